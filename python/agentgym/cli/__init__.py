"""``agentgym-rl`` command line: train, eval, play, serve-env, list, make-tiny-model."""

from __future__ import annotations

import argparse
import sys


def _cmd_list(args: argparse.Namespace) -> int:
    from agentgym.envs.registry import describe, list_envs

    for env_id in list_envs():
        print(f"{env_id:20s} {describe(env_id)}")
    return 0


def _cmd_make_tiny_model(args: argparse.Namespace) -> int:
    from agentgym.models import build_tiny_model

    path = build_tiny_model(args.dir, seed=args.seed)
    print(f"tiny model written to {path}")
    return 0


def _cmd_serve_env(args: argparse.Namespace) -> int:
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


def play(env_id: str, *, task=None, seed: int = 0, max_turns: int | None = None,
         input_fn=input, print_fn=print) -> float:
    """Play ``env_id`` in the terminal: observation, numbered valid actions, reward.

    Type an action, or the number of a listed one; ``q`` quits. Returns the episode return.
    """
    import agentgym

    env = agentgym.make(env_id, max_turns=max_turns)
    options = {} if task is None else {"task": task}
    obs, info = env.reset(seed=seed, options=options)
    instructions = getattr(env.unwrapped, "instructions", "")
    if instructions:
        print_fn(instructions.strip() + "\n")
    total, turn = 0.0, 0
    while True:
        print_fn(obs)
        valid = getattr(env.unwrapped, "valid_actions", lambda: [])()
        if valid:
            shown = valid[:30]
            print_fn("actions: " + " | ".join(f"[{i}] {a}" for i, a in enumerate(shown)))
        try:
            line = input_fn(f"turn {turn + 1}> ").strip()
        except EOFError:
            line = "q"
        if line in ("q", "quit", "exit"):
            break
        action = valid[int(line)] if line.isdigit() and int(line) < len(valid) else line
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        turn += 1
        print_fn(f"reward {reward:+.3f}  return {total:.3f}")
        if terminated or truncated:
            print_fn(obs)
            print_fn(f"episode over ({'terminated' if terminated else 'truncated'}) "
                     f"after {turn} turns, return {total:.3f}")
            break
    env.close()
    return total


def _cmd_play(args: argparse.Namespace) -> int:
    task = args.task
    if task is not None and task.isdigit():
        task = int(task)
    play(args.env, task=task, seed=args.seed, max_turns=args.max_turns)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentgym-rl", description="Multi-turn RL for LLM agents (AgentGym-RL)."
    )
    sub = parser.add_subparsers(dest="command")

    from agentgym import train_cli

    p = sub.add_parser("train", help="train a policy with RL (default: tiny model on maze)")
    train_cli.add_train_args(p)
    p.set_defaults(func=train_cli.run_train)

    p = sub.add_parser("eval", help="success rate and mean reward of a model on envs")
    train_cli.add_eval_args(p)
    p.set_defaults(func=train_cli.run_eval)

    p = sub.add_parser("play", help="play an environment in the terminal")
    p.add_argument("env")
    p.add_argument("--task", default=None, help="task index or task text")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-turns", type=int, default=None)
    p.set_defaults(func=_cmd_play)

    p = sub.add_parser("serve-env", help="serve an env over AgentGym's HTTP protocol")
    p.add_argument("env")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-envs", type=int, default=4096)
    p.add_argument("--idle-timeout", type=float, default=None, help="seconds; None = never")
    p.add_argument("--max-turns", type=int, default=None)
    p.set_defaults(func=_cmd_serve_env)

    p = sub.add_parser("list", help="list registered environments")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("make-tiny-model", help="build the local tiny model into DIR")
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_make_tiny_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        argv = ["train"]  # the main job on built-in defaults
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
