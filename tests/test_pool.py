"""agentgym.EnvPool over the Rust episode pool: batching, horizon, errors, isolation, scale."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import agentgym
from agentgym.errors import EnvError, InvalidTaskError
from agentgym.pool import episode_seed, episode_seeds
from tests.helpers import BAD_TEXTCRAFT

NATIVE = ["textcraft", "maze", "wordle"]


def test_reset_and_step_shapes_and_types():
    pool = agentgym.EnvPool("_test_panic", 5, seed=3)
    obs = pool.reset()
    assert len(obs) == 5 and all(isinstance(o, str) for o in obs)
    out, rew, term, trunc = pool.step([4, 0, 2], ["noop", "stop", "noop"])
    assert out == ["step 1 noop", "step 1 stop", "step 1 noop"]
    assert rew.dtype == np.float32 and rew.tolist() == [1.0, 1.0, 1.0]
    assert term.dtype == np.bool_ and term.tolist() == [False, True, False]
    assert trunc.tolist() == [False, False, False]
    assert pool.turns.tolist() == [1, 0, 1, 0, 1]
    assert pool.stop_reasons() == ["done", None, None, None, None]


def test_default_tasks_and_seeds_are_reproducible_and_distinct():
    a = agentgym.EnvPool("_test_panic", 4, seed=11)
    b = agentgym.EnvPool("_test_panic", 4, seed=11)
    c = agentgym.EnvPool("_test_panic", 4, seed=12)
    first = a.reset()
    assert first == b.reset()
    assert first != c.reset()
    assert len(set(first)) == 4  # each slot its own task and seed
    second = a.reset()  # the next episode of each slot plays another task
    assert all(x != y for x, y in zip(first, second))
    assert a.episode(1)["task"] == 1 + 4


def test_episode_seeds_mix_every_input():
    ids = np.arange(3)
    base = episode_seeds(0, ids, np.zeros(3, np.uint64))
    assert len(set(base.tolist())) == 3
    assert (episode_seeds(1, ids, np.zeros(3, np.uint64)) != base).all()
    assert (episode_seeds(0, ids, np.ones(3, np.uint64)) != base).all()


def test_explicit_tasks_seeds_and_horizon():
    pool = agentgym.EnvPool("_test_panic", 3, max_turns=5)
    obs = pool.reset([0, 2], tasks=[7, "custom"], seeds=[1, 2], max_turns=[1, None])
    assert obs == ["reset task=Index(7) seed=1", 'reset task=Spec("custom") seed=2']
    _, _, term, trunc = pool.step([0, 2], ["noop", "noop"])
    assert trunc.tolist() == [True, False] and not term.any()
    assert pool.stop_reasons()[0] == "horizon"
    assert pool.episode(2)["max_turns"] is None
    pool.reset([1])
    assert pool.episode(1)["max_turns"] == 5


def test_errors_are_named_and_leave_no_side_effects():
    pool = agentgym.EnvPool("_test_panic", 3)
    with pytest.raises(agentgym.EpisodeNotStartedError):
        pool.step([0], ["noop"])
    pool.reset()
    with pytest.raises(IndexError, match="out of range"):
        pool.step([0, 3], ["noop", "noop"])
    with pytest.raises(IndexError):
        pool.reset([-1])
    with pytest.raises(ValueError, match="more than once"):
        pool.step([1, 1], ["noop", "noop"])
    with pytest.raises(ValueError, match="actions"):
        pool.step([0, 1], ["noop"])
    with pytest.raises(TypeError):
        pool.step([0], [3])
    with pytest.raises(TypeError):
        pool.step([0], "noop")  # a str is not a list of actions
    assert pool.turns.tolist() == [0, 0, 0]
    pool.step([2], ["stop"])
    with pytest.raises(agentgym.EpisodeFinishedError, match="done"):
        pool.step([2], ["noop"])
    with pytest.raises(ValueError, match="stop reason"):
        pool.finish([0], "exploded")


def test_constructor_errors():
    with pytest.raises(agentgym.UnknownEnvError, match="textcraft"):
        agentgym.EnvPool("no-such-env", 2)
    with pytest.raises(ValueError, match="unexpected keyword"):
        agentgym.EnvPool("_test_panic", 2, colour="red")
    with pytest.raises(ValueError, match="at least 1"):
        agentgym.EnvPool("_test_panic", 0)
    with pytest.raises(TypeError):
        agentgym.EnvPool("_test_panic", 2, bad=object())  # not JSON-serialisable


def test_panicking_env_ends_only_its_episode():
    pool = agentgym.EnvPool("_test_panic", 300)
    pool.reset()
    ids = list(range(300))
    actions = ["panic" if i in (5, 250) else "noop" for i in ids]
    obs, rew, term, trunc = pool.step(ids, actions)
    reasons = pool.stop_reasons()
    for i in ids:
        if i in (5, 250):
            assert obs[i].startswith("Environment error") and trunc[i] and not term[i]
            assert reasons[i] == "env_error" and rew[i] == 0.0
        else:
            assert obs[i] == "step 1 noop" and reasons[i] is None
    pool.reset([5])
    assert pool.step([5], ["noop"])[0] == ["step 1 noop"]


def test_finish_records_external_stop_reason():
    pool = agentgym.EnvPool("_test_panic", 2)
    pool.reset()
    pool.finish([1], "timeout")
    assert pool.stop_reasons() == [None, "timeout"]
    with pytest.raises(agentgym.EpisodeFinishedError, match="timeout"):
        pool.step([1], ["noop"])


@pytest.mark.parametrize("env_id", NATIVE)
def test_native_pool_is_deterministic(env_id):
    def run():
        pool = agentgym.EnvPool(env_id, 16, seed=5, max_turns=6)
        trace = [pool.reset()]
        live = list(range(16))
        for t in range(6):
            acts = [pool.valid_actions(i)[t % len(pool.valid_actions(i))] for i in live]
            obs, rew, term, trunc = pool.step(live, acts)
            trace.append((obs, rew.tolist(), term.tolist(), trunc.tolist()))
            live = [i for i, d in zip(live, term | trunc) if not d]
            if not live:
                break
        return trace

    assert run() == run()


@pytest.mark.parametrize("env_id", NATIVE)
def test_hundred_thousand_episodes_reset_and_step(env_id):
    n, steps = 100_000, 4
    pool = agentgym.EnvPool(env_id, n, seed=1)
    obs = pool.reset()
    assert len(obs) == n and all(obs[i] for i in (0, n // 2, n - 1))
    rows = sorted({0, 1, 2, n // 3, n // 2, n - 2, n - 1,
                   *np.random.default_rng(0).integers(0, n, 9).tolist()})
    default = pool.valid_actions(0)[0]
    live = np.arange(n)
    seen = {r: [obs[r]] for r in rows}  # each sampled row: observations, rewards, flags
    actions = {r: [] for r in rows}
    for k in range(steps):
        acts = [default] * len(live)
        pos = {int(i): j for j, i in enumerate(live)}
        for r in rows:
            if r in pos:  # a row-specific action, so that rows differ in what they play
                valid = pool.valid_actions(r)
                acts[pos[r]] = valid[(r + k) % len(valid)]
                actions[r].append(acts[pos[r]])
        out, rew, term, trunc = pool.step(live, acts)
        assert len(out) == len(live) and rew.shape == term.shape == trunc.shape == (len(live),)
        for r in rows:
            if r in pos:
                j = pos[r]
                seen[r].append((out[j], float(rew[j]), bool(term[j]), bool(trunc[j])))
        live = live[~(term | trunc)]
    assert pool.turns.sum() > n  # most episodes are still running after the first step
    # Each sampled row is the episode a one-slot pool plays from the same task and seed.
    counters = np.zeros(len(rows), np.uint64)
    seeds = episode_seeds(1, np.array(rows), counters).tolist()
    for r, seed in zip(rows, seeds):
        assert pool.episode(r)["task"] == r and pool.episode(r)["seed"] == seed
        one = agentgym.EnvPool(env_id, 1)
        want = [one.reset([0], tasks=[r], seeds=[seed])[0]]
        for action in actions[r]:
            o, rw, te, tr = one.step([0], [action])
            want.append((o[0], float(rw[0]), bool(te[0]), bool(tr[0])))
        assert seen[r] == want, f"row {r}"


def test_stop_reasons_of_selected_slots():
    pool = agentgym.EnvPool("_test_panic", 4, max_turns=1)
    pool.reset()
    pool.step([0, 2], ["stop", "noop"])
    assert pool.stop_reasons([2, 0, 1]) == ["horizon", "done", None]
    with pytest.raises(IndexError):
        pool.stop_reasons([4])


def test_step_and_reset_take_lists_arrays_and_iterables():
    pool = agentgym.EnvPool("_test_panic", 6)
    pool.reset()
    obs, *_ = pool.step(np.array([0, 1], dtype=np.uint8), ["noop", "noop"])
    assert obs == ["step 1 noop"] * 2
    assert pool.step((i for i in (2, 3)), ("noop", "noop"))[0] == ["step 1 noop"] * 2
    assert pool.step(range(4, 6), ["noop", "stop"])[0] == ["step 1 noop", "step 1 stop"]
    with pytest.raises(IndexError, match="out of range"):
        pool.step(np.array([-1]), ["noop"])
    with pytest.raises(TypeError):
        pool.step([0.5], ["noop"])
    # List seeds and horizons go through int() in the core, as the Python loop did.
    pool.reset([0, 1], tasks=[0, 1], seeds=[7.9, "8"], max_turns=[None, 3.0])
    assert (pool.episode(0)["seed"], pool.episode(1)["seed"]) == (7, 8)
    assert (pool.episode(0)["max_turns"], pool.episode(1)["max_turns"]) == (None, 3)
    with pytest.raises(OverflowError):
        pool.reset([0], tasks=[0], seeds=[-1])
    with pytest.raises(ValueError):
        pool.reset([0], tasks=[0], seeds=[1], max_turns=["x"])


# Reset failures: a refused task or a panicking reset fails only its own row.
def test_pool_reset_reports_each_failed_row():
    pool = agentgym.EnvPool("textcraft", 4)
    obs, failed = pool.reset(tasks=[0, BAD_TEXTCRAFT, 2, 3], seeds=[0] * 4, errors="return")
    assert [row for row, _ in failed] == [1]
    assert isinstance(failed[0][1], InvalidTaskError) and "textcraft" in str(failed[0][1])
    assert obs[1] == "" and all(obs[i] for i in (0, 2, 3))
    assert pool.stop_reasons() == [None, "env_error", None, None]
    _, _, term, trunc = pool.step([0, 2, 3], ["inventory"] * 3)
    assert not (term | trunc).any()
    # The raising form (the default): the same batch runs, then the refusal is raised.
    pool = agentgym.EnvPool("textcraft", 4)
    with pytest.raises(InvalidTaskError):
        pool.reset(tasks=[0, BAD_TEXTCRAFT, 2, 3], seeds=[0] * 4)
    assert pool.stop_reasons() == [None, "env_error", None, None]
    with pytest.raises(ValueError, match="errors must be"):
        pool.reset(errors="ignore")


def test_pool_reset_panic_is_a_row_error_and_not_raised():
    pool = agentgym.EnvPool("_test_panic", 3)
    obs, failed = pool.reset(tasks=[0, "panic", 2], seeds=[1] * 3, errors="return")
    assert [row for row, _ in failed] == [1]
    assert isinstance(failed[0][1], EnvError) and "panic on reset" in str(failed[0][1])
    assert obs[1].startswith("Environment error: ") and obs[0] == "reset task=Index(0) seed=1"
    # Raising form: a panic ends its episode, as in a step, and raises nothing.
    obs = pool.reset(tasks=[0, "panic", 2], seeds=[1] * 3)
    assert obs[1].startswith("Environment error: ")
    assert pool.stop_reasons() == [None, "env_error", None]
    assert pool.step([0, 2], ["noop", "noop"])[0] == ["step 1 noop"] * 2


def test_pool_env_construction_failure_is_a_named_error():
    with pytest.raises(ValueError, match="construction failed"):
        agentgym.EnvPool("_test_panic", 2, fail_make=True)


@given(st.integers(0, 2**64 - 1), st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=8),
       st.integers(0, 2**32))
def test_scalar_episode_seed_equals_the_vectorised_one(seed, ids, counter):
    want = episode_seeds(seed, np.array(ids, np.uint64),
                         np.full(len(ids), counter, np.uint64)).tolist()
    assert [episode_seed(seed, i, counter) for i in ids] == want
