"""Exports of trajectories in verl's, SkyRL's and TRL's shapes (the packed numpy layout is
``agentgym.data.trajectories.pack``)."""

from __future__ import annotations

from collections.abc import Sequence

from agentgym.data.trajectories import Trajectory


def to_verl(traj: Trajectory) -> dict:
    """The fields of verl's ``AgentLoopOutput`` for one trajectory."""
    p = traj.prompt_len
    return {
        "prompt_ids": traj.token_ids[:p],
        "response_ids": traj.token_ids[p:],
        "response_mask": traj.loss_mask[p:],
        "response_logprobs": traj.logprobs[p:],
        "num_turns": traj.num_turns,
        "reward_score": traj.reward,
        "metrics": dict(traj.timings),
    }


def to_skyrl(trajs: Sequence[Trajectory]) -> dict:
    """SkyRL's ``GeneratorOutput`` for a batch of trajectories."""
    return {
        "prompt_token_ids": [t.token_ids[: t.prompt_len] for t in trajs],
        "response_ids": [t.token_ids[t.prompt_len :] for t in trajs],
        "rewards": [t.reward for t in trajs],
        "loss_masks": [t.loss_mask[t.prompt_len :] for t in trajs],
        "stop_reasons": [t.stop_reason for t in trajs],
        "rollout_logprobs": [t.logprobs[t.prompt_len :] for t in trajs],
    }


def to_trl(traj: Trajectory) -> dict:
    """A pre-tokenized row for TRL's ``SFTTrainer`` (``input_ids`` with ``assistant_masks``,
    used with ``assistant_only_loss=True``: loss on exactly the model's tokens), plus the
    episode's reward."""
    return {
        "input_ids": traj.token_ids,
        "assistant_masks": traj.loss_mask,
        "reward": traj.reward,
    }
