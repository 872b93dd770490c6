"""``agentgym-rl plan``: the learner's memory on each GPU for a training config, before any
weight is loaded.

The model is built from its ``config.json`` on the meta device (shapes only, no download):
a local model folder, a hub id with a bundled config (``configs/agentgym_rl/models/``),
``tiny`` or a named local model. The table gives each kind of memory on the busiest rank
(rank 0, beside a colocated backend), the total and whether it fits ``--gpu-memory``; when
it does not, the setting to change (:mod:`agentgym.learner.planner` has every formula).
Exit status: 0 fits, 1 does not fit, 2 bad input (one line naming the flag or key).
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["HELP", "add_args", "run"]

HELP = "per-GPU memory of a training config: fits or not, and what to change"

#: What ``--help`` ends with: two real command lines (tests/cli/test_help_examples.py
#: parses each with the real parser).
EXAMPLES = """\
examples:
  agentgym-rl plan --config configs/agentgym_rl/babyai_7b.yaml --gpus 8
  agentgym-rl plan --config configs/agentgym_rl/webarena_3b.yaml --gpus 8 --nodes 2 --gpu-memory 141
"""


def add_args(p: argparse.ArgumentParser) -> None:
    p.epilog = EXAMPLES
    p.add_argument("--config", required=True,
                   help="YAML or TOML file of TrainerConfig fields, or the name of one under "
                        "configs/ or configs/agentgym_rl/ (e.g. babyai_7b)")
    p.add_argument("--gpus", type=int, default=1, metavar="N",
                   help="GPUs (ranks) per node, as torchrun's --nproc-per-node (default 1)")
    p.add_argument("--nodes", type=int, default=1, metavar="K",
                   help="nodes (default 1); the run has N x K ranks")
    p.add_argument("--gpu-memory", type=float, default=80.0, metavar="GIB",
                   help="memory of one GPU in GiB (default 80)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="any TrainerConfig field (JSON value), repeatable")


def _fail(msg: str) -> int:
    print(f"agentgym-rl plan: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl plan``: print the table; 0 when it fits, 1 when it does not, 2 on
    bad input."""
    if args.gpus < 1:
        return _fail(f"--gpus must be >= 1, got {args.gpus}")
    if args.nodes < 1:
        return _fail(f"--nodes must be >= 1, got {args.nodes}")
    if not args.gpu_memory > 0:
        return _fail(f"--gpu-memory must be > 0 GiB, got {args.gpu_memory:g}")
    from agentgym.cli.key_values import parse_key_values
    from agentgym.learner.planner import plan_memory
    from agentgym.learner.train_config import find_config, load_config_file

    try:
        path = find_config(args.config)
        cfg = load_config_file(path)
    except (OSError, ValueError) as e:
        return _fail(f"--config {args.config}: {e}")
    try:
        cfg.update(parse_key_values(args.set))
    except argparse.ArgumentTypeError as e:
        return _fail(f"--set: {e}")
    try:
        plan = plan_memory(cfg, args.gpus * args.nodes, args.gpu_memory, nodes=args.nodes)
    except ValueError as e:  # a config key or value the plan refuses, named in e
        return _fail(f"{path}: {e}")
    print(f"config {path}")
    print(plan.render())
    return 0 if plan.fits else 1
