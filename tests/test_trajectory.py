"""TrajectoryStore and PackedBatch: packed export against a Python-side model of the episodes,
mask/logprob alignment, failure masking, error mapping, and a 10,000-episode drain."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym import TrajectoryError
from agentgym.trajectory import (
    FAILURE_REASONS,
    STOP_REASONS,
    PackedBatch,
    TrajectoryStore,
)

pytestmark = pytest.mark.timeout(120)


def test_stop_reason_codes_match_core():
    assert STOP_REASONS == (
        "done",
        "horizon",
        "length",
        "env_error",
        "backend_error",
        "timeout",
        "aborted",
    )


def test_single_episode_layout():
    s = TrajectoryStore()
    s.begin(42, group_id=7, sample_index=2, policy_version=5, task_id=99)
    s.append(42, [10, 11, 12])
    s.append(42, [13, 14], is_model=True, logprobs=[-0.5, -1.5])
    s.add_turn(42, 0.25)
    s.append(42, [15], is_model=False)
    s.append(42, np.array([16], dtype=np.uint32), True, np.array([-2.0], dtype=np.float32))
    s.add_turn(42, 1.0)
    assert 42 in s and s.num_tokens(42) == 7 and s.num_turns(42) == 2
    s.finish(42, "done")
    assert 42 not in s and s.num_completed == 1
    b = s.drain()
    assert len(b) == 1 and b.num_tokens == 7
    assert b.token_ids.dtype == np.uint32 and b.offsets.dtype == np.int64
    assert b.loss_mask.dtype == np.uint8 and b.logprobs.dtype == np.float32
    t = b.trajectory(0)
    assert t.key == 42 and t.group_id == 7 and t.sample_index == 2
    assert t.policy_version == 5 and t.task_id == 99
    assert t.token_ids.tolist() == [10, 11, 12, 13, 14, 15, 16]
    assert t.loss_mask.tolist() == [0, 0, 0, 1, 1, 0, 1]
    assert t.logprobs.tolist() == [0.0, 0.0, 0.0, -0.5, -1.5, 0.0, -2.0]
    assert t.turn_rewards.tolist() == [0.25, 1.0]
    assert t.reward == 1.25 and t.num_turns == 2 and t.prompt_len == 3
    assert t.stop_reason == "done"
    # Views, not copies.
    assert np.shares_memory(t.token_ids, b.token_ids)
    assert len(s.drain()) == 0


def test_failure_zeroes_mask_and_overrides():
    s = TrajectoryStore()
    keys = list(range(len(STOP_REASONS)))
    s.begin_batch(keys, group_ids=keys)
    s.append_segments(keys, [[1, 2]] * len(keys), is_model=False)
    s.append_segments(keys, [[3, 4]] * len(keys), is_model=True, logprobs=[[-1, -2]] * len(keys))
    s.add_turns(keys, [1.0] * len(keys))
    s.finish_batch(keys, list(STOP_REASONS), [None, 5.0] + [None] * (len(keys) - 2))
    b = s.drain()
    assert b.stop_reason_names() == list(STOP_REASONS)
    for t in b:
        want = [0, 0, 0, 0] if t.stop_reason in FAILURE_REASONS else [0, 0, 1, 1]
        assert t.loss_mask.tolist() == want
        assert t.logprobs.tolist() == [0, 0, -1, -2]  # logprobs stay for analysis
        assert t.prompt_len == 2
    assert b.failed.tolist() == [r in FAILURE_REASONS for r in STOP_REASONS]
    assert b.rewards.tolist() == [1.0, 5.0] + [1.0] * (len(keys) - 2)


def test_errors_map_to_named_exceptions():
    s = TrajectoryStore()
    with pytest.raises(TrajectoryError, match="unknown episode key 3"):
        s.append(3, [1])
    s.begin(3)
    with pytest.raises(TrajectoryError, match="already begun"):
        s.begin(3)
    with pytest.raises(TrajectoryError, match="already begun"):
        s.begin_batch([4, 4])
    assert 4 not in s
    with pytest.raises(TrajectoryError, match="logprobs"):
        s.append(3, [1, 2], True, [0.0])
    with pytest.raises(TrajectoryError, match="offsets"):
        s.append_batch([3], [1, 2], [0, 1], [False])
    with pytest.raises(TrajectoryError, match="lengths"):
        s.add_turns([3, 3], [1.0])
    # A batch naming an unknown key changes nothing.
    with pytest.raises(TrajectoryError, match="99"):
        s.append_batch([3, 99], [1, 2], [0, 1, 2], [False, False])
    assert s.num_tokens(3) == 0
    with pytest.raises(ValueError, match="stop reason"):
        s.finish(3, "exploded")
    with pytest.raises(ValueError, match="outside"):
        s.append(3, [-1])
    with pytest.raises(ValueError, match="integers"):
        s.append(3, [1.5])
    with pytest.raises(TypeError):
        s.finish("3", "done")  # type: ignore[arg-type]
    s.finish(3, "done")
    with pytest.raises(TrajectoryError, match="has finished"):
        s.append(3, [1])
    with pytest.raises(TrajectoryError, match="has finished"):
        s.add_turn(3, 1.0)


def test_drain_max_concat_and_padding():
    s = TrajectoryStore()
    s.begin_batch([1, 2, 3], task_ids=[10, 20, 30])
    s.append_segments([1, 2, 3], [[5], [6, 7], []], is_model=[False, True, True])
    s.finish_batch([2, 1, 3], "horizon")
    first, rest = s.drain(max=2), s.drain()
    assert first.keys.tolist() == [2, 1] and rest.keys.tolist() == [3]
    both = PackedBatch.concat([first, rest, PackedBatch.empty()])
    assert both.keys.tolist() == [2, 1, 3]
    assert both.offsets.tolist() == [0, 2, 3, 3]
    assert both.trajectory(-1).token_ids.size == 0
    assert both.trajectory(1).token_ids.tolist() == [5]
    with pytest.raises(IndexError):
        both.trajectory(3)
    pad = both.to_padded(pad_token_id=-1)
    assert pad["input_ids"].tolist() == [[6, 7], [5, -1], [-1, -1]]
    assert pad["attention_mask"].tolist() == [[1, 1], [1, 0], [0, 0]]
    assert pad["loss_mask"].tolist() == [[1, 1], [0, 0], [0, 0]]
    assert PackedBatch.empty().to_padded()["input_ids"].shape == (0, 0)


def test_to_torch_shares_memory():
    torch = pytest.importorskip("torch")
    s = TrajectoryStore()
    s.begin(1)
    s.append(1, [1, 2, 3], True, [-0.1, -0.2, -0.3])
    s.finish(1, "done")
    b = s.drain()
    t = b.to_torch()
    assert t["logprobs"].dtype == torch.float32
    t["logprobs"][0] = 7.0
    assert b.logprobs[0] == 7.0
    assert t["token_ids"].long().tolist() == [1, 2, 3]


def test_finish_all_and_discard():
    s = TrajectoryStore()
    s.begin_batch(np.arange(5, dtype=np.uint64))
    s.discard(4)
    assert s.finish_all() == 4
    b = s.drain()
    assert sorted(b.keys.tolist()) == [0, 1, 2, 3]
    assert set(b.stop_reason_names()) == {"aborted"}


segment = st.tuples(
    st.integers(0, 5),  # episode
    st.lists(st.integers(0, 2**32 - 1), max_size=12),
    st.booleans(),
)
op = st.one_of(segment, st.tuples(st.integers(0, 5), st.floats(-10, 10, width=32)))


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(op, max_size=60),
    reasons=st.lists(st.sampled_from(STOP_REASONS), min_size=6, max_size=6),
)
def test_round_trip_matches_python_model(ops, reasons):
    keys = [1000 + 3 * i for i in range(6)]
    s = TrajectoryStore()
    s.begin_batch(keys, group_ids=[k // 2 for k in keys], sample_indices=range(6))
    model = {k: {"tok": [], "mask": [], "lp": [], "turns": []} for k in keys}
    lp_next = -0.0
    for o in ops:
        k = keys[o[0]]
        if len(o) == 3:
            _, toks, is_model = o
            lps = [lp_next - 0.25 * j for j in range(len(toks))]
            lp_next -= 0.25 * len(toks)
            # Mix single appends and batched ones.
            if len(toks) % 2:
                s.append(k, toks, is_model, lps)
            else:
                s.append_batch([k], toks, [0, len(toks)], [is_model], lps)
            model[k]["tok"] += toks
            model[k]["mask"] += [int(is_model)] * len(toks)
            model[k]["lp"] += lps if is_model else [0.0] * len(toks)
        else:
            s.add_turn(k, o[1])
            model[k]["turns"].append(o[1])
    s.finish_batch(keys, reasons)
    b = s.drain()
    assert b.keys.tolist() == keys
    assert b.offsets[-1] == b.num_tokens == b.token_ids.size == b.loss_mask.size
    for i, (k, reason) in enumerate(zip(keys, reasons, strict=True)):
        t, m = b.trajectory(i), model[k]
        assert t.token_ids.tolist() == m["tok"]
        mask = [0] * len(m["mask"]) if reason in FAILURE_REASONS else m["mask"]
        assert t.loss_mask.tolist() == mask
        np.testing.assert_array_equal(t.logprobs, np.array(m["lp"], dtype=np.float32))
        np.testing.assert_array_equal(t.turn_rewards, np.array(m["turns"], dtype=np.float32))
        assert t.num_turns == len(m["turns"])
        assert t.reward == pytest.approx(sum(np.float32(x) for x in m["turns"]), abs=1e-4)
        assert t.prompt_len == next((j for j, x in enumerate(m["mask"]) if x), len(m["tok"]))
        assert t.stop_reason == reason and t.group_id == k // 2 and t.sample_index == i


def test_ten_thousand_episodes_drained_at_once():
    n, turns = 10_000, 3
    keys = np.arange(n, dtype=np.uint64) * 7 + 1
    s = TrajectoryStore()
    s.begin_batch(keys, group_ids=keys // 8, sample_indices=keys % 8, policy_versions=4)
    rng = np.random.default_rng(0)
    want_tokens: list[list[np.ndarray]] = [[] for _ in range(n)]
    for _ in range(turns):
        for is_model in (False, True):
            lengths = rng.integers(1, 12, size=n)
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            flat = rng.integers(0, 50_000, size=offsets[-1], dtype=np.uint32)
            lps = -rng.random(offsets[-1], dtype=np.float32) if is_model else None
            s.append_batch(keys, flat, offsets, is_model, lps)
            for i in (0, n // 2, n - 1):
                want_tokens[i].append(flat[offsets[i] : offsets[i + 1]])
        s.add_turns(keys, np.full(n, 0.5, dtype=np.float32))
    reasons = ["done"] * (n - 100) + ["timeout"] * 100
    s.finish_batch(keys, reasons)
    assert s.num_live == 0 and s.num_completed == n
    b = s.drain()
    assert len(b) == n and np.array_equal(b.keys, keys)
    assert np.all(b.num_turns == turns) and np.allclose(b.rewards, 1.5)
    assert np.array_equal(b.policy_version, np.full(n, 4, dtype=np.uint32))
    for i in (0, n // 2, n - 1):
        np.testing.assert_array_equal(b.trajectory(i).token_ids, np.concatenate(want_tokens[i]))
    # Masks: model tokens of successful episodes only; logprobs nonzero exactly there.
    ok_tokens = b.offsets[n - 100]
    assert b.loss_mask[ok_tokens:].sum() == 0
    model_lp = b.logprobs[:ok_tokens][b.loss_mask[:ok_tokens] == 1]
    assert np.all(model_lp <= 0) and b.loss_mask[:ok_tokens].sum() == model_lp.size
    assert np.all(b.logprobs[:ok_tokens][b.loss_mask[:ok_tokens] == 0] == 0)
    assert s.heap_bytes() < 10_000_000  # the drained buffers left the store


def test_exports_match_a_hand_built_trajectory():
    """``to_verl``, ``to_skyrl`` and ``pack`` of two trajectories, field by field, against
    values written out by hand."""
    from agentgym.data.exports import pack, to_skyrl, to_verl
    from agentgym.data.schemas import Trajectory

    a = Trajectory(task_id=3, env_id="maze", group_id=7, sample_index=1,
                   token_ids=[101, 102, 103, 11, 12, 201, 13],
                   loss_mask=[0, 0, 0, 1, 1, 0, 1],
                   logprobs=[0.0, 0.0, 0.0, -0.5, -1.25, 0.0, -2.0],
                   prompt_len=3, turn_rewards=[0.0, 1.0], reward=1.0, num_turns=2,
                   stop_reason="done", policy_version=4,
                   timings={"total_s": 0.5, "gen_s": 0.25})
    b = Trajectory(task_id=4, env_id="maze", group_id=8, sample_index=0,
                   token_ids=[101, 102, 21], loss_mask=[0, 0, 1], logprobs=[0.0, 0.0, -0.75],
                   prompt_len=2, turn_rewards=[0.5], reward=0.5, num_turns=1,
                   stop_reason="length", policy_version=3)
    verl = to_verl(a)
    assert verl == {
        "prompt_ids": [101, 102, 103],
        "response_ids": [11, 12, 201, 13],
        "response_mask": [1, 1, 0, 1],
        "response_logprobs": [-0.5, -1.25, 0.0, -2.0],
        "num_turns": 2,
        "reward_score": 1.0,
        "metrics": {"total_s": 0.5, "gen_s": 0.25},
    }
    assert verl["metrics"] is not a.timings
    assert to_skyrl([a, b]) == {
        "prompt_token_ids": [[101, 102, 103], [101, 102]],
        "response_ids": [[11, 12, 201, 13], [21]],
        "rewards": [1.0, 0.5],
        "loss_masks": [[1, 1, 0, 1], [1]],
        "stop_reasons": ["done", "length"],
        "rollout_logprobs": [[-0.5, -1.25, 0.0, -2.0], [-0.75]],
    }
    want = {
        "token_ids": ([101, 102, 103, 11, 12, 201, 13, 101, 102, 21], np.uint32),
        "offsets": ([0, 7, 10], np.int64),
        "loss_mask": ([0, 0, 0, 1, 1, 0, 1, 0, 0, 1], np.uint8),
        "logprobs": ([0, 0, 0, -0.5, -1.25, 0, -2.0, 0, 0, -0.75], np.float32),
        "rewards": ([1.0, 0.5], np.float32),
        "turn_rewards": ([0.0, 1.0, 0.5], np.float32),
        "turn_offsets": ([0, 2, 3], np.int64),
        "num_turns": ([2, 1], np.uint32),
        "stop_reason": ([0, 2], np.uint8),
        "group_id": ([7, 8], np.uint64),
        "sample_index": ([1, 0], np.uint32),
        "policy_version": ([4, 3], np.uint32),
        "prompt_len": ([3, 2], np.uint32),
    }
    packed = pack([a, b])
    assert packed.keys() == want.keys()
    for name, (values, dtype) in want.items():
        assert packed[name].dtype == dtype, name
        np.testing.assert_array_equal(packed[name], np.array(values, dtype), err_msg=name)
    # the learner reads the packed layout as the same two trajectories
    from agentgym.learner.batch import PackedBatch

    pb = PackedBatch.from_any(packed)
    assert pb.lengths.tolist() == [7, 3] and pb.rewards.tolist() == [1.0, 0.5]


def test_drain_rows_share_one_positive_zero_and_keep_negative_zero():
    from agentgym import _core

    s = _core.TrajectoryStore()
    s.begin(1)
    s.append(1, np.array([1, 2], np.uint32), False)
    lps = np.array([0.0, -1.25, -0.0, 3.0], np.float32)
    s.append(1, np.array([3, 4, 5, 6], np.uint32), True, lps)
    s.add_turn(1, 0.0)
    s.finish(1, "done")
    ((_, mask, logprobs, turn_rewards, *_),) = s.drain_rows()
    assert mask == [0, 0, 1, 1, 1, 1]
    assert logprobs == [0.0, 0.0, 0.0, -1.25, -0.0, 3.0]
    # Every +0.0 (prompt tokens, a model token, a turn reward) is one object; -0.0 is not.
    assert logprobs[0] is logprobs[1] is logprobs[2] is turn_rewards[0]
    assert str(logprobs[4]) == "-0.0" and logprobs[4] is not logprobs[0]
