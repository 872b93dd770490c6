"""AgentGym's clients against ``serve-env``'s family dialects, over real HTTP on 127.0.0.1.

Each test replays the exact requests one AgentGym client class (``agentenv/envs/<family>.py``
in WooooDyy/AgentGym) sends, with ``requests`` as those clients do: the same paths, bodies,
query strings and the fields they read from each reply, and checks the reply types and field
sets of that family's AgentGym server.
"""

from __future__ import annotations

import json
import shutil

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentgym
from agentgym.serving.client import RemoteEnv
from agentgym.serving.dialects import DIALECTS, FINISHED, SEARCHQA_INVALID, dialect_for
from agentgym.serving.server import PROTOCOL_HEADER, ServerThread

pytestmark = pytest.mark.timeout(60)
TIMEOUT = 30


def post(base: str, path: str, data: dict | None = None, **kw):
    """An AgentGym client's ``_post``: the body as JSON, 200 asserted, the JSON reply."""
    res = requests.post(f"{base}/{path}", json=data, timeout=TIMEOUT, **kw)
    assert res.status_code == 200, res.text
    return res.json()


def get(base: str, path: str, key: str, env_id: int):
    """An AgentGym client's ``_get``: the id in the query string."""
    res = requests.get(f"{base}/{path}?{key}={env_id}", timeout=TIMEOUT)
    assert res.status_code == 200, res.text
    return res.json()


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def oracle_run(env_id: str, task: int, seed: int = 0) -> list[str]:
    """The reference oracle's actions for one episode of a local env."""
    env = agentgym.make(env_id)
    env.reset(seed=seed, options={"task": task})
    actions = []
    for _ in range(60):
        a = env.unwrapped.oracle_action()
        actions.append(a)
        _, _, term, trunc, _ = env.step(a)
        if term or trunc:
            break
    env.close()
    return actions


@pytest.fixture(scope="module")
def textcraft():
    with ServerThread("textcraft", protocol="agentgym") as srv:
        yield srv.url


def test_textcraft_client_sequence(textcraft):
    base = textcraft
    ok = post(base, "create", {"minecraft_dir": "agentenv_textcraft/", "commands": None,
                               "goal": None})
    assert set(ok) == {"id", "observation", "done", "reward"}
    env_id = ok["id"]
    assert isinstance(env_id, int) and isinstance(ok["observation"], str)
    r = post(base, "reset", {"data_idx": 3, "id": env_id})
    assert set(r) == {"id", "observation", "done", "reward"} and r["done"] is False
    local = agentgym.make("textcraft")
    assert r["observation"] == local.reset(seed=0, options={"task": 3})[0]
    assert get(base, "observation", "id", env_id) == r["observation"]
    for action in oracle_run("textcraft", 3):
        s = post(base, "step", {"action": action, "id": env_id})
        assert set(s) == {"observation", "reward", "done"}
        assert isinstance(s["observation"], str) and is_number(s["reward"])
        assert isinstance(s["done"], bool)
        assert (s["observation"], s["reward"]) == local.step(action)[:2]
    assert s["done"] is True and s["reward"] == 1
    after = post(base, "step", {"action": "inventory", "id": env_id})  # AgentGym steps on: 200
    assert after == {"observation": FINISHED, "reward": 0.0, "done": True}
    assert set(get(base, "detail", "id", env_id)) == {"observation", "done", "reward", "deleted"}
    assert post(base, "close", {"id": env_id}) is True
    assert post(base, "close", {"id": env_id}) is False


def test_textcraft_create_honours_commands_and_goal(textcraft):
    base = textcraft
    commands = "craft 4 oak planks using 1 oak logs\ncraft 1 stick using 2 planks"
    ok = post(base, "create", {"commands": commands, "goal": "minecraft:oak_planks"})
    env_id = ok["id"]
    assert ok["observation"] == f"Crafting commands:\n{commands}\n\nGoal: craft oak planks."
    assert get(base, "commands", "id", env_id) == commands
    assert get(base, "goal", "id", env_id) == "minecraft:oak_planks"
    post(base, "step", {"action": "get 1 oak logs", "id": env_id})
    s = post(base, "step", {"action": "craft 4 oak planks using 1 oak logs", "id": env_id})
    assert s["done"] is True and s["reward"] == 1  # the goal given, not the index's
    # the goal alone: commands drawn as for an indexed task, served back by GET /commands
    ok2 = post(base, "create", {"goal": "stick"})
    listed = get(base, "commands", "id", ok2["id"])
    assert ok2["observation"] == f"Crafting commands:\n{listed}\n\nGoal: craft stick."
    res = requests.post(f"{base}/create", json={"commands": commands}, timeout=TIMEOUT)
    assert res.status_code == 400 and "goal" in res.json()["error"]
    for i in (env_id, ok2["id"]):
        post(base, "close", {"id": i})


