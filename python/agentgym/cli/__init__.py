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

Every mistake is one line on stderr and exit status 2, never a traceback: a value a flag's
``type=`` refuses (:mod:`agentgym.cli.args`: every parser is an ``args.Parser``), and any
:class:`~agentgym.errors.UsageError` or :class:`~agentgym.errors.UnknownEnvError` a
subcommand raises (:func:`main` prints ``agentgym-rl <command>: error: <message>``). Any
other exception is a bug and keeps its traceback. Ctrl-C is one line and exit status 130.
Every subcommand's ``--help`` shows each option's default (``args.HelpFormatter``, set
here on every subparser after its module added its arguments).
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
from agentgym.cli.args import HelpFormatter, Parser
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


def build_parser() -> Parser:
    """The ``agentgym-rl`` parser: one subparser per entry of :data:`SUBCOMMANDS`, each an
    :class:`~agentgym.cli.args.Parser` (a mistake is one line, exit 2) whose ``--help``
    shows the defaults (:class:`~agentgym.cli.args.HelpFormatter`)."""
    parser = Parser(prog="agentgym-rl", formatter_class=HelpFormatter,
                    description="Multi-turn RL for LLM agents (AgentGym-RL).")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)
    for name, module in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=module.HELP, formatter_class=HelpFormatter)
        module.add_args(p)
        p.formatter_class = HelpFormatter  # whatever the module set: the defaults shown
        p.set_defaults(func=module.run)
    return parser


def _subparser(parser: Parser, name: str | None) -> Parser:
    """The parser of subcommand ``name`` (the top parser when there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return parser


def _one_line(error: BaseException) -> str:
    from agentgym.collection.store import CollectionError

    text = " ".join(str(error).split()) or type(error).__name__
    # the collection errors are documented by name (docs/reliability.md)
    return f"{type(error).__name__}: {text}" if isinstance(error, CollectionError) else text


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``; empty means ``train``) and run the
    subcommand. A :class:`~agentgym.errors.UsageError` or an unknown env id is one line on
    stderr, ``agentgym-rl <command>: error: ...``, and exit status 2; Ctrl-C exit status
    130 (a subcommand that keeps work says what it kept itself)."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        argv = ["train"]  # the main job on built-in defaults
    args, extra = parser.parse_known_args(argv)
    if extra:  # refused by the subcommand's parser: its name in the one line
        _subparser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    # a log file, not a terminal: no redrawn library bars (ours write plain lines)
    quiet_library_bars()
    from agentgym.errors import UnknownEnvError, UsageError

    try:
        return int(args.func(args) or 0)
    except (UsageError, UnknownEnvError) as e:  # the user's mistake, named: one line
        print(f"agentgym-rl {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"agentgym-rl {args.command}: interrupted", file=sys.stderr)
        return 130


__all__ = ["SUBCOMMANDS", "build_parser", "main"]
