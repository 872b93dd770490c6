"""The ``code_debug`` env: task set, actions, rewards, oracle, registry and Gymnasium API."""

from __future__ import annotations

import random

import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
from agentgym.envs.code_debug import (
    NUM_HIDDEN,
    NUM_VISIBLE,
    VARIANTS,
    CodeDebugEnv,
    _outcomes,
    make_task,
    run_tests,
    split_sites,
    task_counts,
)
from agentgym.errors import EpisodeFinishedError, InvalidTaskError

pytestmark = pytest.mark.timeout(120)


def test_splits_are_disjoint_and_sized():
    counts = task_counts()
    assert counts == {"train": 462, "test": 114, "all": 576}
    train, test = set(split_sites("train")), set(split_sites("test"))
    assert not train & test and len(train | test) == len(split_sites("all"))
    assert CodeDebugEnv("test").num_tasks == 114
    with pytest.raises(ValueError):
        CodeDebugEnv("dev")


def test_every_task_has_a_visible_failing_test_and_a_correct_fix():
    families, kinds = set(), set()
    for site in split_sites("all"):
        for variant in range(VARIANTS):
            t = make_task(site, variant)
            families.add(t.family)
            kinds.add(t.bug_kind)
            assert len(t.visible) == NUM_VISIBLE and len(t.hidden) == NUM_HIDDEN
            assert t.buggy[t.bug_line - 1] != t.fixed[t.bug_line - 1]
            assert len(t.buggy) == len(t.fixed)
            cases = t.visible + t.hidden
            assert len({repr(a) for a, _ in cases}) == len(cases)
            fixed = _outcomes(t.fixed, t.name, [a for a, _ in cases])
            assert [v for _, v in fixed] == [e for _, e in cases]
            buggy = _outcomes(t.buggy, t.name, [a for a, _ in t.visible])
            assert any(b != ("ok", e) for b, (_, e) in zip(buggy, t.visible, strict=True))
    assert {"arithmetic", "string", "list", "recursion", "dict", "search", "sort"} <= families
    assert {"off_by_one", "wrong_operator", "wrong_comparison", "missing_base_case",
            "initial_value"} <= kinds


def test_reset_is_deterministic_and_tasks_differ():
    a, b = CodeDebugEnv(), CodeDebugEnv()
    assert a.reset(task=7, seed=1) == b.reset(task=7, seed=2)
    assert a.reset(task=7) != a.reset(task=8)
    assert a.reset(seed=5) == b.reset(seed=5)
    with pytest.raises(InvalidTaskError):
        a.reset(task=10_000)
    with pytest.raises(InvalidTaskError):
        a.reset(task="seven")


def test_submitting_the_buggy_code_scores_the_fraction_of_tests_passed():
    env = CodeDebugEnv()
    env.reset(task=0)
    t = env.task
    cases = t.visible + t.hidden
    expected = sum(o == ("ok", e) for o, (_, e) in
                   zip(_outcomes(t.buggy, t.name, [a for a, _ in cases]), cases, strict=True))
    obs, reward, done, info = env.step("submit")
    assert done and info["passed"] == expected and info["total"] == len(cases)
    assert reward == pytest.approx(expected / len(cases)) and reward < 1.0
    with pytest.raises(EpisodeFinishedError):
        env.step("view")


def test_fixing_the_bug_line_scores_one():
    env = CodeDebugEnv()
    env.reset(task=3)
    k = env.task.bug_line
    obs, reward, done, _ = env.step(f"replace {k} {env.task.fixed[k - 1].lstrip()}")
    assert not done and "Replaced lines" in obs
    assert env.code == env.task.fixed  # indentation of line k was kept
    obs, _, _, info = env.step("run_tests")
    assert f"{NUM_VISIBLE}/{NUM_VISIBLE} visible tests passed" in obs
    _, reward, done, info = env.step("submit")
    assert done and reward == 1.0 and info["solved"]


def test_range_replace_delete_and_bad_actions():
    env = CodeDebugEnv()
    env.reset(task=0)
    n = len(env.code)
    body = "\n".join(env.task.fixed)
    obs, _, _, _ = env.step(f"replace 1-{n}\n{body}")
    assert env.code == env.task.fixed
    env.step("replace 2-2")  # delete the docstring line
    assert len(env.code) == n - 1
    for bad in ("replace 0 x", f"replace 3-{n + 5} x", "replace x y", "dance"):
        obs, reward, done, info = env.step(bad)
        assert info.get("invalid") and not done and reward == 0.0
    obs, _, _, _ = env.step("view")
    assert obs.splitlines()[0].startswith("  1 | def ")


def test_syntax_errors_and_escapes_are_reported_not_raised():
    env = CodeDebugEnv()
    env.reset(task=0)
    env.step("replace 3 total = (")
    obs, _, _, _ = env.step("run_tests")
    assert "Error while loading the code: SyntaxError" in obs
    env.step("replace 3 import os; os.system('echo pwned')")
    obs, _, _, _ = env.step("run_tests")
    assert "pwned" not in obs and "not allowed" in obs
    _, reward, done, _ = env.step("submit")
    assert done and reward == 0.0


def test_expected_values_never_enter_the_sandbox():
    secret = 918273645
    rep = run_tests(
        "def f(x):\n    import os\n    return open('cases.txt').read()\n",
        "f", [((1,), secret)],
    )
    assert rep["passed"] == [False]
    assert str(secret) not in rep["messages"][0].split("got")[1]


def test_penalties_are_optional():
    env = CodeDebugEnv(step_penalty=0.01, invalid_penalty=0.1)
    env.reset(task=0)
    assert env.step("view")[1] == -0.01
    assert env.step("nonsense")[1] == -0.1


@pytest.mark.slow
def test_oracle_solves_tasks_from_both_splits():
    for split, n in (("train", 30), ("test", 20)):
        env = CodeDebugEnv(split)
        for task in random.Random(0).sample(range(env.num_tasks), n):
            env.reset(task=task)
            reward, done, steps = 0.0, False, 0
            while not done:
                _, reward, done, _ = env.step(env.oracle_action())
                steps += 1
            assert reward == 1.0 and steps == 2, (split, task)


def test_random_policy_rarely_solves():
    env = CodeDebugEnv()
    rng = random.Random(0)
    solved = 0
    for task in range(12):
        env.reset(task=task)
        done, info = False, {}
        for _ in range(4):
            _, _, done, info = env.step(rng.choice(env.valid_actions()))
            if done:
                break
        solved += bool(info.get("solved"))
    assert solved == 0


def test_make_and_gymnasium_checker():
    env = agentgym.make("code_debug", split="test", max_turns=3)
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=1, options={"task": 2})
    assert "Fix the bug" in obs and info["task"] == 2
    assert "replace <n> <code>" in env.unwrapped.instructions
    _, _, term, trunc, _ = env.step("view")
    assert not term and not trunc
