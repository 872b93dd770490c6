"""The AgentGym-protocol env server (agentgym.serving.server) over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentgym
from agentgym.envs import BaseEnv
from agentgym.errors import InvalidTaskError
from agentgym.serving.server import ServerThread, start_server

pytestmark = pytest.mark.timeout(60)


class GuessEnv(BaseEnv):
    """Guess a hidden number; the seed moves the number, so (task, seed) fixes an episode."""

    instructions = "Guess the hidden number in [0, 50): answer `guess N`."
    num_tasks = 100

    def reset(self, task=None, seed=None):
        if not isinstance(task, int) or not 0 <= task < self.num_tasks:
            raise InvalidTaskError(f"task must be an index in [0, {self.num_tasks}), got {task!r}")
        self.target = (task * 7 + random.Random(seed).randrange(10)) % 50
        return f"task {task}: guess a number in [0, 50)"

    def step(self, action):
        if action == "boom":
            raise RuntimeError("the env itself broke")
        gate = GATES.get(action)
        if gate is not None:
            gate.wait(10)
        try:
            guess = int(action.split()[-1])
        except (ValueError, IndexError):
            return "invalid action", -0.1, False, {}
        if guess == self.target:
            return "correct", 1.0, True, {}
        return ("higher" if guess < self.target else "lower"), 0.0, False, {"guess": guess}

    def valid_actions(self):
        return [f"guess {i}" for i in range(50)]


GATES: dict[str, threading.Event] = {}
ENV = "_test_guess_server"
agentgym.register(ENV, GuessEnv, override=True)


def local_target(task: int, seed: int) -> int:
    """The hidden number of (task, seed), read from a local env built by agentgym.make."""
    env = agentgym.make(ENV)
    env.reset(seed=seed, options={"task": task})
    return env.unwrapped.env.target


@pytest.fixture
async def server():
    handle = await start_server(ENV, max_envs=8)
    async with httpx.AsyncClient(base_url=handle.url, timeout=10) as client:
        client.handle = handle
        yield client
    await handle.close()


async def test_binds_localhost_and_reports_port():
    handle = await start_server(ENV)
    try:
        assert handle.host == "127.0.0.1" and handle.port > 0
        async with httpx.AsyncClient() as c:
            hello = (await c.get(handle.url + "/")).json()
        assert hello["env"] == ENV and hello["live"] == 0 and "POST /step" in hello["endpoints"]
    finally:
        await handle.close()


async def test_agentgym_textcraft_client_calls(server):
    """Exactly the requests AgentGym's TextCraftEnvClient makes, and the keys it reads."""
    r = await server.post("/create", json={"minecraft_dir": "agentenv_textcraft/",
                                           "commands": None, "goal": None})
    assert r.status_code == 200
    created = r.json()
    env_id = created["id"]
    assert isinstance(env_id, int) and isinstance(created["observation"], str)
    r = await server.post("/reset", json={"data_idx": 3, "id": env_id})
    assert r.status_code == 200 and r.json()["observation"].startswith("task 3:")
    r = await server.post("/step", json={"action": "guess 0", "id": env_id})
    step = r.json()
    assert r.status_code == 200 and {"observation", "reward", "done"} <= step.keys()
    assert step["observation"] in ("higher", "correct") and step["done"] is (step["reward"] == 1)
    r = await server.get(f"/observation?id={env_id}")
    assert r.json() == step["observation"]
    r = await server.post("/close", json={"id": env_id})
    assert r.status_code == 200 and r.json()["closed"] is True


async def test_other_agentgym_client_shapes(server):
    # BabyAI/SciWorld/ALFWorld: POST /create with no body; step reads "score".
    r = await server.post("/create")
    env_id = r.json()["id"]
    step = (await server.post("/step", json={"action": "nonsense", "id": env_id})).json()
    assert step["score"] == pytest.approx(-0.1) and step["reward"] == pytest.approx(-0.1)
    # ALFWorld / LMRL-Gym maze: {"game": idx}, routes also under /<env id>/.
    r = await server.post(f"/{ENV}/reset", json={"id": env_id, "game": 5, "world_type": "Text"})
    assert r.json()["observation"].startswith("task 5:")
    # SearchQA: env addressed by env_idx; "id" is then the task index; GET ?env_idx=.
    r = await server.post("/reset", json={"env_idx": env_id, "id": 7})
    assert r.json()["observation"].startswith("task 7:")
    assert (await server.get(f"/observation?env_idx={env_id}")).json().startswith("task 7:")
    # WebArena: create answers env_idx; reset {"seed": 0, "idx": i}; step reads "terminated".
    env_idx = (await server.post("/create")).json()["env_idx"]
    r = await server.post("/reset", json={"env_idx": env_idx, "seed": 0, "idx": 9})
    assert r.json()["observation"].startswith("task 9:")
    step = (await server.post("/step", json={"env_idx": env_idx, "action": "x"})).json()
    assert step["terminated"] is False
    # WebShop: {"env_idx", "session_id"}.
    r = await server.post("/reset", json={"env_idx": env_idx, "session_id": 11})
    assert r.json()["observation"].startswith("task 11:")


