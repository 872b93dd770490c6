"""A run folder in a trainer's shape: ``verl`` (one ``AgentLoopOutput`` row per trajectory),
``skyrl`` (``GeneratorOutput``'s fields, one row per trajectory) or ``trl`` (pre-tokenized
``input_ids`` + ``assistant_masks``), written as Parquet shards, one per run shard (memory:
one shard). The conversions are :mod:`agentgym.data.exports`. A trajectory played with a
bounded context (``RolloutConfig.context_window``) becomes one row per reply: the context the
backend was sent and the reply, with the episode's reward (what the learner trains). A verl
row of an image episode also has ``images`` (:func:`agentgym.data.exports.verl_images`: one
PNG per image span, in order); skyrl and trl rows carry no pictures."""

from __future__ import annotations

import json
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
    "verl": lambda trajs: _verl_rows(trajs),
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


def _verl_rows(trajs: list[Trajectory]) -> list[dict[str, Any]]:
    """verl rows; when any row of the shard has ``images``, every row has the column (a
    text row's empty), so that the shard's schema does not depend on its first row."""
    rows = [exports.to_verl(t) for t in trajs]
    if any("images" in r for r in rows):
        for r in rows:
            r.setdefault("images", [])
    return rows


#: A verl row's ``images``: Hugging Face ``datasets``' ``Image`` feature's storage.
_IMAGES = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
#: The schema metadata that makes ``datasets`` read ``images`` as a list of ``Image``
#: features (decoded to PIL images), the other columns as they are.
_HF_IMAGES = json.dumps({"info": {"features": {"images": [{"_type": "Image"}]}}})


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    table = pa.Table.from_pylist(rows)
    if "images" in table.column_names:
        i = table.column_names.index("images")
        table = table.set_column(i, pa.field("images", _IMAGES),
                                 table.column(i).cast(_IMAGES))
        table = table.replace_schema_metadata({"huggingface": _HF_IMAGES})
    return table


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
        table = _table(TARGETS[to](trajs))
        atomic_write(dst / f"part-{i:06d}.parquet", lambda fh, t=table: pq.write_table(t, fh))
        rows += table.num_rows
    return {"rows": rows, "shards": len(src), "out": str(dst), "to": to}
