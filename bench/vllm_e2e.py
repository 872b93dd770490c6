"""End-to-end rollout throughput on real vLLM (in-process AsyncLLM, tiny model, CPU).

    python bench/vllm_e2e.py --json [--concurrency 256] [--episodes 256] [--turns 4]
                                    [--tokens 32] [--vary-episodes 1024] [--vary-max-turns 8]

One vLLM engine serves every phase (one startup). Every model turn is exactly ``--tokens``
sampled tokens: a bench-only backend proxy (:class:`FixedLengthTurns`) asks for them with
``ignore_eos`` and no stop token and reports the turn as finished, so the engine appends the
end-of-turn token as a prompt token and the episode goes on. Phases:

(a)/(b) fixed horizon. The engine plays ``--episodes`` maze episodes with ``max_turns =
  --turns`` (a random tiny model's actions are invalid moves, so episodes last exactly
  ``--turns`` turns; the realised turn counts are reported). ``raw`` replays the same token
  workload on the bare AsyncLLM: every episode's prompt, the same number of generated tokens
  per turn, then the engine's own observation tokens appended, with all episodes' turn k
  submitted at once and turn k+1 after it (prefix-cache structure as in the engine).
  Reported: ``raw_tokens_per_s``, ``engine_tokens_per_s`` and their ratio (target >= 0.9).

(c) varying horizon. ``--vary-episodes`` episodes of maze whose horizon is drawn per task
  from 1..``--vary-max-turns`` (env ``bench/maze_horizon``, a Python env around the native
  maze that ends the episode at its horizon). Baseline: AgentGym-RL's synchronous rollout,
  batches of ``--concurrency`` episodes, per turn one batched generate for all live episodes
  (all submitted to the AsyncLLM at once) then every env stepped, repeated until the batch is
  done. The engine plays the same tasks with ``max_concurrency = --concurrency``. Reported:
  ``barrier_trajectories_per_s``, ``engine_vary_trajectories_per_s`` and their ratio
  ``engine_over_barrier`` (target >= 1.5), with every turn ``--tokens`` tokens; then the
  same with turn k of task t generating ``turn_length(t, k)`` in 1..``--tokens`` tokens
  (identical in both runs, as replies of varying length are in real rollouts):
  ``barrier_vt_trajectories_per_s``, ``engine_vt_trajectories_per_s``,
  ``engine_over_barrier_varied_tokens``; then varied tokens with long-tailed horizons
  (geometric, capped at ``--tail-max-turns``: most episodes end within a few turns, a few
  run to the cap, so each barrier batch ends with a handful of stragglers):
  ``barrier_lt_trajectories_per_s``, ``engine_lt_trajectories_per_s``,
  ``engine_over_barrier_long_tail``.

``raw_tokens_per_s_by_concurrency`` shows how vLLM's throughput here depends on the number
of requests in flight, which is what the barrier gives away as its batches drain.

Measured with ``bench/harness.py``: each comparison (engine vs raw at the fixed horizon;
engine vs barrier per varying-horizon workload) runs one untimed warm-up of each arm (the
varying ones on one batch's worth of tasks), then ``--repeats`` rounds (default 5), the
order alternating (``raw`` replays the engine's latest run's trajectories); the fixed metric
names hold the medians, ``comparisons`` the per-round ratio blocks with their ranges. The
AsyncLLM's engine-core and worker processes run on ``--server-cores`` (their OpenMP threads
bound there), this process on ``--client-cores``.

Prints one JSON object with fixed metric names, settings, hardware and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import sys
import tempfile
import time
import zlib

import msgspec

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench.*

import agentgym  # noqa: E402
from agentgym.envs import BaseEnv  # noqa: E402
from agentgym.parse import parse_actions  # noqa: E402


class FixedLengthTurns:
    """Backend proxy (bench only): each turn is exactly ``tokens`` sampled tokens, or
    ``length(episode_key, turn)`` when given (read from the engine's request id)."""

    def __init__(self, inner, tokens: int, length=None):
        self.inner = inner
        self.tokens = tokens
        self.length = length

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, prompt_ids, sampling, request_id=None):
        n = self.tokens
        if self.length is not None:  # request ids are "{run}-{episode key}-{turn}-{attempt}"
            _, key, turn, _ = request_id.split("-")
            n = self.length(int(key), int(turn))
        s = msgspec.structs.replace(sampling, max_new_tokens=n, ignore_eos=True,
                                    stop_token_ids=[])
        res = await self.inner.generate(prompt_ids, s, request_id=request_id)
        res.finish_reason = "stop"  # a complete turn: the engine appends end-of-turn, goes on
        return res


