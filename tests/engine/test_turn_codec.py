"""``_core.TurnCodec``: the engine's per-turn Rust call (decode, parse, env step, templated
observation tokens, trajectory appends). Its tokenization must equal the Python tokenizer's,
and a turn must be recorded the same whether the codec steps a native env or a driver
hands it the step results."""

import gc

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentgym
from agentgym import _core
from agentgym.backends.scripted import ScriptedBackend
from agentgym.data import PackedBatch
from agentgym.engine import RolloutEngine
from agentgym.engine.chat import ChatFormatter
from agentgym.engine.drivers import StepOutcome
from agentgym.engine.orchestrator import Turn
from agentgym.errors import TrajectoryError


@pytest.fixture(scope="module")
def fmt(tiny_model_dir):
    from transformers import AutoTokenizer

    return ChatFormatter(AutoTokenizer.from_pretrained(tiny_model_dir))


@pytest.fixture(scope="module")
def codec(fmt):
    return fmt.codec("react")


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_tokenization_equals_the_python_tokenizer(fmt, codec, text):
    ids = fmt.fast.encode(text, add_special_tokens=False).ids
    assert codec.encode(text) == ids
    assert codec.decode(ids) == fmt.fast.decode(ids, skip_special_tokens=True)
    wrapped = fmt.fast.encode(fmt.obs_prefix + text + fmt.obs_suffix,
                              add_special_tokens=False).ids
    assert codec.observation_ids([text]) == [wrapped]


def test_actions_are_decoded_and_parsed(fmt, codec):
    replies = [fmt.encode("Thought: go\nAction: move north") + [fmt.end_of_turn_id],
               fmt.encode("no action here"), []]
    assert codec.actions(replies) == ["move north", "", ""]
    assert codec.action_format == "react"
    with pytest.raises(ValueError, match="format"):
        _core.TurnCodec(fmt.fast.to_str(), "", "", fmt.end_of_turn_id, "nonsense")
    with pytest.raises(ValueError, match="vocabulary"):
        _core.TurnCodec(fmt.fast.to_str(), "", "", 10**9)


def _setup(fmt, n, env_id="maze", **kw):
    pool = agentgym.EnvPool(env_id, n, max_turns=3, **kw)
    obs = pool.reset()
    store = _core.TrajectoryStore()
    for k in range(n):
        store.begin(100 + k)
        store.append(100 + k, np.array(fmt.encode("hi"), np.uint32), False)
    return pool, store, obs


def test_panicking_env_and_full_context_end_only_their_episode(fmt, codec):
    pool, store, _ = _setup(fmt, 3, env_id="_test_panic")
    replies = [fmt.encode(f"Action: {a}") for a in ("noop", "panic", "noop")]
    contexts = [[] for _ in range(3)]
    turns = [Turn(100 + k, k, replies[k], None, False, contexts[k], None) for k in range(3)]
    stopped, errors = codec.step_turn_batch(pool._pool, store, turns, 10_000)
    assert [(i, _core.STOP_REASONS[c]) for i, c in stopped] == [(1, "env_error")]
    assert errors[0][0] == 1 and "asked to panic" in errors[0][1]
    # A context cap that leaves no room for the observation ends with "length".
    cap = store.num_tokens(102) + len(replies[2]) + 2
    last = Turn(102, 2, replies[2], None, False, [], None)
    stopped, _ = codec.step_turn_batch(pool._pool, store, [last], cap)
    assert [_core.STOP_REASONS[c] for _, c in stopped] == ["length"]
    assert last.context == replies[2] + [fmt.end_of_turn_id]


class _PoolAsPython(gym.Env):
    """A native env as a plain Gymnasium env (one pool slot, the episode seed passed through
    as is): the engine drives it with a ``PythonDriver`` and records its turns from step
    results."""

    env_id = "maze"

    def __init__(self):
        self.pool = agentgym.EnvPool(self.env_id, 1)
        self.instructions = self.pool.instructions

    def reset(self, *, seed=None, options=None):
        return self.pool.reset([0], tasks=[options["task"]], seeds=[seed])[0], {}

    def step(self, action):
        (obs,), rew, term, _ = self.pool.step([0], [action])
        return obs, float(rew[0]), bool(term[0]), False, {}

    def valid_actions(self):
        return self.pool.valid_actions(0)


@pytest.mark.parametrize("env_id", ["maze", "textcraft"])
def test_native_and_driver_stepped_turns_give_equal_trajectories(fmt, env_id):
    tok = fmt.tokenizer
    driven = f"test/{env_id}-as-python"
    agentgym.register(driven, type(driven, (_PoolAsPython,), {"env_id": env_id}), override=True)

    def run(run_env):
        eng = RolloutEngine(ScriptedBackend(tok, policy="random", seed=3), tok, max_turns=6,
                            max_total_tokens=900, max_concurrency=5)
        eng.reseed(0, run_id="same")  # the random policy is seeded by request id
        try:
            return eng.collect_sync(8, run_env)
        finally:
            eng.close()

    native, python = run(env_id), run(driven)
    assert [t.stop_reason for t in native] == [t.stop_reason for t in python]
    assert {t.stop_reason for t in native} >= {"horizon"}
    for a, b in zip(native, python):
        assert a.token_ids == b.token_ids and len(a.token_ids) > a.prompt_len
        assert a.loss_mask == b.loss_mask and a.logprobs == b.logprobs
        assert a.turn_rewards == b.turn_rewards and a.num_turns == b.num_turns
    gc.collect()


