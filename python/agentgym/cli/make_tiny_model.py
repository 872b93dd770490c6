"""``agentgym-rl make-tiny-model DIR``: build the local tiny model (no network) into DIR."""

from __future__ import annotations

import argparse

HELP = "build the local tiny model into DIR"

#: What ``--help`` ends with: two real command lines (tests/cli/test_help_examples.py
#: parses each with the real parser).
EXAMPLES = """\
examples:
  agentgym-rl make-tiny-model models/tiny
  agentgym-rl make-tiny-model models/tiny-seed1 --seed 1
"""


def add_args(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EXAMPLES
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl make-tiny-model``."""
    from agentgym.models import build_tiny_model

    path = build_tiny_model(args.dir, seed=args.seed)
    print(f"tiny model written to {path}")
    return 0
