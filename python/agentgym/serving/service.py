"""The env table behind the AgentGym-protocol server: env ids -> live env instances.

:class:`EnvService` holds the protocol's semantics without HTTP: parsing and checking request
bodies (AgentGym's key spellings included), one env per id, one call at a time per env in a
thread pool, the episode state that responses report, the live-env cap, idle expiry and
closing. :mod:`agentgym.serving.server` puts it behind aiohttp routes. Refusals are
:class:`RequestError` with the HTTP status they answer with.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agentgym.errors import (
    AgentGymError,
    EpisodeFinishedError,
    EpisodeNotStartedError,
    InvalidTaskError,
    UnknownEnvError,
)

#: Keys that name the task index in a reset body, in order of precedence.
TASK_KEYS = ("data_idx", "idx", "game", "session_id")
#: Environment variable holding the bearer token (server and :class:`RemoteEnv` read it).
TOKEN_ENV = "AGENTGYM_AUTH_TOKEN"
#: Response header naming the protocol a server speaks at its root (``generic`` or the
#: AgentGym family), read by :class:`~agentgym.serving.client.RemoteEnv`.
PROTOCOL_HEADER = "X-AgentGym-Protocol"
_MAX_SEED = 2**64 - 1
_MAX_TASK = 2**64 - 1
_log = logging.getLogger(__name__)
_DIGITS = re.compile(r"\s*[0-9]{1,20}\s*")


class RequestError(Exception):
    """A request the server refuses; becomes a JSON error response with ``status``."""

    def __init__(self, status: int, message: str, kind: str = "RequestError", headers=None):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.headers = headers


@dataclass
class _Slot:
    """One live env instance and the episode state the protocol reports."""

    env: Any
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    observation: str = ""
    reset_observation: str = ""
    reward: float = 0.0
    score: float = 0.0
    terminated: bool = False
    truncated: bool = False
    turns: int = 0
    task: Any = None
    seed: int | None = None
    info: dict = field(default_factory=dict)
    actions: list = field(default_factory=list)
    closed: bool = False

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


def _jsonable(value: Any) -> Any:
    """``value`` made JSON-safe (numpy scalars, paths and such become str or numbers)."""
    try:
        return json.loads(json.dumps(value, default=_fallback, allow_nan=False))
    except (TypeError, ValueError):
        return json.loads(json.dumps(value, default=str))


def _fallback(obj: Any) -> Any:
    if hasattr(obj, "item") and callable(obj.item):
        try:
            return obj.item()
        except (TypeError, ValueError):
            pass
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


def json_type(value: Any) -> str:
    """The JSON name of ``value``'s type (what a client sent), for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "an unsupported value"


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _int_field(body: dict, key: str, *, required: bool, minimum: int = 0, maximum=None):
    value = body.get(key)
    if value is None:
        if required:
            raise RequestError(400, f"missing field {key!r}", "MissingField")
        return None
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(
            400, f"field {key!r} must be an integer, got {json_type(value)}", "WrongType"
        )
    if value < minimum or (maximum is not None and value > maximum):
        hi = "" if maximum is None else f" and <= {maximum}"
        raise RequestError(400, f"field {key!r} must be >= {minimum}{hi}, got {value}", "BadValue")
    return value


