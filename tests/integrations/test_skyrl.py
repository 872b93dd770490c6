"""The SkyRL adapters: agentgym envs through skyrl-gym's real registry and ``BaseTextEnv``
(these run in the main virtualenv, which has skyrl-gym), and ``AgentGymGenerator`` against
SkyRL's real generator interface: the ``skyrl`` package (``skyrl.train.generators.base``:
``GeneratorInterface``, ``GeneratorInput``, ``GeneratorOutput``, ``TrajectoryID``) needs
Python >= 3.12 and pins transformers <= 5.8, so the tests marked ``skyrl`` run in its own
virtualenv, ``.venv-skyrl`` (``scripts/setup.sh --skyrl``; scripts/test.sh runs them with
``-m skyrl``). SkyRL's own generator playing these envs on a vLLM server is
``bench/peer_skyrl.py`` (tests/bench/test_peer_skyrl.py)."""

from __future__ import annotations

import asyncio

import pytest
import skyrl_gym
from pydantic import BaseModel, ConfigDict, ValidationError
from skyrl_gym.envs.base_text_env import BaseTextEnv
from skyrl_gym.envs.registration import registry
from skyrl_gym.metrics import aggregate_for_environment

import agentgym
from agentgym.integrations._episodes import TaskRefError
from agentgym.integrations.skyrl import (
    ENV_PREFIX,
    AgentGymGenerator,
    AgentGymTextEnv,
    register_envs,
)

# The main test run deselects the ``skyrl`` tests by their marker; in .venv-skyrl these
# imports succeed.
try:
    from skyrl.train.generators.base import (
        BatchMetadata,
        GeneratorInput,
        GeneratorInterface,
        GeneratorOutput,
        TrajectoryID,
    )
except ImportError as e:  # collected, then deselected, outside .venv-skyrl
    SKYRL_MISSING: ImportError | None = e
else:
    SKYRL_MISSING = None


@pytest.fixture
def skyrl_types():
    if SKYRL_MISSING is not None:
        pytest.fail(f"SkyRL's skyrl package is not importable ({SKYRL_MISSING}); run the "
                    "skyrl tests with .venv-skyrl/bin/python (scripts/setup.sh --skyrl)")


def validate(typed_dict, value):
    """``value`` validated in strict mode against SkyRL's TypedDict ``typed_dict`` (as a
    field of a pydantic model that allows its ``torch.Tensor`` fields)."""

    class Checked(BaseModel):
        model_config = ConfigDict(arbitrary_types_allowed=True, strict=True)
        value: typed_dict

    return Checked(value=value).value


def test_every_env_registered_with_skyrl_gym():
    ids = register_envs()
    # the single-agent envs (a multi-seat game is not a skyrl-gym env)
    assert ids == [ENV_PREFIX + e for e in agentgym.list_envs(kind=("native", "python"))]
    assert all(i in registry for i in ids)
    assert register_envs(["maze"]) == ["agentgym-maze"]  # again: no error
    # SkyRL's generator aggregates episode metrics through the registered class
    assert registry["agentgym-maze"].entry_point is AgentGymTextEnv
    assert aggregate_for_environment("agentgym-maze", [{"turns": 2, "reward": 0.0},
                                                       {"turns": 4, "reward": 1.0}]) \
        == {"turns": 3.0, "reward": 0.5}


@pytest.mark.parametrize("env_id", ["maze", "office"])
def test_oracle_plays_through_the_skyrl_env(env_id):
    register_envs([env_id])
    env = skyrl_gym.make(ENV_PREFIX + env_id, env_config={"max_turns": 30},
                         extras={"task": 4, "seed": 7})
    assert isinstance(env, BaseTextEnv) and isinstance(env, AgentGymTextEnv)
    chat, meta = env.init([{"role": "user", "content": "label"}])
    twin = agentgym.make(env_id, max_turns=30)
    obs0, _ = twin.reset(seed=7, options={"task": 4})
    assert chat == [{"role": "system", "content": twin.unwrapped.instructions},
                    {"role": "user", "content": obs0}]
    assert meta["task"] == 4
    total, done, turns = 0.0, False, 0
    while not done:
        action = twin.unwrapped.oracle_action()
        out = env.step(f"Thought: go.\nAction: {action}")
        obs, reward, term, trunc, _ = twin.step(action)
        # the parsed action is reported, never handed back as text to re-encode
        assert out["metadata"]["action"] == action and out["postprocessed_action"] is None
        assert out["reward"] == reward and out["done"] == (term or trunc)
        assert out["observations"] == ([] if out["done"] else [{"role": "user", "content": obs}])
        total += out["reward"]
        done, turns = out["done"], turns + 1
    assert total >= 1.0 - 1e-6  # the oracle solves it
    assert env.get_metrics() == {"turns": turns, "reward": total}


