"""Env snapshots in the native pool: bytes and microseconds per snapshot, restore and fork,
per env, against the baseline of resetting the episode and replaying its first k actions
(what Prefix Sampling and GiGPO-style replays pay to rebuild a state), in the same run.

For each native env and each prefix length k, ``--num-envs`` slots play task ``i`` with
seed ``1000 + i``, stepped k times in batches with scripted actions (the oracle's action,
or a random valid one, by a seeded coin), prepared before any timing. The slots still
running after k steps are the measured set (``slots``). Timed, each over the whole set in
one call, best of ``--repeats`` (noise on a shared machine only slows a run down):

- ``snapshot_us``: ``EnvPool.snapshot(ids)`` per slot (a copy of the env and the episode
  record into the pool's table); ``release_us`` frees them again;
- ``restore_us``: ``EnvPool.restore(ids, handles)`` per slot (a copy out of the table);
- ``fork_us``: ``EnvPool.fork(src, targets)`` per child, ``--fork-children`` children of one
  slot (the targets are finished again, untimed, between repeats);
- ``replay_us``: the baseline, per slot: ``EnvPool.reset`` of the same slots, tasks and seeds
  followed by the k recorded actions, one batched ``step`` per turn (the pool's fastest
  path, so the baseline is the cheapest replay there is), checked to rebuild the same state
  (``valid_actions`` and the next step's observation equal a restored slot's);
- ``replay_over_restore``: ``replay_us / restore_us``.

``bytes_mean`` / ``bytes_max`` come from ``EnvPool.snapshot_bytes``: the table entry, the
env's struct (``size_of_val``), the env's own heap buffers (their capacities) and the task
text. Read-only data every env of an id shares (word lists, catalogues, recipe books, the
search corpus) is not copied by a snapshot and not counted. The allocator's per-block
overhead is not counted either.

Usage: ``python bench/snapshots.py [--env maze wordle ...|all] [--num-envs 512]
[--prefix 2 5 16] [--repeats 5] [--fork-children 64]``. Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import agentgym  # noqa: E402
from agentgym import _core  # noqa: E402

ENVS = tuple(e for e in _core.native_env_ids() if not e.startswith("_"))


def _best(fn, repeats: int, between=None) -> float:
    """Fastest of ``repeats`` timed calls of ``fn`` (seconds); ``between()`` runs untimed
    after each call."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        if between is not None:
            between()
    return best


def _play_prefix(pool, n: int, k: int, rng: random.Random):
    """Resets slots ``0..n`` and steps them ``k`` times: the per-turn batches of (ids,
    actions) that were played, for the replay."""
    tasks = list(range(n))
    seeds = [1000 + i for i in range(n)]
    pool.reset(list(range(n)), tasks, seeds, None)
    turns = []
    for _ in range(k):
        ids = [i for i, r in enumerate(pool._pool.running(list(range(n)))) if r]
        if not ids:
            break
        actions = []
        for i in ids:
            oracle = pool.oracle_action(i) if rng.random() < 0.5 else None
            actions.append(oracle or rng.choice(pool.valid_actions(i) or ["look"]))
        pool.step(ids, actions)
        turns.append((ids, actions))
    return tasks, seeds, turns


