"""A collection run's folder: shards, ``manifest.json``, ``metadata.json``, resume.

Layout of a run folder::

    part-000000.parquet ...     the shards (or part-NNNNNN.jsonl): rows of the schema
    .agentgym/metadata.json     how the run was made (identity, tasks, command line, versions)
    .agentgym/manifest.json     the committed shards, their row counts, whether it is complete
    .agentgym/summary.json      the last summary (written when a run ends)
    .agentgym/lock              held (flock) while a collector writes the folder

The bookkeeping lives in a hidden folder so that every reader that takes a whole folder
(``pyarrow.dataset``, ``datasets.load_dataset("parquet", data_dir=...)``, polars) matches
only shards: they skip hidden names.

Invariants:

* A shard becomes visible only complete: it is written under a hidden temporary name,
  flushed and fsynced, renamed onto its final name, the folder fsynced, and then the manifest
  is rewritten the same way. A crash leaves at most a hidden ``.*.tmp`` file, which readers
  never match and the next open deletes; a shard renamed but not yet in the manifest is
  complete and is adopted by the next open.
* Every key (``task_index``, ``sample_index``) is in at most one visible shard at every
  moment (a game episode's key has one row per seat, all in that shard). ``drop_failed``
  (``--retry-failed``) rewrites a shard in place (``os.replace`` of a complete temporary
  file onto the same name) without its failed rows; the keys it drops
  are missing, and the next rows for them land in new shards. So a plain reader of the
  folder (pyarrow, ``datasets``, polars) sees each key exactly once when a run is complete.
* Opening an existing folder with a different identity (env, env kwargs, model, tokenizer,
  sampling, task list, format or schema version) raises :class:`RunMismatchError` before
  anything is changed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from agentgym.collection.progress import STATS_COLUMNS, shard_stats
from agentgym.collection.schema import (
    FIELDS,
    SCHEMA,
    SCHEMA_VERSION,
    decode_jsonl_frames,
    to_jsonl,
)
from agentgym.data.trajectories import FAILED_STOP_REASONS
from agentgym.errors import UsageError
from agentgym.runtime.files import fsync_dir

__all__ = [
    "CollectionError",
    "DiskFullError",
    "OutputNotWritableError",
    "RunLockedError",
    "RunMismatchError",
    "PreparedShard",
    "RunStore",
    "ShardError",
    "read_run",
]

log = logging.getLogger(__name__)

FORMATS = ("parquet", "jsonl")
#: The run folder's bookkeeping folder (hidden: whole-folder readers skip it).
META_DIR = ".agentgym"
_SHARD = re.compile(r"^part-(\d{6})\.(parquet|jsonl)$")
#: Columns Parquet dictionary-encodes: all but the long token-level lists, where after zstd
#: it saves little or no space and costs a quarter to a third of a shard's encoding time
#: (TextCraft and maze shards of the tiny model).
#: Frames (``images``) are not dictionary-encoded either: each is stored once per row already.
_DICTIONARY_COLUMNS = [n for n, _, _ in FIELDS if n not in ("token_ids", "loss_mask",
                                                           "logprobs", "images")]
#: Free bytes a shard write requires before it starts (else :class:`DiskFullError`).
MIN_FREE_BYTES = 16 << 20


class CollectionError(UsageError):
    """A collection run cannot go on (the message says why and what to do, in one line: the
    command line prints it as is and exits 2)."""


class RunMismatchError(CollectionError):
    """The output folder holds a run made differently (another env, model, schema, ...)."""


class OutputNotWritableError(CollectionError):
    """The output folder cannot be created or written."""


class DiskFullError(CollectionError):
    """No space left for the next shard; the committed shards are intact."""


class RunLockedError(CollectionError):
    """Another collector is writing the same folder."""


class ShardError(CollectionError):
    """A shard of the folder is unreadable or repeats a key of another shard; the message
    names the shard to delete (its keys are then played again on resume)."""

#: What a :class:`ShardError` tells the user to do.
_SHARD_FIX = ("delete that shard and run the same collect command again: its keys are "
              "played again")


def _open_temp(path: Path):
    """The file a temporary write goes to: an Arrow ``OSFile``, so that Parquet encodes
    straight into it with the GIL released (one place, so a test can point it at
    ``/dev/full`` to get a real ENOSPC)."""
    return pa.OSFile(str(path), "wb")


def atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """Write ``path`` so that it appears only complete: ``write(f)`` into a hidden
    temporary file beside it, flush, fsync, rename onto ``path``, fsync the folder.
    ENOSPC/EDQUOT raise :class:`DiskFullError`; the temporary file is removed on any error."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with _open_temp(tmp) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(f"no space left on the device of {path.parent} while writing "
                                f"{path.name}; the committed shards are intact: free space "
                                "and run the same command again to resume") from e
        if isinstance(e, OSError):
            raise OutputNotWritableError(f"cannot write {path}: {e}") from e
        raise


