"""``RemoteEnv``: a Gymnasium env backed by an AgentGym-protocol env server over HTTP.

Works against :mod:`agentgym.serving.server` and against AgentGym's own env servers
(``agentenv-textcraft``, ``-babyai``, ``-sciworld``, ``-alfworld``, ``-lmrlgym``, ``-webshop``,
``-webarena``, AgentGym-RL's SearchQA). Those servers differ in small ways (the key that names
the env, the key that names the task, where the first observation comes from); each
difference is one field of a :class:`ServerProfile`, chosen by ``env_name`` from
:data:`PROFILES`, else by the family the server's ``GET /`` names (``X-AgentGym-Protocol``
from :mod:`agentgym.serving.server`, AgentGym's greeting strings). A 200 answer carrying
``error`` is an error; a reset that finds its env gone (404/410 here, AgentGym's 200 "The id
N is not valid." or 500) creates a new one. ``auth_token`` (default: ``$AGENTGYM_AUTH_TOKEN``)
is sent as a bearer token.

One ``httpx.Client`` (and, for ``areset``/``astep``, one ``aiohttp.ClientSession``) per env
keeps connections alive; pass ``client=`` / ``async_client=`` to share one pool across many
envs. The async side uses aiohttp rather than ``httpx.AsyncClient`` because httpx's async
pool slows down sharply with many concurrent connections (encode/httpx#3215; here 64 envs
stepping at once through one ``httpx.AsyncClient`` spent most of their time in its pool).
Connection failures are retried with exponential backoff (a request that never reached the
server is safe to resend); 4xx answers are not retried; 503 (server at its env cap) is.
A server that cannot be reached raises :class:`ServerUnavailableError`; other failures raise
:class:`RemoteEnvError` (both are :class:`agentgym.errors.EnvError`), and the server's
``EpisodeFinishedError`` / ``InvalidTaskError`` come back as those same classes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import gymnasium as gym
import httpx

from agentgym.envs.spaces import TextSpace
from agentgym.errors import (
    EnvError,
    EpisodeFinishedError,
    EpisodeNotStartedError,
    InvalidTaskError,
)
from agentgym.serving.service import PROTOCOL_HEADER, TOKEN_ENV

_log = logging.getLogger(__name__)


class RemoteEnvError(EnvError):
    """An env server answered with an error, or with something that is not the protocol."""

    def __init__(self, message: str, status: int | None = None, kind: str | None = None):
        super().__init__(message)
        self.status = status
        self.kind = kind


class ServerUnavailableError(RemoteEnvError):
    """The env server could not be reached (refused, unresolvable, connect timeout)."""


@dataclass(frozen=True)
class _Unreached:
    """A request that never reached the server (safe to resend); ``cause`` says why."""

    cause: BaseException


@dataclass(frozen=True)
class _Reply:
    """An HTTP answer, whichever client fetched it."""

    status: int
    content: bytes
    reason: str
    retry_after: str | None
    protocol: str | None = None


@dataclass(frozen=True)
class ServerProfile:
    """How one family of AgentGym env servers spells the protocol."""

    #: Key naming the env instance in request bodies and query strings.
    id_key: str = "id"
    #: Key naming the task index in the reset body.
    task_key: str = "data_idx"
    #: Extra fields sent with every reset.
    reset_extra: Mapping[str, Any] = field(default_factory=dict)
    #: Whether to send ``seed`` with reset (only servers that use it; others ignore it).
    send_seed: bool = True
    #: Keys of the step response.
    obs_key: str = "observation"
    done_key: str = "done"
    #: Where the first observation of an episode comes from: ``response`` (the reset
    #: answer's ``observation``), ``get`` (``GET /observation``) or ``task_description``
    #: (SciWorld: ``task_description + "\\n" + observation``).
    reset_obs: str = "response"
    #: The ``/create`` body (SearchQA's server requires the first task's ``id``).
    create_body: Mapping[str, Any] = field(default_factory=dict)
    #: Whether every reset sends a task to an AgentGym server (BabyAI, SciWorld and SearchQA
    #: need one; TextCraft's defaults to 0): without one, ``reset(seed=s)`` sends task ``s``
    #: (0 without a seed).
    task_required: bool = False


#: Server families by env name; unknown names use ``PROFILES["agentgym"]`` (our server).
PROFILES: dict[str, ServerProfile] = {
    "agentgym": ServerProfile(),
    "textcraft": ServerProfile(task_required=True),
    "babyai": ServerProfile(task_required=True),
    "sciworld": ServerProfile(reset_obs="task_description", task_required=True),
    "alfworld": ServerProfile(task_key="game", reset_extra={"world_type": "Text"}),
    "maze": ServerProfile(task_key="game"),
    "wordle": ServerProfile(task_key="seed", send_seed=False, reset_obs="get"),
    "webshop": ServerProfile(id_key="env_idx", task_key="session_id", obs_key="state",
                             reset_obs="get", send_seed=False),
    "webarena": ServerProfile(id_key="env_idx", task_key="idx", done_key="terminated",
                              reset_extra={"seed": 0}, reset_obs="get", send_seed=False),
    "searchqa": ServerProfile(id_key="env_idx", task_key="id", reset_obs="get",
                              send_seed=False, create_body={"id": 0}, task_required=True),
}
#: AgentGym servers' ``GET /`` greetings -> their family.
GREETINGS: dict[str, str] = {
    "This is environment TextCraft.": "textcraft",
    "This is environment BabyAI.": "babyai",
    "This is environment ScienceWorld.": "sciworld",
}
#: A 200-with-error answer that means the server no longer has the env (restarted, closed).
_LOST = re.compile(r"is not valid|has been deleted|not found|not initialized", re.IGNORECASE)


class RemoteEnv(gym.Env):
    """A Gymnasium env whose episodes run on an env server at ``url``.

    ``reset(seed=s, options={"task": i})`` sends AgentGym's reset with ``data_idx=i`` (and
    ``seed=s``); against :mod:`agentgym.serving.server` it replays exactly what
    ``agentgym.make(env_name).reset(seed=s, options={"task": i})`` gives locally. ``env_name``
    picks the server's :class:`ServerProfile` (``profile=`` overrides). ``max_turns`` cuts
    episodes client-side (``truncated=True``). The server-side env is created on the first
    reset and recreated if the server expired it; ``close()`` frees it (``POST /close``).
    ``areset``/``astep``/``aclose`` are the same over ``aiohttp`` (call ``aclose`` after
    using them, so the session is closed on its own loop).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        url: str,
        env_name: str = "agentgym",
        *,
        profile: ServerProfile | None = None,
        max_turns: int | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 300.0,
        retries: int = 3,
        backoff: float = 0.2,
        client: httpx.Client | None = None,
        async_client: aiohttp.ClientSession | None = None,
        auth_token: str | None = None,
    ):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s) URL, got {url!r}")
        if async_client is not None and not isinstance(async_client, aiohttp.ClientSession):
            raise TypeError("async_client must be an aiohttp.ClientSession, got "
                            f"{type(async_client).__name__}")
        self.url = url.rstrip("/")
        self.env_name = env_name
        named = env_name.lower()
        self._named_profile = profile or (PROFILES.get(named) if named != "agentgym" else None)
        self.profile = self._named_profile or PROFILES["agentgym"]
        token = auth_token if auth_token is not None else os.environ.get(TOKEN_ENV)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        #: What ``GET /`` said the server is: ``"agentgym-rl"`` (this package's server),
        #: ``"agentgym"`` (an AgentGym server) or ``"unknown"``; None until the first reset.
        self.server: str | None = None
        #: The protocol it speaks: ``"generic"`` or an AgentGym family (``"babyai"``, ...;
        #: ``"webshop|searchqa"`` when an AgentGym server's greeting cannot tell them apart).
        self.server_dialect: str | None = None
        self.max_turns = max_turns
        self.retries = max(0, int(retries))
        self.backoff = backoff
        self.timeout = httpx.Timeout(read_timeout, connect=connect_timeout)
        self._client, self._owns_client = client, client is None
        self._aclient, self._owns_aclient = async_client, async_client is None
        self.observation_space = TextSpace()
        self.action_space = TextSpace()
        self.env_id: int | None = None
        self._turns = 0
        self._done = True
        self._observation = ""

    # ------------------------------------------------------------------ transport
    @property
    def client(self) -> httpx.Client:
        """The sync connection pool (created on first use)."""
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout)
        return self._client

    @property
    def async_client(self) -> aiohttp.ClientSession:
        """The async connection pool (created on first use, inside the running loop)."""
        if self._aclient is None:
            self._aclient = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.timeout.connect, sock_read=self.timeout.read))
        return self._aclient

    def _delay(self, attempt: int, reply: _Reply | None = None) -> float:
        if reply is not None:
            try:
                return min(float(reply.retry_after or ""), 10.0)
            except ValueError:
                pass
        return min(self.backoff * (2**attempt), 5.0)

    def _settle(self, outcome: _Reply | _Unreached, attempt: int, retries: int,
                path: str) -> tuple[Any, float | None]:
        """The retry policy for attempt ``attempt`` (from 0) of ``retries + 1``: ``(answer,
        None)`` for a final reply (not a 503, or the last attempt), else ``(None, delay)``
        with the seconds to wait before the next attempt; a request that never reached the
        server on its last attempt raises :class:`ServerUnavailableError`."""
        if isinstance(outcome, _Reply):
            if outcome.status != 503 or attempt == retries:
                return self._parse(outcome, path), None
            return None, self._delay(attempt, outcome)
        if attempt == retries:
            raise self._unavailable(outcome.cause, retries)
        return None, self._delay(attempt)

    def _request(self, method: str, path: str, body: dict | None = None,
                 retries: int | None = None) -> Any:
        retries = self.retries if retries is None else retries
        for attempt in range(retries + 1):
            answer, delay = self._settle(self._send(method, path, body), attempt, retries, path)
            if delay is None:
                return answer
            time.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _arequest(self, method: str, path: str, body: dict | None = None,
                        retries: int | None = None) -> Any:
        retries = self.retries if retries is None else retries
        for attempt in range(retries + 1):
            answer, delay = self._settle(await self._asend(method, path, body), attempt,
                                         retries, path)
            if delay is None:
                return answer
            await asyncio.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _timed_out(self, path: str, e: BaseException) -> RemoteEnvError:
        return RemoteEnvError(f"env server {self.url} did not answer /{path} within "
                              f"{self.timeout.read}s ({type(e).__name__})")

    def _send(self, method: str, path: str, body: dict | None) -> _Reply | _Unreached:
        url = f"{self.url}/{path}"
        try:
            if method == "GET":
                r = self.client.request("GET", url, params=body, headers=self._headers)
            else:
                r = self.client.request(method, url, json=body if body is not None else {},
                                        headers=self._headers)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            return _Unreached(e)
        except httpx.TimeoutException as e:
            raise self._timed_out(path, e) from e
        except httpx.HTTPError as e:
            raise RemoteEnvError(f"request to {url} failed: {type(e).__name__}: {e}") from e
        return _Reply(r.status_code, r.content, r.reason_phrase, r.headers.get("Retry-After"),
                      r.headers.get(PROTOCOL_HEADER))

    async def _asend(self, method: str, path: str, body: dict | None) -> _Reply | _Unreached:
        url = f"{self.url}/{path}"
        kwargs: dict[str, Any] = (
            {"params": {k: str(v) for k, v in (body or {}).items()}} if method == "GET"
            else {"json": body if body is not None else {}})
        try:
            async with self.async_client.request(method, url, headers=self._headers,
                                                 **kwargs) as r:
                content = await r.read()
                return _Reply(r.status, content, r.reason or "", r.headers.get("Retry-After"),
                              r.headers.get(PROTOCOL_HEADER))
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
            return _Unreached(e)
        except (asyncio.TimeoutError, aiohttp.SocketTimeoutError) as e:
            raise self._timed_out(path, e) from e
        except aiohttp.ClientError as e:
            raise RemoteEnvError(f"request to {url} failed: {type(e).__name__}: {e}") from e

    def _unavailable(self, last: BaseException, retries: int) -> ServerUnavailableError:
        return ServerUnavailableError(
            f"env server {self.url} is unreachable after {retries + 1} attempts "
            f"({type(last).__name__}: {last})", None, "Unavailable")

    def _parse(self, reply: _Reply, path: str) -> Any:
        try:
            data = json.loads(reply.content)
        except ValueError:
            data = None
        status = reply.status
        if status >= 400 or (status == 200 and isinstance(data, dict) and "error" in data
                             and path != "observation"):
            message = data.get("error") if isinstance(data, dict) else None
            kind = data.get("type") if isinstance(data, dict) else None
            body = reply.content[:500].decode(errors="replace")
            text = f"env server {self.url} /{path} -> {status}: {message or body or reply.reason}"
            if kind == "EpisodeFinishedError":
                raise EpisodeFinishedError(text)
            if kind == "InvalidTaskError":
                raise InvalidTaskError(text)
            raise RemoteEnvError(text, status, kind)
        if data is None and reply.content.strip() != b"null":
            raise RemoteEnvError(
                f"env server {self.url} /{path} answered non-JSON: {reply.content[:200]!r}",
                status)
        return data

    # ------------------------------------------------------------ protocol pieces
    def _detect(self, outcome: _Reply | _Unreached) -> None:
        """Read what the server is from its ``GET /`` answer (once; a server not reached is
        asked again at the next reset) and, without a profile named by ``env_name`` or
        ``profile=``, take the detected family's profile."""
        if isinstance(outcome, _Unreached):
            return
        try:
            data = json.loads(outcome.content)
        except ValueError:
            data = None
        named = self.env_name.lower()
        if outcome.protocol:
            self.server, self.server_dialect = "agentgym-rl", outcome.protocol
        elif isinstance(data, dict) and data.get("name") == "agentgym-rl env server":
            self.server, self.server_dialect = "agentgym-rl", "generic"
        elif isinstance(data, str) and data in GREETINGS:
            self.server, self.server_dialect = "agentgym", GREETINGS[data]
        elif data == "ok":
            family = named if named in ("webshop", "searchqa") else "webshop|searchqa"
            self.server, self.server_dialect = "agentgym", family
        else:
            self.server, self.server_dialect = "unknown", None
        if self._named_profile is None and self.server_dialect in PROFILES:
            self.profile = PROFILES[self.server_dialect]
        _log.info("env server %s: %s server, %s protocol", self.url, self.server,
                  self.server_dialect or "unknown")

    @property
    def _generic(self) -> bool:
        return self.server_dialect == "generic"

    def _create_body(self) -> dict:
        return dict(self.profile.create_body)

    def _with_id(self, body: dict | None = None) -> dict:
        out = dict(body or {})
        out[self.profile.id_key] = self.env_id
        return out

    def _created(self, data: Any) -> None:
        if isinstance(data, bool):
            data = None
        if isinstance(data, int):
            self.env_id = data
            return
        if isinstance(data, dict):
            for key in (self.profile.id_key, "id", "env_idx"):
                if isinstance(data.get(key), int) and not isinstance(data.get(key), bool):
                    self.env_id = data[key]
                    return
        raise RemoteEnvError(f"env server {self.url} /create answered without an env id: "
                             f"{str(data)[:200]}")

    def _reset_body(self, seed: int | None, options: dict | None) -> tuple[dict, Any]:
        options = dict(options or {})
        if "max_turns" in options:
            self.max_turns = options["max_turns"]
        task = options.get("task")
        body = dict(self.profile.reset_extra)
        if task is None and self.profile.task_required and not self._generic:
            body[self.profile.task_key] = seed if seed is not None else 0
        if task is not None:
            body[self.profile.task_key] = task
        if self.profile.send_seed:
            # The caller's seed as given, so the server's env replays a local one; with no
            # seed, a fresh one drawn from this env's own seeded RNG.
            body["seed"] = seed if seed is not None else int(self.np_random.integers(2**63))
        return self._with_id(body), task

    def _reset_done(self, data: Any, task: Any) -> tuple[str, dict]:
        if not isinstance(data, dict):
            data = {}
        if self.profile.reset_obs == "task_description" and not self._generic:
            obs = f"{data.get('task_description', '')}\n{data.get('observation', '')}"
        else:
            obs = data.get("observation", "")
        info = dict(data.get("info") or {}) if isinstance(data.get("info"), dict) else {}
        info.setdefault("task", task)
        info["env_idx"] = self.env_id
        info["turns"] = 0
        info["server_dialect"] = self.server_dialect
        if "available_actions" in data:
            info["available_actions"] = data["available_actions"]
        self._turns, self._done = 0, False
        self._observation = obs if isinstance(obs, str) else str(obs)
        return self._observation, info

    def _step_done(self, data: Any) -> tuple[str, float, bool, bool, dict]:
        if not isinstance(data, dict):
            raise RemoteEnvError(f"env server {self.url} /step answered {str(data)[:200]!r}")
        p = self.profile
        obs = data.get(p.obs_key, data.get("observation", ""))
        reward = data.get("reward") or 0.0
        done = bool(data.get(p.done_key, data.get("done", False)))
        truncated = bool(data.get("truncated", False))
        terminated = bool(data.get("terminated", done and not truncated))
        self._turns += 1
        if not terminated and self.max_turns is not None and self._turns >= self.max_turns:
            truncated = True
        info = dict(data.get("info") or {}) if isinstance(data.get("info"), dict) else {}
        info["turns"] = self._turns
        for key in ("score", "available_actions"):
            if key in data:
                info[key] = data[key]
        self._done = terminated or truncated
        self._observation = obs if isinstance(obs, str) else str(obs)
        return self._observation, float(reward), terminated, truncated, info

    def _check_action(self, action: Any) -> None:
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        if self.env_id is None:
            raise EpisodeNotStartedError(f"{self.env_name}: call reset() before step()")
        if self._done:
            raise EpisodeFinishedError(f"{self.env_name}: episode has finished; call reset()")

    def _expired(self, e: RemoteEnvError) -> bool:
        """Whether a failed reset means the server lost the env (restart, expiry, close):
        404/410 from this package's server; AgentGym's answer 200 with an error naming the
        id, or 500 (WebShop, SearchQA)."""
        if e.status in (404, 410):
            return True
        if e.status == 200:
            return bool(_LOST.search(str(e)))
        return e.status == 500 and self.server != "agentgym-rl"

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if self.server is None:
            self._detect(self._send("GET", "", None))
        if self.env_id is None:
            self._created(self._request("POST", "create", self._create_body()))
        body, task = self._reset_body(seed, options)
        try:
            data = self._request("POST", "reset", body)
        except RemoteEnvError as e:
            if not self._expired(e):
                raise
            self._created(self._request("POST", "create", self._create_body()))
            data = self._request("POST", "reset", self._with_id(body))
        if self.profile.reset_obs == "get":
            data = dict(data) if isinstance(data, dict) else {}
            data["observation"] = self._request("GET", "observation", self._with_id())
        return self._reset_done(data, task)

    def step(self, action: str):
        self._check_action(action)
        return self._step_done(self._request("POST", "step", self._with_id({"action": action})))

    async def areset(self, *, seed: int | None = None, options: dict | None = None):
        """``reset`` over the async client (for the asyncio orchestrator)."""
        gym.Env.reset(self, seed=seed)
        if self.server is None:
            self._detect(await self._asend("GET", "", None))
        if self.env_id is None:
            self._created(await self._arequest("POST", "create", self._create_body()))
        body, task = self._reset_body(seed, options)
        try:
            data = await self._arequest("POST", "reset", body)
        except RemoteEnvError as e:
            if not self._expired(e):
                raise
            self._created(await self._arequest("POST", "create", self._create_body()))
            data = await self._arequest("POST", "reset", self._with_id(body))
        if self.profile.reset_obs == "get":
            data = dict(data) if isinstance(data, dict) else {}
            data["observation"] = await self._arequest("GET", "observation", self._with_id())
        return self._reset_done(data, task)

    async def astep(self, action: str):
        """``step`` over the async client."""
        self._check_action(action)
        data = await self._arequest("POST", "step", self._with_id({"action": action}))
        return self._step_done(data)

    def observe(self) -> str:
        """The last observation (no request)."""
        return self._observation

    def _extension(self, route: str) -> str:
        """The path of a route of the generic protocol that AgentGym's dialects lack
        (``available_actions``, ``oracle_action``): under ``/generic`` where this package's
        server speaks a family's dialect at its root (the same envs, one table)."""
        if self.server == "agentgym-rl" and self.server_dialect not in (None, "generic"):
            return f"generic/{route}"
        return route

    def valid_actions(self) -> list[str]:
        """``GET /available_actions`` ([] where the server has no such route)."""
        if self.env_id is None:
            return []
        try:
            data = self._request("GET", self._extension("available_actions"),
                                 self._with_id())
        except RemoteEnvError as e:
            if e.status in (404, 405):
                return []
            raise
        return [str(a) for a in data] if isinstance(data, list) else []

    def oracle_action(self) -> str | None:
        """The served env's oracle action (``GET /oracle_action`` of this package's server,
        ``agentgym-rl serve-env``); None where the server has no such route (an AgentGym
        server) or the env has no oracle."""
        if self.env_id is None:
            return None
        try:
            data = self._request("GET", self._extension("oracle_action"), self._with_id())
        except RemoteEnvError as e:
            if e.status in (404, 405):
                return None
            raise
        return data if isinstance(data, str) else None

    #: An env server's state cannot be copied from here: no snapshots.
    supports_snapshots = False

    def snapshot(self):
        """Always :class:`~agentgym.errors.SnapshotUnsupportedError`: the episode's state
        lives in the server's process."""
        from agentgym.errors import SnapshotUnsupportedError

        raise SnapshotUnsupportedError("a remote env's state lives in its env server and "
                                       "cannot be snapshotted")

    restore = snapshot

    def close(self) -> None:
        """Free the server-side env (``POST /close``) and this env's connections."""
        if self.env_id is not None:
            try:
                self._request("POST", "close", self._with_id(), retries=0)
            except RemoteEnvError:
                pass  # already gone, or the server is down: nothing left to free
            self.env_id = None
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None
        self._done = True

    async def aclose(self) -> None:
        """``close`` over the async client, then close the async client."""
        if self.env_id is not None:
            try:
                await self._arequest("POST", "close", self._with_id(), retries=0)
            except RemoteEnvError:
                pass
            self.env_id = None
        if self._owns_aclient and self._aclient is not None:
            await self._aclient.close()
            self._aclient = None
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None
        self._done = True


__all__ = ["PROFILES", "RemoteEnv", "RemoteEnvError", "ServerProfile", "ServerUnavailableError"]
