"""The one row schema of a collection run: one row per trajectory, the same fields in
Parquet and JSONL.

A row's key is (``task_index``, ``sample_index``): ``task_index`` is the task's position in
the run's task list (recorded in ``metadata.json``), which is also its ``group_id``, so
a resumed run gives every key the same episode seed. An episode of a multi-seat game
(self-play) has one row per seat under its key: (``task_index``, ``sample_index``,
``seat``) is then a row's identity, and the seats of one episode are always in the same
shard. Version 7 added ``seat``, ``episode_id``, ``role`` and ``player``; older shards read
as single-agent rows. Version 8 added ``images`` and ``image_refs``; older shards read as
rows without images. ``SCHEMA_VERSION`` changes only when a
field is added, removed or retyped; Parquet shards carry it in their schema metadata
(``agentgym.schema_version``) and ``metadata.json`` records it.

Rows are built column-wise from a :class:`~agentgym.data.PackedBatch` and its
:class:`~agentgym.data.RowInfo`: each token-level field becomes an Arrow list array over the
packed buffer, with no per-row Python dicts or lists.

An episode with image observations stores each distinct frame once in its row (``images``:
hash, height, width and the RGB bytes, row-major) and, per image placeholder span of its
``token_ids`` in order, the index of the frame shown there (``image_refs``); a text row has
both empty. JSONL carries a frame's bytes base64-encoded (:func:`decode_jsonl_frames`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from agentgym.data.frames import Frame, RowImages
from agentgym.data.trajectories import (
    STEP_FIELDS,
    STOP_REASONS,
    BatchFormatError,
    PackedBatch,
    RowInfo,
    Trajectory,
    pack,
    unpack,
)

__all__ = ["FIELDS", "FRAME", "SCHEMA", "SCHEMA_VERSION", "decode_jsonl_frames", "from_table",
           "rows_to_trajectories", "to_jsonl", "to_table", "trajectories_table"]

SCHEMA_VERSION = 8

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
#: One frame of an episode (:class:`~agentgym.data.frames.Frame`): ``data`` holds
#: ``height * width * 3`` RGB bytes, row-major.
FRAME = pa.struct([("hash", pa.string()), ("height", pa.uint32()), ("width", pa.uint32()),
                   ("data", pa.binary())])

#: (name, Arrow type, description): the documented schema, in column order.
FIELDS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("run_id", pa.string(), "the run's id (metadata.json)"),
    ("env_id", pa.string(), "environment id"),
    ("task_index", pa.int64(), "position of the task in the run's task list (the key)"),
    ("task_id", pa.int64(), "the env's task index (null for a task given as text)"),
    ("task_text", pa.string(), "the task text (null for a task index)"),
    ("group_id", pa.uint64(), "GRPO group: equals task_index"),
    ("sample_index", pa.uint32(), "sample within the group (the key)"),
    ("seat", pa.uint32(), "a multi-seat game's seat (one row per seat under the key; 0 for a "
                          "single-agent episode)"),
    ("episode_id", pa.uint64(), "a game episode's id, the same on all its seats' rows (null "
                                "for a single-agent episode)"),
    ("role", pa.string(), "the seat's role in the game (X, O, first, ...; else null)"),
    ("player", pa.string(), "who played the seat: policy (the only rows with loss mask 1) or "
                            "the opponent's name (else null)"),
    ("seed", pa.uint64(), "the env seed, from (run seed, group_id)"),
    ("token_ids", pa.list_(pa.uint32()), "the whole conversation, token-exact"),
    ("loss_mask", pa.list_(pa.uint8()), "1 exactly on model-generated tokens"),
    ("logprobs", pa.list_(pa.float32()), "behaviour logprob per token (0 off the mask)"),
    ("prompt_len", pa.uint32(), "tokens before the first model token"),
    ("turn_rewards", pa.list_(pa.float32()), "the env's reward after each turn"),
    ("reward", pa.float32(), "sum of turn_rewards"),
    ("num_turns", pa.uint32(), "turns played"),
    ("stop_reason", pa.string(), "done | horizon | length | env_error | backend_error | "
                                 "timeout | aborted"),
    ("error", pa.string(), "error message of a failed episode (else null)"),
    ("policy_version", pa.uint32(), "the backend's weights version the episode began under"),
    ("max_turns", pa.int32(), "the horizon (null: none)"),
    ("env_kwargs", pa.string(), "the env's keyword arguments, JSON"),
    ("time_total_s", pa.float64(), "episode wall time"),
    ("time_gen_s", pa.float64(), "time spent waiting for the backend"),
    ("cut_turns", pa.uint32(), "replies cut at max_new_tokens that stepped the env"),
    ("invalid_turns", pa.uint32(), "turns whose action the env refused as unreadable"),
    ("undo_turns", pa.uint32(), "accepted undo turns (RolloutConfig.undo)"),
    ("attempts", pa.uint32(), "attempts played (RolloutConfig.reflection; 1 without a retry)"),
    ("attempt_return", pa.float32(), "the last attempt's return where the episode retried "
                                      "(reflection; its success is judged on it), else null"),
    ("plan_turns", pa.uint32(), "plan turns (RolloutConfig.plan; counted in num_turns, never "
                                "sent to the env)"),
    ("branch_parent", pa.uint32(), "branched groups (RolloutConfig.branch_at): sample_index of "
                                   "the sample that played the shared prefix (its own when "
                                   "not branched)"),
    ("branch_turn", pa.uint32(), "turns of the shared prefix (0: not branched)"),
    ("branch_pos", pa.uint32(), "tokens of the shared prefix (0: not branched; a child's "
                                "copy of it has loss mask 0)"),
    ("step_context", pa.list_(pa.uint32()), "bounded contexts (RolloutConfig.context_window): "
                                            "per reply, where its window resumes after the "
                                            "first prompt (empty: the whole record)"),
    ("step_reply", pa.list_(pa.uint32()), "per reply, its first token (bounded contexts)"),
    ("step_end", pa.list_(pa.uint32()), "per reply, the token after it (bounded contexts)"),
    ("messages", pa.list_(_MESSAGE), "decoded segments (role prompt | assistant | "
                                      "observation), only with messages=True, else null"),
    ("images", pa.list_(FRAME), "each distinct frame of an image episode once: hash, height, "
                                "width, RGB bytes row-major (empty: a text row)"),
    ("image_refs", pa.list_(pa.uint32()), "per image placeholder span of token_ids, in "
                                          "order, the index of its frame in images"),
)

SCHEMA = pa.schema([(n, t) for n, t, _ in FIELDS],
                   metadata={"agentgym.schema_version": str(SCHEMA_VERSION)})

#: ``STOP_REASONS`` as an Arrow array: a row's stop reason is ``take`` of its code.
_STOP_NAMES = pa.array(STOP_REASONS, pa.string())


def _packed_list(offsets: np.ndarray, values: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A list array over packed ``values`` and their int64 ``offsets`` (starting at 0), the
    buffers wrapped, not copied (the int32 offsets of ``list<>`` are the one conversion)."""
    if offsets[-1] > np.iinfo(np.int32).max:
        raise BatchFormatError(f"{offsets[-1]} values do not fit one shard's list column; "
                               "use a smaller shard_size")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)),
                                    pa.array(values.astype(typ.to_pandas_dtype(), copy=False),
                                             type=typ))


