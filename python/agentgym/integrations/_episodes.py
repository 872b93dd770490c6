"""What the trainer adapters share: task references in dataset rows and an episode
coalescer that turns many concurrent one-episode requests into batched engine runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from agentgym.data.trajectories import Trajectory
from agentgym.engine.batching import TickBatcher
from agentgym.engine.orchestrator import RolloutEngine


class TaskRefError(ValueError):
    """A dataset row or prompt does not say which agentgym env and task to play, or names
    a multi-seat game (the adapters hand over one trajectory per request)."""


def single_agent(env_id: str) -> str:
    """``env_id``, where it is not a multi-seat game (a :class:`TaskRefError` otherwise):
    one request of the trainer adapters is one episode with one trajectory, while a game's
    episode has one per seat."""
    from agentgym.envs.registry import is_game

    if is_game(env_id):
        raise TaskRefError(f"{env_id} is a multi-seat game: the trainer adapters take "
                           "single-agent envs only (train games with agentgym-rl train "
                           "--self-play)")
    return env_id


def task_label(env_id: str, task: int | str) -> str:
    """The text a dataset row shows as its prompt (the engine renders the real prompt
    from the env's first observation)."""
    return f"agentgym {env_id} task {task}"


def check_task(task: Any) -> int | str:
    """``task`` as a task reference: a task index (an int; a numpy scalar becomes one) or
    the env's task text; a :class:`TaskRefError` otherwise."""
    if hasattr(task, "item") and not isinstance(task, str):  # numpy scalar from a batch
        task = task.item()
    if isinstance(task, bool) or not isinstance(task, (int, str)):
        raise TaskRefError(f"task must be an int index or a task text, got {task!r}")
    return task


def engine_top_k(top_k: Any) -> int:
    """A trainer's ``top_k`` as the engine's: a positive k as is; 0, None or a negative
    value (no top-k filtering in vLLM's, TRL's, verl's and SkyRL's conventions) as -1."""
    k = int(top_k or 0)
    return k if k > 0 else -1


def task_ref(fields: Mapping[str, Any]) -> tuple[str, int | str]:
    """``(env_id, task)`` from a mapping holding ``env_id`` and ``task`` (a task index or
    the env's task text). Numpy scalars are turned into Python ints."""
    try:
        env_id, task = fields["env_id"], fields["task"]
    except (KeyError, TypeError) as e:
        raise TaskRefError(f"no agentgym env_id/task in {fields!r}") from e
    if not isinstance(env_id, str) or not env_id:
        raise TaskRefError(f"env_id must be a non-empty string, got {env_id!r}")
    return single_agent(env_id), check_task(task)


class EpisodeCoalescer:
    """``await coalescer.play(env_id, task, ...)`` plays one episode and returns its
    ``Trajectory``; the requests made during one event-loop iteration are played together.

    Requests with the same env, env kwargs and run overrides form one batch; within it,
    the requests for the same task form one group (played as ``n_samples`` of one task:
    same seed, one ``group_id``), and groups of equal size go to one ``RolloutEngine.collect``
    call. Each concurrent collect gets an engine of its own from a pool made by
    ``make_engine(engine_key)``, so a batch never waits for another batch's episodes.
    A request whose batch could not run (an unknown env id, a bad override) gets that
    exception; episode failures are data (the trajectory's stop reason).
    """

    def __init__(self, make_engine: Callable[[Hashable], RolloutEngine]):
        self._make_engine = make_engine
        self._idle: dict[Hashable, list[RolloutEngine]] = {}
        self._engines: list[RolloutEngine] = []
        self._batcher = TickBatcher(self._play_batch, is_async=True)

    def play(self, env_id: str, task: int | str, *, engine_key: Hashable = None,
             env_kwargs: Mapping[str, Any] | None = None, **overrides) -> asyncio.Future:
        """A future of the episode's ``Trajectory``. ``engine_key`` selects engines made
        for it (``make_engine(engine_key)``); ``overrides`` are ``RolloutConfig`` fields."""
        key = (single_agent(env_id), engine_key, _frozen(env_kwargs or {}),
               _frozen(overrides))
        return self._batcher.submit((key, task, dict(env_kwargs or {}), overrides))

    async def _play_batch(self, items: list) -> list:
        by_key: dict[tuple, dict[int | str, list[int]]] = {}
        for i, (key, task, _, _) in enumerate(items):
            by_key.setdefault(key, {}).setdefault(task, []).append(i)
        jobs = []
        for key, groups in by_key.items():
            by_size: dict[int, list[int | str]] = {}
            for task, idx in groups.items():
                by_size.setdefault(len(idx), []).append(task)
            first = items[next(iter(groups.values()))[0]]
            for size, tasks in by_size.items():
                jobs.append((key, first[2], first[3], size, tasks, [groups[t] for t in tasks]))
        results: list = [None] * len(items)
        outs = await asyncio.gather(*(self._collect(*job[:5]) for job in jobs),
                                    return_exceptions=True)
        for (_, _, _, size, _, idx_groups), out in zip(jobs, outs):
            for g, idx in enumerate(idx_groups):
                for s, i in enumerate(idx):
                    results[i] = out if isinstance(out, BaseException) else out[g * size + s]
        return results

    async def _collect(self, key: tuple, env_kwargs: dict, overrides: dict, n: int,
                       tasks: Sequence[int | str]) -> list[Trajectory]:
        env_id, engine_key = key[0], key[1]
        idle = self._idle.setdefault(engine_key, [])
        if idle:
            engine = idle.pop()
        else:
            engine = self._make_engine(engine_key)
            self._engines.append(engine)
        try:
            batch = await engine.collect(list(tasks), env_id, env_kwargs=env_kwargs,
                                         n_samples=n, **overrides)
        finally:
            idle.append(engine)
        return batch.trajectories

    def close(self) -> None:
        """Close every engine's env drivers."""
        for engine in self._engines:
            engine.close()
        self._engines.clear()
        self._idle.clear()


def _frozen(d: Mapping[str, Any]) -> str:
    return json.dumps(d, sort_keys=True, default=repr)
