"""``agentgym-rl list``: the registered env ids with their descriptions."""

from __future__ import annotations

import argparse

HELP = "list registered environments"


def add_args(p: argparse.ArgumentParser) -> None:
    """``list`` takes no arguments."""


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl list``."""
    from agentgym.envs.registry import describe, list_envs

    for env_id in list_envs():
        print(f"{env_id:20s} {describe(env_id)}")
    return 0
