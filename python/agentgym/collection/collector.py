"""``Collector``: play (task, sample) keys with a runner and stream the trajectories into a
run folder as shards; resumable, each key exactly once.

The runner is a :class:`~agentgym.engine.runner.Runner` (the in-process engine or the Ray
pool, as :func:`~agentgym.engine.runner.open_runner` builds them), or any object with its
``stream_requests`` alone::

    runner.stream_requests(requests, env_id, *, env_kwargs=None, **overrides)
        -> AsyncIterator[Trajectory]

A runner that also has ``stream_batches`` (same arguments plus
``trajectories``; it yields an :class:`~agentgym.engine.EpisodeBatch` per group of episodes
that ended together, as the engine does) is read through it: shards are then built over the
packed buffers, and ``run()`` asks for rows only (no :class:`Trajectory` objects). A runner
must play exactly the given :class:`~agentgym.engine.EpisodeRequest` s and keep each
request's ``group_id`` and ``sample_index`` on its rows; the collector never touches
anything else of it, except an optional ``config`` attribute (a
:class:`~agentgym.engine.RolloutConfig`) whose row-shaping fields it records.

Key (t, s) is the ``t``-th task of the run's task list, sample ``s``: it is played as
``EpisodeRequest(tasks[t], group_id=t, sample_index=s)``, so its env seed comes from (run
seed, t) whatever else has been played, and a resumed run's rows equal an uninterrupted run's
with a deterministic backend. Requests go to the runner in windows of ``window`` keys and
finished trajectories to a background writer thread in shards of ``shard_size`` rows (at
most two shards queued): memory does not grow with the number of episodes.

Finished rows are never held long: a shard is also cut when ``flush_every`` seconds passed
since the last one (checked as episodes finish), and a cancelled run (Ctrl-C or SIGTERM on
the command line; ``asyncio`` cancels the main task) commits the rows it holds before the
cancellation goes on, so an interrupt loses only the episodes in flight. Everything the
collector can check is checked before the folder is touched: the env is built with its
kwargs and the task indices are checked against its task count (:func:`check_tasks`); a new
folder that fails before its first row is removed again, so a corrected command is never
refused as a different run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec
import numpy as np

from agentgym._core import __version__
from agentgym.collection.progress import Progress, format_summary, run_summary
from agentgym.collection.schema import to_table
from agentgym.collection.store import RunStore
from agentgym.data.trajectories import PackedBatch, RowInfo, Trajectory, pack
from agentgym.engine.orchestrator import EpisodeRequest
from agentgym.envs.registry import is_game, seats
from agentgym.errors import ConfigError

__all__ = ["DEFAULT_FLUSH_EVERY_S", "ROW_FIELDS", "Collector", "check_tasks", "collect"]

#: Seconds after which the finished rows are written as a shard, full or not.
DEFAULT_FLUSH_EVERY_S = 30.0

#: Rollout settings that shape the rows: part of a run's identity.
ROW_FIELDS = ("max_turns", "max_new_tokens", "max_total_tokens", "temperature", "top_p",
              "top_k", "action_format", "system_prompt", "seed", "undo", "max_undos",
              "undo_depth", "reflection", "reflection_discount", "reflection_prompt",
              "opponent")


def _episode_end(packed: PackedBatch | None, trajs: list[Trajectory] | None, end: int,
                 count: int) -> int:
    """``end`` moved past the rest of its episode's rows (a game's seats are consecutive
    rows with the same group and sample)."""
    if packed is not None:
        def key(i):
            return packed.group_id[i], packed.sample_index[i]
    else:
        def key(i):
            return trajs[i].group_id, trajs[i].sample_index
    while 0 < end < count and key(end) == key(end - 1):
        end += 1
    return end


#: (env id, kwargs as JSON) -> its task count (None: unbounded), for envs checked already in
#: this process: a Python env is built to count its tasks, once.
_TASK_COUNTS: dict[tuple[str, str], int | None] = {}


def _task_count(env_id: str, env_kwargs: dict[str, Any], kwargs_what: str) -> int | None:
    from agentgym.envs.tasks import task_set

    key = (env_id, json.dumps(env_kwargs, sort_keys=True, default=str))
    if key not in _TASK_COUNTS:
        try:
            _TASK_COUNTS[key] = task_set(env_id, **env_kwargs).num_tasks
        except (TypeError, ValueError) as e:  # the env's constructor refused the kwargs
            why = " ".join(str(e).split())
            raise ConfigError(f"{kwargs_what} {json.dumps(env_kwargs)}: {env_id} refuses "
                              f"them: {why}") from e
    return _TASK_COUNTS[key]


def check_tasks(env_id: str, env_kwargs: dict[str, Any] | None,
                tasks: Sequence[int | str], *, what: str = "tasks",
                kwargs_what: str = "env_kwargs") -> int | None:
    """Build ``env_id`` with ``env_kwargs`` (as the engine will) and check that every task
    index of ``tasks`` is one of its tasks; returns the env's task count (None: unbounded).

    A :class:`~agentgym.errors.ConfigError` names ``kwargs_what`` when the env refuses its
    kwargs, and ``what`` (``tasks``, or the flag) with the env's task count when an index is
    negative or past the end (an env would otherwise wrap it, or fail every episode); an
    unknown id raises :class:`~agentgym.errors.UnknownEnvError`. Task texts are the env's to
    judge when played, and a multi-seat game takes any index (its deals repeat). ``remote:``
    ids are not checked (that would connect)."""
    if env_id.startswith("remote:"):
        return None
    n = _task_count(env_id, dict(env_kwargs or {}), kwargs_what)
    if isinstance(tasks, range):
        if not len(tasks):
            raise ConfigError(f"{what}: no tasks")
        lo, hi = min(tasks[0], tasks[-1]), max(tasks[0], tasks[-1])
    else:
        ints = [t for t in tasks if not isinstance(t, str)]
        if not ints:
            return n
        lo, hi = min(ints), max(ints)
    if lo < 0:
        raise ConfigError(f"{what}: task index {lo} is negative; task indices start at 0")
    # a multi-seat game's deals or openings repeat by design (task i is deal i mod n, the
    # policy's seat turning with the group): any index is one
    if n is not None and hi >= n and not is_game(env_id):
        kw = f" with {json.dumps(env_kwargs)}" if env_kwargs else ""
        raise ConfigError(f"{what} reaches task index {hi}, past the end: {env_id}{kw} has "
                          f"{n} tasks (indices 0 to {n - 1})")
    return n


def _task_spec(tasks: Sequence[int | str]) -> Any:
    if isinstance(tasks, range):
        return {"range": [tasks.start, tasks.stop, tasks.step]}
    return list(tasks)


class _Writer:
    """Shards become Arrow tables and their bookkeeping in the caller (``to_table``,
    ``RunStore.prepare_shard``) and files in a thread (``RunStore.commit_shard``: Parquet
    encoding, compression and fsync release the GIL, and little Python runs there); the
    thread's first error is raised by the next ``submit`` / ``join``."""

    def __init__(self, store: RunStore, row_args: dict[str, Any]):
        self.store, self.row_args = store, row_args
        self.q: queue.Queue = queue.Queue(maxsize=2)
        self.error: BaseException | None = None
        self.held = None  # a shard whose queuing was cancelled
        self.thread = threading.Thread(target=self._loop, name="agentgym-shard-writer",
                                       daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            shard = self.q.get()
            if shard is None:
                return
            if self.error is not None:
                continue
            try:
                self.store.commit_shard(shard)
            except BaseException as e:
                self.error = e

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    async def submit(self, packed: PackedBatch, info: RowInfo) -> None:
        self._raise()
        # Done here, between ticks, the conversion never makes the event loop wait for a GIL
        # hand-over from the writer thread; it wraps the packed buffers (plus one list per
        # scalar column).
        shard = self.store.prepare_shard(to_table(packed, info, **self.row_args))
        await self._put(shard)

    async def _put(self, shard) -> None:
        """Queue ``shard``; with two shards queued, wait for the writer (backpressure). A
        cancelled wait keeps the shard for :meth:`join`, so an interrupt loses none."""
        while True:
            try:
                self.q.put_nowait(shard)
                return
            except queue.Full:
                pass
            try:
                await asyncio.sleep(0.005)
            except asyncio.CancelledError:
                self.held = shard
                raise

    async def join(self) -> None:
        """Commit every queued shard (and one whose queuing was cancelled), then stop."""
        if self.held is not None:
            shard, self.held = self.held, None
            await self._put(shard)
        await self._put(None)
        await asyncio.to_thread(self.thread.join)
        self._raise()

    def stop(self) -> None:
        if self.thread.is_alive():
            with contextlib.suppress(queue.Empty):
                while True:  # drop what is queued: those keys are played again on resume
                    self.q.get_nowait()
            self.q.put(None)
            self.thread.join()


class _ShardBuffer:
    """Finished rows waiting for their shard: ranges of the runner's packed batches, or
    trajectories (from a runner without ``stream_batches``), packed when the shard is
    taken."""

    def __init__(self):
        #: [batch, its row info, first row, end row] per run of consecutive rows of a batch.
        self.parts: list[list] = []
        self.trajs: list[Trajectory] = []
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def add_rows(self, packed: PackedBatch, info: RowInfo, row: int, end: int) -> None:
        """Buffer rows ``row ... end - 1`` of ``packed``."""
        if self.parts and self.parts[-1][0] is packed and self.parts[-1][3] == row:
            self.parts[-1][3] = end
        else:
            self.parts.append([packed, info, row, end])
        self.n += end - row

    def add_trajectories(self, trajs: list[Trajectory]) -> None:
        self.trajs.extend(trajs)
        self.n += len(trajs)

    def take(self) -> tuple[PackedBatch, RowInfo]:
        """The buffered rows as one packed batch and its row info; the buffer emptied."""
        parts, trajs = self.parts, self.trajs
        self.parts, self.trajs, self.n = [], [], 0
        if trajs:
            return pack(trajs), RowInfo.of(trajs)
        return (PackedBatch.concat([p.rows(a, z) for p, _, a, z in parts]),
                RowInfo.concat([i.rows(a, z) for _, i, a, z in parts]))


class Collector:
    """Collect ``tasks`` x ``n_samples`` episodes of ``env_id`` with ``runner`` into the run
    folder ``out`` (created, or resumed when it holds the same run).

    ``tasks``: task indices or task texts (a ``range`` is recorded compactly); ``format``:
    ``"parquet"`` or ``"jsonl"``; ``retry_failed``: play again the keys whose rows failed
    (their rows are replaced); ``tokenizer`` with ``messages=True``: also store the decoded
    segments; ``metadata``: recorded in ``metadata.json`` (model, command line, ...);
    ``identity``: extra fields that must match for a resume (model, tokenizer hash, backend);
    ``overrides``: rollout settings for ``runner.stream_requests`` (``max_turns``, ...).
    ``flush_every``: seconds after which the finished rows become a shard even when it has
    fewer than ``shard_size`` rows (None: only full shards, and the last).

    The env is built with ``env_kwargs`` and the task indices are checked against its task
    count (:func:`check_tasks`), then the folder is opened (and checked against an existing
    run), all here, before any episode. ``stream()`` yields each finished trajectory (once it
    is queued for its shard); ``run()`` plays everything and returns the summary. A run
    whose task is cancelled (Ctrl-C), or whose ``stream()`` is closed before its end,
    commits the rows it holds, sets ``interrupted`` and ``summary`` (what is on disk), and
    lets the cancellation go on.
    """

    def __init__(self, runner, env_id: str, tasks: Sequence[int | str] | int,
                 out: str | os.PathLike, *, n_samples: int = 1,
                 env_kwargs: dict[str, Any] | None = None, format: str = "parquet",
                 shard_size: int = 1000, window: int = 32768, retry_failed: bool = False,
                 tokenizer=None, messages: bool = False, metadata: dict[str, Any] | None = None,
                 identity: dict[str, Any] | None = None, progress: bool | None = None,
                 compression: str = "zstd",
                 flush_every: float | None = DEFAULT_FLUSH_EVERY_S, **overrides: Any):
        if not callable(getattr(runner, "stream_requests", None)):
            raise TypeError(f"{type(runner).__name__} is not a runner: it has no "
                            "stream_requests(requests, env_id, *, env_kwargs, **overrides)")
        if messages and tokenizer is None:
            raise ValueError("messages=True needs the tokenizer")
        for name, value in (("n_samples", n_samples), ("shard_size", shard_size),
                            ("window", window)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if flush_every is not None and not flush_every > 0:
            raise ConfigError(f"flush_every must be > 0 seconds (None: only full shards), "
                              f"got {flush_every!r}")
        self.runner, self.env_id = runner, env_id
        self.tasks = range(tasks) if isinstance(tasks, int) else (
            tasks if isinstance(tasks, range)
            else [x if isinstance(x, str) else int(x) for x in tasks])
        if not len(self.tasks):
            raise ConfigError("no tasks to collect")
        self.n_samples, self.env_kwargs = n_samples, dict(env_kwargs or {})
        check_tasks(env_id, self.env_kwargs, self.tasks)  # before the folder is touched
        self.shard_size, self.window, self.retry_failed = shard_size, window, retry_failed
        self.flush_every = flush_every
        #: the run was cancelled; its finished rows were committed first
        self.interrupted = False
        self.tokenizer = tokenizer if messages else None
        self.progress, self.overrides = progress, overrides
        config = getattr(runner, "config", None)
        base = msgspec.structs.asdict(config) if isinstance(config, msgspec.Struct) else {}
        rollout = {**base, **overrides}
        self.max_turns = rollout.get("max_turns")
        ident = {"env_id": env_id, "env_kwargs": self.env_kwargs,
                 "tasks": _task_spec(self.tasks), "n_samples": n_samples,
                 "rollout": {k: rollout[k] for k in ROW_FIELDS if k in rollout},
                 "messages": bool(messages), **(identity or {})}
        self.store = RunStore(out, ident, fmt=format, compression=compression,
                              metadata={**(metadata or {}), "env_id": env_id,
                                        "agentgym_version": _version()})
        self.out = self.store.path
        self.summary: dict[str, Any] | None = None
        #: rows per key: one per seat of a multi-seat game
        self.per = seats(env_id)

    @property
    def total(self) -> int:
        return len(self.tasks) * self.n_samples

    def missing(self) -> np.ndarray:
        """The flat key indices (``t * n_samples + s``) without a row, ascending."""
        return np.flatnonzero(~self.store.done_mask(len(self.tasks), self.n_samples))

    async def stream(self) -> AsyncIterator[Trajectory]:
        """Play every missing key; yield each trajectory as soon as it is queued for its
        shard. When the iteration ends every shard is committed and ``summary`` is set; a
        consumer that stops early and closes the stream (``contextlib.aclosing``) has every
        trajectory it was given in a committed shard once ``aclose`` returns."""
        async with contextlib.aclosing(self._play(trajectories=True)) as it:
            async for trajs in it:
                for t in trajs:
                    yield t

    async def _play(self, trajectories: bool) -> AsyncIterator[list[Trajectory]]:
        """Play every missing key into shards; with ``trajectories``, yield the finished
        trajectories of each slice of rows once it is queued for its shard."""
        store, n = self.store, self.n_samples
        if self.retry_failed:
            store.drop_failed()
        missing = self.missing()
        per = self.per
        prog = Progress(self.total * per, (self.total - len(missing)) * per, self.progress)
        writer = _Writer(store, {"run_id": store.run_id, "max_turns": self.max_turns,
                                 "env_kwargs": self.env_kwargs, "tokenizer": self.tokenizer})
        buf = _ShardBuffer()
        last = time.monotonic()  # when the last shard was cut

        async def cut() -> None:
            nonlocal last
            await writer.submit(*buf.take())
            last = time.monotonic()

        ok = failed = False
        try:
            for w in range(0, len(missing), self.window):
                ts, ss = np.divmod(missing[w:w + self.window], n)
                reqs = [EpisodeRequest(self.tasks[t], t, s)
                        for t, s in zip(ts.tolist(), ss.tolist())]
                async with contextlib.aclosing(self._batches(reqs, trajectories)) as it:
                    async for packed, info, trajs in it:
                        if packed is None:
                            prog.update(trajs)
                            count = len(trajs)
                        else:
                            prog.update_packed(packed, info)
                            count = len(packed)
                        row = 0
                        while row < count:  # fill the shard buffer, submit when full
                            end = min(count, row + self.shard_size - len(buf))
                            if per > 1:  # an episode's seats stay in one shard
                                end = _episode_end(packed, trajs, end, count)
                            if packed is None:
                                buf.add_trajectories(trajs[row:end])
                            else:
                                buf.add_rows(packed, info, row, end)
                            if len(buf) >= self.shard_size:
                                await cut()
                            if trajectories:
                                yield trajs[row:end]
                            row = end
                        if len(buf) and self.flush_every is not None \
                                and time.monotonic() - last >= self.flush_every:
                            await cut()  # finished rows wait at most about flush_every
            if len(buf):
                await cut()
            await writer.join()
            ok = True
        except (asyncio.CancelledError, GeneratorExit):
            # Ctrl-C, SIGTERM, a cancelled task or a consumer that stopped reading: keep
            # every finished episode (only those in flight are lost), then go on stopping
            self.interrupted = True
            if len(buf):
                await writer.submit(*buf.take())
            await writer.join()
            ok = bool(store.shards) or not store.new_run  # a new run without rows: discarded
            failed = not ok
            raise
        except Exception:
            failed = True
            raise
        finally:
            writer.stop()
            prog.close()
            if ok:
                self._finish(prog)
            elif failed:  # before its first row, a new run leaves no folder behind
                store.discard()
            else:
                store.close()

    async def _batches(self, reqs: list[EpisodeRequest], trajectories: bool
                       ) -> AsyncIterator[tuple[PackedBatch | None, RowInfo | None,
                                                list[Trajectory] | None]]:
        """The runner's finished episodes in groups as ``(packed, info, trajectories)``:
        packed rows and their row info when the runner has ``stream_batches``
        (:class:`~agentgym.engine.RolloutEngine`; trajectories only when asked for), else
        one trajectory at a time without them (its shard is then packed from the
        trajectories)."""
        kw = {"env_kwargs": self.env_kwargs, **self.overrides}
        batches = getattr(self.runner, "stream_batches", None)
        if callable(batches):
            it = batches(reqs, self.env_id, trajectories=trajectories, **kw)
            async with contextlib.aclosing(it):
                async for b in it:
                    yield b.packed, b.info, b.trajectories
            return
        it = self.runner.stream_requests(reqs, self.env_id, **kw)
        async with contextlib.aclosing(it):
            async for traj in it:
                yield None, None, [traj]

    def _finish(self, prog: Progress) -> None:
        store = self.store
        run = run_summary((s["stats"] for s in store.shards), self.total * self.per)
        self.summary = {"out": str(self.out), "run_id": store.run_id, "env_id": self.env_id,
                        "run": run, "session": prog.session(), "shards": len(store.shards)}
        if self.interrupted:
            self.summary["interrupted"] = True
        store.finish(run["complete"], self.summary)
        store.close()

    async def run(self) -> dict[str, Any]:
        """Play every missing key and return the summary (also in ``summary.json``); the
        rows go to the shards without becoming :class:`Trajectory` objects."""
        async for _ in self._play(trajectories=False):
            pass
        assert self.summary is not None
        return self.summary

    def close(self) -> None:
        """Release the folder (when ``stream`` was never run to its end)."""
        self.store.close()


def _version() -> str:
    return __version__


def collect(env: str, tasks: Sequence[int | str] | int, out: str | os.PathLike, *,
            backend: str = "scripted", model: str | None = None, n_samples: int = 1,
            policy: str | None = None, runner=None,
            backend_kwargs: dict[str, Any] | None = None,
            rollout: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    """Collect ``tasks`` x ``n_samples`` episodes of ``env`` into ``out`` and return the
    summary (synchronous; resumes an existing run folder). Without ``runner`` one is built
    from ``backend`` and ``model`` (:func:`~agentgym.engine.runner.open_runner`;
    ``backend_kwargs``: the backend's constructor arguments; ``rollout``: its
    :class:`~agentgym.engine.RolloutConfig` fields). ``policy``: the scripted backend's
    policy, ``"oracle"`` (its default) or ``"random"``, as ``agentgym-rl collect --policy``
    (the same as ``backend_kwargs={"policy": ...}``). ``kwargs`` go to :class:`Collector`
    (``env_kwargs``, ``shard_size``, ``flush_every``, rollout overrides such as
    ``max_turns``, ...).

    The env, its kwargs and the task indices are checked before the backend is opened
    (:func:`check_tasks`). Interrupted (Ctrl-C), it commits the finished rows and raises
    ``KeyboardInterrupt``; the same call resumes."""
    from agentgym.engine.loop import run
    from agentgym.engine.runner import open_runner

    backend_kwargs = dict(backend_kwargs or {})
    if policy is not None:
        if runner is not None or backend != "scripted":
            raise ConfigError(f"policy={policy!r} is the scripted backend's (backend="
                              f"'scripted', without runner=); got backend={backend!r}")
        if policy not in ("oracle", "random"):
            raise ConfigError(f"policy must be 'oracle' or 'random', got {policy!r}")
        if backend_kwargs.get("policy", policy) != policy:
            raise ConfigError(f"policy={policy!r} and backend_kwargs['policy']="
                              f"{backend_kwargs['policy']!r} disagree")
        backend_kwargs["policy"] = policy

    async def main() -> dict[str, Any]:
        if runner is not None:
            return await Collector(runner, env, tasks, out, n_samples=n_samples,
                                   **kwargs).run()
        # the env and its tasks first: opening a backend can take minutes
        env_tasks = range(tasks) if isinstance(tasks, int) else tasks
        if isinstance(env_tasks, (range, list, tuple)):
            check_tasks(env, kwargs.get("env_kwargs"), env_tasks)
        opened = await asyncio.to_thread(
            open_runner, backend, model, backend_kwargs=backend_kwargs,
            **{"progress": False, **(rollout or {})})
        try:
            kwargs.setdefault("tokenizer", opened.tokenizer)
            kwargs["identity"] = {**opened.identity, **kwargs.get("identity", {})}
            return await Collector(opened.runner, env, tasks, out, n_samples=n_samples,
                                   **kwargs).run()
        finally:
            await opened.runner.aclose()

    summary = run(main())
    if kwargs.get("progress"):
        print(format_summary(summary), file=sys.stderr)
    return summary
