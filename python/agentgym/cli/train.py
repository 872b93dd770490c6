"""``agentgym-rl train``: multi-turn RL training from a config file and/or flags.

``agentgym-rl train`` with no arguments runs the main job (:data:`MAIN_JOB`): the tiny local
model, a format warm-up on uniformly-random-policy transcripts, then ScalingInter-RL (GRPO,
horizon 2 -> 4 -> 8) on open 4x4 mazes with a goal hint and step shaping, evaluated greedily
at horizon 8 on the held-out test split (README.md gives its measured time and result); it
prints where the metrics, checkpoint and plot are.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from agentgym.cli.key_values import parse_key_values
from agentgym.cli.mechanisms import add_mechanism_args, mechanism_rollout

__all__ = ["HELP", "MAIN_JOB", "add_args", "run"]

HELP = "train a policy with RL (default: tiny model on maze)"

#: What ``--help`` ends with: two real command lines (tests/cli/test_help_examples.py
#: parses each with the real parser).
EXAMPLES = """\
examples:
  agentgym-rl train --output runs/main-job  # the main job: tiny model, 4x4 mazes, CPU
  agentgym-rl train --config configs/smollm2_maze_cpu.yaml --seed 1
"""

#: The default run of ``agentgym-rl train``: sized to learn on two CPU cores.
MAIN_JOB: dict[str, Any] = {
    "model": "tiny",
    "env": "maze",
    # an open 4x4 grid (loops carve away almost every wall) with the goal's offset in every
    # observation and 0.1 per step closer to (or -0.1 per step away from) the goal: most
    # goals are 3-6 moves away, so the short first stage learns from the shaping reward
    "env_kwargs": {"size": 4, "loops": 60, "goal_hint": True, "show_position": False,
                   "shaping": 0.1},
    "eval_env_kwargs": {"split": "test"},
    "system_prompt": "Maze. Reply with Action: move north, move south, move east or move west.",
    "method": "ScalingInter-RL",
    "horizon": [2, 4, 8],
    "steps_per_stage": 50,
    "eval_max_turns": 8,
    "max_steps": 150,
    "tasks_per_step": 8,
    "n_samples": 8,
    "temperature": 1.0,
    "max_new_tokens": 12,
    "max_total_tokens": 1024,
    "format_penalty": 0.5,
    # a reply cut at max_new_tokens ends the episode (stop reason "length", which the format
    # penalty scores): the recipe the measured curves and the ablation were made with
    "rollout": {"truncated_turn": "end"},
    "learner": {"lr": 5e-4, "use_kl_loss": True, "kl_coef": 0.2,
                "loss_agg_mode": "seq-mean-token-mean", "max_tokens_per_microbatch": 32768},
    # 400 steps: after the 73-77 steps a 600k-token budget allowed, seeds 0 and 1 put only
    # 0.79 and 0.16 of their first move's probability on the four well-formed moves (0.996
    # after 200), and after 200 steps seed 1's policy still did not learn to read the goal
    "warmup": {"episodes": 256, "steps": 400, "batch_size": 32, "lr": 5e-3, "max_turns": 8,
               "loss_on": "all", "max_tokens": 3_200_000},
    "eval_every": 25,
    "eval_tasks": 64,
    "eval_temperature": 0.0,
    "save_every": 50,
    "torch_threads": 1,
}


def add_args(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EXAMPLES
    p.add_argument("--config", help="YAML or TOML file of TrainerConfig fields")
    p.add_argument("--env", help="environment id (default: maze)")
    p.add_argument("--env-kwarg", action="append", metavar="KEY=VALUE", default=[],
                   help="environment keyword argument (JSON value), repeatable")
    p.add_argument("--model", help="model folder or hub id, 'tiny' (default), 'tiny-vl' (the "
                        "local tiny vision-language model, for obs=image envs), or "
                        "'smollm2-135m' (SmolLM2-135M-Instruct, extra smollm2)")
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
    p.add_argument("--self-play", action="store_true", default=None,
                   help="train on a multi-seat game (tictactoe, kuhn_poker, negotiation): "
                        "the policy plays the seats --opponents leaves it")
    p.add_argument("--opponents", choices=["self", "pool", "solver", "random"],
                   help="with --self-play: the policy every seat (self, the default), or one "
                        "seat against frozen earlier checkpoints (pool), the game's solver or "
                        "a random player")
    p.add_argument("--no-role-baseline", action="store_true",
                   help="with --self-play: no per-role baseline (plain REINFORCE under rae)")
    add_mechanism_args(p)
    p.add_argument("--resume", help="checkpoint (or run folder) to resume from")
    p.add_argument("--output", "-o", help="run folder (default runs/<timestamp>)")
    p.add_argument("--report-to", metavar="TRACKERS",
                   help="comma-separated trackers beside metrics.jsonl: tensorboard (the "
                        "default), wandb (extra wandb; offline unless WANDB_MODE is set, "
                        "under OUTPUT/wandb), or none")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="any TrainerConfig field (JSON value), repeatable")
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="roll out on Ray workers: the cluster at ADDRESS (e.g. "
                        "127.0.0.1:6379 or auto); alone, a local cluster")
    p.add_argument("--num-rollout-workers", type=int, metavar="N",
                   help="Ray rollout workers (default 2 with --ray)")


TRACKERS = ("tensorboard", "wandb", "none")


def _report_to(spec: str, wandb: Any) -> dict[str, Any]:
    """``--report-to tensorboard,wandb`` as the config's ``tensorboard`` and ``wandb`` fields
    (a config's wandb options are kept when wandb is asked for)."""
    names = {s.strip().lower() for s in spec.split(",") if s.strip()}
    if not names or names - set(TRACKERS) or ("none" in names and len(names) > 1):
        raise SystemExit(f"--report-to {spec!r}: expected a comma-separated list of "
                         "tensorboard, wandb, or none")
    return {"tensorboard": "tensorboard" in names,
            "wandb": (wandb or True) if "wandb" in names else False}


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
        cfg["env_kwargs"] = {**cfg.get("env_kwargs", {}), **parse_key_values(args.env_kwarg)}
    if args.lr is not None:
        cfg["learner"] = {**cfg.get("learner", {}), "lr": args.lr}
    if args.no_warmup:
        cfg["warmup"] = None
    if args.self_play or args.opponents:
        cfg["self_play"] = True
        if args.opponents:
            cfg["opponents"] = args.opponents
    if args.no_role_baseline:
        cfg["role_baseline"] = False
    if mechanisms := mechanism_rollout(args):
        cfg["rollout"] = {**cfg.get("rollout", {}), **mechanisms}
    if args.report_to is not None:
        cfg.update(_report_to(args.report_to, cfg.get("wandb")))
    if args.ray is not None or args.num_rollout_workers:
        cfg["num_rollout_workers"] = args.num_rollout_workers or 2
        cfg["ray_address"] = None if args.ray in (None, "local") else args.ray
    cfg.update(parse_key_values(args.set))
    if not cfg.get("output_dir"):
        cfg["output_dir"] = str(Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    cfg.setdefault("progress", True)
    return cfg


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl train``; prints the summary and where the outputs are."""
    from agentgym.learner.train_config import RunConfigError, TrainerConfig
    from agentgym.learner.trainer import Trainer

    cfg = _train_config(args)
    try:
        TrainerConfig.from_dict(cfg)
    except ValueError as e:  # a key or value the config refuses: one line naming it
        print(f"agentgym-rl train: {e}", file=sys.stderr)
        return 2
    print(f"agentgym-rl train: {cfg.get('method', 'ScalingInter-RL')} on "
          f"{cfg.get('env', 'maze')} with model {cfg.get('model', 'tiny')}; "
          f"output -> {cfg['output_dir']}", file=sys.stderr)
    try:  # a run the trainer refuses (a plan that cannot fit, a checkpoint of another kind)
        trainer = Trainer(cfg)
        summary = trainer.train()
    except RunConfigError as e:
        print(f"agentgym-rl train: {e}", file=sys.stderr)
        return 2
    if summary.get("rank", 0):  # a data-parallel rank other than 0: rank 0 reports
        return 0
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
