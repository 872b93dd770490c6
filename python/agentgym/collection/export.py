"""A run folder in a trainer's shape: ``verl`` (one ``AgentLoopOutput`` row per trajectory),
``skyrl`` (``GeneratorOutput``'s fields, one row per trajectory) or ``trl`` (pre-tokenized
``input_ids`` + ``assistant_masks``), written as Parquet shards, one per run shard (memory:
one shard). The conversions are :mod:`agentgym.data.exports`. A trajectory played with a
bounded context (``RolloutConfig.context_window``) becomes one row per reply: the context the
backend was sent and the reply, with the episode's reward (what the learner trains)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from agentgym.collection.schema import from_table
from agentgym.collection.store import atomic_write, read_shard, shard_files
from agentgym.data import exports
from agentgym.data.trajectories import Trajectory, unpack

__all__ = ["TARGETS", "export_run"]

#: target name -> rows of one shard's trajectories.
TARGETS = {
    "verl": lambda trajs: [exports.to_verl(t) for t in trajs],
    "skyrl": lambda trajs: _columns_to_rows(exports.to_skyrl(trajs)),
    "trl": lambda trajs: [exports.to_trl(t) for t in trajs],
}


def _samples(table: pa.Table) -> list[Trajectory]:
    """A shard's trajectories, each played with a bounded context as its per-reply samples
    (:meth:`~agentgym.data.PackedBatch.step_samples`)."""
    packed, info = from_table(table)
    if packed.has_steps:
        packed, _, row = packed.step_samples()
        info = info.select(row.tolist())
    return unpack(packed, info)


def _columns_to_rows(cols: dict[str, list]) -> list[dict[str, Any]]:
    names = list(cols)
    return [dict(zip(names, vals)) for vals in zip(*(cols[n] for n in names))]


def export_run(run_dir: str | os.PathLike, to: str, out: str | os.PathLike) -> dict[str, Any]:
    """Convert every shard of ``run_dir`` to ``to`` (``verl`` | ``skyrl`` | ``trl``) into
    ``out/part-NNNNNN.parquet``; returns ``{"rows", "shards", "out"}``."""
    if to not in TARGETS:
        raise ValueError(f"unknown export target {to!r}; expected one of {sorted(TARGETS)}")
    src = shard_files(run_dir)
    if not src:
        raise FileNotFoundError(f"{run_dir} holds no shards (part-NNNNNN.parquet|jsonl)")
    dst = Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    rows = 0
    for i, f in enumerate(src):
        trajs = _samples(read_shard(f))
        table = pa.Table.from_pylist(TARGETS[to](trajs))
        atomic_write(dst / f"part-{i:06d}.parquet", lambda fh, t=table: pq.write_table(t, fh))
        rows += table.num_rows
    return {"rows": rows, "shards": len(src), "out": str(dst), "to": to}
