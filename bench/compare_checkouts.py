"""The same benchmarks on two checkouts of this repository, in one session: a base (an
older commit's worktree with its own built ``_core``) and this tree, run alternately
(base, head, base, head, ...) so both see the same machine load, each bench's headline
figures side by side with their ratio (head / base; above 1 is faster for a rate).

    git worktree add /tmp/base <commit>   # then build its extension into /tmp/base/python
    python bench/compare_checkouts.py --base /tmp/base [--rounds 2] [--out FILE]

The benches: ``engine_overhead`` (engine turns/s at 256 and 4096 episodes in flight),
``env_pool`` (native maze and textcraft steps/s at 1,024 envs), ``distributed`` (in-process
and one-Ray-worker trajectories/s, and the learner's update tokens/s at 1 rank on the tiny
model). Each figure is compared as the harness compares arms (``bench/harness.py``): the
median of the per-round ratios head / base with its range (``tie`` where the range holds
1.0), and each tree's own median and range over its rounds; every run's value is kept.
Prints one JSON object (and writes it to ``--out`` with fsync and rename).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from bench.harness import fmt_ratio, ratio_stats, summarize  # noqa: E402

#: name -> (arguments after ``bench/<script>.py``, {figure: path into its JSON})
BENCHES: dict[str, tuple[list[str], dict[str, tuple]]] = {
    "engine_overhead": (
        ["--json", "--episodes", "4096", "--concurrency", "256", "4096", "--repeats", "2"],
        {"turns_per_s@256": ("results", "256", "turns_per_s"),
         "turns_per_s@4096": ("results", "4096", "turns_per_s")}),
    "env_pool": (
        ["--json", "--env", "maze", "textcraft", "--num-envs", "1024", "--steps", "200000",
         "--repeats", "2"],
        {}),  # figures read by _env_pool below
    "distributed": (
        ["--json", "--episodes", "2048", "--repeats", "2", "--learner-steps", "3",
         "--latency-ms", "0"],
        {"in_process_trajectories_per_s": ("rollouts", 0, "in_process", "trajectories_per_s"),
         "ray_1_worker_trajectories_per_s": ("rollouts", 0, "ray_1_worker",
                                             "trajectories_per_s"),
         "update_tokens_per_s": ("learner", "ranks_1", "tokens_per_s")}),
}


def _figures(name: str, report: dict) -> dict[str, float]:
    if name == "env_pool":
        return {f"{env}_native_steps_per_s@{r['num_envs']}": float(r["native_steps_per_s"])
                for env, body in report["envs"].items() for r in body["results"]}
    got = {}
    for fig, path in BENCHES[name][1].items():
        v = report
        for k in path:
            v = v[k]
        got[fig] = float(v)
    return got


def _run(tree: Path, name: str, args: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "python")}
    proc = subprocess.run([sys.executable, str(tree / "bench" / f"{name}.py"), *args],
                          env=env, cwd=tree, capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"{name} on {tree} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base", required=True, help="the base checkout (with its _core built)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--benches", default=",".join(BENCHES))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    trees = {"base": Path(args.base).resolve(), "head": HERE}
    commits = {k: subprocess.run(["git", "-C", str(t), "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True).stdout.strip()
               for k, t in trees.items()}
    report: dict = {"bench": "compare_checkouts", "commits": commits,
                    "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                    "rounds": args.rounds, "load_avg_start": os.getloadavg()[0], "benches": {}}
    t0 = time.time()
    for name in args.benches.split(","):
        bench_args = BENCHES[name][0]
        runs: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
        for _ in range(args.rounds):
            for side in ("base", "head"):
                runs[side].append(_figures(name, _run(trees[side], name, bench_args)))
        rows = {}
        for fig in runs["head"][0]:
            base = [r[fig] for r in runs["base"]]
            head = [r[fig] for r in runs["head"]]
            rows[fig] = {**summarize({"head": head, "base": base}, "head", "base"),
                         "head_vs_base": round(ratio_stats(head, base)["median"], 3)}
        report["benches"][name] = rows
        print(f"{name}: " + ", ".join(f"{k} {fmt_ratio(v)}" for k, v in rows.items()),
              file=sys.stderr)
    report["wall_s"] = round(time.time() - t0, 1)
    report["load_avg_end"] = os.getloadavg()[0]
    text = json.dumps(report)
    if args.out:
        from agentgym.runtime.files import write_text_atomic

        write_text_atomic(args.out, json.dumps(report, indent=2) + "\n")
    print(text)
    return report


if __name__ == "__main__":
    main()
