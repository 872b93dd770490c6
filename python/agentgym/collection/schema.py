"""The one row schema of a collection run: one row per trajectory, the same fields in
Parquet and JSONL.

A row's key is (``task_index``, ``sample_index``): ``task_index`` is the task's position in
the run's task list (recorded in ``metadata.json``), which is also its ``group_id``, so
a resumed run gives every key the same episode seed. ``SCHEMA_VERSION`` changes only when a
field is added, removed or retyped; Parquet shards carry it in their schema metadata
(``agentgym.schema_version``) and ``metadata.json`` records it.

Rows are built column-wise: each token-level field of a shard becomes one flat buffer and
an Arrow list array over it (the packed layout of :class:`~agentgym.data.PackedBatch`),
with no per-row Python dicts.
"""

from __future__ import annotations

import array
import json
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from agentgym.data.trajectories import STOP_CODES, BatchFormatError, PackedBatch, Trajectory

__all__ = ["FIELDS", "SCHEMA", "SCHEMA_VERSION", "rows_to_trajectories", "to_jsonl",
           "to_table"]

SCHEMA_VERSION = 1

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])

#: (name, Arrow type, description): the documented schema, in column order.
FIELDS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("run_id", pa.string(), "the run's id (metadata.json)"),
    ("env_id", pa.string(), "environment id"),
    ("task_index", pa.int64(), "position of the task in the run's task list (the key)"),
    ("task_id", pa.int64(), "the env's task index (null for a task given as text)"),
    ("task_text", pa.string(), "the task text (null for a task index)"),
    ("group_id", pa.uint64(), "GRPO group: equals task_index"),
    ("sample_index", pa.uint32(), "sample within the group (the key)"),
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
    ("messages", pa.list_(_MESSAGE), "decoded segments (role prompt | assistant | "
                                      "observation), only with messages=True, else null"),
)

SCHEMA = pa.schema([(n, t) for n, t, _ in FIELDS],
                   metadata={"agentgym.schema_version": str(SCHEMA_VERSION)})


def _list(lengths: np.ndarray, values: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A list array of consecutive runs of ``lengths`` values each."""
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return _packed_list(offsets, values, typ)


def _packed_list(offsets: np.ndarray, values: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A list array over packed ``values`` and their int64 ``offsets`` (starting at 0), the
    buffers wrapped, not copied (the int32 offsets of ``list<>`` are the one conversion)."""
    if offsets[-1] > np.iinfo(np.int32).max:
        raise BatchFormatError(f"{offsets[-1]} values do not fit one shard's list column; "
                               "use a smaller shard_size")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)),
                                    pa.array(values.astype(typ.to_pandas_dtype(), copy=False),
                                             type=typ))


def _flat(lists: Sequence[Sequence], code: str, dtype) -> np.ndarray:
    """The concatenation of ``lists`` as one numpy array (``array.array`` converts Python
    ints and floats in C, about twice as fast as ``np.asarray`` per list)."""
    if code == "B":  # 0/1 masks: bytes() of a list of small ints is a C loop
        return np.frombuffer(b"".join(map(bytes, lists)), np.uint8)
    a = array.array(code)
    for x in lists:
        a.extend(x)
    return np.frombuffer(a, dtype) if len(a) else np.zeros(0, dtype)


def _messages(trajs: Sequence[Trajectory], tokenizer) -> list[list[dict]]:
    """Each trajectory split at its loss-mask changes and decoded as is (template tokens
    kept): the first unmasked run is the prompt, masked runs are the model's replies, later
    unmasked runs the templated observations. A failed episode (all-zero mask) is one
    prompt segment."""
    out = []
    for t in trajs:
        mask, ids = t.loss_mask, t.token_ids
        segs, start = [], 0
        for i in range(1, len(ids) + 1):
            if i == len(ids) or mask[i] != mask[start]:
                role = "assistant" if mask[start] else ("prompt" if start == 0 else
                                                        "observation")
                segs.append({"role": role, "content": tokenizer.decode(ids[start:i])})
                start = i
        out.append(segs)
    return out


def _token_columns(trajs: Sequence[Trajectory]) -> dict[str, pa.Array]:
    """``token_ids``, ``loss_mask``, ``logprobs`` and ``turn_rewards`` from the trajectories'
    lists."""
    n = len(trajs)
    lens = np.fromiter((len(t.token_ids) for t in trajs), np.int64, n)
    for name in ("loss_mask", "logprobs"):
        other = np.fromiter((len(getattr(t, name)) for t in trajs), np.int64, n)
        if (other != lens).any():
            i = int(np.flatnonzero(other != lens)[0])
            raise BatchFormatError(f"trajectory {i}: {name} has {other[i]} entries, "
                                   f"token_ids has {lens[i]}")
    turns = [t.turn_rewards for t in trajs]
    return {
        "token_ids": _list(lens, _flat([t.token_ids for t in trajs], "I", np.uint32),
                           pa.uint32()),
        "loss_mask": _list(lens, _flat([t.loss_mask for t in trajs], "B", np.uint8),
                           pa.uint8()),
        "logprobs": _list(lens, _flat([t.logprobs for t in trajs], "f", np.float32),
                          pa.float32()),
        "turn_rewards": _list(np.fromiter(map(len, turns), np.int64, n),
                              _flat(turns, "f", np.float32), pa.float32()),
    }


