"""``ProcessDriver``: Python envs and simulators hosted in worker processes
(:class:`agentgym.runtime.workers.ProcessEnvPool`): real parallelism, and a hung or crashed env
is killed and restarted without touching the other episodes."""

from __future__ import annotations

import asyncio

from agentgym.engine.drivers.base import (
    FORKS_NEED,
    LASTS_NEED,
    ResetItem,
    StepOutcome,
    require_snapshots,
    shows_frames,
    supports_snapshots,
)
from agentgym.engine.drivers.undo import UndoRules
from agentgym.envs.registry import make
from agentgym.errors import SnapshotUnsupportedError


class ProcessDriver:
    """``capacity`` episodes of a Python env spread over ``num_workers`` processes. With
    ``undo`` rules the workers answer ``undo`` actions (``UndoHistory`` beside each env).
    ``restarts`` (reflection retries): :meth:`restart` resets the slot's env with the
    episode's own task, seed and horizon (the worker keeps no state copies; its replay log
    starts anew), which gives a seeded env its start state again; an env that cannot
    snapshot is refused here all the same, as on the other drivers. Branched groups
    (``forks``) and retries back to the failing turn (``lasts``) are refused for every env: a
    worker holds no copy of an env's state to go back to, and rebuilding one by replaying
    the prefix is what snapshots exist to avoid."""

    core_pool = None

    def __init__(self, env_id: str, capacity: int, num_workers: int = 2,
                 timeout_s: float = 120.0, *, undo: UndoRules | None = None,
                 restarts: bool = False, forks: bool = False, lasts: bool = False,
                 **env_kwargs):
        from agentgym.runtime.workers import ProcessEnvPool

        self.env_id = env_id
        if shows_frames(env_kwargs):
            raise ValueError(f"{env_id}: image observations are not carried back from worker "
                             "processes (env_workers > 0); use env_workers=0")
        self.has_frames = False
        probe = make(env_id, **env_kwargs)  # instructions without starting workers
        try:
            self.instructions = getattr(probe.unwrapped, "instructions", "") or ""
            # before any worker starts
            require_snapshots(supports_snapshots(probe), env_id, undo, restarts)
            for what, on in ((FORKS_NEED, forks), (LASTS_NEED, lasts)):
                if on:
                    raise SnapshotUnsupportedError(
                        f"{env_id}: {what} need env snapshots, and envs in worker processes "
                        "(env_workers > 0) give none; use env_workers=0")
        finally:
            probe.close()
        per_worker = -(-capacity // num_workers)
        #: Each slot's ``(task, seed, max_turns)`` (``restarts`` only).
        self._starts: dict[int, tuple] | None = {} if restarts else None
        self.pool = ProcessEnvPool(env_id, num_workers, per_worker, timeout_s=timeout_s,
                                   undo=undo, **env_kwargs)

    async def reset_many(self, items: list[ResetItem]) -> list[str | Exception]:
        """Reset each row in its worker (concurrently); a failed row gets its exception."""
        return await asyncio.gather(*(self._reset(*item) for item in items),
                                    return_exceptions=True)

    async def _reset(self, slot: int, task, seed: int, max_turns: int | None) -> str:
        obs, _ = await self.pool.reset(slot, task, seed, max_turns=max_turns)
        if self._starts is not None:
            self._starts[slot] = (task, seed, max_turns)
        return str(obs)

    async def save_starts(self, slots: list[int]) -> list[Exception | None]:
        """Nothing to copy: :meth:`restart` resets with the start's task and seed."""
        return [None] * len(slots)

    async def restart(self, slot: int) -> None:
        """Reset ``slot``'s env with its episode's task, seed and horizon."""
        task, seed, max_turns = self._starts[slot]
        await self.pool.reset(slot, task, seed, max_turns=max_turns)

    def drop_saved(self, slots: list[int]) -> None:
        """Forget the starts of ``slots``."""
        for slot in slots:
            self._starts.pop(slot, None)

    # A worker holds no copy of an env's state: going back to before a step and forking are
    # refused when the driver is built (``lasts``, ``forks``), and here had they been asked.
    def save_lasts(self, slots: list[int]) -> None:
        raise SnapshotUnsupportedError(f"{self.env_id}: {LASTS_NEED} need env snapshots, "
                                       "which envs in worker processes give none of")

    def has_last(self, slot: int) -> bool:
        return False

    async def restore_last(self, slot: int) -> None:
        raise SnapshotUnsupportedError(f"{self.env_id}: {LASTS_NEED} need env snapshots, "
                                       "which envs in worker processes give none of")

    async def fork(self, src: int, targets: list[int]) -> None:
        raise SnapshotUnsupportedError(f"{self.env_id}: {FORKS_NEED} need env snapshots, "
                                       "which envs in worker processes give none of")

    async def step_many(self, items: list[tuple[int, str]]) -> list[StepOutcome]:
        """Step each row in its worker (concurrently)."""
        return list(await asyncio.gather(*(self._step(slot, a) for slot, a in items)))

    async def _step(self, slot: int, action: str) -> StepOutcome:
        obs, rew, term, trunc, info = await self.pool.step(slot, action)
        reason = info.get("stop_reason") or ("done" if term else ("horizon" if trunc else None))
        return StepOutcome(str(obs), float(rew), bool(term), bool(trunc), reason,
                           info.get("error"), bool(info.get("invalid")), bool(info.get("undo")))

    def finish(self, items: list[tuple[int, str]]) -> None:
        pass  # the worker's episode is simply reset when the slot is reused

    async def oracle_action(self, slot: int) -> str | None:
        return await self.pool.oracle_action(slot)

    async def valid_actions(self, slot: int) -> list[str]:
        return await self.pool.valid_actions(slot)

    async def frames(self, slots: list[int]) -> list:
        """None per slot: envs in worker processes are built without pictures."""
        return [None] * len(slots)

    def close(self) -> None:
        self.pool.close()


