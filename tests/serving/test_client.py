"""RemoteEnv (agentgym.serving.client) against our own env server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading

import aiohttp
import gymnasium as gym
import httpx
import pytest

import agentgym
from agentgym.envs import BaseEnv
from agentgym.errors import (
    EnvError,
    EpisodeFinishedError,
    EpisodeNotStartedError,
    InvalidTaskError,
)
from agentgym.serving.client import (
    PROFILES,
    RemoteEnv,
    RemoteEnvError,
    ServerUnavailableError,
)
from agentgym.serving.server import ServerThread, start_server

pytestmark = pytest.mark.timeout(60)


class CountdownEnv(BaseEnv):
    """Say the numbers from a seeded start down to zero; wrong words cost reward."""

    instructions = "Count down: answer with the next number."
    num_tasks = 20

    def reset(self, task=None, seed=None):
        if not isinstance(task, int) or not 0 <= task < self.num_tasks:
            raise InvalidTaskError(f"task must be in [0, {self.num_tasks}), got {task!r}")
        self.n = task % 5 + random.Random(seed).randrange(4) + 1
        return f"task {task}: count down from {self.n}"

    def step(self, action):
        gate = GATES.get(action)
        if gate is not None:
            gate.wait(10)
        if action.strip() == str(self.n - 1):
            self.n -= 1
            return f"yes, {self.n}", 1.0, self.n == 0, {}
        return f"no, still {self.n}", -0.5, False, {}

    def valid_actions(self):
        return [str(self.n - 1)]

    def oracle_action(self):
        return str(self.n - 1)


GATES: dict[str, threading.Event] = {}
ENV = "_test_countdown_remote"
agentgym.register(ENV, CountdownEnv, override=True)


@pytest.fixture(scope="module")
def srv():
    with ServerThread(ENV, max_envs=64) as server:
        yield server


def _policy(env, i: int) -> str:
    """Mostly the env's oracle action, sometimes a wrong one."""
    if i % 3 == 2:
        return "look around"
    oracle = getattr(env, "oracle_action", None) or getattr(env.unwrapped, "oracle_action", None)
    action = oracle() if oracle else None
    return action if action is not None else "inventory"


def _compare_episodes(local, remote, task, seed, turns=40):
    lobs, linfo = local.reset(seed=seed, options={"task": task})
    robs, rinfo = remote.reset(seed=seed, options={"task": task})
    assert robs == lobs and rinfo["task"] == linfo["task"]
    for i in range(turns):
        action = _policy(local, i)
        lo, lr, lt, ltr, _ = local.step(action)
        ro, rr, rt, rtr, rinfo = remote.step(action)
        assert (ro, rr, rt, rtr) == (lo, pytest.approx(lr), lt, ltr), f"turn {i}"
        assert rinfo["turns"] == i + 1
        if lt or ltr:
            return i + 1
    return turns


@pytest.mark.parametrize("env_id", [ENV, "textcraft", "maze"])
def test_remote_matches_local_step_for_step(env_id):
    with ServerThread(env_id) as server:
        local = agentgym.make(env_id, max_turns=30)
        remote = RemoteEnv(server.url, env_id, max_turns=30)
        try:
            lengths = [_compare_episodes(local, remote, task, seed)
                       for task, seed in [(0, 0), (1, 7), (3, 123), (4, 2**40)]]
            assert all(n >= 1 for n in lengths)
            assert server.service.listing()["live"] == 1  # one server env, reset each time
        finally:
            remote.close()
        assert server.service.listing()["live"] == 0


def test_gymnasium_api_and_make_remote(srv):
    env = agentgym.make(f"remote:{ENV}", url=srv.url, max_turns=3)
    assert isinstance(env, RemoteEnv) and isinstance(env, gym.Env)
    obs, info = env.reset(seed=5, options={"task": 2})
    assert env.observation_space.contains(obs) and info["env_idx"] is not None
    steps = 0
    truncated = terminated = False
    while not (terminated or truncated):
        _, _, terminated, truncated, _ = env.step("wrong")
        steps += 1
    assert truncated and not terminated and steps == 3
    with pytest.raises(EpisodeFinishedError):
        env.step("wrong")
    with pytest.raises(TypeError):
        env.step(3)
    local = agentgym.make(ENV)
    local.reset(seed=5, options={"task": 2})
    assert env.valid_actions() == local.valid_actions() == [str(int(obs.split()[-1]) - 1)]
    env.close()
    with pytest.raises(ValueError, match="needs url"):
        agentgym.make(f"remote:{ENV}")


