"""Env drivers: how the engine resets and steps the episodes of one env id.

- :class:`NativeDriver`: a Rust ``EnvPool``; resets and steps of one event-loop tick go to
  Rust in one batched call (GIL released).
- :class:`PythonDriver`: one Gymnasium env per slot (``agentgym.make``), stepped in a thread
  pool so a slow env never blocks the event loop.
- :class:`ProcessDriver`: Python envs and simulators hosted in worker processes
  (:class:`agentgym.envs.workers.ProcessEnvPool`): real parallelism, and a hung or crashed
  env is killed and restarted without touching the other episodes.

All report failures as data: :class:`StepOutcome` carries the stop reason, and an env
exception in a step ends only its own episode with ``env_error``. A reset that fails
(refused task, env build error, crash) raises in that episode's own ``reset`` call only,
batched native resets included; the engine records it as ``env_error``.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from agentgym import _core
from agentgym.engine.batching import TickBatcher
from agentgym.errors import InvalidTaskError
from agentgym.pool import EnvPool


@dataclass(slots=True)
class StepOutcome:
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    #: ``done``/``horizon``/``env_error`` once the episode ended, else None.
    stop_reason: str | None = None
    error: str | None = None


def _close_quietly(env) -> None:
    try:
        env.close()
    except Exception:  # a crashed env may fail to close too; it is dropped either way
        pass


def is_native(env_id: str) -> bool:
    return env_id in _core.native_env_ids()


class NativeDriver:
    """Drives ``capacity`` slots of a native env through one ``EnvPool``."""

    def __init__(self, env_id: str, capacity: int, **env_kwargs):
        self.env_id = env_id
        self.pool = EnvPool(env_id, capacity, **env_kwargs)
        self.instructions = self.pool.instructions
        self._running: set[int] = set()
        self._resets = TickBatcher(self.reset_batch)
        self._steps = TickBatcher(self.step_batch)
        # Called once per turn by scripted policies: straight to Rust.
        self.oracle_action = self.pool._pool.oracle_action

    def reset_rows(self, items: list[tuple]) -> tuple[list[str], list[tuple[int, Exception]]]:
        """Reset many ``(slot, task, seed, max_turns)`` in one Rust call: the observations
        and ``(row, exception)`` of each row whose env refused its task, could not be built
        or panicked (that episode ended with ``env_error``; the others are running)."""
        slots, tasks, seeds, horizons = zip(*items)
        obs, failed = self.pool.reset(list(slots), tasks=list(tasks), seeds=list(seeds),
                                      max_turns=list(horizons), errors="return")
        if failed:
            bad = {row for row, _ in failed}
            self._running.update(s for row, s in enumerate(slots) if row not in bad)
        else:
            self._running.update(slots)
        return obs, failed

    def reset_batch(self, items: list[tuple]) -> list[str | Exception]:
        """``reset_rows`` with each failed row's exception in place of its observation (a
        :class:`TickBatcher` raises it in that episode's waiter only)."""
        obs, failed = self.reset_rows(items)
        for row, error in failed:
            obs[row] = error
        return obs

    def step_batch(self, items: list[tuple[int, str]]) -> list[StepOutcome]:
        """Step many slots in one Rust call (slots no longer running get ``aborted``)."""
        live = [(i, slot, action) for i, (slot, action) in enumerate(items)
                if slot in self._running]
        out: list[StepOutcome | None] = [None] * len(items)
        if live:
            _, slots, actions = zip(*live)
            obs, rew, term, trunc = self.pool.step(list(slots), list(actions))
            ended = (term | trunc).nonzero()[0].tolist()
            reasons = {}
            if ended:  # only the slots that just ended, one call for all of them
                reasons = dict(zip(ended, self.pool.stop_reasons([slots[k] for k in ended])))
            for k, (i, slot, _) in enumerate(live):
                reason = reasons.get(k)
                if k in reasons:
                    self._running.discard(slot)
                out[i] = StepOutcome(obs[k], float(rew[k]), bool(term[k]), bool(trunc[k]), reason,
                                     obs[k] if reason == "env_error" else None)
        for i in range(len(items)):
            if out[i] is None:
                out[i] = StepOutcome("", 0.0, False, True, "aborted", "episode no longer running")
        return out

    async def reset(self, slot: int, task, seed: int, max_turns: int | None) -> str:
        return await self._resets.submit((slot, task, seed, max_turns))

    @property
    def core_pool(self) -> _core.EnvPool:
        """The Rust pool, for engine calls that step it together with other work."""
        return self.pool._pool

    def ended(self, slots: list[int]) -> None:
        """Slots whose pool episode ended in a step made outside ``step_batch``."""
        self._running.difference_update(slots)

    async def step(self, slot: int, action: str) -> StepOutcome:
        return await self._steps.submit((slot, action))

    def finish(self, slot: int, reason: str) -> None:
        if slot in self._running:
            self._running.discard(slot)
            self.pool.finish([slot], reason)

    def valid_actions(self, slot: int) -> list[str]:
        return self.pool.valid_actions(slot)

    def close(self) -> None:
        self._running.clear()


