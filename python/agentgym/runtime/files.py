"""Durable file publication: data that is visible on disk survives ``kill -9`` and power loss.

A writer builds its file or folder under a temporary name, calls :func:`fsync_tree` (a
folder) or fsyncs the file, renames it onto the final name, then :func:`fsync_dir` on the
parent so that the rename itself is durable.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "fsync_tree", "write_text_atomic"]


def fsync_dir(folder: str | os.PathLike) -> None:
    """Flush ``folder``'s entries (names created, renamed or removed in it) to disk."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: str | os.PathLike) -> None:
    """Flush every file under ``folder`` and every folder's entries to disk."""
    for root, _, files in os.walk(folder):
        for name in files:
            with open(Path(root) / name, "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(root)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the whole new one:
    a temporary file beside it, fsync, rename, fsync of the folder (made if missing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
