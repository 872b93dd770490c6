"""Rollout workers on Ray: :class:`RayRolloutPool` spreads episode requests over Ray actors.

Each worker is a Ray actor (:class:`RolloutWorker`) with declared resources (CPUs, GPUs) that
owns its own :class:`~agentgym.engine.RolloutEngine`, env pools and backend (vLLM in process,
an OpenAI-compatible server, transformers or the scripted policy), built from a
:class:`WorkerSpec` with :func:`agentgym.backends.make_backend`.

The driver side, :class:`RayRolloutPool`, has the engine's interface (``stream_requests``,
``stream``, ``collect``, ``requests``, ``reseed``), so whatever consumes a
``RolloutEngine`` consumes the pool:

* **Load balancing.** A call opens one stream on every worker (the engine's
  ``stream_requests`` over an async feed) and hands out chunks of requests (by default
  one chunk is a worker's ``max_concurrency``): a worker holds at most its
  ``max_concurrency`` plus one chunk, and gets the next chunk when its results come back,
  so a faster worker takes more.
* **Streaming.** Each worker sends back what finished since its last message (about one
  chunk per message: the rows packed as the trajectory store drains them, with their
  ``RowInfo``, so the worker makes no per-token Python objects), and the pool yields each
  trajectory at once, in completion order: nobody waits for the slowest worker.
* **Faults.** A worker that dies mid-run (a crash, ``ray.kill``, a lost node) has its
  unfinished requests handed to the other workers or to its restarted replacement; every
  request's trajectory comes back exactly once, and a re-run one records
  ``timings["rollout/retries"]``. A request whose workers died ``max_request_retries + 1``
  times comes back as a failed trajectory (stop reason ``aborted``, no tokens) instead of
  sinking the batch. A backend failure inside a worker stays per-episode data, as in
  process (``backend_error``).
* **Weights.** :meth:`RayRolloutPool.update_weights` sends a state dict through the Ray
  object store (one copy, read by every worker) or, for the vLLM backend, as a safetensors
  folder written once into ``weights_dir`` (a folder every worker can read); a path is sent
  as is. Every worker's backend then serves the new weights with ``policy_version`` set to
  the pool's version, so each trajectory carries the version it was generated with and
  the trainer's staleness rule applies unchanged.
* **Games.** A multi-seat game's request comes back as one row per seat, as in process
  (``seat_info`` tags them): a worker sends an episode's rows only once every seat's row
  has drained, so a worker's death never splits an episode, and a request that gave up
  comes back as one failed row per seat.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from agentgym.data.frames import Frame, RowImages
from agentgym.data.trajectories import (
    PACKED_FIELDS,
    PackedBatch,
    RowInfo,
    Trajectory,
    pack,
    unpack,
)
from agentgym.engine.config import RolloutConfig
from agentgym.engine.metrics import batch_metrics
from agentgym.engine.orchestrator import (
    EpisodeBatch,
    EpisodeRequest,
    RolloutBatch,
    group_requests,
    open_engine,
)
from agentgym.envs.registry import roles
from agentgym.envs.registry import seats as env_seats
from agentgym.errors import AgentGymError

__all__ = ["RayRolloutPool", "RolloutWorker", "RolloutWorkerError", "WorkerSpec", "init_ray",
]

log = logging.getLogger(__name__)

#: How long a worker holds finished episodes back to send them with the ones that finish
#: right after (one message per chunk of requests rather than one per wake-up).
_LINGER_S = 0.01


class _Wire(msgspec.Struct, array_like=True, gc=False):
    """What finished on a worker since its last message, as it sends it: the request index
    of each row, the rows packed (each :class:`PackedBatch` field's buffer as bytes) and
    their :class:`RowInfo` fields. No per-token Python object is made on the worker, and the
    driver rebuilds trajectories with :func:`~agentgym.data.trajectories.unpack`."""

    index: list[int]
    arrays: dict[str, bytes]
    #: RowInfo's fields (``seat_info`` None where no row is a game's)
    info: dict[str, list | None]
    #: Each row's frames and image refs (``PackedBatch.images``; None: no image rows)
    images: list[tuple[list[Frame], list[int]]] | None = None


def _encode(index: list[int], packed: PackedBatch, info: RowInfo) -> bytes:
    """msgpack of finished rows in the :class:`_Wire` form (row ``i`` is request
    ``index[i]``)."""
    arrays = {f.name: getattr(packed, f.name).tobytes() for f in fields(PackedBatch)}
    images = None if packed.images is None else [(r.frames, r.refs) for r in packed.images]
    return _encoder.encode(_Wire(index, arrays, {f.name: getattr(info, f.name)
                                                 for f in fields(RowInfo)}, images))


def _decode_rows(message: bytes) -> tuple[list[int], PackedBatch, RowInfo]:
    """The request indices, packed rows and row info of one :func:`_encode` message (the
    arrays are read-only views of the message's buffers)."""
    w = _wire_decoder.decode(message)
    packed = PackedBatch.from_dict({
        **{name: np.frombuffer(w.arrays[name], dtype) for name, dtype in PACKED_FIELDS.items()},
        "images": None if w.images is None else [RowImages(f, r) for f, r in w.images]})
    return w.index, packed, RowInfo(**w.info)


def _unpack(packed: PackedBatch, info: RowInfo) -> list[Trajectory]:
    """:func:`~agentgym.data.trajectories.unpack` without collection passes: the token lists
    are garbage-free numbers, so a pass over them mid-build is wasted work (and the driver
    rebuilds every trajectory of the run)."""
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        return unpack(packed, info)
    finally:
        if gc_was_on:
            gc.enable()


_encoder = msgspec.msgpack.Encoder()
_wire_decoder = msgspec.msgpack.Decoder(_Wire)


class RolloutWorkerError(AgentGymError):
    """Rollout workers cannot run: a worker failed to start (bad model folder, missing
    resources), or every worker is dead and none may be restarted."""


@dataclass
class WorkerSpec:
    """What one rollout worker runs and the resources it reserves.

    ``backend``: ``"transformers"``, ``"vllm"``, ``"openai"`` (``backend_kwargs`` go to
    :func:`~agentgym.backends.make_backend`, e.g. ``base_url``) or ``"scripted"``
    (:class:`~agentgym.backends.scripted.ScriptedBackend`, kwargs ``policy``/``seed``).
    ``model_dir`` holds the tokenizer (and the weights). ``rollout``:
    :class:`~agentgym.engine.RolloutConfig` fields of the worker's engine
    (``max_concurrency`` is its share of the episodes in flight). ``num_cpus``/``num_gpus``
    are the Ray resources of the actor; ``torch_threads`` defaults to ``num_cpus``.
    """

    model_dir: str
    backend: str = "transformers"
    backend_kwargs: dict[str, Any] = field(default_factory=dict)
    rollout: dict[str, Any] = field(default_factory=dict)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    torch_threads: int | None = None

    @property
    def max_concurrency(self) -> int:
        return int(self.rollout.get("max_concurrency", RolloutConfig().max_concurrency))


class RolloutWorker:
    """One rollout worker (run as a Ray actor; see :class:`RayRolloutPool`): a
    ``RolloutEngine`` and its backend, playing the requests the pool feeds it. Its episode
    keys (a game's ``episode_id``) start at ``key_base``, which the pool makes distinct per
    worker and restart."""

    def __init__(self, spec: WorkerSpec, index: int = 0, key_base: int = 0):
        threads = spec.torch_threads or max(1, int(spec.num_cpus))
        if spec.backend in ("transformers", "vllm"):
            import torch

            torch.set_num_threads(threads)
        self.index = index
        kw = dict(spec.backend_kwargs)
        if spec.backend == "transformers":
            kw.setdefault("device", "cuda" if spec.num_gpus else "cpu")
        self.engine = open_engine(spec.backend, spec.model_dir, backend_kwargs=kw,
                                  **{"progress": False, **spec.rollout})
        self.tokenizer = self.engine.tokenizer
        self.backend = self.engine.backend
        if getattr(self.backend, "cpus", None):  # the worker's turn loop beside its engine
            from agentgym.backends.vllm_backend import pin_process

            pin_process(self.backend.cpus)
        self.key_base = int(key_base)
        if self.key_base:
            self.engine.reseed(0, self.key_base)
        self.feeds: dict[str, asyncio.Queue] = {}

    def ready(self) -> int:
        return os.getpid()

    def _feed(self, session: str) -> asyncio.Queue:
        if session not in self.feeds:
            self.feeds[session] = asyncio.Queue()
        return self.feeds[session]

    async def run(self, session: str, env_id: str, env_kwargs: dict | None,
                  overrides: dict, version: int, flush: int = 1,
                  seeding: tuple[int | None, str | None, int | None] | None = None):
        """Play what :meth:`submit` feeds session ``session`` until :meth:`end`; yields
        the encoded ``[(request index, trajectory), ...]`` of what finished since the last
        message (a Ray streaming generator). A message goes once ``flush`` trajectories
        are ready, ``_LINGER_S`` after the first of them, or when the stream ends.
        ``seeding``: the pool's last ``reseed`` (episode-key start, request-id prefix,
        sampling seed), applied to this worker's engine first; the worker's index joins the
        prefix, so no two workers name a request alike."""
        feed = self._feed(session)
        seats = env_seats(env_id)
        self.backend.policy_version = max(self.backend.policy_version, int(version))
        if seeding is not None:
            key_start, run_id, sampling_seed = seeding
            self.engine.reseed(0, (key_start or 0) + self.key_base, None if run_id is None
                               else f"{run_id}w{self.index}", sampling_seed)
        pending: dict[tuple, list[int]] = {}

        async def requests():
            while (chunk := await feed.get()) is not None:
                for idx, req in chunk:
                    req = EpisodeRequest(*req)
                    pending.setdefault((req.task, req.group_id, req.sample_index),
                                       []).append(idx)
                    yield req

        out: list[tuple[list[int], PackedBatch, RowInfo]] = []
        held = _WholeEpisodes(seats)
        ready = asyncio.Event()
        failed: list[BaseException] = []

        async def pump():
            try:
                it = self.engine.stream_batches(requests(), env_id, env_kwargs=env_kwargs,
                                                trajectories=False, **overrides)
                async for packed, info, _ in it:
                    if seats > 1:
                        whole = held.add(packed, info)
                        if whole is None:
                            continue
                        packed, info = whole
                    index, episode_of = [], {}
                    for k, key in enumerate(zip(info.task_id, packed.group_id.tolist(),
                                                packed.sample_index.tolist())):
                        eid = info.seat_info[k][0] if seats > 1 else k
                        if eid not in episode_of:  # one request per episode, all its seats
                            episode_of[eid] = pending[key].pop()
                        index.append(episode_of[eid])
                    out.append((index, packed, info))
                    ready.set()
            except BaseException as e:  # surfaced to the driver below
                failed.append(e)
            finally:
                failed.append(None)  # type: ignore[arg-type]
                ready.set()

        def rows() -> int:
            return sum(len(i) for i, _, _ in out)

        task = asyncio.ensure_future(pump())
        loop = asyncio.get_running_loop()
        try:
            while True:
                await ready.wait()
                ready.clear()
                deadline = loop.time() + _LINGER_S
                while out and not failed and rows() < flush:
                    wait = deadline - loop.time()
                    if wait <= 0:
                        break
                    try:
                        await asyncio.wait_for(ready.wait(), wait)
                    except asyncio.TimeoutError:
                        break
                    ready.clear()
                if out:
                    batch, out[:] = list(out), []
                    yield _encode([i for b in batch for i in b[0]],
                                  PackedBatch.concat([b[1] for b in batch]),
                                  RowInfo.concat([b[2] for b in batch]))
                if failed:
                    break
        finally:
            task.cancel()
            self.feeds.pop(session, None)
        if failed[0] is not None:
            raise failed[0]

    def submit(self, session: str, chunk: list[tuple[int, tuple]]) -> None:
        """Add ``(request index, request)`` pairs to session ``session``'s feed."""
        self._feed(session).put_nowait(chunk)

    def end(self, session: str) -> None:
        """No more requests for session ``session``: its stream ends once they finish."""
        self._feed(session).put_nowait(None)

    async def update_weights(self, weights, version: int) -> int:
        """Load ``weights`` (a state dict, or a path) and serve them as ``version``."""
        await self.backend.update_weights(weights)
        self.backend.policy_version = int(version)
        return self.backend.policy_version

    def policy_version(self) -> int:
        return int(self.backend.policy_version)

    async def close(self) -> None:
        self.engine.close()
        await self.backend.close()


class _WholeEpisodes:
    """Holds a game's drained rows until every seat of their episode has drained:
    :meth:`add` returns the rows of the episodes now whole (None: none yet), each episode's
    rows consecutive (as the engine drains them, which the collector's shards rely on), in
    the order the episodes began to drain."""

    def __init__(self, seats: int):
        self.seats = seats
        self.rows: Counter[int] = Counter()
        self.held: list[tuple[PackedBatch, RowInfo]] = []

    def add(self, packed: PackedBatch, info: RowInfo) -> tuple[PackedBatch, RowInfo] | None:
        eids = [x[0] for x in info.seat_info]
        self.rows.update(eids)
        if not self.held and all(self.rows[e] == self.seats for e in eids):
            for e in eids:  # the common case: the batch holds whole episodes only
                del self.rows[e]
            return packed, info
        self.held.append((packed, info))
        packed = PackedBatch.concat([p for p, _ in self.held])
        info = RowInfo.concat([i for _, i in self.held])
        eids = [x[0] for x in info.seat_info]
        whole = [k for k, e in enumerate(eids) if self.rows[e] == self.seats]
        if not whole:
            self.held = [(packed, info)]
            return None
        first: dict[int, int] = {}
        for k, e in enumerate(eids):
            first.setdefault(e, k)
        whole.sort(key=lambda k: (first[eids[k]], k))
        rest = [k for k, e in enumerate(eids) if self.rows[e] != self.seats]
        for e in {eids[k] for k in whole}:
            del self.rows[e]
        self.held = [(packed.select(rest), info.select(rest))] if rest else []
        return packed.select(whole), info.select(whole)


def init_ray(address: str | None = None, **kw) -> None:
    """Connect to the Ray cluster at ``address`` (``ray start --head`` prints it; ``"auto"``
    finds a local one), or start a local cluster when ``address`` is None or ``"local"``.
    Does nothing when Ray is already initialised."""
    import ray

    if ray.is_initialized():
        return
    if address in (None, "", "local"):
        kw.setdefault("include_dashboard", False)
        ray.init(address="local", **kw)
    else:
        ray.init(address=address, **kw)


@dataclass(eq=False)
class _Slot:
    """One worker position in the pool: its current actor and its bookkeeping."""

    index: int
    spec: WorkerSpec
    actor: Any = None
    restarts: int = 0
    alive: bool = False
    starting: asyncio.Future | None = None
    outstanding: set[int] = field(default_factory=set)


class RayRolloutPool:
    """Rollouts on ``num_workers`` Ray actors, with :class:`RolloutEngine`'s interface.

    ``spec``: one :class:`WorkerSpec` for every worker, or a list (one per worker; then
    ``num_workers`` is its length). ``chunk_size``: requests handed out at once (default a
    worker's ``max_concurrency``; each chunk costs one actor call and about one message
    back, so small chunks cost throughput: ``bench/distributed.py`` compares a quarter of
    it). A dead worker is replaced up to ``max_restarts`` times per position; a request is
    re-run at most ``max_request_retries`` times. ``weights_dir``: where weights for the vLLM
    backend are written (every worker must read it; default a temporary folder on the
    driver's node).
    Ray must be initialised (:func:`init_ray`) before the pool starts its workers.
    """

    def __init__(self, spec: WorkerSpec | Sequence[WorkerSpec], num_workers: int | None = None,
                 *, config: RolloutConfig | None = None, chunk_size: int | None = None,
                 max_restarts: int = 3, max_request_retries: int = 2,
                 weights_dir: str | None = None, start_timeout_s: float = 600.0):
        specs = [spec] * (num_workers or 1) if isinstance(spec, WorkerSpec) else list(spec)
        if num_workers is not None and num_workers != len(specs):
            raise ValueError(f"num_workers={num_workers} but {len(specs)} worker specs")
        if not specs:
            raise ValueError("a rollout pool needs at least one worker")
        self.specs = specs
        rollout = {k: v for k, v in specs[0].rollout.items()
                   if k in RolloutConfig.__struct_fields__}
        self.config = config or RolloutConfig(**rollout)
        self.chunk_size = chunk_size
        self.max_restarts = max_restarts
        self.max_request_retries = max_request_retries
        self.start_timeout_s = start_timeout_s
        self._weights_dir = weights_dir
        self._own_weights_dir: str | None = None
        self._slots = [_Slot(i, s) for i, s in enumerate(specs)]
        self._groups = itertools.count()
        self._version = 0
        #: the last weights sent (a Ray object ref or a path) and their version, for
        #: restarted workers
        self._latest: tuple[Any, int] | None = None
        self._weights_lock: tuple[Any, asyncio.Lock] | None = None
        self._started = False
        #: the last ``reseed``'s (key start, run id, sampling seed), sent with each stream
        self._seeding: tuple[int | None, str | None, int | None] | None = None
        #: per worker position: requests it delivered; pool-wide fault counters
        self.served: Counter[int] = Counter()
        self.stats: Counter[str] = Counter()
        self._actor_cls = None

    # -- workers ---------------------------------------------------------------------------
    def _key_base(self, slot: _Slot) -> int:
        """Where ``slot``'s current actor starts its episode keys: 2**40 apart per worker
        position and restart, so no two actors of the pool name an episode alike."""
        return (slot.restarts * len(self._slots) + slot.index) << 40

    def _new_actor(self, slot: _Slot):
        import ray

        if self._actor_cls is None:
            self._actor_cls = ray.remote(RolloutWorker)
        s = slot.spec
        return self._actor_cls.options(num_cpus=s.num_cpus, num_gpus=s.num_gpus,
                                       max_concurrency=max(64, s.max_concurrency)
                                       ).remote(s, slot.index, self._key_base(slot))

    async def start_worker(self, slot: _Slot) -> None:
        """Start (or restart) ``slot``'s actor and bring it to the latest weights."""
        import ray

        slot.actor = self._new_actor(slot)
        try:
            await asyncio.wait_for(slot.actor.ready.remote(), self.start_timeout_s)
            if self._latest is not None:
                ref, version = self._latest
                await slot.actor.update_weights.remote(ref, version)
        except (ray.exceptions.RayError, asyncio.TimeoutError) as e:
            slot.alive = False
            with contextlib.suppress(Exception):  # best-effort teardown
                ray.kill(slot.actor)
            raise RolloutWorkerError(f"rollout worker {slot.index} failed to start: "
                                     f"{_cause(e)}") from e
        slot.alive = True

    async def start(self) -> None:
        """Start every worker (once); raises :class:`RolloutWorkerError` if one cannot."""
        if self._started:
            return
        await asyncio.gather(*(self.start_worker(s) for s in self._slots))
        self._started = True

    @property
    def num_workers(self) -> int:
        return len(self._slots)

    @property
    def slots(self) -> list[_Slot]:
        """The worker positions, in index order (their actors and bookkeeping)."""
        return self._slots

    @property
    def seeding(self) -> tuple[int | None, str | None, int | None] | None:
        """The last :meth:`reseed`'s (episode-key start, request-id prefix, sampling seed)
        that each stream sends its workers; None before the first."""
        return self._seeding

    @property
    def num_alive(self) -> int:
        return sum(s.alive for s in self._slots)

    def actor(self, index: int):
        """The Ray actor handle at worker position ``index`` (for tests and tools)."""
        return self._slots[index].actor

    # -- the engine's interface ------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        return self._version

    @policy_version.setter
    def policy_version(self, value: int) -> None:
        # the workers pick it up with their next stream (a resumed run's version count)
        self._version = int(value)

    def requests(self, tasks: int | Sequence[int | str],
                 n_samples: int | None = None) -> list[EpisodeRequest]:
        """``tasks`` x ``n_samples`` requests, each task a fresh group (as
        :meth:`RolloutEngine.requests`)."""
        return group_requests(self._groups, tasks,
                              self.config.n_samples if n_samples is None else n_samples)

    def reseed(self, group_start: int, key_start: int | None = None,
               run_id: str | None = None, sampling_seed: int | None = None) -> None:
        """Restart the group-id (hence episode-seed) counter; the episode-key start, the
        request-id prefix and the sampling seed go to every worker's engine with its next
        stream (see :meth:`RolloutWorker.run`)."""
        self._groups = itertools.count(group_start)
        self._seeding = (group_start * 1024 if key_start is None else key_start, run_id,
                         sampling_seed)

    async def stream(self, tasks: int | Sequence[int | str], env_id: str, *,
                     env_kwargs: dict | None = None, **overrides) -> AsyncIterator[Trajectory]:
        n = overrides.get("n_samples", self.config.n_samples)
        async for t in self.stream_requests(self.requests(tasks, n), env_id,
                                            env_kwargs=env_kwargs, **overrides):
            yield t

    async def collect(self, tasks: int | Sequence[int | str], env_id: str, *,
                      env_kwargs: dict | None = None, **overrides) -> RolloutBatch:
        """All trajectories of ``tasks`` x ``n_samples``, ordered by (group, sample)."""
        t0 = time.perf_counter()
        trajs = [t async for t in self.stream(tasks, env_id, env_kwargs=env_kwargs,
                                              **overrides)]
        trajs.sort(key=lambda t: (t.group_id, t.sample_index, t.seat))
        return RolloutBatch(trajs, batch_metrics(trajs, time.perf_counter() - t0))

    async def stream_requests(self, requests: Iterable[EpisodeRequest]
                              | AsyncIterable[EpisodeRequest], env_id: str, *,
                              env_kwargs: dict | None = None,
                              **overrides) -> AsyncIterator[Trajectory]:
        """Play exactly ``requests`` on the workers and yield each trajectory as soon as it
        comes back (completion order), as :meth:`RolloutEngine.stream_requests` does.

        ``requests`` may be an async iterable: each request then goes to a worker as it
        arrives (the workers' streams stay open), and the stream ends when the iterable is
        exhausted and every episode has come back."""
        async for t in self._run(requests, env_id, env_kwargs, overrides, batches=False):
            yield t

    async def stream_batches(self, requests: Iterable[EpisodeRequest]
                             | AsyncIterable[EpisodeRequest], env_id: str, *,
                             env_kwargs: dict | None = None, trajectories: bool = True,
                             **overrides) -> AsyncIterator[EpisodeBatch]:
        """:meth:`stream_requests`, one :class:`~agentgym.engine.EpisodeBatch` per message
        from a worker (the rows its engine drained together, as it sent them), as
        :meth:`RolloutEngine.stream_batches` does in process. ``trajectories=False`` leaves
        out the :class:`Trajectory` objects: the driver then makes no per-token Python
        objects. A re-run row's retry count is in its trajectory's timings only."""
        async for b in self._run(requests, env_id, env_kwargs, overrides, batches=True,
                                 trajectories=trajectories):
            yield b

    async def _run(self, requests, env_id: str, env_kwargs: dict | None, overrides: dict,
                   batches: bool, trajectories: bool = True) -> AsyncIterator:
        await self.start()
        feed = requests if isinstance(requests, AsyncIterable) else None
        reqs = [] if feed is not None else [_request(r) for r in requests]
        run = _PoolRun(self, reqs, env_id, dict(env_kwargs or {}), overrides,
                       batches=batches, trajectories=trajectories, feed=feed)
        async for item in run:
            yield item

    # -- weights ---------------------------------------------------------------------------
    async def update_weights(self, weights, version: int | None = None) -> int:
        """Send ``weights`` (a ``{name: tensor}`` state dict, or a path to a safetensors file
        or model folder) to every worker; they serve them as ``version`` (default: the
        pool's version + 1). Returns the new version."""
        import ray

        await self.start()
        version = self._version + 1 if version is None else int(version)
        loop = asyncio.get_running_loop()
        if self._weights_lock is None or self._weights_lock[0] is not loop:
            self._weights_lock = (loop, asyncio.Lock())  # one update at a time
        async with self._weights_lock[1]:
            payload = weights
            if not isinstance(weights, (str, Path)):
                if any(s.spec.backend == "vllm" for s in self._slots):
                    payload = await asyncio.to_thread(self._write_weights, weights, version)
                else:
                    payload = ray.put(weights)
            else:
                payload = str(weights)
            self._latest = (payload, version)
            live = [s for s in self._slots if s.alive]
            results = await asyncio.gather(
                *(s.actor.update_weights.remote(payload, version) for s in live),
                return_exceptions=True)
            for s, r in zip(live, results):
                if isinstance(r, ray.exceptions.RayActorError):
                    s.alive = False  # a restart brings it to self._latest
                elif isinstance(r, BaseException):
                    raise r
            self._version = version
        return version

    def _write_weights(self, state_dict, version: int) -> str:
        """A safetensors folder of ``state_dict`` under ``weights_dir``; the previous one
        goes."""
        from safetensors.torch import save_file

        root = self._weights_dir
        if root is None:
            root = self._own_weights_dir = (self._own_weights_dir
                                            or tempfile.mkdtemp(prefix="agentgym-weights-"))
        out = Path(root) / f"v{version}"
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous().cpu() for k, v in state_dict.items()},
                  str(out / "model.safetensors"))
        if self._latest is not None and isinstance(self._latest[0], str):
            old = Path(self._latest[0])
            if old.parent == Path(root) and old != out:
                shutil.rmtree(old, ignore_errors=True)
        return str(out)

    # -- teardown --------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every worker (their engines and backends close with the actor)."""
        import ray

        for s in self._slots:
            if s.actor is not None:
                with contextlib.suppress(Exception):  # best-effort teardown
                    ray.kill(s.actor)
            s.actor, s.alive = None, False
        self._started = False
        if self._own_weights_dir:
            shutil.rmtree(self._own_weights_dir, ignore_errors=True)
            self._own_weights_dir = None

    async def aclose(self) -> None:
        self.close()


