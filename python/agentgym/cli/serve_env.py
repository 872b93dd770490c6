"""``agentgym-rl serve-env ENV``: serve a registered env over AgentGym's HTTP protocol."""

from __future__ import annotations

import argparse

HELP = "serve an env over AgentGym's HTTP protocol"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("env")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-envs", type=int, default=4096)
    p.add_argument("--idle-timeout", type=float, default=None, help="seconds; None = never")
    p.add_argument("--max-turns", type=int, default=None)


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl serve-env`` (until interrupted)."""
    from agentgym.serving.server import serve

    serve(
        args.env,
        host=args.host,
        port=args.port,
        max_envs=args.max_envs,
        idle_timeout=args.idle_timeout,
        max_turns=args.max_turns,
    )
    return 0
