"""``agentgym-rl list``: the registered env ids (envs and games) with their kind and
description."""

from __future__ import annotations

import argparse

HELP = "list registered environments and games"

#: What ``--help`` ends with: two real command lines (tests/cli/test_help_examples.py
#: parses each with the real parser).
EXAMPLES = """\
examples:
  agentgym-rl list
  agentgym-rl list --kind game
"""


def add_args(p: argparse.ArgumentParser) -> None:
    """``list [--kind KIND]``."""
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EXAMPLES
    p.add_argument("--kind", choices=["native", "python", "game"], default=None,
                   help="only ids of this kind (native and python: single-agent envs; game: "
                        "multi-seat games)")


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl list``: one line per id, ``id  kind  description``."""
    from agentgym.envs.registry import describe, kind, list_envs

    for env_id in list_envs(kind=getattr(args, "kind", None)):
        print(f"{env_id:20s} {kind(env_id):7s} {describe(env_id)}")
    return 0
