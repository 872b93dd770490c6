"""Native TextCraft: determinism, parity with the pure-Python baseline, specs, oracle, Gymnasium."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import agentgym
from bench.baselines import textcraft_py

NUM_TASKS = 544
KINDS = ("Got ", "Crafted ", "Inventory: [", "Inventory: You", "Wrong item format: ",
         "Could not find enough items to craft ", "Could not find a valid recipe for ",
         "Could not execute ", "Could not find ")


def _scripted_actions(rng: random.Random, valid: list[str], n: int) -> list[str]:
    """A random mix of valid actions and the kinds of mistakes a model makes."""
    crafts = [a for a in valid if a.startswith("craft ")] or ["craft 1 stick using 2 oak planks"]
    out = []
    for _ in range(n):
        kind = rng.random()
        base = rng.choice(valid)
        if kind < 0.55:
            out.append(base)
        elif kind < 0.62:
            out.append(rng.choice(crafts).replace("craft ", "craft 1 ", 1).replace("  ", " "))
        elif kind < 0.68:  # wrong counts
            c = rng.choice(crafts)
            out.append(c.replace(" using 1 ", " using 2 ").replace("craft 4", "craft 8"))
        elif kind < 0.72:  # generic tag names / getting craftable items
            out.append(rng.choice(["get 1 planks", "get 2 stick", "get 4 oak planks",
                                   "craft 4 stick using 2 planks", "get 1 wool"]))
        elif kind < 0.78:  # malformed
            out.append(rng.choice(["craft stick", "craft 1 stick using planks", "get oak logs",
                                   "Get 1 oak logs", "look", "", "inventory now", "craft using",
                                   "craft  using 1 x", "get 1 ", "craft 1 a using 1 b,, 2 c",
                                   "get 007 oak logs", "get 99999999999999999999999 bone",
                                   "craft 1 x using 1 y\ncraft 2 z using 1 w", "inventory\nfoo"]))
        elif kind < 0.84:  # unknown outputs and recipe/ingredient mismatches
            c = rng.choice(crafts)
            out.append(rng.choice([c + ", 1 stick", c.replace("craft", "craft 1 unobtainium", 1),
                                   "craft 1 planks using 1 oak logs", c.upper()]))
        elif kind < 0.90:
            out.append(" " + base if rng.random() < 0.5 else base + " ")
        else:
            out.append("inventory")
    return out


def test_reset_deterministic_for_pool_and_make():
    a = agentgym.EnvPool("textcraft", 8, seed=3)
    b = agentgym.EnvPool("textcraft", 8, seed=3)
    assert a.reset() == b.reset()
    assert a.num_tasks == NUM_TASKS
    env1, env2 = agentgym.make("textcraft"), agentgym.make("textcraft")
    o1, i1 = env1.reset(seed=11)
    o2, i2 = env2.reset(seed=11)
    assert o1 == o2 and i1["task"] == i2["task"]
    assert env1.step("inventory")[0] == "Inventory: You are not carrying anything."


@pytest.mark.parametrize("sanitize", [True, False])
def test_parity_with_python_baseline_on_scripted_sequences(sanitize):
    rng = random.Random(1234)
    n_envs, n_steps = 200, 24
    pool = agentgym.EnvPool("textcraft", n_envs, sanitize_actions=sanitize)
    tasks = [rng.randrange(2 * NUM_TASKS) for _ in range(n_envs)]
    seeds = [rng.randrange(2**64) for _ in range(n_envs)]
    obs = pool.reset(tasks=tasks, seeds=seeds)
    py = [textcraft_py.make(sanitize_actions=sanitize) for _ in range(n_envs)]
    for i, env in enumerate(py):
        assert env.reset(tasks[i], seeds[i]) == obs[i]
        assert env.valid_actions() == pool.valid_actions(i)
    scripts = [_scripted_actions(rng, pool.valid_actions(i), n_steps) for i in range(n_envs)]
    live = list(range(n_envs))
    kinds = set()
    for t in range(n_steps):
        if not live:
            break
        out, rewards, terminated, _ = pool.step(live, [scripts[i][t] for i in live])
        still = []
        for k, i in enumerate(live):
            want = py[i].step(scripts[i][t])
            got = (out[k], float(rewards[k]), bool(terminated[k]))
            assert got == want, (tasks[i], seeds[i], scripts[i][: t + 1])
            kinds.update(k for k in KINDS if want[0].startswith(k))
            if not terminated[k]:
                assert pool.valid_actions(i) == py[i].valid_actions()
                still.append(i)
        live = still
    assert kinds == set(KINDS)


def test_explicit_specs_match_baseline_and_reject_bad_ones():
    pool = agentgym.EnvPool("textcraft", 1)
    env = textcraft_py.make()
    (obs,) = pool.reset(tasks=[77], seeds=[5])
    specs = [
        obs,
        json.dumps({"goal": "stick", "commands": ["craft 4 stick using 2 planks"]}),
        json.dumps({"goal": "minecraft:wooden_pickaxe"}),
        json.dumps({"goal": "oak logs", "commands": "anything at all"}),
    ]
    for spec in specs:
        (got,) = pool.reset(tasks=[spec], seeds=[9])
        assert got == env.reset(spec, 9)
        assert pool.valid_actions(0) == env.valid_actions()
    assert pool.reset(tasks=[obs], seeds=[0]) == [obs]
    for bad in ["", "make a stick", "{", json.dumps({"goal": "unobtainium"}),
                json.dumps({"goal": "planks"}), json.dumps({"goal": "stick", "x": 1}),
                "Crafting commands:\nfoo\n\nGoal: craft nothing known."]:
        with pytest.raises(agentgym.InvalidTaskError, match="textcraft"):
            pool.reset(tasks=[bad], seeds=[0])
        with pytest.raises(textcraft_py.SpecError):
            env.reset(bad, 0)


def test_oracle_solves_all_tasks_in_a_pool():
    n = NUM_TASKS
    pool = agentgym.EnvPool("textcraft", n, max_turns=100)
    pool.reset(tasks=list(range(n)), seeds=list(range(n)))
    live = np.arange(n)
    solved = np.zeros(n, dtype=bool)
    while live.size:
        actions = pool.oracle_actions(live)
        assert all(a is not None for a in actions)
        _, rewards, terminated, truncated = pool.step(live, actions)
        solved[live[terminated]] = rewards[terminated] == 1.0
        live = live[~(terminated | truncated)]
    assert solved.mean() == 1.0
    assert max(pool.turns) <= 60


def test_gymnasium_check_env():
    env = agentgym.make("textcraft", max_turns=20)
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0, options={"task": 5})
    assert obs.endswith(".") and "Goal: craft" in obs
    for _ in range(30):
        action = env.unwrapped.oracle_action()
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    assert terminated and reward == 1.0


def test_sanitized_actions_like_agentgym_client():
    pool = agentgym.EnvPool("textcraft", 1)
    pool.reset(tasks=[0], seeds=[0])
    (obs,), *_ = pool.step([0], ["  Get 1 acacia_logs."])
    assert obs == "Could not execute Get 1 acacialogs"
    (obs,), *_ = pool.step([0], ["get 1 acacia logs."])
    assert obs == "Got 1 acacia logs"
    (obs,), *_ = pool.step([0], ["Look"])
    assert obs == "Inventory: [acacia logs] (1) "


def test_max_distractors_kwarg():
    none = agentgym.EnvPool("textcraft", 1, max_distractors=0)
    full = agentgym.EnvPool("textcraft", 1)
    (a,) = none.reset(tasks=[300], seeds=[1])
    (b,) = full.reset(tasks=[300], seeds=[1])
    assert a.count("\n") < b.count("\n")
    assert textcraft_py.make(max_distractors=0).reset(300, 1) == a
    with pytest.raises(ValueError, match="max_distractors"):
        agentgym.EnvPool("textcraft", 1, max_distractors="many")


_TOKENS = ["craft", "get", "using", "inventory", "1", "2", "4", "0", "10", "oak", "planks",
           "oak planks", "oak logs", "stick", "minecraft:stick", "wool", "white wool", "string",
           ",", " ", "  ", "\n", "'", '"', "\\", "x_y", "é", "\t"]


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2 * NUM_TASKS), st.integers(0, 2**64 - 1),
       st.lists(st.lists(st.sampled_from(_TOKENS), max_size=12), min_size=1, max_size=8),
       st.booleans())
def test_parity_on_fuzzed_actions(task, seed, actions, sanitize):
    pool = agentgym.EnvPool("textcraft", 1, sanitize_actions=sanitize)
    env = textcraft_py.make(sanitize_actions=sanitize)
    assert pool.reset(tasks=[task], seeds=[seed]) == [env.reset(task, seed)]
    for prefix in ([], ["get 8 string", "get 4 oak logs", "craft 4 oak planks using 1 oak logs"]):
        for words in [prefix] + [[" ".join(w)] for w in actions]:
            for action in words:
                (obs,), rewards, terminated, _ = pool.step([0], [action])
                assert (obs, float(rewards[0]), bool(terminated[0])) == env.step(action)
                if terminated[0]:
                    return
