"""Scale-out: Ray rollout workers against the in-process engine, and the data-parallel learner
at 1 vs 2 ranks.

    python bench/distributed.py --json [--latency-ms 0 5 50] [--min-seconds 10]
                                [--concurrency 256] [--repeats 3] [--learner-steps 5]
                                [--device cpu|cuda]

Rollouts: native maze, the scripted oracle (no model, so the engine and the Ray path are all
there is to measure), one row per reply latency (``--latency-ms``: 0 is instant replies, where
the Ray path's fixed costs are most visible; 5 and 50 ms are what an inference server takes
per reply), the same requests played

* in process (one ``RolloutEngine``, ``--concurrency`` episodes in flight),
* on 1 Ray worker (``--concurrency`` in flight on it),
* on 2 Ray workers (``--concurrency / 2`` each: the same total in flight),
* on 1 Ray worker handed chunks of a quarter of its concurrency (the pool's default chunk
  is its whole concurrency; each chunk is one actor call and about one message back).

Each timed run lasts at least ``--min-seconds``: the episode count of a row is calibrated
from a warm-up in-process run (``--episodes`` fixes it instead), so a fixed few tenths of a
second of Ray start-up per run do not decide the ratio. Workers are started and warmed up
before the clock starts; each Ray run alternates with an in-process run, so both see the
same load. Reports trajectories/s and turns/s per path (best of ``--repeats``; in process,
best of all its runs), ``ray_1_worker_vs_in_process`` (target >= 0.8),
``ray_1_worker_cost_us_per_trajectory`` (the wall time the Ray path adds per trajectory)
and ``scaling_2_vs_1_workers``.

Learner: ``policy_update`` on the tiny model on a fixed batch, 1 process vs 2 gloo ranks
(NCCL on ``--device cuda``, one GPU per rank) splitting the batch by tokens; model tokens
and all tokens per second over ``--learner-steps`` updates after one warm-up update."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import tempfile
import time

import numpy as np


def rollout_bench(model_dir: str, concurrency: int, repeats: int, max_turns: int,
                  latency_s: float, min_seconds: float, episodes: int | None = None) -> dict:
    """One latency row: the in-process engine and the Ray paths on the same requests, each
    timed run lasting at least ``min_seconds`` (the episode count is calibrated from a warm-up
    in-process run unless ``episodes`` is given)."""
    import ray
    from transformers import AutoTokenizer

    from agentgym.backends.scripted import ScriptedBackend
    from agentgym.distributed.rollout_workers import RayRolloutPool, WorkerSpec, init_ray
    from agentgym.engine import EpisodeRequest, RolloutEngine

    async def timed(runner, reqs) -> tuple[float, int]:
        t0 = time.perf_counter()
        turns = n = 0
        async for t in runner.stream_requests(reqs, "maze"):
            turns += t.num_turns
            n += 1
        assert n == len(reqs)
        return time.perf_counter() - t0, turns

    tok = AutoTokenizer.from_pretrained(model_dir)
    backend_kwargs = {"policy": "oracle", "latency_s": latency_s}
    engine = RolloutEngine(ScriptedBackend(tok, **backend_kwargs), tok, max_turns=max_turns,
                           max_concurrency=concurrency, progress=False)
    if episodes is None:  # calibrate: enough episodes for min_seconds at the in-process rate
        probe = [EpisodeRequest(g, g) for g in range(max(concurrency, 256))]
        wall, _ = asyncio.run(timed(engine, probe))
        episodes = max(len(probe), int(min_seconds * len(probe) / wall * 1.1))
    else:
        asyncio.run(timed(engine, [EpisodeRequest(g, g) for g in range(concurrency)]))
    reqs = [EpisodeRequest(g, g) for g in range(episodes)]

    def best(runs: list[tuple[float, int]]) -> dict:
        wall, turns = min(runs)
        return {"trajectories_per_s": episodes / wall, "turns_per_s": turns / wall,
                "wall_s": wall, "wall_s_runs": [r[0] for r in runs]}

    local: list[tuple[float, int]] = []
    out = {}
    init_ray(num_cpus=os.cpu_count())
    for name, workers, chunk in (("ray_1_worker", 1, None), ("ray_2_worker", 2, None),
                                 ("ray_1_worker_quarter_chunks", 1, max(1, concurrency // 4))):
        spec = WorkerSpec(model_dir, backend="scripted", backend_kwargs=backend_kwargs,
                          rollout={"max_turns": max_turns,
                                   "max_concurrency": concurrency // workers},
                          num_cpus=1)
        pool = RayRolloutPool(spec, num_workers=workers, chunk_size=chunk)
        try:
            asyncio.run(timed(pool, reqs[:concurrency]))  # warm-up: workers and env pools
            runs = []
            for _ in range(repeats):  # interleaved with in-process runs: same load
                local.append(asyncio.run(timed(engine, reqs)))
                runs.append(asyncio.run(timed(pool, reqs)))
            out[name] = best(runs)
        finally:
            pool.close()
    ray.shutdown()
    engine.close()
    out = {"latency_ms": latency_s * 1e3, "episodes": episodes, "in_process": best(local),
           **out}
    tp = {k: v["trajectories_per_s"] for k, v in out.items() if isinstance(v, dict)}
    out["ray_1_worker_vs_in_process"] = tp["ray_1_worker"] / tp["in_process"]
    # What the Ray path adds per trajectory: wall time per trajectory over in process's.
    out["ray_1_worker_cost_us_per_trajectory"] = (1 / tp["ray_1_worker"]
                                                  - 1 / tp["in_process"]) * 1e6
    out["scaling_2_vs_1_workers"] = tp["ray_2_worker"] / tp["ray_1_worker"]
    out["ray_1_worker_quarter_chunks_vs_in_process"] = (tp["ray_1_worker_quarter_chunks"]
                                                        / tp["in_process"])
    return out


def _batch(vocab: int, n: int, length: int, seed: int = 0):
    from agentgym.data import Trajectory, pack

    rng = np.random.default_rng(seed)
    trajs = []
    for k in range(n):
        ln = int(rng.integers(length // 2, length + 1))
        prompt = ln // 4
        mask = [0] * prompt + [int(x) for x in rng.random(ln - prompt) < 0.6]
        trajs.append(Trajectory(
            task_id=k, env_id="bench", group_id=k // 4, sample_index=k % 4,
            token_ids=rng.integers(3, vocab, ln).tolist(), loss_mask=mask,
            logprobs=[-1.0 * m for m in mask], prompt_len=prompt, turn_rewards=[0.0],
            reward=float(rng.random()), num_turns=1, stop_reason="done", policy_version=0))
    return pack(trajs)


def _learner_rank(rank: int, world: int, port: int, model_dir: str, steps: int, n: int,
                  length: int, device: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from agentgym.learner.update import LearnerConfig, make_optimizer, policy_update

    torch.set_num_threads(1 if device == "cpu" else 4)
    dp = None
    dev = torch.device(device if device == "cpu" else f"cuda:{rank}")
    if world > 1:
        from agentgym.distributed.ddp import DataParallel

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=rank,
                                world_size=world)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev)
    if world > 1:
        dp = DataParallel(model)
    cfg = LearnerConfig(lr=1e-4, use_kl_loss=False, max_tokens_per_microbatch=8192)
    opt = make_optimizer(model, cfg)
    pb = _batch(model.config.vocab_size, n, length)
    policy_update(model, opt, pb, cfg, data_parallel=dp)  # warm-up
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        policy_update(model, opt, pb, cfg, data_parallel=dp)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"wall_s": wall, "tokens": int(pb.num_tokens) * steps,
                       "model_tokens": int(pb.loss_mask.sum()) * steps}, f)


def learner_bench(model_dir: str, steps: int, n: int, length: int, device: str) -> dict:
    import torch.multiprocessing as mp

    res = {}
    for world in (1, 2):
        with tempfile.NamedTemporaryFile(suffix=".json") as f, socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
            mp.spawn(_learner_rank, args=(world, port, model_dir, steps, n, length, device,
                                          f.name), nprocs=world, join=True)
            r = json.load(open(f.name))
        res[f"ranks_{world}"] = {"tokens_per_s": r["tokens"] / r["wall_s"],
                                 "model_tokens_per_s": r["model_tokens"] / r["wall_s"],
                                 "wall_s": r["wall_s"]}
    res["scaling_2_vs_1_ranks"] = (res["ranks_2"]["tokens_per_s"]
                                   / res["ranks_1"]["tokens_per_s"])
    res.update(batch_trajectories=n, max_length=length, steps=steps, device=device)
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--episodes", type=int, default=None,
                    help="episodes per timed run (default: calibrated to --min-seconds)")
    ap.add_argument("--min-seconds", type=float, default=10.0,
                    help="the shortest timed run when --episodes is not given")
    ap.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 5.0, 50.0],
                    help="the scripted backend's reply latency, one rollout row each")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--max-turns", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--learner-steps", type=int, default=5)
    ap.add_argument("--learner-batch", type=int, default=64)
    ap.add_argument("--learner-length", type=int, default=256)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--skip-rollouts", action="store_true")
    ap.add_argument("--model-dir", default=None, help="tiny model folder (default: build one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    model_dir = args.model_dir
    tmp = None
    if model_dir is None:
        from agentgym.models import build_tiny_model

        tmp = tempfile.TemporaryDirectory()
        model_dir = str(build_tiny_model(tmp.name, seed=0))
    out = {"bench": "distributed", "host": platform.node(), "cpus": os.cpu_count(),
           "load_avg": os.getloadavg()[0], "concurrency": args.concurrency,
           "min_seconds": args.min_seconds}
    if not args.skip_rollouts:
        out["rollouts"] = [rollout_bench(model_dir, args.concurrency, args.repeats,
                                         args.max_turns, ms / 1e3, args.min_seconds,
                                         args.episodes) for ms in args.latency_ms]
    out["learner"] = learner_bench(model_dir, args.learner_steps, args.learner_batch,
                                   args.learner_length, args.device)
    out["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=None if args.json else 2))
    if tmp is not None:
        tmp.cleanup()
    return out


if __name__ == "__main__":
    main()
