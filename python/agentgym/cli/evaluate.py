"""``agentgym-rl eval``: success rate and mean reward of a model, checkpoint or run folder on
held-out tasks of one or more envs; writes ``eval.json`` and ``eval.md``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from agentgym.cli.args import (
    check_model,
    folder,
    hub_error,
    is_local,
    key_value,
    nonneg_float,
    nonneg_int,
    positive_int,
    rollout_settings,
)
from agentgym.cli.key_values import parse_key_values

__all__ = ["HELP", "add_args", "default_horizon", "run"]

HELP = "success rate and mean reward of a model on envs"

#: What ``--help`` ends with: two real command lines (tests/cli/test_help_examples.py
#: parses each with the real parser).
EXAMPLES = """\
examples:
  agentgym-rl eval --model runs/main-job --tasks 64 --json  # a run: its env and horizon
  agentgym-rl eval --model smollm2-135m --env wordle,search --tasks 5 --max-new-tokens 48
"""


def add_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--output", "-o", default=None, type=folder,
                   help="folder for eval.json and eval.md (default: runs/eval-<time>)")
    p.add_argument("--env-kwarg", action="append", metavar="KEY=VALUE", default=[],
                   type=key_value,
                   help="environment keyword argument (JSON value), repeatable")
    p.add_argument("--backend", default="transformers",
                   choices=["transformers", "vllm", "openai", "scripted"],
                   help="scripted: no model, the env's oracle (or --policy random) plays")
    p.add_argument("--policy", default="oracle", choices=["oracle", "random"],
                   help="the scripted backend's policy")
    p.add_argument("--tasks", type=positive_int, default=100,
                   help="number of held-out tasks (the env's test split where it has one)")
    p.add_argument("--task-offset", type=nonneg_int, default=0,
                   help="skip this many of them")
    p.add_argument("--max-turns", type=positive_int, default=None,
                   help="the horizon (default: the training run's eval horizon, else each "
                        "env's own: agentgym.envs.registry.default_horizon)")
    p.add_argument("--n-samples", type=positive_int, default=1, help="episodes per task")
    p.add_argument("--temperature", type=nonneg_float, default=0.0,
                   help="sampling temperature (0: greedy)")
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help="tokens per turn (default: the training run's, else the rollout "
                        "default)")
    p.add_argument("--max-total-tokens", type=positive_int, default=None,
                   help="context cap of an episode (default: the training run's, else the "
                        "rollout default); a longer episode ends with stop reason 'length'")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON only")


def default_horizon(env_id: str) -> int:
    """The horizon ``eval`` plays ``env_id`` at when neither ``--max-turns`` nor a training
    run sets one: the env's own (:func:`agentgym.envs.registry.default_horizon`: its oracle
    solves the held-out tasks within it), not one number for every env."""
    from agentgym.envs.registry import default_horizon as env_horizon

    return int(env_horizon(env_id))


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


def _run_rollout(run: dict[str, Any]) -> dict[str, Any]:
    """A training run's ``rollout`` section (its settings as played)."""
    return dict(run.get("rollout") or {})


def _run_value(run: dict[str, Any], key: str) -> Any:
    """A rollout setting of a training run: in its ``rollout`` section, or at the top of
    the config (the flat spelling of older runs)."""
    section = _run_rollout(run)
    return section[key] if section.get(key) is not None else run.get(key)


