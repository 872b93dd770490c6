"""The native ``gridworld`` env (BabyAI-style text room): determinism, oracle vs random
policy, texts, Gymnasium conformance."""

from __future__ import annotations

import random

import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
from tests.helpers import play_to_end


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
    for _ in range(4):
        ids = [i for i, s in enumerate(a.stop_reasons()) if s is None]
        out_a, out_b = a.step(ids, acts[: len(ids)]), b.step(ids, acts[: len(ids)])
        assert out_a[0] == out_b[0]
    e1, e2 = agentgym.make("gridworld"), agentgym.make("gridworld")
    assert e1.reset(seed=3) == e2.reset(seed=3)
    while True:
        action = e1.unwrapped.oracle_action()
        step = e1.step(action)
        assert step[:3] == e2.step(action)[:3]
        if step[2]:
            break
    assert step[1] == 1.0


def test_invalid_action_and_bad_kwargs():
    pool = agentgym.EnvPool("gridworld", 1)
    pool.reset()
    obs, r, term, _ = pool.step([0], ["fly away"])
    assert obs[0].startswith("Invalid action.") and r[0] == 0 and not term[0]
    with pytest.raises(ValueError, match="size"):
        agentgym.EnvPool("gridworld", 1, size=2)
    with pytest.raises(agentgym.InvalidTaskError):
        pool.reset(tasks=["a room"])


def test_gymnasium_check_env():
    env = agentgym.make("gridworld", difficulty="hard")
    check_env(env.unwrapped, skip_render_check=True)