def horizon_of(task: int, k: int, dist: str = "uniform") -> int:
    """The bench's per-task horizon in 1..k (deterministic): ``uniform``, or ``long_tail``
    (geometric, P(h > j) = 0.75**j, capped at k: most episodes end within a few turns and
    a few run to the cap, as when a policy solves most tasks early)."""
    u = zlib.crc32(f"h{task}".encode())
    if dist == "uniform":
        return 1 + u % k
    if dist == "long_tail":
        x = (u + 0.5) / 2**32
        return min(k, 1 + int(math.log(x) / math.log(0.75)))
    raise ValueError(f"unknown horizon distribution {dist!r}")


def turn_length(task: int, turn: int, n: int) -> int:
    """Tokens of turn ``turn`` of task ``task`` in the varied-length runs: 1..n."""
    return 1 + zlib.crc32(f"t{task}:{turn}".encode()) % n


class MazeHorizon(BaseEnv):
    """Native maze whose episode ends (done) after ``horizon_of(task, max_h)`` turns."""

    num_tasks = 10**6

    def __init__(self, max_h: int = 8, dist: str = "uniform"):
        self.pool = agentgym.EnvPool("maze", 1, seed=0)
        self.instructions = self.pool.instructions
        self.max_h = max_h
        self.dist = dist

    def reset(self, task=None, seed=None):
        task = int(task or 0)
        self.h, self.t = horizon_of(task, self.max_h, self.dist), 0
        return self.pool.reset([0], tasks=[task], seeds=[int(seed or 0)])[0]

    def step(self, action):
        (obs,), rew, term, _ = self.pool.step([0], [action])
        self.t += 1
        done = bool(term[0]) or self.t >= self.h
        if done and not term[0]:
            self.pool.finish([0], "done")
        return obs, float(rew[0]), done, {}


async def raw_generate(llm, prompts: list[list[int]], tokens, tag: str) -> list[list[int]]:
    """All ``prompts`` submitted to the AsyncLLM at once; exactly ``tokens`` tokens each
    (an int, or one int per prompt)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    counts = [tokens] * len(prompts) if isinstance(tokens, int) else list(tokens)

    async def one(i, p, n):
        sp = SamplingParams(max_tokens=n, ignore_eos=True, logprobs=0, detokenize=False,
                            output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        async for out in llm.generate(TokensPrompt(prompt_token_ids=p), sp, f"{tag}-{i}"):
            final = out
        return list(final.outputs[0].token_ids)

    return await asyncio.gather(*(one(i, p, n) for i, (p, n) in enumerate(zip(prompts, counts))))


def _runs(traj):
    """[(mask, tokens)] maximal runs of equal loss-mask value."""
    out = []
    for tok, m in zip(traj.token_ids, traj.loss_mask):
        if out and out[-1][0] == m:
            out[-1][1].append(tok)
        else:
            out.append((m, [tok]))
    return out


async def raw_replay(llm, trajs, tag: str) -> tuple[int, float]:
    """The engine's token workload on the bare AsyncLLM, one round per turn."""
    plans = []
    for t in trajs:
        runs = _runs(t)
        turns = [(len(ids), runs[i + 1][1] if i + 1 < len(runs) else [])
                 for i, (m, ids) in enumerate(runs) if m == 1]
        plans.append((list(runs[0][1]), turns))
    prompts = [p for p, _ in plans]
    generated, k = 0, 0
    t0 = time.perf_counter()
    while True:
        live = [i for i, (_, turns) in enumerate(plans) if k < len(turns)]
        if not live:
            break
        n = plans[live[0]][1][k][0]
        assert all(plans[i][1][k][0] == n for i in live), "turns of unequal length"
        outs = await raw_generate(llm, [prompts[i] for i in live], n, f"{tag}-{k}")
        for i, out in zip(live, outs):
            prompts[i] = prompts[i] + out + plans[i][1][k][1]
            generated += len(out)
        k += 1
    return generated, time.perf_counter() - t0