def _eval_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| env | episodes | success rate | reward/mean | num_turns/mean | max_turns "
             "(horizon) |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['env']} | {r['episodes']} | {r['success_rate']:.3f} | "
                     f"{r['reward/mean']:.3f} | {r['num_turns/mean']:.2f} | {r['max_turns']} |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl eval``: success rate and mean reward of a model per env (task
    family), printed and written as ``eval.json`` and ``eval.md`` into ``--output``. The
    envs, their kwargs and tasks and the model are checked before any model is loaded."""
    from agentgym.engine.loop import run as run_loop

    if args.model is None and args.backend != "scripted":
        from agentgym.errors import ConfigError

        raise ConfigError("--model is required (except with --backend scripted)")
    if args.backend != "openai":  # an openai model is the server's name for it
        check_model(args.model)
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


def _plans(args: argparse.Namespace, envs: list[str], run: dict[str, Any],
           given: dict[str, Any]) -> list[tuple[str, bool, dict[str, Any], list[int]]]:
    """Per env of ``--env``: (env, whether it is the training run's, eval env kwargs, task
    ids), each env built with its kwargs: an unknown id, kwargs an env refuses or too few
    tasks are a named error before any model is loaded."""
    from agentgym.envs.tasks import plan_tasks
    from agentgym.errors import ConfigError

    out = []
    for env in envs:
        own = env == run.get("env")
        base = {**(run.get("env_kwargs", {}) if own else {}), **given}
        # held-out tasks: the run's eval split, the env's test split, or --env-kwarg's
        chosen = {} if "split" in given else (run.get("eval_env_kwargs") if own else None)
        try:
            plan = plan_tasks(env, base, args.task_offset + args.tasks, chosen)
        except (TypeError, ValueError) as e:  # the env refused its kwargs, or too few tasks
            why = " ".join(str(e).split())
            flag = "--tasks/--task-offset" if "too few" in why else "--env-kwarg"
            raise ConfigError(f"{flag}: {env}: {why}") from e
        tasks = plan.eval_ids[args.task_offset:]
        if not tasks:
            raise ConfigError(f"--task-offset {args.task_offset}: {env} has only "
                              f"{len(plan.eval_ids)} held-out tasks")
        out.append((env, own, plan.eval_kwargs, tasks))
    return out


async def _evaluate(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The eval rows of every env of ``--env``, all played on one backend (a vLLM engine
    takes a minute or two to start on a CPU)."""
    import asyncio

    from agentgym.agents import LLMAgent
    from agentgym.backends import make_backend
    from agentgym.engine.config import RolloutConfig
    from agentgym.models import resolve_model

    scripted = args.backend == "scripted"
    if scripted and args.model in (None, "tiny"):  # the scripted policy needs a tokenizer only
        from agentgym.models.names import cached_tiny_model

        args.model = str(await asyncio.to_thread(cached_tiny_model))
    model, run = _model_folder(args.model)
    envs = [e for e in (args.env or run.get("env", "maze")).split(",") if e]
    if not envs:
        from agentgym.errors import ConfigError

        raise ConfigError(f"--env {args.env!r}: no env id")
    given = parse_key_values(args.env_kwarg)
    plans = _plans(args, envs, run, given)
    settings = []
    for env, own, env_kwargs, tasks in plans:
        horizon = args.max_turns or (_run_horizon(run) if own else None) \
            or default_horizon(env)
        # the run's rollout settings (a reply prefix, the truncated-turn rule, its token
        # budgets and system prompt) as trained, then the flags
        rollout = dict(_run_rollout(run)) if own else {}
        rollout["max_new_tokens"] = args.max_new_tokens or _run_value(run, "max_new_tokens") \
            or RolloutConfig().max_new_tokens
        if args.max_total_tokens:
            rollout["max_total_tokens"] = args.max_total_tokens
        elif own and _run_value(run, "max_total_tokens"):
            rollout["max_total_tokens"] = _run_value(run, "max_total_tokens")
        if _run_value(run, "system_prompt") is not None:
            rollout["system_prompt"] = _run_value(run, "system_prompt")
        rollout_settings({k: v for k, v in rollout.items()
                          if k in RolloutConfig.__struct_fields__})  # refused: one line
        settings.append((env, env_kwargs, tasks, horizon, rollout))
    model_dir = await asyncio.to_thread(resolve_model, None if model == "tiny" else model)
    backend_kw = {"policy": args.policy} if scripted else {}
    try:
        backend = None if model_dir is None else \
            await asyncio.to_thread(make_backend, args.backend, model_dir, **backend_kw)
    except OSError as e:  # a hub id the loader could not get (a path is checked first)
        if is_local(model_dir) or args.backend == "openai":
            raise
        raise hub_error(args.model, e) from e
    rows = []
    try:
        for env, env_kwargs, tasks, horizon, rollout in settings:
            # (a scripted backend is open already: the agent's own backend name goes unused)
            agent = LLMAgent(base_model=model, backend="transformers" if scripted
                             else args.backend, env_kwargs=env_kwargs, rollout=rollout)
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
