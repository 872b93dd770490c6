"""An HTTP env server speaking AgentGym's env-server protocol, for any registered env id.

AgentGym (``agentenv-*`` packages) runs each environment suite as a FastAPI app with
``POST /create``, ``POST /step``, ``POST /reset``, ``GET /observation`` and ``POST /close``;
its clients (``agentenv.envs.*EnvClient``) and AgentGym-RL's rollout talk to those endpoints.
This module serves any env that :func:`agentgym.make` builds behind the same endpoints and
bodies, so AgentGym's own clients and :class:`agentgym.serving.client.RemoteEnv` both work.
Each AgentGym family spells the protocol its own way; with ``protocol="agentgym"`` (what
``agentgym-rl serve-env`` uses) an env of a family is served in that family's dialect
(:mod:`agentgym.serving.dialects`) at the root and in the generic protocol below under
``/generic``; ``protocol="generic"`` (the default here) serves the generic protocol at the
root. With ``auth_token`` every request needs ``Authorization: Bearer <token>`` (401
otherwise); off loopback :func:`start_server` refuses to start without one unless
``insecure=True``. The generic protocol:

=======  ====================  ==========================================  =====================
method   path                  request body / query                        response (200)
=======  ====================  ==========================================  =====================
GET      ``/``                 -                                           ``{"name", "env",
                                                                           "version", "live",
                                                                           "max_envs"}``
GET      ``/list``             -                                           ``{"env", "live",
                                                                           "ids", "envs"}``
POST     ``/create``           ``{}`` or ``{"data_idx"?, "seed"?,          ``{"id", "env_idx",
                               "max_turns"?}`` (other keys ignored)        "observation",
                                                                           "reward", "score",
                                                                           "done", "info"}``
POST     ``/reset``            ``{"id", "data_idx"?, "seed"?,              same as create
                               "max_turns"?}``
POST     ``/step``             ``{"id", "action"}``                        ``{"observation",
                                                                           "reward", "score",
                                                                           "done", "terminated",
                                                                           "truncated",
                                                                           "info"}``
GET      ``/observation``      ``?id=N``                                   the observation (str)
GET      ``/available_actions``  ``?id=N``                                 ``[str, ...]``
GET      ``/oracle_action``    ``?id=N``                                   the env's oracle
                                                                           action (str, or
                                                                           null: none)
GET      ``/detail``           ``?id=N``                                   the env's state dict
GET      ``/instructions``     -                                           the instructions (str)
POST     ``/close``            ``{"id"}``                                  ``{"id", "closed"}``
=======  ====================  ==========================================  =====================

``score`` is the episode's return so far (AgentGym's BabyAI/SciWorld clients read it);
``done`` is ``terminated or truncated``. The env is addressed by ``"id"``, or by
``"env_idx"`` as in AgentGym's WebShop/WebArena/SearchQA clients (then ``"id"`` in a reset
body is the task index, as SearchQA sends it). The task index may also be named ``game``
(ALFWorld, LMRL-Gym maze), ``idx`` (WebArena) or ``session_id`` (WebShop). Without a seed a
reset uses seed 0, so an episode is a deterministic function of ``(data_idx, seed)``; without
a task the env draws one from the seed, exactly as ``agentgym.make(env).reset(seed=s)`` does.
Every route is also served under ``/<env id>/`` (LMRL-Gym's ``/maze/step`` layout).

Errors are JSON ``{"error": message, "type": name}``: 400 bad JSON / missing or mistyped
fields / invalid task, 404 unknown id or path, 405 wrong method, 409 stepping a finished
episode, 410 a closed or idle-expired env, 413 a body over ``max_body_bytes``, 503 (with
``Retry-After``) past ``max_envs`` live envs; 500 only when the env's own code raises.
Env calls run in a thread pool, one call at a time per env, so a slow env never blocks the
event loop. The env table itself (:class:`~agentgym.serving.service.EnvService`) lives in
:mod:`agentgym.serving.service`; this module is the HTTP layer, :func:`start_server`,
:class:`ServerThread` and the blocking :func:`serve`.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agentgym.serving.dialects import Dialect, dialect_for
from agentgym.serving.service import (
    PROTOCOL_HEADER,
    TOKEN_ENV,
    EnvService,
    RequestError,
    close_quietly,
    json_type,
)

_log = logging.getLogger(__name__)
#: Path prefix of the generic protocol when an AgentGym dialect holds the root.
GENERIC_PREFIX = "/generic"
_HTTP_KINDS = {404: "NotFound", 405: "MethodNotAllowed", 413: "TooLarge"}


class InsecureServerError(ValueError):
    """Serving off loopback without a bearer token (and without ``insecure=True``)."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine."""
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, auth_token: str | None, insecure: bool) -> None:
    """Refuse to serve off loopback without a token unless ``insecure``."""
    if not is_loopback(host) and not auth_token and not insecure:
        raise InsecureServerError(
            f"refusing to serve on {host!r} (reachable from other machines) without a bearer "
            f"token: pass --auth-token TOKEN (or set {TOKEN_ENV}), or --insecure to serve "
            "it open")