def test_babyai_client_sequence():
    pytest.importorskip("minigrid")
    with ServerThread("babyai", protocol="agentgym") as srv:
        base = srv.url
        res = requests.post(f"{base}/create", timeout=TIMEOUT)  # no body, as the client sends
        assert res.status_code == 200 and set(res.json()) == {"id"}
        env_id = res.json()["id"]
        r = post(base, "reset", {"data_idx": 3, "id": env_id})
        assert set(r) == {"observation", "reward", "score", "deleted", "done"}
        local = agentgym.make("babyai")
        first = local.reset(options={"task": 3})[0]
        assert r["observation"] == first and r["observation"].startswith("Your goal: ")
        assert r["score"] == 0 and r["done"] is False and r["deleted"] is False
        s = post(base, "step", {"action": "turn left", "id": env_id})
        assert set(s) == {"observation", "reward", "score", "done"}
        assert s["observation"] == local.step("turn left")[0]
        o = get(base, "observation", "id", env_id)
        assert set(o) == {"observation", "reward", "score", "done", "deleted"}
        assert o["observation"] == first.split("\n", 1)[0] + "\n" + s["observation"]
        goal = first.split("\n", 1)[0].removeprefix("Your goal: go to the ")
        s = post(base, "step", {"action": f"go to {goal} 1", "id": env_id})
        assert s["done"] is True and s["reward"] > 0 and s["score"] == s["reward"]
        after = post(base, "step", {"action": "turn left", "id": env_id})
        assert after == {"observation": FINISHED, "reward": 0.0, "score": s["score"],
                         "done": True}
        missing = requests.post(f"{base}/reset", json={"id": env_id}, timeout=TIMEOUT)
        assert missing.status_code == 400 and "data_idx" in missing.json()["error"]
        assert post(base, "close", {"id": env_id}) is True


def test_webshop_client_sequence():
    with ServerThread("webshop", protocol="agentgym") as srv:
        base = srv.url
        res = requests.post(f"{base}/create", timeout=TIMEOUT)
        assert res.status_code == 200
        env_id = res.json()
        assert isinstance(env_id, int) and not isinstance(env_id, bool)  # a bare int
        r = post(base, "reset", {"session_id": 5, "env_idx": env_id})
        assert isinstance(r, list) and len(r) == 2 and r[1] is None
        obs = get(base, "observation", "env_idx", env_id)
        local = agentgym.make("webshop")
        assert obs == r[0] == local.reset(seed=0, options={"task": 5})[0]
        avail = get(base, "available_actions", "env_idx", env_id)
        assert avail == {"has_search_bar": True, "clickables": ["search"]}
        instruction = get(base, "instruction_text", "env_idx", env_id)
        assert instruction.startswith("Instruction:") and instruction in obs
        state = get(base, "state", "env_idx", env_id)
        assert set(state) == {"url", "html", "instruction_text"}
        for action in oracle_run("webshop", 5):
            s = post(base, "step", {"action": action, "env_idx": env_id})
            assert set(s) == {"state", "reward", "done", "info"} and s["info"] is None
            assert (s["state"], s["reward"]) == local.step(action)[:2]
        assert s["done"] is True and s["reward"] > 0
        after = post(base, "step", {"action": "click[back to search]", "env_idx": env_id})
        assert after == {"state": FINISHED, "reward": 0.0, "done": True, "info": None}
        assert env_id in get(base, "list_envs", "x", 0)
        assert post(base, "close", {"env_idx": env_id}) is True


def test_searchqa_client_sequence():
    actions = oracle_run("search", 7)
    gold = actions[-1].removeprefix("answer[").removesuffix("]")
    with ServerThread("search", protocol="agentgym") as srv:
        base = srv.url
        env_id = post(base, "create", {"id": 0})
        assert isinstance(env_id, int) and not isinstance(env_id, bool)
        prompt = post(base, "reset", {"id": 7, "env_idx": env_id})
        local = agentgym.make("search")
        question = local.reset(seed=0, options={"task": 7})[0].split("\n", 1)[0]
        assert isinstance(prompt, str) and prompt.startswith("You must reason inside <think>")
        assert prompt.endswith("\n\n " + question)  # AgentGym's "Question: <q>" line
        assert get(base, "observation", "env_idx", env_id) == prompt
        query = actions[0].removeprefix("search[").removesuffix("]")
        s = post(base, "step", {"action": f"<think>hmm</think><search> {query} </search>",
                                "env_idx": env_id})
        assert set(s) == {"observation", "reward", "done", "info"} and s["info"] is None
        expected = local.step(f"search[{query}]")[0]
        assert s["observation"] == f"<information>{expected}</information>"
        s = post(base, "step", {"action": "search[x]", "env_idx": env_id})
        assert s == {"observation": SEARCHQA_INVALID, "reward": 0.0, "done": False,
                     "info": None}
        s = post(base, "step", {"action": f"<answer>{gold}</answer>", "env_idx": env_id})
        assert s["done"] is True and s["reward"] == 1.0
        assert s["observation"] == "Congratulations! You have answered the question correctly."
        after = post(base, "step", {"action": "<answer>x</answer>", "env_idx": env_id})
        assert after["done"] is True and after["observation"] == FINISHED
        assert post(base, "close", {"env_idx": env_id}) is True
        missing = requests.post(f"{base}/create", json={}, timeout=TIMEOUT)
        assert missing.status_code == 400 and "'id'" in missing.json()["error"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("java") is None, reason="ScienceWorld needs Java")
