"""TRL 1.16's own multi-turn generation path (``GRPOTrainer(environment_factory=...)``, its
tool-calling loop) against the agentgym ``rollout_func`` adapter, same model, same run.

    python bench/peer_trl_rollout.py [--tasks 4] [--num-generations 4] [--max-turns 4]
        [--max-new-tokens 96] [--repeats 3] [--warmup-steps 200] [--warmup-lr 3e-3]
        [--model tiny|smollm2-135m|FOLDER] [--out PATH]

The peer is TRL's code as installed, nothing patched: two ``trl.GRPOTrainer`` objects on the
same model folder, CPU, transformers generation (``use_vllm=False`` in both arms: vLLM is
not shared here), temperature 1, top_p 1. Each arm is timed through the trainer's own
``GRPOTrainer._generate_and_score_completions(inputs)`` (what ``training_step`` calls for a
batch), so both pay the same scoring and bookkeeping around generation:

- ``trl``: ``GRPOTrainer(environment_factory=MazeToolEnv, ...)``. TRL probes the env class for
  its tools (``move``), gives the tokenizer its response parser
  (``trl.chat_template_utils.add_response_schema``, Qwen3 schema) and swaps in its
  prefix-preserving training template; per batch it resets one env per rollout
  (``reset(**row)`` returns the first observation, appended to the prompt), then
  ``_generate`` -> ``_generate_single_turn`` (one batched ``model.generate``) ->
  ``parse_response`` -> ``_tool_call_loop``: while any completion holds a parseable tool
  call it runs the tools (``MazeToolEnv.move`` steps the native maze), appends the
  ``<tool_response>`` tokens and regenerates *only for those rollouts*, one batch per
  iteration (a barrier per turn). The episode ends when a reply has no tool call, at
  ``max_tool_calling_iterations`` (set to ``--max-turns``), or when the completion budget
  ``max_completion_length`` would be exceeded. ``get_reward`` is the env's reward.
- ``agentgym``: ``GRPOTrainer(rollout_func=AgentGymRollout(...))`` on the same tasks: the
  engine plays every episode as its own coroutine over a transformers backend of the same
  model folder (each batch is whatever requests are queued), at most ``--max-turns`` turns.

The model (``--model``): the local tiny model (``agentgym.models.build_tiny_model``, random
weights; the default) or a pretrained one (``smollm2-135m``, or a folder) with TRL's Qwen3
chat template (``trl/chat_templates/qwen3.jinja``, recognised by
``supports_tool_calling`` and ``add_response_schema``), then a short supervised format
warm-up (``--warmup-steps`` AdamW steps on conversations rendered with that template and the
``move`` tool: maze observations as tool responses, replies ``<tool_call>\\n{"name": "move",
"arguments": {"direction": <random>}}\\n</tool_call>``; format only, directions uniform at
random), so that sampled replies are tool calls TRL parses. Both arms use those weights; the
engine's arm renders its conversations with the model's own ChatML template, because
Qwen3's template is not append-only (it drops earlier turns' reasoning), which the engine's
token-exact contexts refuse (``ChatTemplateError``).

What differs, by design of each path (reported, not hidden): TRL's loop prompts with the tool
schema and plays moves through tool calls; the engine's maze prompt asks for ``Action: ...``
replies, which this tool-call-trained model does not write, so most of its turns are invalid
actions (the env still steps and the turn counts). TRL's loop also generates one reply after
the last tool result (so up to ``max_turns + 1`` generations for ``max_turns`` env steps) and
stops an episode on a reply without a tool call; the engine stops at the horizon, the goal or
a reply cut at the token cap. Per-turn tokens: ``generation_kwargs={"max_new_tokens": N}``
caps each TRL generation call (a config argument, not a patch) and ``max_new_tokens`` each
engine turn. So rates are reported per trajectory, per generation call (turn) and per
generated (model) token; the counts come from each arm's own output (TRL: ``tool_mask`` and
``completion_mask``, the env's step counter; engine: the trajectories).

Each run also reports its arm's generation batches, observed around the arm's generate call
(TRL: ``model.generate``; engine: its transformers backend's batch): how many, their mean
rows, their decode steps (either arm's batch runs until its longest reply ends or hits the
cap), and the share of generation time spent in batches of fewer than half the episodes.

Measured with ``bench/harness.py``: one untimed pass of each arm, then ``--repeats`` rounds
(default 5) with the arms' order alternating; the comparison block's ratio (trajectories/s,
engine over TRL) is the median of the per-round ratios with its range, and
``other_ratios`` does the same for turns/s, env steps/s and generated tokens/s; every run
is kept. The process is pinned to ``--client-cores`` (default: every allowed core).
Written to ``bench/results/peer_trl_rollout.json`` (``--out``) and printed as one JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench.harness when run as a script
    sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "peer_trl_rollout.json"
DIRECTIONS = ("north", "south", "east", "west")
TOOL_INSTRUCTIONS = ("You are in a grid maze. Reach the goal. Each turn you see your position "
                     "and what lies to the north, south, east and west: wall, open or goal. "
                     "Call the move tool once per turn.")


class MazeToolEnv:
    """The native maze as a TRL environment: ``reset`` returns the first observation,
    ``move`` steps the env (one tool), ``get_reward`` the episode's reward."""

    max_turns = 4

    def __init__(self):
        import agentgym

        self.env = agentgym.make("maze", max_turns=self.max_turns)
        self.reward, self.steps, self.done = 0.0, 0, False

    def reset(self, **kwargs) -> str:
        obs, _ = self.env.reset(options={"task": int(kwargs["task"])})
        self.reward, self.steps, self.done = 0.0, 0, False
        return "\n" + obs

    def move(self, direction: str) -> str:
        """Move one cell in the maze.

        Args:
            direction: north, south, east or west.
        """
        if self.done:
            raise ValueError("The episode is over.")
        obs, reward, term, trunc = self.env.step(f"move {direction}")[:4]
        self.steps += 1
        self.reward += float(reward)
        self.done = bool(term or trunc)
        return obs

    def get_reward(self) -> float:
        return self.reward