def _image_columns(images: Sequence[RowImages] | None, n: int) -> tuple[pa.Array, pa.Array]:
    """The ``images`` and ``image_refs`` columns of ``n`` rows' images (``None``: all rows
    without), built column-wise: one flat array per frame field, offsets per row."""
    if images is None:
        zeros = np.zeros(n + 1, np.int64)
        return (pa.ListArray.from_arrays(pa.array(zeros.astype(np.int32)), pa.array([], FRAME)),
                _packed_list(zeros, np.zeros(0, np.uint32), pa.uint32()))
    frames = [f for im in images for f in im.frames]
    frame_off = np.zeros(n + 1, np.int64)
    np.cumsum([len(im.frames) for im in images], out=frame_off[1:])
    ref_off = np.zeros(n + 1, np.int64)
    np.cumsum([len(im.refs) for im in images], out=ref_off[1:])
    refs = np.fromiter((r for im in images for r in im.refs), np.uint32, int(ref_off[-1]))
    total = sum(f.nbytes for f in frames)
    if total > np.iinfo(np.int32).max:
        raise BatchFormatError(f"{total} bytes of frames do not fit one shard's images column; "
                               "use a smaller shard_size")
    values = pa.StructArray.from_arrays(
        [pa.array([f.hash for f in frames], pa.string()),
         pa.array([f.height for f in frames], pa.uint32()),
         pa.array([f.width for f in frames], pa.uint32()),
         pa.array([f.data for f in frames], pa.binary())], fields=list(FRAME))
    return (pa.ListArray.from_arrays(pa.array(frame_off.astype(np.int32)), values),
            _packed_list(ref_off, refs, pa.uint32()))


