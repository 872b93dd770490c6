"""The announcement's API end to end: ``LLMAgent(...).train(env)`` then ``.infer(env)``."""

from __future__ import annotations

import zlib

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import agentgym  # noqa: E402
from agentgym.agents import InferenceResult, LLMAgent, resolve_env  # noqa: E402
from agentgym.envs import BaseEnv, TextCraftEnv  # noqa: E402
from tests.helpers import PickEnv  # noqa: E402

pytestmark = pytest.mark.timeout(300)


class OneStep(PickEnv):
    """The one-turn bandit as a user env that no test registers (``resolve_env`` gives it a
    fresh id)."""


def test_resolve_env_accepts_ids_instances_and_base_envs():
    assert resolve_env("maze") == ("maze", {})
    assert resolve_env(TextCraftEnv())[0] == "textcraft"
    assert resolve_env(agentgym.make("maze"))[0] == "maze"
    env_id, _ = resolve_env(OneStep())
    assert env_id in agentgym.list_envs()
    with pytest.raises(TypeError, match="cannot tell"):
        resolve_env(object())
    # a registered env class maps to its id and the constructor arguments given
    from agentgym.envs import ECommerceServiceEnv

    assert resolve_env(ECommerceServiceEnv()) == ("ecommerce_service", {})
    assert resolve_env(ECommerceServiceEnv(split="test")) == ("ecommerce_service",
                                                              {"split": "test"})


class AIOpsEnv(BaseEnv):
    """The announcement's example of a user env: an on-call alert to resolve."""

    instructions = "You are on call. Reply with Action: <command>."
    num_tasks = 50

    def reset(self, task=None, seed=None):
        self.host = f"db-{int(task or 0) % 7}"
        return f"alert: disk 93% full on {self.host}"

    def step(self, action):
        fixed = "clean" in action.lower() and self.host in action
        return ("disk at 41%" if fixed else "disk still 93%"), float(fixed), fixed, {}


agentgym.register("_agents_aiops", AIOpsEnv, override=True)

#: The announcement's scenario envs and a user env, for the end-to-end agent tests.
SCENARIOS = ["ecommerce_service", "office", "project_planning", "code_debug", "_agents_aiops"]


