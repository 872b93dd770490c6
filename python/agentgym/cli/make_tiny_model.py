"""``agentgym-rl make-tiny-model DIR``: build the local tiny model (no network) into DIR."""

from __future__ import annotations

import argparse

HELP = "build the local tiny model into DIR"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl make-tiny-model``."""
    from agentgym.models import build_tiny_model

    path = build_tiny_model(args.dir, seed=args.seed)
    print(f"tiny model written to {path}")
    return 0
