"""Benchmark of the TrajectoryStore (``agentgym._core``): batched appends of a multi-turn
rollout and one packed drain (read into a ``PackedBatch``), against a pure-Python baseline
(per-episode lists, numpy packing) on the same data. Prints one JSON object."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from agentgym._core import TrajectoryStore
from agentgym.data import PackedBatch


def workload(n: int, turns: int, obs_len: int, gen_len: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    steps = []
    for _ in range(turns):
        for is_model, mean in ((False, obs_len), (True, gen_len)):
            lengths = rng.integers(mean // 2, mean * 3 // 2 + 1, size=n)
            offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            flat = rng.integers(0, 150_000, size=int(offsets[-1]), dtype=np.uint32)
            lps = -rng.random(int(offsets[-1]), dtype=np.float32) if is_model else None
            steps.append((flat, offsets, is_model, lps))
    return steps


def run_rust(n, steps, turns):
    keys = np.arange(n, dtype=np.uint64)
    s = TrajectoryStore()
    t0 = time.perf_counter()
    zeros = np.zeros(n, dtype=np.uint32)
    s.begin_batch(keys, keys // 8, (keys % 8).astype(np.uint32), zeros, np.zeros_like(keys))
    for i, (flat, offsets, is_model, lps) in enumerate(steps):
        s.append_batch(keys, flat, offsets, np.full(n, is_model), lps)
        if i % 2:
            s.add_turns(keys, np.ones(n, dtype=np.float32))
    t1 = time.perf_counter()
    s.finish_batch(keys, "done")
    b = PackedBatch.from_dict(s.drain())
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, b.num_tokens


def run_python(n, steps, turns):
    t0 = time.perf_counter()
    eps = [{"tok": [], "mask": [], "lp": [], "turns": []} for _ in range(n)]
    for i, (flat, offsets, is_model, lps) in enumerate(steps):
        for k in range(n):
            a, z = offsets[k], offsets[k + 1]
            e = eps[k]
            e["tok"].append(flat[a:z])
            e["mask"].append(np.full(z - a, int(is_model), dtype=np.uint8))
            e["lp"].append(lps[a:z] if is_model else np.zeros(z - a, dtype=np.float32))
            if i % 2:
                e["turns"].append(1.0)
    t1 = time.perf_counter()
    tok = np.concatenate([x for e in eps for x in e["tok"]])
    np.concatenate([x for e in eps for x in e["mask"]])
    np.concatenate([x for e in eps for x in e["lp"]])
    np.cumsum([sum(len(x) for x in e["tok"]) for e in eps])
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, tok.size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--episodes", type=int, default=4096)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--obs-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=128)
    args = ap.parse_args()
    steps = workload(args.episodes, args.turns, args.obs_len, args.gen_len)
    r_app, r_drain, r_tok = run_rust(args.episodes, steps, args.turns)
    p_app, p_drain, p_tok = run_python(args.episodes, steps, args.turns)
    assert r_tok == p_tok
    print(
        json.dumps(
            {
                "bench": "trajectory_store",
                "episodes": args.episodes,
                "turns": args.turns,
                "tokens": int(r_tok),
                "rust/append_s": round(r_app, 4),
                "rust/drain_s": round(r_drain, 4),
                "rust/tokens_per_s": round(r_tok / (r_app + r_drain)),
                "baseline_python/append_s": round(p_app, 4),
                "baseline_python/drain_s": round(p_drain, 4),
                "baseline_python/tokens_per_s": round(p_tok / (p_app + p_drain)),
                "speedup": round((p_app + p_drain) / (r_app + r_drain), 2),
                "idle_bytes_per_episode": TrajectoryStore.idle_bytes_per_episode(),
            }
        )
    )


if __name__ == "__main__":
    main()