def test_reset_without_task_draws_one_from_the_seed(srv):
    local = agentgym.make(ENV)
    remote = RemoteEnv(srv.url, ENV)
    try:
        for seed in (0, 1, 99):
            assert remote.reset(seed=seed)[0] == local.reset(seed=seed)[0]
    finally:
        remote.close()


def test_server_errors_come_back_named(srv):
    env = RemoteEnv(srv.url, ENV)
    try:
        with pytest.raises(InvalidTaskError, match="task must be in"):
            env.reset(seed=0, options={"task": 999})
        env.reset(seed=0, options={"task": 0})
        while True:
            _, _, terminated, _, _ = env.step(env.valid_actions()[0])
            if terminated:
                break
        # The server itself refuses a step on the finished episode (409).
        with pytest.raises(EpisodeFinishedError, match="409"):
            env._request("POST", "step", env._with_id({"action": "0"}))
        with pytest.raises(RemoteEnvError) as err:
            env._request("POST", "step", {"id": "nope", "action": "0"})
        assert err.value.status == 400 and isinstance(err.value, EnvError)
    finally:
        env.close()


def test_expired_env_is_recreated_on_reset(srv):
    env = RemoteEnv(srv.url, ENV)
    env.reset(seed=0, options={"task": 1})
    old = env.env_id
    httpx.post(srv.url + "/close", json={"id": old})
    with pytest.raises(RemoteEnvError) as err:  # a step is not retried: 410 comes back
        env.step("0")
    assert err.value.status == 410
    obs, info = env.reset(seed=0, options={"task": 1})
    assert env.env_id != old and obs.startswith("task 1:")
    env.close()
    assert env.env_id is None


def test_close_frees_server_env(srv):
    before = srv.service.listing()["live"]
    envs = [RemoteEnv(srv.url, ENV) for _ in range(5)]
    for i, env in enumerate(envs):
        env.reset(seed=i, options={"task": i})
    assert srv.service.listing()["live"] == before + 5
    for env in envs:
        env.close()
        env.close()  # idempotent
    assert srv.service.listing()["live"] == before


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _count_sends(monkeypatch, name: str) -> list:
    """Record the path of every request ``RemoteEnv.<name>`` (``_send`` or ``_asend``) sends,
    then send it for real; returns the record."""
    sent, real = [], getattr(RemoteEnv, name)

    def counted(self, method, path, body):
        sent.append(path)
        return real(self, method, path, body)

    monkeypatch.setattr(RemoteEnv, name, counted)
    return sent


@pytest.mark.timeout(15)
def test_server_down_is_a_clear_error_quickly(monkeypatch):
    sent = _count_sends(monkeypatch, "_send")
    env = RemoteEnv(_dead_url(), ENV, retries=2, backoff=0.01, connect_timeout=1.0)
    with pytest.raises(ServerUnavailableError, match="unreachable after 3 attempts"):
        env.reset(seed=0)
    # the protocol probe, then the request that never arrived, sent again
    assert sent == [""] + ["create"] * 3
    env.close()


@pytest.mark.timeout(15)
async def test_server_down_async(monkeypatch):
    sent = _count_sends(monkeypatch, "_asend")
    env = RemoteEnv(_dead_url(), ENV, retries=1, backoff=0.01, connect_timeout=1.0)
    with pytest.raises(ServerUnavailableError, match="unreachable after 2 attempts"):
        await env.areset(seed=0)
    assert sent == [""] + ["create"] * 2
    await env.aclose()


def test_read_timeout_is_an_error_not_a_hang(srv):
    gate = GATES.setdefault("hold", threading.Event())
    gate.clear()
    env = RemoteEnv(srv.url, ENV, read_timeout=0.3)
    try:
        env.reset(seed=0, options={"task": 0})
        with pytest.raises(RemoteEnvError, match="did not answer /step"):
            env.step("hold")
    finally:
        gate.set()
        env.close()