async def test_full_episode_is_deterministic(server):
    async def episode(seed):
        env_id = (await server.post("/create", json={"data_idx": 4, "seed": seed})).json()["id"]
        out = []
        for guess in range(50):
            step = (await server.post("/step", json={"id": env_id, "action": f"guess {guess}"}))
            step = step.json()
            out.append((step["observation"], step["reward"], step["done"]))
            if step["done"]:
                assert step["score"] == 1.0 and step["terminated"] and not step["truncated"]
                break
        await server.post("/close", json={"id": env_id})
        return out

    a, b = await episode(1), await episode(1)
    assert a == b and a[-1] == ("correct", 1.0, True)


async def test_stepping_finished_episode_is_409_then_reset_recovers(server):
    env_id = (await server.post("/create", json={"data_idx": 0, "seed": 0})).json()["id"]
    target = local_target(0, 0)
    step = (await server.post("/step", json={"id": env_id, "action": f"guess {target}"})).json()
    assert step["done"] is True
    r = await server.post("/step", json={"id": env_id, "action": "guess 1"})
    assert r.status_code == 409
    assert r.json()["type"] == "EpisodeFinishedError" and "reset" in r.json()["error"]
    await server.post("/reset", json={"id": env_id, "data_idx": 1})
    assert (await server.post("/step", json={"id": env_id, "action": "guess 1"})).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/step", b"{not json", 400, "not valid JSON"),
        ("/step", b"\xff\xfe", 400, "not valid JSON"),
        ("/step", b"[1, 2]", 400, "JSON object"),
        ("/step", b"", 400, "empty body"),
        ("/step", {"action": "x"}, 400, "missing field 'id'"),
        ("/step", {"id": "abc", "action": "x"}, 400, "must be an integer"),
        ("/step", {"id": 1.5, "action": "x"}, 400, "must be an integer"),
        ("/step", {"id": True, "action": "x"}, 400, "must be an integer"),
        ("/step", {"id": -1, "action": "x"}, 400, ">= 0"),
        ("/step", {"id": 0}, 400, "missing field 'action'"),
        ("/step", {"id": 0, "action": 5}, 400, "'action' must be a string"),
        ("/step", {"id": 12345, "action": "x"}, 404, "unknown env id 12345"),
        ("/reset", {"id": 0, "data_idx": [1]}, 400, "task index"),
        ("/reset", {"id": 0, "data_idx": 10_000}, 400, "task must be an index"),
        ("/reset", {"id": 0, "seed": -3}, 400, "'seed' must be >= 0"),
        ("/reset", {"id": 0, "max_turns": 0}, 400, "'max_turns' must be >= 1"),
        ("/create", {"data_idx": "x"}, 400, "task must be an index"),
        ("/close", {"id": 999}, 404, "unknown env id"),
        ("/nowhere", {}, 404, "no endpoint POST /nowhere"),
    ],
)
async def test_bad_requests_get_4xx_json(server, path, body, status, needle):
    await server.post("/create", json={"data_idx": 0})
    if isinstance(body, bytes):
        r = await server.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        r = await server.post(path, json=body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]
    assert (await server.get("/")).status_code == 200


async def test_wrong_method_and_oversized_body():
    handle = await start_server(ENV, max_body_bytes=1024)
    try:
        async with httpx.AsyncClient(base_url=handle.url) as c:
            r = await c.get("/step")
            assert r.status_code == 405 and "GET is not allowed" in r.json()["error"]
            r = await c.post("/step", json={"id": 0, "action": "x" * 5000})
            assert r.status_code == 413 and "1024 bytes" in r.json()["error"]
            assert (await c.get("/observation?id=zz")).status_code == 400
            assert (await c.get("/observation")).status_code == 400
    finally:
        await handle.close()


async def test_close_frees_env_and_later_calls_say_closed(server):
    ids = [(await server.post("/create")).json()["id"] for _ in range(3)]
    service = server.handle.service
    assert service.listing()["live"] == 3
    assert (await server.post("/close", json={"id": ids[1]})).json() == {"id": ids[1],
                                                                          "closed": True}
    listing = (await server.get("/list")).json()
    assert listing["live"] == 2 and listing["ids"] == [ids[0], ids[2]]
    r = await server.post("/step", json={"id": ids[1], "action": "x"})
    assert r.status_code == 410 and "closed" in r.json()["error"]
    assert (await server.get(f"/observation?id={ids[1]}")).status_code == 410
    again = (await server.post("/close", json={"id": ids[1]})).json()
    assert again["closed"] is False
    for i in (ids[0], ids[2]):
        await server.post("/close", json={"id": i})
    assert service.listing()["live"] == 0 and len(service.envs) == 0


