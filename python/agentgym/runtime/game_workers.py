"""A suite game's slots hosted in worker processes: :class:`ProcessGamePool`.

The twin of :class:`~agentgym.envs.suites._game.SuiteGamePool` (the same view rows, the same
``areset``/``astep``/``aoracle_actions``) for a game whose library may crash or hang its
process: each worker hosts a ``SuiteGamePool`` of its share of the slots
(:class:`GameHost`), and the transport, the watchdog and the restarts are
:class:`~agentgym.runtime.workers.ProcessEnvPool`'s. So:

* a game that raises ends only its own episode (its row is the exception, as in process);
* a game that kills its process (a C++ abort, a segfault) or makes no progress for
  ``timeout_s`` ends only the episode whose call it was (``env_error`` or ``timeout``): the
  worker is restarted and its other games are rebuilt by replaying their reset and moves
  (a suite game is deterministic from its task, seed and moves; chance nodes are drawn from
  the episode's seed);
* every call of one event-loop tick travels to a worker as one message.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentgym.errors import EnvError, EpisodeFinishedError
from agentgym.runtime.workers import ProcessEnvPool, _error, _Slot, worker_info


class GameHost:
    """A worker's side: ``spec["slots"]`` slots of suite game ``spec["env_id"]`` (built on
    the first call, so a game that cannot load fails that call, not the worker's start)."""

    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.pool: Any = None

    def _pool(self) -> Any:
        if self.pool is None:
            from agentgym.envs.registry import game_pool

            self.pool = game_pool(self.spec["env_id"], self.spec["slots"],
                                  **self.spec["env_kwargs"])
        return self.pool

    @staticmethod
    def _one(rows: list) -> list:
        row = rows[0]
        if isinstance(row, BaseException):
            raise row
        return list(row)

    def handle(self, op: str, local: int, args: list[Any]) -> Any:
        """One call: ``reset`` ``[task, seed, _]`` and ``step`` ``[moves]`` answer the
        slot's view; ``replay`` ``[task, seed, _, move lists]`` rebuilds a game after a
        restart; ``valid_actions`` and ``oracle_action`` ``[seat]``."""
        if op == "info":
            return worker_info(0 if self.pool is None else len(self.pool))
        pool = self._pool()
        if op in ("reset", "replay"):
            view = self._one(pool.reset([local], [args[0]], [args[1]]))
            if op == "reset":
                return view
            for moves in args[3]:
                self._one(pool.step([local], [moves]))
            return None
        if op == "step":
            return self._one(pool.step([local], [args[0]]))
        if op == "valid_actions":
            return pool.valid_actions(local, args[0])
        if op == "oracle_action":
            return pool.oracle_actions([local], [args[0]])[0]
        raise ValueError(f"unknown game worker op {op!r}")

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


class ProcessGamePool(ProcessEnvPool):
    """``capacity`` slots of suite game ``game_id`` over ``num_workers`` processes, with the
    awaited methods of :class:`~agentgym.envs.suites._game.SuiteGamePool` (the engine's
    self-play path drives it the same way: ``is_async``). ``kwargs`` build each game."""

    is_async = True

    def __init__(self, game_id: str, capacity: int, num_workers: int = 2,
                 timeout_s: float = 120.0, **kwargs: Any):
        from agentgym.envs.registry import game_pool

        probe = game_pool(game_id, 0, **kwargs)  # the seats and prompts, before any worker
        try:
            self.seats, self.roles = probe.seats, list(probe.roles)
            self.instructions, self.num_tasks = list(probe.instructions), probe.num_tasks
        finally:
            probe.close()
        num_workers = max(1, min(num_workers, capacity))
        super().__init__(game_id, num_workers, max(1, -(-capacity // num_workers)),
                         timeout_s=timeout_s, **kwargs)
        self._spec["host"] = f"{GameHost.__module__}:{GameHost.__name__}"  # what workers run
        self.capacity = capacity

    def __len__(self) -> int:
        return self.capacity

    def _row(self, slot: _Slot, result: tuple[bool, Any]) -> Any:
        """A call's answer as the in-process pool gives it: the view, or the exception of a
        game that failed (its episode is over; a ``TimeoutError`` where it hung)."""
        slot.busy = False
        ok, payload = result
        if not ok:
            reason, (name, msg, _) = payload
            slot.state, slot.stop_reason = "done", reason
            if reason == "timeout":  # the episode ends with stop reason ``timeout``
                return TimeoutError(f"{self.env_id}: {msg}")
            return _error(name, msg) if reason == "env_error" else EnvError(f"{reason}: {msg}")
        movers, observations, over, rewards, refused = payload
        if over:
            slot.state, slot.stop_reason = "done", "done"
        return movers, observations, over, rewards, refused

    async def areset(self, slots: list[int], tasks: list, seeds: list[int]) -> list:
        """Start a game in each slot; per row its first view, or its exception."""
        await self.start()
        rows = [self._free_slot(i) for i in slots]
        futs = self._submit([self._start(slot, task, int(seed), None)
                             for slot, task, seed in zip(rows, tasks, seeds, strict=True)])
        return [self._row(s, r) for s, r in zip(rows, await self._gather(rows, futs))]

    async def astep(self, slots: list[int], moves: list[list[str]]) -> list:
        """One move list per slot; per row its view after the step, or the exception of a
        game that failed or is not running."""
        await self.start()
        out: list = [None] * len(slots)
        calls, rows, at = [], [], []
        for k, (i, row) in enumerate(zip(slots, moves, strict=True)):
            slot = self._slot(i)
            if slot.state != "live" or slot.busy:
                out[k] = EpisodeFinishedError(f"{self.env_id}: slot {i} has no running game")
                continue
            slot.busy = True
            calls.append((slot, "step", [[str(m) for m in row]]))
            rows.append(slot)
            at.append(k)
        if calls:
            results = await self._gather(rows, self._submit(calls))
            for k, slot, r in zip(at, rows, results):
                out[k] = self._row(slot, r)
        return out

    async def aoracle_actions(self, slots: list[int], seats: list[int]) -> list:
        """The game's scripted player's action for each ``(slot, seat)`` (None where that
        seat is not to move, the game has none or its call failed)."""
        await self.start()
        futs = self._submit([(self._slot(i), "oracle_action", [int(seat)])
                             for i, seat in zip(slots, seats, strict=True)])
        return [payload if ok else None for ok, payload in await asyncio.gather(*futs)]

    async def avalid_actions(self, slot: int, seat: int) -> list[str]:
        """The legal actions of ``seat`` in ``slot`` now ([] when it is not to move)."""
        await self.start()
        ok, payload = await self._submit([(self._slot(slot), "valid_actions", [int(seat)])])[0]
        if not ok:
            raise _error(*payload[1][:2])
        return list(payload)

    def finish(self, slots: list[int]) -> None:
        """End the games of ``slots`` (a worker's game is replaced at the slot's next
        reset)."""
        for i in slots:
            slot = self._slot(i)
            if slot.state == "live":
                slot.state, slot.stop_reason = "done", "aborted"
