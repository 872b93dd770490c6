"""ScienceWorld env: task table, reset/step, rewards, gold-path oracle, worker JVM cleanup.

Tests that start a JVM are few and marked ``slow``; they share one simulator.
"""

from __future__ import annotations

import shutil

import pytest

from agentgym.envs.sciworld import AGENTGYM_EXCLUDED, TASKS, SciWorldEnv
from agentgym.errors import EnvError, InvalidTaskError
from tests.helpers import process_gone


def jvm(test):
    """Mark a test that starts ScienceWorld's JVM: slow, long timeout, skipped without Java."""
    for mark in (
        pytest.mark.slow,
        pytest.mark.timeout(300),
        pytest.mark.skipif(shutil.which("java") is None, reason="ScienceWorld needs Java"),
    ):
        test = mark(test)
    return test


def test_task_index_maps_over_splits_without_a_jvm():
    env = SciWorldEnv(split="test", tasks=["find-living-thing", "chemistry-mix"])
    assert env.num_tasks == 75 + 8
    assert env.task_of(0) == ("find-living-thing", 225)
    assert env.task_of(74) == ("find-living-thing", 299)
    assert env.task_of(75) == ("chemistry-mix", 24)
    assert env.task_of("boil:3") == ("boil", 3)
    assert env.task_of("4-1:7") == ("find-living-thing", 7)
    assert SciWorldEnv(split="train", tasks="1-1").num_tasks == 14
    assert SciWorldEnv().num_tasks == sum(t[2] for t in TASKS) == 7207
    # AgentGym's agentenv-sciworld: all variations of 23 families, in task-id order
    agentgym_env = SciWorldEnv(tasks="agentgym")
    assert len(agentgym_env.families) == 30 - len(AGENTGYM_EXCLUDED) == 23
    assert agentgym_env.task_of(30) == ("melt", 0)
    for bad in (-1, 83, "boil:30", "no-such-task:1", "boil", 2.0):
        with pytest.raises(InvalidTaskError):
            env.task_of(bad)
    with pytest.raises(InvalidTaskError):
        SciWorldEnv(tasks=["no-such-task"])
    with pytest.raises(ValueError):
        SciWorldEnv(split="validation")
    with pytest.raises(EnvError):
        env.step("look around")  # before reset: no JVM is started for this
    assert env._sw is None


@pytest.fixture(scope="module")
def sim():
    pytest.importorskip("scienceworld")
    env = SciWorldEnv(split="test", tasks=["find-living-thing", "chemistry-mix"])
    yield env
    env.close()


@jvm
def test_split_table_matches_the_simulator(sim):
    server = sim.simulator
    for task_id, name, n, _, _ in TASKS:
        assert server.get_max_variations(name) == n, task_id
    for name in ("boil", "use-thermometer", "identify-life-stages-2"):
        server.load(name, 0, "")
        n, n_train, n_dev = next(t[2:] for t in TASKS if t[1] == name)
        assert server.get_variations_train() == list(range(n_train))
        assert server.get_variations_dev() == list(range(n_train, n_train + n_dev))
        assert server.get_variations_test() == list(range(n_train + n_dev, n))


@jvm
def test_reset_step_valid_actions_and_determinism(sim):
    obs = sim.reset(0)
    assert obs.startswith("Your task is to find a(n) living thing.")
    assert "This room is called the" in obs
    actions = sim.valid_actions()
    assert 0 < len(actions) <= sim.max_valid_actions and actions[0] == "look around"
    assert any(a.startswith("focus on") for a in actions)
    opens = [a for a in actions if a.startswith("open door")]
    trace = [sim.step(a)[:3] for a in ["look around", *opens[:2], "inventory"]]
    assert sim.reset(0) == obs
    assert [sim.step(a)[:3] for a in ["look around", *opens[:2], "inventory"]] == trace
    assert sim.jvm_start_s is not None and sim.jvm_start_s > 0


@jvm
def test_wrong_focus_fails_the_task_with_zero_return(sim):
    sim.reset(0)
    total = 0.0
    for action in ("look around", "focus on air"):  # air is in every room, and not alive
        _, reward, done, info = sim.step(action)
        total += reward
    assert done and info["score"] < 0 and not info["success"]
    assert total == pytest.approx(0.0)
    assert sim.valid_actions() == [] and sim.oracle_action() is None


@jvm
@pytest.mark.parametrize("task", [3, 76])  # find-living-thing and chemistry-mix
def test_gold_sequence_reaches_success(sim, task):
    sim.reset(task)
    total, done, steps = 0.0, False, 0
    while not done:
        action = sim.oracle_action()
        assert action is not None, f"gold path ended early after {steps} steps"
        _, reward, done, info = sim.step(action)
        total += reward
        steps += 1
    assert info["success"] and info["score"] == 100
    assert total == pytest.approx(1.0)


@jvm
def test_oracle_stops_when_the_agent_leaves_the_gold_path(sim):
    sim.reset(5)
    first = sim.oracle_action()
    assert first is not None
    sim.step("inventory" if first != "inventory" else "look around")
    assert sim.oracle_action() is None


@jvm
async def test_worker_pool_hosts_jvms_and_closes_them():
    pytest.importorskip("scienceworld")
    from agentgym.envs.simulators import register_all
    from agentgym.runtime.workers import ProcessEnvPool

    register_all()
    async with ProcessEnvPool(
        "sciworld", 1, 1, tasks=["find-living-thing"], split="dev", timeout_s=240
    ) as pool:
        results = await pool.reset_many([0], [1], [0])
        assert all(obs.startswith("Your task is") for obs, _ in results)
        obs, reward, done, trunc, info = await pool.step(0, "look around")
        assert "This room is called" in obs and not done and info["moves"] >= 0
        (worker,) = await pool.worker_info()
        jvms = worker["children"]
        assert len(jvms) == 1  # the env instance's JVM, a child of the worker
    for pid in [worker["pid"], *jvms]:
        assert process_gone(pid, wait_s=20.0)
