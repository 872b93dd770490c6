"""Env-pool throughput: native ``agentgym.EnvPool`` vs a pure-Python env per episode.

For each env and pool size N, both paths play the same action sequences: slot ``i`` plays
task ``i`` with seed ``1000 + i``, and its actions cycle through a few of its valid actions
followed by the oracle's solution, so every episode ends at the end of its cycle (goal
reached, or the horizon set to the cycle length) and is reset inside the timed loop.
Action lists are prepared before timing; both loops also read every observation (total
length) so the work done with the strings is the same, and the totals are compared.

``bytes_per_episode`` is RSS growth (``/proc/self/statm``, after ``malloc_trim``) per reset
episode, measured in a fresh subprocess per (path, env, N) after the shared data (recipe
book, word lists) loaded; for N=1 it is mostly page granularity (0 or a few KiB).

Each (env, N) is timed ``--repeats`` times (default 3), native and Python runs interleaved,
and the best run of each path is reported (the ``timeit`` convention: on a shared machine
noise only ever slows a run down, so the fastest run is the best estimate of the cost);
``ratio`` is best native over best Python, and every run's rate is listed too
(``native_steps_per_s_runs``, ``python_steps_per_s_runs``).

Usage: ``python bench/env_pool.py --env textcraft [maze ...|all] --num-envs 1 64 1024 4096
[--repeats 3] [--json]``.
Prints one JSON object on stdout (and, without ``--json``, a table on stderr).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

# Neither path calls BLAS, but numpy's OpenBLAS starts one server thread per core at import,
# and those threads spin (``blas_thread_server``) whenever they wake, taking CPU from the
# pool's helper thread on a small machine. One BLAS thread means no server threads at all.
# Set before numpy is first imported; an explicit setting in the environment wins.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import agentgym  # noqa: E402

#: Every listed native env; those with a ``bench/baselines/<env>_py.py`` are also compared.
ENVS = tuple(e for e in agentgym._core.native_env_ids() if not e.startswith("_"))
RANDOM_ACTIONS = 6
ORACLE_LIMIT = 200


def baseline(env_id: str):
    """The baseline module ``bench/baselines/<env>_py.py``, or None when it is missing."""
    try:
        return importlib.import_module(f"bench.baselines.{env_id}_py")
    except ModuleNotFoundError as e:
        if e.name and e.name.endswith(f"{env_id}_py"):
            return None
        raise


def rss_bytes() -> int:
    """Resident set size, after returning freed heap pages to the OS (glibc ``malloc_trim``)
    so that garbage of finished calls does not count as episode state."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def prepare(env_id: str, n: int):
    """Tasks, seeds and per-slot action cycles (random valid actions + oracle solution)."""
    tasks = list(range(n))
    seeds = [1000 + i for i in range(n)]
    pool = agentgym.EnvPool(env_id, n, max_turns=ORACLE_LIMIT)
    pool.reset(tasks=tasks, seeds=seeds)
    cycles = []
    for i in range(n):
        valid = pool.valid_actions(i)
        rng = random.Random(i)
        cycles.append(rng.sample(valid, min(RANDOM_ACTIONS, len(valid))))
    live = np.arange(n)
    while live.size:
        actions = pool.oracle_actions(live)
        keep = np.array([a is not None for a in actions], dtype=bool)
        live, actions = live[keep], [a for a in actions if a is not None]
        if not live.size:
            break
        _, _, terminated, truncated = pool.step(live, actions)
        for i, a in zip(live.tolist(), actions, strict=True):
            cycles[i].append(a)
        live = live[~(terminated | truncated)]
    cycles = [c or ["inventory"] for c in cycles]
    return tasks, seeds, cycles


