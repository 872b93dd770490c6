"""A process pool for Python envs and simulators, driven from asyncio.

:class:`ProcessEnvPool` hosts ``num_workers x envs_per_worker`` env instances of any
registered Python env id (a ``BaseEnv``, a gymnasium env or a native one) in worker
processes (``spawn`` start method), so hundreds of episodes can be live at once without
blocking the event loop. Requests and results cross one-way pipes as msgpack (msgspec); the
calls made in one event-loop tick travel to a worker as one message, and the parent reads
results with ``loop.add_reader`` (no threads, no polling of live calls).

Fault isolation:

* an env that raises ends only its own episode (``stop_reason="env_error"``);
* a call that makes no progress for ``timeout_s`` seconds is taken to have hung: the worker
  is killed (its whole process group, so simulator JVMs go too) and restarted, that episode
  ends with ``stop_reason="timeout"``;
* a worker that dies mid-call ends the episode of that call with ``"env_error"``;
* the other episodes of a restarted worker survive: their envs are rebuilt by replaying
  ``reset(task, seed)`` and the actions taken so far (envs are deterministic from task,
  seed and actions), then their queued calls run as if nothing happened.

Episode-level results never raise: a failed ``step`` returns ``("", 0.0, False, True,
{"stop_reason": ..., "error": ...})``. Misuse raises named errors (``IndexError``,
``EpisodeNotStartedError``, ``EpisodeFinishedError``).
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import multiprocessing as mp
import os
import pickle
import queue
import random
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import msgspec

from agentgym.envs.base import env_method
from agentgym.errors import (
    AgentGymError,
    EnvError,
    EpisodeFinishedError,
    EpisodeNotStartedError,
)

StepResult = tuple[str, float, bool, bool, dict[str, Any]]


def _enc_hook(obj: Any) -> Any:
    if hasattr(obj, "item") and getattr(obj, "shape", None) == ():
        return obj.item()  # numpy scalars
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    return repr(obj)


_ENC = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_DEC = msgspec.msgpack.Decoder()


# ============================================================================ worker side
def _child_pids(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _worker_main(req_conn, res_conn, spec: dict[str, Any]) -> None:
    """Worker process: host env instances (or, where ``spec["host"]`` names a
    ``module:Class``, that class built with ``spec``: its ``handle`` and ``close``), answer
    requests in order, one result each."""
    os.setpgrp()  # the parent kills the whole group (JVMs included) on a hang
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if spec.get("host"):
        module, _, name = spec["host"].partition(":")
        host = getattr(importlib.import_module(module), name)(spec)
        _serve(req_conn, res_conn, host.handle, host.close)
        return
    from agentgym.envs import registry
    from agentgym.envs.registry import make, register

    if spec["kind"] == "python":  # native and remote ids need no registration
        env_id = spec["env_id"]
        if (not registry.is_registered(env_id)
                or registry.spec(env_id).entry_point != spec["entry_point"]):
            register(spec["env_id"], spec["entry_point"], override=True, **spec["defaults"])
    envs: dict[int, Any] = {}
    running: set[int] = set()  # locals with an episode reset (or replayed) in this process
    undo = spec.get("undo")
    histories: dict[int, Any] = {}  # local -> UndoHistory of its episode (undo rules only)
    if undo is not None:
        from agentgym.engine.drivers.undo import UndoHistory, UndoRules

        undo = UndoRules(*undo)

    def env_of(local: int) -> Any:
        if local not in envs:
            # under undo rules the history applies the horizon (the env's own would roll back)
            horizon = spec["max_turns"] if undo is None else None
            envs[local] = make(spec["env_id"], max_turns=horizon, **spec["env_kwargs"])
        return envs[local]

    def reset(env: Any, task: Any, seed: Any, max_turns: Any) -> Any:
        options = {k: v for k, v in (("task", task), ("max_turns", max_turns)) if v is not None}
        return env.reset(seed=seed, options=options or None)

    def running_env(local: int) -> Any:
        if local not in running:
            raise EnvError("episode is not running in this worker (lost in a worker restart)")
        return envs[local]

    def step(local: int, env: Any, action: str) -> Any:
        history = histories.get(local)
        return env.step(action) if history is None else history.step(env, action)

    def handle(op: str, local: int, args: list[Any]) -> Any:
        if op in ("reset", "replay"):
            running.discard(local)
            histories.pop(local, None)
            env = env_of(local)
            if undo is None:
                obs, info = reset(env, *args[:3])
            else:  # the history applies the horizon: an undo is a turn, never rolled back
                obs, info = reset(env, args[0], args[1], None)
                horizon = args[2] if args[2] is not None else spec["max_turns"]
                histories[local] = UndoHistory(undo, str(obs), max_turns=horizon)
            if op == "replay":
                for action in args[3]:
                    step(local, env, action)
            running.add(local)
            return [obs, info] if op == "reset" else None
        if op == "step":
            obs, r, term, trunc, info = step(local, running_env(local), args[0])
            return [obs, float(r), bool(term), bool(trunc), info]
        if op in ("valid_actions", "oracle_action"):
            running_env(local)
            fn = env_method(env_of(local), op)
            return fn() if fn is not None else ([] if op == "valid_actions" else None)
        if op == "instructions":
            return str(getattr(env_of(local), "instructions", "") or "")
        if op == "info":
            return worker_info(len(envs))
        raise ValueError(f"unknown worker op {op!r}")

    def close() -> None:
        for env in envs.values():
            try:
                env.close()
            except Exception:
                pass

    _serve(req_conn, res_conn, handle, close)


def worker_info(hosted: int) -> dict[str, Any]:
    """A worker's answer to ``info``: its pid, its child pids (JVMs) and what it hosts."""
    return {"pid": os.getpid(), "children": _child_pids(os.getpid()), "envs": hosted}