async def test_live_env_cap_answers_503_with_retry_after():
    handle = await start_server(ENV, max_envs=2)
    try:
        async with httpx.AsyncClient(base_url=handle.url) as c:
            a = (await c.post("/create")).json()["id"]
            await c.post("/create")
            r = await c.post("/create")
            assert r.status_code == 503 and r.headers["Retry-After"] == "1"
            assert "cap" in r.json()["error"]
            await c.post("/close", json={"id": a})
            assert (await c.post("/create")).status_code == 200
    finally:
        await handle.close()


async def test_idle_envs_expire():
    handle = await start_server(ENV, idle_timeout=0.1)
    try:
        async with httpx.AsyncClient(base_url=handle.url) as c:
            env_id = (await c.post("/create")).json()["id"]
            for _ in range(200):
                if handle.service.listing()["live"] == 0:
                    break
                await __import__("asyncio").sleep(0.05)
            assert handle.service.listing()["expired"] == 1
            r = await c.post("/step", json={"id": env_id, "action": "x"})
            assert r.status_code == 410 and "idle" in r.json()["error"]
    finally:
        await handle.close()


async def test_env_exception_is_500_and_server_lives(server):
    env_id = (await server.post("/create")).json()["id"]
    r = await server.post("/step", json={"id": env_id, "action": "boom"})
    assert r.status_code == 500 and "the env itself broke" in r.json()["error"]
    r = await server.post("/step", json={"id": env_id, "action": "guess 3"})
    assert r.status_code == 200


async def test_blocking_step_runs_off_the_event_loop(server):
    import asyncio

    gate = GATES.setdefault("wait-for-gate", threading.Event())
    gate.clear()
    env_id = (await server.post("/create")).json()["id"]
    other = (await server.post("/create")).json()["id"]
    slow = asyncio.create_task(server.post("/step", json={"id": env_id, "action": "wait-for-gate"}))
    await asyncio.sleep(0.05)
    # While that step blocks in a worker thread, the loop still serves other envs.
    assert (await server.get("/")).status_code == 200
    assert (await server.post("/step", json={"id": other, "action": "guess 1"})).status_code == 200
    assert not slow.done()
    gate.set()
    assert (await slow).status_code == 200


async def test_many_envs_concurrently(server):
    import asyncio

    async def run(task):
        env_id = (await server.post("/create", json={"data_idx": task, "seed": task})).json()["id"]
        for guess in range(50):
            step = (await server.post("/step", json={"id": env_id, "action": f"guess {guess}"}))
            if step.json()["done"]:
                break
        await server.post("/close", json={"id": env_id})
        return guess

    found = await asyncio.gather(*(run(t) for t in range(8)))
    assert found == [local_target(t, t) for t in range(8)]
    assert server.handle.service.listing()["live"] == 0


def test_available_actions_detail_and_instructions():
    with ServerThread(ENV, available_actions=True) as srv, httpx.Client(base_url=srv.url) as c:
        created = c.post("/create", json={"data_idx": 2}).json()
        assert created["available_actions"][:2] == ["guess 0", "guess 1"]
        assert c.get(f"/available_actions?id={created['id']}").json()[-1] == "guess 49"
        detail = c.get(f"/detail?id={created['id']}").json()
        assert detail["turns"] == 0 and detail["task"] == 2 and detail["seed"] == 0
        assert c.get("/instructions").json() == GuessEnv.instructions


def test_serve_blocks_prints_url_and_stops_on_sigterm():
    path = os.path.dirname(agentgym.__path__[0])
    code = f"import sys; sys.path.insert(0, {path!r})\n" + (
        "from agentgym.serving.server import serve\nserve('wordle', port=0)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line
        url = line.rsplit(" ", 1)[-1].strip()
        assert httpx.get(url + "/", timeout=10).json()["env"] == "wordle"
        proc.terminate()
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.stdout.close()


# ------------------------------------------------------------------ fuzzing
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12,
)
_field = st.one_of(st.integers(-5, 5), st.integers(), st.text(max_size=12), _json)
_bodies = st.one_of(
    st.binary(max_size=300),
    _json.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {}, optional={k: _field for k in ("id", "env_idx", "action", "data_idx", "seed",
                                            "game", "idx", "session_id", "max_turns")}
    ).map(lambda v: json.dumps(v).encode()),
)
_paths = st.sampled_from(["/", "/list", "/create", "/reset", "/step", "/close", "/observation",
                          "/detail", "/available_actions", "/instructions", f"/{ENV}/step",
                          "/step/extra", "/%ff", "/.."])