def _error(status: int, message: str, kind: str, headers=None) -> web.Response:
    return web.json_response({"error": message, "type": kind}, status=status, headers=headers)


# ---------------------------------------------------------------------- the app
_SERVICE = web.AppKey("service", EnvService)
_MAX_BODY = web.AppKey("max_body_bytes", int)
_PROTOCOL = web.AppKey("protocol", str)


async def _json_body(request: web.Request, *, optional: bool = False) -> dict:
    raw = await request.read()  # 413 past client_max_size
    if not raw.strip():
        if optional:
            return {}
        raise RequestError(400, "empty body; expected a JSON object", "BadJSON")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise RequestError(400, f"body is not valid JSON: {e}", "BadJSON") from None
    if body is None and optional:
        return {}
    if not isinstance(body, dict):
        raise RequestError(
            400, f"body must be a JSON object, got {json_type(body)}", "BadJSON"
        )
    return body


@web.middleware
async def _errors(request: web.Request, handler):
    """Every failure becomes a JSON error response; nothing escapes as a crash."""
    try:
        return await handler(request)
    except RequestError as e:
        return _error(e.status, str(e), e.kind, e.headers)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        message = e.reason if e.text is None or e.text.startswith(str(e.status)) else e.text
        if e.status == 404:
            message = f"no endpoint {request.method} {request.path}; see GET / for the protocol"
        elif e.status == 405:
            message = f"{request.method} is not allowed on {request.path}"
        elif e.status == 413:
            message = f"request body too large (limit {request.app[_MAX_BODY]} bytes)"
        keep = {k: v for k, v in e.headers.items() if k.lower() in ("allow", "retry-after")}
        return _error(e.status, message, _HTTP_KINDS.get(e.status, "HTTPError"), keep)
    except asyncio.CancelledError:
        raise
    except Exception:  # a bug in this module: log it, answer, keep serving
        _log.exception("%s %s failed", request.method, request.path)
        return _error(500, "internal server error (the server log has the details)",
                      "InternalError")


