"""The driver protocol: how the rollout engine resets and steps the episodes of one env id.

Every driver has the same methods, each either sync or async for all of them:

- ``async reset_many(items)``: reset ``(slot, task, seed, max_turns)`` rows; one first
  observation per row, or the exception of a row whose env refused its task, could not be
  built or crashed (only that episode ends, with ``env_error``);
- ``async step_many(items)``: step ``(slot, action)`` rows; one :class:`StepOutcome` each
  (an env exception ends only its own episode, with ``env_error``);
- ``finish(items)``: ``(slot, stop_reason)`` rows of episodes the engine ended itself
  (context full, timeout, backend error, cancellation);
- ``async oracle_action(slot)`` / ``async valid_actions(slot)``: for scripted policies;
- ``async frames(slots)``: each slot's current picture, a ``(h, w, 3)`` uint8 array (None
  where the env shows none; an exception where it failed to draw one), for an env built
  with image observations (``has_frames``: its ``obs`` option is ``"image"`` or
  ``"both"``); the engine asks after every reset and step;
- ``close()``.

``core_pool`` is the Rust pool of a native env, which the engine steps in the same call as
the turn's token bookkeeping (``TurnCodec.step_turn_batch``) and asks for the turns whose
action the env refused (``EnvPool.invalid_turns``) and the accepted undos
(``EnvPool.undo_turns``); None for every other driver, whose ``StepOutcome.invalid`` and
``StepOutcome.undo`` say it per step.

Every driver takes ``undo`` (:class:`~agentgym.engine.undo.UndoRules`, or None: off),
``restarts`` (reflection retries: ``save_starts``, ``restart``, ``drop_saved``) and
``forks`` (branched groups: ``async fork(src, targets)`` copies a running slot into free
ones) and, with any of them, raises :class:`~agentgym.errors.SnapshotUnsupportedError` when
it is built for an env that cannot snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from agentgym import _core

#: ``(slot, task, seed, max_turns)`` of one reset.
ResetItem = tuple[int, "int | str | None", int, "int | None"]


@dataclass(slots=True)
class StepOutcome:
    """What the env did with one action (read by ``TurnCodec.record_turn_batch``). A driver
    returns a new one for every step of a running episode: the engine may set its
    ``observation`` (an image observation's markup before the text)."""

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    #: ``done``/``horizon``/``env_error``/``aborted`` once the episode ended, else None.
    stop_reason: str | None = None
    error: str | None = None
    #: The env refused the action as unreadable (Gymnasium ``info["invalid"]``): not one of
    #: its commands, or one whose arguments do not parse.
    invalid: bool = False
    #: The action was an accepted ``undo`` (``RolloutConfig.undo``).
    undo: bool = False

    @classmethod
    def env_error(cls, error: BaseException, reward: float = 0.0) -> StepOutcome:
        """The outcome of a step whose env failed with ``error``: the episode ends with
        ``env_error``, the message as its observation and its error."""
        msg = f"{type(error).__name__}: {error}"
        return cls(f"Environment error: {msg}", reward, False, True, "env_error", msg)


def shows_frames(env_kwargs: dict) -> bool:
    """An env built with ``env_kwargs`` shows pictures: its ``obs`` option (every env with
    image observations takes it) is ``"image"`` or ``"both"``."""
    return env_kwargs.get("obs", "text") in ("image", "both")


#: The outcome of a step on a slot whose episode is no longer running.
NOT_RUNNING = StepOutcome("", 0.0, False, True, "aborted", "episode no longer running")


class EnvDriver(Protocol):
    """What the rollout engine needs from the envs of one env id (see the module docs)."""

    env_id: str
    #: The env's instructions, the default system prompt.
    instructions: str
    core_pool: _core.EnvPool | None
    #: The env shows pictures (built with ``obs="image"`` or ``"both"``).
    has_frames: bool

    async def reset_many(self, items: list[ResetItem]) -> list[str | Exception]: ...

    async def step_many(self, items: list[tuple[int, str]]) -> list[StepOutcome]: ...

    def finish(self, items: list[tuple[int, str]]) -> None: ...

    async def oracle_action(self, slot: int) -> str | None: ...

    async def valid_actions(self, slot: int) -> list[str]: ...

    async def frames(self, slots: list[int]) -> list: ...

    def close(self) -> None: ...
