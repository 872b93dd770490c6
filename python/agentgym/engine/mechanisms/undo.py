"""Self-correction: the ``undo`` action (``undo`` or ``undo N``; ``RolloutConfig.undo``)
restores the env to before the last N turns not undone already; the undo turn's reward
cancels theirs, at most ``max_undos`` accepted undos per episode and ``undo_depth`` turns
back. The env's side answers it (a native env inside its Rust pool, a Python env through
:class:`~agentgym.engine.drivers.undo.UndoHistory`); the engine's side counts each episode's
accepted undos. docs/mechanisms.md has the rules and why.
"""

from __future__ import annotations

from typing import Any

from agentgym.engine.drivers.undo import UndoRules
from agentgym.engine.mechanisms.base import Mechanism, PoolCounter


def undo_rules(cfg) -> UndoRules | None:
    """The rules of a :class:`~agentgym.engine.config.RolloutConfig` (None: undo off)."""
    return UndoRules(cfg.max_undos, cfg.undo_depth) if cfg.undo else None


class Undo(Mechanism):
    """Counts each episode's accepted undos (``undo_turns``): per step where the driver
    steps the env, from the native pool's episode record where it does not."""

    name = "undo"
    default_count, count_field = 3, "max_undos"
    row_defaults = {"undo_turns": 0}
    with_images = True

    @classmethod
    def driver_needs(cls, cfg) -> dict[str, Any]:
        return {"undo": undo_rules(cfg)}

    def __init__(self, loop):
        super().__init__(loop)
        if loop.pool is not None:  # the pool counts them in its episode record
            loop.pool_counters.append(PoolCounter(loop.pool.undo_turns, _add_undos))
            self.stepped = None

    async def stepped(self, turns, outs):
        for t, o in zip(turns, outs):
            if o.undo:
                _add_undos(t.episode, 1)
        return outs

    def forked(self, root, child) -> None:
        if self.loop.pool is None:  # a native pool copied its count with the record
            child.state["undo"] = root.state.get("undo", 0)

    def row(self, eps) -> dict:
        return {"undo_turns": [e.state.get("undo", 0) for e in eps]}


def _add_undos(ep, n: int) -> None:
    ep.state["undo"] = ep.state.get("undo", 0) + n
