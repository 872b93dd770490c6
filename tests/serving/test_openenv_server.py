"""``agentgym-rl serve-env --protocol openenv``: this project's envs served by OpenEnv's own
server (:mod:`agentgym.serving.openenv`) and driven by OpenEnv's own client
(``GenericEnvClient``, its sync wrapper) over real sockets on 127.0.0.1.

Covered: a ``maze`` episode played by the native oracle and a ``wordle`` episode of random
legal guesses give the same turn texts, valid actions, rewards, done and success flags as
the same env stepped in-process with the same seed, task and actions; the horizon cut is
``truncated``; sessions are independent and capped by ``--max-envs``; bad input (an action
of another shape, a step before reset or after the end, an unknown reset argument) is a
4xx or OpenEnv's structured error naming no Python type, never a traceback; the bearer
token and the loopback rule of the AgentGym-protocol server hold.

TRL: its only OpenEnv entry point (TRL 1.16) is
``trl.experimental.async_grpo.openenv_harness.HarnessRolloutWorker``, an ``AsyncGRPOTrainer``
rollout worker that samples every turn from a vLLM server (``vllm_server_url``; its base
class refuses to start without vLLM) and so needs a GPU inference server. What runs here is
the OpenEnv side of that path, exactly as the worker calls it: a ``ResourceSessionFactory``
whose sessions are OpenEnv's ``StepEnvSessionAdapter`` over ``GenericEnvClient``, played by
OpenEnv's ``MCPHarnessAdapter.run_white_box`` (the worker's ``harness_adapter`` path) with a
scripted model step in place of vLLM, then ``session.verify``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient

import agentgym
from agentgym.serving.openenv import AgentGymEnvironment, OpenEnvServer
from agentgym.serving.server import InsecureServerError

pytestmark = pytest.mark.timeout(120)

#: What no error a client sees may contain: a traceback, a Python exception's name
#: (``ValueError``, ``RequestError``; OpenEnv's codes are spelled ``EXECUTION_ERROR``).
PYTHON_TYPES = re.compile(r"Traceback|\b[A-Z][a-z]\w*(Error|Exception)\b")


@pytest.fixture(scope="module")
def maze_url(tmp_path_factory):
    """``agentgym-rl serve-env --protocol openenv maze`` in a subprocess, on a free port."""
    log = tmp_path_factory.mktemp("openenv") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentgym.cli", "serve-env", "--protocol", "openenv",
             "maze", "--port", "0", "--max-envs", "4"], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            found = re.search(r"listening on (http://\S+)", log.read_text())
            if found:
                break
            assert proc.poll() is None, f"server exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"server did not start: {log.read_text()}"
            time.sleep(0.1)
        yield found.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def client(url: str):
    """OpenEnv's own client, its sync wrapper."""
    return GenericEnvClient(base_url=url).sync()


def play_both(url: str, env_id: str, seed: int, task: int, choose, max_turns=None):
    """Play one episode on the server and on the same env in-process, with the actions
    ``choose(local_env, turn)`` picks; assert every turn matches; return the last result
    and the local episode's return."""
    local = agentgym.make(env_id)
    options = {"task": task} if max_turns is None else {"task": task, "max_turns": max_turns}
    text, _ = local.reset(seed=seed, options=options)
    extra = {} if max_turns is None else {"max_turns": max_turns}
    with client(url) as env:
        result = env.reset(seed=seed, task=task, **extra)
        assert result.observation["text"] == text and not result.done
        assert result.reward is None
        assert result.observation["valid_actions"] == local.unwrapped.valid_actions()
        total, turn = 0.0, 0
        while not result.done:
            action = choose(local, turn)
            text, reward, terminated, truncated, _ = local.step(action)
            result = env.step({"message": action})
            total += reward
            turn += 1
            obs = result.observation
            assert (obs["text"], result.reward, result.done) == \
                (text, reward, terminated or truncated)
            assert obs["truncated"] == (truncated and not terminated)
            assert obs["success"] == (terminated and total >= 1.0)
            if not result.done:
                assert obs["valid_actions"] == local.unwrapped.valid_actions()
            assert turn < 200
        state = env.state()
        assert state["step_count"] == turn and state["done"] and state["task"] == task
        assert state["episode_return"] == pytest.approx(total)
    return result, total