def _auth(token: str):
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler):
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise RequestError(401, "missing or wrong bearer token (send 'Authorization: "
                               "Bearer TOKEN')", "Unauthorized",
                               headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return check


def _dialect_handler(service: EnvService, route):
    async def handler(request: web.Request):
        if route.method == "GET":
            arg = request.query
        else:
            arg = await _json_body(request, optional=route.optional_body)
        return web.json_response(await route.handler(service, arg))

    return handler


def create_app(
    env_id: str,
    *,
    max_envs: int | None = 4096,
    idle_timeout: float | None = None,
    max_body_bytes: int = 1 << 20,
    threads: int | None = None,
    available_actions: bool = False,
    protocol: str = "generic",
    auth_token: str | None = None,
    **env_kwargs: Any,
) -> web.Application:
    """The aiohttp application serving ``env_id`` (see the module docstring for routes).

    ``protocol``: ``"generic"`` (the routes above at the root), ``"agentgym"`` (the env's
    AgentGym family dialect at the root and the generic routes under ``/generic``; envs
    without a family get the generic protocol) or a family name of
    :data:`agentgym.serving.dialects.DIALECTS`. ``auth_token``: every request must carry
    ``Authorization: Bearer <token>`` (401 otherwise).
    """
    dialect: Dialect | None = dialect_for(env_id, protocol)
    service = EnvService(env_id, env_kwargs, max_envs=max_envs, idle_timeout=idle_timeout,
                         threads=threads, available_actions=available_actions)
    middlewares = [_errors] + ([_auth(auth_token)] if auth_token else [])
    app = web.Application(client_max_size=max_body_bytes, middlewares=middlewares)
    app[_SERVICE] = service
    app[_MAX_BODY] = max_body_bytes
    spoken = "generic" if dialect is None else dialect.family
    app[_PROTOCOL] = spoken

    async def mark(request, response):
        response.headers[PROTOCOL_HEADER] = spoken

    app.on_response_prepare.append(mark)

    async def hello(request):
        from agentgym import __version__

        return web.json_response({"name": "agentgym-rl env server", "env": env_id,
                                  "version": __version__, "live": len(service.envs),
                                  "max_envs": max_envs, "protocol": "agentgym",
                                  "endpoints": [f"{m} {p}" for m, p, _ in routes]})

    async def listing(request):
        return web.json_response(service.listing())

    async def create(request):
        return web.json_response(await service.create(await _json_body(request, optional=True)))

    async def reset(request):
        return web.json_response(await service.reset(await _json_body(request)))

    async def step(request):
        return web.json_response(await service.step(await _json_body(request)))

    async def close(request):
        return web.json_response(await service.close(await _json_body(request)))

    async def observation(request):
        _, slot = service.query_slot(request.query)
        return web.json_response(slot.observation)

    async def detail(request):
        return web.json_response(await service.detail(*service.query_slot(request.query)))

    async def available(request):
        _, slot = service.query_slot(request.query)
        return web.json_response(await service.actions(slot))

    async def oracle(request):
        _, slot = service.query_slot(request.query)
        return web.json_response(await service.oracle(slot))

    instructions_text: list[str] = []

    async def instructions(request):
        if not instructions_text:
            probe = next(iter(service.envs.values()), None)
            if probe is None:
                env = await service._guarded(service._make)
                text = getattr(env, "instructions", "")
                await service._run(close_quietly, env)
            else:
                text = getattr(probe.env, "instructions", "")
            instructions_text[:] = [text if isinstance(text, str) else str(text)]
        return web.json_response(instructions_text[0])

    routes = [("GET", "/", hello), ("GET", "/list", listing), ("POST", "/create", create),
              ("POST", "/reset", reset), ("POST", "/step", step), ("POST", "/close", close),
              ("GET", "/observation", observation), ("GET", "/detail", detail),
              ("GET", "/available_actions", available), ("GET", "/oracle_action", oracle),
              ("GET", "/instructions", instructions)]
    prefixes = [""]
    if env_id.replace("-", "").replace("_", "").isalnum():
        prefixes.append(f"/{env_id}")
    if dialect is not None:
        prefixes = [GENERIC_PREFIX]

        async def greeting(request):
            return web.json_response(dialect.hello)

        app.router.add_route("GET", "/", greeting)
        for route in dialect.routes:
            app.router.add_route(route.method, route.path, _dialect_handler(service, route))
    for prefix in prefixes:
        for method, path, handler in routes:
            app.router.add_route(method, (prefix + path) if path != "/" or not prefix else prefix,
                                 handler)

    async def sweeper(app):
        task = None
        if idle_timeout is not None:
            async def loop():
                period = max(0.05, min(idle_timeout / 2, 30.0))
                while True:
                    await asyncio.sleep(period)
                    await service.sweep()

            task = asyncio.create_task(loop())
        yield
        if task is not None:
            task.cancel()
        await service.shutdown()

    app.cleanup_ctx.append(sweeper)
    return app


@dataclass
class ServerHandle:
    """A running server: ``url``, ``port``, ``service`` (the env table), ``await close()``."""

    runner: web.AppRunner
    host: str
    port: int
    app: web.Application

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def service(self) -> EnvService:
        return self.app[_SERVICE]

    async def close(self) -> None:
        await self.runner.cleanup()

    async def __aenter__(self) -> ServerHandle:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


async def start_server(env_id: str, host: str = "127.0.0.1", port: int = 0, *,
                       insecure: bool = False, **options: Any) -> ServerHandle:
    """Start serving ``env_id`` on the running event loop; ``port=0`` picks a free port.

    ``options`` are :func:`create_app`'s (``max_envs``, ``idle_timeout``, ``max_body_bytes``,
    ``threads``, ``available_actions``, ``protocol``, ``auth_token``) plus keyword arguments
    for ``agentgym.make``. Off loopback it refuses to start without ``auth_token`` (raising
    :class:`InsecureServerError`) unless ``insecure=True``.
    """
    check_exposure(host, options.get("auth_token"), insecure)
    app = create_app(env_id, **options)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1]
    return ServerHandle(runner, host, bound, app)


class ServerThread:
    """A server running on its own event loop in a daemon thread (for sync code and tests).

    ``with ServerThread("textcraft") as srv: RemoteEnv(srv.url, "textcraft")``.
    """

    def __init__(self, env_id: str, host: str = "127.0.0.1", port: int = 0, **options: Any):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"agentgym-server-{env_id}")
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            start_server(env_id, host, port, **options), self._loop)
        try:
            self.handle = future.result(timeout=60)
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._loop.close()
            raise

    @property
    def url(self) -> str:
        return self.handle.url

    @property
    def port(self) -> int:
        return self.handle.port

    @property
    def service(self) -> EnvService:
        return self.handle.service

    def call(self, coro, timeout: float = 60):
        """Run ``coro`` on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self.call(self.handle.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(env_id: str, host: str = "127.0.0.1", port: int = 8000, **options: Any) -> None:
    """Serve ``env_id`` until interrupted (``agentgym-rl serve-env ENV --port N``).

    Prints one line with the bound URL (useful with ``port=0``). ``options`` as for
    :func:`start_server`.
    """

    async def main():
        handle = await start_server(env_id, host, port, **options)
        protocol = handle.app[_PROTOCOL]
        print(f"agentgym env server: env={env_id} protocol={protocol} listening on "
              f"{handle.url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        try:
            import signal

            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
        try:
            await stop.wait()
        finally:
            await handle.close()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass


__all__ = ["GENERIC_PREFIX", "PROTOCOL_HEADER", "EnvService", "InsecureServerError", "RequestError",
           "ServerHandle", "ServerThread", "check_exposure", "create_app", "is_loopback",
           "serve", "start_server"]
