"""The seed's API end to end: ``LLMAgent(...).train(env)`` then ``.infer(env)``."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import agentgym  # noqa: E402
from agentgym.agents import InferenceResult, LLMAgent, resolve_env  # noqa: E402
from agentgym.envs import BaseEnv, TextCraftEnv  # noqa: E402

pytestmark = pytest.mark.timeout(300)


class OneStep(BaseEnv):
    instructions = "Reply with Action: move east."
    num_tasks = 100

    def reset(self, task=None, seed=None):
        return "East: open."

    def step(self, action):
        ok = action.strip().endswith("east")
        return "Done.", float(ok), True, {}


def test_resolve_env_accepts_ids_instances_and_base_envs():
    assert resolve_env("maze") == ("maze", {})
    assert resolve_env(TextCraftEnv())[0] == "textcraft"
    assert resolve_env(agentgym.make("maze"))[0] == "maze"
    env_id, _ = resolve_env(OneStep())
    assert env_id in agentgym.list_envs()
    with pytest.raises(TypeError, match="cannot tell"):
        resolve_env(object())


def _tiny_kwargs(tmp_path):
    return dict(output_dir=str(tmp_path / "run"), progress=False, tensorboard=False,
                torch_threads=1,
                tasks_per_step=2, n_samples=2, max_new_tokens=12, eval_every=2, eval_tasks=2,
                save_every=2, warmup={"episodes": 16, "steps": 3, "batch_size": 4},
                learner={"lr": 1e-4, "use_kl_loss": False})


@pytest.mark.slow
def test_seed_api_textcraft_transformers(tmp_path):
    env = TextCraftEnv()
    agent = LLMAgent(base_model="tiny", backend="transformers", **_tiny_kwargs(tmp_path))
    summary = agent.train(env, method="ScalingInter-RL", max_steps=2, horizon=[2, 3],
                          steps_per_stage=1)
    assert summary["steps"] == 2
    assert summary["eval_success_end"] is not None
    assert agent.model_dir and agent.model_dir.endswith("model")
    res = agent.infer(env, tasks=3, max_turns=2)
    assert isinstance(res, InferenceResult)
    assert len(res.trajectories) == 3
    assert 0.0 <= res.success_rate <= 1.0
    assert all(t.num_turns <= 2 for t in res.trajectories)


def test_seed_api_user_base_env(tmp_path, tiny_model_dir):
    agent = LLMAgent(base_model=tiny_model_dir, backend="transformers",
                     **{**_tiny_kwargs(tmp_path), "warmup": None})
    summary = agent.train(OneStep(), method="GRPO", max_steps=1, max_turns=1)
    assert summary["steps"] == 1
    res = agent.infer(OneStep(), tasks=[0, 1], max_turns=1)
    assert len(res.trajectories) == 2


def test_from_config_file(tmp_path, tiny_model_dir):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[train]\nmodel = "{tiny_model_dir}"\nmethod = "RLOO"\nseed = 3\n')
    agent = LLMAgent.from_config(cfg)
    assert agent.base_model == tiny_model_dir
    assert agent.config["method"] == "RLOO" and agent.config["seed"] == 3


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:.*torch.distributed.reduce_op.*:FutureWarning")
def test_seed_api_vllm(tmp_path):
    pytest.importorskip("vllm")
    agent = LLMAgent(base_model="tiny", backend="vllm", **_tiny_kwargs(tmp_path),
                     backend_kwargs={"enforce_eager": True})
    summary = agent.train("maze", method="GRPO", max_steps=1, max_turns=2,
                          env_kwargs={"size": 3})
    assert summary["steps"] == 1
    res = agent.infer("maze", tasks=2, max_turns=2)
    assert len(res.trajectories) == 2
