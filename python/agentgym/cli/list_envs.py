"""``agentgym-rl list``: the registered env ids (envs and games) with their kind and
description; ``list --suite NAME``: a community suite's envs (``openspiel``, ``textarena``,
``reasoning_gym``, ``openenv``, ``verifiers``; docs/suites.md) with their kind, seats and
where each comes from."""

from __future__ import annotations

import argparse

HELP = "list registered environments and games"

#: What ``--help`` ends with: two real command lines (tests/cli/test_help_examples.py
#: parses each with the real parser).
EXAMPLES = """\
examples:
  agentgym-rl list --kind game
  agentgym-rl list --suite openspiel --kind game
"""


def add_args(p: argparse.ArgumentParser) -> None:
    """``list [--kind KIND] [--suite NAME]``."""
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EXAMPLES
    p.add_argument("--kind", choices=["native", "python", "game"], default=None,
                   help="only ids of this kind (native and python: single-agent envs; game: "
                        "multi-seat games)")
    p.add_argument("--suite", default=None, metavar="NAME",
                   help="list a community suite's envs instead (openspiel, textarena, "
                        "reasoning_gym, openenv, verifiers): id, kind, seats and source; "
                        "play one as --env NAME:ID")


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl list``: one line per id, ``id  kind  description``; with
    ``--suite``, ``id  kind  seats  source`` per env of the suite (seats ``?``: the game
    takes several counts)."""
    from agentgym.envs.registry import describe, kind, list_envs

    suite = getattr(args, "suite", None)
    if suite is not None:
        from agentgym.envs.suites import SUITES, list_suite
        from agentgym.errors import ConfigError

        if suite not in SUITES:
            raise ConfigError(f"--suite: unknown suite {suite!r}; suites: "
                              f"{', '.join(SUITES)}")
        want = getattr(args, "kind", None)
        if want == "native":
            raise ConfigError("--kind native: a suite's envs are python envs or games")
        for e in list_suite(suite):
            if want is None or e.kind == want:
                seats = "?" if e.seats is None else str(e.seats)
                print(f"{e.env_id:40s} {e.kind:7s} {seats:>5s}  {e.source}")
        return 0

    for env_id in list_envs(kind=getattr(args, "kind", None)):
        print(f"{env_id:20s} {kind(env_id):7s} {describe(env_id)}")
    return 0
