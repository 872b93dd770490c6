"""``agentgym-rl collect``: play (task, sample) episodes with any backend and write them as
Parquet (or JSONL) shards into a run folder; the same command resumes the folder after an
interruption (``kill -9`` included) and plays only the keys not yet on disk."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agentgym.cli.key_values import parse_key_values
from agentgym.cli.mechanisms import add_mechanism_args, mechanism_rollout

__all__ = ["HELP", "add_args", "parse_tasks", "run"]

HELP = "collect rollouts into a resumable folder of Parquet/JSONL shards"

#: What ``--help`` ends with: two real command lines (tests/cli/test_help_examples.py
#: parses each with the real parser).
EXAMPLES = """\
examples:
  agentgym-rl collect --env maze --tasks 0:100000 --backend scripted --out data/maze-oracle
  agentgym-rl collect --env textcraft --tasks 0:544 --n-samples 8 --backend vllm -o data/tc-run1
"""


def add_args(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EXAMPLES
    p.add_argument("--env", required=True, help="environment id")
    p.add_argument("--env-kwarg", action="append", metavar="KEY=VALUE", default=[],
                   help="environment keyword argument (JSON value), repeatable")
    tasks = p.add_mutually_exclusive_group(required=True)
    tasks.add_argument("--tasks", help="task indices: START:STOP[:STEP] or i,j,k")
    tasks.add_argument("--tasks-file", help="one task per line: an integer is a task index, "
                                            "any other line a task text")
    tasks.add_argument("--task", action="append", help="a task text, repeatable")
    p.add_argument("--n-samples", type=int, default=1, help="episodes per task (a group)")
    p.add_argument("--out", "-o", required=True,
                   help="run folder (resumed when it holds the same run)")
    p.add_argument("--format", default="parquet", choices=["parquet", "jsonl"])
    p.add_argument("--shard-size", type=int, default=1000, help="rows per shard")
    p.add_argument("--retry-failed", action="store_true",
                   help="play again the keys whose rows failed (their rows are replaced)")
    p.add_argument("--messages", action="store_true",
                   help="also store the decoded conversation segments")
    p.add_argument("--backend", default="scripted",
                   choices=["scripted", "transformers", "vllm", "openai"])
    p.add_argument("--model", default=None,
                   help="model folder (its tokenizer too); default and 'tiny': the local "
                        "tiny model")
    p.add_argument("--policy", default="oracle", choices=["oracle", "random"],
                   help="the scripted backend's policy")
    p.add_argument("--base-url", help="openai backend: the server's URL")
    p.add_argument("--served-model", help="openai backend: the server's model name "
                                          "(default: --model)")
    p.add_argument("--backend-kwarg", action="append", metavar="KEY=VALUE", default=[],
                   help="backend constructor argument (JSON value), repeatable")
    p.add_argument("--max-turns", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None, help="run seed (episode seeds derive "
                                                          "from it and the task)")
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--opponent", default=None,
                   help="a multi-seat game's other seats: self (the model every seat, the "
                        "default), solver or random")
    p.add_argument("--env-workers", type=int, default=None)
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="play on Ray rollout workers: the cluster at ADDRESS; alone, a local "
                        "cluster")
    p.add_argument("--num-workers", type=int, metavar="N",
                   help="Ray rollout workers (default 2 with --ray; --max-concurrency is "
                        "per worker)")
    p.add_argument("--worker-cpus", type=float, default=1.0, help="Ray CPUs per worker")
    p.add_argument("--worker-gpus", type=float, default=0.0, help="Ray GPUs per worker")
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
    """The task list of ``--tasks`` (a range or indices), ``--tasks-file`` or ``--task``."""
    if args.task:
        return list(args.task)
    if args.tasks_file:
        lines = Path(args.tasks_file).read_text(encoding="utf-8").splitlines()
        return _ints_or_texts([ln.strip() for ln in lines if ln.strip()])
    spec = args.tasks.strip()
    if ":" in spec:
        try:
            parts = [int(x) for x in spec.split(":")]
        except ValueError:
            raise SystemExit(f"--tasks {spec!r}: expected START:STOP[:STEP]") from None
        if len(parts) not in (2, 3):
            raise SystemExit(f"--tasks {spec!r}: expected START:STOP[:STEP]")
        return range(*parts)
    try:
        return [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--tasks {spec!r}: expected START:STOP[:STEP] or i,j,k") from None


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl collect``: prints the summary table (``--json``: the summary)."""
    from agentgym.collection import CollectionError, Collector
    from agentgym.collection.progress import format_summary
    from agentgym.engine.loop import run as run_loop
    from agentgym.engine.runner import open_runner

    tasks = parse_tasks(args)
    rollout = {k: v for k, v in {
        "max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens,
        "max_total_tokens": args.max_total_tokens, "temperature": args.temperature,
        "top_p": args.top_p, "seed": args.seed, "system_prompt": args.system_prompt,
        "max_concurrency": args.max_concurrency, "env_workers": args.env_workers,
        "opponent": args.opponent,
    }.items() if v is not None}
    rollout.update(mechanism_rollout(args))
    backend_kwargs = parse_key_values(args.backend_kwarg)
    if args.backend == "scripted":
        backend_kwargs.setdefault("policy", args.policy)
    if args.backend == "openai":
        if not args.base_url:
            raise SystemExit("--backend openai needs --base-url")
        backend_kwargs.setdefault("base_url", args.base_url)
        if args.served_model:
            backend_kwargs.setdefault("model", args.served_model)

    async def main() -> dict:
        import asyncio

        pooled = args.ray is not None or args.num_workers  # the same rows from Ray workers
        opened = await asyncio.to_thread(
            open_runner, args.backend, args.model, backend_kwargs=backend_kwargs,
            num_workers=(args.num_workers or 2) if pooled else 0,
            ray_address=None if args.ray in (None, "local") else args.ray,
            worker={"num_cpus": args.worker_cpus, "num_gpus": args.worker_gpus},
            progress=False, **rollout)
        try:
            collector = Collector(
                opened.runner, args.env, tasks, args.out, n_samples=args.n_samples,
                env_kwargs=parse_key_values(args.env_kwarg), format=args.format,
                shard_size=args.shard_size, retry_failed=args.retry_failed,
                tokenizer=opened.tokenizer, messages=args.messages, identity=opened.identity,
                metadata={"command": sys.argv, "backend_kwargs": backend_kwargs},
                progress=not args.no_progress)
            return await collector.run()
        finally:
            await opened.runner.aclose()

    try:
        summary = run_loop(main())
    except CollectionError as e:
        print(f"agentgym-rl collect: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary))
    else:
        print(format_summary(summary))
    return 0
