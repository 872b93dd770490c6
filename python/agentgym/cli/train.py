"""``agentgym-rl train`` and ``agentgym-rl eval``: argument parsers and entry functions.

``agentgym.cli`` wires them::

    p = sub.add_parser("train", help="multi-turn RL training (ScalingInter-RL, GRPO, PPO, ...)")
    add_train_args(p); p.set_defaults(func=run_train)
    p = sub.add_parser("eval", help="evaluate a model or checkpoint on held-out tasks")
    add_eval_args(p); p.set_defaults(func=run_eval)

``agentgym-rl train`` with no arguments runs the main job (:data:`MAIN_JOB`): the tiny local
model, a format warm-up on uniformly-random-policy transcripts, then ScalingInter-RL (GRPO,
horizon 1 -> 2) on 2x2 mazes with a goal hint, evaluated greedily on the held-out test split
(about 10 minutes on two CPU cores); it prints where the metrics, checkpoint and plot are.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["MAIN_JOB", "add_eval_args", "add_train_args", "run_eval", "run_train"]

#: The default run of ``agentgym-rl train`` (tuned to learn on 2 CPU cores in ~15 min).
MAIN_JOB: dict[str, Any] = {
    "model": "tiny",
    "env": "maze",
    "env_kwargs": {"size": 2, "loops": 4, "goal_hint": True, "show_position": False},
    "eval_env_kwargs": {"split": "test"},
    "system_prompt": "Maze. Reply with Action: move north, move south, move east or move west.",
    "method": "ScalingInter-RL",
    "horizon": [1, 2],
    "steps_per_stage": 50,
    "eval_max_turns": 2,
    "max_steps": 200,
    "tasks_per_step": 8,
    "n_samples": 8,
    "temperature": 1.0,
    "max_new_tokens": 12,
    "max_total_tokens": 1024,
    "format_penalty": 0.5,
    "learner": {"lr": 5e-4, "use_kl_loss": True, "kl_coef": 0.2,
                "loss_agg_mode": "seq-mean-token-mean", "max_tokens_per_microbatch": 32768},
    "warmup": {"episodes": 256, "steps": 100, "batch_size": 32, "lr": 5e-3, "max_turns": 2,
               "loss_on": "all"},
    "eval_every": 20,
    "eval_tasks": 64,
    "eval_temperature": 0.0,
    "save_every": 50,
    "torch_threads": 1,
}


def _kv(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, val = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(val)
        except json.JSONDecodeError:
            out[key] = val
    return out


def add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML or TOML file of TrainerConfig fields")
    p.add_argument("--env", help="environment id (default: maze)")
    p.add_argument("--env-kwarg", action="append", metavar="KEY=VALUE", default=[],
                   help="environment keyword argument (JSON value), repeatable")
    p.add_argument("--model", help="model folder or hub id, or 'tiny' (default)")
    p.add_argument("--backend", choices=["transformers", "vllm", "openai"])
    p.add_argument("--method", help="ScalingInter-RL | GRPO | PPO | REINFORCE++ | RLOO")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--horizon", help="ScalingInter-RL stages, e.g. 4,8,12")
    p.add_argument("--steps-per-stage", type=int)
    p.add_argument("--max-turns", type=int, help="fixed horizon of the non-staged methods")
    p.add_argument("--tasks-per-step", type=int)
    p.add_argument("--n-samples", type=int, help="episodes per task (GRPO group size)")
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--eval-every", type=int)
    p.add_argument("--eval-tasks", type=int)
    p.add_argument("--async-rollouts", action="store_true", default=None,
                   help="overlap the next rollout with the current update")
    p.add_argument("--no-warmup", action="store_true", help="skip the tiny model's warm-up")
    p.add_argument("--resume", help="checkpoint (or run folder) to resume from")
    p.add_argument("--output", "-o", help="run folder (default runs/<timestamp>)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="any TrainerConfig field (JSON value), repeatable")


def _train_config(args: argparse.Namespace) -> dict[str, Any]:
    from agentgym.learner.train_config import load_config_file

    cfg: dict[str, Any]
    if args.config:
        cfg = load_config_file(args.config)
    elif args.env in (None, "maze") and args.model in (None, "tiny"):
        cfg = json.loads(json.dumps(MAIN_JOB))
    else:
        cfg = {}
    simple = {"env": args.env, "model": args.model, "backend": args.backend,
              "method": args.method, "max_steps": args.max_steps,
              "steps_per_stage": args.steps_per_stage, "max_turns": args.max_turns,
              "tasks_per_step": args.tasks_per_step, "n_samples": args.n_samples,
              "seed": args.seed, "eval_every": args.eval_every, "eval_tasks": args.eval_tasks,
              "async_rollouts": args.async_rollouts, "resume": args.resume,
              "output_dir": args.output}
    if args.env and args.env != cfg.get("env", args.env):
        cfg.pop("env_kwargs", None)
        cfg.pop("eval_env_kwargs", None)
    cfg.update({k: v for k, v in simple.items() if v is not None})
    if args.horizon:
        cfg["horizon"] = [int(x) for x in args.horizon.split(",")]
    if args.env_kwarg:
        cfg["env_kwargs"] = {**cfg.get("env_kwargs", {}), **_kv(args.env_kwarg)}
    if args.lr is not None:
        cfg["learner"] = {**cfg.get("learner", {}), "lr": args.lr}
    if args.no_warmup:
        cfg["warmup"] = None
    cfg.update(_kv(args.set))
    if not cfg.get("output_dir"):
        cfg["output_dir"] = str(Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    cfg.setdefault("progress", True)
    return cfg


def run_train(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl train``; prints the summary and where the outputs are."""
    from agentgym.learner.trainer import Trainer

    cfg = _train_config(args)
    print(f"agentgym-rl train: {cfg.get('method', 'ScalingInter-RL')} on "
          f"{cfg.get('env', 'maze')} with model {cfg.get('model', 'tiny')}; "
          f"output -> {cfg['output_dir']}", file=sys.stderr)
    trainer = Trainer(cfg)
    summary = trainer.train()
    out = Path(summary["output_dir"])
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    s0, s1 = summary.get("eval_success_start"), summary.get("eval_success_end")
    lines = [f"done: {summary['steps']} steps in {summary['wall_s']:.0f} s"]
    if s0 is not None:
        lines.append(f"held-out success rate: {s0:.2f} -> {s1:.2f} "
                     f"(best {summary['eval_success_best']:.2f})")
    lines += [f"metrics:    {summary['metrics']}",
              f"checkpoint: {summary['checkpoint']}",
              f"plot:       {summary['plot']}",
              f"summary:    {out / 'summary.json'}"]
    print("\n".join(lines))
    return 0