def _row_images(table: pa.Table) -> list[RowImages] | None:
    """Each row's images from the ``images``/``image_refs`` columns; ``None`` when no row
    has one (or the columns are absent: shards before schema version 8)."""
    if "images" not in table.column_names or "image_refs" not in table.column_names:
        return None
    col = table.column("images").combine_chunks()
    refs = table.column("image_refs").combine_chunks()
    if isinstance(col, pa.ChunkedArray) or len(col.flatten()) == 0:  # no rows / no frames
        return None
    foff = col.offsets.to_numpy().astype(np.int64)
    flat = col.flatten()
    hashes, heights = flat.field("hash").to_pylist(), flat.field("height").to_pylist()
    widths, datas = flat.field("width").to_pylist(), flat.field("data").to_pylist()
    frames = [Frame(hash=h, height=y, width=x, data=d)
              for h, y, x, d in zip(hashes, heights, widths, datas)]
    roff = refs.offsets.to_numpy().astype(np.int64)
    ref_values = refs.flatten().to_numpy(zero_copy_only=False).astype(np.int64).tolist()
    f0, r0 = foff[0], roff[0]
    return [RowImages(frames[foff[i] - f0:foff[i + 1] - f0],
                      ref_values[roff[i] - r0:roff[i + 1] - r0]) for i in range(len(col))]


def decode_jsonl_frames(table: pa.Table) -> pa.Table:
    """A table read from JSONL with its frames' bytes decoded (JSON lines carry them
    base64-encoded, which the JSON reader leaves as text)."""
    if "images" not in table.column_names:
        return table
    col = table.column("images").combine_chunks()
    if isinstance(col, pa.ChunkedArray) or len(col.flatten()) == 0:
        return table
    flat = col.flatten()
    data = pa.array([base64.b64decode(b) for b in flat.field("data").to_pylist()], pa.binary())
    values = pa.StructArray.from_arrays(
        [flat.field("hash"), flat.field("height"), flat.field("width"), data],
        fields=list(FRAME))
    offsets = col.offsets.to_numpy().astype(np.int64)
    fixed = pa.ListArray.from_arrays(pa.array((offsets - offsets[0]).astype(np.int32)), values)
    i = table.column_names.index("images")
    return table.set_column(i, table.schema.field(i), fixed)


def _messages(packed: PackedBatch, tokenizer) -> list[list[dict]]:
    """Each row split at its loss-mask changes and decoded as is (template tokens kept): the
    first unmasked run is the prompt, masked runs are the model's replies, later unmasked
    runs the templated observations. A failed episode (all-zero mask) is one prompt
    segment."""
    out = []
    for b in range(len(packed)):
        a, z = int(packed.offsets[b]), int(packed.offsets[b + 1])
        ids, mask = packed.token_ids[a:z].tolist(), packed.loss_mask[a:z]
        cuts = [0, *(np.flatnonzero(np.diff(mask)) + 1).tolist(), z - a]
        segs = []
        for i, j in zip(cuts, cuts[1:]):
            if i == j:
                continue
            role = "assistant" if mask[i] else ("prompt" if i == 0 else "observation")
            segs.append({"role": role, "content": tokenizer.decode(ids[i:j])})
        out.append(segs)
    return out


