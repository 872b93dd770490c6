"""The native ``game2048`` env: determinism in (task, seed), oracle vs random policy, texts,
Gymnasium conformance."""

from __future__ import annotations

import random

import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
from tests.helpers import (
    assert_invalid_action_is_a_free_turn,
    assert_pools_play_alike,
    play_to_end,
)


def test_board_text():
    pool = agentgym.EnvPool("game2048", 1, difficulty="easy")
    obs = pool.reset()[0]
    head, *rows = obs.split("\n")
    assert head == "Make a 64 tile. Score 0, move 0."
    assert len(rows) == 4 and all(len(r.split(" ")) == 4 for r in rows)
    cells = " ".join(rows).split(" ")
    assert sorted(c for c in cells if c != ".") in (["2", "2"], ["2", "4"], ["4", "4"])
    assert "up, down, left and right" in pool.instructions


def test_oracle_reaches_target_and_random_rarely_does():
    rng = random.Random(0)
    pool = agentgym.EnvPool("game2048", 64, seed=2)
    pool.reset()
    assert play_to_end(pool, "oracle", rng).mean() >= 0.95
    pool.reset()
    assert play_to_end(pool, "random", rng).mean() < 0.3


def test_deterministic_in_task_and_seed():
    a, b = agentgym.EnvPool("game2048", 16, seed=7), agentgym.EnvPool("game2048", 16, seed=7)
    assert a.reset() == b.reset()
    moves = ["up", "left", "down", "right"]
    assert_pools_play_alike(a, b, lambda k, ids: [moves[(k + i) % 4] for i in ids], 20)
    # Same task, different seeds: same opening, the spawns then differ.
    c = agentgym.EnvPool("game2048", 2)
    first = c.reset(tasks=[5, 5], seeds=[1, 2])
    assert first[0] == first[1]
    seen = set()
    for _ in range(10):
        obs = c.step([0, 1], ["left", "left"])[0]
        seen.add(obs[0] != obs[1])
    assert True in seen
    e1, e2 = agentgym.make("game2048"), agentgym.make("game2048")
    assert e1.reset(seed=1) == e2.reset(seed=1)
    for m in moves * 5:
        assert e1.step(m)[:3] == e2.step(m)[:3]


def test_bad_input():
    assert_invalid_action_is_a_free_turn("game2048", "diagonal")
    with pytest.raises(ValueError, match="power of two"):
        agentgym.EnvPool("game2048", 1, target=100)


def test_gymnasium_check_env():
    env = agentgym.make("game2048")
    check_env(env.unwrapped, skip_render_check=True)