def tool_model(out_dir: str, steps: int, seed: int = 0, batch: int = 8, model: str = "tiny",
               lr: float = 3e-3) -> tuple[str, str]:
    """``model`` (``tiny``: the local tiny model built with ``seed``; else a named model or a
    folder) format-warmed on move tool calls with TRL's Qwen3 template: a folder with that
    template (TRL's arm) and one with the same weights and the model's own ChatML template
    (the engine's arm: Qwen3's template drops earlier turns' reasoning, so a conversation's
    rendering is not append-only, which the engine refuses)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import qwen3_chat_template

    import agentgym
    from agentgym.models import build_tiny_model, resolve_model

    src = (str(build_tiny_model(os.path.join(out_dir, "tiny"), seed=seed)) if model == "tiny"
           else resolve_model(model))
    tok = AutoTokenizer.from_pretrained(src)
    chatml = AutoTokenizer.from_pretrained(src)
    tok.chat_template = qwen3_chat_template
    for t in (tok, chatml):
        if t.pad_token is None:
            t.pad_token = t.eos_token
    net = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    rng = random.Random(seed)
    env = agentgym.make("maze", max_turns=16)
    move = MazeToolEnv.move

    def call(d):
        return {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "move", "arguments": {"direction": d}}}]}

    def conversation() -> str:
        obs, _ = env.reset(options={"task": rng.randrange(10_000)})
        msgs = [{"role": "user", "content": TOOL_INSTRUCTIONS + "\n" + obs}]
        for _ in range(rng.randint(1, 4)):
            d = rng.choice(DIRECTIONS)
            msgs.append(call(d))
            msgs.append({"role": "tool", "name": "move",
                         "content": env.step(f"move {d}")[0]})
        msgs.append(call(rng.choice(DIRECTIONS)))
        return tok.apply_chat_template(msgs, tools=[move], tokenize=False)

    torch.manual_seed(seed)
    opt = torch.optim.AdamW(net.parameters(), lr=lr)
    net.train()
    for _ in range(steps):
        enc = tok([conversation() for _ in range(batch)], return_tensors="pt", padding=True,
                  add_special_tokens=False)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        loss = net(**enc, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    out, out_chatml = os.path.join(out_dir, "tool"), os.path.join(out_dir, "tool_chatml")
    for folder, tokenizer in ((out, tok), (out_chatml, chatml)):
        net.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return out, out_chatml


class BatchLog:
    """The generation batches of one arm, observed around its generate call (changes
    nothing): rows, decode steps and seconds of each, taken per run."""

    def __init__(self, fn, shape):
        """``fn``: the generate call; ``shape(args, kwargs, out)``: its (rows, decode steps)."""
        self.batches: list[tuple[int, int, float]] = []
        self._fn, self._shape = fn, shape

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self._fn(*args, **kwargs)
        wall = time.perf_counter() - t0
        self.batches.append((*self._shape(args, kwargs, out), wall))
        return out

    def take(self, episodes: int) -> dict:
        """The batches since the last ``take``: their count, mean rows, decode steps (each
        batch runs until its longest reply ends), and the share of generation time spent in
        batches of fewer than half the ``episodes``."""
        batches, self.batches = self.batches, []
        busy = sum(s for _, _, s in batches)
        low = sum(s for n, _, s in batches if n < episodes / 2)
        return {"generation_batches": len(batches),
                "batch_rows_mean": sum(n for n, _, _ in batches) / max(len(batches), 1),
                "batch_decode_steps": [k for _, k, _ in batches],
                "generation_s": busy,
                "under_half_batch_time_share": low / busy if busy else None}


def timed(trainer, inputs: list[dict]) -> tuple[float, dict]:
    t0 = time.perf_counter()
    out = trainer._generate_and_score_completions(inputs)
    return time.perf_counter() - t0, out


def trl_run(trainer, inputs: list[dict], log: BatchLog) -> dict:
    wall, out = timed(trainer, inputs)
    mask = out["completion_mask"]
    if "tool_mask" in out:
        mask = mask * out["tool_mask"]
    envs = trainer.environments
    calls = trainer._metrics["train"]["tools/call_frequency"][-1] * len(inputs)
    replies = [sum(1 for m in c if m["role"] == "assistant") for c in trainer._last_completions]
    return {"wall_s": wall, "episodes": len(envs), "env_steps": sum(e.steps for e in envs),
            "tool_calls": round(calls), "generations": sum(replies),
            "generated_tokens": int(mask.sum()),
            "tool_calls_per_episode": [e.steps for e in envs],
            "reward_mean": sum(e.reward for e in envs) / len(envs), **log.take(len(envs))}


def agentgym_run(trainer, rollout, inputs: list[dict], log: BatchLog) -> dict:
    wall, _ = timed(trainer, inputs)
    trajs = rollout.last_trajectories
    return {"wall_s": wall, "episodes": len(trajs),
            "env_steps": sum(t.num_turns for t in trajs),
            "generations": sum(t.num_turns for t in trajs),
            "generated_tokens": sum(sum(t.loss_mask[t.prompt_len:]) for t in trajs),
            "reward_mean": sum(t.reward for t in trajs) / len(trajs),
            **log.take(len(trajs))}


def rates(run: dict) -> dict:
    w = run["wall_s"]
    return {"trajectories_per_s": run["episodes"] / w, "turns_per_s": run["generations"] / w,
            "env_steps_per_s": run["env_steps"] / w,
            "generated_tokens_per_s": run["generated_tokens"] / w}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96,
                    help="per generation call; a move tool call is 69 tokens of the tiny "
                         "tokenizer with Qwen3's empty think block")
    ap.add_argument("--warmup-steps", type=int, default=200)
    ap.add_argument("--warmup-batch", type=int, default=8,
                    help="conversations a warm-up step (SmolLM2-135M: 2 keeps the step near "
                         "5 GB, 8 passes 14 GB)")
    ap.add_argument("--warmup-lr", type=float, default=3e-3,
                    help="the format warm-up's AdamW lr (3e-3 for the random tiny model; a "
                         "pretrained model wants far less, e.g. 5e-5)")
    ap.add_argument("--model", default="tiny",
                    help="tiny (built locally, seed 0), a named model (smollm2-135m) or a folder")
    ap.add_argument("--out", default=str(RESULTS))
    from bench.harness import Harness, add_arguments, write_json_atomic

    add_arguments(ap)
    args = ap.parse_args(argv)
    hs = Harness.from_args(args, with_server=False)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from trl import GRPOConfig, GRPOTrainer

        from agentgym.integrations.trl import AgentGymRollout, env_reward

        MazeToolEnv.max_turns = args.max_turns
        n, tasks = args.num_generations, list(range(args.tasks))
        batch = n * args.tasks
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            model, model_chatml = tool_model(tmp, args.warmup_steps, batch=args.warmup_batch,
                                             model=args.model, lr=args.warmup_lr)
            warmup_s = time.perf_counter() - t0

            def cfg(name: str, **kw):
                return GRPOConfig(output_dir=os.path.join(tmp, name),
                                  per_device_train_batch_size=batch, num_generations=n,
                                  report_to="none", use_cpu=True, bf16=False,
                                  save_strategy="no", temperature=1.0, top_p=1.0, seed=0,
                                  log_completions=False, **kw)

            from datasets import Dataset

            trl_rows = [{"prompt": [{"role": "user", "content": TOOL_INSTRUCTIONS}], "task": t}
                        for t in tasks]
            trl_tr = GRPOTrainer(
                model=model, args=cfg("trl", max_completion_length=4096 - 512,
                                      max_tool_calling_iterations=args.max_turns,
                                      generation_kwargs={"max_new_tokens": args.max_new_tokens}),
                train_dataset=Dataset.from_list(trl_rows), environment_factory=MazeToolEnv)
            ag_rows = AgentGymRollout.dataset("maze", tasks)
            rollout = AgentGymRollout(max_turns=args.max_turns,
                                      max_new_tokens=args.max_new_tokens, max_total_tokens=4096)
            ag_tr = GRPOTrainer(
                model=model_chatml,
                args=cfg("agentgym", max_completion_length=args.max_new_tokens),
                reward_funcs=env_reward, train_dataset=ag_rows,
                rollout_func=rollout)
            for tr in (trl_tr, ag_tr):
                tr.model.train()  # training_step's mode: num_generations prompts per task
            trl_inputs = [r for r in trl_rows for _ in range(n)]
            ag_inputs = [r for r in ag_rows for _ in range(n)]

            trl_tr._last_completions = None
            orig = trl_tr._tool_call_loop

            def spy(prompts, prompt_ids, completion_ids, completions, *a):
                out = orig(prompts, prompt_ids, completion_ids, completions, *a)
                trl_tr._last_completions = out[1]
                return out

            trl_tr._tool_call_loop = spy  # observes the loop's output; changes nothing
            # Generation batches, observed: TRL's model.generate calls, the engine
            # backend's batches (its batcher's run, on the worker thread).
            trl_log = trl_tr.model.generate = BatchLog(
                trl_tr.model.generate,
                lambda a, kw, out: (out.shape[0], out.shape[1] - kw["input_ids"].shape[1]))
            batcher = rollout._ensure_engine(ag_tr).backend._batcher
            ag_log = batcher.run = BatchLog(
                batcher.run, lambda a, kw, out: (len(a[0]), max(len(r.tokens) for r in a[0])))
            hs.pin_client()
            block, runs = hs.compare(
                f"{args.model}: {batch} episodes",
                {"trl": lambda: (lambda r: {**r, **rates(r)})(
                    trl_run(trl_tr, trl_inputs, trl_log)),
                 "agentgym": lambda: (lambda r: {**r, **rates(r)})(
                     agentgym_run(ag_tr, rollout, ag_inputs, ag_log))},
                metric="trajectories_per_s", numerator="agentgym", denominator="trl",
                other_metrics=["turns_per_s", "env_steps_per_s", "generated_tokens_per_s"])
            rollout.close()
    block["model"] = args.model

    summary = {}
    for arm, rs in runs.items():
        summary[arm] = {k: {"median": statistics.median(r[k] for r in rs),
                            "min": min(r[k] for r in rs), "max": max(r[k] for r in rs)}
                        for k in ("trajectories_per_s", "turns_per_s", "env_steps_per_s",
                                  "generated_tokens_per_s")}
        summary[arm]["under_half_batch_time_share"] = {
            "median": statistics.median(r["under_half_batch_time_share"] or 0.0 for r in rs)}
    ratios = {"trajectories_per_s": block["ratio"]["median"],
              **{k: v["median"] for k, v in block.get("other_ratios", {}).items()}}
    result = {
        "bench": "peer_trl_rollout",
        "peer": "trl GRPOTrainer(environment_factory) _generate -> _tool_call_loop",
        "trl": __import__("trl").__version__, "env": "maze", "tasks": args.tasks,
        "num_generations": n, "episodes": batch, "max_turns": args.max_turns,
        "max_new_tokens": args.max_new_tokens, "temperature": 1.0,
        "generation": "transformers (use_vllm=False), CPU, both arms",
        "model": (f"{'tiny (seed 0)' if args.model == 'tiny' else args.model}, Qwen3 tool "
                  f"template, {args.warmup_steps}-step format warm-up at lr {args.warmup_lr}"),
        "warmup_s": warmup_s, "repeats": args.repeats, "summary": summary,
        "method": "bench/harness.py: one untimed pass of each arm, then --repeats rounds, "
                  "arms alternating; ratio = median of per-round engine/TRL",
        "comparisons": [block], "ratios_agentgym_over_trl_median": ratios, "runs": runs,
        "load_avg": os.getloadavg(), "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    write_json_atomic(args.out, result)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
