"""The agent-mechanism options (``--undo``, ``--reflection``, ``--branch-at``, ``--plan``,
``--context-window``) shared by ``train`` and ``collect``: docs/mechanisms.md."""

from __future__ import annotations

import argparse
from typing import Any

from agentgym.cli.args import nonneg_int, positive_int


def add_mechanism_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--undo", type=nonneg_int, nargs="?", const=3, metavar="MAX_UNDOS",
                   default=None,
                   help="let the model reply 'undo' / 'undo N' (envs that snapshot; at most "
                        "MAX_UNDOS an episode, default 3): docs/mechanisms.md")
    p.add_argument("--reflection", type=nonneg_int, metavar="N", default=None,
                   help="reflection retries: up to N more attempts after an unsolved one, "
                        "from the episode's start (envs that snapshot): docs/mechanisms.md")
    p.add_argument("--branch-at", type=nonneg_int, metavar="K", default=None,
                   help="branched groups: play each group as trees that fork after K turns "
                        "(envs that snapshot): docs/mechanisms.md")
    p.add_argument("--branch-width", type=positive_int, metavar="W", default=None,
                   help="samples per tree with --branch-at (default 2)")
    p.add_argument("--plan", type=nonneg_int, nargs="?", const=0, metavar="REPLAN_EVERY",
                   default=None,
                   help="a plan turn before the first action (and after every REPLAN_EVERY "
                        "env turns): docs/mechanisms.md")
    p.add_argument("--context-window", type=positive_int, metavar="K", default=None,
                   help="bounded context: each reply sees the first prompt and the last K "
                        "replies; one training sample per reply: docs/mechanisms.md")


def mechanism_rollout(args: argparse.Namespace) -> dict[str, Any]:
    """The rollout settings of the mechanism options given (none: ``{}``); an option that
    needs another is a :class:`~agentgym.errors.ConfigError` naming both."""
    from agentgym.agents import mechanism_settings
    from agentgym.errors import ConfigError

    chosen = {name: getattr(args, name) for name in ("undo", "reflection", "branch_at",
                                                     "plan", "context_window")
              if getattr(args, name) is not None}
    out = mechanism_settings(chosen)
    if args.branch_width is not None:
        if args.branch_at is None:
            raise ConfigError("--branch-width needs --branch-at")
        out["branch_width"] = args.branch_width
    return out