def _serve(req_conn, res_conn, handle, close) -> None:
    """A worker's message loop: ``handle(op, local, args)`` answers each call of each
    message, in order, with one result (an exception is reported, never raised); ``close``
    runs when the parent shuts the worker down or goes away."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def reader() -> None:  # keeps the request pipe drained so the parent never blocks
        while True:
            try:
                inbox.put(req_conn.recv_bytes())
            except (EOFError, OSError):
                inbox.put(None)
                return

    threading.Thread(target=reader, daemon=True).start()
    res_conn.send_bytes(_ENC.encode([0, True, "ready"]))
    try:
        while True:
            msg = inbox.get()
            if msg is None:
                break
            stop = False
            for call_id, op, local, args in _DEC.decode(msg):
                if op == "shutdown":
                    stop = True
                    res_conn.send_bytes(_ENC.encode([call_id, True, None]))
                    continue
                try:
                    payload = [call_id, True, handle(op, local, args)]
                except BaseException as e:  # noqa: BLE001 (reported to the parent)
                    err = [type(e).__name__, str(e), traceback.format_exc(limit=8)[-2000:]]
                    payload = [call_id, False, err]
                try:
                    data = _ENC.encode(payload)
                except Exception as e:  # unencodable result (e.g. odd info values)
                    data = _ENC.encode([call_id, False, ["TypeError", str(e), ""]])
                res_conn.send_bytes(data)
            if stop:
                break
    finally:
        close()


# ============================================================================ parent side
@dataclass
class _Item:
    call_id: int
    slot: int  # -1: not tied to an episode
    op: str
    local: int
    args: list[Any]
    fut: asyncio.Future
    sent_at: float = 0.0
    epoch: int = 0  # the slot's episode number when the call was made


@dataclass
class _Slot:
    index: int
    state: str = "idle"  # idle | live | done
    task: Any = None
    seed: int | None = None
    max_turns: int | None = None
    actions: list[str] = field(default_factory=list)
    stop_reason: str | None = None
    busy: bool = False
    epoch: int = 0  # episodes started in this slot (a late result of an older one is stale)


class _Worker:
    def __init__(self, index: int):
        self.index = index
        self.proc: Any = None
        self.req: Any = None  # parent writes requests here
        self.res: Any = None  # parent reads results here
        self.pending: collections.OrderedDict[int, _Item] = collections.OrderedDict()
        self.outbox: list[_Item] = []  # calls of this loop tick, sent as one message
        self.last_progress = 0.0
        self.ready = False  # the worker has imported everything and answers
        self.restarts = 0
        self.start_failures = 0  # consecutive deaths before "ready"; 3 make it broken
        self.broken: str | None = None


def _error(name: str, msg: str) -> Exception:
    import agentgym.errors as errors

    if name in errors.__all__:
        return getattr(errors, name)(msg)
    builtin = {"ValueError": ValueError, "TypeError": TypeError, "IndexError": IndexError,
               "KeyError": KeyError, "NotImplementedError": NotImplementedError}  # fmt: skip
    if name in builtin:
        return builtin[name](msg)
    return EnvError(f"{name}: {msg}")


class ProcessEnvPool:
    """``num_workers`` processes, each hosting ``envs_per_worker`` instances of ``env_id``.

    Episode ``i`` lives in worker ``i // envs_per_worker``. ``env_kwargs`` go to
    ``agentgym.make(env_id, max_turns=max_turns, **env_kwargs)`` in the worker. ``undo``
    (:class:`~agentgym.engine.undo.UndoRules`): each worker answers ``undo`` actions with an
    ``UndoHistory`` beside each env (replays included). Use as
    ``async with ProcessEnvPool(...) as pool:`` or call ``await pool.aclose()``.
    """

    def __init__(
        self,
        env_id: str,
        num_workers: int = 2,
        envs_per_worker: int = 1,
        *,
        max_turns: int | None = None,
        timeout_s: float = 60.0,
        seed: int = 0,
        start_method: str = "spawn",
        max_restarts: int = 100,
        undo: Any = None,
        **env_kwargs: Any,
    ):
        from agentgym.envs import registry

        if num_workers < 1 or envs_per_worker < 1:
            raise ValueError("num_workers and envs_per_worker must be >= 1")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        entry = registry.spec(env_id)  # UnknownEnvError early
        if not isinstance(entry.entry_point, str):
            try:
                pickle.dumps(entry.entry_point)
            except Exception as e:
                raise TypeError(
                    f"{env_id!r}: a ProcessEnvPool entry point must be a 'module:attr' string "
                    f"or picklable by reference ({e})"
                ) from None
        self.env_id = env_id
        self.num_workers = num_workers
        self.envs_per_worker = envs_per_worker
        self.num_envs = num_workers * envs_per_worker
        self.timeout_s = float(timeout_s)
        self.max_restarts = max_restarts
        #: time a fresh worker may take to import before its first call counts as hung
        self.startup_timeout_s = 120.0
        self._spec = {
            "env_id": env_id,
            "entry_point": entry.entry_point,
            "defaults": dict(entry.kwargs),
            "kind": entry.kind,
            "max_turns": max_turns,
            "slots": envs_per_worker,
            "env_kwargs": env_kwargs,
            # ``UndoRules`` as (max_undos, depth): the workers answer undo actions
            "undo": None if undo is None else (undo.max_undos, undo.depth),
        }
        self._ctx = mp.get_context(start_method)
        self._rng = random.Random(seed)
        self._slots = [_Slot(i) for i in range(self.num_envs)]
        self._workers = [_Worker(w) for w in range(num_workers)]
        self._next_id = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchdog: asyncio.Task | None = None
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Spawn the workers (done lazily by the first call)."""
        if self._closed:
            raise AgentGymError("ProcessEnvPool is closed")
        loop = asyncio.get_running_loop()
        if self._loop is not None:
            if self._loop is not loop:
                raise AgentGymError("ProcessEnvPool is bound to the event loop that started it")
            return
        self._loop = loop
        for w in self._workers:
            self._spawn(w)
        self._watchdog = self._loop.create_task(self._watch())

    async def __aenter__(self) -> ProcessEnvPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self, timeout_s: float = 10.0) -> None:
        """Shut the workers down (they close their envs, JVMs included); kill stragglers."""
        if self._closed:
            return
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        live = [w for w in self._workers if w.proc is not None]
        futs = [self._send(w, "shutdown") for w in live]
        if futs:
            await asyncio.wait(futs, timeout=timeout_s)
        deadline = time.monotonic() + timeout_s
        for w in live:
            while w.proc.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        self._teardown()

    def close(self) -> None:
        """Synchronous shutdown (outside a running loop): ask politely, then kill."""
        if self._closed:
            return
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        for w in self._workers:
            if w.proc is not None and w.proc.is_alive():
                try:
                    w.req.send_bytes(_ENC.encode([[-1, "shutdown", 0, []]]))
                except OSError:
                    pass
        for w in self._workers:
            if w.proc is not None:
                w.proc.join(timeout=10.0)
        self._teardown()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self._teardown()
            except Exception:
                pass

    def _teardown(self) -> None:
        for w in self._workers:
            self._kill(w)
            self._fail_all(w, "aborted", "ProcessEnvPool closed")

    def _fail_all(self, w: _Worker, reason: str, msg: str) -> None:
        for item in w.pending.values():
            if not item.fut.done() and not item.fut.get_loop().is_closed():
                item.fut.set_result((False, (reason, ["EnvError", msg, ""])))
        w.pending.clear()

    # ------------------------------------------------------------------ episode API
    async def reset(
        self, i: int, task: int | str | None = None, seed: int | None = None,
        max_turns: int | None = None,
    ) -> tuple[str, dict[str, Any]]:  # fmt: skip
        """Start episode ``i``; returns ``(observation, info)``; raises the env's error."""
        (res,) = await self.reset_many([i], [task], [seed], max_turns=max_turns)
        if isinstance(res, BaseException):
            raise res
        return res

    async def reset_many(
        self, ids: list[int], tasks: list[Any] | None = None, seeds: list[int | None] | None = None,
        max_turns: int | None = None,
    ) -> list[tuple[str, dict[str, Any]] | BaseException]:  # fmt: skip
        """Start several episodes; a failed one yields its exception in place of a result."""
        await self.start()
        tasks = list(tasks) if tasks is not None else [None] * len(ids)
        seeds = list(seeds) if seeds is not None else [None] * len(ids)
        if not len(tasks) == len(seeds) == len(ids):
            raise ValueError("ids, tasks and seeds must have the same length")
        slots = [self._free_slot(i) for i in ids]
        if len({s.index for s in slots}) != len(slots):
            raise ValueError("an episode id appears twice in one reset_many call")
        calls = []
        for slot, task, seed in zip(slots, tasks, seeds, strict=True):
            seed = self._rng.randrange(2**63) if seed is None else int(seed)
            calls.append(self._start(slot, task, seed, max_turns))
        futs = self._submit(calls)
        out: list[Any] = []
        for slot, fut in zip(slots, await self._gather(slots, futs), strict=True):
            slot.busy = False
            ok, payload = fut
            if ok:
                out.append((payload[0], payload[1]))
            else:
                slot.state, slot.stop_reason = "done", payload[0]
                out.append(_error(*payload[1][:2]) if payload[0] == "env_error" else
                           EnvError(f"{payload[0]}: {payload[1][1]}"))  # fmt: skip
        return out

    async def step(self, i: int, action: str) -> StepResult:
        """One step of episode ``i``: ``(obs, reward, terminated, truncated, info)``."""
        (res,) = await self.step_many([i], [action])
        return res

    async def step_many(self, ids: list[int], actions: list[str]) -> list[StepResult]:
        """Step several episodes at once (one message per worker); results in ``ids`` order."""
        await self.start()
        if len(ids) != len(actions):
            raise ValueError("ids and actions must have the same length")
        slots = [self._live_slot(i) for i in ids]
        if len({s.index for s in slots}) != len(slots):
            raise ValueError("an episode id appears twice in one step_many call")
        for slot, action in zip(slots, actions, strict=True):
            if not isinstance(action, str):
                raise TypeError(f"action must be a str, got {type(action).__name__}")
            slot.busy = True
        futs = self._submit([(s, "step", [a]) for s, a in zip(slots, actions, strict=True)])
        out: list[StepResult] = []
        for slot, (ok, payload) in zip(slots, await self._gather(slots, futs), strict=True):
            slot.busy = False
            if ok:
                obs, reward, term, trunc, info = payload
                if term or trunc:
                    slot.state, slot.stop_reason = "done", "done" if term else "horizon"
                out.append((obs, reward, term, trunc, info))
            else:
                reason, (name, msg, tb) = payload
                if slot.state != "done":  # keep the first reason (a timeout stays a timeout)
                    slot.state, slot.stop_reason = "done", reason
                info = {"stop_reason": reason, "error": f"{name}: {msg}", "traceback": tb}
                out.append(("", 0.0, False, True, info))
        return out

    async def valid_actions(self, i: int) -> list[str]:
        return await self._query(self._live_slot(i), "valid_actions")

    async def oracle_action(self, i: int) -> str | None:
        return await self._query(self._live_slot(i), "oracle_action")

    async def instructions(self) -> str:
        """The env's instructions (system prompt)."""
        await self.start()
        return await self._query(self._slots[0], "instructions", check_busy=False)

    async def worker_info(self) -> list[dict[str, Any]]:
        """pid, child pids (e.g. JVMs) and env count of each worker."""
        await self.start()
        res = await asyncio.gather(*(self._send(w, "info") for w in self._workers))
        return [payload for _, payload in res]

    def stop_reason(self, i: int) -> str | None:
        return self._slot(i).stop_reason

    def stop_reasons(self) -> list[str | None]:
        return [s.stop_reason for s in self._slots]

    def is_live(self, i: int) -> bool:
        return self._slot(i).state == "live"

    @property
    def restarts(self) -> int:
        """Worker restarts so far (hangs and crashes)."""
        return sum(w.restarts for w in self._workers)

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _start(slot: _Slot, task: Any, seed: int, max_turns: int | None
               ) -> tuple[_Slot, str, list[Any]]:
        """Mark ``slot`` as starting a new episode (its replay log empty, a new epoch); the
        reset call to send."""
        slot.task, slot.seed, slot.max_turns, slot.actions = task, seed, max_turns, []
        slot.state, slot.stop_reason, slot.busy = "live", None, True
        slot.epoch += 1
        return slot, "reset", [task, seed, max_turns]

    def _slot(self, i: int) -> _Slot:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.num_envs:
            raise IndexError(f"episode id {i!r} out of range [0, {self.num_envs})")
        return self._slots[i]

    def _free_slot(self, i: int) -> _Slot:
        slot = self._slot(i)
        if slot.busy:
            raise AgentGymError(f"episode {i} has a call in flight")
        return slot

    def _live_slot(self, i: int) -> _Slot:
        slot = self._free_slot(i)
        if slot.state == "idle":
            raise EpisodeNotStartedError(f"episode {i} has not been reset")
        if slot.state == "done":
            raise EpisodeFinishedError(f"episode {i} has finished ({slot.stop_reason}); reset it")
        return slot

    @staticmethod
    async def _gather(slots: list[_Slot], futs: list[asyncio.Future]) -> list[Any]:
        """The results of ``futs``; if the caller is cancelled meanwhile, ``slots`` are no
        longer busy (the worker still runs the calls; their late results are dropped)."""
        try:
            return await asyncio.gather(*futs)
        except asyncio.CancelledError:
            for slot in slots:
                slot.busy = False
            raise

    async def _query(self, slot: _Slot, op: str, check_busy: bool = True) -> Any:
        if check_busy:
            slot.busy = True
        try:
            ok, payload = await self._submit([(slot, op, [])])[0]
        finally:
            if check_busy:
                slot.busy = False
        if not ok:
            reason, (name, msg, _) = payload
            if reason != "env_error":
                slot.state, slot.stop_reason = "done", reason
            raise _error(name, msg) if reason == "env_error" else EnvError(f"{reason}: {msg}")
        return payload

    def _submit(self, calls: list[tuple[_Slot, str, list[Any]]]) -> list[asyncio.Future]:
        """Queue episode calls, one message per worker; futures resolve to (ok, payload)."""
        items = [self._item(s.index, op, s.index % self.envs_per_worker, a) for s, op, a in calls]
        by_worker: dict[int, list[_Item]] = {}
        for it in items:
            by_worker.setdefault(it.slot // self.envs_per_worker, []).append(it)
        for w, batch in by_worker.items():
            self._enqueue(self._workers[w], batch)
        return [it.fut for it in items]

    def _send(self, w: _Worker, op: str) -> asyncio.Future:
        """Queue one worker-level call (not tied to an episode)."""
        item = self._item(-1, op, 0, [])
        self._enqueue(w, [item])
        return item.fut

    def _item(self, slot: int, op: str, local: int, args: list[Any]) -> _Item:
        assert self._loop is not None
        self._next_id += 1
        fut = self._loop.create_future()
        epoch = self._slots[slot].epoch if slot >= 0 else 0
        return _Item(self._next_id, slot, op, local, args, fut, time.monotonic(), epoch)

    def _enqueue(self, w: _Worker, items: list[_Item]) -> None:
        for it in items:
            w.pending[it.call_id] = it
        if w.proc is None:  # dead and not yet respawned: respawn, resending everything
            self._restart(w)
            return
        if not w.outbox:  # coalesce the calls of this loop tick into one message
            self._loop.call_soon(self._flush, w)
        w.outbox.extend(items)

    def _flush(self, w: _Worker) -> None:
        items, w.outbox = w.outbox, []
        if w.proc is not None:
            self._write(w, items)

    def _write(self, w: _Worker, items: list[_Item]) -> None:
        if not items:
            return
        try:
            w.req.send_bytes(_ENC.encode([[it.call_id, it.op, it.local, it.args] for it in items]))
        except OSError:
            pass  # the worker is gone: EOF on the result pipe triggers the restart

    def _spawn(self, w: _Worker) -> None:
        req_r, req_w = self._ctx.Pipe(duplex=False)
        res_r, res_w = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(
            target=_worker_main, args=(req_r, res_w, self._spec), daemon=True,
            name=f"agentgym-{self.env_id}-{w.index}",
        )  # fmt: skip
        proc.start()
        req_r.close()
        res_w.close()
        w.proc, w.req, w.res = proc, req_w, res_r
        w.last_progress = time.monotonic()
        w.ready = False
        assert self._loop is not None
        self._loop.add_reader(res_r.fileno(), self._on_readable, w)

    def _kill(self, w: _Worker) -> None:
        if w.proc is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.remove_reader(w.res.fileno())
            except (OSError, ValueError):
                pass
        try:
            os.killpg(w.proc.pid, signal.SIGKILL)  # the worker and its JVMs
        except (ProcessLookupError, PermissionError):
            pass
        if w.proc.is_alive():
            w.proc.kill()
        w.proc.join(timeout=5.0)
        for conn in (w.req, w.res):
            conn.close()
        w.proc = w.req = w.res = None

    def _on_readable(self, w: _Worker) -> None:
        try:
            while w.res is not None and w.res.poll():
                call_id, ok, payload = _DEC.decode(w.res.recv_bytes())
                w.last_progress = time.monotonic()
                if call_id == 0:
                    w.ready, w.start_failures = True, 0
                    continue
                item = w.pending.pop(call_id, None)
                if ok and item is not None and item.op == "step":
                    # record at once: a restart may replay this episode before step_many
                    # returns (not into a newer episode of the slot: a cancelled late step)
                    slot = self._slots[item.slot]
                    if item.epoch == slot.epoch:
                        slot.actions.append(item.args[0])
                if item is not None and not item.fut.done():
                    item.fut.set_result((True, payload) if ok else (False, ("env_error", payload)))
        except (EOFError, OSError):
            if w.res is not None:
                self._loop.remove_reader(w.res.fileno())
            if self._closed or w.proc is None:
                return
            w.proc.join(timeout=5.0)
            msg = f"worker process died (exit code {w.proc.exitcode})"
            if not w.ready:
                w.start_failures += 1
                if w.start_failures >= 3:
                    self._kill(w)
                    w.broken = f"worker failed to start 3 times ({msg})"
                    self._fail_all(w, "env_error", w.broken)
                    return
                self._restart(w)  # nothing ran yet: no call is to blame
                return
            self._fail_head(w, "env_error", msg)

    async def _watch(self) -> None:
        tick = min(0.25, self.timeout_s / 4)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for w in self._workers:
                if w.proc is None or not w.pending:
                    continue
                head = next(iter(w.pending.values()))
                limit = self.timeout_s if w.ready else max(self.timeout_s, self.startup_timeout_s)
                if now - max(head.sent_at, w.last_progress) > limit:
                    self._fail_head(w, "timeout", f"no result within {self.timeout_s:g} s")

    def _fail_head(self, w: _Worker, reason: str, msg: str) -> None:
        """The oldest pending call hung or crashed its worker: fail it, restart the rest."""
        if self._closed:
            return
        self._kill(w)
        if w.pending:
            _, head = w.pending.popitem(last=False)
            if head.slot >= 0:
                slot = self._slots[head.slot]
                slot.state, slot.stop_reason = "done", reason
            if not head.fut.done():
                head.fut.set_result((False, (reason, ["EnvError", msg, ""])))
        self._restart(w)

    def _restart(self, w: _Worker) -> None:
        """Respawn ``w``, replay its live episodes, then resend its queued calls."""
        if self._closed:
            return
        if w.proc is not None:
            self._kill(w)
        if w.restarts >= self.max_restarts and not w.broken:
            w.broken = f"worker restarted {w.restarts} times (max_restarts)"
        if w.broken:
            self._fail_all(w, "env_error", w.broken)
            return
        w.restarts += 1
        queued = list(w.pending.values())
        w.pending.clear()
        w.outbox.clear()  # everything pending is resent below
        self._spawn(w)
        resets = {it.slot for it in queued if it.op == "reset"}
        replays = []
        lo = w.index * self.envs_per_worker
        for slot in self._slots[lo : lo + self.envs_per_worker]:
            if slot.state == "live" and slot.index not in resets:
                args = [slot.task, slot.seed, slot.max_turns, list(slot.actions)]
                item = self._item(slot.index, "replay", slot.index % self.envs_per_worker, args)
                item.fut.add_done_callback(lambda f, s=slot: self._replayed(s, f))
                replays.append(item)
        now = time.monotonic()
        for it in replays + queued:
            it.sent_at = now
            w.pending[it.call_id] = it
        self._write(w, replays + queued)

    def _replayed(self, slot: _Slot, fut: asyncio.Future) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        ok, payload = fut.result()
        if not ok and slot.state == "live":
            slot.state, slot.stop_reason = "done", payload[0]
