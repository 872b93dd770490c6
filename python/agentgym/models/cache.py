"""Where locally built models live: :func:`cache_dir`, and the one build-once step
(temporary folder, fsync, rename) that the named models share. Its own module, so that the
model builders (``smollm2``, ``tiny``, ``tiny_vl``) and the name table
(:mod:`agentgym.models.names`, which imports them) never import each other."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """Where models are built once: ``$AGENTGYM_CACHE/models`` if set, else
    ``$XDG_CACHE_HOME/agentgym/models`` (default ``~/.cache/agentgym/models``)."""
    root = os.environ.get("AGENTGYM_CACHE")
    if root:
        return Path(root).expanduser() / "models"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "agentgym" / "models"


def _cached_build(name: str, build: Callable[[Path], object]) -> Path:
    """``cache_dir() / name``, built once by ``build(folder)`` (temporary folder, fsync,
    rename: a reader never sees a half-built model)."""
    from agentgym.runtime.files import fsync_dir, fsync_tree

    cache = cache_dir()
    target = cache / name
    if (target / "tokenizer.json").exists() and (target / "config.json").exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache))
    try:
        build(tmp)
        fsync_tree(tmp)
        os.replace(tmp, target)
        fsync_dir(cache)
    except OSError:  # built meanwhile by another process
        if not (target / "config.json").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
