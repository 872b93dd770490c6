"""The announcement's example with a real model: SmolLM2-135M-Instruct trained on the
e-commerce customer-service scenario through ``LLMAgent``, held-out success before and after.

    python bench/smollm2_llmagent.py [--steps 2] [--eval-tasks 8] [--out FILE]

    env = ECommerceServiceEnv()
    agent = LLMAgent(base_model="smollm2-135m", backend="vllm")
    agent.train(env, method="ScalingInter-RL", max_steps=...)
    agent.infer(env)

Greedy evaluation on the env's test split at step 0 and after the last step (the trainer's
eval rows), vLLM-CPU rollouts, full fine-tuning in float32, the env's own instructions as
the system prompt. Besides success it reports what the training episodes earned (reward,
the share of GRPO groups whose samples all scored alike, which carry no gradient), the stop
reasons, and the first training reply, so a flat curve says why it is flat. Prints one JSON
object and writes it to ``bench/results/smollm2_llmagent.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "smollm2_llmagent.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--eval-tasks", type=int, default=8)
    ap.add_argument("--tasks-per-step", type=int, default=4)
    ap.add_argument("--n-samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--output", default="runs/smollm2_llmagent")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()

    from agentgym.agents import LLMAgent
    from agentgym.envs import ECommerceServiceEnv
    from agentgym.learner.tracking import read_jsonl

    t0 = time.perf_counter()
    env = ECommerceServiceEnv()
    agent = LLMAgent(base_model="smollm2-135m", backend="vllm", output_dir=args.output,
                     progress=False, eval_every=args.steps, eval_tasks=args.eval_tasks,
                     tasks_per_step=args.tasks_per_step, n_samples=args.n_samples,
                     max_new_tokens=args.max_new_tokens, max_total_tokens=4096,
                     horizon=[5, 10], steps_per_stage=max(1, args.steps // 2),
                     filter_groups={"max_draws": 1}, save_every=0,
                     learner={"lr": 1e-5, "use_kl_loss": False,
                              "max_tokens_per_microbatch": 4096})
    summary = agent.train(env, method="ScalingInter-RL", max_steps=args.steps)
    rows = read_jsonl(Path(summary["metrics"]))
    train = [r for r in rows if r["type"] == "train"]
    evals = [r for r in rows if r["type"] == "eval"]
    report = {
        "bench": "smollm2_llmagent", "env": "ecommerce_service", "model": "smollm2-135m",
        "backend": "vllm", "steps": summary["steps"], "eval_tasks": args.eval_tasks,
        "episodes_per_step": args.tasks_per_step * args.n_samples,
        "max_new_tokens": args.max_new_tokens,
        "success_before": evals[0]["success_rate"] if evals else None,
        "success_after": evals[-1]["success_rate"] if evals else None,
        "eval_reward_before": evals[0]["reward/mean"] if evals else None,
        "eval_reward_after": evals[-1]["reward/mean"] if evals else None,
        "train": [{k: r.get(k) for k in ("step", "reward/mean", "reward/max", "success_rate",
                                          "num_turns/mean", "cut_turns/mean",
                                          "filter_groups/dropped_share", "timing_s/gen",
                                          "timing_s/update")} | {
                       "stop_reasons": {k.split("/", 1)[1]: v for k, v in r.items()
                                        if k.startswith("stop_reason/")}} for r in train],
        "wall_s": time.perf_counter() - t0, "machine": platform.machine(),
        "note": "filter_groups/dropped_share: the share of GRPO groups whose samples all "
                "scored alike (zero advantage, no gradient)",
    }
    text = json.dumps(report)
    print(text)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
