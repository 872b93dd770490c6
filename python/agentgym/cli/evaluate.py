"""``agentgym-rl eval``: success rate and mean reward of a model, checkpoint or run folder on
held-out tasks of one or more envs; writes ``eval.json`` and ``eval.md``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from agentgym.cli.key_values import parse_key_values

__all__ = ["HELP", "add_args", "run"]

HELP = "success rate and mean reward of a model on envs"

#: What ``--help`` ends with: two real command lines (tests/cli/test_help_examples.py
#: parses each with the real parser).
EXAMPLES = """\
examples:
  agentgym-rl eval --model runs/main-job --tasks 64 --json  # a run: its env and horizon
  agentgym-rl eval --model smollm2-135m --env wordle,search --tasks 5 --max-new-tokens 48
"""


def add_args(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EXAMPLES
    p.add_argument("--model", default=None,
                   help="model folder, checkpoint folder or run folder (its latest checkpoint; "
                        "the run's env, env kwargs, system prompt, eval horizon, token budgets "
                        "and rollout settings are reused), or a named model: 'smollm2-135m' "
                        "(extra smollm2), 'tiny-vl'; required except with --backend scripted "
                        "(default: the tiny model's tokenizer)")
    p.add_argument("--env", default=None,
                   help="environment id, or several separated by commas (default: the run's, "
                        "or maze)")
    p.add_argument("--output", "-o", default=None,
                   help="folder for eval.json and eval.md (default: runs/eval-<time>)")
    p.add_argument("--env-kwarg", action="append", metavar="KEY=VALUE", default=[])
    p.add_argument("--backend", default="transformers",
                   choices=["transformers", "vllm", "openai", "scripted"],
                   help="scripted: no model, the env's oracle (or --policy random) plays")
    p.add_argument("--policy", default="oracle", choices=["oracle", "random"],
                   help="the scripted backend's policy")
    p.add_argument("--tasks", type=int, default=100,
                   help="number of held-out tasks (the env's test split where it has one)")
    p.add_argument("--task-offset", type=int, default=0, help="skip this many of them")
    p.add_argument("--max-turns", type=int, default=None)
    p.add_argument("--n-samples", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens per turn (default: the training run's, else the rollout "
                        "default)")
    p.add_argument("--max-total-tokens", type=int, default=None,
                   help="context cap of an episode (default: the training run's, else the "
                        "rollout default); a longer episode ends with stop reason 'length'")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON only")


def _model_folder(path: str) -> tuple[str, dict[str, Any]]:
    """(model folder, the training run's config or {})."""
    p = Path(path)
    if (p / "config.json").is_file():
        return str(p), {}
    from agentgym.learner.checkpoint import find_checkpoint

    try:
        ckpt = find_checkpoint(p)
    except FileNotFoundError:
        return path, {}  # a hub id or a server-side model name
    import torch

    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    return str(ckpt / "model"), dict(state.get("config") or {})


def _run_horizon(run: dict[str, Any]) -> int:
    """The horizon a training run evaluated at: its ``eval_max_turns``, else its schedule's
    last stage (a fixed horizon's ``max_turns``)."""
    from agentgym.learner.trainer import TrainerConfig, make_schedule

    cfg = TrainerConfig.from_dict(run)
    return cfg.eval_max_turns or make_schedule(cfg).stages[-1].max_turns


def _eval_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| env | episodes | success rate | reward/mean | num_turns/mean | max_turns |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['env']} | {r['episodes']} | {r['success_rate']:.3f} | "
                     f"{r['reward/mean']:.3f} | {r['num_turns/mean']:.2f} | {r['max_turns']} |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl eval``: success rate and mean reward of a model per env (task
    family), printed and written as ``eval.json`` and ``eval.md`` into ``--output``."""
    from agentgym.engine.loop import run as run_loop

    rows = run_loop(_evaluate(args))
    out = Path(args.output or f"runs/eval-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    report = {"model": str(args.model), "backend": args.backend, "results": rows}
    if args.backend == "scripted":
        report["policy"] = args.policy
    (out / "eval.json").write_text(json.dumps(report, indent=2))
    (out / "eval.md").write_text(_eval_table(rows))
    if args.json:
        print(json.dumps(report))
    else:
        print(_eval_table(rows), end="")
        print(f"wrote {out / 'eval.json'} and {out / 'eval.md'}")
    return 0


async def _evaluate(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The eval rows of every env of ``--env``, all played on one backend (a vLLM engine
    takes a minute or two to start on a CPU)."""
    import asyncio

    from agentgym.agents import LLMAgent
    from agentgym.backends import make_backend
    from agentgym.engine.config import RolloutConfig
    from agentgym.envs.tasks import plan_tasks
    from agentgym.models import resolve_model

    scripted = args.backend == "scripted"
    if args.model is None and not scripted:
        raise SystemExit("agentgym-rl eval: --model is required (except with --backend "
                         "scripted)")
    if scripted and args.model in (None, "tiny"):  # the scripted policy needs a tokenizer only
        from agentgym.models.names import cached_tiny_model

        args.model = str(await asyncio.to_thread(cached_tiny_model))
    model, run = _model_folder(args.model)
    envs = [e for e in (args.env or run.get("env", "maze")).split(",") if e]
    given = parse_key_values(args.env_kwarg)
    model_dir = await asyncio.to_thread(resolve_model, None if model == "tiny" else model)
    backend_kw = {"policy": args.policy} if scripted else {}
    backend = None if model_dir is None else \
        await asyncio.to_thread(make_backend, args.backend, model_dir, **backend_kw)
    rows = []
    try:
        for env in envs:
            own = env == run.get("env")
            base = {**(run.get("env_kwargs", {}) if own else {}), **given}
            # held-out tasks: the run's eval split, the env's test split, or --env-kwarg's
            chosen = {} if "split" in given else (run.get("eval_env_kwargs") if own else None)
            plan = plan_tasks(env, base, args.task_offset + args.tasks, chosen)
            env_kwargs, tasks = plan.eval_kwargs, plan.eval_ids[args.task_offset:]
            horizon = args.max_turns or (_run_horizon(run) if own else None) or 8
            max_new = args.max_new_tokens or run.get("max_new_tokens") \
                or RolloutConfig().max_new_tokens
            cap_tokens = args.max_total_tokens or (run.get("max_total_tokens") if own else None)
            cap = {} if cap_tokens is None else {"max_total_tokens": cap_tokens}
            # the run's rollout settings (a reply prefix, the truncated-turn rule) as trained
            # (a scripted backend is open already: the agent's own backend name goes unused)
            agent = LLMAgent(base_model=model, backend="transformers" if scripted
                             else args.backend, env_kwargs=env_kwargs,
                             max_new_tokens=max_new, rollout=dict(run.get("rollout") or {})
                             if own else {}, system_prompt=run.get("system_prompt"), **cap)
            res = await agent.ainfer(env, tasks, n_samples=args.n_samples, max_turns=horizon,
                                     temperature=args.temperature, backend=backend)
            m = {k: v for k, v in res.metrics.items() if k != "success_rate"}
            rows.append({"env": env, "env_kwargs": env_kwargs, "tasks": [tasks[0], tasks[-1]],
                         "episodes": len(res.trajectories), "max_turns": horizon,
                         "success_rate": res.success_rate,
                         "reward/mean": m.get("reward/mean", 0.0),
                         "num_turns/mean": m.get("num_turns/mean", 0.0), "metrics": m})
    finally:
        if backend is not None:
            await backend.close()
    return rows
