"""What the trainer adapters share (``agentgym.integrations._episodes``): a multi-seat game
is refused by name, since one adapter request is one trajectory and a game episode has one
per seat."""

import pytest

from agentgym.integrations._episodes import EpisodeCoalescer, TaskRefError, task_ref


@pytest.mark.parametrize("game", ["tictactoe", "kuhn_poker", "negotiation"])
def test_the_adapters_refuse_a_game_by_name(game):
    with pytest.raises(TaskRefError, match="multi-seat game.*single-agent envs only"):
        task_ref({"env_id": game, "task": 0})
    coalescer = EpisodeCoalescer(lambda key: None)  # never asked for an engine
    with pytest.raises(TaskRefError, match="--self-play"):
        coalescer.play(game, 0)
    assert task_ref({"env_id": "maze", "task": 3}) == ("maze", 3)