def test_busy_server_503_is_retried_then_reported(monkeypatch):
    with ServerThread(ENV, max_envs=1) as server:
        holder = RemoteEnv(server.url, ENV)
        holder.reset(seed=0, options={"task": 0})
        waiter = RemoteEnv(server.url, ENV, retries=1, backoff=0.01)
        sent = _count_sends(monkeypatch, "_send")
        with pytest.raises(RemoteEnvError) as err:
            waiter.reset(seed=0, options={"task": 0})
        assert err.value.status == 503 and "cap" in str(err.value)
        assert sent == [""] + ["create"] * 2  # the 503 was retried once, then reported
        holder.close()
        assert waiter.reset(seed=0, options={"task": 0})[0].startswith("task 0:")
        waiter.close()


async def test_async_areset_astep_match_sync_and_share_a_pool():
    handle = await start_server(ENV)
    local = agentgym.make(ENV)
    try:
        async with aiohttp.ClientSession() as shared:
            envs = [RemoteEnv(handle.url, ENV, async_client=shared) for _ in range(6)]

            async def episode(env, task):
                obs, _ = await env.areset(seed=task, options={"task": task})
                trace = [obs]
                for i in range(20):
                    action = "wrong" if i % 4 == 3 else env.observe().rsplit(" ", 1)[-1]
                    action = str(int(action) - 1) if action.isdigit() else action
                    obs, reward, terminated, truncated, _ = await env.astep(action)
                    trace.append((obs, reward, terminated))
                    if terminated:
                        break
                return trace

            traces = await asyncio.gather(*(episode(e, t) for t, e in enumerate(envs)))
            for task, trace in enumerate(traces):
                assert trace[0] == local.reset(seed=task, options={"task": task})[0]
                assert trace[-1][2] is True
            assert handle.service.listing()["live"] == 6
            await asyncio.gather(*(e.aclose() for e in envs))
            assert handle.service.listing()["live"] == 0
            assert not shared.closed  # a shared session stays open for its owner
    finally:
        await handle.close()


@pytest.mark.parametrize("name", ["webshop", "searchqa", "webarena", "alfworld", "maze",
                                  "sciworld", "babyai"])
def test_agentgym_server_profiles_against_our_server(srv, name):
    """Each AgentGym server family's request shapes, spoken to our server (which takes them
    all), reach the same episode as a local env with the profile's seed."""
    profile = PROFILES[name]
    env = RemoteEnv(srv.url, name)
    local = agentgym.make(ENV)
    try:
        obs, _ = env.reset(seed=3, options={"task": 4})
        seed = 3 if profile.send_seed else profile.reset_extra.get("seed", 0)
        expected = local.reset(seed=seed, options={"task": 4})[0]
        assert obs == expected  # the generic server's observation as it is (no SciWorld join)
        assert env.server == "agentgym-rl" and env.server_dialect == "generic"
        o, r, *_ = env.step("nope")
        assert (o, r) == local.step("nope")[:2]
    finally:
        env.close()


def test_bad_arguments_and_unknown_profile_default():
    with pytest.raises(ValueError):
        RemoteEnv("localhost:8000", ENV)
    with pytest.raises(TypeError, match="aiohttp.ClientSession"):
        RemoteEnv("http://127.0.0.1:1", ENV, async_client=object())
    with pytest.raises(EpisodeNotStartedError):
        RemoteEnv("http://127.0.0.1:1", ENV).step("0")
    assert RemoteEnv("http://127.0.0.1:1", "anything").profile == PROFILES["agentgym"]


def test_passes_gymnasium_env_checker(srv):
    from gymnasium.utils.env_checker import check_env

    env = RemoteEnv(srv.url, ENV)
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()


@pytest.mark.timeout(20)
def test_server_going_away_mid_episode():
    server = ServerThread(ENV)
    env = RemoteEnv(server.url, ENV, retries=1, backoff=0.01, connect_timeout=1.0)
    env.reset(seed=0, options={"task": 0})
    server.stop()
    with pytest.raises(ServerUnavailableError):
        env.step("0")
    env.close()  # nothing to free any more: quiet
    assert env.env_id is None


