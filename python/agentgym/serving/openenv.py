"""Any registered single-agent env served as an OpenEnv environment (Meta's ``openenv-core``).

``agentgym-rl serve-env --protocol openenv ENV`` runs OpenEnv's own server
(``openenv.core.env_server.http_server.create_app``: the ``/ws`` WebSocket session that
OpenEnv's ``EnvClient``/``GenericEnvClient`` and TRL's OpenEnv harness drive, plus
``/reset``, ``/step``, ``/state``, ``/schema``, ``/metadata``, ``/health``) around
:class:`AgentGymEnvironment`, an OpenEnv ``Environment`` that wraps one env of this project
built by :func:`agentgym.envs.registry.make` (a native env such as ``maze``, ``wordle`` or
``textcraft``, a Python env, a suite env). What goes over the wire:

* action: :class:`AgentGymAction`, ``{"message": <reply text>}`` (the action the env
  steps with, what follows ``Action:`` in its reply format);
* observation: :class:`AgentGymObservation`: ``text`` (the turn text), ``valid_actions``,
  ``reward`` (None after a reset), ``done`` (the env ended the episode or the horizon cut
  it), ``success`` (the env's success rule, :func:`agentgym.envs.registry.success_rule`,
  over the episode's return so far) and ``truncated`` (the horizon cut it);
* reset: ``reset(seed=..., episode_id=..., task=..., split=..., max_turns=...)`` is this
  project's ``reset(seed=seed, options={"task": task, "max_turns": max_turns})`` on the
  env built with ``split`` (a seed left out is 0, so an episode is a function of its task
  and seed, as with the AgentGym-protocol server); any other argument is refused;
* state: OpenEnv's ``State`` (``episode_id``, ``step_count``) plus ``env_id``, ``task``,
  ``seed``, ``episode_return`` and ``done``; metadata: the env id and its instructions (the
  system prompt) as the description.

Each OpenEnv session (one WebSocket) gets its own env, stepped on the session's own thread,
one call at a time, so the environment declares ``SUPPORTS_CONCURRENT_SESSIONS``; at most
``max_envs`` sessions are open at once, and ``idle_timeout`` closes idle ones (OpenEnv's
``ConcurrencyConfig``). OpenEnv's plain HTTP ``/reset`` and ``/step`` build a fresh env per
request, so an episode lives in one WebSocket session; an HTTP ``/step`` is always a step
before reset (409).

Refusals: an action of another shape is OpenEnv's own validation error (HTTP 422, or the
WebSocket's ``VALIDATION_ERROR``); a step before reset or after the episode ended, and a bad
reset argument, is :class:`~agentgym.serving.service.RequestError`, one line (HTTP 409 or
400 as ``{"detail", "type"}``, the WebSocket's ``EXECUTION_ERROR`` with the same message).
As with the AgentGym-protocol server, the server binds 127.0.0.1 by default and refuses to
serve off loopback without a bearer token (``auth_token``: every HTTP request and WebSocket
handshake must carry ``Authorization: Bearer TOKEN``; OpenEnv's own client sends no such
header, so a token-protected server needs a client that does) unless ``insecure``.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import socket
import threading
import time
import uuid
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from openenv.core.env_server.http_server import create_app as openenv_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import (
    Action,
    ConcurrencyConfig,
    EnvironmentMetadata,
    Observation,
    State,
)
from pydantic import Field

from agentgym.data.trajectories import solved
from agentgym.envs.base import env_method
from agentgym.envs.registry import make, spec, success_rule, task_splits
from agentgym.errors import (
    EpisodeFinishedError,
    EpisodeNotStartedError,
    InvalidTaskError,
    UnknownEnvError,
)
from agentgym.serving.server import check_exposure
from agentgym.serving.service import RequestError, close_quietly, json_type

__all__ = ["AgentGymAction", "AgentGymEnvironment", "AgentGymObservation", "OpenEnvServer",
           "create_app", "serve"]

#: The keyword arguments of :meth:`AgentGymEnvironment.reset` besides OpenEnv's own.
RESET_ARGS = ("task", "split", "max_turns")
#: The largest seed or task index a reset takes.
_MAX_INDEX = 2**64 - 1


class AgentGymAction(Action):
    """One reply: the action text the env steps with."""

    message: str = Field(description="the action, as the env's reply format writes it after "
                                     "'Action:' (e.g. 'move north')")


class AgentGymObservation(Observation):
    """One turn of an episode: its text, the actions that make sense now, and whether the
    episode is solved (``reward`` and ``done`` are OpenEnv's own fields)."""

    text: str = Field(default="", description="the turn text (the env's observation)")
    valid_actions: list[str] = Field(default_factory=list,
                                     description="actions meaningful now ([]: free text)")
    success: bool = Field(default=False, description="the episode is solved (the env's "
                                                     "success rule over its return so far)")
    truncated: bool = Field(default=False, description="the horizon (max_turns) cut the "
                                                       "episode")


def _text(obs: Any) -> str:
    """The turn text of an observation (an env built with image observations gives
    ``{"text", "image"}``: its text)."""
    return str(obs["text"]) if isinstance(obs, dict) else str(obs)


def _int_arg(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an integer in ``[minimum, maximum]``, or a 400 naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"reset: {name} must be an integer, got {json_type(value)}",
                           "WrongType")
    if value < minimum or (maximum is not None and value > maximum):
        upper = "" if maximum is None else f" and <= {maximum}"
        raise RequestError(400, f"reset: {name} must be >= {minimum}{upper}, got {value}",
                           "BadValue")
    return value


class AgentGymEnvironment(Environment[AgentGymAction, AgentGymObservation, State]):
    """An OpenEnv ``Environment`` playing one env of this project (see the module docs)."""

    #: Each session builds its own env (:func:`~agentgym.envs.registry.make`), which shares
    #: no state with another's, and OpenEnv steps it on the session's own thread.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None = None):
        super().__init__()
        self.env_id = env_id
        self._kwargs = dict(env_kwargs or {})
        self._env = make(env_id, **self._kwargs)
        self._threshold = success_rule(env_id).threshold
        self._episode_id: str | None = None
        self._task: Any = None
        self._seed: int | None = None
        self._turns = 0
        self._return = 0.0
        self._done: bool | None = None  # None: no episode yet

    # ------------------------------------------------------------------ OpenEnv API
    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> AgentGymObservation:
        """Start an episode: ``seed`` (default 0), ``task``, ``split`` and ``max_turns``
        as the module docs say; a refusal is a :class:`RequestError` (400)."""
        unknown = sorted(set(kwargs) - set(RESET_ARGS))
        if unknown:
            raise RequestError(400, f"reset: unknown argument(s) {', '.join(unknown)}; it takes "
                               f"seed, episode_id, {', '.join(RESET_ARGS)}", "UnknownField")
        seed = 0 if seed is None else _int_arg("seed", seed, 0, _MAX_INDEX)
        task = kwargs.get("task")
        if isinstance(task, int) and not isinstance(task, bool):
            _int_arg("task", task, 0, _MAX_INDEX)
        elif task is not None and not isinstance(task, str):
            raise RequestError(400, "reset: task must be an index or a task string, got "
                               f"{json_type(task)}", "WrongType")
        options: dict[str, Any] = {} if task is None else {"task": task}
        if kwargs.get("max_turns") is not None:
            options["max_turns"] = _int_arg("max_turns", kwargs["max_turns"], 1)
        if kwargs.get("split") is not None:
            self._use_split(kwargs["split"])
        try:
            obs, info = self._env.reset(seed=seed, options=options)
        except (InvalidTaskError, ValueError, KeyError, IndexError) as e:
            raise RequestError(400, f"reset: rejected by the env: {e}", "Rejected") from None
        except (TypeError, OverflowError):  # argument conversion: the details name internals
            raise RequestError(400, "reset: the env could not use these arguments",
                               "Rejected") from None
        self._episode_id = episode_id or uuid.uuid4().hex
        self._task = (info or {}).get("task", task)
        self._seed = seed
        self._turns, self._return, self._done = 0, 0.0, False
        return AgentGymObservation(text=_text(obs), valid_actions=self._valid_actions(),
                                   reward=None, done=False)

    def step(self, action: AgentGymAction, timeout_s: float | None = None,
             **kwargs: Any) -> AgentGymObservation:
        """Step the env with ``action.message``; a step before reset or after the episode
        ended is a :class:`RequestError` (409)."""
        if not isinstance(action, AgentGymAction):
            raise RequestError(400, 'step: the action must be {"message": <reply text>}',
                               "WrongType")
        if self._done is None:
            raise RequestError(409, "step before reset: call reset first (an episode lives in "
                               "one session, OpenEnv's /ws WebSocket; each HTTP /step gets a "
                               "fresh env)", "NotStarted")
        if self._done:
            raise RequestError(409, f"the episode has ended (after {self._turns} turns); call "
                               "reset to start another", "EpisodeEnded")
        try:
            obs, reward, terminated, truncated, _ = self._env.step(action.message)
        except (EpisodeFinishedError, EpisodeNotStartedError) as e:
            raise RequestError(409, str(e), "EpisodeEnded") from None
        self._turns += 1
        self._return += float(reward)
        self._done = bool(terminated or truncated)
        return AgentGymObservation(
            text=_text(obs), valid_actions=[] if self._done else self._valid_actions(),
            reward=float(reward), done=self._done, truncated=bool(truncated and not terminated),
            success=bool(solved(bool(terminated), self._return, threshold=self._threshold)))

    @property
    def state(self) -> State:
        return State(episode_id=self._episode_id, step_count=self._turns, env_id=self.env_id,
                     task=self._task, seed=self._seed, episode_return=self._return,
                     done=bool(self._done))

    def get_metadata(self) -> EnvironmentMetadata:
        from agentgym import __version__

        text = getattr(self._env, "instructions", "")
        return EnvironmentMetadata(name=self.env_id, version=__version__,
                                   description=text if isinstance(text, str) else str(text))

    def close(self) -> None:
        close_quietly(self._env)

    # ---------------------------------------------------------------------- helpers
    def _valid_actions(self) -> list[str]:
        fn = env_method(self._env, "valid_actions")
        return [str(a) for a in fn()] if callable(fn) else []

    def _use_split(self, split: Any) -> None:
        """Rebuild the env on task split ``split`` (a 400 naming the env's splits when it
        has no such split)."""
        if split == self._kwargs.get("split"):
            return
        splits, _ = task_splits(self.env_id)
        if not isinstance(split, str) or split not in splits:
            have = ", ".join(splits) if splits else "none"
            raise RequestError(400, f"reset: split must be one of the env's splits ({have}), "
                               f"got {split!r}", "BadValue")
        env = make(self.env_id, **{**self._kwargs, "split": split})
        close_quietly(self._env)
        self._env, self._kwargs = env, {**self._kwargs, "split": split}


# ---------------------------------------------------------------------------- the app
class _BearerAuth:
    """ASGI middleware: every HTTP request and WebSocket handshake must carry
    ``Authorization: Bearer TOKEN`` (HTTP 401; a WebSocket handshake is refused)."""

    def __init__(self, app: Any, token: str):
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket"):
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                refusal = JSONResponse(
                    {"detail": "missing or wrong bearer token (send 'Authorization: Bearer "
                               "TOKEN')", "type": "Unauthorized"},
                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _refusal(request, error: RequestError) -> JSONResponse:
    return JSONResponse({"detail": str(error), "type": error.kind}, status_code=error.status)


def create_app(env_id: str, *, max_envs: int = 4096, idle_timeout: float | None = None,
               auth_token: str | None = None, **env_kwargs: Any) -> FastAPI:
    """OpenEnv's FastAPI app serving ``env_id`` (keyword arguments for
    :func:`~agentgym.envs.registry.make` in ``env_kwargs``, ``max_turns`` included): at
    most ``max_envs`` sessions, idle ones closed after ``idle_timeout`` seconds. One env is
    built and closed first, so an unknown id or a bad keyword argument fails here."""
    if spec(env_id).kind == "game":
        raise UnknownEnvError(f"{env_id!r} is a multi-seat game: the env server serves "
                              "single-agent envs")
    AgentGymEnvironment(env_id, env_kwargs).close()
    app = openenv_app(functools.partial(AgentGymEnvironment, env_id, env_kwargs),
                      AgentGymAction, AgentGymObservation, env_name=env_id,
                      concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_envs,
                                                           session_timeout=idle_timeout))
    app.add_exception_handler(RequestError, _refusal)
    if auth_token:
        app.add_middleware(_BearerAuth, token=auth_token)
    return app


def _listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``(host, port)`` and listening (``port=0``: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


class OpenEnvServer:
    """OpenEnv's server of ``env_id`` on a socket bound at construction: :meth:`run` serves
    in this thread until interrupted, :meth:`start` on a daemon thread (``with
    OpenEnvServer("maze").start() as srv: GenericEnvClient(base_url=srv.url)``).

    Off loopback it refuses to start without ``auth_token`` (an
    :class:`~agentgym.serving.server.InsecureServerError`) unless ``insecure``; ``options``
    are :func:`create_app`'s."""

    def __init__(self, env_id: str, host: str = "127.0.0.1", port: int = 0, *,
                 insecure: bool = False, **options: Any):
        check_exposure(host, options.get("auth_token"), insecure)
        app = create_app(env_id, **options)
        self.host = host
        self._sock = _listen(host, port)
        self.port = int(self._sock.getsockname()[1])
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                                     access_log=False))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host.strip('[]')}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def run(self) -> None:
        """Serve until interrupted (uvicorn stops on SIGINT/SIGTERM in the main thread)."""
        try:
            asyncio.run(self._server.serve(sockets=[self._sock]))
        finally:
            self._sock.close()

    def start(self, timeout: float = 60.0) -> OpenEnvServer:
        """Serve on a daemon thread; returns once the server accepts requests."""
        self._thread = threading.Thread(target=self.run, daemon=True,
                                        name=f"agentgym-openenv-{self.port}")
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the OpenEnv server on {self.url} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Stop serving (closing every open session) and wait for the thread."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> OpenEnvServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(env_id: str, host: str = "127.0.0.1", port: int = 8000, *,
          max_turns: int | None = None, **options: Any) -> None:
    """Serve ``env_id`` over OpenEnv's protocol until interrupted (``agentgym-rl serve-env
    --protocol openenv ENV``); prints one line with the bound URL (useful with
    ``port=0``). ``options``: :class:`OpenEnvServer`'s (``max_envs``, ``idle_timeout``,
    ``auth_token``, ``insecure``)."""
    if max_turns is not None:
        options["max_turns"] = max_turns
    server = OpenEnvServer(env_id, host, port, **options)
    print(f"agentgym env server: env={env_id} protocol=openenv listening on {server.url}",
          flush=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