def _write_json(path: Path, obj: Any) -> None:
    data = (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()
    atomic_write(path, lambda f: f.write(data))


def shard_files(path: str | os.PathLike) -> list[Path]:
    """The visible shards of a run folder, in sequence order."""
    p = Path(path)
    return sorted((f for f in p.iterdir() if _SHARD.match(f.name)), key=lambda f: f.name)


def read_shard(path: Path, columns: list[str] | None = None) -> pa.Table:
    """One shard as an Arrow table of the run schema (``columns``: only those)."""
    try:
        if path.suffix == ".parquet":
            return pq.read_table(path, columns=columns)
        table = decode_jsonl_frames(pajson.read_json(
            path, parse_options=pajson.ParseOptions(explicit_schema=SCHEMA)))
        return table.select(columns) if columns else table
    except (pa.ArrowException, OSError) as e:
        why = " ".join(str(e).split())
        raise ShardError(f"shard {path} is unreadable ({why}); {_SHARD_FIX}") from e


def read_run(path: str | os.PathLike, columns: list[str] | None = None) -> Iterator[pa.Table]:
    """The run folder's shards one table at a time (memory: one shard)."""
    for f in shard_files(path):
        yield read_shard(f, columns)


class RunStore:
    """The shards, manifest and metadata of one run folder, opened for writing.

    ``identity``: what makes rows of this run comparable (env, env kwargs, model, tokenizer
    hash, sampling, task list, ...); a new folder records it in ``metadata.json`` (with
    ``metadata``, the run's description), an existing one must match it. ``compression``:
    Parquet codec.
    """

    def __init__(self, path: str | os.PathLike, identity: dict[str, Any], *,
                 fmt: str = "parquet", metadata: dict[str, Any] | None = None,
                 compression: str = "zstd", min_free_bytes: int = MIN_FREE_BYTES):
        if fmt not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
        self.path = Path(path)
        self.meta_dir = self.path / META_DIR
        self.fmt = fmt
        self.compression = compression
        self.min_free_bytes = min_free_bytes
        self.identity = json.loads(json.dumps({**identity, "format": fmt,
                                               "schema_version": SCHEMA_VERSION}))
        #: this open made the folder / the run (its metadata): :meth:`discard` undoes them
        self.made_folder = not self.path.exists()
        self.new_run = False
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputNotWritableError(f"cannot create the output folder {self.path}: {e}") \
                from e
        self._lock_fd = self._lock()
        try:
            self._open(metadata or {})
        except BaseException:
            self.close()
            raise

    # -- opening ------------------------------------------------------------------------
    def _lock(self) -> int:
        try:
            self.meta_dir.mkdir(exist_ok=True)
            fd = os.open(self.meta_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise OutputNotWritableError(f"cannot write in the output folder {self.path}: {e}") \
                from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLockedError(f"another collector is writing {self.path}") from None
        return fd

    def _open(self, metadata: dict[str, Any]) -> None:
        meta_path = self.meta_dir / "metadata.json"
        if meta_path.exists():
            meta = json.loads(meta_path.read_text())
            old = meta.get("identity", {})
            diff = sorted(k for k in set(old) | set(self.identity)
                          if old.get(k) != self.identity.get(k))
            if diff:
                fields = "; ".join(f"{k}: existing {old.get(k)!r}, requested "
                                   f"{self.identity.get(k)!r}" for k in diff)
                raise RunMismatchError(
                    f"{self.path} holds a different run ({fields}): choose another --output "
                    "folder, or the same settings to resume it")
            self.metadata = meta
        else:
            if any(_SHARD.match(f.name) for f in self.path.iterdir()):
                raise RunMismatchError(f"{self.path} holds shards but no {META_DIR}/metadata.json: "
                                       "not a folder this collector wrote; choose another "
                                       "--output folder")
            self.metadata = {"run_id": uuid.uuid4().hex[:12],
                             **json.loads(json.dumps(metadata)), "identity": self.identity,
                             "schema_version": SCHEMA_VERSION, "format": self.fmt,
                             "created_at": time.time()}
            _write_json(meta_path, self.metadata)
            self.new_run = True
        self.run_id: str = self.metadata.get("run_id", "")
        for d in (self.path, self.meta_dir):  # temporaries of an interrupted write
            for f in d.iterdir():
                if f.name.startswith(".") and f.name.endswith(".tmp"):
                    f.unlink()
        self._reconcile()

    def _reconcile(self) -> None:
        """Make the manifest list exactly the visible shards (adopting a shard renamed before
        a crash let the manifest record it) and load every key's state."""
        man_path = self.meta_dir / "manifest.json"
        listed = {}
        if man_path.exists():
            listed = {s["name"]: s for s in json.loads(man_path.read_text()).get("shards", [])}
        self.shards: list[dict[str, Any]] = []
        tasks, samples, failed, seats = [], [], [], []
        for f in shard_files(self.path):
            if not f.name.endswith(self.fmt):
                raise RunMismatchError(f"{self.path} holds {f.name}, not a {self.fmt} shard")
            known = listed.get(f.name, {}).get("stats")
            t = read_shard(f, ["task_index", "sample_index", "seat"]
                           + (["stop_reason"] if known else STATS_COLUMNS))
            seats.append(t.column("seat").to_numpy().astype(np.int64))
            ti = t.column("task_index").to_numpy()
            si = t.column("sample_index").to_numpy().astype(np.int64)
            fl = _failed_rows(t)
            if f.name not in listed:
                log.info("adopting %s (complete, written before the manifest recorded it)", f)
            tasks.append(ti)
            samples.append(si)
            failed.append(fl)
            if not known or known.get("rows") != t.num_rows:
                known = shard_stats(t if "reward" in t.column_names
                                    else read_shard(f, STATS_COLUMNS))
            self.shards.append({"name": f.name, "rows": int(t.num_rows),
                                "failed": int(fl.sum()), "stats": known})
        for name in set(listed) - {s["name"] for s in self.shards}:
            log.warning("%s is listed in the manifest but missing: its keys are played again",
                        name)
        self._tasks = np.concatenate(tasks) if tasks else np.zeros(0, np.int64)
        self._samples = np.concatenate(samples) if samples else np.zeros(0, np.int64)
        self._failed = np.concatenate(failed) if failed else np.zeros(0, bool)
        if len(self._tasks):
            keys = self._tasks * (1 << 32) + self._samples
            # a key's rows: one per seat, all in one shard
            shard = np.repeat(np.arange(len(self.shards)), [s["rows"] for s in self.shards])
            rows, n = np.unique(np.stack([keys, np.concatenate(seats)], 1), axis=0,
                                return_counts=True)
            homes = np.unique(np.stack([keys, shard], 1), axis=0)[:, 0]  # sorted by key
            bad = np.concatenate([rows[n > 1, 0], homes[1:][homes[1:] == homes[:-1]]])
            if bad.size:
                k = int(bad[0])
                names = [s["name"] for s, (a, b) in zip(self.shards, _spans(self.shards))
                         if (keys[a:b] == k).any()]
                raise ShardError(f"key (task_index={k >> 32}, sample_index={k & 0xFFFFFFFF}) "
                                 f"is in more than one shard of {self.path}, or twice for "
                                 f"one seat: {', '.join(names)}; delete {names[-1]} and run "
                                 "the same collect command again: its keys are played again")
        nums = [int(_SHARD.match(s["name"]).group(1)) for s in self.shards]
        self._next = max(nums, default=-1) + 1
        self._write_manifest(complete=False)

    # -- state ----------------------------------------------------------------------------
    def done_mask(self, num_tasks: int, n_samples: int, *, count_failed: bool = True) -> np.ndarray:
        """bool[num_tasks * n_samples]: the key (t, s) at ``t * n_samples + s`` has a row
        (``count_failed=False``: a row that did not fail)."""
        done = np.zeros(num_tasks * n_samples, bool)
        ok = (self._tasks < num_tasks) & (self._samples < n_samples)
        if not count_failed:
            ok &= ~self._failed
        done[self._tasks[ok] * n_samples + self._samples[ok]] = True
        return done

    @property
    def num_rows(self) -> int:
        return int(len(self._tasks))

    @property
    def num_failed(self) -> int:
        return int(self._failed.sum())

    # -- writing --------------------------------------------------------------------------
    def _check_space(self) -> None:
        free = shutil.disk_usage(self.path).free
        if free < self.min_free_bytes:
            raise DiskFullError(f"only {free} bytes free on the device of {self.path} (a "
                                f"shard needs at least {self.min_free_bytes}); the committed "
                                "shards are intact: free space and run the same command again")

    def _write_table(self, path: Path, table: pa.Table) -> None:
        if self.fmt == "parquet":
            atomic_write(path, lambda f: pq.write_table(
                table, f, compression=self.compression, use_dictionary=_DICTIONARY_COLUMNS))
        else:
            data = to_jsonl(table)
            atomic_write(path, lambda f: f.write(data))

    def prepare_shard(self, table: pa.Table) -> PreparedShard:
        """What committing ``table`` records besides the file (its keys, failed rows and
        stats), computed without touching the folder: a caller with a writer thread does
        this part itself, so that the thread runs little Python."""
        return PreparedShard(table, table.column("task_index").to_numpy(),
                             table.column("sample_index").to_numpy().astype(np.int64),
                             _failed_rows(table), shard_stats(table))

    def commit_shard(self, shard: PreparedShard) -> str:
        """Write ``shard`` as the next shard, then record it in the manifest; returns the
        shard's name. Thread-safe against nothing: call from one thread at a time."""
        self._check_space()
        name = f"part-{self._next:06d}.{self.fmt}"
        self._write_table(self.path / name, shard.table)
        self._next += 1
        self._tasks = np.concatenate([self._tasks, shard.tasks])
        self._samples = np.concatenate([self._samples, shard.samples])
        self._failed = np.concatenate([self._failed, shard.failed])
        self.shards.append({"name": name, "rows": int(shard.table.num_rows),
                            "failed": int(shard.failed.sum()), "stats": shard.stats})
        self._write_manifest(complete=False)
        return name

    def write_shard(self, table: pa.Table) -> str:
        """``commit_shard(prepare_shard(table))``."""
        return self.commit_shard(self.prepare_shard(table))

    def drop_failed(self) -> int:
        """Remove the failed rows from every shard (each rewritten in place atomically, or
        deleted when nothing is left) so that their keys are played again; returns how many
        rows were dropped."""
        dropped = 0
        for s in list(self.shards):
            if not s["failed"]:
                continue
            path = self.path / s["name"]
            table = read_shard(path)
            kept = table.filter(~_failed_rows(table))
            dropped += table.num_rows - kept.num_rows
            if kept.num_rows:
                self._check_space()
                self._write_table(path, kept)
            else:
                path.unlink()
                fsync_dir(self.path)
        self._reconcile()
        return dropped

    def _write_manifest(self, complete: bool) -> None:
        _write_json(self.meta_dir / "manifest.json", {
            "schema_version": SCHEMA_VERSION, "run_id": self.run_id, "format": self.fmt,
            "complete": complete, "rows": self.num_rows, "failed": self.num_failed,
            "shards": self.shards, "updated_at": time.time()})

    def finish(self, complete: bool, summary: dict[str, Any] | None = None) -> None:
        """Record whether every key has a row, and the run's summary (``summary.json``)."""
        self._write_manifest(complete)
        if summary is not None:
            _write_json(self.meta_dir / "summary.json", summary)

    def discard(self) -> bool:
        """Undo a new run that never committed a row (it failed or was interrupted before
        its first shard): remove the bookkeeping this open wrote, and the folder when this
        open made it, so that a corrected command starts afresh instead of being refused as
        a different run. Returns whether it did; a run with rows, or one that was in the
        folder before, is left as it is. Closes the store."""
        if not self.new_run or self.shards or self._lock_fd is None:
            self.close()
            return False
        for name in ("metadata.json", "manifest.json", "summary.json", "lock"):
            with contextlib.suppress(FileNotFoundError):
                (self.meta_dir / name).unlink()
        self.close()
        for d in (self.meta_dir, *([self.path] if self.made_folder else [])):
            with contextlib.suppress(OSError):  # not empty: someone else's files stay
                d.rmdir()
        return True

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None


@dataclass
class PreparedShard:
    """A shard's table with what the run's bookkeeping records of it
    (:meth:`RunStore.prepare_shard`)."""

    table: pa.Table
    tasks: np.ndarray
    samples: np.ndarray
    failed: np.ndarray
    stats: dict[str, Any]


_FAILED = pa.array(sorted(FAILED_STOP_REASONS))


def _failed_rows(table: pa.Table) -> np.ndarray:
    """bool[rows]: the row's episode failed."""
    return pc.is_in(table.column("stop_reason"), _FAILED).to_numpy(zero_copy_only=False)


def _spans(shards: list[dict[str, Any]]) -> Iterator[tuple[int, int]]:
    a = 0
    for s in shards:
        yield a, a + s["rows"]
        a += s["rows"]
