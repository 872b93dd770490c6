"""Simulator throughput: BabyAI and ScienceWorld steps/s in-process vs 1 vs N workers.

Every configuration hosts the same number of env instances (``N x envs-per-worker``); one
asyncio coroutine per episode plays random valid actions and resets its env when the
episode ends (the rollout engine's pattern). The in-process baseline steps one env
instance in a plain loop. BabyAI's valid actions are read from its observation (as an LLM
agent reads them); ScienceWorld's are listed once per episode (the listing costs far more
than a step), so many later draws are commands the simulator parses and refuses.

    python bench/sim_workers.py --json [--workers 2] [--seconds 10] [--skip-sciworld]

Prints one JSON object: ``{env: {"baseline_steps_per_s", "baseline_step_ms",
"workers_1_steps_per_s", "workers_N_steps_per_s", "speedup_vs_1_worker", ...},
"jvm_start_s": ..., "load_avg_1m": ...}``. Steps/s are wall-clock rates including resets
(and ScienceWorld's per-episode action listing); ``baseline_step_ms`` is the mean time
inside ``step`` alone. On a shared machine read them with ``load_avg_1m`` in mind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import time

from agentgym.envs.simulators import register_all
from agentgym.runtime.workers import ProcessEnvPool

CONFIGS = {
    # env id: (env kwargs, max_turns, envs per worker)
    "babyai": ({"level": ["GoToLocal", "PickupLoc", "OpenDoor"]}, 30, 8),
    "sciworld": ({"tasks": ["find-living-thing", "boil"], "split": "train"}, 30, 1),
}


def obs_actions(obs: str, fallback: list[str]) -> list[str]:
    """The "Available actions: [...]" list at the end of a BabyAI observation."""
    _, sep, tail = obs.rpartition("Available actions: ")
    if not sep:
        return fallback
    listed = [a for a in json.loads(tail) if a != "check available actions"]
    return listed or fallback


def baseline(env_id: str, kwargs: dict, max_turns: int, seconds: float, warmup: float) -> dict:
    """One env instance stepped in this process with random valid actions."""
    import agentgym

    env = agentgym.make(env_id, max_turns=max_turns, **kwargs)
    rng = random.Random(0)
    t0 = time.perf_counter()
    env.reset(seed=0)
    setup_s = time.perf_counter() - t0
    steps = episodes = 0
    in_step = 0.0
    actions = env.unwrapped.valid_actions() or ["look around"]
    t0 = time.perf_counter()
    warm_until = t0 + warmup
    while time.perf_counter() - t0 < seconds + warmup:
        if warm_until and time.perf_counter() >= warm_until:  # JIT / caches are warm now
            steps = episodes = warm_until = 0
            in_step = 0.0
            t0 = time.perf_counter() - warmup
        t_step = time.perf_counter()
        obs, _, term, trunc, _ = env.step(rng.choice(actions))
        in_step += time.perf_counter() - t_step
        steps += 1
        if env_id == "babyai":
            actions = obs_actions(obs, actions)
        if term or trunc:
            episodes += 1
            env.reset(seed=rng.randrange(2**31))
            actions = env.unwrapped.valid_actions() or ["look around"]
    elapsed = time.perf_counter() - t0 - warmup
    out = {
        "steps_per_s": steps / elapsed,
        "step_ms": 1000 * in_step / max(steps, 1),
        "episodes": episodes,
        "first_reset_s": setup_s,
    }
    jvm = getattr(getattr(env, "env", None), "jvm_start_s", None)
    if jvm is not None:
        out["jvm_start_s"] = jvm
    env.close()
    return out


async def pooled(
    env_id: str,
    kwargs: dict,
    max_turns: int,
    workers: int,
    per_worker: int,
    seconds: float,
    warmup: float,
) -> dict:
    """``workers x per_worker`` envs, one coroutine per episode, for ``seconds`` after
    ``warmup`` seconds of the same play (not counted)."""
    pool = ProcessEnvPool(env_id, workers, per_worker, max_turns=max_turns, timeout_s=300, **kwargs)
    counts = {"steps": 0, "episodes": 0}
    t_start = time.perf_counter()
    await pool.reset_many(list(range(pool.num_envs)), seeds=list(range(pool.num_envs)))
    warmup_s = time.perf_counter() - t_start
    start = time.perf_counter() + warmup
    deadline = start + seconds

    async def episode(i: int) -> None:
        rng = random.Random(i)
        actions = await pool.valid_actions(i) or ["look around"]
        while time.perf_counter() < deadline:
            obs, _, term, trunc, _ = await pool.step(i, rng.choice(actions))
            timed = time.perf_counter() >= start
            counts["steps"] += timed
            if term or trunc:
                counts["episodes"] += timed
                await pool.reset(i, seed=rng.randrange(2**31))
                actions = await pool.valid_actions(i) or ["look around"]
            elif env_id == "babyai":
                actions = obs_actions(obs, actions)

    await asyncio.gather(*(episode(i) for i in range(pool.num_envs)))
    elapsed = time.perf_counter() - start
    await pool.aclose()
    return {
        "steps_per_s": counts["steps"] / elapsed,
        "episodes": counts["episodes"],
        "startup_s": warmup_s,
        "restarts": pool.restarts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object (default)")
    parser.add_argument("--workers", type=int, default=max(2, os.cpu_count() or 2))
    parser.add_argument("--seconds", type=float, default=10.0, help="timed window per run")
    parser.add_argument("--warmup", type=float, default=5.0, help="untimed play first")
    parser.add_argument("--skip-sciworld", action="store_true")
    parser.add_argument("--babyai-envs-per-worker", type=int, default=None)
    args = parser.parse_args()
    register_all()
    result: dict = {
        "workers": args.workers,
        "seconds": args.seconds,
        "warmup_s": args.warmup,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    for env_id, (kwargs, max_turns, per_worker) in CONFIGS.items():
        if env_id == "sciworld" and (args.skip_sciworld or shutil.which("java") is None):
            continue
        if env_id == "babyai" and args.babyai_envs_per_worker:
            per_worker = args.babyai_envs_per_worker
        total = args.workers * per_worker
        timing = (args.seconds, args.warmup)
        base = baseline(env_id, kwargs, max_turns, *timing)
        one = asyncio.run(pooled(env_id, kwargs, max_turns, 1, total, *timing))
        many = asyncio.run(pooled(env_id, kwargs, max_turns, args.workers, per_worker, *timing))
        result[env_id] = {
            "envs": total,
            "baseline_steps_per_s": round(base["steps_per_s"], 1),
            "baseline_step_ms": round(base["step_ms"], 2),
            "workers_1_steps_per_s": round(one["steps_per_s"], 1),
            f"workers_{args.workers}_steps_per_s": round(many["steps_per_s"], 1),
            "speedup_vs_1_worker": round(many["steps_per_s"] / one["steps_per_s"], 2),
            "episodes": {
                "baseline": base["episodes"],
                "1": one["episodes"],
                str(args.workers): many["episodes"],
            },  # fmt: skip
            "pool_startup_s": {
                "1": round(one["startup_s"], 2),
                str(args.workers): round(many["startup_s"], 2),
            },  # fmt: skip
            "first_reset_s": round(base["first_reset_s"], 2),
        }
        if "jvm_start_s" in base:
            result["jvm_start_s"] = round(base["jvm_start_s"], 2)
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
