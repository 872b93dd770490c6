"""Partial rollouts on long-tailed episodes, in one run: generated tokens/s and the share of
generation time with fewer than half the rollout slots busy, with a barrier at each weight
update and without.

Both arms play the same requests (tasks, env seeds, per-episode horizons, in the same order)
on one in-process vLLM-CPU backend with at most ``--slots`` episodes in flight, and push the
same weights through the backend ``--batches`` times (one push per ``--groups`` finished
GRPO groups of ``--samples``), so the policy and the work are the same in both:

* ``barrier`` (the synchronous loop): a batch's episodes all end, then the weights are
  pushed, then the next batch starts; the slots empty as the batch's long episodes finish.
* ``stream`` (partial rollouts, the fully asynchronous mode): one open stream keeps every
  slot taken; each push lands while episodes are in flight (the backend's
  :class:`~agentgym.backends.base.WeightGate` lets the running replies finish under the old
  weights), and an episode that spans it carries on under the new ones.

Workloads: ``maze8`` is the main job's maze and rollout settings at the horizon-8 stage
(a reply cut at 12 tokens ends its episode, so episode lengths run from 1 to 8 turns);
``textcraft_mixed`` is TextCraft with each group's horizon drawn from 5, 10, 20 and 30 turns
(a mixed-length batch). ``--model`` picks the policy (default: a fresh tiny model; a warmed
model from ``bench/async_train.py``'s work folder plays well-formed moves).

Per run: ``tokens_per_s`` (the model's tokens, loss mask, over the run's wall time);
``low_occupancy_share`` (the share of generation time with fewer than ``--slots / 2``
episodes in flight, sampled every 10 ms; the barrier arm's pushes are not generation time);
``mean_in_flight``; ``partial_share`` (trajectories that spanned a push); ``push_s`` (the
pushes' own seconds, the barrier's drain included). Arms interleave after a warm-up of each
(``bench/harness.py``); the ratio is the median of per-round ratios with its range. The
vLLM engine runs on the server core, this process (event loop, envs) on the client core.

    python bench/partial_rollouts.py [--workloads maze8 textcraft_mixed] [--slots 64]
        [--groups 8] [--samples 8] [--batches 6] [--model DIR] [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from harness import Harness, add_arguments, spread, write_json_atomic  # noqa: E402

MAZE_PROMPT = "Maze. Reply with Action: move north, move south, move east or move west."

#: workload -> (env, env kwargs, engine settings, horizons drawn per group)
WORKLOADS = {
    "maze8": ("maze", {"size": 4, "loops": 60, "goal_hint": True, "show_position": False,
                       "shaping": 0.1},
              {"max_new_tokens": 12, "truncated_turn": "end", "system_prompt": MAZE_PROMPT},
              (8,)),
    "textcraft_mixed": ("textcraft", {}, {"max_new_tokens": 12, "truncated_turn": "step"},
                        (5, 10, 20, 30)),
}


def make_requests(workload: str, args, round_seed: int) -> list[list]:
    """``--batches`` batches of ``--groups`` groups x ``--samples`` requests, each group with
    a task and a horizon drawn from ``round_seed``."""
    from agentgym.engine.episode import EpisodeRequest

    horizons = WORKLOADS[workload][3]
    rng = np.random.default_rng(round_seed)
    out, g = [], round_seed * 100_000
    for _ in range(args.batches):
        batch = []
        for _ in range(args.groups):
            task, h = int(rng.integers(0, 10_000)), int(rng.choice(horizons))
            batch += [EpisodeRequest(task, g, s, max_turns=h) for s in range(args.samples)]
            g += 1
        out.append(batch)
    return out


class Occupancy:
    """Episodes in flight, sampled every 10 ms while generation is on."""

    def __init__(self, slots: int):
        self.slots = slots
        self.in_flight = 0
        self.generating = True
        self.samples: list[int] = []
        self._task: asyncio.Task | None = None

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(0.01)
            if self.generating:
                self.samples.append(self.in_flight)

    def __enter__(self):
        self._task = asyncio.ensure_future(self._sample())
        return self

    def __exit__(self, *exc):
        self._task.cancel()

    def row(self) -> dict:
        s = np.asarray(self.samples or [0])
        return {"low_occupancy_share": round(float(np.mean(s < self.slots / 2)), 4),
                "mean_in_flight": round(float(s.mean()), 2)}


async def play(engine, env: str, env_kwargs: dict, requests: list, occ: Occupancy,
               on_traj=None) -> list:
    """Play ``requests`` with at most ``occ.slots`` in flight; returns the trajectories."""
    freed = asyncio.Event()

    async def feed():
        for r in requests:
            while occ.in_flight >= occ.slots:
                freed.clear()
                await freed.wait()
            occ.in_flight += 1
            yield r

    out = []
    async for t in engine.stream_requests(feed(), env, env_kwargs=env_kwargs):
        occ.in_flight -= 1
        freed.set()
        out.append(t)
        if on_traj is not None:
            on_traj(t)
    return out


async def push(backend, weights, pushes: list) -> None:
    t0 = time.perf_counter()
    await backend.update_weights(weights)
    pushes.append(time.perf_counter() - t0)


async def run_barrier(engine, backend, weights, workload, batches, slots) -> dict:
    env, kw = WORKLOADS[workload][:2]
    occ, pushes, trajs = Occupancy(slots), [], []
    t0 = time.perf_counter()
    with occ:
        for batch in batches:
            trajs += await play(engine, env, kw, batch, occ)
            occ.generating = False
            await push(backend, weights, pushes)
            occ.generating = True
    return _row(trajs, time.perf_counter() - t0, occ, pushes)


async def run_stream(engine, backend, weights, workload, batches, slots, groups,
                     samples) -> dict:
    env, kw = WORKLOADS[workload][:2]
    occ, pushes, pending = Occupancy(slots), [], []
    rows: dict[int, int] = {}
    finished = [0]

    def on_traj(t):
        rows[t.group_id] = rows.get(t.group_id, 0) + 1
        if rows[t.group_id] == samples:
            finished[0] += 1
            if finished[0] % groups == 0:  # a batch's worth finished: push, no barrier
                pending.append(asyncio.ensure_future(push(backend, weights, pushes)))

    t0 = time.perf_counter()
    with occ:
        trajs = await play(engine, env, kw, [r for b in batches for r in b], occ, on_traj)
        await asyncio.gather(*pending)
    return _row(trajs, time.perf_counter() - t0, occ, pushes)


def _row(trajs, wall: float, occ: Occupancy, pushes: list) -> dict:
    tokens = sum(int(np.sum(t.loss_mask)) for t in trajs)
    turns = [t.num_turns for t in trajs]
    return {"wall_s": round(wall, 3), "generated_tokens": tokens,
            "tokens_per_s": round(tokens / wall, 1), "trajectories": len(trajs),
            "turns_p50": float(np.percentile(turns, 50)),
            "turns_max": int(max(turns)), **occ.row(),
            "partial_share": round(float(np.mean([bool(t.version_at) for t in trajs])), 4),
            "pushes": len(pushes), "push_s": round(sum(pushes), 3)}


async def bench(args, h: Harness) -> dict:
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.backends.vllm_backend import VLLMBackend
    from agentgym.engine import RolloutEngine
    from agentgym.models import build_tiny_model

    model_dir = args.model or str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny", seed=0))
    tok = AutoTokenizer.from_pretrained(model_dir)
    weights = {k: v.detach().clone() for k, v in AutoModelForCausalLM.from_pretrained(
        model_dir, torch_dtype=torch.float32).state_dict().items()}
    with h.starting_server():
        backend = await asyncio.to_thread(VLLMBackend, model_dir, enforce_eager=True,
                                          max_num_seqs=args.slots, seed=0)
    h.children_started()
    blocks = {}
    try:
        for workload in args.workloads:
            settings = WORKLOADS[workload][2]
            engine = RolloutEngine(backend, tok, max_turns=max(WORKLOADS[workload][3]),
                                   max_total_tokens=1024, max_concurrency=args.slots,
                                   temperature=1.0, progress=False, **settings)
            def arm(kind, engine=engine, workload=workload):
                calls = iter(range(1_000))  # the k-th run of each arm plays the same requests

                async def one():
                    batches = make_requests(workload, args, next(calls))
                    if kind == "barrier":
                        return await run_barrier(engine, backend, weights, workload, batches,
                                                 args.slots)
                    return await run_stream(engine, backend, weights, workload, batches,
                                            args.slots, args.groups, args.samples)
                return one

            block, rows = await h.acompare(
                workload, {"stream": arm("stream"), "barrier": arm("barrier")},
                metric="tokens_per_s", numerator="stream", denominator="barrier")
            block["arms"] = {a: {k: spread([r[k] for r in rs]) for k in
                                 ("tokens_per_s", "low_occupancy_share", "mean_in_flight",
                                  "partial_share", "push_s", "wall_s")}
                             for a, rs in rows.items()}
            block["runs"] = rows
            blocks[workload] = block
    finally:
        await backend.close()
    return {"bench": "partial_rollouts", "model": args.model or "tiny (fresh, seed 0)",
            "slots": args.slots, "groups_per_push": args.groups, "samples": args.samples,
            "batches": args.batches, "cpu_count": os.cpu_count(), "workloads": blocks}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--groups", type=int, default=8, help="groups per weight push")
    ap.add_argument("--samples", type=int, default=8, help="episodes per group")
    ap.add_argument("--batches", type=int, default=6, help="weight pushes per run")
    ap.add_argument("--model", default=None, help="model folder (default: a fresh tiny model)")
    ap.add_argument("--out", default=None)
    add_arguments(ap, repeats=3)
    args = ap.parse_args(argv)
    h = Harness.from_args(args)
    report = asyncio.run(bench(args, h))
    print(json.dumps(report, indent=1))
    if args.out:
        write_json_atomic(args.out, report)
    return report


if __name__ == "__main__":
    main()
