"""The multi-seat side of the suite adapters: :class:`SuiteGame` (one episode of a suite's
game) and :class:`SuiteGamePool`, the twin of ``agentgym._core.GamePool`` that the engine's
self-play path drives for a suite game.

The pool answers with the same view tuples as the Rust pool, ``(to_move, observations,
over, rewards, refused)``, one per row, and a row whose game raised gets the exception
instance instead (returned, never raised: a third-party game that fails ends only its own
episode, with ``env_error``). Its ``areset``/``astep``/``aoracle_actions`` run the same work
on one worker thread, so a slow game never holds the event loop; one thread keeps each
game's calls in order and the suites' module-level state (a global RNG) untouched by a
second caller.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentgym.errors import EnvError, EpisodeFinishedError, EpisodeNotStartedError

View = tuple[list[int], list[str], bool, list[float], list[bool]]


class SuiteGame:
    """One episode of a suite's game, played seat by seat.

    Subclasses set ``seats``, ``roles`` and ``instructions`` (one system prompt per seat) in
    ``__init__`` and implement the rest. ``step`` takes one move per seat to move (in
    ``to_move()`` order) and returns, per move, whether the game refused it; a refused move
    ends the game with -1 for its seat and 0 for the others (:meth:`refuse`), as every native
    game does.
    """

    seats: int = 2
    roles: tuple[str, ...] = ()
    instructions: tuple[str, ...] = ()
    #: The deals or openings a task index picks (None: unbounded, any index is a seed).
    num_tasks: int | None = None
    #: :meth:`snapshot` and :meth:`restore` work.
    snapshots: bool = False

    def reset(self, task: int | None, seed: int) -> None:
        raise NotImplementedError

    def to_move(self) -> list[int]:
        raise NotImplementedError

    def observation(self, seat: int) -> str:
        raise NotImplementedError

    def over(self) -> bool:
        raise NotImplementedError

    def rewards(self) -> list[float]:
        raise NotImplementedError

    def step(self, moves: list[str]) -> list[bool]:
        raise NotImplementedError

    def valid_actions(self, seat: int) -> list[str]:
        return []

    def oracle_action(self, seat: int) -> str | None:
        return None

    def snapshot(self) -> Any:
        from agentgym.errors import SnapshotUnsupportedError

        raise SnapshotUnsupportedError(f"{type(self).__name__} cannot snapshot its state")

    def restore(self, state: Any) -> None:
        self.snapshot()

    def close(self) -> None:
        pass

    def view(self, refused: list[bool]) -> View:
        """The game's view now, as the Rust pool gives it."""
        if self.over():
            return [], [], True, [float(r) for r in self.rewards()], refused
        movers = self.to_move()
        return (movers, [self.observation(s) for s in movers], False,
                [float(r) for r in self.rewards()], refused)


def refused_rewards(seats: int, mover: int) -> list[float]:
    """The final rewards after ``mover``'s refused move: -1 for it, 0 for the others."""
    return [-1.0 if s == mover else 0.0 for s in range(seats)]


def _error(e: BaseException) -> EnvError:
    err = EnvError(f"{type(e).__name__}: {e}")
    err.__cause__ = e
    return err


