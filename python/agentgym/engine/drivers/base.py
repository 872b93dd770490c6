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

Snapshots are one capability (:class:`Snapshots`): keep a slot's start and go back to it
(``save_starts``, ``restart``, ``drop_saved``; reflection retries), keep a slot's state
before its step and go back to it (``save_lasts``, ``has_last``, ``restore_last``; retries
back to the failing turn), and copy a running slot into free ones (``fork``; branched
groups). Every driver implements all of it; what it cannot serve it refuses when it is
built. Every driver takes ``undo`` (:class:`~agentgym.engine.drivers.undo.UndoRules`, or
None: off), ``restarts``, ``lasts`` and ``forks`` (the uses of snapshots a run needs) and,
with any of them, raises :class:`~agentgym.errors.SnapshotUnsupportedError` when it is built
for an env that cannot snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agentgym import _core
from agentgym.errors import SnapshotUnsupportedError

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


@runtime_checkable
class Snapshots(Protocol):
    """Going back and copying (see the module docs): what reflection retries and branched
    groups ask of a driver."""

    async def save_starts(self, slots: list[int]) -> list[Exception | None]:
        """Keep each slot's state as its episode's start (per slot None, or the exception
        that kept it from being copied)."""

    async def restart(self, slot: int) -> None:
        """Put ``slot``'s env back to its episode's start."""

    def drop_saved(self, slots: list[int]) -> None:
        """Forget what was kept for ``slots`` (their starts and last states)."""

    def save_lasts(self, slots: list[int]) -> None:
        """Keep each slot's state before the step it is about to take."""

    def has_last(self, slot: int) -> bool:
        """Whether a state before ``slot``'s last step is kept."""

    async def restore_last(self, slot: int) -> None:
        """Put ``slot``'s env back to before its last step."""

    async def fork(self, src: int, targets: list[int]) -> None:
        """Copy running slot ``src``'s env into each of ``targets``."""


@runtime_checkable
class EnvDriver(Snapshots, Protocol):
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


def require_snapshots(supported: bool, env_id: str, undo: object | None,
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
