"""``agentgym-rl`` command line."""

from __future__ import annotations

import argparse
import sys


def _cmd_list(args: argparse.Namespace) -> int:
    from agentgym.envs.registry import describe, list_envs

    for env_id in list_envs():
        print(f"{env_id:24s} {describe(env_id)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentgym-rl", description="Multi-turn RL for LLM agents (AgentGym-RL)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="list registered environments")
    p.set_defaults(func=_cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
