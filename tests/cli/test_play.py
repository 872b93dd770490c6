"""``agentgym-rl play``: an interactive episode driven by typed actions."""

import agentgym
from agentgym.cli.play import play


def test_play_maze_with_oracle_moves_reaches_goal():
    env = agentgym.make("maze")
    env.reset(seed=0, options={"task": 3})
    moves = []
    while True:
        a = env.unwrapped.oracle_action()
        moves.append(a)
        _, _, term, trunc, _ = env.step(a)
        if term or trunc:
            break
    typed = iter(moves)
    lines = []
    total = play("maze", task=3, seed=0, input_fn=lambda _: next(typed), print_fn=lines.append)
    assert total == 1.0
    assert any("episode over (terminated)" in line for line in lines)


def test_play_accepts_action_numbers_and_quits():
    lines = []
    answers = iter(["0", "q"])
    total = play("wordle", task=1, input_fn=lambda _: next(answers), print_fn=lines.append)
    assert total == 0.0
    assert any(line.startswith("actions: [0]") for line in lines)
    assert any(line.startswith("reward") for line in lines)