@pytest.fixture(scope="session")
def warm_model_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny model after a short format warm-up on random-policy transcripts of the
    scenario envs: it ends its turns (``Action: ...<|im_end|>``) in their long contexts, so
    its episodes reach the env instead of ending ``length``."""
    from agentgym.learner.warmup import WarmupConfig, warmup_model

    out = tmp_path_factory.mktemp("warm_model")
    warmup_model(tiny_model_dir, out, SCENARIOS, config=WarmupConfig(
        episodes=24, steps=60, batch_size=8, max_turns=6, lr=3e-3))
    return str(out)


def _weights(model_dir: str):
    from safetensors.torch import load_file

    return load_file(f"{model_dir}/model.safetensors")


def _train_rows(summary):
    from agentgym.learner.tracking import read_jsonl

    return [r for r in read_jsonl(summary["metrics"]) if r.get("type") == "train"]


def _scenario(name):
    from agentgym import envs

    return {"AIOpsEnv": AIOpsEnv}.get(name) or getattr(envs, name)


@pytest.mark.slow
@pytest.mark.parametrize("env_name", ["ECommerceServiceEnv", "OfficeEnv", "ProjectPlanningEnv",
                                      "CodeDebugEnv", "AIOpsEnv"])
def test_train_and_infer_reach_the_env(tmp_path, warm_model_dir, env_name):
    """The announcement's scenarios and a user env: training and inference play real
    episodes (stop reasons ``done``/``horizon``, not ``env_error``) and train the weights."""
    env = _scenario(env_name)()
    kwargs = {**_tiny_kwargs(tmp_path), "warmup": None, "max_new_tokens": 24,
              "max_total_tokens": 4096, "eval_every": 1, "save_every": 1}
    agent = LLMAgent(base_model=warm_model_dir, backend="transformers", **kwargs)
    summary = agent.train(env, method="ScalingInter-RL", max_steps=1, horizon=[2],
                          steps_per_stage=1)
    (row,) = _train_rows(summary)
    reached = row.get("stop_reason/done", 0.0) + row.get("stop_reason/horizon", 0.0)
    assert reached > 0.0, row
    assert row.get("stop_reason/env_error", 0.0) == 0.0, row
    before, after = _weights(warm_model_dir), _weights(agent.model_dir)
    assert any(not (before[k] == after[k]).all() for k in before)
    res = agent.infer(env, tasks=2, max_turns=2)
    assert len(res.trajectories) == 2
    assert all(t.stop_reason in ("done", "horizon", "length") for t in res.trajectories)
    assert any(t.num_turns >= 1 and t.stop_reason != "length" for t in res.trajectories)


def _tiny_kwargs(tmp_path):
    return dict(output_dir=str(tmp_path / "run"), progress=False, tensorboard=False,
                torch_threads=1,
                tasks_per_step=2, n_samples=2, max_new_tokens=12, eval_every=2, eval_tasks=2,
                save_every=2, warmup={"episodes": 16, "steps": 3, "batch_size": 4},
                learner={"lr": 1e-4, "use_kl_loss": False})


@pytest.mark.slow
def test_agent_api_textcraft_transformers(tmp_path):
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


def test_agent_api_user_base_env(tmp_path, tiny_model_dir):
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
    # a shipped config by name; a typo in the file is refused at once, by its path
    main = LLMAgent.from_config("main_job", seed=2)
    assert main.base_model == "tiny" and main.config["rollout"]["max_new_tokens"] == 12
    run = main._config("maze", {}, {"max_new_tokens": 5, "rollout": {"undo": True}})
    assert (run.rollout.max_new_tokens, run.rollout.undo, run.rollout.truncated_turn,
            run.seed) == (5, True, "end", 2)
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: {max_new_tokenz: 3}\n")
    from agentgym.errors import ConfigError

    with pytest.raises(ConfigError, match=r"rollout\.max_new_tokenz \(did you mean "
                                          r"rollout\.max_new_tokens\?\)"):
        LLMAgent.from_config(bad)


class ResetStepOnly(BaseEnv):
    """A user env with only ``reset`` and ``step``: no ``valid_actions()`` for the format
    warm-up to draw random actions from."""

    num_tasks = 10

    def reset(self, task=None, seed=None):
        return "Guess."

    def step(self, action):
        return "no", 0.0, True, {}


def test_an_env_without_valid_actions_is_refused_by_the_warm_up(tmp_path):
    """The tiny model's warm-up would teach an empty action: one line says so and what to
    do, instead of training to nothing."""
    from agentgym.learner.warmup import WarmupError

    agent = LLMAgent("tiny", **{**_tiny_kwargs(tmp_path),
                                "warmup": {"episodes": 4, "steps": 2, "batch_size": 2}})
    with pytest.raises(WarmupError) as e:
        agent.train(ResetStepOnly(), method="GRPO", max_steps=3)
    msg = str(e.value)
    assert "\n" not in msg and "valid_actions()" in msg and "--no-warmup" in msg


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:.*torch.distributed.reduce_op.*:FutureWarning")
def test_agent_api_vllm(tmp_path):
    pytest.importorskip("vllm")
    agent = LLMAgent(base_model="tiny", backend="vllm", **_tiny_kwargs(tmp_path),
                     backend_kwargs={"enforce_eager": True})
    summary = agent.train("maze", method="GRPO", max_steps=1, max_turns=2,
                          env_kwargs={"size": 3})
    assert summary["steps"] == 1
    res = agent.infer("maze", tasks=2, max_turns=2)
    assert len(res.trajectories) == 2


def _forward_logprobs(model_dir: str, traj) -> list[float]:
    """Logprobs of ``traj``'s model tokens under the weights in ``model_dir`` (a forward pass)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([traj.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    return [float(logp[i - 1]) for i, m in enumerate(traj.loss_mask) if m]


class ParityEnv(BaseEnv):
    """One turn; reward 1 when the action's CRC-32 is even, so samples of one task whose
    actions differ in any way differ in reward half the time and GRPO has advantages to
    learn from (a reward on the length alone gave a warmed model's short replies all one
    parity)."""

    instructions = "Reply with Action: <anything>."
    num_tasks = 50

    def reset(self, task=None, seed=None):
        return "Say something."

    def step(self, action):
        return "ok", float(zlib.crc32(action.encode()) % 2 == 0), True, {}


@pytest.mark.slow
def test_infer_uses_trained_weights_and_train_continues(tmp_path, warm_model_dir):
    kwargs = {**_tiny_kwargs(tmp_path), "warmup": None, "max_new_tokens": 16, "n_samples": 4,
              "learner": {"lr": 3e-3, "use_kl_loss": False}}
    agent = LLMAgent(base_model=warm_model_dir, backend="transformers", **kwargs)
    first = agent.train(ParityEnv(), method="GRPO", max_steps=2, max_turns=1)
    trained = agent.model_dir
    assert trained.startswith(first["output_dir"])
    res = agent.infer(ParityEnv(), tasks=[0, 1, 2], max_turns=1, temperature=1.0)
    traj = next(t for t in res.trajectories if sum(t.loss_mask))
    behaviour = [lp for lp, m in zip(traj.logprobs, traj.loss_mask) if m]
    # the episode was generated by the trained weights, not the base model's
    assert behaviour == pytest.approx(_forward_logprobs(trained, traj), abs=2e-3)
    base = _forward_logprobs(warm_model_dir, traj)
    assert max(abs(a - b) for a, b in zip(behaviour, base)) > 1e-2
    # success_rate is the share of episodes that succeeded
    assert res.success_rate == pytest.approx(
        sum(t.success for t in res.trajectories) / len(res.trajectories))
    # a second train() starts from the weights the first one ended with
    second = agent.train(ParityEnv(), method="GRPO", max_steps=1, max_turns=1,
                         output_dir=str(tmp_path / "run2"))
    assert agent.trainer.model_dir == trained
    assert second["output_dir"] != first["output_dir"]
    assert _weights(agent.model_dir).keys() == _weights(trained).keys()
    assert any(not (_weights(agent.model_dir)[k] == _weights(trained)[k]).all()
               for k in _weights(trained))


