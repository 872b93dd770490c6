"""The pool against EnvPool's own C++ engine on the same trivial dynamics: ``agentgym.EnvPool``
stepping ``_bench_cartpole`` (CartPole-v1's dynamics in Rust, a bench-only env) against
``envpool.make("CartPole-v1")``, so what differs is pool machinery, not env logic.

Both sides play the same pre-drawn random pushes (one ``int32`` array per step for EnvPool,
the same pushes as ``"0"``/``"1"`` strings for the pool), the same batch sizes (``--num-envs``,
1 to 4,096) and the same thread count (``--threads``: EnvPool's ``num_threads`` and the pool's
rayon workers, ``RAYON_NUM_THREADS``), synchronous stepping (``batch_size == num_envs``), and
the same 500-step limit. An ended episode restarts as each engine does it: EnvPool resets it
inside its next ``step`` (its auto-reset); the pool's caller resets the ended slots with one
``reset`` call after the step that ended them (what the rollout engine does), counted in the
timed loop. Rates count env transitions (``num_envs`` per ``step`` call).

The pool runs twice: with its text observation (``x=... theta_dot=...``, one Python ``str``
per row) and with the formatting skipped (``text=false``: an empty string per row); EnvPool
returns a ``float32[num_envs, 4]`` array.

Each (engine, threads, repeat) runs in a fresh interpreter, all batch sizes in it, pinned to
the client cores (``bench/harness.py``: every allowed core unless ``--client-cores``); after
one untimed interpreter of each engine, ``--repeats`` rounds (default 5), the engines'
order rotated by round. Per (threads, size) and pool variant the comparison block's ratio
is the median of the per-round ratios pool rate / EnvPool rate (above 1: the pool is
faster) with its range; each engine's median and range, every run listed.

Usage: ``python bench/peer_envpool.py [--num-envs 1 16 256 4096] [--threads 1 2]
[--steps 200000] [--repeats 5] [--client-cores LIST] [--out bench/results/peer_envpool.json]``.
Prints one JSON object; EnvPool absent: the report says so and has no rows.
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

RESULTS = Path(__file__).resolve().parent / "results" / "peer_envpool.json"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.harness as a script
ENGINES = ("envpool", "pool_text", "pool_no_text")
HORIZON = 500  # CartPole-v1's step limit


def plan(n: int, steps: int, seed: int = 0):
    """Per-step pushes for ``n`` envs, ``steps`` env transitions in all (at least one call)."""
    import numpy as np

    calls = max(1, steps // n)
    return np.random.default_rng(seed).integers(0, 2, size=(calls, n), dtype=np.int32)


def run_envpool(n: int, threads: int, pushes) -> tuple[float, int]:
    import envpool

    env = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=n, batch_size=n,
                       num_threads=threads, seed=0, max_episode_steps=HORIZON)
    env.reset()
    ended = 0
    t0 = time.perf_counter()
    for actions in pushes:
        _, _, terminated, truncated, _ = env.step(actions)
        ended += int((terminated | truncated).sum())
    elapsed = time.perf_counter() - t0
    env.close()
    return elapsed, ended


def run_pool(n: int, text: bool, pushes) -> tuple[float, int]:
    import numpy as np

    import agentgym
    from agentgym import _core

    _core._register_test_envs()
    pool = agentgym.EnvPool("_bench_cartpole", n, max_turns=HORIZON, text=text)
    pool.reset()
    ids = np.arange(n)
    names = np.array(["0", "1"], dtype=object)
    actions = [names[row].tolist() for row in pushes]  # prepared before timing
    ended = 0
    t0 = time.perf_counter()
    for acts in actions:
        _, _, terminated, truncated = pool.step(ids, acts)
        done = terminated | truncated
        if done.any():
            d = np.flatnonzero(done)
            pool.reset(d)
            ended += len(d)
    elapsed = time.perf_counter() - t0
    return elapsed, ended


def child(engine: str, sizes: list[int], steps: int) -> list[dict]:
    """One engine at every size, in this interpreter (its thread count set by the parent)."""
    import gc

    threads = int(os.environ["RAYON_NUM_THREADS"])
    rows = []
    for n in sizes:
        pushes = plan(n, steps)
        gc.collect()
        if engine == "envpool":
            elapsed, ended = run_envpool(n, threads, pushes)
        else:
            elapsed, ended = run_pool(n, engine == "pool_text", pushes)
        rows.append({"num_envs": n, "transitions": int(pushes.size), "seconds": elapsed,
                     "episodes_ended": ended})
    return rows


def _spawn(engine: str, threads: int, sizes: list[int], steps: int,
           cores: list[int] | None = None) -> list[dict]:
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads), "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--_child", engine, "--num-envs", *map(str, sizes),
           "--steps", str(steps)]
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, preexec_fn=pin)
    if out.returncode:
        raise RuntimeError(f"{engine} (threads={threads}) failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def envpool_version() -> str | None:
    try:
        import envpool
    except ImportError:
        return None
    return envpool.__version__


def measure(sizes: list[int], threads: list[int], steps: int, repeats: int,
            hs=None) -> dict:
    from bench.harness import Harness, plan_cores, schedule

    if hs is None:
        hs = Harness(plan_cores(with_server=False), repeats=repeats)
    version = envpool_version()
    report = {
        "bench": "peer_envpool",
        "peer": None if version is None else f"envpool {version}",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "steps_per_size": steps, "repeats": hs.repeats, "horizon": HORIZON,
        "method": "bench/harness.py: one untimed interpreter of each engine, then --repeats "
                  "rounds, engines rotated; ratio = median of per-round pool/EnvPool",
        "loadavg_1m_before": round(os.getloadavg()[0], 2),
        "comparisons": [], "rows": [],
    }
    if version is None:
        report["skipped"] = "envpool is not installed (pip install 'agentgym-rl[peers]')"
        return report
    cores = hs.plan.client if hs.plan.pin else None
    for t in threads:
        runs: dict[str, list[list[dict]]] = {e: [] for e in ENGINES}
        order: list[list[str]] = []
        load0 = os.getloadavg()
        for kind, r, engine in schedule(ENGINES, hs.repeats):
            out = _spawn(engine, t, sizes, steps, cores)
            if kind == "warmup":
                continue
            if len(order) <= r:
                order.append([])
            order[r].append(engine)
            runs[engine].append(out)
        load1 = os.getloadavg()
        for i, n in enumerate(sizes):
            per_arm = {e: [{"steps_per_s": c[i]["transitions"] / c[i]["seconds"],
                            "seconds": c[i]["seconds"], "episodes_ended": c[i]["episodes_ended"]}
                           for c in runs[e]] for e in ENGINES}
            row: dict = {"threads": t, "num_envs": n}
            for engine in ENGINES:
                cells = per_arm[engine]
                rates = sorted(c["steps_per_s"] for c in cells)
                med = rates[len(rates) // 2] if len(rates) % 2 else \
                    (rates[len(rates) // 2 - 1] + rates[len(rates) // 2]) / 2
                row[f"{engine}_steps_per_s"] = round(med)
                row[f"{engine}_us_per_call"] = round(1e6 * n / med, 2)
                row[f"{engine}_steps_per_s_runs"] = [round(c["steps_per_s"]) for c in cells]
                row[f"{engine}_episodes_ended"] = cells[0]["episodes_ended"]
            for engine in ENGINES[1:]:
                block = hs.block_from_runs(
                    f"{t} thread{'s' if t > 1 else ''}, {n} envs, {engine}",
                    {engine: per_arm[engine], "envpool": per_arm["envpool"]},
                    metric="steps_per_s", numerator=engine, denominator="envpool",
                    order=order, load_before=load0, load_after=load1)
                block.update({"threads": t, "num_envs": n})
                report["comparisons"].append(block)
                row[f"ratio_{engine}"] = round(block["ratio"]["median"], 2)
                row[f"ratio_{engine}_range"] = [round(block["ratio"]["min"], 2),
                                                round(block["ratio"]["max"], 2)]
            report["rows"].append(row)
    report["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    return report


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-envs", type=int, nargs="+", default=[1, 4, 16, 64, 256, 1024, 4096])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=200_000, help="env transitions per size")
    ap.add_argument("--out", default=str(RESULTS), help="JSON file ('-': none)")
    ap.add_argument("--_child", choices=ENGINES, help=argparse.SUPPRESS)
    from bench.harness import Harness, add_arguments, write_json_atomic

    add_arguments(ap)
    args = ap.parse_args(argv)
    if args._child:
        print(json.dumps(child(args._child, args.num_envs, args.steps)))
        return {}
    if args.repeats < 1 or min(args.threads) < 1 or min(args.num_envs) < 1:
        ap.error("--repeats, --threads and --num-envs must be at least 1")
    hs = Harness.from_args(args, with_server=False)
    if hs.plan.pin and max(args.threads) > len(hs.plan.client):
        print(f"peer_envpool: {max(args.threads)} threads on {len(hs.plan.client)} client "
              "core(s)", file=sys.stderr)
    report = measure(args.num_envs, args.threads, args.steps, args.repeats, hs)
    if args.out != "-":
        write_json_atomic(args.out, report)
    print(json.dumps(report))
    for row in report["rows"]:
        print(f"T={row['threads']} N={row['num_envs']:5d}"
              f" envpool {row['envpool_steps_per_s']:>11,}/s"
              f"  pool text {row['pool_text_steps_per_s']:>11,}/s x{row['ratio_pool_text']}"
              f"  no text {row['pool_no_text_steps_per_s']:>11,}/s x{row['ratio_pool_no_text']}",
              file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