def _packed_columns(packed: PackedBatch) -> dict[str, pa.Array]:
    """The same four columns over a packed batch's buffers."""
    return {
        "token_ids": _packed_list(packed.offsets, packed.token_ids, pa.uint32()),
        "loss_mask": _packed_list(packed.offsets, packed.loss_mask, pa.uint8()),
        "logprobs": _packed_list(packed.offsets, packed.logprobs, pa.float32()),
        "turn_rewards": _packed_list(packed.turn_offsets, packed.turn_rewards, pa.float32()),
    }


def to_table(trajs: Sequence[Trajectory], run_id: str, task_index: Sequence[int],
             max_turns: int | None, env_kwargs: dict[str, Any],
             tokenizer=None, packed: PackedBatch | None = None) -> pa.Table:
    """The rows of ``trajs`` (``task_index[i]`` is trajectory ``i``'s key) as one Arrow table
    of :data:`SCHEMA`; with a ``tokenizer``, ``messages`` holds the decoded segments.

    ``packed``: the same trajectories' rows packed (row ``i`` is ``trajs[i]``, as
    :meth:`~agentgym.engine.RolloutEngine.stream_batches` hands them): the token-level
    columns are built over its buffers instead of from the trajectories' lists (same
    table)."""
    n = len(trajs)
    if packed is not None and len(packed) != n:
        raise BatchFormatError(f"packed batch has {len(packed)} rows for {n} trajectories")
    unknown = {t.stop_reason for t in trajs} - STOP_CODES.keys()
    if unknown:
        raise BatchFormatError(f"unknown stop reason {sorted(unknown)[0]!r}; expected one of "
                               f"{tuple(STOP_CODES)}")
    token_cols = _token_columns(trajs) if packed is None else _packed_columns(packed)
    tasks = [t.task_id for t in trajs]
    is_text = [isinstance(x, str) for x in tasks]
    cols = {
        "run_id": pa.array([run_id] * n, pa.string()),
        "env_id": pa.array([t.env_id for t in trajs], pa.string()),
        "task_index": pa.array(np.asarray(task_index, np.int64)),
        "task_id": pa.array([None if s else int(x) for x, s in zip(tasks, is_text)], pa.int64()),
        "task_text": pa.array([x if s else None for x, s in zip(tasks, is_text)], pa.string()),
        "group_id": pa.array([t.group_id for t in trajs], pa.uint64()),
        "sample_index": pa.array([t.sample_index for t in trajs], pa.uint32()),
        "seed": pa.array(np.fromiter((t.seed for t in trajs), np.uint64, n)),
        **token_cols,
        "prompt_len": pa.array([t.prompt_len for t in trajs], pa.uint32()),
        "reward": pa.array([t.reward for t in trajs], pa.float32()),
        "num_turns": pa.array([t.num_turns for t in trajs], pa.uint32()),
        "stop_reason": pa.array([t.stop_reason for t in trajs], pa.string()),
        "error": pa.array([t.error for t in trajs], pa.string()),
        "policy_version": pa.array([t.policy_version for t in trajs], pa.uint32()),
        "max_turns": pa.array([max_turns] * n, pa.int32()),
        "env_kwargs": pa.array([json.dumps(env_kwargs, sort_keys=True)] * n, pa.string()),
        "time_total_s": pa.array([t.timings.get("total_s", 0.0) for t in trajs], pa.float64()),
        "time_gen_s": pa.array([t.timings.get("gen_s", 0.0) for t in trajs], pa.float64()),
        "messages": (pa.array(_messages(trajs, tokenizer), pa.list_(_MESSAGE))
                     if tokenizer is not None else pa.nulls(n, pa.list_(_MESSAGE))),
    }
    return pa.Table.from_arrays([cols[name] for name, _, _ in FIELDS], schema=SCHEMA)


_encoder = msgspec.json.Encoder()


def to_jsonl(table: pa.Table) -> bytes:
    """The table's rows as JSON lines (same field names and values as the Parquet rows)."""
    rows = table.to_pylist()
    return b"".join(_encoder.encode(r) + b"\n" for r in rows)


def rows_to_trajectories(table: pa.Table) -> list[Trajectory]:
    """The rows of a run table as :class:`Trajectory` objects (``messages`` is dropped)."""
    out = []
    for r in table.drop_columns([c for c in ("messages",) if c in table.column_names]) \
            .to_pylist():
        out.append(Trajectory(
            task_id=r["task_text"] if r["task_id"] is None else r["task_id"],
            env_id=r["env_id"], group_id=r["group_id"], sample_index=r["sample_index"],
            token_ids=r["token_ids"], loss_mask=r["loss_mask"], logprobs=r["logprobs"],
            prompt_len=r["prompt_len"], turn_rewards=r["turn_rewards"], reward=r["reward"],
            num_turns=r["num_turns"], stop_reason=r["stop_reason"],
            policy_version=r["policy_version"],
            timings={"total_s": r["time_total_s"], "gen_s": r["time_gen_s"]},
            seed=r["seed"], error=r["error"]))
    return out