async def barrier_rollout(llm, fmt, tasks, batch: int, length, max_h: int, tag: str,
                          dist: str = "uniform"):
    """AgentGym-RL's synchronous rollout: per turn one batched generate, then step all envs.
    Turn ``k`` of task ``t`` generates ``length(t, k)`` tokens."""
    envs = [agentgym.make("bench/maze_horizon", max_h=max_h, dist=dist) for _ in range(batch)]
    system = envs[0].unwrapped.instructions
    done_eps, generated, rnd = 0, 0, 0
    t0 = time.perf_counter()
    for start in range(0, len(tasks), batch):
        chunk = tasks[start:start + batch]
        ids, live, turn = [], list(range(len(chunk))), 0
        for i, task in enumerate(chunk):
            obs, _ = envs[i].reset(seed=task, options={"task": task})
            ids.append(fmt.initial_prompt(system, obs))
        while live:
            counts = [length(chunk[i], turn) for i in live]
            outs = await raw_generate(llm, [ids[i] for i in live], counts, f"{tag}{rnd}")
            rnd += 1
            turn += 1
            actions = parse_actions(fmt.decode_batch(outs), "auto")
            still, new_obs = [], []
            for i, out, a in zip(live, outs, actions):
                generated += len(out)
                obs, _, term, trunc, _ = envs[i].step(a or "")
                ids[i] = ids[i] + out + [fmt.end_of_turn_id]
                if term or trunc:
                    done_eps += 1
                else:
                    still.append(i)
                    new_obs.append(obs)
            for i, o in zip(still, fmt.observation_ids(new_obs)):
                ids[i] = ids[i] + o
            live = still
    return done_eps, generated, time.perf_counter() - t0