def to_table(packed: PackedBatch, info: RowInfo, *, run_id: str, max_turns: int | None,
             env_kwargs: dict[str, Any], tokenizer=None) -> pa.Table:
    """The rows of a packed batch and their :class:`~agentgym.data.RowInfo` (row ``i`` of
    each is one trajectory) as one Arrow table of :data:`SCHEMA`. The token-level columns
    wrap the packed buffers; a row's key ``task_index`` is its ``group_id``. With a
    ``tokenizer``, ``messages`` holds the decoded segments."""
    n = len(packed)
    if len(info) != n:
        raise BatchFormatError(f"packed batch has {n} rows, its row info {len(info)}")
    tasks = info.task_id
    is_text = [isinstance(x, str) for x in tasks]
    tags = info.seat_info or [None] * n
    cols = {
        "run_id": pa.array([run_id] * n, pa.string()),
        "env_id": pa.array(info.env_id, pa.string()),
        "task_index": pa.array(packed.group_id.astype(np.int64)),
        "task_id": pa.array([None if s else int(x) for x, s in zip(tasks, is_text)], pa.int64()),
        "task_text": pa.array([x if s else None for x, s in zip(tasks, is_text)], pa.string()),
        "group_id": pa.array(packed.group_id, pa.uint64()),
        "sample_index": pa.array(packed.sample_index, pa.uint32()),
        "seat": pa.array(packed.seat, pa.uint32()),
        "episode_id": pa.array([None if g is None else g[0] for g in tags], pa.uint64()),
        "role": pa.array([None if g is None else g[1] for g in tags], pa.string()),
        "player": pa.array([None if g is None else g[2] for g in tags], pa.string()),
        "seed": pa.array(np.array(info.seed, np.uint64)),
        "token_ids": _packed_list(packed.offsets, packed.token_ids, pa.uint32()),
        "loss_mask": _packed_list(packed.offsets, packed.loss_mask, pa.uint8()),
        "logprobs": _packed_list(packed.offsets, packed.logprobs, pa.float32()),
        "prompt_len": pa.array(packed.prompt_len, pa.uint32()),
        "turn_rewards": _packed_list(packed.turn_offsets, packed.turn_rewards, pa.float32()),
        "reward": pa.array(packed.rewards, pa.float32()),
        "num_turns": pa.array(packed.num_turns, pa.uint32()),
        "stop_reason": _STOP_NAMES.take(pa.array(packed.stop_reason)),
        "error": pa.array(info.error, pa.string()),
        "policy_version": pa.array(packed.policy_version, pa.uint32()),
        "max_turns": pa.array([max_turns] * n, pa.int32()),
        "env_kwargs": pa.array([json.dumps(env_kwargs, sort_keys=True)] * n, pa.string()),
        "time_total_s": pa.array(info.time_total_s, pa.float64()),
        "time_gen_s": pa.array(info.time_gen_s, pa.float64()),
        "cut_turns": pa.array(info.cut_turns, pa.uint32()),
        "invalid_turns": pa.array(info.invalid_turns, pa.uint32()),
        "undo_turns": pa.array(info.undo_turns, pa.uint32()),
        "attempts": pa.array(info.attempts, pa.uint32()),
        "attempt_return": pa.array(info.attempt_return, pa.float32()),
        "plan_turns": pa.array(info.plan_turns, pa.uint32()),
        "branch_parent": pa.array(packed.branch_parent, pa.uint32()),
        "branch_turn": pa.array(packed.branch_turn, pa.uint32()),
        "branch_pos": pa.array(packed.branch_pos, pa.uint32()),
        **{name: _packed_list(packed.step_offsets, getattr(packed, name), pa.uint32())
           for name in STEP_FIELDS},
        "messages": (pa.array(_messages(packed, tokenizer), pa.list_(_MESSAGE))
                     if tokenizer is not None else pa.nulls(n, pa.list_(_MESSAGE))),
    }
    cols["images"], cols["image_refs"] = _image_columns(packed.images, n)
    return pa.Table.from_arrays([cols[name] for name, _, _ in FIELDS], schema=SCHEMA)


def trajectories_table(trajs: Sequence[Trajectory], **kwargs: Any) -> pa.Table:
    """:func:`to_table` of trajectories (packed with :func:`~agentgym.data.pack`; raises
    :class:`~agentgym.data.BatchFormatError` on inconsistent lists or an unknown stop
    reason)."""
    return to_table(pack(trajs), RowInfo.of(trajs), **kwargs)


_encoder = msgspec.json.Encoder()


def to_jsonl(table: pa.Table) -> bytes:
    """The table's rows as JSON lines (same field names and values as the Parquet rows)."""
    rows = table.to_pylist()
    return b"".join(_encoder.encode(r) + b"\n" for r in rows)