@pytest.fixture(scope="module")
def fuzz_server():
    with ServerThread(ENV, max_envs=100_000, max_body_bytes=4096) as srv:
        with httpx.Client(base_url=srv.url, timeout=10) as client:
            for _ in range(3):
                client.post("/create")
            yield client, srv


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]), path=_paths, body=_bodies,
       query=st.dictionaries(st.sampled_from(["id", "env_idx", "x"]), st.text(max_size=10),
                             max_size=2))
def test_fuzz_endpoints_never_5xx(fuzz_server, method, path, body, query):
    client, _ = fuzz_server
    r = client.request(method, path, content=body, params=query,
                       headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (r.status_code, r.text)
    if r.status_code >= 400:
        assert isinstance(r.json()["error"], str)


def test_fuzz_server_still_alive(fuzz_server):
    client, srv = fuzz_server
    assert client.get("/").status_code == 200
    env_id = client.post("/create", json={"data_idx": 1}).json()["id"]
    assert client.post("/step", json={"id": env_id, "action": "guess 7"}).status_code == 200


def test_requests_library_like_agentgym_clients():
    """AgentGym's clients use `requests`: create (JSON body or none), then `id` merged into
    every POST body, `?id=` on GETs, and `assert status_code == 200` on every answer."""
    requests = pytest.importorskip("requests")
    with ServerThread(ENV) as srv:
        base = srv.url
        ok = requests.post(f"{base}/create", timeout=300,
                           json={"minecraft_dir": "agentenv_textcraft/", "commands": None,
                                 "goal": None})
        assert ok.status_code == 200
        env_id = ok.json()["id"]
        info = {"observation": ok.json()["observation"], "reward": 0, "done": False}
        assert isinstance(info["observation"], str)

        def post(path, data):
            data["id"] = env_id
            res = requests.post(f"{base}/{path}", json=data, timeout=300)
            assert res.status_code == 200, res.text
            return res.json()

        reset = post("reset", {"data_idx": 6})
        assert reset["observation"].startswith("task 6:") and reset["done"] is False
        target = local_target(6, 0)
        for guess in range(50):
            out = post("step", {"action": f"guess {guess}"})
            if out["done"]:
                break
        assert guess == target and out["reward"] == 1.0 and out["score"] == 1.0
        res = requests.get(f"{base}/observation?id={env_id}", timeout=300)
        assert res.status_code == 200 and res.json() == "correct"
        assert post("close", {})["closed"] is True
        # A BabyAI-style create without any body.
        assert requests.post(f"{base}/create", timeout=300).json()["id"] == env_id + 1


# ------------------------------------------------------------- bearer token
def test_bearer_token_is_required_when_set():
    with ServerThread(ENV, auth_token="s3cret", protocol="agentgym") as srv:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = httpx.post(srv.url + "/create", json={}, headers=headers)
            assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
            assert "bearer token" in r.json()["error"]
        assert httpx.get(srv.url + "/list").status_code == 401  # every route
        assert srv.service.created == 0  # a refused request reached no env
        ok = httpx.post(srv.url + "/create", json={},
                        headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["id"] == 0


def test_off_loopback_needs_a_token_or_insecure():
    from agentgym.serving.server import InsecureServerError, check_exposure, is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    with pytest.raises(InsecureServerError, match="--auth-token"):
        ServerThread(ENV, host="0.0.0.0")
    check_exposure("0.0.0.0", "tok", False)  # a token: fine
    check_exposure("0.0.0.0", None, True)  # told --insecure: fine
    check_exposure("127.0.0.1", None, False)  # loopback stays token-free


def test_serve_env_cli_refuses_open_host_and_reads_token_env(monkeypatch, capsys):
    import argparse

    from agentgym.cli import serve_env

    p = argparse.ArgumentParser()
    serve_env.add_args(p)
    monkeypatch.delenv("AGENTGYM_AUTH_TOKEN", raising=False)
    from agentgym.errors import ConfigError

    with pytest.raises(ConfigError, match="refusing to serve on '0.0.0.0'"):
        serve_env.run(p.parse_args([ENV, "--host", "0.0.0.0", "--port", "0"]))
    seen = {}
    monkeypatch.setattr("agentgym.serving.server.serve", lambda env, **kw: seen.update(kw))
    monkeypatch.setenv("AGENTGYM_AUTH_TOKEN", "from-env")
    assert serve_env.run(p.parse_args([ENV, "--host", "0.0.0.0"])) == 0
    assert seen["auth_token"] == "from-env" and seen["protocol"] == "agentgym"
    assert serve_env.run(p.parse_args([ENV, "--auth-token", "flag", "--protocol",
                                       "generic"])) == 0
    assert seen["auth_token"] == "flag" and seen["protocol"] == "generic"