def test_record_turn_batch_records_a_driver_step_like_a_native_step(fmt, codec):
    pool, native_store, _ = _setup(fmt, 4)
    _, driven_store, _ = _setup(fmt, 4)
    replies, (obs, rew, term, trunc) = _twin_replies(fmt, 4)
    replies[1] = replies[1][:-1]  # cut before its end-of-turn token
    head = fmt.encode("hi")
    a = [Turn(100 + k, k, replies[k], None, k != 1, list(head), None) for k in range(4)]
    b = [Turn(100 + k, k, replies[k], None, k != 1, list(head), None) for k in range(4)]
    stepped = codec.step_turn_batch(pool._pool, native_store, a, 10_000)
    outcomes = [StepOutcome(obs[k], float(rew[k]), bool(term[k]), bool(trunc[k]),
                            ("done" if term[k] else "horizon") if (term | trunc)[k] else None)
                for k in range(4)]
    assert codec.record_turn_batch(driven_store, b, outcomes, 10_000) == stepped
    assert [t.context for t in a] == [t.context for t in b]
    for store in (native_store, driven_store):
        store.finish_batch(np.array([100, 101, 102, 103], np.uint64), "done")
    p, q = native_store.drain(), driven_store.drain()
    for field in ("token_ids", "loss_mask", "turn_rewards", "offsets"):
        assert p[field].tolist() == q[field].tolist()
    assert q["turn_rewards"].tolist() == rew.tolist()
    # Outcomes read by name: a wrong count, a bad stop reason or a missing field are errors.
    with pytest.raises(ValueError, match="step results"):
        codec.record_turn_batch(driven_store, b[:1], [], 10_000)
    with pytest.raises(ValueError, match="stop reason"):
        codec.record_turn_batch(driven_store, b[:1], [StepOutcome("x", 0.0, True, False,
                                                                  "finished")], 10_000)
    with pytest.raises(AttributeError):
        codec.record_turn_batch(driven_store, b[:1], [object()], 10_000)


def _twin_replies(fmt, n):
    """Oracle replies for a fresh maze pool of n episodes, and that pool's first step."""
    twin = agentgym.EnvPool("maze", n, max_turns=3)
    twin.reset()
    acts = [a or "" for a in twin.oracle_actions(range(n))]
    replies = [fmt.encode(f"Action: {a}") + [fmt.end_of_turn_id] for a in acts]
    return replies, twin.step(range(n), acts)


def test_step_turn_batch_extends_each_context_with_what_it_stores(fmt, codec):
    pool, store, _ = _setup(fmt, 4)
    replies, (obs, _, term, trunc) = _twin_replies(fmt, 4)
    replies[1] = replies[1][:-1]  # cut before its end-of-turn token
    head = fmt.encode("hi")
    contexts = [list(head) for _ in range(4)]
    turns = [Turn(100 + k, k, replies[k], [-0.5] * len(replies[k]) if k != 2 else None, k != 1,
                  contexts[k], "extra fields are ignored") for k in range(4)]
    stopped, errors = codec.step_turn_batch(pool._pool, store, turns, 10_000)
    assert errors == []
    assert [i for i, _ in stopped] == [k for k in range(4) if (term | trunc)[k]]
    assert all(_core.STOP_REASONS[c] in ("done", "horizon") for _, c in stopped)
    for k in range(4):
        expect = head + replies[k] + ([fmt.end_of_turn_id] if k == 1 else [])
        if not (term | trunc)[k]:
            expect += fmt.observation_ids([obs[k]])[0]
        assert contexts[k] == expect
    assert contexts[0][len(head)] is contexts[2][len(head)]  # shared int objects
    store.finish_batch(np.array([100, 101, 102, 103], np.uint64), "done")
    p = store.drain()
    for k in range(4):
        a, b = p["offsets"][k], p["offsets"][k + 1]
        assert p["token_ids"][a:b].tolist() == contexts[k]
        n = len(replies[k])
        lp = p["logprobs"][a + len(head):a + len(head) + n].tolist()
        assert lp == ([0.0] * n if k == 2 else [-0.5] * n)


