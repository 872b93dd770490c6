"""``agentgym-rl list``: the registered env ids with their descriptions."""

from __future__ import annotations

import argparse

HELP = "list registered environments"

#: What ``--help`` ends with: two real command lines (tests/cli/test_help_examples.py
#: parses each with the real parser).
EXAMPLES = """\
examples:
  agentgym-rl list
  python -m agentgym.cli list
"""


def add_args(p: argparse.ArgumentParser) -> None:
    """``list`` takes no arguments."""
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EXAMPLES


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl list``."""
    from agentgym.envs.registry import describe, list_envs

    for env_id in list_envs():
        print(f"{env_id:20s} {describe(env_id)}")
    return 0