class EnvService:
    """The env table behind the HTTP routes: ids -> live env instances.

    ``max_envs`` caps live envs (``/create`` answers 503 past it); envs idle for
    ``idle_timeout`` seconds are closed by a sweeper. Env calls run on ``executor``.
    """

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        *,
        max_envs: int | None = 4096,
        idle_timeout: float | None = None,
        threads: int | None = None,
        available_actions: bool = False,
    ):
        from agentgym.envs.registry import spec

        if spec(env_id).kind == "game":  # UnknownEnvError now rather than on the first /create
            raise UnknownEnvError(f"{env_id!r} is a multi-seat game: the env server serves "
                                  "single-agent envs")
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.max_envs = max_envs
        self.idle_timeout = idle_timeout
        self.available_actions = available_actions
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="agentgym-env")
        self.envs: dict[int, _Slot] = {}
        self.next_id = 0
        self.created = 0
        self.expired = 0
        self._pending = 0  # creations in flight, counted against max_envs
        self._gone: OrderedDict[int, str] = OrderedDict()  # recently closed ids -> why

    # ---------------------------------------------------------------- helpers
    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def _slot(self, env_idx: int) -> _Slot:
        slot = self.envs.get(env_idx)
        if slot is not None and not slot.closed:
            return slot
        if env_idx in self._gone:
            raise RequestError(410, f"env {env_idx} was {self._gone[env_idx]}", "EnvClosed")
        if env_idx < self.next_id:
            raise RequestError(410, f"env {env_idx} was closed or expired", "EnvClosed")
        raise RequestError(404, f"unknown env id {env_idx}; POST /create first", "UnknownId")

    def _forget(self, env_idx: int, why: str) -> None:
        self._gone[env_idx] = why
        while len(self._gone) > 10_000:
            self._gone.popitem(last=False)

    @staticmethod
    def _env_key(body: dict) -> str:
        return "env_idx" if "env_idx" in body else "id"

    @classmethod
    def _reset_args(cls, body: dict) -> tuple[Any, int, int | None]:
        task = None
        keys = TASK_KEYS + (("id",) if cls._env_key(body) == "env_idx" else ())
        for key in keys:
            if body.get(key) is not None:
                task = body[key]
                break
        if task is not None:
            if isinstance(task, str) and _DIGITS.fullmatch(task):
                task = int(task)
            if isinstance(task, bool) or not isinstance(task, (int, str)):
                raise RequestError(
                    400, f"task index must be an integer or a task string, got "
                    f"{json_type(task)}", "WrongType",
                )
            if isinstance(task, int) and not 0 <= task <= _MAX_TASK:
                raise RequestError(
                    400, f"task index must be >= 0 and <= {_MAX_TASK}, got {task}", "BadValue")
        seed = _int_field(body, "seed", required=False, maximum=_MAX_SEED)
        max_turns = _int_field(body, "max_turns", required=False, minimum=1)
        return task, (0 if seed is None else seed), max_turns

    def _payload(self, env_idx: int, slot: _Slot, *, reset: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": env_idx,
            "observation": slot.observation,
            "reward": _finite(slot.reward),
            "score": _finite(slot.score),
            "done": slot.done,
            "terminated": slot.terminated,
            "truncated": slot.truncated,
            "info": _jsonable(slot.info),
        }
        if reset:
            out["env_idx"] = env_idx
        if self.available_actions:
            out["available_actions"] = slot.actions
        return out

    async def _refresh_actions(self, slot: _Slot) -> None:
        if self.available_actions:
            slot.actions = await self._guarded(self._actions, slot)

    @staticmethod
    def _actions(slot: _Slot) -> list[str]:
        fn = getattr(slot.env, "valid_actions", None)
        if fn is None:
            unwrapped = getattr(slot.env, "unwrapped", None)
            fn = getattr(unwrapped, "valid_actions", None)
        return list(fn()) if callable(fn) else []

    # ------------------------------------------------------------- blocking parts
    def _make(self):
        from agentgym.envs.registry import make

        return make(self.env_id, **self.env_kwargs)

    @staticmethod
    def _do_reset(slot: _Slot, task, seed: int, max_turns):
        options: dict[str, Any] = {}
        if task is not None:
            options["task"] = task
        if max_turns is not None:
            options["max_turns"] = max_turns
        obs, info = slot.env.reset(seed=seed, options=options)
        if not isinstance(obs, str):
            raise RuntimeError("env reset returned a non-string observation")
        slot.observation, slot.info = obs, dict(info or {})
        slot.reset_observation = obs
        slot.reward = slot.score = 0.0
        slot.terminated = slot.truncated = False
        slot.turns = 0
        slot.task = slot.info.get("task", task)
        slot.seed = seed

    @staticmethod
    def _do_step(slot: _Slot, action: str):
        obs, reward, terminated, truncated, info = slot.env.step(action)
        slot.observation = obs if isinstance(obs, str) else str(obs)
        slot.reward = float(reward)
        slot.score += slot.reward
        slot.terminated, slot.truncated = bool(terminated), bool(truncated)
        slot.turns += 1
        slot.info = dict(info or {})

    async def _guarded(self, fn, *args):
        """Run an env call in the pool, mapping the env's errors to HTTP statuses."""
        try:
            return await self._run(fn, *args)
        except (EpisodeFinishedError, EpisodeNotStartedError) as e:
            raise RequestError(409, str(e), type(e).__name__) from None
        except (InvalidTaskError, UnknownEnvError) as e:
            raise RequestError(400, str(e), type(e).__name__) from None
        except (TypeError, OverflowError):
            # argument conversion (the native envs' bindings): the details name internals
            raise RequestError(400, "the env could not use the request's arguments",
                               "Rejected") from None
        except (ValueError, IndexError, KeyError) as e:
            raise RequestError(400, f"rejected by the env: {e}", "Rejected") from None
        except AgentGymError as e:
            raise RequestError(500, f"env error: {e}", type(e).__name__) from None
        except Exception as e:  # the env's own bug: report it, keep serving
            _log.exception("env %s raised", self.env_id)
            raise RequestError(500, f"the env failed: {e}", "EnvCrash") from None

    # ------------------------------------------------------------------ actions
    async def create(self, body: dict) -> dict[str, Any]:
        task, seed, max_turns = self._reset_args(body)
        if self.max_envs is not None and len(self.envs) + self._pending >= self.max_envs:
            raise RequestError(
                503,
                f"live env cap reached ({self.max_envs}); POST /close unused envs or retry",
                "TooManyEnvs",
                headers={"Retry-After": "1"},
            )
        self._pending += 1
        try:
            env = await self._guarded(self._make)
            slot = _Slot(env)
            try:
                await self._guarded(self._do_reset, slot, task, seed, max_turns)
                await self._refresh_actions(slot)
            except RequestError:
                await self._run(close_quietly, env)
                raise
        finally:
            self._pending -= 1
        env_idx = self.next_id
        self.next_id += 1
        self.created += 1
        self.envs[env_idx] = slot
        return self._payload(env_idx, slot, reset=True)

    async def reset(self, body: dict) -> dict[str, Any]:
        env_idx = _int_field(body, self._env_key(body), required=True)
        task, seed, max_turns = self._reset_args(body)
        slot = self._slot(env_idx)
        async with slot.lock:
            self._slot(env_idx)  # closed while we waited?
            await self._guarded(self._do_reset, slot, task, seed, max_turns)
            await self._refresh_actions(slot)
            slot.last_used = time.monotonic()
            return self._payload(env_idx, slot, reset=True)

    async def step(self, body: dict) -> dict[str, Any]:
        env_idx = _int_field(body, self._env_key(body), required=True)
        action = body.get("action")
        if action is None:
            raise RequestError(400, "missing field 'action'", "MissingField")
        if not isinstance(action, str):
            raise RequestError(
                400, f"field 'action' must be a string, got {json_type(action)}", "WrongType"
            )
        slot = self._slot(env_idx)
        async with slot.lock:
            self._slot(env_idx)
            if slot.done:
                why = "terminated" if slot.terminated else "truncated"
                raise RequestError(
                    409,
                    f"episode of env {env_idx} has finished ({why} after {slot.turns} turns); "
                    "POST /reset to start another",
                    "EpisodeFinishedError",
                )
            await self._guarded(self._do_step, slot, action)
            await self._refresh_actions(slot)
            slot.last_used = time.monotonic()
            return self._payload(env_idx, slot, reset=False)

    async def close(self, body: dict) -> dict[str, Any]:
        env_idx = _int_field(body, self._env_key(body), required=True)
        slot = self.envs.get(env_idx)
        if slot is None:
            if env_idx < self.next_id:
                return {"id": env_idx, "closed": False, "detail": "already closed"}
            raise RequestError(404, f"unknown env id {env_idx}", "UnknownId")
        async with slot.lock:
            if self.envs.pop(env_idx, None) is None:
                return {"id": env_idx, "closed": False, "detail": "already closed"}
            slot.closed = True
            self._forget(env_idx, "closed")
            await self._run(close_quietly, slot.env)
        return {"id": env_idx, "closed": True}

    def slot_for(self, body: Mapping[str, Any]) -> tuple[int, _Slot]:
        """The live env a request body names (by ``id`` or ``env_idx``)."""
        env_idx = _int_field(dict(body), self._env_key(dict(body)), required=True)
        return env_idx, self._slot(env_idx)

    async def run_on(self, slot: _Slot, fn, *args):
        """``fn(env, *args)`` on the env's own thread-pool turn (one call at a time per env),
        with the env's errors mapped to HTTP statuses."""
        async with slot.lock:
            return await self._guarded(fn, slot.env, *args)

    def query_slot(self, query: Mapping[str, str]) -> tuple[int, _Slot]:
        """The env named by a query string's ``id`` (or ``env_idx``)."""
        raw = query.get("id", query.get("env_idx"))
        env_idx = _int_field({"id": raw}, "id", required=True)
        return env_idx, self._slot(env_idx)

    async def detail(self, env_idx: int, slot: _Slot) -> dict[str, Any]:
        out = self._payload(env_idx, slot, reset=False)
        out.update(turns=slot.turns, task=_jsonable(slot.task), seed=slot.seed,
                   idle_s=round(time.monotonic() - slot.last_used, 3))
        return out

    async def actions(self, slot: _Slot) -> list[str]:
        async with slot.lock:
            return await self._guarded(self._actions, slot)

    @staticmethod
    def _oracle(slot: _Slot) -> str | None:
        fn = getattr(slot.env, "oracle_action", None)
        if fn is None:
            fn = getattr(getattr(slot.env, "unwrapped", None), "oracle_action", None)
        action = fn() if callable(fn) else None
        return action if isinstance(action, str) else None

    async def oracle(self, slot: _Slot) -> str | None:
        """The env's oracle action now (None: the env has none, or none here)."""
        async with slot.lock:
            return await self._guarded(self._oracle, slot)

    def listing(self) -> dict[str, Any]:
        now = time.monotonic()
        envs = [
            {"id": i, "turns": s.turns, "done": s.done, "idle_s": round(now - s.last_used, 3)}
            for i, s in sorted(self.envs.items())
        ]
        return {"env": self.env_id, "live": len(self.envs), "ids": sorted(self.envs),
                "created": self.created, "expired": self.expired, "max_envs": self.max_envs,
                "envs": envs}

    async def sweep(self) -> int:
        """Close envs idle longer than ``idle_timeout``; returns how many."""
        if self.idle_timeout is None:
            return 0
        cutoff = time.monotonic() - self.idle_timeout
        stale = [i for i, s in self.envs.items() if s.last_used < cutoff and not s.lock.locked()]
        closed = 0
        for env_idx in stale:
            slot = self.envs.get(env_idx)
            if slot is None or slot.lock.locked() or slot.last_used >= cutoff:
                continue  # closed or used while an earlier one was being closed
            del self.envs[env_idx]
            slot.closed = True
            self._forget(env_idx, f"closed after {self.idle_timeout:g}s idle")
            self.expired += 1
            closed += 1
            await self._run(close_quietly, slot.env)
        return closed

    async def shutdown(self) -> None:
        envs, self.envs = list(self.envs.values()), {}
        for slot in envs:
            slot.closed = True
            await self._run(close_quietly, slot.env)
        self.executor.shutdown(wait=False, cancel_futures=True)


def close_quietly(env) -> None:
    try:
        env.close()
    except Exception:  # closing must never take the server down
        pass


__all__ = ["PROTOCOL_HEADER", "TASK_KEYS", "TOKEN_ENV", "EnvService", "RequestError",
           "close_quietly", "json_type"]
