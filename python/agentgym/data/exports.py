"""Exports of trajectories: packed numpy arrays for learners, and verl/SkyRL shapes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentgym.data.schemas import STOP_REASONS, Trajectory

_CODE = {name: i for i, name in enumerate(STOP_REASONS)}


def pack(trajs: Sequence[Trajectory]) -> dict[str, np.ndarray]:
    """Concatenate trajectories into the packed layout the Rust store drains and the learner
    consumes: ``token_ids``/``loss_mask``/``logprobs`` flat with ``offsets`` (B+1),
    ``turn_rewards`` with ``turn_offsets``, and per-trajectory ``rewards``, ``num_turns``,
    ``stop_reason`` codes, ``group_id``, ``sample_index``, ``policy_version``, ``prompt_len``."""
    lens = np.array([len(t.token_ids) for t in trajs], np.int64)
    offsets = np.zeros(len(trajs) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    tlens = np.array([len(t.turn_rewards) for t in trajs], np.int64)
    turn_offsets = np.zeros(len(trajs) + 1, np.int64)
    np.cumsum(tlens, out=turn_offsets[1:])

    def cat(field, dtype):
        parts = [np.asarray(getattr(t, field), dtype) for t in trajs]
        return np.concatenate(parts) if parts else np.zeros(0, dtype)

    return {
        "token_ids": cat("token_ids", np.uint32),
        "offsets": offsets,
        "loss_mask": cat("loss_mask", np.uint8),
        "logprobs": cat("logprobs", np.float32),
        "rewards": np.array([t.reward for t in trajs], np.float32),
        "turn_rewards": cat("turn_rewards", np.float32),
        "turn_offsets": turn_offsets,
        "num_turns": np.array([t.num_turns for t in trajs], np.uint32),
        "stop_reason": np.array([_CODE[t.stop_reason] for t in trajs], np.uint8),
        "group_id": np.array([t.group_id for t in trajs], np.uint64),
        "sample_index": np.array([t.sample_index for t in trajs], np.uint32),
        "policy_version": np.array([t.policy_version for t in trajs], np.uint32),
        "prompt_len": np.array([t.prompt_len for t in trajs], np.uint32),
    }


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