def add_eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True,
                   help="model folder, checkpoint folder or run folder (its latest checkpoint; "
                        "the run's env, env kwargs, system prompt and eval horizon are reused)")
    p.add_argument("--env", default=None,
                   help="environment id, or several separated by commas (default: the run's, "
                        "or maze)")
    p.add_argument("--output", "-o", default=None,
                   help="folder for eval.json and eval.md (default: runs/eval-<time>)")
    p.add_argument("--env-kwarg", action="append", metavar="KEY=VALUE", default=[])
    p.add_argument("--backend", default="transformers",
                   choices=["transformers", "vllm", "openai"])
    p.add_argument("--tasks", type=int, default=100,
                   help="number of held-out tasks (the env's test split where it has one)")
    p.add_argument("--task-offset", type=int, default=0, help="skip this many of them")
    p.add_argument("--max-turns", type=int, default=None)
    p.add_argument("--n-samples", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=int, default=64)
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


def _eval_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| env | episodes | success rate | reward/mean | num_turns/mean | max_turns |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['env']} | {r['episodes']} | {r['success_rate']:.3f} | "
                     f"{r['reward/mean']:.3f} | {r['num_turns/mean']:.2f} | {r['max_turns']} |")
    return "\n".join(lines) + "\n"


def run_eval(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl eval``: success rate and mean reward of a model per env (task
    family), printed and written as ``eval.json`` and ``eval.md`` into ``--output``."""
    from agentgym.agents import LLMAgent

    model, run = _model_folder(args.model)
    envs = [e for e in (args.env or run.get("env", "maze")).split(",") if e]
    rows = []
    from agentgym.envs.tasks import plan_tasks

    given = _kv(args.env_kwarg)
    for env in envs:
        own = env == run.get("env")
        base = {**(run.get("env_kwargs", {}) if own else {}), **given}
        # held-out tasks: the run's eval split, the env's test split, or what --env-kwarg says
        chosen = {} if "split" in given else (run.get("eval_env_kwargs") if own else None)
        plan = plan_tasks(env, base, args.task_offset + args.tasks, chosen)
        env_kwargs, tasks = plan.eval_kwargs, plan.eval_ids[args.task_offset:]
        horizon = args.max_turns or (run.get("eval_max_turns") if own else None) \
            or (max(run["horizon"]) if run.get("horizon") else None) or 8
        agent = LLMAgent(base_model=model, backend=args.backend, env_kwargs=env_kwargs,
                         max_new_tokens=args.max_new_tokens,
                         system_prompt=run.get("system_prompt"))
        res = agent.infer(env, tasks, n_samples=args.n_samples, max_turns=horizon,
                          temperature=args.temperature)
        m = {k: v for k, v in res.metrics.items() if k != "success_rate"}
        rows.append({"env": env, "env_kwargs": env_kwargs, "tasks": [tasks[0], tasks[-1]],
                     "episodes": len(res.trajectories), "max_turns": horizon,
                     "success_rate": res.success_rate,
                     "reward/mean": m.get("reward/mean", 0.0),
                     "num_turns/mean": m.get("num_turns/mean", 0.0), "metrics": m})
    out = Path(args.output or f"runs/eval-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    report = {"model": str(args.model), "backend": args.backend, "results": rows}
    (out / "eval.json").write_text(json.dumps(report, indent=2))
    (out / "eval.md").write_text(_eval_table(rows))
    if args.json:
        print(json.dumps(report))
    else:
        print(_eval_table(rows), end="")
        print(f"wrote {out / 'eval.json'} and {out / 'eval.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m agentgym.train_cli train|eval ...``)."""
    parser = argparse.ArgumentParser(prog="agentgym-rl")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_train_args(sub.add_parser("train"))
    add_eval_args(sub.add_parser("eval"))
    args = parser.parse_args(argv)
    return run_train(args) if args.cmd == "train" else run_eval(args)


if __name__ == "__main__":
    raise SystemExit(main())
