"""The ``agentgym-rl`` command line: one module per subcommand.

==================  =====================================  ==============================
subcommand          module                                 does
==================  =====================================  ==============================
``train``           :mod:`agentgym.cli.train`              RL training (no arguments: the
                                                           main job)
``eval``            :mod:`agentgym.cli.evaluate`           held-out success rate of a model
``collect``         :mod:`agentgym.cli.collect`            collect rollouts into shards
``export``          :mod:`agentgym.cli.export`             a collected run for verl/SkyRL/TRL
``play``            :mod:`agentgym.cli.play`               play an env in the terminal
``serve-env``       :mod:`agentgym.cli.serve_env`          serve an env over HTTP
``list``            :mod:`agentgym.cli.list_envs`          the registered env ids
``make-tiny-model`` :mod:`agentgym.cli.make_tiny_model`    build the local tiny model
``plan``            :mod:`agentgym.cli.plan`               per-GPU memory of a config:
                                                           fits or not, what to change
==================  =====================================  ==============================

Each module has ``HELP`` (its one-line help), ``add_args(parser)`` and ``run(args) -> int``.
:func:`main` is the ``agentgym-rl`` console script and ``python -m agentgym.cli``; with no
arguments it runs ``train``. The modules import their heavy dependencies inside ``run``, so
building the parser stays cheap. Progress bars go through :mod:`agentgym.progress`: on a
terminal tqdm's redrawn bar, in a log file one plain line at a bounded rate.
"""

from __future__ import annotations

import argparse
import sys

from agentgym.cli import (
    collect,
    evaluate,
    export,
    list_envs,
    make_tiny_model,
    plan,
    play,
    serve_env,
    train,
)
from agentgym.progress import quiet_library_bars

#: subcommand name -> the module that implements it, in ``--help`` order.
SUBCOMMANDS = {
    "train": train,
    "eval": evaluate,
    "collect": collect,
    "export": export,
    "play": play,
    "serve-env": serve_env,
    "list": list_envs,
    "make-tiny-model": make_tiny_model,
    "plan": plan,
}


def build_parser() -> argparse.ArgumentParser:
    """The ``agentgym-rl`` parser: one subparser per entry of :data:`SUBCOMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="agentgym-rl", description="Multi-turn RL for LLM agents (AgentGym-RL)."
    )
    sub = parser.add_subparsers(dest="command")
    for name, module in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=module.HELP)
        module.add_args(p)
        p.set_defaults(func=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``; empty means ``train``) and run the subcommand."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        argv = ["train"]  # the main job on built-in defaults
    args = parser.parse_args(argv)
    # a log file, not a terminal: no redrawn library bars (ours write plain lines)
    quiet_library_bars()
    from agentgym.errors import UnknownEnvError

    try:
        return int(args.func(args) or 0)
    except UnknownEnvError as e:  # an env id no subcommand knows: one line naming it
        print(f"agentgym-rl {args.command}: {e}", file=sys.stderr)
        return 2


__all__ = ["SUBCOMMANDS", "build_parser", "main"]
