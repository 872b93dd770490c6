"""``agentgym-rl train``: multi-turn RL training from a config file and/or flags.

``agentgym-rl train`` with no arguments runs the main job, the shipped config
``main_job.yaml`` (:data:`MAIN_JOB`): the tiny local model, a format warm-up on
uniformly-random-policy transcripts, then ScalingInter-RL (GRPO, horizon 2 -> 4 -> 8) on
open 4x4 mazes with a goal hint and step shaping, evaluated greedily at horizon 8 on the
held-out test split (docs/training.md gives its measured time and result); it prints where
the metrics, checkpoint and plot are.

``--config`` takes a YAML/TOML file or the name of a shipped config (``smollm2_maze_cpu``;
package data, found outside the checkout too). Every flag sets one field of the config tree
(:data:`FLAG_FIELDS`; ``--set PATH=VALUE`` any field, ``rollout.max_turns=4``). The run
folder (``--output``) must be new or empty: ``--resume RUN`` continues a run in its own
folder (from its ``config.yaml`` and latest checkpoint), ``--overwrite`` clears it first.
Ctrl-C saves a checkpoint of the last finished step and the summary, and exits 130. Every
mistake (a key or value the config refuses, an unknown env, an output folder that cannot
be used, a resume folder without a checkpoint) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import time
from pathlib import Path
from typing import Any

from agentgym.cli.args import (
    folder,
    key_value,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    say,
)
from agentgym.cli.key_values import parse_key_values
from agentgym.cli.mechanisms import add_mechanism_args, mechanism_rollout

__all__ = ["CLI_ONLY", "FLAG_FIELDS", "HELP", "MAIN_JOB", "add_args", "main_job", "run"]

HELP = "train a policy with RL (default: tiny model on maze)"

#: What ``--help`` ends with: two real command lines (tests/cli/test_help_examples.py
#: parses each with the real parser).
EXAMPLES = """\
examples:
  agentgym-rl train --output runs/main-job  # the main job: tiny model, 4x4 mazes, CPU
  agentgym-rl train --config configs/smollm2_maze_cpu.yaml --seed 1 --set rollout.max_new_tokens=4
"""

#: The main job's file (package data): what a bare ``agentgym-rl train`` loads.
MAIN_JOB_FILE = Path(__file__).resolve().parents[1] / "configs" / "main_job.yaml"

#: Each flag of ``train`` -> the config field it sets (a dotted path into the tree:
#: :class:`~agentgym.learner.train_config.TrainerConfig`); tests/cli/test_train_flags.py
#: checks that every flag is here or in :data:`CLI_ONLY` and names a field. The hidden
#: ``--opponents`` and ``--num-rollout-workers`` are the old spellings of ``--opponent``
#: and ``--num-workers`` (``collect``'s).
FLAG_FIELDS: dict[str, str] = {
    "--env": "env",
    "--env-kwarg": "env_kwargs",
    "--model": "model",
    "--backend": "backend",
    "--method": "method",
    "--max-steps": "max_steps",
    "--horizon": "horizon",
    "--steps-per-stage": "steps_per_stage",
    "--max-turns": "rollout.max_turns",
    "--tasks-per-step": "tasks_per_step",
    "--n-samples": "n_samples",
    "--max-new-tokens": "rollout.max_new_tokens",
    "--max-total-tokens": "rollout.max_total_tokens",
    "--temperature": "rollout.temperature",
    "--system-prompt": "rollout.system_prompt",
    "--max-concurrency": "rollout.max_concurrency",
    "--lr": "learner.lr",
    "--seed": "seed",
    "--eval-every": "eval_every",
    "--eval-tasks": "eval_tasks",
    "--async-rollouts": "async_rollouts",
    "--fully-async": "fully_async",
    "--max-staleness": "learner.max_staleness",
    "--no-warmup": "warmup",
    "--self-play": "self_play",
    "--opponent": "rollout.opponent",
    "--opponents": "rollout.opponent",
    "--no-role-baseline": "role_baseline",
    "--undo": "rollout.undo",
    "--reflection": "rollout.reflection",
    "--branch-at": "rollout.branch_at",
    "--branch-width": "rollout.branch_width",
    "--plan": "rollout.plan",
    "--context-window": "rollout.context_window",
    "--resume": "resume",
    "--output": "output_dir",
    "--report-to": "tensorboard",  # and wandb
    "--ray": "ray_address",
    "--num-workers": "num_rollout_workers",
    "--num-rollout-workers": "num_rollout_workers",
    "--worker-cpus": "rollout_worker.num_cpus",
    "--worker-gpus": "rollout_worker.num_gpus",
}

#: The flags that set no one field, and what they do instead.
CLI_ONLY: dict[str, str] = {
    "--help": "prints the help",
    "--config": "the config file (or shipped config) the flags apply over",
    "--set": "any field, by its path",
    "--overwrite": "clears a non-empty run folder before the run",
}


_MAIN_JOB: dict[str, Any] = {}


def main_job() -> dict[str, Any]:
    """The main job's config (``main_job.yaml``, read once), a fresh copy."""
    if not _MAIN_JOB:
        import yaml

        _MAIN_JOB.update(yaml.safe_load(MAIN_JOB_FILE.read_text(encoding="utf-8")))
    return copy.deepcopy(_MAIN_JOB)


