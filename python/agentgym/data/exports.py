"""Exports of trajectories in verl's, SkyRL's and TRL's shapes (the packed numpy layout is
``agentgym.data.trajectories.pack``).

An image episode's verl row also has ``images``: one ``{"bytes": PNG, "path": None}`` per
image placeholder span of its tokens, in order (a frame shown twice is listed twice), the
form of Hugging Face ``datasets``' ``Image`` feature and of an image that verl's
``RLHFDataset`` and ``verl.utils.dataset.vision_utils.process_image`` read (``Image.open``
of ``bytes``)."""

from __future__ import annotations

from collections.abc import Sequence

from agentgym.data.frames import png
from agentgym.data.trajectories import Trajectory


def verl_images(traj: Trajectory) -> list[dict]:
    """The trajectory's pictures as verl reads them: per image placeholder span, in order,
    ``{"bytes": PNG, "path": None}`` (each distinct frame encoded once)."""
    encoded = [png(f) for f in traj.images]
    return [{"bytes": encoded[r], "path": None} for r in traj.image_refs]


def to_verl(traj: Trajectory) -> dict:
    """The fields of verl's ``AgentLoopOutput`` for one trajectory, plus its ``group_id``
    (the GRPO group) and ``sample_index`` (extra fields verl ignores: where the row came
    from); an image episode's also ``images`` (:func:`verl_images`:
    ``AgentLoopOutput.multi_modal_data["images"]`` is ``[process_image(x) for x in
    images]``)."""
    p = traj.prompt_len
    out = {
        "prompt_ids": traj.token_ids[:p],
        "response_ids": traj.token_ids[p:],
        "response_mask": traj.loss_mask[p:],
        "response_logprobs": traj.logprobs[p:],
        "num_turns": traj.num_turns,
        "reward_score": traj.reward,
        "metrics": dict(traj.timings),
        "group_id": traj.group_id,
        "sample_index": traj.sample_index,
    }
    if traj.image_refs:
        out["images"] = verl_images(traj)
    return out


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