def schedule(cycles: list[list[str]], steps: int) -> list[list[str]]:
    """Per-step action lists: slot i's action at step t is ``cycles[i][t % len]``."""
    n = len(cycles)
    return [[c[t % len(c)] for c in cycles] for t in range(max(1, steps // n))]


def run_native(env_id, tasks, seeds, cycles, plan):
    n = len(tasks)
    horizon = [len(c) for c in cycles]
    pool = agentgym.EnvPool(env_id, n)
    pool.reset(tasks=tasks, seeds=seeds, max_turns=horizon)
    ids = list(range(n))
    task_arr, seed_arr, hor_arr = np.array(tasks), np.array(seeds), np.array(horizon)
    chars, reward, episodes = 0, 0.0, 0
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    for actions in plan:
        obs, rewards, terminated, truncated = pool.step(ids, actions)
        chars += sum(map(len, obs))
        done = terminated | truncated
        if done.any():
            d = np.flatnonzero(done)
            reward += float(rewards[d].sum())
            pool.reset(d, tasks=task_arr[d].tolist(), seeds=seed_arr[d].tolist(),
                       max_turns=hor_arr[d].tolist())
            episodes += len(d)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return elapsed, cpu, chars, reward, episodes


def run_python(module, tasks, seeds, cycles, plan):
    n = len(tasks)
    horizon = [len(c) for c in cycles]
    envs = [module.make() for _ in range(n)]
    for env, task, seed in zip(envs, tasks, seeds, strict=True):
        env.reset(task, seed)
    turns = [0] * n
    chars, reward, episodes = 0, 0.0, 0
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    for actions in plan:
        for i in range(n):
            obs, r, done = envs[i].step(actions[i])
            chars += len(obs)
            turns[i] += 1
            if done or turns[i] >= horizon[i]:
                reward += r
                envs[i].reset(tasks[i], seeds[i])
                turns[i] = 0
                episodes += 1
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return elapsed, cpu, chars, reward, episodes


def measure_memory(path: str, env_id: str, n: int) -> float:
    """RSS growth per reset episode, in a fresh interpreter."""
    cmd = [sys.executable, __file__, "--_mem", path, env_id, str(n)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(out.strip())


def _memory_child(path: str, env_id: str, n: int) -> None:
    tasks, seeds = list(range(n)), [1000 + i for i in range(n)]
    if path == "native":
        agentgym.EnvPool(env_id, 1).reset()  # load shared data first
        gc.collect()
        before = rss_bytes()
        pool = agentgym.EnvPool(env_id, n)
        pool.reset(tasks=tasks, seeds=seeds)
    else:
        module = baseline(env_id)
        module.make().reset(0, 0)
        gc.collect()
        before = rss_bytes()
        envs = [module.make() for _ in range(n)]
        for env, task, seed in zip(envs, tasks, seeds, strict=True):
            env.reset(task, seed)
    gc.collect()
    print((rss_bytes() - before) / n)


def bench_env(env_id: str, sizes: list[int], steps: int, repeats: int = 3) -> dict:
    module = baseline(env_id)
    try:
        agentgym.EnvPool(env_id, 1).reset()
    except agentgym.AgentGymError as e:
        return {"skipped": f"native env unavailable: {e}"}
    rows = []
    for n in sizes:
        tasks, seeds, cycles = prepare(env_id, n)
        plan = schedule(cycles, steps)
        total = len(plan) * n
        gc.collect()
        gc.freeze()  # the prepared plan is not part of either system under test
        native, python = [], []
        for _ in range(repeats):  # interleaved, so a noisy stretch hits both paths
            native.append(run_native(env_id, tasks, seeds, cycles, plan))
            if module is not None:
                python.append(run_python(module, tasks, seeds, cycles, plan))
        nt, ncpu, nchars, nrew, neps = min(native, key=lambda r: r[0])
        native_mem = measure_memory("native", env_id, n)
        row = {
            "num_envs": n,
            "steps": total,
            "repeats": repeats,
            "native_steps_per_s": round(total / nt),
            "native_cpu_s_per_mstep": round(ncpu / total * 1e6, 3),
            "bytes_per_episode": round(native_mem),
            "episodes_reset": neps,
            "success_rate": round(nrew / neps, 3) if neps else None,
            "native_steps_per_s_runs": [round(total / r[0]) for r in native],
            # No pure-Python copy of this env exists yet: native numbers only.
            "python_steps_per_s": None,
            "ratio": None,
            "python_cpu_s_per_mstep": None,
            "python_bytes_per_episode": None,
            "same_observations": None,
            "python_steps_per_s_runs": None,
        }
        if module is not None:
            pt, pcpu, _, _, _ = min(python, key=lambda r: r[0])
            # Every run of either path must read the same texts and rewards.
            same = len({r[2:] for r in native + python}) == 1
            row.update({
                "python_steps_per_s": round(total / pt),
                "ratio": round(pt / nt, 2),
                "python_cpu_s_per_mstep": round(pcpu / total * 1e6, 3),
                "python_bytes_per_episode": round(measure_memory("python", env_id, n)),
                "same_observations": same,
                "python_steps_per_s_runs": [round(total / r[0]) for r in python],
            })
        gc.unfreeze()
        del plan
        rows.append(row)
    return {"results": rows, "baseline": module is not None}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", nargs="+", default=["textcraft"], choices=[*ENVS, "all"],
                    help="one or more env ids, or all")
    ap.add_argument("--num-envs", type=int, nargs="+", default=[1, 64, 1024, 4096])
    ap.add_argument("--steps", type=int, default=300_000, help="env steps per pool size")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed runs per path and size; the best of each is reported")
    ap.add_argument("--json", action="store_true", help="print only the JSON object")
    ap.add_argument("--_mem", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if args._mem:
        _memory_child(args._mem[0], args._mem[1], int(args._mem[2]))
        return {}
    envs = ENVS if "all" in args.env else tuple(dict.fromkeys(args.env))
    report = {
        "benchmark": "env_pool",
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "steps_per_size": args.steps,
        "repeats": args.repeats,
        "loadavg_1m_before": round(os.getloadavg()[0], 2),
        "envs": {e: bench_env(e, args.num_envs, args.steps, args.repeats) for e in envs},
    }
    report["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(report))
    if not args.json:
        for env_id, res in report["envs"].items():
            for row in res.get("results", []):
                py = row["python_steps_per_s"]
                vs = f"python {py:>9,}/s x{row['ratio']:<7}" if py else "python      -      "
                print(f"{env_id:10s} N={row['num_envs']:5d} native {row['native_steps_per_s']:>10,}"
                      f"/s {vs} {row['bytes_per_episode']:>8,} B/ep", file=sys.stderr)
            if "skipped" in res:
                print(f"{env_id:10s} skipped: {res['skipped']}", file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