#: The main job (``main_job.yaml``) as a mapping: the config a bare ``agentgym-rl train``
#: runs (:func:`main_job` gives a copy to change).
MAIN_JOB: dict[str, Any] = main_job()


def _horizon(text: str) -> list[int]:
    try:
        stages = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected turns per stage like 2,4,8, got "
                                         f"{text!r}") from None
    if not stages or min(stages) < 1:
        raise argparse.ArgumentTypeError(f"expected turns per stage (each >= 1) like 2,4,8, "
                                         f"got {text!r}")
    return stages


def add_args(p: argparse.ArgumentParser) -> None:
    p.epilog = EXAMPLES
    p.add_argument("--config", help="YAML or TOML file of TrainerConfig fields, or the name of "
                                    "a shipped config (main_job, smollm2_maze_cpu, ...)")
    p.add_argument("--env", help="environment id (default: maze)")
    p.add_argument("--env-kwarg", action="append", metavar="KEY=VALUE", default=[],
                   type=key_value, help="environment keyword argument (JSON value), repeatable")
    p.add_argument("--model", help="model folder or hub id, 'tiny' (default), 'tiny-vl' (the "
                        "local tiny vision-language model, for obs=image envs), or "
                        "'smollm2-135m' (SmolLM2-135M-Instruct, extra smollm2)")
    p.add_argument("--backend", choices=["transformers", "vllm", "openai"])
    p.add_argument("--method", help="ScalingInter-RL | GRPO | PPO | REINFORCE++ | RLOO")
    p.add_argument("--max-steps", type=nonneg_int)
    p.add_argument("--horizon", type=_horizon, help="ScalingInter-RL stages, e.g. 4,8,12")
    p.add_argument("--steps-per-stage", type=positive_int)
    p.add_argument("--max-turns", type=positive_int,
                   help="fixed horizon of the non-staged methods (rollout.max_turns)")
    p.add_argument("--tasks-per-step", type=positive_int)
    p.add_argument("--n-samples", type=positive_int, help="episodes per task (GRPO group size)")
    p.add_argument("--max-new-tokens", type=positive_int, help="tokens per reply")
    p.add_argument("--max-total-tokens", type=positive_int, help="context cap of an episode")
    p.add_argument("--temperature", type=nonneg_float, help="sampling temperature")
    p.add_argument("--system-prompt")
    p.add_argument("--max-concurrency", type=positive_int, help="episodes played at once")
    p.add_argument("--lr", type=positive_float, help="the learner's learning rate")
    p.add_argument("--seed", type=nonneg_int)
    p.add_argument("--eval-every", type=nonneg_int)
    p.add_argument("--eval-tasks", type=nonneg_int)
    p.add_argument("--async-rollouts", action="store_true", default=None,
                   help="overlap the next rollout with the current update")
    p.add_argument("--fully-async", action="store_true", default=None,
                   help="fully asynchronous training: one open stream of episodes, a step "
                        "whenever a batch of groups has finished, weights pushed while "
                        "episodes are in flight (partial rollouts)")
    p.add_argument("--max-staleness", type=nonneg_int,
                   help="the staleness bound in policy versions (default 1 with "
                        "--fully-async or --async-rollouts)")
    p.add_argument("--no-warmup", action="store_true", help="skip the tiny model's warm-up")
    p.add_argument("--self-play", action="store_true", default=None,
                   help="train on a multi-seat game (tictactoe, kuhn_poker, negotiation): "
                        "the policy plays the seats --opponent leaves it")
    p.add_argument("--opponent", choices=["self", "pool", "solver", "random"],
                   help="with --self-play: the policy every seat (self, the default), or one "
                        "seat against frozen earlier checkpoints (pool), the game's solver or "
                        "a random player")
    p.add_argument("--opponents", dest="opponent", choices=["self", "pool", "solver", "random"],
                   help=argparse.SUPPRESS)
    p.add_argument("--no-role-baseline", action="store_true",
                   help="with --self-play: no per-role baseline (plain REINFORCE under rae)")
    add_mechanism_args(p)
    p.add_argument("--resume", metavar="RUN",
                   help="continue a run: its folder (its latest checkpoint) or a checkpoint; "
                        "the run's config.yaml is the config (flags still apply) and the run "
                        "goes on in its own folder")
    p.add_argument("--output", "-o", type=folder,
                   help="run folder, new or empty (default runs/<timestamp>)")
    p.add_argument("--overwrite", action="store_true",
                   help="clear the run folder --output names if it holds a run")
    p.add_argument("--report-to", metavar="TRACKERS",
                   help="comma-separated trackers beside metrics.jsonl: tensorboard (the "
                        "default), wandb (extra wandb; offline unless WANDB_MODE is set, "
                        "under OUTPUT/wandb), or none")
    p.add_argument("--set", action="append", metavar="PATH=VALUE", default=[], type=key_value,
                   help="any config field by its path (JSON value), repeatable: max_steps=5, "
                        "rollout.max_turns=4, learner={\"kl_coef\": 0} (a mapping is merged "
                        "into its section)")
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="roll out on Ray workers: the cluster at ADDRESS (e.g. "
                        "127.0.0.1:6379 or auto); alone, a local cluster")
    p.add_argument("--num-workers", type=positive_int, metavar="N",
                   help="Ray rollout workers (default 2 with --ray)")
    p.add_argument("--num-rollout-workers", dest="num_workers", type=positive_int,
                   help=argparse.SUPPRESS)
    p.add_argument("--worker-cpus", type=positive_float, help="Ray CPUs per rollout worker")
    p.add_argument("--worker-gpus", type=nonneg_float, help="Ray GPUs per rollout worker")


