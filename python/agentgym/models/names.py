"""Named models: ``--model NAME`` and ``LLMAgent(base_model=NAME)`` for a model that is built
locally instead of downloaded.

``resolve_model(name)`` returns the model folder of a named model (building it into the
cache on first use) and any other string unchanged (a model folder, a checkpoint, a hub id
or a server-side model name). ``"tiny"`` is not resolved here: the trainer builds the tiny
model into its own run folder with the run's seed and architecture.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agentgym.models.cache import _cached_build, cache_dir

__all__ = [
    "NAMED_MODELS",
    "cache_dir",
    "cached_tiny_model",
    "cached_tiny_vl_model",
    "is_named_model",
    "resolve_model",
]


def cached_tiny_model() -> Path:
    """The local tiny model with seed 0 (for its tokenizer, or an untrained policy), built once
    into :func:`cache_dir` (temporary folder, fsync, rename)."""
    from agentgym.models.tiny import build_tiny_model

    return _cached_build("tiny-seed0", lambda d: build_tiny_model(d, seed=0))


def cached_tiny_vl_model() -> Path:
    """``tiny-vl`` (:mod:`agentgym.models.tiny_vl`) with seed 0, built once into
    :func:`cache_dir` like :func:`cached_tiny_model`."""
    from agentgym.models.tiny_vl import build_tiny_vl_model

    return _cached_build("tiny-vl-seed0", lambda d: build_tiny_vl_model(d, seed=0))


def _smollm2() -> Path:
    from agentgym.models.smollm2 import smollm2_dir

    return smollm2_dir()


#: name -> builder returning the model folder.
NAMED_MODELS: dict[str, Callable[[], Path]] = {
    "smollm2-135m": _smollm2,
    "tiny-vl": cached_tiny_vl_model,
}


def is_named_model(name: object) -> bool:
    """True if ``name`` is one of :data:`NAMED_MODELS` (and not an existing path)."""
    return isinstance(name, str) and name in NAMED_MODELS and not Path(name).exists()


def resolve_model(name: str | Path | None) -> str | None:
    """The model folder of a named model (built once into the cache), else ``name`` as it
    was given (``None`` stays ``None``)."""
    if name is None:
        return None
    if is_named_model(name):
        return str(NAMED_MODELS[str(name)]())
    return str(name) if isinstance(name, Path) else name
