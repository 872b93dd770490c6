"""Self-correction: the ``undo`` action (``undo`` or ``undo N``) for the envs the engine's
Python drivers step (``RolloutConfig.undo``).

A native env answers undos inside its Rust pool (``rust/core/src/pool/undo.rs``); this
module applies the same rules to a Gymnasium env with ``snapshot()``/``restore()`` (a
:class:`~agentgym.envs.base.BaseEnv` that declares ``snapshot_safe``, or one that overrides
them), with the grammar and the texts read from ``agentgym._core`` (``parse_undo``,
``undo_reply``, ``undo_refusal``), so both answer alike:

- before each turn whose action is not an undo, the env's state is saved, then that turn's
  reward and the observation the model saw before it (the last ``depth`` turns are kept);
- ``undo N`` restores the state before the last ``N`` such turns not undone already,
  answers ``Undid the last N turn(s). <the observation at that point>`` and is rewarded
  with minus the undone turns' rewards (the return is the surviving path's);
- an undo past ``max_undos`` accepted ones, of more turns than are kept, or where the env
  failed to copy its state is refused like an unreadable action (reward 0, nothing changes,
  ``info["invalid"]``). An undo is a turn: turn counts are never rolled back.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from agentgym import _core
from agentgym.envs.base import env_method
from agentgym.errors import SnapshotUnsupportedError


@dataclass(frozen=True, slots=True)
class UndoRules:
    """The undo rules of a run: ``max_undos`` accepted undos per episode, the last
    ``depth`` turns undoable."""

    max_undos: int
    depth: int


def undo_rules(cfg) -> UndoRules | None:
    """The rules of a :class:`~agentgym.engine.config.RolloutConfig` (None: undo off)."""
    return UndoRules(cfg.max_undos, cfg.undo_depth) if cfg.undo else None


def supports_snapshots(env: Any) -> bool:
    """Whether a Gymnasium env (or what it wraps) says it can snapshot its state."""
    for obj in (env, getattr(env, "unwrapped", None)):
        flag = getattr(obj, "supports_snapshots", None)
        if flag is not None:
            return bool(flag() if callable(flag) else flag)
    return False


#: What the mechanisms that need env snapshots are called in a
#: ``SnapshotUnsupportedError``.
UNDO_NEEDS = "the undo action (RolloutConfig.undo)"
RESTARTS_NEED = "the reflection retry (RolloutConfig.reflection)"
FORKS_NEED = "branched groups (RolloutConfig.branch_at)"
LASTS_NEED = "reflection retries back to the failing turn (RolloutConfig.reflection_restore)"


def require_snapshots(supported: bool, env_id: str, undo: UndoRules | None,
                      restarts: bool, forks: bool = False) -> None:
    """Raise :class:`SnapshotUnsupportedError` when the env cannot snapshot (``supported``
    False) and undo rules, reflection retries or branched groups are on: checked when a
    driver is built, before any episode starts; the message names each mechanism that needs
    it."""
    needs = [what for what, on in ((UNDO_NEEDS, undo is not None), (RESTARTS_NEED, restarts),
                                   (FORKS_NEED, forks)) if on]
    if needs and not supported:
        raise SnapshotUnsupportedError(
            f"{env_id}: {' and '.join(needs)} need{'s' if len(needs) == 1 else ''} env "
            "snapshots, and this env cannot snapshot its state")


class UndoHistory:
    """One episode's undo history over a Gymnasium env with ``snapshot()``/``restore()``
    (see the module docs). ``step`` replaces ``env.step`` for the episode. With
    ``max_turns`` it also applies the horizon (every turn counts, undos included); without,
    the caller does."""

    __slots__ = ("rules", "entries", "observation", "undos", "broken", "turns", "max_turns")

    def __init__(self, rules: UndoRules, observation: str, max_turns: int | None = None):
        self.rules = rules
        #: ``(saved state, reward, observation before)`` per undoable turn, oldest first.
        self.entries: deque = deque()
        self.observation = observation
        self.undos = 0
        self.broken = False
        self.turns = 0
        self.max_turns = max_turns

    def copy(self) -> UndoHistory:
        """An independent copy (a forked episode's): the saved states are shared, which is
        safe because ``restore`` copies what it restores."""
        other = UndoHistory(self.rules, self.observation, self.max_turns)
        other.entries = deque(self.entries)
        other.undos, other.broken, other.turns = self.undos, self.broken, self.turns
        return other

    def step(self, env: Any, action: str) -> tuple[str, float, bool, bool, dict]:
        """One turn: an undo answered here, any other action stepped with the env's state
        saved first. Returns Gymnasium's ``(obs, reward, terminated, truncated, info)``."""
        n = _core.parse_undo(action)
        obs, reward, term, trunc, info = (self._undo(env, n) if n is not None
                                          else self._step(env, action))
        self.turns += 1
        if (not term and self.max_turns is not None and self.turns >= self.max_turns):
            trunc = True
        if term or trunc:
            self.entries.clear()
        return obs, reward, term, trunc, info

    def _step(self, env: Any, action: str):
        saved = None
        if not self.broken:
            try:
                saved = env_method(env, "snapshot")()
            except SnapshotUnsupportedError:
                self.broken = True
                self.entries.clear()
        obs, reward, term, trunc, info = env.step(action)
        if saved is not None and not (term or trunc):
            self.entries.append((saved, float(reward), self.observation))
            if len(self.entries) > self.rules.depth:
                self.entries.popleft()
        self.observation = str(obs)
        return obs, reward, term, trunc, info

    def _undo(self, env: Any, n: int):
        if self.broken:
            why = _core.undo_refusal("unsupported")
        elif self.undos >= self.rules.max_undos:
            why = _core.undo_refusal("cap", max_undos=self.rules.max_undos)
        elif n > len(self.entries):
            why = _core.undo_refusal("too_many", asked=n, available=len(self.entries))
        else:
            why = None
        if why is not None:
            return why, 0.0, False, False, {"invalid": True}
        undone = 0.0
        for _ in range(n):
            saved, reward, observation = self.entries.pop()
            undone += reward
        env_method(env, "restore")(saved)
        self.observation = observation
        self.undos += 1
        return _core.undo_reply(n, observation), -undone, False, False, {"undo": True}
