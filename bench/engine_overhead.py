"""Engine overhead: turns per second through the whole rollout engine with an instant
scripted policy (no model), at several concurrency levels.

    python bench/engine_overhead.py --json [--env maze] [--episodes 8192] [--repeats 3]

Prints one JSON object: for each concurrency, `turns_per_s`, `us_per_turn` (engine wall
time per turn: decode, parse, env step, observation tokenization, trajectory store,
coroutine scheduling) and the baseline `env_only_turns_per_s` (the same env stepped
directly through EnvPool with oracle actions), so the engine's share is visible.

Each concurrency is collected ``--repeats`` times on the same engine: `turns_per_s` is the
best run (the timeit convention: on a shared machine, noise only ever slows a run down),
`turns_per_s_median` the median and `turns_per_s_runs` every run; `cpu_us_per_turn` is
the process CPU time per turn of the best run.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time

import numpy as np

import agentgym
from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine


def env_only(env_id: str, n: int, turns: int) -> float:
    """Baseline: the env alone, stepped in one batch per turn with oracle actions."""
    pool = agentgym.EnvPool(env_id, n, seed=0)
    pool.reset()
    ids = np.arange(n)
    done_turns = 0
    t0 = time.perf_counter()
    for _ in range(turns):
        actions = [a or "" for a in pool.oracle_actions(ids)]
        _, _, term, trunc = pool.step(ids, actions)
        done_turns += len(ids)
        finished = ids[term | trunc]
        if len(finished):
            pool.reset(finished)
    return done_turns / (time.perf_counter() - t0)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--env", default="maze")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--episodes", type=int, default=8192)
    ap.add_argument("--max-turns", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model-dir", default=None, help="tokenizer to use (default: build tiny)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    model_dir = args.model_dir
    if model_dir is None:
        from agentgym.models import build_tiny_model

        model_dir = str(build_tiny_model(tempfile.mkdtemp(prefix="tiny-"), seed=0))
    tok = AutoTokenizer.from_pretrained(model_dir)
    results = {}
    for c in args.concurrency:
        backend = ScriptedBackend(tok, policy="oracle")
        eng = RolloutEngine(backend, tok, max_turns=args.max_turns, max_concurrency=c,
                            max_total_tokens=8192, progress=False)
        eng.collect_sync(min(c, 256), args.env)  # warm-up (driver, caches)
        runs = []
        for _ in range(max(1, args.repeats)):
            t0, c0 = time.perf_counter(), time.process_time()
            batch = eng.collect_sync(args.episodes, args.env)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            turns = sum(t.num_turns for t in batch)
            runs.append((turns / wall, wall, cpu, turns, len(batch), batch.metrics))
            del batch
        best = max(runs, key=lambda r: r[0])
        rate, wall, cpu, turns, n, metrics = best
        results[str(c)] = {
            "turns_per_s": rate,
            "turns_per_s_median": statistics.median(r[0] for r in runs),
            "turns_per_s_runs": [round(r[0]) for r in runs],
            "us_per_turn": 1e6 * wall / turns,
            "cpu_us_per_turn": 1e6 * cpu / turns,
            "trajectories_per_s": n / wall,
            "turns": turns,
            "success_rate": metrics["success_rate"],
            "env_only_turns_per_s": env_only(args.env, c, 64),
        }
        eng.close()
    out = {
        "bench": "engine_overhead",
        "env": args.env,
        "episodes": args.episodes,
        "repeats": args.repeats,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "results": results,
        "turns_per_s_max": max(r["turns_per_s"] for r in results.values()),
        "turns_per_s_min": min(r["turns_per_s"] for r in results.values()),
    }
    print(json.dumps(out, indent=None if args.json else 2))
    return out


if __name__ == "__main__":
    main()
