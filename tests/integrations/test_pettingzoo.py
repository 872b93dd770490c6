"""The native multi-seat games through ``agentgym._core.Game`` and as PettingZoo AEC envs
(``agentgym.integrations.pettingzoo``): PettingZoo's own API test, oracle self-play, final
rewards, illegal moves, private views, and the binding's named errors."""

import sys
import warnings

import pytest

pytest.importorskip("pettingzoo")

import agentgym  # noqa: E402
from agentgym import _core  # noqa: E402
from agentgym.integrations.pettingzoo import GameAEC, game_ids  # noqa: E402


def play(env: GameAEC, choose) -> dict[str, float]:
    """Play one game with ``choose(agent, info)``; each agent's final reward."""
    final = {}
    for agent in env.agent_iter():
        _, reward, term, trunc, info = env.last()
        if term or trunc:
            final[agent] = reward
            env.step(None)
        else:
            env.step(choose(agent, info))
    return final


@pytest.mark.parametrize("game_id", ["tictactoe", "kuhn_poker", "negotiation"])
def test_pettingzoo_api_test_passes(game_id, monkeypatch):
    """PettingZoo's ``api_test``, with its one numpy-only check (an observation's dtype
    against its space's: a text observation has none) left out; every other check runs. Its
    advisory warnings (observations not numpy arrays, agent names) are not failures."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pettingzoo.test import api_test

        module = sys.modules["pettingzoo.test.api_test"]
        monkeypatch.setattr(module, "_test_observation_space_compatibility",
                            lambda *a, **k: None)
        api_test(GameAEC(game_id), num_cycles=200, verbose_progress=False)


def test_oracle_self_play_reaches_each_games_value():
    # (the test-only game that conftest registers with the test envs starts with "_")
    assert sorted(g for g in game_ids() if not g.startswith("_")) == [
        "kuhn_poker", "negotiation", "tictactoe"]
    env = GameAEC("tictactoe")
    assert env.possible_agents == ["X", "O"]
    for seed in range(5):  # perfect play from the empty board draws
        env.reset(seed=seed, options={"task": 0})
        assert play(env, lambda a, info: info["oracle_action"]) == {"X": 0.0, "O": 0.0}
    poker = GameAEC("kuhn_poker")
    total = 0.0
    for task in range(6):
        for seed in range(200):
            poker.reset(seed=seed, options={"task": task})
            final = play(poker, lambda a, info: info["oracle_action"])
            assert final["first"] == -final["second"] and abs(final["first"]) in (1.0, 2.0)
            total += final["first"]
    # Kuhn poker's value for the first player is -1/18 under the equilibrium
    assert total / 1200 == pytest.approx(-1 / 18, abs=0.05)


def test_an_illegal_move_ends_the_game_at_minus_one_for_its_agent():
    env = GameAEC("tictactoe")
    env.reset(seed=0, options={"task": 0})
    final = play(env, lambda a, info: "5" if a == "X" else "5")  # O takes X's cell
    assert final == {"X": 0.0, "O": -1.0}
    env.reset(seed=0, options={"task": 0})
    assert play(env, lambda a, info: "the middle") == {"X": -1.0, "O": 0.0}


def test_a_seat_never_sees_the_other_seats_card():
    env = GameAEC("kuhn_poker")
    views = []
    for task in (0, 1):  # (Jack, Queen) and (Jack, King): the first seat holds the Jack
        env.reset(seed=0, options={"task": task})
        views.append(env.observe("first"))
    assert views[0] == views[1] and "Jack" in views[0]
    assert "Queen" not in views[0] and "King" not in views[0]


def test_the_binding_refuses_bad_input_with_named_errors():
    g = _core.Game("tictactoe")
    g.reset(0, 0)
    with pytest.raises(IndexError, match="seat 2"):
        g.observation(2)
    with pytest.raises(ValueError, match="1 seat"):
        g.step(["1", "2"])
    with pytest.raises(agentgym.UnknownEnvError, match="kuhn_poker"):
        _core.Game("chess")
    with pytest.raises(ValueError, match="unexpected keyword"):
        _core.Game("tictactoe", '{"size": 4}')
    copy = g.snapshot()
    g.step(["5"])
    assert copy.to_move() == [0] and g.to_move() == [1]
    g.step(["zz"])
    assert g.over and g.rewards() == [0.0, -1.0]
    with pytest.raises(ValueError, match="over"):
        g.step(["1"])


def test_negotiators_reach_deals_and_keep_their_values_private():
    env = GameAEC("negotiation")
    assert env.possible_agents == ["A", "B"]
    deals = 0
    for task in range(40):
        env.reset(seed=task, options={"task": task})
        view = env.observe("B")
        assert "Your values" in view and "private" in view
        final = play(env, lambda a, info: info["oracle_action"])
        assert all(0.0 <= r <= 1.0 for r in final.values())
        deals += sum(final.values()) > 0
    assert deals >= 30