def test_env_without_id_or_with_bad_task_fails_by_name():
    with pytest.raises(TaskRefError):
        AgentGymTextEnv(None, {"task": 0})
    env = AgentGymTextEnv(None, {"task": "this is not a maze task"}, env_id="maze")
    with pytest.raises(agentgym.errors.AgentGymError):
        env.init([])


@pytest.fixture(scope="module")
def generator(turn_model_dir):
    from transformers import AutoTokenizer

    from agentgym.backends.transformers_backend import TransformersBackend

    tok = AutoTokenizer.from_pretrained(turn_model_dir)
    gen = AgentGymGenerator(TransformersBackend(turn_model_dir), tok, max_turns=3,
                            max_new_tokens=12)
    yield gen, tok
    gen.close()


@pytest.mark.skyrl
def test_generator_implements_skyrls_interface(skyrl_types):
    assert issubclass(AgentGymGenerator, GeneratorInterface)
    assert not getattr(AgentGymGenerator.generate, "__isabstractmethod__", False)


@pytest.mark.skyrl
def test_generator_output_is_skyrls_type_in_input_order(skyrl_types, generator):
    gen, tok = generator
    rows = [("agentgym-maze", 2), ("maze", 5), ("agentgym-maze", 2), ("agentgym-wordle", 0)]
    batch = validate(GeneratorInput, {
        "prompts": [[{"role": "user", "content": "label"}]] * len(rows),
        "env_classes": [c for c, _ in rows],
        "env_extras": [{"task": t} for _, t in rows],
        "sampling_params": {"temperature": 1.0, "max_generate_length": 10},
        "trajectory_ids": [TrajectoryID(f"{c}/{t}", 0) for c, t in rows],
        "batch_metadata": BatchMetadata(global_step=3, training_phase="train"),
    })
    out = asyncio.run(gen.generate(batch))
    validate(GeneratorOutput, out)
    assert set(out) == set(GeneratorOutput.__annotations__)
    with pytest.raises(ValidationError):  # the check is strict: a wrong type fails
        validate(GeneratorOutput, {**out, "rewards": [str(r) for r in out["rewards"]]})
    assert out["trajectory_ids"] == batch["trajectory_ids"]
    n = len(rows)
    assert all(len(out[k]) == n for k in ("prompt_token_ids", "response_ids", "rewards",
                                          "loss_masks", "stop_reasons", "rollout_logprobs"))
    envs = {"maze": agentgym.make("maze"), "wordle": agentgym.make("wordle")}
    for i, (cls, task) in enumerate(rows):
        env_id = cls.removeprefix(ENV_PREFIX)
        assert out["env_metrics"][i]["env_id"] == env_id and out["env_metrics"][i]["task"] == task
        obs, _ = envs[env_id].reset(seed=0, options={"task": task})
        prompt = tok.decode(out["prompt_token_ids"][i])
        assert obs.split("\n")[0] in prompt  # row i's own env and task
        resp, mask, lps = out["response_ids"][i], out["loss_masks"][i], out["rollout_logprobs"][i]
        assert len(resp) == len(mask) == len(lps) > 0
        assert mask[0] == 1 and set(mask) <= {0, 1}
        # per-turn cap from sampling_params: no model run longer than 10 tokens
        run = longest = 0
        for m in mask:
            run = run + 1 if m else 0
            longest = max(longest, run)
        assert longest <= 10
        assert out["stop_reasons"][i] in ("done", "horizon", "length")
    # same env and task in one batch: one group, the same first prompt
    assert out["prompt_token_ids"][0] == out["prompt_token_ids"][2]
    metrics = out["rollout_metrics"]
    assert metrics["batch/size"] == n
    assert metrics["reward/mean"] == pytest.approx(sum(out["rewards"]) / n)


@pytest.mark.skyrl
def test_generator_rejects_rows_without_task(skyrl_types, generator):
    gen, _ = generator
    with pytest.raises(TaskRefError):
        asyncio.run(gen.generate({"prompts": [[]], "env_classes": ["agentgym-maze"],
                                  "env_extras": [{}], "sampling_params": None,
                                  "trajectory_ids": None, "batch_metadata": None}))