def from_table(table: pa.Table) -> tuple[PackedBatch, RowInfo]:
    """The rows of a run table as a packed batch and its row info, column by column (the
    inverse of :func:`to_table`; ``messages``, ``run_id``, ``max_turns`` and
    ``env_kwargs`` are not kept)."""

    def listed(name: str, dtype) -> tuple[np.ndarray, np.ndarray]:
        col = table.column(name).combine_chunks()
        if isinstance(col, pa.ChunkedArray):  # no rows
            col = pa.array([], col.type)
        offsets = col.offsets.to_numpy().astype(np.int64)
        values = col.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
        return offsets - offsets[0], values[offsets[0]:offsets[-1]]

    def plain(name: str, dtype) -> np.ndarray:
        return table.column(name).to_numpy().astype(dtype, copy=False)

    offsets, token_ids = listed("token_ids", np.uint32)
    _, loss_mask = listed("loss_mask", np.uint8)
    _, logprobs = listed("logprobs", np.float32)
    turn_offsets, turn_rewards = listed("turn_rewards", np.float32)
    codes = {name: i for i, name in enumerate(STOP_REASONS)}
    try:
        stops = np.array([codes[r] for r in table.column("stop_reason").to_pylist()], np.uint8)
    except KeyError as e:
        raise BatchFormatError(f"unknown stop reason {e.args[0]!r}") from None
    sample_index = plain("sample_index", np.uint32)
    if "branch_pos" in table.column_names:
        branch = {name: plain(name, np.uint32)
                  for name in ("branch_parent", "branch_turn", "branch_pos")}
    else:  # shards of schema versions 2-4 (before branched groups): unbranched rows
        zeros = np.zeros(table.num_rows, np.uint32)
        branch = {"branch_parent": sample_index, "branch_turn": zeros, "branch_pos": zeros}
    steps = {}
    if "step_reply" in table.column_names:  # absent before schema version 6: no steps
        steps["step_offsets"], steps["step_context"] = listed("step_context", np.uint32)
        steps["step_reply"] = listed("step_reply", np.uint32)[1]
        steps["step_end"] = listed("step_end", np.uint32)[1]
    seats = {}
    if "seat" in table.column_names:  # absent before schema version 7: single-agent rows
        seats["seat"] = plain("seat", np.uint32)
    packed = PackedBatch.from_dict({
        **branch, **steps, **seats,
        "token_ids": token_ids, "offsets": offsets, "loss_mask": loss_mask,
        "logprobs": logprobs, "rewards": plain("reward", np.float32),
        "turn_rewards": turn_rewards, "turn_offsets": turn_offsets,
        "num_turns": plain("num_turns", np.uint32), "stop_reason": stops,
        "group_id": plain("group_id", np.uint64),
        "sample_index": sample_index,
        "policy_version": plain("policy_version", np.uint32),
        "prompt_len": plain("prompt_len", np.uint32),
        # absent before schema version 8: rows without images
        "images": _row_images(table)})
    task_id, task_text = table.column("task_id").to_pylist(), \
        table.column("task_text").to_pylist()
    info = RowInfo(
        env_id=table.column("env_id").to_pylist(),
        task_id=[text if i is None else i for i, text in zip(task_id, task_text)],
        seed=table.column("seed").to_pylist(), error=table.column("error").to_pylist(),
        time_total_s=table.column("time_total_s").to_pylist(),
        time_gen_s=table.column("time_gen_s").to_pylist(),
        cut_turns=table.column("cut_turns").to_pylist(),
        invalid_turns=table.column("invalid_turns").to_pylist(),
        # absent from shards of schema version 2 (before undo): none
        undo_turns=(table.column("undo_turns").to_pylist()
                    if "undo_turns" in table.column_names else [0] * table.num_rows),
        # absent from shards of schema versions 2 and 3 (before reflection): one attempt
        attempts=(table.column("attempts").to_pylist()
                  if "attempts" in table.column_names else [1] * table.num_rows),
        # absent from shards before schema version 5 (before planning): none
        plan_turns=(table.column("plan_turns").to_pylist()
                    if "plan_turns" in table.column_names else [0] * table.num_rows),
        # absent before schema version 6: judged on the reward
        attempt_return=(table.column("attempt_return").to_pylist()
                        if "attempt_return" in table.column_names else [None] * table.num_rows))
    if "role" in table.column_names and table.column("role").null_count < table.num_rows:
        info.seat_info = [None if r is None else (e, r, p) for e, r, p in zip(
            table.column("episode_id").to_pylist(), table.column("role").to_pylist(),
            table.column("player").to_pylist())]
    return packed, info


def rows_to_trajectories(table: pa.Table) -> list[Trajectory]:
    """The rows of a run table as :class:`Trajectory` objects (:func:`from_table`, then
    :func:`~agentgym.data.trajectories.unpack`)."""
    return unpack(*from_table(table))
