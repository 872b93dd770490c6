"""``agentgym-rl collect``: play (task, sample) episodes with any backend and write them as
Parquet (or JSONL) shards into a run folder; the same command resumes the folder after an
interruption (``kill -9`` included) and plays only the keys not yet on disk."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from agentgym.cli.args import (
    check_backend_kwargs,
    check_model,
    check_tasks,
    folder,
    format_tasks,
    hub_error,
    is_local,
    key_value,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    probability,
    rollout_settings,
    say,
    task_indices,
)
from agentgym.cli.key_values import parse_key_values
from agentgym.cli.mechanisms import add_mechanism_args, mechanism_rollout

#: Seconds between two partial shards (the collector's default, without importing it).
DEFAULT_FLUSH_EVERY_S = 30.0

__all__ = ["HELP", "add_args", "parse_tasks", "run"]

HELP = "collect rollouts into a resumable folder of Parquet/JSONL shards"

#: What ``--help`` ends with: two real command lines (tests/cli/test_help_examples.py
#: parses each with the real parser).
EXAMPLES = """\
examples:
  agentgym-rl collect --env maze --tasks 0:100000 --backend scripted --output data/maze-oracle
  agentgym-rl collect --env textcraft --tasks 0:544 --n-samples 8 --backend vllm -o data/tc-run1