async def concurrency_sweep(llm, fmt, tokens: int, top: int) -> dict[str, float]:
    """Raw AsyncLLM tokens/s with c requests in flight (rounds of c maze prompts)."""
    pool = agentgym.EnvPool("maze", top, seed=0)
    prompts = [fmt.initial_prompt(pool.instructions, o) for o in pool.reset()]
    out, c = {}, top
    while c >= 16:
        rounds = max(1, (2 * top) // c)
        t0 = time.perf_counter()
        for r in range(rounds):
            await raw_generate(llm, prompts[:c], tokens, f"sweep{c}-{r}")
        out[str(c)] = c * rounds * tokens / (time.perf_counter() - t0)
        c //= 4
    return out


@contextlib.contextmanager
def _profiled(path: str | None):
    """cProfile the block when ``path`` is set: stats saved there, top functions to stderr."""
    if not path:
        yield
        return
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        prof.dump_stats(path)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


async def run(args) -> dict:
    from transformers import AutoTokenizer

    from agentgym.backends.vllm_backend import VLLMBackend
    from agentgym.engine import RolloutEngine
    from agentgym.models import build_tiny_model
    from bench.harness import Harness

    hs = Harness.from_args(args)
    agentgym.register("bench/maze_horizon", MazeHorizon, override=True)
    load0 = os.getloadavg()
    model_dir = args.model_dir or str(build_tiny_model(tempfile.mkdtemp(prefix="tiny-"), seed=0))
    tok = AutoTokenizer.from_pretrained(model_dir)
    t0 = time.perf_counter()
    with hs.starting_server():  # the engine-core and worker processes on the server cores
        vllm = await asyncio.to_thread(
            VLLMBackend, model_dir, max_model_len=4096, max_num_seqs=args.concurrency,
            kv_cache_space_gib=args.kv_cache_gib, enforce_eager=True,
        )
    hs.children_started()
    startup_s = time.perf_counter() - t0
    backend = FixedLengthTurns(vllm, args.tokens)
    eng = RolloutEngine(backend, tok, max_new_tokens=args.tokens, max_total_tokens=4096,
                        max_concurrency=args.concurrency, progress=False)
    llm = vllm.engine
    comparisons = []
    try:
        await eng.collect(min(args.episodes, 64), "maze", max_turns=2)  # warm-up
        # (a)/(b) fixed horizon: the engine, and raw vLLM replaying the engine's latest
        # trajectories (the same token workload), interleaved by the harness
        latest: dict = {}

        async def engine_fixed() -> dict:
            c0 = time.process_time()
            batch = await eng.collect(args.episodes, "maze", max_turns=args.turns)
            latest["trajs"] = batch.trajectories
            wall = batch.metrics["timing_s/gen"]
            tokens = sum(sum(t.loss_mask) for t in batch)
            return {"tokens_per_s": tokens / wall, "tokens": tokens, "wall_s": wall,
                    "client_cpu_s": time.process_time() - c0,
                    "num_turns_mean": batch.metrics["num_turns/mean"],
                    "num_turns_min": min(t.num_turns for t in batch)}

        async def raw_fixed() -> dict:
            c0 = time.process_time()
            tokens, wall = await raw_replay(llm, latest["trajs"], f"raw{time.monotonic_ns()}")
            return {"tokens_per_s": tokens / wall, "tokens": tokens, "wall_s": wall,
                    "client_cpu_s": time.process_time() - c0}

        block, fixed = await hs.acompare(
            f"fixed horizon {args.turns}, {args.concurrency} in flight, tokens/s",
            {"engine": engine_fixed, "raw": raw_fixed}, metric="tokens_per_s",
            numerator="engine", denominator="raw")
        comparisons.append(block)
        sweep = await concurrency_sweep(llm, eng.formatter, args.tokens, args.concurrency)
        # (c) varying horizon: AgentGym-RL barrier vs the engine, same tasks; turns of
        # --tokens tokens, then turns of turn_length(task, turn) tokens
        tasks = list(range(args.vary_episodes))
        vary = {}
        varied = lambda t, k: turn_length(t, k, args.tokens)  # noqa: E731
        for name, fn, dist, max_h in [
            ("fixed", lambda t, k: args.tokens, "uniform", args.vary_max_turns),
            ("varied", varied, "uniform", args.vary_max_turns),
            ("long_tail", varied, "long_tail", args.tail_max_turns),
        ]:
            def barrier_arm(ts, name=name, fn=fn, dist=dist, max_h=max_h):
                async def go() -> dict:
                    c0 = time.process_time()
                    eps, tokens, wall = await barrier_rollout(
                        llm, eng.formatter, ts, args.concurrency, fn, max_h,
                        f"{name}{time.monotonic_ns()}-", dist)
                    return {"trajectories_per_s": eps / wall, "tokens": tokens,
                            "wall_s": wall, "client_cpu_s": time.process_time() - c0}
                return go

            def engine_arm(ts, fn=fn, dist=dist, max_h=max_h, profile=False):
                async def go() -> dict:
                    # A fresh engine: episode keys count from 0, so key == task index here.
                    veng = RolloutEngine(FixedLengthTurns(vllm, args.tokens, fn), tok,
                                         max_new_tokens=args.tokens, max_total_tokens=4096,
                                         max_concurrency=args.concurrency, progress=False)
                    c0 = time.process_time()
                    try:
                        with _profiled(args.profile if profile else None):
                            vb = await veng.collect(ts, "bench/maze_horizon", max_turns=max_h,
                                                    env_kwargs={"max_h": max_h, "dist": dist})
                    finally:
                        veng.close()
                    wall = vb.metrics["timing_s/gen"]
                    return {"trajectories_per_s": len(vb) / wall,
                            "tokens": sum(sum(t.loss_mask) for t in vb), "wall_s": wall,
                            "client_cpu_s": time.process_time() - c0,
                            "num_turns_mean": vb.metrics["num_turns/mean"],
                            "stop_reasons": {k.split("/", 1)[1]: v
                                             for k, v in vb.metrics.items()
                                             if k.startswith("stop_reason/")}}
                return go

            warm = tasks[:args.concurrency]  # the untimed warm-up: one batch's worth
            block, runs = await hs.acompare(
                f"{name} horizons, {args.concurrency} in flight, trajectories/s",
                {"engine": engine_arm(tasks, profile=True), "barrier": barrier_arm(tasks)},
                warmups={"engine": engine_arm(warm), "barrier": barrier_arm(warm)},
                metric="trajectories_per_s", numerator="engine", denominator="barrier")
            block.update({"horizons": dist, "max_turns": max_h})
            comparisons.append(block)
            vary[name] = {
                "barrier_trajectories_per_s": block["arms"]["barrier"]["median"],
                "engine_trajectories_per_s": block["arms"]["engine"]["median"],
                "engine_over_barrier": block["ratio"]["median"],
                "engine_over_barrier_range": [block["ratio"]["min"], block["ratio"]["max"]],
                "tie": block["tie"], "runs": runs, "horizons": dist, "max_turns": max_h,
            }
    finally:
        eng.close()
        await vllm.close()
    fx = comparisons[0]
    return {
        "bench": "vllm_e2e",
        "method": "bench/harness.py: one untimed warm-up of each arm, then --repeats "
                  "interleaved rounds; every ratio = median of per-round ratios (range in "
                  "comparisons)",
        "raw_tokens_per_s": fx["arms"]["raw"]["median"],
        "engine_tokens_per_s": fx["arms"]["engine"]["median"],
        "engine_over_raw": fx["ratio"]["median"],
        "barrier_trajectories_per_s": vary["fixed"]["barrier_trajectories_per_s"],
        "engine_vary_trajectories_per_s": vary["fixed"]["engine_trajectories_per_s"],
        "engine_over_barrier": vary["fixed"]["engine_over_barrier"],
        "barrier_vt_trajectories_per_s": vary["varied"]["barrier_trajectories_per_s"],
        "engine_vt_trajectories_per_s": vary["varied"]["engine_trajectories_per_s"],
        "engine_over_barrier_varied_tokens": vary["varied"]["engine_over_barrier"],
        "barrier_lt_trajectories_per_s": vary["long_tail"]["barrier_trajectories_per_s"],
        "engine_lt_trajectories_per_s": vary["long_tail"]["engine_trajectories_per_s"],
        "engine_over_barrier_long_tail": vary["long_tail"]["engine_over_barrier"],
        "comparisons": comparisons,
        "vary_runs": vary,
        "raw_tokens_per_s_by_concurrency": sweep,
        "fixed_runs": fixed,
        "raw_mode": "AsyncLLM, all episodes' turn k submitted at once, turn by turn "
                    "(the engine's latest run's observation tokens replayed)",
        "settings": {"concurrency": args.concurrency, "episodes": args.episodes,
                     "turns": args.turns, "tokens_per_turn": args.tokens,
                     "vary_episodes": args.vary_episodes, "vary_max_turns": args.vary_max_turns,
                     "tail_max_turns": args.tail_max_turns,
                     "repeats": args.repeats, "env": "maze", "vary_env": "bench/maze_horizon",
                     "model": "tiny Qwen2 (2 layers, hidden 128) float32, enforce_eager",
                     "vllm_startup_s": startup_s},
        "hardware": {"cpu_count": os.cpu_count(), "cpu_model": _cpu_model(),
                     "machine": platform.machine()},
        "load_avg_start": list(load0),
        "load_avg_end": list(os.getloadavg()),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--vary-episodes", type=int, default=1024)
    ap.add_argument("--vary-max-turns", type=int, default=8)
    ap.add_argument("--tail-max-turns", type=int, default=16)
    ap.add_argument("--kv-cache-gib", type=int, default=2)
    ap.add_argument("--model-dir", default=None, help="model folder (default: build tiny)")
    ap.add_argument("--profile", default=None,
                    help="cProfile the engine's varying-horizon runs into this file")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    from bench.harness import add_arguments, write_json_atomic

    add_arguments(ap)
    args = ap.parse_args(argv)
    # vLLM logs to stdout by default; without its logging config its warnings go to stderr
    # and stdout carries only the JSON object.
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    from agentgym.engine.loop import run as run_loop

    out = run_loop(run(args))
    if args.out:
        write_json_atomic(args.out, out)
    print(json.dumps(out, indent=None if args.json else 2))
    return out


if __name__ == "__main__":
    main()