def test_success_rate_counts_only_solved_episodes(tmp_path, warm_model_dir):
    class Half(BaseEnv):
        """Even tasks are solved by any action, odd ones never."""

        num_tasks = 10

        def reset(self, task=None, seed=None):
            self.task = int(task)
            return "Say anything."

        def step(self, action):
            return "ok", float(self.task % 2 == 0), True, {}

    agent = LLMAgent(base_model=warm_model_dir, backend="transformers",
                     **{**_tiny_kwargs(tmp_path), "warmup": None, "max_new_tokens": 24})
    res = agent.infer(Half(), tasks=[0, 1, 2, 3], max_turns=1)
    reached = [t for t in res.trajectories if t.stop_reason == "done"]
    assert reached  # the warmed model ends its turns
    assert res.success_rate == pytest.approx(
        sum(t.success for t in res.trajectories) / len(res.trajectories))
    assert {t.task_id for t in reached if t.success} == {t.task_id for t in reached} & {0, 2}


def test_infer_plays_with_the_configs_rollout_settings(tmp_path, tiny_model_dir):
    """``infer`` opens each assistant turn with the config's reply prefix, as training did."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prefix = "Action: move"
    agent = LLMAgent(base_model=tiny_model_dir, backend="transformers", max_new_tokens=3,
                     rollout={"reply_prefix": prefix}, output_dir=str(tmp_path / "run"))
    res = agent.infer("maze", tasks=2, max_turns=2)
    assert len(res.trajectories) == 2
    for t in res.trajectories:
        first = t.loss_mask.index(1)
        assert tok.decode(t.token_ids[:first]).endswith("assistant\n" + prefix)


def test_mechanisms_by_name_set_the_rollout_settings(tmp_path, tiny_model_dir):
    """``mechanisms`` names (or names with counts) become the rollout settings that turn
    them on; an unknown name is refused; ``infer`` plays with them (a reflection retry
    after an unsolved attempt shows in the trajectory's attempts)."""
    from agentgym.agents import mechanism_settings

    assert mechanism_settings(["undo"]) == {"undo": True, "max_undos": 3}
    assert mechanism_settings({"undo": 1, "reflection": 2}) == {
        "undo": True, "max_undos": 1, "reflection": 2}
    assert mechanism_settings("reflection") == {"reflection": 1}
    assert mechanism_settings(None) == {}
    # named as the RolloutConfig field and the flag (--branch-at, --plan, --context-window)
    assert mechanism_settings({"branch_at": 3}) == {"branch_at": 3}
    assert mechanism_settings(["plan"]) == {"plan": True, "replan_every": 0}
    assert mechanism_settings({"context_window": 2}) == {"context_window": 2}
    # the older names still work
    assert mechanism_settings({"branching": 3}) == {"branch_at": 3}
    assert mechanism_settings(["planning"]) == {"plan": True, "replan_every": 0}
    assert mechanism_settings({"memory": 2}) == {"context_window": 2}
    with pytest.raises(ValueError, match="unknown mechanism 'planing'"):
        mechanism_settings(["planing"])
    agent = LLMAgent(base_model=tiny_model_dir, backend="transformers", max_new_tokens=3,
                     output_dir=str(tmp_path / "run"))
    res = agent.infer("maze", tasks=2, max_turns=1, mechanisms={"reflection": 1})
    assert len(res.trajectories) == 2
    for t in res.trajectories:
        # an untrained policy rarely solves a maze in one turn: it gets its second attempt
        assert t.success or t.timings.get("attempts") == 2.0
    planned = agent.infer("maze", tasks=2, max_turns=2, mechanisms=["planning"])
    assert [t.timings.get("plan_turns") for t in planned.trajectories] == [1.0, 1.0]
    bounded = agent.infer("maze", tasks=2, max_turns=3, mechanisms={"memory": 1})
    assert [len(t.step_reply) for t in bounded.trajectories] == \
        [t.num_turns for t in bounded.trajectories]