TRACKERS = ("tensorboard", "wandb", "none")


def _report_to(spec: str, wandb: Any) -> dict[str, Any]:
    """``--report-to tensorboard,wandb`` as the config's ``tensorboard`` and ``wandb`` fields
    (a config's wandb options are kept when wandb is asked for)."""
    from agentgym.errors import ConfigError

    names = {s.strip().lower() for s in spec.split(",") if s.strip()}
    if not names or names - set(TRACKERS) or ("none" in names and len(names) > 1):
        raise ConfigError(f"--report-to {spec!r}: expected a comma-separated list of "
                          "tensorboard, wandb, or none")
    return {"tensorboard": "tensorboard" in names,
            "wandb": (wandb or True) if "wandb" in names else False}


def _set(cfg: dict[str, Any], path: str, value: Any, *, merge: bool = False) -> None:
    """Set the field at the dotted ``path`` of the raw config ``cfg`` (a mapping given for a
    section with ``merge`` is merged into it)."""
    from agentgym.learner.train_config import DEPRECATED_ALIASES, SECTIONS

    path = DEPRECATED_ALIASES.get(path, path)
    *parents, key = path.split(".")
    node = cfg
    for part in parents:
        child = node.get(part)
        node[part] = child = dict(child) if isinstance(child, dict) else {}
        node = child
    old = node.get(key)
    if merge and key in SECTIONS and not parents and isinstance(value, dict) \
            and isinstance(old, dict):
        value = {**old, **value}
    node[key] = value


