"""A run folder in a trainer's shape: ``verl`` (one ``AgentLoopOutput`` row per trajectory),
``skyrl`` (``GeneratorOutput``'s fields, one row per trajectory) or ``trl`` (pre-tokenized
``input_ids`` + ``assistant_masks``), written as Parquet shards, one per run shard (memory:
one shard). The conversions are :mod:`agentgym.data.exports`. A trajectory played with a
bounded context (``RolloutConfig.context_window``) becomes one row per reply: the context the
backend was sent and the reply, with the episode's reward (what the learner trains). A verl
row of an image episode also has ``images`` (:func:`agentgym.data.exports.verl_images`: one
PNG per image span, in order); skyrl and trl rows carry no pictures. A verl row also keeps
its key, ``task_index``, ``sample_index`` and ``group_id`` (extra columns verl ignores), so
that a row can be traced back to its run row and grouped.

The output folder must be new or empty: an export never mixes with another one's shards
(``overwrite=True`` replaces an earlier export, a folder of ``part-NNNNNN.parquet`` files
and nothing else)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from agentgym.collection.schema import from_table
from agentgym.collection.store import atomic_write, read_shard, shard_files
from agentgym.data import exports
from agentgym.data.trajectories import Trajectory, unpack
from agentgym.errors import ConfigError, OutputPathError

__all__ = ["TARGETS", "export_run"]

#: target name -> rows of one shard's trajectories (and each one's ``task_index``).
TARGETS = {
    "verl": lambda trajs, keys: _verl_rows(trajs, keys),
    "skyrl": lambda trajs, keys: _columns_to_rows(exports.to_skyrl(trajs)),
    "trl": lambda trajs, keys: [exports.to_trl(t) for t in trajs],
}

#: What an earlier export's folder holds: its shards (and a crash's hidden temporaries).
_EXPORT_FILE = re.compile(r"^(part-\d{6}\.parquet|\..*\.tmp)$")


def _samples(table: pa.Table) -> tuple[list[Trajectory], list[int]]:
    """A shard's trajectories, each played with a bounded context as its per-reply samples
    (:meth:`~agentgym.data.PackedBatch.step_samples`), and each one's ``task_index``."""
    packed, info = from_table(table)
    keys = table.column("task_index").to_pylist()
    if packed.has_steps:
        packed, _, row = packed.step_samples()
        info = info.select(row.tolist())
        keys = [keys[r] for r in row.tolist()]
    return unpack(packed, info), keys


def _verl_rows(trajs: list[Trajectory], keys: list[int]) -> list[dict[str, Any]]:
    """verl rows with their key (``task_index``, ``sample_index``) and ``group_id``; when any
    row of the shard has ``images``, every row has the column (a text row's empty), so that
    the shard's schema does not depend on its first row."""
    rows = [{**exports.to_verl(t), "task_index": k} for t, k in zip(trajs, keys)]
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


def _inside(a: Path, b: Path) -> bool:
    """``a`` is ``b`` or inside it."""
    return a == b or b in a.parents


def _prepare_out(run_dir: Path, dst: Path, overwrite: bool) -> None:
    """Check the output folder (new, or empty; with ``overwrite`` an earlier export, which
    is cleared) before anything is written."""
    src, out = run_dir.resolve(), dst.resolve()
    if _inside(out, src) or _inside(src, out):
        raise OutputPathError(f"--output {dst}: the export cannot go into the run folder {run_dir} "
                              "or a folder around it; choose another --output folder")
    if dst.exists() and not dst.is_dir():
        raise OutputPathError(f"--output {dst} is an existing file; expected a folder")
    held = sorted(f.name for f in dst.iterdir()) if dst.is_dir() else []
    if not held:
        return
    if not overwrite:
        raise OutputPathError(f"--output {dst} is not empty ({len(held)} entries, e.g. {held[0]}): "
                              "choose another folder, or pass --overwrite to replace an "
                              "earlier export there")
    other = [n for n in held if not _EXPORT_FILE.match(n) or not (dst / n).is_file()]
    if other:
        raise OutputPathError(f"--output {dst} holds files no export wrote (e.g. {other[0]}): "
                              "--overwrite replaces an earlier export only; choose another "
                              "folder")
    for name in held:
        (dst / name).unlink()


def export_run(run_dir: str | os.PathLike, to: str, out: str | os.PathLike, *,
               overwrite: bool = False) -> dict[str, Any]:
    """Convert every shard of ``run_dir`` to ``to`` (``verl`` | ``skyrl`` | ``trl``) into
    ``out/part-NNNNNN.parquet``; returns ``{"rows", "shards", "out", "to"}``.

    ``out`` must be new or empty (an :class:`~agentgym.errors.OutputPathError` otherwise,
    before anything is written); ``overwrite=True`` first clears an earlier export there (a
    folder of ``part-NNNNNN.parquet`` files and nothing else). ``run_dir`` without shards is
    a :class:`~agentgym.errors.ConfigError`."""
    if to not in TARGETS:
        raise ConfigError(f"unknown export target {to!r}; expected one of {sorted(TARGETS)}")
    run = Path(run_dir)
    if not run.is_dir():
        raise ConfigError(f"RUN_DIR {run_dir}: no such folder (a folder written by "
                          "agentgym-rl collect)")
    src = shard_files(run)
    if not src:
        raise ConfigError(f"RUN_DIR {run_dir} holds no shards (part-NNNNNN.parquet|jsonl): "
                          "not a folder written by agentgym-rl collect, or one with no rows "
                          "yet")
    dst = Path(out)
    _prepare_out(run, dst, overwrite)
    try:
        dst.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputPathError(f"--output {dst}: cannot create it ({e.strerror or e})") from e
    rows = 0
    for i, f in enumerate(src):
        trajs, keys = _samples(read_shard(f))
        table = _table(TARGETS[to](trajs, keys))
        atomic_write(dst / f"part-{i:06d}.parquet", lambda fh, t=table: pq.write_table(t, fh))
        rows += table.num_rows
    return {"rows": rows, "shards": len(src), "out": str(dst), "to": to}
