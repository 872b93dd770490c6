"""Suite ids in the one env registry: ``suite:id`` names resolve before the other ids
holding ``:`` and leave ``remote:ID`` and ``module:attr`` ids as they were; unknown names
and settings give one-line errors; every suite lists its envs."""

from __future__ import annotations

import pytest

from agentgym.envs import registry
from agentgym.envs.suites import SUITES, list_suite
from agentgym.errors import UnknownEnvError


def test_suite_ids_resolve_to_envs_and_games():
    assert registry.kind("openspiel:catch") == "python"
    assert registry.kind("openspiel:kuhn_poker") == "game"
    assert registry.roles("openspiel:kuhn_poker") == ("player 0", "player 1")
    assert registry.seats("openspiel:leduc_poker(players=3)") == 3
    assert registry.kind("textarena:TicTacToe-v0") == "game"
    assert registry.kind("reasoning_gym:gcd") == "python"
    assert registry.default_horizon("reasoning_gym:gcd") == 1
    assert registry.success_rule("reasoning_gym:gcd").threshold == 1.0


def test_suite_ids_are_never_listed_with_the_registered_ids():
    registry.spec("openspiel:catch")
    prefixes = tuple(f"{name}:" for name in SUITES)
    assert not any(e.startswith(prefixes) for e in registry.list_envs())


def test_remote_and_module_ids_still_resolve(monkeypatch):
    # a module:attr id registers itself: on a copy of the table, so no later test lists it
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    assert registry.kind("remote:maze") == "remote"
    s = registry.spec("agentgym.envs.babyai:BabyAIEnv")
    assert s.kind == "python" and s.entry_point == "agentgym.envs.babyai:BabyAIEnv"


@pytest.mark.parametrize("env_id, message", [
    ("openspiel:no_such_game", "OpenSpiel has no game 'no_such_game'"),
    ("openspiel:kuhn_poker(players=99)", "pyspiel.load_game"),
    ("openspiel:mfg_crowd_modelling", "mean-field"),
    ("textarena:NoSuchEnv-v0", "TextArena has no env 'NoSuchEnv-v0'"),
    ("textarena:TicTacToe-v0@x", "must be a player count"),
    ("reasoning_gym:no_such_dataset", "reasoning_gym has no dataset"),
    ("openspiel:", "name the openspiel env"),
])
def test_a_bad_suite_id_is_one_line_naming_it(env_id, message):
    with pytest.raises(UnknownEnvError, match=None) as err:
        registry.spec(env_id)
    text = str(err.value)
    assert message in text and "\n" not in text


def test_every_suite_lists_its_envs_with_their_source():
    for name in SUITES:
        rows = list_suite(name)
        # openenv-core ships no example envs: an OpenEnv env is a module or a server URL
        assert rows or name == "openenv"
        assert all(r.env_id.startswith(name + ":") for r in rows)
        assert all(r.kind in ("python", "game") and r.source for r in rows)
    ids = {r.env_id for r in list_suite("openspiel")}
    assert {"openspiel:leduc_poker", "openspiel:catch"} <= ids
    assert list_suite("openenv") == []
    with pytest.raises(ValueError, match="^--suite:"):
        list_suite("gym")


def test_a_game_cannot_be_made_as_a_single_agent_env():
    with pytest.raises(UnknownEnvError, match="multi-seat game"):
        registry.make("openspiel:tic_tac_toe")