def _unique_run_folder() -> str:
    base = Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    out, k = base, 1
    while out.exists() and any(out.iterdir()):
        k += 1
        out = base.with_name(f"{base.name}-{k}")
    return str(out)


def _train_config(args: argparse.Namespace) -> dict[str, Any]:
    """The raw config (a nested mapping) the flags make: the ``--config`` file, else the
    resumed run's own config, else the main job (tiny model on maze) or the defaults, with
    every flag and ``--set`` applied. Errors are one-line ConfigErrors."""
    from agentgym.errors import ConfigError
    from agentgym.learner.train_config import _nest, find_config, load_config_file

    run_folder = None
    if args.resume:
        from agentgym.learner.checkpoint import checkpoint_config
        from agentgym.learner.trainer import run_folder_of

        try:
            run_folder = run_folder_of(args.resume)
        except FileNotFoundError:
            raise ConfigError(f"--resume {args.resume}: no checkpoint there (expected a run "
                              "folder with checkpoints/latest, or a checkpoint folder)") from None
        if getattr(args, "overwrite", False):
            raise ConfigError("--resume continues a run in its folder; --overwrite would "
                              "clear it: give one of them")
    cfg: dict[str, Any]
    if args.config:
        cfg = load_config_file(find_config(args.config))
    elif run_folder is not None:
        cfg = checkpoint_config(args.resume)
        cfg.pop("output_dir", None)  # the folder it is in now
    elif args.env in (None, "maze") and args.model in (None, "tiny"):
        cfg = main_job()
    else:
        cfg = {}
    cfg = _nest(cfg)  # the old flat spellings into their sections: a flag sets one place
    if args.env and args.env != cfg.get("env", args.env):
        cfg.pop("env_kwargs", None)
        cfg.pop("eval_env_kwargs", None)
    simple = {"env": args.env, "model": args.model, "backend": args.backend,
              "method": args.method, "max_steps": args.max_steps, "horizon": args.horizon,
              "steps_per_stage": args.steps_per_stage, "tasks_per_step": args.tasks_per_step,
              "n_samples": args.n_samples, "seed": args.seed, "eval_every": args.eval_every,
              "eval_tasks": args.eval_tasks, "async_rollouts": args.async_rollouts,
              "fully_async": args.fully_async, "learner.max_staleness": args.max_staleness,
              "resume": args.resume, "output_dir": args.output,
              "rollout.max_turns": args.max_turns,
              "rollout.max_new_tokens": args.max_new_tokens,
              "rollout.max_total_tokens": args.max_total_tokens,
              "rollout.temperature": args.temperature,
              "rollout.system_prompt": args.system_prompt,
              "rollout.max_concurrency": args.max_concurrency,
              "learner.lr": args.lr,
              "rollout_worker.num_cpus": args.worker_cpus,
              "rollout_worker.num_gpus": args.worker_gpus}
    for path, value in simple.items():
        if value is not None:
            _set(cfg, path, value)
    if args.env_kwarg:
        cfg["env_kwargs"] = {**(cfg.get("env_kwargs") or {}),
                             **parse_key_values(args.env_kwarg)}
    if args.no_warmup:
        cfg["warmup"] = None
    if args.self_play or args.opponent:
        cfg["self_play"] = True
        if args.opponent:
            _set(cfg, "rollout.opponent", args.opponent)
    if args.no_role_baseline:
        cfg["role_baseline"] = False
    for key, value in mechanism_rollout(args).items():
        _set(cfg, f"rollout.{key}", value)
    if args.report_to is not None:
        cfg.update(_report_to(args.report_to, cfg.get("wandb")))
    if args.ray is not None or args.num_workers:
        cfg["num_rollout_workers"] = args.num_workers or 2
        cfg["ray_address"] = None if args.ray in (None, "local") else args.ray
    for key, value in parse_key_values(args.set).items():
        _set(cfg, key, value, merge=True)
    if not cfg.get("output_dir"):
        cfg["output_dir"] = str(run_folder) if run_folder is not None else _unique_run_folder()
    cfg.setdefault("progress", True)
    return cfg


