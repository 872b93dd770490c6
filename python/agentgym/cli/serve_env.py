"""``agentgym-rl serve-env ENV``: serve a registered env over AgentGym's HTTP protocol (or,
with ``--protocol openenv``, OpenEnv's: :mod:`agentgym.serving.openenv`)."""

from __future__ import annotations

import argparse
import errno
import os

from agentgym.cli.args import port, positive_float, positive_int
from agentgym.errors import ConfigError

HELP = "serve an env over AgentGym's HTTP protocol (or OpenEnv's)"

#: What ``--help`` ends with: two real command lines (tests/cli/test_help_examples.py
#: parses each with the real parser).
EXAMPLES = """\
examples:
  agentgym-rl serve-env textcraft --port 36001  # AgentGym's TextCraft client works as is
  agentgym-rl serve-env search --protocol generic --port 8001 --max-envs 1024 --idle-timeout 600
"""


def add_args(p: argparse.ArgumentParser) -> None:
    p.epilog = EXAMPLES
    p.add_argument("env", help="environment id")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=port, default=8000, help="port (0: any free one)")
    p.add_argument("--max-envs", type=positive_int, default=4096,
                   help="envs alive at once")
    p.add_argument("--idle-timeout", type=positive_float, default=None,
                   help="seconds before an idle env is closed (default: never)")
    p.add_argument("--max-turns", type=positive_int, default=None,
                   help="the horizon (default: the env's own limit)")
    p.add_argument("--protocol", default="agentgym",
                   help="'agentgym' (default): the dialect of the env's AgentGym family "
                        "(textcraft, babyai, sciworld, webshop, searchqa for search) at the "
                        "root and the generic protocol under /generic; 'generic': the generic "
                        "protocol at the root; 'openenv': Meta's OpenEnv protocol (its "
                        "EnvClient, TRL's OpenEnv harness); or a family name")
    p.add_argument("--auth-token", default=None,
                   help="require 'Authorization: Bearer TOKEN' on every request (default: "
                        "$AGENTGYM_AUTH_TOKEN); needed off loopback")
    p.add_argument("--insecure", action="store_true",
                   help="serve off loopback without a token (anyone who reaches it can step "
                        "its envs)")


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl serve-env`` (until interrupted)."""
    from agentgym.serving.server import InsecureServerError, serve
    from agentgym.serving.service import TOKEN_ENV

    token = args.auth_token or os.environ.get(TOKEN_ENV) or None
    options = dict(host=args.host, port=args.port, max_envs=args.max_envs,
                   idle_timeout=args.idle_timeout, max_turns=args.max_turns,
                   auth_token=token, insecure=args.insecure)
    if args.protocol == "openenv":
        from agentgym.serving.openenv import serve
    else:
        options["protocol"] = args.protocol
    try:
        serve(args.env, **options)
    except (InsecureServerError, ValueError) as e:  # one line on stderr, exit 2 (main)
        raise ConfigError(str(e)) from e
    except OSError as e:  # the address cannot be listened on: one line naming it
        if e.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise
        raise ConfigError(f"--host {args.host} --port {args.port}: cannot listen there "
                          f"({e.strerror})") from e
    return 0
