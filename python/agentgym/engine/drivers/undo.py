"""The ``undo`` action on a Gymnasium env the engine's Python drivers step
(``RolloutConfig.undo``; the engine's side is :mod:`agentgym.engine.mechanisms.undo`).

A native env answers undos inside its Rust pool (``rust/core/src/pool/undo.rs``);
:class:`UndoHistory` applies the same rules to a Gymnasium env with
``snapshot()``/``restore()`` (a :class:`~agentgym.envs.base.BaseEnv` that declares
``snapshot_safe``, or one that overrides them), with the grammar and the texts read from
``agentgym._core`` (``parse_undo``, ``undo_reply``, ``undo_refusal``), so both answer alike:

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