class PythonDriver:
    """One Gymnasium env per slot, stepped on a thread pool (``max_workers`` threads).

    Fast envs skip the pool: the driver measures the wall time of a reset and of a step
    (an uncontended single-thread job every ``probe_every`` ticks, and every inline call)
    and runs a tick's work inline on the event loop when it is expected to take less than
    ``inline_budget_s`` in total. A thread hand-off costs tens of microseconds and GIL
    switches; a pure-Python env steps in a few. Slow envs (simulators, HTTP) stay on the
    pool. ``inline_budget_s = 0`` always uses the pool. Envs that may hang belong in worker
    processes (``env_workers``), where they can be killed.
    """

    probe_every = 64

    def __init__(self, env_id: str, capacity: int, max_workers: int = 8, **env_kwargs):
        import agentgym

        self.env_id = env_id
        self._make = lambda: agentgym.make(env_id, **env_kwargs)
        first = self._make()
        self.instructions = getattr(first, "instructions", "") or getattr(
            first.unwrapped, "instructions", ""
        )
        self._envs: list = [first] + [None] * (capacity - 1)
        self._turns = [0] * capacity
        self._horizon: list[int | None] = [None] * capacity
        self._running: set[int] = set()
        #: Envs dropped after a crash, until their close job has run.
        self._dropped: dict[int, object] = {}
        self._max_workers = max_workers
        self._executor = ThreadPoolExecutor(max_workers=max_workers,
                                            thread_name_prefix=f"env-{env_id}")
        self.inline_budget_s = 0.002
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

    async def reset(self, slot: int, task, seed: int, max_turns: int | None) -> str:
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
        return str(obs)

    def _step_one(self, slot: int, action: str):
        try:
            return self._envs[slot].step(action)
        except Exception as e:  # the env's failure ends only this episode
            return e

    def _step_chunk(self, items: list[tuple[int, str]]) -> list:
        return [self._step_one(slot, action) for slot, action in items]

    async def step(self, slot: int, action: str) -> StepOutcome:
        (out,) = await self.step_many([(slot, action)])
        return out

    async def step_many(self, items: list[tuple[int, str]]) -> list[StepOutcome]:
        """Step many episodes: one thread-pool job per chunk, not one per episode."""
        out: list[StepOutcome | None] = [None] * len(items)
        live = []
        for i, (slot, action) in enumerate(items):
            if slot in self._running:
                live.append((i, slot, action))
            else:
                out[i] = StepOutcome("", 0.0, False, True, "aborted", "episode no longer running")
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
            self._drop(slot)
            msg = f"{type(result).__name__}: {result}"
            return StepOutcome(f"Environment error: {msg}", 0.0, False, True, "env_error", msg)
        obs, rew, term, trunc, _ = result
        self._turns[slot] += 1
        cap = self._horizon[slot]
        if not term and cap is not None and self._turns[slot] >= cap:
            trunc = True
        reason = "done" if term else ("horizon" if trunc else None)
        if reason:
            self._running.discard(slot)
        return StepOutcome(str(obs), float(rew), bool(term), bool(trunc), reason)

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

    def finish(self, slot: int, reason: str) -> None:
        self._running.discard(slot)

    def oracle_action(self, slot: int) -> str | None:
        fn = getattr(self._env(slot).unwrapped, "oracle_action", None)
        return fn() if fn else None

    def valid_actions(self, slot: int) -> list[str]:
        fn = getattr(self._env(slot).unwrapped, "valid_actions", None)
        return list(fn()) if fn else []

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        for env in self._envs:
            if env is not None:
                env.close()
        for key in list(self._dropped):  # crashed envs whose close job had not run yet
            self._close_dropped(key)


class ProcessDriver:
    """``capacity`` episodes of a Python env spread over ``num_workers`` processes."""

    def __init__(self, env_id: str, capacity: int, num_workers: int = 2,
                 timeout_s: float = 120.0, **env_kwargs):
        import agentgym
        from agentgym.envs.workers import ProcessEnvPool

        self.env_id = env_id
        probe = agentgym.make(env_id, **env_kwargs)  # instructions without starting workers
        self.instructions = getattr(probe.unwrapped, "instructions", "") or ""
        probe.close()
        per_worker = -(-capacity // num_workers)
        self.pool = ProcessEnvPool(env_id, num_workers, per_worker, timeout_s=timeout_s,
                                   **env_kwargs)

    async def reset(self, slot: int, task, seed: int, max_turns: int | None) -> str:
        obs, _ = await self.pool.reset(slot, task, seed, max_turns=max_turns)
        return str(obs)

    async def step(self, slot: int, action: str) -> StepOutcome:
        obs, rew, term, trunc, info = await self.pool.step(slot, action)
        reason = info.get("stop_reason") or ("done" if term else ("horizon" if trunc else None))
        return StepOutcome(str(obs), float(rew), bool(term), bool(trunc), reason,
                           info.get("error"))

    def finish(self, slot: int, reason: str) -> None:
        pass  # the worker's episode is simply reset when the slot is reused

    async def oracle_action(self, slot: int) -> str | None:
        return await self.pool.oracle_action(slot)

    async def valid_actions(self, slot: int) -> list[str]:
        return await self.pool.valid_actions(slot)

    def close(self) -> None:
        self.pool.close()


def make_driver(env_id: str, capacity: int, env_workers: int = 0, **env_kwargs):
    """The driver for ``env_id``: native envs in the Rust pool; Python envs on a thread pool,
    or in ``env_workers`` processes when that is > 0."""
    if is_native(env_id):
        return NativeDriver(env_id, capacity, **env_kwargs)
    if env_workers > 0:
        return ProcessDriver(env_id, capacity, num_workers=env_workers, **env_kwargs)
    return PythonDriver(env_id, capacity, **env_kwargs)