_RUN_MARKS = ("metrics.jsonl", "config.yaml", "checkpoints", "summary.json")


def _prepare_output(cfg, overwrite: bool) -> bool:
    """Check the run folder before anything is built, and clear it for ``--overwrite``;
    returns whether this run makes it (new or empty: removed again if the run stops before
    its first checkpoint). One-line OutputPathErrors."""
    from agentgym.errors import OutputPathError
    from agentgym.learner.trainer import run_folder_of

    out = Path(cfg.output_dir)
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"--output {out}: is a file, not a folder")
    busy = out.is_dir() and any(out.iterdir())
    if cfg.resume:
        if busy and out.resolve() != run_folder_of(cfg.resume).resolve():
            raise OutputPathError(f"--output {out} is not empty: --resume continues in the "
                                  f"run's own folder ({run_folder_of(cfg.resume)}) unless "
                                  "--output names a new one")
        return not busy
    if busy:
        if not overwrite:
            raise OutputPathError(f"--output {out} is not empty (a run is there?): --resume "
                                  f"{out} continues it, --overwrite replaces it")
        if not any((out / m).exists() for m in _RUN_MARKS):
            raise OutputPathError(f"--output {out} is not empty and holds no run (no "
                                  "metrics.jsonl, config.yaml or checkpoints/): --overwrite "
                                  "clears run folders only; choose another --output")
        shutil.rmtree(out)
    return True


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl train``; prints the summary and where the outputs are (exit 130
    after Ctrl-C, with the checkpoint it saved)."""
    from agentgym.cli.args import check_model
    from agentgym.envs.registry import spec
    from agentgym.learner.train_config import TrainerConfig

    cfg = TrainerConfig.from_dict(_train_config(args))  # a refused key or value: one line
    spec(cfg.env)  # an unknown env id: one line
    if cfg.model not in ("tiny", "tiny-vl"):
        check_model(cfg.model)
    created = _prepare_output(cfg, getattr(args, "overwrite", False))
    out = Path(cfg.output_dir)
    verb = "resuming" if cfg.resume else "output"
    say("train", f"{cfg.method} on {cfg.env} with model {cfg.model}; {verb} -> {out}")
    summary = _train(cfg, out, created)
    if summary.get("rank", 0):  # a data-parallel rank other than 0: rank 0 reports
        return 0
    if summary.get("interrupted") and not summary.get("checkpoint"):
        if created and out.is_dir():
            shutil.rmtree(out, ignore_errors=True)
        say("train", "interrupted before the first checkpoint: nothing to resume"
            + (f" ({out} removed)" if created else ""))
        return 130
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    s0, s1 = summary.get("eval_success_start"), summary.get("eval_success_end")
    head = "interrupted" if summary.get("interrupted") else "done"
    lines = [f"{head}: {summary['steps']} steps in {summary['wall_s']:.0f} s"]
    if s0 is not None:
        lines.append(f"held-out success rate: {s0:.2f} -> {s1:.2f} "
                     f"(best {summary['eval_success_best']:.2f})")
    lines += [f"metrics:    {summary['metrics']}",
              f"checkpoint: {summary['checkpoint']}",
              f"plot:       {summary['plot']}",
              f"summary:    {out / 'summary.json'}"]
    if summary.get("interrupted"):
        lines.append(f"resume:     agentgym-rl train --resume {out}")
    print("\n".join(lines), flush=True)
    return 130 if summary.get("interrupted") else 0


def _train(cfg, out: Path, created: bool) -> dict[str, Any]:
    """Train ``cfg``; a run this command started that fails before its first checkpoint
    leaves no folder behind."""
    from agentgym.learner.trainer import Trainer

    try:
        return Trainer(cfg).train()
    except BaseException:
        if created and not (out / "checkpoints" / "latest").exists():
            shutil.rmtree(out, ignore_errors=True)
        raise