def test_sciworld_client_sequence():
    pytest.importorskip("scienceworld")
    with ServerThread("sciworld-agentgym", protocol="agentgym") as srv:
        base = srv.url
        res = requests.post(f"{base}/create", timeout=TIMEOUT)
        assert res.status_code == 200 and set(res.json()) == {"id"}
        env_id = res.json()["id"]
        r = post(base, "reset", {"data_idx": 0, "id": env_id})
        assert set(r) == {"task_name", "var_num", "task_description", "observation", "reward",
                          "score", "deleted", "done"}
        assert (r["task_name"], r["var_num"]) == ("boil", 0)  # AgentGym's games[0]
        assert r["task_description"].startswith("Your task is to boil")
        first = r["task_description"] + "\n" + r["observation"]  # what the client shows
        assert "\n\n" not in first.split("\n", 1)[0] and "This room is called" in first
        assert get(base, "observation", "id", env_id) == r["observation"]
        s = post(base, "step", {"action": "look around", "id": env_id})
        assert set(s) == {"observation", "reward", "score", "done"}
        assert isinstance(s["score"], int) and s["done"] is False
        hint = get(base, "action_hint", "id", env_id)
        assert "look around" in hint["possible_actions"] and hint["possible_objects"]
        assert isinstance(get(base, "goals", "id", env_id)["goals"], str)
        assert get(base, "task_description", "id", env_id) == {
            "task_description": r["task_description"]}
        assert post(base, "close", {"id": env_id}) is True


@pytest.mark.parametrize("env_id,family", [("textcraft", "textcraft"), ("webshop", "webshop"),
                                           ("search", "searchqa")])
def test_remote_env_detects_and_plays_our_dialects(env_id, family):
    """RemoteEnv with no family named finds the dialect from GET / and plays it."""
    with ServerThread(env_id, protocol="agentgym") as srv:
        assert requests.get(srv.url, timeout=TIMEOUT).headers[PROTOCOL_HEADER] == family
        env = RemoteEnv(srv.url)
        obs, info = env.reset(seed=0, options={"task": 2})
        assert (env.server, env.server_dialect) == ("agentgym-rl", family)
        assert info["server_dialect"] == family
        local = agentgym.make(env_id)
        local_obs = local.reset(seed=0, options={"task": 2})[0]
        if family == "searchqa":
            assert obs.endswith(local_obs.split("\n", 1)[0])
        else:
            assert obs == local_obs
        env.close()
        # the generic protocol stays reachable under /generic
        g = requests.post(f"{srv.url}/generic/create", json={"data_idx": 2}, timeout=TIMEOUT)
        assert g.json()["observation"] == local_obs and g.json()["env_idx"] == g.json()["id"]


def test_dialect_choice():
    assert dialect_for("textcraft", "generic") is None
    assert dialect_for("maze") is None  # no AgentGym family: the generic protocol
    assert dialect_for("search") is DIALECTS["searchqa"]
    assert dialect_for("gridworld", "babyai") is DIALECTS["babyai"]
    with pytest.raises(ValueError, match="protocol must be"):
        dialect_for("textcraft", "nope")


_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=6,
)
_KEYS = ["id", "env_idx", "data_idx", "session_id", "action", "goal", "commands", "seed"]
_INTERNAL = ("TaskArg", "extract", "Overflow", "dict", "NoneType", "Traceback", "PyO3",
             "str object", "got int", "got float", "got list", "got str")


@pytest.mark.slow
@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(["create", "reset", "step", "close"]),
       body=st.dictionaries(st.sampled_from(_KEYS), _values, max_size=4),
       family=st.sampled_from(["textcraft", "search"]))
def test_malformed_requests_get_a_clean_4xx(dialect_servers, path, body, family):
    base = dialect_servers[family]
    res = requests.post(f"{base}/{path}", data=json.dumps(body), timeout=TIMEOUT)
    assert res.status_code < 500, res.text
    if res.status_code >= 400:
        error = res.json()["error"]
        assert not any(word in error for word in _INTERNAL), error
    assert requests.get(base, timeout=TIMEOUT).status_code == 200  # the server lives


@pytest.fixture(scope="module")
def dialect_servers(textcraft):
    with ServerThread("search", protocol="agentgym") as srv:
        yield {"textcraft": textcraft, "search": srv.url}


@pytest.mark.parametrize("protocol", ["agentgym", "generic"])
def test_huge_task_index_is_a_clean_400(protocol):
    with ServerThread("textcraft", protocol=protocol) as srv:
        env_id = post(srv.url, "create", {})["id"]
        for value, message in ((10**30, "task index must be >= 0 and <="),
                               ({"a": 1}, "task index must be an integer or a task string, "
                                          "got an object")):
            res = requests.post(f"{srv.url}/reset", json={"id": env_id, "data_idx": value},
                                timeout=TIMEOUT)
            assert res.status_code == 400 and message in res.json()["error"], res.text
            assert not any(w in res.json()["error"] for w in _INTERNAL)