def bench_env(env_id: str, n: int, k: int, repeats: int, children: int) -> dict:
    rng = random.Random(f"{env_id}/{k}")
    pool = agentgym.EnvPool(env_id, n)
    tasks, seeds, turns = _play_prefix(pool, n, k, rng)
    ids = [i for i, r in enumerate(pool._pool.running(list(range(n)))) if r]
    if not ids:
        return {"prefix": k, "slots": 0, "skipped": "every episode ended within the prefix"}
    m = len(ids)

    held: list[list[int]] = []
    snapshot_s = _best(lambda: held.append(pool.snapshot(ids)), repeats)
    handles = held.pop()
    nbytes = pool.snapshot_bytes(handles)
    release_s = float("inf")
    for hs in held:
        t0 = time.perf_counter()
        pool.release(hs)
        release_s = min(release_s, time.perf_counter() - t0)
    restore_s = _best(lambda: pool.restore(ids, handles), repeats)

    # Single-slot calls (the latency an undo pays), Python call overhead included.
    one = ids[:1]
    [h1] = pool.snapshot(one)
    single_snapshot_s = _best(lambda: pool.release(pool.snapshot(one)), repeats * 20)
    single_restore_s = _best(lambda: pool.restore(one, [h1]), repeats * 20)
    pool.release([h1])

    # Replay baseline: the same slots reset to the same tasks and seeds, then the recorded
    # actions of those slots, one batched step per turn.
    in_set = set(ids)
    plan = [([i for i in t_ids if i in in_set],
             [a for i, a in zip(t_ids, acts) if i in in_set]) for t_ids, acts in turns]
    set_tasks = [tasks[i] for i in ids]
    set_seeds = [seeds[i] for i in ids]

    def replay():
        pool.reset(ids, set_tasks, set_seeds, None)
        for t_ids, acts in plan:
            pool.step(t_ids, acts)

    replay_s = _best(replay, repeats)
    # The replay rebuilds the snapshot's state: the same valid actions, and the same
    # observations on the next step, as the restored slots.
    probe = ids[: min(m, 32)]
    replayed = [pool.valid_actions(i) for i in probe]
    pool.restore(ids, handles)
    assert replayed == [pool.valid_actions(i) for i in probe], "replay and restore differ"
    action = [(pool.valid_actions(i) or ["look"])[0] for i in probe]
    after_restore = pool.step(probe, action)[0]
    replay()
    assert pool.step(probe, action)[0] == after_restore, "replay and restore differ"
    pool.release(handles)

    # Fork: one running slot into `children` free slots of a pool of its own.
    fpool = agentgym.EnvPool(env_id, children + 1)
    fpool.reset([0], [tasks[ids[0]]], [seeds[ids[0]]], None)
    for t_ids, acts in turns:
        if ids[0] in t_ids:
            fpool.step([0], [acts[t_ids.index(ids[0])]])
    targets = list(range(1, children + 1))
    fork_s = _best(lambda: fpool.fork(0, targets), repeats,
                   between=lambda: fpool.finish(targets, "aborted"))

    us = 1e6
    return {
        "prefix": k,
        "slots": m,
        "mean_turns_replayed": round(sum(len(t) for t, _ in plan) / m, 2),
        "bytes_mean": round(statistics.fmean(nbytes)),
        "bytes_max": max(nbytes),
        "snapshot_us": round(snapshot_s / m * us, 3),
        "release_us": round(release_s / m * us, 3),
        "restore_us": round(restore_s / m * us, 3),
        "fork_us": round(fork_s / children * us, 3),
        "replay_us": round(replay_s / m * us, 3),
        "replay_over_restore": round(replay_s / restore_s, 1),
        "replay_over_snapshot": round(replay_s / snapshot_s, 1),
        "single_call_snapshot_and_release_us": round(single_snapshot_s * us, 2),
        "single_call_restore_us": round(single_restore_s * us, 2),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", nargs="+", default=["all"], choices=[*ENVS, "all"])
    ap.add_argument("--num-envs", type=int, default=512)
    ap.add_argument("--prefix", type=int, nargs="+", default=[2, 5, 16],
                    help="prefix lengths k (turns played before the snapshot)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fork-children", type=int, default=64)
    args = ap.parse_args(argv)
    envs = ENVS if "all" in args.env else tuple(dict.fromkeys(args.env))
    report = {
        "benchmark": "snapshots",
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "num_envs": args.num_envs,
        "repeats": args.repeats,
        "fork_children": args.fork_children,
        "loadavg_1m_before": round(os.getloadavg()[0], 2),
        "envs": {
            e: [bench_env(e, args.num_envs, k, args.repeats, args.fork_children)
                for k in args.prefix]
            for e in envs
        },
    }
    report["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