# ------------------------------------------------- against AgentGym's servers (stand-ins)
class AgentGymStandIn:
    """A stand-in for one AgentGym env server, answering field for field as that family's
    ``agentenv-*/server.py`` does (AgentGym's servers are not on PyPI): its greeting, its
    request models (FastAPI's 422 for a missing field), its reply shapes, its errors (200
    with ``{"error"}``; 500 for WebShop's and SearchQA's unknown ids), no ``/close`` on
    WebShop, and steps after ``done`` answered as it answers them. Its episodes are a
    stand-in game: two steps to ``done`` (reward 1 on the second). ``restart()`` forgets
    every env, as a restarted server does; ``seen`` records ``(path, body)``."""

    def __init__(self, family: str):
        from aiohttp import web

        self.family, self.envs, self.next_id, self.seen = family, {}, 0, []
        app = web.Application()
        text = {"babyai": "This is environment BabyAI.",
                "textcraft": "This is environment TextCraft.",
                "sciworld": "This is environment ScienceWorld."}.get(family, "ok")

        async def hello(request):
            return web.json_response(text)

        app.router.add_get("/", hello)
        for path in ("create", "reset", "step", "close"):
            if not (family == "webshop" and path == "close"):
                app.router.add_post(f"/{path}", self._post(path))
        app.router.add_get("/observation", self._observation)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._runner = web.AppRunner(app)

        async def start():
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            return self._runner.addresses[0][1]

        port = asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        self.url = f"http://127.0.0.1:{port}"

    def restart(self):
        self.envs.clear()

    def stop(self):
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    @property
    def key(self) -> str:
        return "env_idx" if self.family in ("webshop", "searchqa") else "id"

    def _obs(self, env: dict) -> str:
        return f"task {env['task']}: {env['left']} to go"

    async def _observation(self, request):
        from aiohttp import web

        env = self.envs.get(int(request.query[self.key]))
        return web.json_response(self._obs(env) if env else {"error": "unknown"})

    def _post(self, path):
        from aiohttp import web

        required = {("create", "searchqa"): ["id"], ("reset", "babyai"): ["id", "data_idx"],
                    ("reset", "sciworld"): ["id", "data_idx"]}.get((path, self.family))
        if required is None:
            required = [] if path == "create" else [self.key]
            required += ["action"] if path == "step" else []

        async def handler(request):
            raw = await request.read()
            body = json.loads(raw) if raw.strip() else {}
            self.seen.append((path, body))
            for key in required:
                if not isinstance(body.get(key), int if key != "action" else str):
                    return web.json_response({"detail": [{"loc": ["body", key],
                                                          "msg": "field required"}]},
                                             status=422)
            return web.json_response(self._answer(path, body))

        async def guarded(request):
            try:
                return await handler(request)
            except KeyError:  # WebShop's and SearchQA's servers don't catch a bad id
                return web.Response(status=500, text="Internal Server Error")

        return guarded

    def _answer(self, path: str, body: dict):
        fam = self.family
        if path == "create":
            idx, self.next_id = self.next_id, self.next_id + 1
            self.envs[idx] = {"task": body.get("id", idx), "left": 2, "score": 0, "done": False}
            if fam in ("webshop", "searchqa"):
                return idx
            if fam == "textcraft":
                return {"id": idx, "observation": self._obs(self.envs[idx]), "done": False,
                        "reward": 0}
            return {"id": idx}
        idx = body[self.key]
        if fam in ("webshop", "searchqa"):
            env = self.envs[idx]  # KeyError -> 500, as theirs
        elif idx not in self.envs:
            return {"error": f"The id {idx} is not valid."}
        else:
            env = self.envs[idx]
        if path == "close":
            del self.envs[idx]
            return True
        if path == "reset":
            task = {"webshop": body.get("session_id"), "searchqa": body.get("id")}.get(
                fam, body.get("data_idx", 0))
            if fam == "sciworld" and task >= 10:
                return {"error": "list index out of range"}
            env.update(task=task, left=2, score=0, done=False)
            obs = self._obs(env)
            if fam == "webshop":
                return [obs, None]
            if fam == "searchqa":
                return obs
            if fam == "textcraft":
                return {"id": idx, "observation": obs, "done": False, "reward": 0}
            if fam == "babyai":
                return {"observation": obs, "reward": 0, "score": 0, "deleted": False,
                        "done": False}
            return {"task_name": "boil", "var_num": task, "task_description": "Boil it.",
                    "observation": obs, "reward": 0, "score": 0, "deleted": False,
                    "done": False}
        if env["done"] and fam in ("babyai", "sciworld"):
            return {"error": f"The task with environment {idx} has finished."}
        env["left"] = max(env["left"] - 1, 0)
        reward = 1 if env["left"] == 0 and not env["done"] else 0
        env["done"] = env["left"] == 0
        env["score"] += reward
        obs = self._obs(env)
        if fam == "webshop":
            return {"state": obs, "reward": reward, "done": env["done"], "info": None}
        if fam in ("searchqa", "textcraft"):
            out = {"observation": obs, "reward": reward, "done": env["done"]}
            return out | ({"info": None} if fam == "searchqa" else {})
        return {"observation": obs, "reward": reward, "score": env["score"],
                "done": env["done"]}


