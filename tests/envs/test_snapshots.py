"""Env snapshots through the Gymnasium views: a Python env that declares
``snapshot_safe`` (and a native env through ``NativeEnv``) restores to a state from which
the same actions give the same observations, rewards and end flags, any number of times;
an env that cannot snapshot says so with ``SnapshotUnsupportedError`` before any episode
starts."""

from __future__ import annotations

import random

import pytest

import agentgym
from agentgym.envs.base import BaseEnv
from agentgym.errors import SnapshotUnsupportedError

SAFE = ["office", "ecommerce_service", "project_planning", "code_debug", "babyai", "maze",
        "textcraft"]


def _action(env, rng: random.Random) -> str:
    base = env.unwrapped
    valid = base.valid_actions()
    if valid and rng.random() < 0.7:
        return rng.choice(valid)
    return base.oracle_action() or (valid[0] if valid else "look")


@pytest.mark.parametrize("env_id", SAFE)
def test_restore_replays_the_continuation(env_id):
    env = agentgym.make(env_id, max_turns=40)
    base = env.unwrapped
    assert base.supports_snapshots
    rng = random.Random(7)
    env.reset(seed=3, options={"task": 1})
    for _ in range(2):
        env.step(_action(env, rng))
    state = base.snapshot()
    actions, seen = [], []
    for _ in range(5):
        a = _action(env, rng)
        actions.append(a)
        obs, reward, terminated, truncated, _ = env.step(a)
        seen.append((obs, reward, terminated, truncated))
        if terminated or truncated:
            break
    for _ in range(2):  # a state restores any number of times
        base.restore(state)
        again = []
        for a in actions:
            obs, reward, terminated, truncated, _ = env.step(a)
            again.append((obs, reward, terminated, truncated))
        assert again == seen
    if hasattr(base, "release"):
        base.release(state)
    env.close()


def test_an_env_that_does_not_declare_snapshots_refuses_before_any_episode():
    class Counter(BaseEnv):
        def reset(self, task=None, seed=None):
            self.n = 0
            return "0"

        def step(self, action):
            self.n += 1
            return str(self.n), 0.0, False, {}

    assert not Counter.supports_snapshots()
    with pytest.raises(SnapshotUnsupportedError, match="snapshot_safe"):
        Counter().snapshot()

    class Declared(Counter):
        snapshot_safe = True

    env = Declared()
    env.reset()
    env.step("x")
    state = env.snapshot()
    env.step("x")
    env.restore(state)
    assert env.step("x")[0] == "2"


def test_simulators_and_remote_envs_cannot_snapshot():
    from agentgym.envs.sciworld import SciWorldEnv

    assert not SciWorldEnv.supports_snapshots()
    with pytest.raises(SnapshotUnsupportedError):
        SciWorldEnv.__new__(SciWorldEnv).snapshot()  # no JVM started
    from agentgym.serving.client import RemoteEnv

    assert RemoteEnv.supports_snapshots is False
    with pytest.raises(SnapshotUnsupportedError, match="server"):
        RemoteEnv.snapshot(RemoteEnv.__new__(RemoteEnv))