def test_step_turn_batch_errors_are_named_and_change_nothing(fmt, codec):
    pool, store, _ = _setup(fmt, 2)
    r = fmt.encode("Action: move north")
    ctx = [1, 2]
    before = store.num_tokens(100)
    with pytest.raises(TypeError, match="tuple"):
        codec.step_turn_batch(pool._pool, store, [[100, 0, r, None, True, ctx]], 100)
    with pytest.raises(ValueError, match="6 items"):
        codec.step_turn_batch(pool._pool, store, [(100, 0, r, None, True)], 100)
    with pytest.raises(TypeError, match="context"):
        codec.step_turn_batch(pool._pool, store, [(100, 0, r, None, True, (1, 2))], 100)
    with pytest.raises(IndexError):
        codec.step_turn_batch(pool._pool, store, [(100, 7, r, None, True, ctx)], 100)
    with pytest.raises(TypeError):
        codec.step_turn_batch(pool._pool, store, [(100, 0, ["Action: x"], None, True, ctx)], 100)
    with pytest.raises(ValueError, match="more than once"):
        codec.step_turn_batch(pool._pool, store, [(100, 0, r, None, True, ctx),
                                                  (101, 0, r, None, True, ctx)], 100)
    with pytest.raises(TrajectoryError):
        codec.step_turn_batch(pool._pool, store, [(999, 0, r, None, True, ctx)], 100)
    with pytest.raises(ValueError, match="logprobs"):
        codec.step_turn_batch(pool._pool, store, [(100, 0, r, [0.0], True, ctx)], 100)
    assert ctx == [1, 2] and store.num_tokens(100) == before
    assert pool.turns.tolist() == [0, 0]


def test_prompts_equal_the_templated_first_prompt_and_go_to_the_store(fmt, codec):
    system = "You play a maze."
    head = fmt.system_ids(system)
    assert head is not None
    observations = ["You are at the start.", "A wall to the north.", "You are at the start."]
    store = _core.TrajectoryStore()
    for k in range(3):
        store.begin(k)
    prompts = codec.prompts(store, [0, 1, 2], head, observations)
    assert prompts == [fmt.initial_prompt(system, o) for o in observations]
    assert not any(gc.is_tracked(p) for p in prompts)
    store.finish_batch(np.array([0, 1, 2], np.uint64), "done")
    p = store.drain()
    for k in range(3):
        a, b = p["offsets"][k], p["offsets"][k + 1]
        assert p["token_ids"][a:b].tolist() == prompts[k]
        assert not p["loss_mask"][a:b].any()
    # An unknown key fails the whole call before anything is appended.
    store.begin(7)
    with pytest.raises(TrajectoryError):
        codec.prompts(store, [7, 8], head, ["a", "b"])
    with pytest.raises(ValueError, match="lengths must match"):
        codec.prompts(store, [7], head, ["a", "b"])
    assert store.num_tokens(7) == 0


def test_drain_rows_match_drain_and_are_untracked():
    def filled():
        s = _core.TrajectoryStore()
        for k, reward in ((5, 1.0), (6, 0.0)):
            s.begin(k)
            s.append(k, np.array([1, 2, 3], np.uint32), False)
            s.append(k, np.array([4, 5], np.uint32), True, np.array([-0.25, -1.5], np.float32))
            s.add_turn(k, reward)
            s.append(k, np.array([6], np.uint32), False)
        s.finish_batch(np.array([5, 6], np.uint64), ["done", "env_error"])
        return s

    p = filled().drain()
    rows = filled().drain_rows()
    assert [r.key for r in rows] == p["keys"].tolist()
    for i, r in enumerate(rows):
        a, b = p["offsets"][i], p["offsets"][i + 1]
        assert r.loss_mask == p["loss_mask"][a:b].tolist()
        assert r.logprobs == p["logprobs"][a:b].tolist()
        ta, tb = p["turn_offsets"][i], p["turn_offsets"][i + 1]
        assert r.turn_rewards == p["turn_rewards"][ta:tb].tolist()
        assert (r.reward, r.num_turns, r.stop_reason, r.prompt_len) == (
            p["rewards"][i], p["num_turns"][i], p["stop_reason"][i], p["prompt_len"][i])
        assert (r.group_id, r.sample_index, r.policy_version) == (
            p["group_id"][i], p["sample_index"][i], p["policy_version"][i])
        assert not gc.is_tracked(r.loss_mask) and not gc.is_tracked(r.logprobs)
        assert r.logprobs[0] is r.logprobs[1]  # one shared 0.0
    # a Python packed batch's rows through the same code: equal, keyed by position
    again = _core.packed_rows(PackedBatch.from_dict(filled().drain()))
    assert [r.key for r in again] == [0, 1]
    for r, q in zip(rows, again, strict=True):
        assert (r.loss_mask, r.logprobs, r.turn_rewards, r.reward, r.num_turns,
                r.stop_reason, r.prompt_len, r.group_id) == (
            q.loss_mask, q.logprobs, q.turn_rewards, q.reward, q.num_turns, q.stop_reason,
            q.prompt_len, q.group_id)
    assert _core.STOP_REASONS[rows[1].stop_reason] == "env_error"
    assert rows[1].loss_mask == [0] * 6


def test_engine_trajectories_stay_off_the_cyclic_gc(fmt):
    tok = fmt.tokenizer
    eng = RolloutEngine(ScriptedBackend(tok), tok, max_turns=4, max_concurrency=4)
    batch = eng.collect_sync(6, "maze")
    for t in batch:
        assert not gc.is_tracked(t)
        assert not gc.is_tracked(t.token_ids) and not gc.is_tracked(t.loss_mask)
    assert len(batch) == 6