FAMILIES = ["babyai", "textcraft", "sciworld", "webshop", "searchqa"]


@pytest.fixture(params=FAMILIES)
def standin(request):
    server = AgentGymStandIn(request.param)
    yield server
    server.stop()


def _named(family: str) -> str:
    """The env name RemoteEnv gets: none for the families whose greeting names them."""
    return family if family in ("webshop", "searchqa") else "agentgym"


def test_remote_env_plays_agentgym_servers(standin):
    env = RemoteEnv(standin.url, _named(standin.family), backoff=0.01)
    obs, info = env.reset(seed=4)  # no task: the servers that need one get data_idx 4
    assert (env.server, env.server_dialect) == ("agentgym", standin.family)
    assert info["server_dialect"] == standin.family
    expected = "task 4: 2 to go" if standin.family != "webshop" else "task None: 2 to go"
    if standin.family == "sciworld":
        expected = "Boil it.\n" + expected  # AgentGym's client joins them so
    assert obs == expected
    resets = [b for p, b in standin.seen if p == "reset"]
    if standin.family in ("babyai", "sciworld", "searchqa"):
        assert resets[-1][env.profile.task_key] == 4
    obs, reward, term, trunc, _ = env.step("go")
    assert (obs, reward, term) == (f"task {4 if standin.family != 'webshop' else None}: "
                                   "1 to go", 0.0, False)
    obs, reward, term, trunc, _ = env.step("go")
    assert (reward, term, trunc) == (1.0, True, False)
    obs, _ = env.reset(options={"task": 7})
    assert obs.endswith("task 7: 2 to go")
    env.close()


def test_remote_env_recreates_an_env_agentgym_lost(standin):
    env = RemoteEnv(standin.url, _named(standin.family), backoff=0.01)
    env.reset(options={"task": 1})
    first = env.env_id
    standin.restart()  # a restarted server: "The id 0 is not valid." (or 500)
    obs, _ = env.reset(options={"task": 2})
    assert obs.endswith("task 2: 2 to go") and env.env_id != first
    assert [p for p, _ in standin.seen].count("create") == 2
    standin.restart()
    with pytest.raises(RemoteEnvError) as err:  # mid-episode: an error, never a reply
        env.step("go")
    assert err.value.status in (200, 500)
    env.close()


def test_agentgym_error_answers_are_errors():
    server = AgentGymStandIn("sciworld")
    try:
        env = RemoteEnv(server.url, backoff=0.01)
        with pytest.raises(RemoteEnvError, match="list index out of range") as err:
            env.reset(options={"task": 12})  # 200 {"error": ...}: not an episode
        assert err.value.status == 200
        assert env.reset(options={"task": 3})[0] == "Boil it.\ntask 3: 2 to go"
        env.close()
    finally:
        server.stop()


def test_remote_env_sends_bearer_token(monkeypatch):
    with ServerThread(ENV, auth_token="s3cret") as server:
        env = RemoteEnv(server.url, ENV, auth_token="s3cret")
        assert env.reset(seed=0, options={"task": 1})[0].startswith("task 1")
        env.close()
        monkeypatch.setenv("AGENTGYM_AUTH_TOKEN", "s3cret")
        env = RemoteEnv(server.url, ENV)  # the token from the environment
        assert env.reset(seed=0, options={"task": 2})[0].startswith("task 2")
        env.close()
        monkeypatch.delenv("AGENTGYM_AUTH_TOKEN")
        env = RemoteEnv(server.url, ENV, retries=0)
        with pytest.raises(RemoteEnvError) as err:
            env.reset(seed=0)
        assert err.value.status == 401
        env.close()
