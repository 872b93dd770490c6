"""``agentgym-rl make-tiny-model DIR``: build the local tiny model (no network) into DIR."""

from __future__ import annotations

import argparse

from agentgym.cli.args import folder, nonneg_int

HELP = "build the local tiny model into DIR"

#: What ``--help`` ends with: two real command lines (tests/cli/test_help_examples.py
#: parses each with the real parser).
EXAMPLES = """\
examples:
  agentgym-rl make-tiny-model models/tiny
  agentgym-rl make-tiny-model models/tiny-seed1 --seed 1
"""


def add_args(p: argparse.ArgumentParser) -> None:
    p.epilog = EXAMPLES
    p.add_argument("dir", type=folder, help="folder to write the model into")
    p.add_argument("--seed", type=nonneg_int, default=0, help="weights seed")


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl make-tiny-model``."""
    from agentgym.models import build_tiny_model

    path = build_tiny_model(args.dir, seed=args.seed)
    print(f"tiny model written to {path}")
    return 0
