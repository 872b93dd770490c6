"""``agentgym-rl play ENV``: play an env in the terminal."""

from __future__ import annotations

import argparse

from agentgym.cli.args import check_tasks, nonneg_int, positive_int

HELP = "play an environment in the terminal"

#: What ``--help`` ends with: two real command lines (tests/cli/test_help_examples.py
#: parses each with the real parser).
EXAMPLES = """\
examples:
  agentgym-rl play maze --task 3 --max-turns 20
  agentgym-rl play wordle --seed 7
"""


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


def add_args(p: argparse.ArgumentParser) -> None:
    p.epilog = EXAMPLES
    p.add_argument("env", help="environment id")
    p.add_argument("--task", default=None, help="task index or task text (default: drawn "
                                                "from --seed)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="episode seed")
    p.add_argument("--max-turns", type=positive_int, default=None,
                   help="the horizon (default: the env's own limit)")


def run(args: argparse.Namespace) -> int:
    """Run ``agentgym-rl play``; a task the env does not have is one line naming
    ``--task``."""
    from agentgym.errors import ConfigError, InvalidTaskError

    task = args.task
    if task is not None and task.isdigit():
        task = int(task)
        check_tasks(args.env, {}, [task], flag=f"--task {task}")  # an env would wrap it
    try:
        play(args.env, task=task, seed=args.seed, max_turns=args.max_turns)
    except InvalidTaskError as e:
        raise ConfigError(f"--task {args.task}: {' '.join(str(e).split())}") from e
    return 0
