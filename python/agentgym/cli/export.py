"""``agentgym-rl export``: a collection run folder in verl's, SkyRL's or TRL's shape."""

from __future__ import annotations

import argparse
import json

from agentgym.cli.args import folder

__all__ = ["HELP", "add_args", "run"]

HELP = "convert a collected run folder for verl, SkyRL or TRL"

#: What ``--help`` ends with: two real command lines (tests/cli/test_help_examples.py
#: parses each with the real parser).
EXAMPLES = """\
examples:
  agentgym-rl export data/maze-oracle --to verl --output data/maze-verl
  agentgym-rl export data/tc-run1 --to trl -o data/tc-trl
"""


def add_args(p: argparse.ArgumentParser) -> None:
    p.epilog = EXAMPLES
    p.add_argument("run_dir", help="a folder written by agentgym-rl collect")
    p.add_argument("--to", required=True, choices=["verl", "skyrl", "trl"],
                   help="the trainer's shape")
    p.add_argument("--output", "-o", dest="out", required=True, type=folder,
                   help="output folder (Parquet shards): new or empty")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier export in --output (a folder of part-NNNNNN.parquet "
                        "files only)")


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl export``; prints what it wrote as JSON. A non-empty ``--output`` is
    refused (one line, exit 2) unless ``--overwrite``."""
    from agentgym.collection.export import export_run

    print(json.dumps(export_run(args.run_dir, args.to, args.out, overwrite=args.overwrite)))
    return 0
