"""``EnvPool.snapshot`` / ``restore`` / ``fork`` / ``release`` over the Rust pool: exact
replays on every native env, independent forks, and the named errors."""

import random

import pytest

import agentgym
from agentgym import _core
from agentgym.errors import (
    AgentGymError,
    EpisodeFinishedError,
    EpisodeNotStartedError,
    SnapshotUnsupportedError,
    UnknownSnapshotError,
)

NATIVE = [e for e in _core.native_env_ids() if not e.startswith("_")]


def _play(pool, slot, rng, steps):
    """Up to ``steps`` random valid actions on ``slot`` while it runs: the actions and what
    each step gave (observation, reward, terminated, truncated, episode record, refused)."""
    actions, outcomes = [], []
    for _ in range(steps):
        if not pool._pool.running([slot])[0]:
            break
        valid = pool.valid_actions(slot) or ["look"]
        action = rng.choice(valid + ["not an action"])
        actions.append(action)
        outcomes.append(_step(pool, slot, action))
    return actions, outcomes


def _step(pool, slot, action):
    obs, rew, term, trunc = pool.step([slot], [action])
    return (obs[0], float(rew[0]), bool(term[0]), bool(trunc[0]), pool.episode(slot),
            pool.invalid_turns([slot])[0])


@pytest.mark.parametrize("env_id", NATIVE)
def test_restore_replays_the_continuation_exactly(env_id):
    pool = agentgym.EnvPool(env_id, 3, seed=5, max_turns=30)
    assert pool.snapshots_supported
    pool.reset([0])
    rng = random.Random(env_id)
    _play(pool, 0, rng, 3)
    if not pool._pool.running([0])[0]:
        pool.reset([0])
    before = pool.episode(0)
    [handle] = pool.snapshot([0])
    assert pool.num_snapshots == 1 and pool.snapshot_bytes([handle])[0] > 0
    actions, want = _play(pool, 0, rng, 8)
    assert actions
    for slot in (0, 2):  # the same slot, and another one
        pool.restore([slot], [handle])
        assert pool.episode(slot) == before
        assert [_step(pool, slot, a) for a in actions] == want
    pool.release([handle])
    assert pool.num_snapshots == 0


def test_fork_children_start_equal_and_never_share_state():
    pool = agentgym.EnvPool("maze", 5, seed=1)
    pool.reset([2])
    pool.step([2], [pool.oracle_action(2)])
    source = (pool.episode(2), pool.valid_actions(2), pool.oracle_action(2))
    children = pool.fork(2, 3)
    assert children == [0, 1, 3]
    for c in children:
        assert (pool.episode(c), pool.valid_actions(c), pool.oracle_action(c)) == source
    # One child plays to the goal; the others (and the source) still see the fork's state.
    while pool._pool.running([0])[0]:
        pool.step([0], [pool.oracle_action(0)])
    assert pool.stop_reasons([0]) == ["done"]
    for c in (1, 2, 3):
        assert (pool.episode(c), pool.valid_actions(c), pool.oracle_action(c)) == source
    # Stepping two children with the same action gives the same step.
    a = pool.oracle_action(1)
    obs, rew, term, trunc = pool.step([1, 3], [a, a])
    assert obs[0] == obs[1] and rew[0] == rew[1] and term[0] == term[1]


def test_fork_targets_must_be_free():
    pool = agentgym.EnvPool("wordle", 4, seed=0)
    pool.reset([0, 1])
    with pytest.raises(ValueError, match="slot 1 holds a running episode"):
        pool.fork(0, [3, 1])
    assert pool.stop_reasons([3]) == [None] and pool.episode(3)["turns"] == 0
    with pytest.raises(ValueError, match="needs 3 free slots"):
        pool.fork(0, 3)
    with pytest.raises(ValueError):
        pool.fork(0, [0])
    with pytest.raises(IndexError):
        pool.fork(0, [9])
    assert pool.fork(0, [3, 2]) == [3, 2]
    assert pool.fork(1, []) == []


def test_snapshot_errors_are_named_and_change_nothing():
    unsupported = agentgym.EnvPool("_test_panic", 3)
    assert not unsupported.snapshots_supported
    unsupported.reset([0, 1])
    with pytest.raises(SnapshotUnsupportedError, match="_test_panic cannot snapshot"):
        unsupported.snapshot([0])
    with pytest.raises(SnapshotUnsupportedError):
        unsupported.fork(0, [2])
    # A fork from an episode that ended with env_error is refused by its state.
    unsupported.step([1], ["panic"])
    with pytest.raises(EpisodeFinishedError, match="env_error"):
        unsupported.fork(1, [2])

    pool = agentgym.EnvPool("maze", 3)
    with pytest.raises(EpisodeNotStartedError, match="not been reset"):
        pool.snapshot([0])
    pool.reset([0])
    with pytest.raises(IndexError):
        pool.snapshot([0, 7])
    with pytest.raises(ValueError):
        pool.snapshot([0, 0])
    assert pool.num_snapshots == 0
    [h] = pool.snapshot([0])
    with pytest.raises(UnknownSnapshotError, match=f"handle {h + 1}"):
        pool.restore([1], [h + 1])
    assert pool.stop_reasons([1]) == [None]
    with pytest.raises(ValueError, match="lengths must match"):
        pool.restore([0, 1], [h])
    with pytest.raises(ValueError):
        pool.release([h, h])
    pool.release([h])
    for call in (lambda: pool.restore([0], [h]), lambda: pool.release([h]),
                 lambda: pool.snapshot_bytes([h])):
        with pytest.raises(UnknownSnapshotError, match="released"):
            call()
    pool.finish([0], "timeout")
    with pytest.raises(EpisodeFinishedError, match=r"finished \(timeout\)"):
        pool.snapshot([0])


def test_snapshot_errors_are_exported():
    for name in ("SnapshotUnsupportedError", "UnknownSnapshotError"):
        cls = getattr(agentgym, name)
        assert cls is getattr(agentgym.errors, name) is getattr(_core, name)
        assert issubclass(cls, AgentGymError)


def test_many_slots_snapshot_and_restore_in_one_call():
    n = 600  # over the pool's parallel threshold
    pool = agentgym.EnvPool("game2048", n, seed=2)
    pool.reset()
    ids = list(range(n))
    handles = pool.snapshot(ids)
    assert len(set(handles)) == n
    first = pool.step(ids, ["left"] * n)[0]
    pool.restore(ids, handles)
    assert pool.step(ids, ["left"] * n)[0] == first
    pool.restore(ids[::-1], handles)  # slot i gets slot n-1-i's state
    assert pool.step(ids, ["left"] * n)[0] == first[::-1]
    pool.release(handles)
