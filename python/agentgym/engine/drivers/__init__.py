"""Env drivers: how the engine resets and steps the episodes of one env id.

- :class:`NativeDriver`: a Rust ``EnvPool``; resets and steps of one event-loop tick go to
  Rust in one batched call (GIL released).
- :class:`PythonDriver`: one Gymnasium env per slot (``agentgym.make``), stepped in a thread
  pool so a slow env never blocks the event loop.
- :class:`ProcessDriver`: Python envs and simulators hosted in worker processes: real
  parallelism, and a hung or crashed env is killed and restarted without touching the other
  episodes.

All follow :class:`EnvDriver` and report failures as data: a failed reset or step ends only
its own episode, which the engine records with ``env_error``.
"""

from __future__ import annotations

from agentgym.engine.drivers.base import NOT_RUNNING, EnvDriver, ResetItem, StepOutcome
from agentgym.engine.drivers.native import NativeDriver
from agentgym.engine.drivers.process import ProcessDriver
from agentgym.engine.drivers.python import PythonDriver
from agentgym.engine.drivers.undo import UndoRules
from agentgym.envs.registry import is_native

__all__ = [
    "NOT_RUNNING",
    "EnvDriver",
    "NativeDriver",
    "ProcessDriver",
    "PythonDriver",
    "ResetItem",
    "StepOutcome",
    "make_driver",
]


def make_driver(env_id: str, capacity: int, env_workers: int = 0,
                inline_budget_s: float = 0.002, *, undo: UndoRules | None = None,
                restarts: bool = False, forks: bool = False, lasts: bool = False,
                **env_kwargs) -> EnvDriver:
    """The driver for ``env_id``: native envs in the Rust pool; Python envs on a thread pool
    (work of a tick under ``inline_budget_s`` runs inline), or in ``env_workers`` processes
    when that is > 0. ``undo``: the ``undo`` action's rules (None: off); an env that cannot
    snapshot then raises :class:`~agentgym.errors.SnapshotUnsupportedError` here.
    ``restarts``: reflection retries (``save_starts``/``restart``/``drop_saved``), and
    ``forks``: branched groups (``fork``), and ``lasts``: retries back to the failing turn
    (``save_lasts``/``restore_last``), with the same check."""
    flags = {"undo": undo, "restarts": restarts, "forks": forks, "lasts": lasts}
    if is_native(env_id):
        return NativeDriver(env_id, capacity, **flags, **env_kwargs)
    if env_workers > 0:
        return ProcessDriver(env_id, capacity, num_workers=env_workers, **flags, **env_kwargs)
    return PythonDriver(env_id, capacity, inline_budget_s=inline_budget_s, **flags,
                        **env_kwargs)