def _request(r) -> tuple:
    return tuple(r if isinstance(r, EpisodeRequest) else EpisodeRequest(*r))


class _PoolRun:
    """One ``stream_requests`` or ``stream_batches`` call of a :class:`RayRolloutPool`:
    ``reqs`` all known at the start, or (``feed``, an async iterable) arriving while the
    run goes on."""

    def __init__(self, pool: RayRolloutPool, reqs: list[tuple], env_id: str,
                 env_kwargs: dict, overrides: dict, batches: bool = False,
                 trajectories: bool = True, feed: AsyncIterable | None = None):
        self.pool, self.reqs = pool, reqs
        #: a game's seats (its roles): each request's rows
        self.roles = list(roles(env_id)) or [None]
        #: yield EpisodeBatch items instead of trajectories; ``trajectories=False`` (batches
        #: only) leaves their Trajectory objects out
        self.batches, self.trajectories = batches, trajectories
        self.env_id, self.env_kwargs, self.overrides = env_id, env_kwargs, overrides
        self.session = uuid.uuid4().hex
        self.pending: deque[int] = deque(range(len(reqs)))
        self.feed = feed
        #: every request is known (a list, or the feed exhausted)
        self.fed = feed is None
        self.retries = [0] * len(reqs)
        self.delivered = bytearray(len(reqs))
        self.left = len(reqs)
        self.out: asyncio.Queue = asyncio.Queue()
        self.tasks: dict[int, asyncio.Task] = {}
        self.opened: set[int] = set()

    def _capacity(self, slot: _Slot) -> tuple[int, int]:
        cap = int(self.overrides.get("max_concurrency", slot.spec.max_concurrency))
        chunk = self.pool.chunk_size or max(1, cap)
        return cap, chunk

    def _refill(self, slot: _Slot) -> None:
        """Hand ``slot`` chunks until it holds its capacity plus one chunk."""
        if not slot.alive or slot.index not in self.opened:
            return
        cap, chunk = self._capacity(slot)
        while self.pending and len(slot.outstanding) < cap + chunk:
            take = [self.pending.popleft() for _ in range(min(chunk, len(self.pending)))]
            slot.outstanding.update(take)
            slot.actor.submit.remote(self.session, [(i, self.reqs[i]) for i in take])

    def _refill_all(self) -> None:
        for s in self.pool.slots:
            self._refill(s)

    async def _take_feed(self) -> None:
        """Queue the feed's requests as they arrive and hand them to the workers."""
        try:
            async for r in self.feed:
                self.reqs.append(_request(r))
                self.retries.append(0)
                self.delivered.append(0)
                self.pending.append(len(self.reqs) - 1)
                self.left += 1
                self._refill_all()
        except Exception as e:  # the caller's feed failed: the caller sees it
            self.out.put_nowait(e)
        finally:
            self.fed = True
            self.out.put_nowait(None)  # wakes the consumer to check for the end

    async def _drive(self, slot: _Slot) -> None:
        """Open the session's stream on ``slot`` and take its results until it ends; on the
        worker's death, hand its unfinished requests back and restart it."""
        import ray

        actor = slot.actor
        try:
            gen = actor.run.remote(self.session, self.env_id, self.env_kwargs, self.overrides,
                                   self.pool.policy_version, self._capacity(slot)[1],
                                   self.pool.seeding)
            self.opened.add(slot.index)
            self._refill(slot)
            async for ref in gen:
                index, packed, info = _decode_rows(await ref)
                slot.outstanding.difference_update(index)
                self._deliver(index, packed, info, slot.index)
                self._refill(slot)
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError,
                ray.exceptions.ActorUnavailableError) as e:
            self.opened.discard(slot.index)
            if slot.actor is actor:
                slot.alive = False
            lost = sorted(slot.outstanding)
            slot.outstanding.clear()
            self.pool.stats["worker_deaths"] += 1
            log.warning("rollout worker %d died (%s); re-running its %d unfinished episodes",
                        slot.index, _cause(e), len(lost))
            for idx in reversed(lost):
                self.retries[idx] += 1
                self.pool.stats["requests_retried"] += 1
                if self.retries[idx] > self.pool.max_request_retries:
                    given_up = self._gave_up(idx)
                    self._deliver([idx] * len(given_up), pack(given_up), RowInfo.of(given_up),
                                  slot.index)
                else:
                    self.pending.appendleft(idx)
            self._refill_all()
            if self.left or not self.fed:
                await self._restart(slot)
        except BaseException as e:
            self.out.put_nowait(e)  # an engine bug on the worker: the caller sees it
        else:
            self.opened.discard(slot.index)

    async def _restart(self, slot: _Slot) -> None:
        pool = self.pool
        if slot.restarts >= pool.max_restarts:
            if not any(s.alive for s in pool.slots):
                self.out.put_nowait(RolloutWorkerError(
                    f"every rollout worker is dead and worker {slot.index} has used its "
                    f"{pool.max_restarts} restarts"))
            return
        slot.restarts += 1
        pool.stats["worker_restarts"] += 1
        with contextlib.suppress(Exception):  # best-effort teardown
            import ray

            ray.kill(slot.actor)
        try:
            await pool.start_worker(slot)
        except RolloutWorkerError as e:
            if not any(s.alive for s in pool.slots):
                self.out.put_nowait(e)
            return
        if self.left or not self.fed:
            self.tasks[slot.index] = asyncio.ensure_future(self._drive(slot))

    def _gave_up(self, idx: int) -> list[Trajectory]:
        """Request ``idx``'s failed rows: one, or one per seat of a game (its role, no
        episode id or player: the episode never finished on a worker)."""
        req = EpisodeRequest(*self.reqs[idx])
        return [Trajectory(
            task_id=req.task, env_id=self.env_id, group_id=req.group_id,
            sample_index=req.sample_index,
            token_ids=[], loss_mask=[], logprobs=[], prompt_len=0, turn_rewards=[],
            reward=0.0, num_turns=0, stop_reason="aborted", policy_version=self.pool.policy_version,
            seed=req.seed or 0, seat=seat, role=role,
            error=f"rollout workers died {self.retries[idx]} times while playing this episode")
            for seat, role in enumerate(self.roles)]

    def _deliver(self, index: list[int], packed: PackedBatch, info: RowInfo,
                 worker: int) -> None:
        """Queue the rows of requests ``index`` (row ``i`` is request ``index[i]``; a game's
        request has a row per seat, all in the same message) for the caller, less those
        already delivered (a re-run whose first worker came back)."""
        keep = [i for i, idx in enumerate(index) if not self.delivered[idx]]
        if len(keep) < len(index):
            self.pool.stats["duplicates_dropped"] += (len(index) - len(keep)) // len(self.roles)
            if not keep:
                return
            index = [index[i] for i in keep]
            packed, info = packed.select(keep), info.select(keep)
        requests = set(index)
        for idx in requests:
            self.delivered[idx] = 1
        self.left -= len(requests)
        self.pool.served[worker] += len(requests)
        trajs = _unpack(packed, info) if self.trajectories else None  # True unless batches
        for idx, traj in zip(index, trajs or ()):
            if self.retries[idx]:
                traj.timings["rollout/retries"] = float(self.retries[idx])
        if self.batches:
            self.out.put_nowait(EpisodeBatch(packed, info, trajs))
        else:
            for traj in trajs:
                self.out.put_nowait(traj)

    async def __aiter__(self):
        pool = self.pool
        if not self.reqs and self.fed:
            return
        feeding = asyncio.ensure_future(self._take_feed()) if self.feed is not None else None
        for slot in pool.slots:
            if slot.alive:
                self.tasks[slot.index] = asyncio.ensure_future(self._drive(slot))
            elif slot.actor is not None or slot.restarts < pool.max_restarts:
                self.tasks[slot.index] = asyncio.ensure_future(self._restart(slot))
        try:
            rows = 0  # each request's rows, once
            while not (self.fed and rows == len(self.reqs) * len(self.roles)):
                item = await self.out.get()
                if item is None:  # the feed ended
                    continue
                if isinstance(item, BaseException):
                    raise item
                rows += len(item.packed) if self.batches else 1
                yield item
        finally:
            if feeding is not None:
                feeding.cancel()  # (a finished feed: nothing to cancel)
                await asyncio.gather(feeding, return_exceptions=True)
            for slot in pool.slots:
                slot.outstanding.clear()
                if slot.alive and slot.index in self.opened:
                    with contextlib.suppress(Exception):  # best-effort teardown
                        slot.actor.end.remote(self.session)
            tasks = list(self.tasks.values())
            done, running = await asyncio.wait(tasks, timeout=30) if tasks else ((), ())
            for t in running:
                t.cancel()


def _cause(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[-1] if text else type(e).__name__
