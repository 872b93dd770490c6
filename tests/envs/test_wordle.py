"""The native ``wordle`` env: feedback rules, determinism, parity with the pure-Python
baseline, oracle vs random policy, Gymnasium conformance."""

from __future__ import annotations

import random

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
from bench.baselines import wordle_py
from tests.helpers import assert_steps_match_reference, play_to_end

KWARGS = [
    {},
    {"max_guesses": 3, "split": "test"},
    {"valid_actions": "consistent", "num_valid_actions": 50, "split": "train"},
]
EXTRA_ACTIONS = ["dance", "xyzzq", "Guess: CRATE.", "guess", "crâne", "GUESS  slate", "", "crane"]




@pytest.mark.parametrize(
    "guess,answer,marks",
    [
        ("crane", "crane", "GGGGG"),
        ("crane", "trace", "YGGBG"),
        ("geese", "those", "BBBGG"),
        ("speed", "abide", "BBYBY"),
        ("eerie", "theme", "YBBBG"),
        ("error", "robot", "BYBGB"),
        ("sassy", "assay", "YYGBG"),
        ("mamma", "maxim", "GGYBB"),
    ],
)
def test_feedback_duplicate_letters(guess, answer, marks):
    assert wordle_py.feedback(guess, answer) == marks
    if answer not in wordle_py.ALLOWED:
        pytest.skip(f"{answer} is not in the word list")
    pool = agentgym.EnvPool("wordle", 1)
    pool.reset(tasks=[answer])
    obs = pool.step([0], [f"guess {guess}"])[0][0]
    if guess in wordle_py.ALLOWED:
        shown = " ".join(f"{c}={m}" for c, m in zip(guess, marks, strict=True))
        assert f"{guess} -> {shown}." in obs
    else:
        assert obs.startswith("Not in the word list")


@pytest.mark.parametrize("kwargs", KWARGS)
def test_parity_with_python_baseline(kwargs):
    pool = agentgym.EnvPool("wordle", 1, **kwargs)
    py = wordle_py.make(**kwargs)
    assert pool.num_tasks == py.stop - py.start
    rng = random.Random(0)
    # The pure-Python consistent-candidate scan is slow; fewer tasks keep the test quick.
    for task in range(25 if kwargs.get("valid_actions") == "consistent" else 150):
        seed = rng.getrandbits(64)
        assert pool.reset(tasks=[task], seeds=[seed])[0] == py.reset(task, seed)
        assert_steps_match_reference(pool, py, rng, 12, EXTRA_ACTIONS)


def test_pool_and_make_are_deterministic():
    a, b = agentgym.EnvPool("wordle", 16, seed=3), agentgym.EnvPool("wordle", 16, seed=3)
    assert a.reset() == b.reset()
    assert [a.valid_actions(i) for i in range(16)] == [b.valid_actions(i) for i in range(16)]
    for _ in range(6):
        acts = a.oracle_actions(range(16))
        assert acts == b.oracle_actions(range(16))
        ids = [i for i, s in enumerate(a.stop_reasons()) if s is None]
        if not ids:
            break
        out_a = a.step(ids, [acts[i] for i in ids])
        out_b = b.step(ids, [acts[i] for i in ids])
        assert out_a[0] == out_b[0]
        np.testing.assert_array_equal(out_a[2], out_b[2])
    e1, e2 = agentgym.make("wordle"), agentgym.make("wordle")
    assert e1.reset(seed=9) == e2.reset(seed=9)
    assert e1.unwrapped.valid_actions() == e2.unwrapped.valid_actions()
    assert e1.step("guess crate")[:3] == e2.step("guess crate")[:3]


def test_invalid_words_do_not_use_a_guess():
    pool = agentgym.EnvPool("wordle", 1, max_guesses=2)
    pool.reset(tasks=["trace"])
    for bad in ["xyzzq", "hello world", "guess abcdef"]:
        obs, r, term, _ = pool.step([0], [bad])
        assert not term[0] and r[0] == 0 and obs[0].endswith("2 left.")
    obs, r, term, _ = pool.step([0], ["guess crane"])
    assert obs[0] == "Guess 1/2: crane -> c=Y r=G a=G n=B e=G. 1 left."
    obs, r, term, _ = pool.step([0], ["trace"])
    assert obs[0].endswith("Solved!") and r[0] == 1.0 and term[0]


def test_oracle_solves_nearly_all_and_random_rarely():
    rng = random.Random(0)
    n = agentgym.EnvPool("wordle", 1).num_tasks
    pool = agentgym.EnvPool("wordle", 512)
    pool.reset(tasks=list(range(0, n, 4))[:512])
    assert play_to_end(pool, "oracle", rng).mean() >= 0.98
    pool.reset()
    assert play_to_end(pool, "random", rng).mean() < 0.05


def test_bad_input_is_a_named_error():
    pool = agentgym.EnvPool("wordle", 1)
    with pytest.raises(agentgym.InvalidTaskError):
        pool.reset(tasks=["zzzzz"])
    with pytest.raises(ValueError, match="max_guesses"):
        agentgym.EnvPool("wordle", 1, max_guesses=0)


def test_gymnasium_check_env():
    env = agentgym.make("wordle")
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert obs.startswith("Guess the secret five-letter word.") and info["task"] < env.num_tasks
