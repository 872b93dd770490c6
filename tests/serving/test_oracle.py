"""The scripted backend with a remote env: this package's env server answers the served env's
oracle action (``GET /oracle_action``) and valid actions, so ``--backend scripted`` plays a
``remote:`` env as it plays the local one; an env that answers neither is refused with one
error naming it, never played with empty actions."""

from __future__ import annotations

import json

import pytest

import agentgym
from agentgym.backends.base import BackendError, SamplingParams
from agentgym.backends.scripted import ScriptedBackend
from agentgym.serving.server import ServerThread


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("protocol", ["agentgym", "generic"])
def test_the_remote_env_answers_the_served_envs_oracle(protocol):
    """Whether the server speaks TextCraft's dialect at its root (``serve-env``'s default)
    or the generic protocol, the client reaches the oracle and the valid actions."""
    local = agentgym.make("textcraft")
    local_obs, _ = local.reset(seed=3, options={"task": 5})
    with ServerThread("textcraft", protocol=protocol) as server:
        env = agentgym.make("remote:textcraft", url=server.url)
        try:
            obs, _ = env.reset(seed=3, options={"task": 5})
            assert env.unwrapped.server_dialect == ("textcraft" if protocol == "agentgym"
                                                     else "generic")
            for _ in range(40):
                action = env.unwrapped.oracle_action()
                assert action == local.unwrapped.oracle_action() and action
                assert action in env.unwrapped.valid_actions() or not \
                    local.unwrapped.valid_actions()
                *_, terminated, truncated, _ = env.step(action)
                local.step(action)
                if terminated or truncated:
                    break
            assert terminated
        finally:
            env.close()


def test_the_oracle_route_answers_null_for_an_env_without_one():
    class NoOracle(agentgym.envs.BaseEnv):
        def reset(self, task=None, seed=None):
            return "start"

        def step(self, action):
            return "ok", 0.0, False, {}

    agentgym.register("test/no-oracle", NoOracle, override=True)
    with ServerThread("test/no-oracle") as server:
        env = agentgym.make("remote:test/no-oracle", url=server.url)
        try:
            env.reset(seed=0)
            assert env.unwrapped.oracle_action() is None
            assert env.unwrapped.valid_actions() == []
        finally:
            env.close()


def test_collect_with_the_scripted_backend_plays_a_remote_env(tiny_model_dir, tmp_path,
                                                              capsys):
    """The command line of the issue: ``collect --env remote:textcraft --env-kwarg url=...
    --backend scripted`` solves the tasks (it played empty actions and scored 0 before)."""
    from agentgym.cli import main

    with ServerThread("textcraft", protocol="agentgym") as server:
        assert main(["collect", "--env", "remote:textcraft", "--env-kwarg",
                     f"url={server.url}", "--backend", "scripted", "--model", tiny_model_dir,
                     "--tasks", "0:4", "--max-turns", "40", "--out", str(tmp_path / "run"),
                     "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["run"]["rows"] == 4 and summary["run"]["success_rate"] == 1.0


async def test_the_scripted_backend_refuses_an_env_without_oracle_or_actions(tokenizer):
    class Driver:
        env_id = "remote:elsewhere"

        async def oracle_action(self, slot):
            return None

        async def valid_actions(self, slot):
            return []

    backend = ScriptedBackend(tokenizer, "oracle")
    with pytest.raises(BackendError, match="'remote:elsewhere' gives no oracle action"):
        await backend.generate([1, 2], SamplingParams(max_new_tokens=8),
                               context=(Driver(), 0, 0, 0))
    # the random policy plays what the env offers: nothing here, an empty action as before
    out = await ScriptedBackend(tokenizer, "random").generate(
        [1, 2], SamplingParams(max_new_tokens=8), context=(Driver(), 0, 0, 0))
    assert tokenizer.decode(out.token_ids).startswith("Action:")


def test_a_game_is_not_served():
    with pytest.raises(agentgym.UnknownEnvError, match="multi-seat game"):
        ServerThread("tictactoe")
