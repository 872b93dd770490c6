"""The native ``gridworld`` env (BabyAI-style text room): determinism, oracle vs random
policy, texts, Gymnasium conformance."""

from __future__ import annotations

import random

import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
from tests.helpers import (
    assert_invalid_action_is_a_free_turn,
    assert_oracle_play_matches,
    assert_pools_play_alike,
    play_to_end,
)


def test_listed_and_first_observation():
    assert "gridworld" in agentgym.list_envs()
    pool = agentgym.EnvPool("gridworld", 8)
    obs = pool.reset()
    assert all(o.startswith("Mission: ") and " You face " in o and " You see " in o for o in obs)
    missions = {o.split(".")[0].split(": ")[1].split(" the ")[0] for o in pool.reset()}
    assert missions <= {"go to", "pick up", "open"}
    assert "toggle" in pool.instructions


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_oracle_solves_and_random_rarely_does(difficulty):
    rng = random.Random(0)
    pool = agentgym.EnvPool("gridworld", 256, seed=1, max_turns=200, difficulty=difficulty)
    pool.reset()
    assert play_to_end(pool, "oracle", rng).mean() == 1.0
    pool = agentgym.EnvPool("gridworld", 256, seed=1, max_turns=15, difficulty=difficulty)
    pool.reset()
    assert play_to_end(pool, "random", rng).mean() < 0.2


def test_pool_and_make_are_deterministic():
    a, b = agentgym.EnvPool("gridworld", 32, seed=4), agentgym.EnvPool("gridworld", 32, seed=9)
    assert a.reset() == b.reset()  # layouts depend on the task only
    acts = ["turn left", "move forward", "pick up", "toggle", "drop", "turn right", "x"] * 5
    assert_pools_play_alike(a, b, lambda k, ids: acts[: len(ids)], 4)
    e1, e2 = agentgym.make("gridworld"), agentgym.make("gridworld")
    assert e1.reset(seed=3) == e2.reset(seed=3)
    step = assert_oracle_play_matches(e1, e2)
    assert step[1] == 1.0


def test_invalid_action_and_bad_kwargs():
    pool = assert_invalid_action_is_a_free_turn("gridworld", "fly away")
    with pytest.raises(ValueError, match="size"):
        agentgym.EnvPool("gridworld", 1, size=2)
    with pytest.raises(agentgym.InvalidTaskError):
        pool.reset(tasks=["a room"])


def test_gymnasium_check_env():
    env = agentgym.make("gridworld", difficulty="hard")
    check_env(env.unwrapped, skip_render_check=True)
