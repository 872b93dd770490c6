"""``PythonDriver``: one Gymnasium env per slot, stepped on a thread pool."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from agentgym.engine.drivers.base import (
    NOT_RUNNING,
    ResetItem,
    StepOutcome,
    require_snapshots,
    shows_frames,
    supports_snapshots,
)
from agentgym.engine.drivers.undo import UndoHistory, UndoRules
from agentgym.envs.base import env_method
from agentgym.envs.registry import make
from agentgym.errors import InvalidTaskError


def _close_quietly(env) -> None:
    try:
        env.close()
    except Exception:  # a crashed env may fail to close too; it is dropped either way
        pass


class PythonDriver:
    """One Gymnasium env per slot, stepped on a thread pool (``max_workers`` threads).

    Fast envs skip the pool: the driver measures the wall time of a reset and of a step
    (an uncontended single-thread job every ``probe_every`` ticks, and every inline call)
    and runs a tick's work inline on the event loop when it is expected to take less than
    ``inline_budget_s`` in total. A thread hand-off costs tens of microseconds and GIL
    switches; a pure-Python env steps in a few. Slow envs (simulators, HTTP) stay on the
    pool. ``inline_budget_s = 0`` always uses the pool. Envs that may hang belong in worker
    processes (``env_workers``), where they can be killed.

    With ``undo`` rules each episode keeps an :class:`~agentgym.engine.undo.UndoHistory`
    and ``undo`` / ``undo N`` actions are undos; an env that cannot snapshot raises
    :class:`~agentgym.errors.SnapshotUnsupportedError` here, before any episode.
    ``restarts`` (reflection retries): each episode's start state is kept (``snapshot()``)
    for :meth:`restart`; an env that cannot snapshot raises here as well, and for ``forks``
    (branched groups, :meth:`fork`) and ``lasts`` (:meth:`save_lasts`, :meth:`restore_last`:
    retries back to the failing turn).
    """

    probe_every = 64

    core_pool = None

    def __init__(self, env_id: str, capacity: int, max_workers: int = 8,
                 inline_budget_s: float = 0.002, *, undo: UndoRules | None = None,
                 restarts: bool = False, forks: bool = False, lasts: bool = False,
                 **env_kwargs):
        self.env_id = env_id
        self._make = lambda: make(env_id, **env_kwargs)
        first = self._make()
        self.undo = undo
        #: Each slot's undo history while its episode runs (undo rules only).
        self._history: list[UndoHistory | None] = [None] * capacity
        try:
            require_snapshots(supports_snapshots(first), env_id, undo, restarts, forks)
        except Exception:
            _close_quietly(first)
            raise
        if undo is not None:
            self._step_one = self._step_undo  # the plain path stays as it is
        #: Each slot's ``(start state, start observation, turns)`` (``restarts`` only), and
        #: its ``(state, observation, turns)`` before its last step (``lasts`` only).
        self._starts: dict[int, tuple] = {}
        self._lasts: dict[int, tuple] = {}
        self.instructions = getattr(first, "instructions", "") or getattr(
            first.unwrapped, "instructions", ""
        )
        self.has_frames = shows_frames(env_kwargs)
        self._envs: list = [first] + [None] * (capacity - 1)
        self._turns = [0] * capacity
        self._horizon: list[int | None] = [None] * capacity
        self._running: set[int] = set()
        #: Envs dropped after a crash, until their close job has run.
        self._dropped: dict[int, object] = {}
        self._max_workers = max_workers
        self._executor = ThreadPoolExecutor(max_workers=max_workers,
                                            thread_name_prefix=f"env-{env_id}")
        self.inline_budget_s = inline_budget_s
        #: Measured wall seconds per step / per reset (moving averages; None until known).
        self.step_cost: float | None = None
        self.reset_cost: float | None = None
        self._ticks = 0

    @staticmethod
    def _average(old: float | None, new: float) -> float:
        return new if old is None else 0.8 * old + 0.2 * new

    def _inline(self, cost: float | None, n: int) -> bool:
        return cost is not None and cost * n <= self.inline_budget_s

    def _timed_steps(self, items: list[tuple[int, str]]) -> list:
        t0 = time.perf_counter()
        out = self._step_chunk(items)
        self.step_cost = self._average(self.step_cost, (time.perf_counter() - t0) / len(items))
        return out

    def _timed_reset(self, env, seed, options):
        t0 = time.perf_counter()
        out = env.reset(seed=seed, options=options)
        self.reset_cost = self._average(self.reset_cost, time.perf_counter() - t0)
        return out

    def _env(self, slot: int):
        if self._envs[slot] is None:
            self._envs[slot] = self._make()
        return self._envs[slot]

    async def reset_many(self, items: list[ResetItem]) -> list[str | Exception]:
        """Reset each row (inline when cheap, else on the thread pool); a row whose env
        raised gets its exception (a crashed env is rebuilt on the slot's next reset)."""
        return await asyncio.gather(*(self._reset(*item) for item in items),
                                    return_exceptions=True)

    async def _reset(self, slot: int, task, seed: int, max_turns: int | None) -> str:
        loop = asyncio.get_running_loop()
        env = self._env(slot)
        options = {"task": task} if task is not None else {}
        try:
            if self._inline(self.reset_cost, 1):
                obs, _ = self._timed_reset(env, seed, options)
            else:
                obs, _ = await loop.run_in_executor(
                    self._executor, self._timed_reset, env, seed, options
                )
        except Exception as e:  # ends only this episode (the engine records env_error)
            if not isinstance(e, InvalidTaskError):  # a crashed env may be broken: rebuild
                self._drop(slot)
            raise
        self._turns[slot] = 0
        self._horizon[slot] = max_turns
        self._running.add(slot)
        if self.undo is not None:
            self._history[slot] = UndoHistory(self.undo, str(obs))
        return str(obs)

    def _step_one(self, slot: int, action: str):
        try:
            return self._envs[slot].step(action)
        except Exception as e:  # the env's failure ends only this episode
            return e

    def _step_undo(self, slot: int, action: str):
        """``_step_one`` under undo rules (the driver applies the horizon)."""
        history = self._history[slot]
        try:
            if history is None:
                return self._envs[slot].step(action)
            return history.step(self._envs[slot], action)
        except Exception as e:  # the env's failure ends only this episode
            return e

    def _step_chunk(self, items: list[tuple[int, str]]) -> list:
        return [self._step_one(slot, action) for slot, action in items]

    async def step_many(self, items: list[tuple[int, str]]) -> list[StepOutcome]:
        """Step many episodes: one thread-pool job per chunk, not one per episode."""
        out: list[StepOutcome | None] = [None] * len(items)
        live = []
        for i, (slot, action) in enumerate(items):
            if slot in self._running:
                live.append((i, slot, action))
            else:
                out[i] = NOT_RUNNING
        if live:
            loop = asyncio.get_running_loop()
            self._ticks += 1
            pairs = [(slot, action) for _, slot, action in live]
            if self._inline(self.step_cost, len(live)):
                chunks, results = [live], [self._timed_steps(pairs)]
            elif self.step_cost is None or self._ticks % self.probe_every == 0:
                # One job: its wall time is the envs' own (no sibling jobs on the GIL).
                chunks = [live]
                results = [await loop.run_in_executor(self._executor, self._timed_steps, pairs)]
            else:
                n = max(1, min(self._max_workers, len(live)))
                chunks = [live[k::n] for k in range(n)]
                results = await asyncio.gather(*(
                    loop.run_in_executor(self._executor, self._step_chunk, pairs[k::n])
                    for k in range(n)
                ))
            for chunk, res in zip(chunks, results):
                for (i, slot, _), r in zip(chunk, res):
                    out[i] = self._outcome(slot, r)
        return out  # type: ignore[return-value]

    def _outcome(self, slot: int, result) -> StepOutcome:
        if isinstance(result, Exception):
            self._running.discard(slot)
            self._history[slot] = None
            self._drop(slot)
            return StepOutcome.env_error(result)
        obs, rew, term, trunc, info = result
        self._turns[slot] += 1
        cap = self._horizon[slot]
        if not term and cap is not None and self._turns[slot] >= cap:
            trunc = True
        reason = "done" if term else ("horizon" if trunc else None)
        if reason:
            self._running.discard(slot)
            self._history[slot] = None
        return StepOutcome(str(obs), float(rew), bool(term), bool(trunc), reason,
                           invalid=bool(info and info.get("invalid")),
                           undo=bool(info and info.get("undo")))

    def _drop(self, slot: int) -> None:
        """Forget the env of ``slot`` after it raised (the next reset builds a new one) and
        close it on the thread pool, off the event loop (a remote env sends a request)."""
        env, self._envs[slot] = self._envs[slot], None
        if env is not None:
            self._dropped[id(env)] = env
            self._executor.submit(self._close_dropped, id(env))

    def _close_dropped(self, key: int) -> None:
        env = self._dropped.pop(key, None)  # atomic: closed here or by ``close``, once
        if env is not None:
            _close_quietly(env)

    def finish(self, items: list[tuple[int, str]]) -> None:
        self._running.difference_update(slot for slot, _ in items)
        if self.undo is not None:
            for slot, _ in items:
                self._history[slot] = None

    async def save_starts(self, slots: list[int]) -> list[Exception | None]:
        """Keep each slot's state (an episode just reset) as its start, for
        :meth:`restart`; a slot whose env failed to copy itself gets the exception."""
        out: list[Exception | None] = []
        for slot in slots:
            try:
                env = self._envs[slot]
                history = self._history[slot]
                self._starts[slot] = (env_method(env, "snapshot")(),
                                      history.observation if history is not None else None, 0)
                out.append(None)
            except Exception as e:  # ends only this episode (env_error)
                self._starts.pop(slot, None)
                out.append(e)
        return out

    async def restart(self, slot: int) -> None:
        """Put ``slot``'s env back at its start; the horizon counts anew (and, with undo
        rules, the undo history and cap)."""
        self._put_back(slot, self._starts[slot])

    def _put_back(self, slot: int, saved: tuple) -> None:
        state, observation, turns = saved
        env_method(self._envs[slot], "restore")(state)
        self._turns[slot] = turns
        self._running.add(slot)
        if self.undo is not None:
            self._history[slot] = UndoHistory(self.undo, observation)

    def drop_saved(self, slots: list[int]) -> None:
        """Forget the start states of ``slots`` and their states before the last step."""
        for slot in slots:
            self._starts.pop(slot, None)
            self._lasts.pop(slot, None)

    def save_lasts(self, slots: list[int]) -> None:
        """Keep the state of running ``slots`` as it is before their next step; a slot
        whose env fails to copy itself keeps none (its retry goes back to the start)."""
        for slot in slots:
            history = self._history[slot]
            try:
                self._lasts[slot] = (env_method(self._envs[slot], "snapshot")(),
                                     history.observation if history is not None else None,
                                     self._turns[slot])
            except Exception:
                self._lasts.pop(slot, None)

    def has_last(self, slot: int) -> bool:
        return slot in self._lasts

    async def restore_last(self, slot: int) -> None:
        """Put ``slot``'s env back as it was before its last step (the turn count too;
        with undo rules, an undo history that starts there)."""
        self._put_back(slot, self._lasts[slot])

    async def fork(self, src: int, targets: list[int]) -> None:
        """Put the state of running slot ``src`` (its env's ``snapshot()``, turn count,
        horizon and undo history) into the free slots ``targets``; each then steps on its
        own (``restore`` copies what it restores)."""
        if src not in self._running:
            raise RuntimeError(f"slot {src} has no running episode to fork")
        state = env_method(self._envs[src], "snapshot")()
        history = self._history[src]
        for t in targets:
            env_method(self._env(t), "restore")(state)
            self._turns[t], self._horizon[t] = self._turns[src], self._horizon[src]
            self._running.add(t)
            if history is not None:
                self._history[t] = history.copy()

    async def oracle_action(self, slot: int) -> str | None:
        fn = getattr(self._env(slot).unwrapped, "oracle_action", None)
        return fn() if fn else None

    async def frames(self, slots: list[int]) -> list:
        """Each slot's picture from its env's ``frame()`` (None where it has no env or shows
        nothing; the exception where drawing raised), on the event loop: a frame is drawn
        from state the env already holds."""
        out: list = []
        for slot in slots:
            env = self._envs[slot]
            frame = env_method(env, "frame") if env is not None else None
            try:
                out.append(frame() if frame is not None else None)
            except Exception as e:  # ends only this episode (the engine records env_error)
                out.append(e)
        return out

    async def valid_actions(self, slot: int) -> list[str]:
        fn = getattr(self._env(slot).unwrapped, "valid_actions", None)
        return list(fn()) if fn else []

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        for env in self._envs:
            if env is not None:
                env.close()
        for key in list(self._dropped):  # crashed envs whose close job had not run yet
            self._close_dropped(key)