def test_an_oracle_maze_episode_matches_the_native_env(maze_url):
    result, total = play_both(maze_url, "maze", seed=7, task=3,
                              choose=lambda local, _: local.unwrapped.oracle_action())
    assert result.done and result.observation["success"] and total == 1.0


def test_a_horizon_cut_is_truncated_and_not_solved(maze_url):
    result, _ = play_both(maze_url, "maze", seed=1, task=5, max_turns=2,
                          choose=lambda local, _: local.unwrapped.valid_actions()[0])
    assert result.observation["truncated"] and not result.observation["success"]


def test_a_random_legal_wordle_episode_matches_the_native_env():
    import random

    rng = random.Random(0)
    with OpenEnvServer("wordle").start() as server:
        result, _ = play_both(server.url, "wordle", seed=11, task=2,
                              choose=lambda local, _: rng.choice(local.unwrapped.valid_actions()))
    assert result.done


def test_max_turns_and_split_reach_the_env():
    local = agentgym.make("maze", split="test", max_turns=1)
    text, _ = local.reset(seed=2, options={"task": 4})
    with OpenEnvServer("maze", max_turns=1).start() as server, client(server.url) as env:
        assert env.reset(seed=2, task=4, split="test").observation["text"] == text
        result = env.step({"message": local.unwrapped.valid_actions()[0]})
        assert result.done and result.observation["truncated"]


def test_sessions_are_independent_and_capped_by_max_envs():
    assert AgentGymEnvironment.SUPPORTS_CONCURRENT_SESSIONS
    with OpenEnvServer("maze", max_envs=2).start() as server:
        a, b = client(server.url), client(server.url)
        with a, b:
            first = a.reset(seed=0, task=1).observation["text"]
            b.reset(seed=0, task=2)
            b.step({"message": "move north"})
            assert a.state()["step_count"] == 0 and b.state()["step_count"] == 1
            assert a.reset(seed=0, task=1).observation["text"] == first
            # a third session is refused on connect (OpenEnv's client then sees the socket
            # closed; the refusal is the first message)
            from websockets.sync.client import connect

            with connect(server.url.replace("http://", "ws://") + "/ws") as ws:
                refusal = json.loads(ws.recv(timeout=30))
            assert refusal["type"] == "error"
            assert refusal["data"]["code"] == "CAPACITY_REACHED"
            assert refusal["data"]["max_sessions"] == 2


def refused(call, *args, **kwargs) -> str:
    """The error OpenEnv's client raises for a refused call (its ``RuntimeError``), checked
    to name no Python type."""
    with pytest.raises(RuntimeError) as err:
        call(*args, **kwargs)
    message = str(err.value)
    assert not PYTHON_TYPES.search(message), message
    return message


def test_bad_input_over_the_websocket_is_a_structured_error(maze_url):
    with client(maze_url) as env:
        message = refused(env.step, {"message": "move north"})
        assert "step before reset" in message and "EXECUTION_ERROR" in message
        env.reset(seed=0, task=0)
        assert "VALIDATION_ERROR" in refused(env.step, {"move": "north"})
        assert "VALIDATION_ERROR" in refused(env.step, {"message": 3})
        assert "unknown argument(s) difficulty" in refused(env.reset, difficulty=3)
        assert "seed must be an integer" in refused(env.reset, seed="seven")
        assert "split must be one of" in refused(env.reset, split="dev")
        assert "task must be >= 0" in refused(env.reset, task=-1)
        assert "rejected by the env: invalid task" in refused(env.reset, task="abc")
        # the session survives every refusal
        assert env.reset(seed=0, task=0).observation["text"]


