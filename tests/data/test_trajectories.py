"""``_core.TrajectoryStore`` and ``agentgym.data``'s ``PackedBatch``: the drained layout against
a Python-side model of the episodes, mask/logprob alignment, failure masking, error mapping,
a 10,000-episode drain, and ``pack`` of ``Trajectory`` structs giving the store's layout."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym import TrajectoryError, _core
from agentgym.data import (
    FAILED_STOP_CODES,
    FAILED_STOP_REASONS,
    STOP_CODES,
    STOP_REASONS,
    BatchFormatError,
    PackedBatch,
    pack,
)
from tests.helpers import make_trajectory

pytestmark = pytest.mark.timeout(120)


def u32(x):
    return np.asarray(x, dtype=np.uint32)


def u64(x):
    return np.asarray(x, dtype=np.uint64)


def f32(x):
    return np.asarray(x, dtype=np.float32)


def begin_batch(s, keys, group_ids=0, sample_indices=0, policy_versions=0, task_ids=0):
    """``begin_batch`` with each metadata column given per key or as one value for all."""
    k = u64(keys)

    def col(v, dtype):
        return np.ascontiguousarray(np.broadcast_to(np.asarray(v, dtype), k.shape))

    s.begin_batch(k, col(group_ids, np.uint64), col(sample_indices, np.uint32),
                  col(policy_versions, np.uint32), col(task_ids, np.uint64))


def append_segments(s, keys, segments, is_model, logprobs=None):
    """``append_batch`` of one token list per key (flattened here)."""
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in segments])]).astype(np.int64)
    flat = u32([t for seg in segments for t in seg])
    lp = None if logprobs is None else f32([x for seg in logprobs for x in seg])
    model = np.ascontiguousarray(np.broadcast_to(np.asarray(is_model, bool), (len(keys),)))
    s.append_batch(u64(keys), flat, offsets, model, lp)


def drain(s, max=None):
    """The raw drained dict and the ``PackedBatch`` read from it."""
    d = s.drain(max)
    return d, PackedBatch.from_dict(d)


def row(b: PackedBatch, i: int) -> dict:
    """Trajectory ``i`` of ``b``: its token, mask, logprob and turn-reward slices."""
    a, z = int(b.offsets[i]), int(b.offsets[i + 1])
    ta, tz = int(b.turn_offsets[i]), int(b.turn_offsets[i + 1])
    return {"token_ids": b.token_ids[a:z], "loss_mask": b.loss_mask[a:z],
            "logprobs": b.logprobs[a:z], "turn_rewards": b.turn_rewards[ta:tz]}


def test_stop_reason_codes_come_from_core():
    assert STOP_REASONS == _core.STOP_REASONS == (
        "done",
        "horizon",
        "length",
        "env_error",
        "backend_error",
        "timeout",
        "aborted",
    )
    assert [STOP_CODES[r] for r in STOP_REASONS] == list(range(len(STOP_REASONS)))
    assert FAILED_STOP_REASONS == {"env_error", "backend_error", "timeout", "aborted"}
    assert FAILED_STOP_CODES == (3, 4, 5, 6)


def test_single_episode_layout():
    s = _core.TrajectoryStore()
    s.begin(42, 7, 2, 5, 99)
    s.append(42, u32([10, 11, 12]), False)
    s.append(42, u32([13, 14]), True, f32([-0.5, -1.5]))
    s.add_turn(42, 0.25)
    s.append(42, u32([15]), False)
    s.append(42, u32([16]), True, f32([-2.0]))
    s.add_turn(42, 1.0)
    assert 42 in s and s.num_tokens(42) == 7 and s.num_turns(42) == 2
    s.finish(42, "done")
    assert 42 not in s and s.num_completed == 1
    d, b = drain(s)
    assert len(b) == 1 and b.num_tokens == 7
    assert b.token_ids.dtype == np.uint32 and b.offsets.dtype == np.int64
    assert b.loss_mask.dtype == np.uint8 and b.logprobs.dtype == np.float32
    assert d["keys"].tolist() == [42] and d["task_id"].tolist() == [99]
    assert b.group_id.tolist() == [7] and b.sample_index.tolist() == [2]
    assert b.policy_version.tolist() == [5]
    t = row(b, 0)
    assert t["token_ids"].tolist() == [10, 11, 12, 13, 14, 15, 16]
    assert t["loss_mask"].tolist() == [0, 0, 0, 1, 1, 0, 1]
    assert t["logprobs"].tolist() == [0.0, 0.0, 0.0, -0.5, -1.5, 0.0, -2.0]
    assert t["turn_rewards"].tolist() == [0.25, 1.0]
    assert b.rewards.tolist() == [1.25] and b.num_turns.tolist() == [2]
    assert b.prompt_len.tolist() == [3] and b.stop_reason_names() == ["done"]
    # from_dict keeps the drained arrays (already of the right dtype): no copies.
    # (the store plays whole records: a batch from its drain has no steps, and its rows are
    # single-agent: seat 0; it holds no per-token versions: every token is the row's)
    assert b.token_version.tolist() == [5] * 7
    for f in fields(b):
        if f.name.startswith("step_") or f.name == "seat":
            assert not getattr(b, f.name).any()
            continue
        if f.name == "token_version":
            continue
        assert np.shares_memory(getattr(b, f.name), d[f.name]) or d[f.name].size == 0, f.name
    assert len(s.drain()["offsets"]) == 1


def test_failure_zeroes_mask_and_overrides():
    s = _core.TrajectoryStore()
    keys = list(range(len(STOP_REASONS)))
    begin_batch(s, keys, group_ids=keys)
    append_segments(s, keys, [[1, 2]] * len(keys), is_model=False)
    append_segments(s, keys, [[3, 4]] * len(keys), is_model=True, logprobs=[[-1, -2]] * len(keys))
    s.add_turns(u64(keys), f32([1.0] * len(keys)))
    over = f32([np.nan, 5.0] + [np.nan] * (len(keys) - 2))  # NaN: the sum of turn rewards
    s.finish_batch(u64(keys), list(STOP_REASONS), over)
    _, b = drain(s)
    assert b.stop_reason_names() == list(STOP_REASONS)
    for i, reason in enumerate(STOP_REASONS):
        t = row(b, i)
        # The Rust store zeroes the mask of exactly the reasons in FAILED_STOP_REASONS.
        want = [0, 0, 0, 0] if reason in FAILED_STOP_REASONS else [0, 0, 1, 1]
        assert t["loss_mask"].tolist() == want, reason
        assert t["logprobs"].tolist() == [0, 0, -1, -2]  # logprobs stay for analysis
    assert b.prompt_len.tolist() == [2] * len(keys)
    assert b.failed.tolist() == [r in FAILED_STOP_REASONS for r in STOP_REASONS]
    assert b.rewards.tolist() == [1.0, 5.0] + [1.0] * (len(keys) - 2)


def test_errors_map_to_named_exceptions():
    s = _core.TrajectoryStore()
    with pytest.raises(TrajectoryError, match="unknown episode key 3"):
        s.append(3, u32([1]), False)
    s.begin(3)
    with pytest.raises(TrajectoryError, match="already begun"):
        s.begin(3)
    with pytest.raises(TrajectoryError, match="already begun"):
        begin_batch(s, [4, 4])
    assert 4 not in s
    with pytest.raises(TrajectoryError, match="lengths must match"):
        s.begin_batch(u64([4, 5]), u64([0]), u32([0, 0]), u32([0, 0]), u64([0, 0]))
    assert 4 not in s and 5 not in s
    with pytest.raises(TrajectoryError, match="logprobs"):
        s.append(3, u32([1, 2]), True, f32([0.0]))
    with pytest.raises(TrajectoryError, match="offsets"):
        s.append_batch(u64([3]), u32([1, 2]), np.array([0, 1], np.int64), np.array([False]))
    with pytest.raises(TrajectoryError, match="lengths"):
        s.add_turns(u64([3, 3]), f32([1.0]))
    # A batch naming an unknown key changes nothing.
    with pytest.raises(TrajectoryError, match="99"):
        s.append_batch(u64([3, 99]), u32([1, 2]), np.array([0, 1, 2], np.int64),
                       np.array([False, False]))
    assert s.num_tokens(3) == 0
    with pytest.raises(ValueError, match="stop reason"):
        s.finish(3, "exploded")
    # Arrays of the wrong dtype (or lists) are a TypeError, never a silent cast.
    with pytest.raises(TypeError):
        s.append(3, np.array([-1]), False)
    with pytest.raises(TypeError):
        s.append(3, np.array([1.5]), False)
    with pytest.raises(TypeError):
        s.append(3, [1], False)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        s.finish("3", "done")  # type: ignore[arg-type]
    assert s.num_tokens(3) == 0
    s.finish(3, "done")
    with pytest.raises(TrajectoryError, match="has finished"):
        s.append(3, u32([1]), False)
    with pytest.raises(TrajectoryError, match="has finished"):
        s.add_turn(3, 1.0)


def test_drain_max_and_concat():
    s = _core.TrajectoryStore()
    begin_batch(s, [1, 2, 3], task_ids=[10, 20, 30])
    append_segments(s, [1, 2, 3], [[5], [6, 7], []], is_model=[False, True, True])
    s.finish_batch(u64([2, 1, 3]), "horizon")
    (d1, first), (d2, rest) = drain(s, max=2), drain(s)
    assert d1["keys"].tolist() == [2, 1] and d2["keys"].tolist() == [3]
    assert d1["task_id"].tolist() == [20, 10] and d2["task_id"].tolist() == [30]
    both = PackedBatch.concat([first, rest, PackedBatch.empty()])
    assert len(both) == 3 and both.offsets.tolist() == [0, 2, 3, 3]
    assert both.token_ids.tolist() == [6, 7, 5] and both.loss_mask.tolist() == [1, 1, 0]
    assert row(both, 2)["token_ids"].size == 0
    assert both.stop_reason_names() == ["horizon"] * 3
    assert both.lengths.tolist() == [2, 1, 0]
    assert both.trajectory_index().tolist() == [0, 0, 1]
    assert len(PackedBatch.empty()) == 0 and PackedBatch.empty().num_tokens == 0
    PackedBatch.empty().validate()
    assert PackedBatch.concat([]).offsets.tolist() == [0]


def test_finish_all_and_discard():
    s = _core.TrajectoryStore()
    begin_batch(s, np.arange(5))
    s.discard(4)
    assert s.finish_all("aborted") == 4
    d, b = drain(s)
    assert sorted(d["keys"].tolist()) == [0, 1, 2, 3]
    assert set(b.stop_reason_names()) == {"aborted"}
    assert b.failed.all()


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
    s = _core.TrajectoryStore()
    begin_batch(s, keys, group_ids=[k // 2 for k in keys], sample_indices=range(6))
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
                s.append(k, u32(toks), is_model, f32(lps))
            else:
                s.append_batch(u64([k]), u32(toks), np.array([0, len(toks)], np.int64),
                               np.array([is_model]), f32(lps))
            model[k]["tok"] += toks
            model[k]["mask"] += [int(is_model)] * len(toks)
            model[k]["lp"] += lps if is_model else [0.0] * len(toks)
        else:
            s.add_turn(k, o[1])
            model[k]["turns"].append(o[1])
    s.finish_batch(u64(keys), reasons)
    d, b = drain(s)
    assert d["keys"].tolist() == keys
    assert b.offsets[-1] == b.num_tokens == b.token_ids.size == b.loss_mask.size
    for i, (k, reason) in enumerate(zip(keys, reasons, strict=True)):
        t, m = row(b, i), model[k]
        assert t["token_ids"].tolist() == m["tok"]
        mask = [0] * len(m["mask"]) if reason in FAILED_STOP_REASONS else m["mask"]
        assert t["loss_mask"].tolist() == mask
        np.testing.assert_array_equal(t["logprobs"], np.array(m["lp"], dtype=np.float32))
        np.testing.assert_array_equal(t["turn_rewards"], np.array(m["turns"], dtype=np.float32))
        assert b.num_turns[i] == len(m["turns"])
        assert b.rewards[i] == pytest.approx(sum(np.float32(x) for x in m["turns"]), abs=1e-4)
        assert b.prompt_len[i] == next((j for j, x in enumerate(m["mask"]) if x), len(m["tok"]))
        assert b.stop_reason_names()[i] == reason
        assert b.group_id[i] == k // 2 and b.sample_index[i] == i


def test_ten_thousand_episodes_drained_at_once():
    n, turns = 10_000, 3
    keys = np.arange(n, dtype=np.uint64) * 7 + 1
    s = _core.TrajectoryStore()
    begin_batch(s, keys, group_ids=keys // 8, sample_indices=keys % 8, policy_versions=4)
    rng = np.random.default_rng(0)
    want_tokens: list[list[np.ndarray]] = [[] for _ in range(n)]
    for _ in range(turns):
        for is_model in (False, True):
            lengths = rng.integers(1, 12, size=n)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            flat = rng.integers(0, 50_000, size=offsets[-1], dtype=np.uint32)
            lps = -rng.random(offsets[-1], dtype=np.float32) if is_model else None
            s.append_batch(keys, flat, offsets, np.full(n, is_model), lps)
            for i in (0, n // 2, n - 1):
                want_tokens[i].append(flat[offsets[i] : offsets[i + 1]])
        s.add_turns(keys, np.full(n, 0.5, dtype=np.float32))
    reasons = ["done"] * (n - 100) + ["timeout"] * 100
    s.finish_batch(keys, reasons)
    assert s.num_live == 0 and s.num_completed == n
    d, b = drain(s)
    assert len(b) == n and np.array_equal(d["keys"], keys)
    assert np.all(b.num_turns == turns) and np.allclose(b.rewards, 1.5)
    assert np.array_equal(b.policy_version, np.full(n, 4, dtype=np.uint32))
    for i in (0, n // 2, n - 1):
        np.testing.assert_array_equal(row(b, i)["token_ids"], np.concatenate(want_tokens[i]))
    # Masks: model tokens of successful episodes only; logprobs nonzero exactly there.
    ok_tokens = b.offsets[n - 100]
    assert b.loss_mask[ok_tokens:].sum() == 0
    model_lp = b.logprobs[:ok_tokens][b.loss_mask[:ok_tokens] == 1]
    assert np.all(model_lp <= 0) and b.loss_mask[:ok_tokens].sum() == model_lp.size
    assert np.all(b.logprobs[:ok_tokens][b.loss_mask[:ok_tokens] == 0] == 0)
    assert b.failed.sum() == 100 and b.failed[n - 100 :].all()
    assert s.heap_bytes() < 10_000_000  # the drained buffers left the store


def test_pack_gives_the_layout_the_store_drains():
    """The same episodes recorded in the Rust store and packed from ``Trajectory`` structs
    (as the engine builds them: a failed one already has a zero mask) give equal batches,
    field for field and dtype for dtype."""
    # (segments as (tokens, is_model, logprobs), turn rewards, stop reason)
    episodes = [
        ([([1, 2, 3], False, None), ([4, 5], True, [-0.5, -0.25]), ([6], False, None),
          ([7], True, [-1.0])], [0.0, 1.0], "done"),
        ([([8], False, None), ([9, 10, 11], True, [-0.1, -0.2, -0.3])], [0.5], "length"),
        ([([12, 13], False, None), ([14], True, [-2.0])], [0.25], "env_error"),
        ([([15, 16], False, None)], [], "horizon"),
    ]
    s = _core.TrajectoryStore()
    trajs = []
    for key, (segs, turns, reason) in enumerate(episodes):
        s.begin(key, 100 + key // 2, key % 2, 3 + key, 0)
        ids, mask, lps = [], [], []
        for toks, is_model, lp in segs:
            s.append(key, u32(toks), is_model, None if lp is None else f32(lp))
            ids += toks
            mask += [int(is_model and reason not in FAILED_STOP_REASONS)] * len(toks)
            lps += lp if lp is not None else [0.0] * len(toks)
        for r in turns:
            s.add_turn(key, r)
        s.finish(key, reason)
        is_model = [m for toks, m, _ in segs for _ in toks]
        prompt_len = is_model.index(True) if True in is_model else len(is_model)
        trajs.append(make_trajectory(
            ids, mask, logprobs=lps, turn_rewards=turns, reward=float(sum(turns)),
            num_turns=len(turns), stop_reason=reason, group_id=100 + key // 2,
            sample_index=key % 2, policy_version=3 + key, prompt_len=prompt_len))
    _, drained = drain(s)
    packed = pack(trajs)
    assert len(packed) == 4 and packed.prompt_len.tolist() == [3, 1, 2, 2]
    for f in fields(PackedBatch):
        got, want = getattr(packed, f.name), getattr(drained, f.name)
        assert got.dtype == want.dtype, f.name
        np.testing.assert_array_equal(got, want, err_msg=f.name)
    assert packed.failed.tolist() == [False, False, True, False]
    # concat of two packed halves is the packed whole
    halves = PackedBatch.concat([pack(trajs[:1]), pack(trajs[1:])])
    for f in fields(PackedBatch):
        np.testing.assert_array_equal(getattr(halves, f.name), getattr(packed, f.name))
    assert len(pack([])) == 0 and pack([]).offsets.tolist() == [0]
    # rows(a, z) is the batch of trajectories a .. z-1, as views of the same buffers
    for a in range(5):
        for z in range(a, 5):
            part, want = packed.rows(a, z), pack(trajs[a:z])
            for f in fields(PackedBatch):
                got = getattr(part, f.name)
                assert got.dtype == getattr(want, f.name).dtype, f.name
                np.testing.assert_array_equal(got, getattr(want, f.name), err_msg=f.name)
    assert np.shares_memory(packed.rows(1, 3).token_ids, packed.token_ids)
    with pytest.raises(IndexError):
        packed.rows(2, 5)


def test_pack_rejects_inconsistent_trajectories():
    good = make_trajectory([1, 2, 3], [0, 1, 1])
    pack([good])
    short_mask = make_trajectory([1, 2, 3], [0, 1, 1], logprobs=[0.0] * 3)
    short_mask.loss_mask = [0, 1]
    with pytest.raises(BatchFormatError, match="trajectory 1: loss_mask has 2 entries"):
        pack([good, short_mask])
    long_lp = make_trajectory([1, 2, 3], [0, 1, 1], logprobs=[0.0] * 4)
    with pytest.raises(BatchFormatError, match="trajectory 0: logprobs has 4 entries"):
        pack([long_lp, good])
    unknown = make_trajectory([1, 2, 3], [0, 1, 1], stop_reason="exploded")
    with pytest.raises(BatchFormatError, match="unknown stop reason 'exploded'"):
        pack([good, unknown])


def test_from_dict_reports_bad_fields():
    d = {f.name: getattr(pack([make_trajectory([1, 2], [0, 1])]), f.name)
         for f in fields(PackedBatch)}
    PackedBatch.from_dict({**d, "keys": np.zeros(1, np.uint64)})  # extra entries are fine
    with pytest.raises(BatchFormatError, match="missing field 'turn_offsets'"):
        PackedBatch.from_dict({k: v for k, v in d.items() if k != "turn_offsets"})
    with pytest.raises(BatchFormatError, match="1-D"):
        PackedBatch.from_dict({**d, "rewards": np.zeros((1, 1), np.float32)})
    with pytest.raises(BatchFormatError, match="stop_reason codes"):
        PackedBatch.from_dict({**d, "stop_reason": np.array([len(STOP_REASONS)], np.uint8)})
    with pytest.raises(BatchFormatError, match="turn_offsets"):
        PackedBatch.from_dict({**d, "turn_offsets": np.array([0, 1], np.int64)})


def test_packed_batch_validation_errors():
    good = pack([make_trajectory([1, 2, 3, 4], [0, 0, 1, 1], reward=1.0, turn_rewards=[1.0])])
    d = {f: getattr(good, f) for f in good.__dataclass_fields__}
    PackedBatch.from_dict(d)
    bad = dict(d, offsets=np.array([0, 3]))
    with pytest.raises(BatchFormatError, match="offsets"):
        PackedBatch.from_dict(bad)
    missing = {k: v for k, v in d.items() if k != "logprobs"}
    with pytest.raises(BatchFormatError, match="logprobs"):
        PackedBatch.from_dict(missing)
    with pytest.raises(BatchFormatError, match="rewards"):
        PackedBatch.from_dict(dict(d, rewards=np.zeros(3, np.float32)))


def test_drain_rows_share_one_positive_zero_and_keep_negative_zero():
    s = _core.TrajectoryStore()
    s.begin(1)
    s.append(1, np.array([1, 2], np.uint32), False)
    lps = np.array([0.0, -1.25, -0.0, 3.0], np.float32)
    s.append(1, np.array([3, 4, 5, 6], np.uint32), True, lps)
    s.add_turn(1, 0.0)
    s.finish(1, "done")
    (row,) = s.drain_rows()
    mask, logprobs, turn_rewards = row.loss_mask, row.logprobs, row.turn_rewards
    assert mask == [0, 0, 1, 1, 1, 1]
    assert logprobs == [0.0, 0.0, 0.0, -1.25, -0.0, 3.0]
    # Every +0.0 (prompt tokens, a model token, a turn reward) is one object; -0.0 is not.
    assert logprobs[0] is logprobs[1] is logprobs[2] is turn_rewards[0]
    assert str(logprobs[4]) == "-0.0" and logprobs[4] is not logprobs[0]


def test_packed_rows_refuse_inconsistent_columns():
    """A packed batch whose columns disagree is a ValueError naming the column, never a
    panic or an out-of-range read."""
    import dataclasses

    good = pack([make_trajectory([1, 2, 3], [0, 1, 1], turn_rewards=[1.0], reward=1.0),
                 make_trajectory([4, 5], [0, 1], logprobs=[0.0, -1.0])])
    assert len(_core.packed_rows(good)) == 2
    bad = [
        (dataclasses.replace(good, offsets=np.array([0, 9, 99], np.int64)), "offsets"),
        (dataclasses.replace(good, offsets=np.array([0, 3, 1], np.int64)), "offsets"),
        (dataclasses.replace(good, rewards=np.zeros(5, np.float32)), "rewards"),
        (dataclasses.replace(good, turn_offsets=np.array([0, 1, 50], np.int64)),
         "turn_offsets"),
        (dataclasses.replace(good, logprobs=np.zeros(1, np.float32)), "logprobs"),
        (dataclasses.replace(good, group_id=good.group_id.astype(np.int32)), "group_id"),
    ]
    for batch, column in bad:
        with pytest.raises(ValueError, match=column):
            _core.packed_rows(batch)


def test_one_success_rule_for_scalars_arrays_and_trajectories():
    from agentgym.data.trajectories import SUCCESS_REWARD, solved

    rewards = np.array([1.0, 1.0 - 1e-7, 0.99, 2.0, 1.0], np.float32)
    done = np.array([True, True, True, True, False])
    want = [True, True, False, True, False]
    assert solved(done, rewards).tolist() == want
    for d, r, w in zip(done.tolist(), rewards.tolist(), want, strict=True):
        assert bool(solved(d, r)) is w
        t = make_trajectory([1, 2], [0, 1], reward=r, stop_reason="done" if d else "horizon")
        assert t.success is w
    assert SUCCESS_REWARD == 1.0