"""


def add_args(p: argparse.ArgumentParser) -> None:
    p.epilog = EXAMPLES
    p.add_argument("--env", required=True, help="environment id")
    p.add_argument("--env-kwarg", action="append", metavar="KEY=VALUE", default=[],
                   type=key_value,
                   help="environment keyword argument (JSON value), repeatable")
    tasks = p.add_mutually_exclusive_group(required=True)
    tasks.add_argument("--tasks", type=task_indices,
                       help="task indices: START:STOP[:STEP] or i,j,k (each below the env's "
                            "task count)")
    tasks.add_argument("--tasks-file", help="one task per line: an integer is a task index, "
                                            "any other line a task text")
    tasks.add_argument("--task", action="append", help="a task text, repeatable")
    p.add_argument("--n-samples", type=positive_int, default=1,
                   help="episodes per task (a group)")
    p.add_argument("--output", "-o", dest="out", required=True, type=folder,
                   help="run folder (resumed when it holds the same run)")
    p.add_argument("--format", default="parquet", choices=["parquet", "jsonl"],
                   help="shard format")
    p.add_argument("--shard-size", type=positive_int, default=1000,
                   help="rows per shard (at most: see --flush-every)")
    p.add_argument("--flush-every", type=positive_float, default=DEFAULT_FLUSH_EVERY_S,
                   metavar="SECONDS",
                   help="also write the finished rows as a shard when this long passed since "
                        "the last one (checked as episodes finish); Ctrl-C writes them too")
    p.add_argument("--retry-failed", action="store_true",
                   help="play again the keys whose rows failed (their rows are replaced)")
    p.add_argument("--messages", action="store_true",
                   help="also store the decoded conversation segments")
    p.add_argument("--backend", default="scripted",
                   choices=["scripted", "transformers", "vllm", "openai"],
                   help="what plays the episodes")
    p.add_argument("--model", default=None,
                   help="model folder (its tokenizer too), a hub id or a named model; "
                        "default and 'tiny': the local tiny model")
    p.add_argument("--policy", default="oracle", choices=["oracle", "random"],
                   help="the scripted backend's policy")
    p.add_argument("--base-url", help="openai backend: the server's URL")
    p.add_argument("--served-model", help="openai backend: the server's model name "
                                          "(default: --model)")
    p.add_argument("--backend-kwarg", action="append", metavar="KEY=VALUE", default=[],
                   type=key_value,
                   help="backend constructor argument (JSON value), repeatable")
    p.add_argument("--max-turns", type=positive_int, default=None,
                   help="the horizon (default: the rollout default)")
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help="tokens per reply (default: the rollout default)")
    p.add_argument("--max-total-tokens", type=positive_int, default=None,
                   help="context cap of an episode (default: the rollout default)")
    p.add_argument("--temperature", type=nonneg_float, default=None,
                   help="sampling temperature (default: the rollout default)")
    p.add_argument("--top-p", type=probability, default=None,
                   help="nucleus sampling (default: the rollout default)")
    p.add_argument("--seed", type=nonneg_int, default=None,
                   help="run seed (episode seeds derive from it and the task; default 0)")
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--max-concurrency", type=positive_int, default=None,
                   help="episodes played at once (default: the rollout default)")
    p.add_argument("--opponent", default=None,
                   help="a multi-seat game's other seats: self (the model every seat, the "
                        "default), solver or random")
    p.add_argument("--env-workers", type=nonneg_int, default=None,
                   help="worker processes for Python envs (default 0: threads)")
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="play on Ray rollout workers: the cluster at ADDRESS; alone, a local "
                        "cluster")
    p.add_argument("--num-workers", type=positive_int, metavar="N",
                   help="Ray rollout workers (default 2 with --ray; --max-concurrency is "
                        "per worker)")
    p.add_argument("--worker-cpus", type=positive_float, default=1.0,
                   help="Ray CPUs per worker")
    p.add_argument("--worker-gpus", type=nonneg_float, default=0.0,
                   help="Ray GPUs per worker")
    add_mechanism_args(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def _ints_or_texts(items: list[str]) -> list[int | str]:
    out: list[int | str] = []
    for s in items:
        try:
            out.append(int(s))
        except ValueError:
            out.append(s)
    return out


def parse_tasks(args: argparse.Namespace) -> range | list[int | str]:
    """The task list of ``--tasks`` (a range or indices, parsed by its ``type=``),
    ``--tasks-file`` or ``--task``; a file that cannot be read or has no task is a
    :class:`~agentgym.errors.ConfigError` naming ``--tasks-file``."""
    from agentgym.errors import ConfigError

    if args.task:
        return list(args.task)
    if args.tasks_file:
        try:
            lines = Path(args.tasks_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--tasks-file {args.tasks_file}: cannot read it "
                              f"({e.strerror if isinstance(e, OSError) else e})") from e
        tasks = _ints_or_texts([ln.strip() for ln in lines if ln.strip()])
        if not tasks:
            raise ConfigError(f"--tasks-file {args.tasks_file}: no tasks in it")
        return tasks
    return args.tasks


def _tasks_flag(args: argparse.Namespace) -> str:
    if args.task:
        return "--task"
    if args.tasks_file:
        return f"--tasks-file {args.tasks_file}"
    return f"--tasks {format_tasks(args.tasks)}"


def _settings(args: argparse.Namespace) -> tuple[Any, dict[str, Any], dict[str, Any],
                                                 dict[str, Any]]:
    """Everything the run needs, checked before anything is opened or written: (tasks,
    env kwargs, rollout settings, backend kwargs). A mistake is a ``UsageError`` naming its
    flag; an unknown env id an ``UnknownEnvError``."""
    from agentgym.errors import ConfigError

    tasks = parse_tasks(args)
    env_kwargs = parse_key_values(args.env_kwarg)
    check_model(args.model)
    check_tasks(args.env, env_kwargs, tasks, flag=_tasks_flag(args))  # builds the env
    rollout = {k: v for k, v in {
        "max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens,
        "max_total_tokens": args.max_total_tokens, "temperature": args.temperature,
        "top_p": args.top_p, "seed": args.seed, "system_prompt": args.system_prompt,
        "max_concurrency": args.max_concurrency, "env_workers": args.env_workers,
        "opponent": args.opponent,
    }.items() if v is not None}
    rollout.update(mechanism_rollout(args))
    rollout = rollout_settings(rollout)
    backend_kwargs = parse_key_values(args.backend_kwarg)
    if args.backend == "scripted":
        backend_kwargs.setdefault("policy", args.policy)
    if args.backend == "openai":
        if not args.base_url and "base_url" not in backend_kwargs:
            raise ConfigError("--backend openai needs --base-url (the server's URL)")
        if args.base_url:
            backend_kwargs.setdefault("base_url", args.base_url)
        if args.served_model:
            backend_kwargs.setdefault("model", args.served_model)
    check_backend_kwargs(args.backend, backend_kwargs)
    return tasks, env_kwargs, rollout, backend_kwargs


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl collect``: prints the summary table (``--json``: the summary).
    Everything is checked before the folder is touched; Ctrl-C (or SIGTERM) writes the
    finished rows, prints one line saying what is on disk and exits 130 (143)."""
    import asyncio
    import signal

    from agentgym.collection import Collector
    from agentgym.collection.progress import format_summary
    from agentgym.engine.loop import run as run_loop
    from agentgym.engine.runner import open_runner

    tasks, env_kwargs, rollout, backend_kwargs = _settings(args)
    state: dict[str, Any] = {}

    async def main() -> dict:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()

        def terminate() -> None:  # SIGTERM: as Ctrl-C (asyncio turns SIGINT into a cancel)
            state["signal"] = "SIGTERM"
            task.cancel()

        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGTERM, terminate)
        pooled = args.ray is not None or args.num_workers  # the same rows from Ray workers
        try:
            opened = await asyncio.to_thread(
                open_runner, args.backend, args.model, backend_kwargs=backend_kwargs,
                num_workers=(args.num_workers or 2) if pooled else 0,
                ray_address=None if args.ray in (None, "local") else args.ray,
                worker={"num_cpus": args.worker_cpus, "num_gpus": args.worker_gpus},
                progress=False, **rollout)
        except OSError as e:  # a hub id the loader could not get (a path is checked first)
            if is_local(args.model):
                raise
            raise hub_error(args.model, e) from e
        try:
            collector = Collector(
                opened.runner, args.env, tasks, args.out, n_samples=args.n_samples,
                env_kwargs=env_kwargs, format=args.format,
                shard_size=args.shard_size, flush_every=args.flush_every,
                retry_failed=args.retry_failed,
                tokenizer=opened.tokenizer, messages=args.messages, identity=opened.identity,
                metadata={"command": sys.argv, "backend_kwargs": backend_kwargs},
                progress=not args.no_progress)
            state["collector"] = collector
            return await collector.run()
        finally:
            await opened.runner.aclose()
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGTERM)

    try:
        summary = run_loop(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        name = state.get("signal", "SIGINT")
        _say_kept(args, state.get("collector"), name)
        return 143 if name == "SIGTERM" else 130
    if args.json:
        print(json.dumps(summary))
    else:
        print(format_summary(summary))
    return 0


def _say_kept(args: argparse.Namespace, collector, signal_name: str) -> None:
    """The one line an interrupted run prints: what is on disk and how to resume."""
    what = "interrupted" if signal_name == "SIGINT" else f"stopped by {signal_name}"
    summary = getattr(collector, "summary", None)
    if collector is None or not getattr(collector, "interrupted", False):
        say("collect", f"{what} before collecting began; {args.out} is as it was")
    elif summary is None:
        say("collect", f"{what} before any episode finished; nothing written to {args.out}")
    else:
        run = summary["run"]
        say("collect", f"{what}: {run['rows']:,} of {run['expected']:,} rows are on disk in "
                       f"{args.out} (episodes in flight were dropped); run the same command "
                       "again to resume")