def test_bad_input_over_http_is_a_4xx_without_a_traceback(maze_url):
    with httpx.Client(base_url=maze_url, timeout=30) as http:
        cases = [
            ("/step", {"action": {"message": "move north"}}, 409, "step before reset"),
            ("/step", {"action": {"bogus": 1}}, 422, "message"),
            ("/step", {"action": "move north"}, 422, "action"),
            ("/reset", {"difficulty": 3}, 400, "unknown argument(s) difficulty"),
            ("/reset", {"seed": -1}, 422, "seed"),
            ("/reset", {"task": [1]}, 400, "task must be an index or a task string"),
        ]
        for path, body, status, needle in cases:
            answer = http.post(path, json=body)
            assert answer.status_code == status, (path, body, answer.text)
            assert needle in answer.text and not PYTHON_TYPES.search(answer.text)
        ok = http.post("/reset", json={"seed": 3, "task": 2})
        assert ok.status_code == 200 and ok.json()["observation"]["text"].startswith("You are")
        meta = http.get("/metadata").json()
        assert meta["name"] == "maze" and meta["description"] == \
            agentgym.make("maze").instructions
        schema = http.get("/schema").json()["action"]
        assert schema["required"] == ["message"]


def test_a_finished_episode_refuses_another_step(maze_url):
    with client(maze_url) as env:
        env.reset(seed=0, task=4, max_turns=1)
        assert env.step({"message": "move north"}).done
        assert "the episode has ended" in refused(env.step, {"message": "move north"})


def test_the_bearer_token_and_the_loopback_rule():
    with pytest.raises(InsecureServerError, match="--auth-token"):
        OpenEnvServer("maze", host="0.0.0.0")
    with OpenEnvServer("maze", auth_token="s3cret").start() as server:
        assert httpx.get(f"{server.url}/health").status_code == 401
        assert httpx.get(f"{server.url}/health",
                         headers={"Authorization": "Bearer s3cret"}).status_code == 200
        with pytest.raises(ConnectionError):  # OpenEnv's client sends no token
            client(server.url).connect()


def test_the_cli_refuses_an_open_host_and_an_unknown_env_in_one_line(capsys):
    from agentgym.cli import main

    assert main(["serve-env", "--protocol", "openenv", "maze", "--host", "0.0.0.0",
                 "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "refusing to serve on '0.0.0.0'" in err and "\n" not in err
    assert main(["serve-env", "--protocol", "openenv", "nosuch", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'nosuch'" in err and "\n" not in err


def test_openenvs_harness_plays_the_served_env_as_trls_worker_drives_it(maze_url):
    from openenv.core.env_server.mcp_types import Tool
    from openenv.core.harness import (
        HarnessRunLimits,
        MCPHarnessAdapter,
        ModelStepResult,
        ResourceSessionFactory,
        StepEnvSessionAdapter,
    )
    from openenv.core.llm_client import LLMResponse, ToolCall

    move = Tool(name="act", description="take one action in the maze",
                input_schema={"type": "object", "properties": {"message": {"type": "string"}},
                              "required": ["message"]})

    class Factory(ResourceSessionFactory):
        def create(self, task, seed=None, episode_id=None):
            return StepEnvSessionAdapter(
                GenericEnvClient(base_url=maze_url), task=task, seed=seed,
                episode_id=episode_id, tool_specs=[move], reset_kwargs={"task": task},
                action_builder=lambda name, args: {"message": args["message"]},
                initial_messages_builder=lambda result, task: [
                    {"role": "user", "content": result.observation["text"]}])

    local = agentgym.make("maze")
    local.reset(seed=5, options={"task": 6})

    def model_step(messages, tools, sampling):
        """The oracle in place of vLLM: one tool call a turn, the native env kept in step."""
        action = local.unwrapped.oracle_action()
        local.step(action)
        return ModelStepResult(LLMResponse(content="", tool_calls=[
            ToolCall(id=f"call_{len(messages)}", name="act", args={"message": action})]))

    session = Factory().create(6, seed=5, episode_id="rollout-0")
    try:
        rollout = MCPHarnessAdapter().run_white_box(model_step, session,
                                                    HarnessRunLimits(max_turns=50))
        verify = session.verify(rollout.messages)
    finally:
        session.close()
    assert rollout.done and verify.done and verify.env_reward == 1.0
    assert verify.metrics["step_count"] == len(rollout.tool_trace)