class SuiteGamePool:
    """``capacity`` slots of suite game ``game_id`` (``factory(**kwargs)`` builds one
    episode's :class:`SuiteGame`), with the methods of ``agentgym._core.GamePool``."""

    is_async = True

    def __init__(self, game_id: str, capacity: int, factory, kwargs: dict[str, Any]):
        self.game_id = game_id
        self._factory, self._kwargs = factory, dict(kwargs)
        probe = factory(**self._kwargs)
        try:
            self.seats = int(probe.seats)
            self.roles = list(probe.roles)
            self.instructions = list(probe.instructions)
            self.num_tasks = probe.num_tasks
        finally:
            probe.close()
        self._games: list[SuiteGame | None] = [None] * capacity
        self._running = [False] * capacity
        self._executor: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return len(self._games)

    def _check(self, slots: list[int]) -> None:
        for slot in slots:
            if not 0 <= slot < len(self._games):
                raise IndexError(f"slot {slot} out of range (pool of {len(self._games)})")

    def _live(self, slot: int) -> SuiteGame:
        game = self._games[slot]
        if game is None or not self._running[slot]:
            raise EpisodeNotStartedError(f"{self.game_id}: no game running in slot {slot}")
        return game

    # -- the Rust pool's methods ------------------------------------------------------------
    def reset(self, slots: list[int], tasks: list, seeds: list[int]) -> list:
        """Start a game in each slot with its task and seed; per row its first view, or the
        exception that kept it from starting."""
        self._check(slots)
        out: list = []
        for slot, task, seed in zip(slots, tasks, seeds):
            self._running[slot] = False
            try:
                game = self._games[slot]
                if game is None:
                    game = self._games[slot] = self._factory(**self._kwargs)
                game.reset(task, int(seed))
                view = game.view([])
            except Exception as e:  # the third-party game failed: that row only
                self._games[slot] = None
                out.append(_error(e))
                continue
            self._running[slot] = not view[2]
            out.append(view)
        return out

    def step(self, slots: list[int], moves: list[list[str]]) -> list:
        """One move list per slot (one move per seat to move); per row its view after the
        step, or the exception of a game that failed (its slot is then free)."""
        self._check(slots)
        out: list = []
        for slot, row in zip(slots, moves):
            game = self._games[slot]
            if game is None or not self._running[slot]:
                out.append(EpisodeFinishedError(f"{self.game_id}: slot {slot} has no "
                                                "running game"))
                continue
            try:
                refused = game.step([str(m) for m in row])
                view = game.view([bool(r) for r in refused])
            except Exception as e:
                self._running[slot] = False
                self._games[slot] = None
                out.append(_error(e))
                continue
            self._running[slot] = not view[2]
            out.append(view)
        return out

    def oracle_actions(self, slots: list[int], seats: list[int]) -> list:
        """The game's scripted player's action for each ``(slot, seat)`` (None where that
        seat is not to move or the game has none)."""
        out: list = []
        for slot, seat in zip(slots, seats):
            try:
                game = self._live(slot)
                out.append(game.oracle_action(seat) if seat in game.to_move() else None)
            except Exception:
                out.append(None)
        return out

    def valid_actions(self, slot: int, seat: int) -> list[str]:
        """The legal actions of ``seat`` in ``slot`` now ([] when it is not to move)."""
        game = self._live(slot)
        return list(game.valid_actions(seat)) if seat in game.to_move() else []

    def snapshot(self, slot: int) -> Any:
        """A copy of the running game of ``slot`` (:meth:`SuiteGame.snapshot`)."""
        return self._live(slot).snapshot()

    def restore(self, slot: int, state: Any) -> None:
        """Put the game of ``slot`` back as :meth:`snapshot` saw it."""
        game = self._games[slot]
        if game is None:
            raise EpisodeNotStartedError(f"{self.game_id}: no game in slot {slot}")
        game.restore(state)
        self._running[slot] = not game.over()

    def finish(self, slots: list[int]) -> None:
        """End the games of ``slots``."""
        self._check(slots)
        for slot in slots:
            self._running[slot] = False

    # -- off the event loop -------------------------------------------------------------------
    async def _off_loop(self, fn, *args):
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"suite-{self.game_id}")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def areset(self, slots: list[int], tasks: list, seeds: list[int]) -> list:
        """:meth:`reset` on the pool's worker thread."""
        return await self._off_loop(self.reset, slots, tasks, seeds)

    async def astep(self, slots: list[int], moves: list[list[str]]) -> list:
        """:meth:`step` on the pool's worker thread."""
        return await self._off_loop(self.step, slots, moves)

    async def aoracle_actions(self, slots: list[int], seats: list[int]) -> list:
        """:meth:`oracle_actions` on the pool's worker thread (a search bot may think)."""
        return await self._off_loop(self.oracle_actions, slots, seats)

    async def avalid_actions(self, slot: int, seat: int) -> list[str]:
        """:meth:`valid_actions` on the pool's worker thread."""
        return await self._off_loop(self.valid_actions, slot, seat)

    def close(self) -> None:
        for game in self._games:
            if game is not None:
                try:
                    game.close()
                except Exception:  # a third-party close that fails: nothing left to do
                    pass
        self._games = [None] * len(self._games)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
