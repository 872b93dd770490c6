"""``Trajectory``: one finished multi-turn episode, token-exact (msgspec Struct).

Field for field it maps onto verl's ``AgentLoopOutput`` (prompt_ids = token_ids[:prompt_len],
response_ids = token_ids[prompt_len:], response_mask = loss_mask[prompt_len:],
response_logprobs, num_turns, reward_score) and SkyRL's ``GeneratorOutput`` (prompt_token_ids,
response_ids, rewards, loss_masks, stop_reasons, rollout_logprobs); see
``agentgym.data.exports``.
"""

from __future__ import annotations

import msgspec

#: Stop reasons in code order (the Rust core's ``StopReason`` discriminants).
STOP_REASONS = ("done", "horizon", "length", "env_error", "backend_error", "timeout", "aborted")

#: Stop reasons of failed episodes: their loss mask is zeroed.
FAILED_STOP_REASONS = frozenset({"env_error", "backend_error", "timeout", "aborted"})


class Trajectory(msgspec.Struct, kw_only=True, gc=False):
    """A finished episode.

    ``token_ids`` is the whole conversation as the model saw it (the chat template applied
    once, then one segment per turn); ``loss_mask[i] == 1`` exactly where the model generated
    token ``i`` (its end-of-turn token included); ``logprobs[i]`` is the behaviour policy's
    log-probability of that token (0.0 elsewhere). ``turn_rewards[t]`` is the env's reward
    after turn ``t``; ``reward`` their sum. A failed episode (``stop_reason`` in
    ``FAILED_STOP_REASONS``) keeps its tokens but has an all-zero mask.

    Instances are not tracked by the cyclic GC (msgspec ``gc=False``): a trajectory holds
    numbers, strings and lists of numbers, so it is never part of a reference cycle, and a
    rollout makes thousands whose token lists the collector would otherwise traverse again
    and again. (Don't store objects that refer back to the trajectory in its fields.)
    """

    task_id: int | str
    env_id: str
    group_id: int
    sample_index: int
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_len: int
    turn_rewards: list[float]
    reward: float
    num_turns: int
    stop_reason: str
    policy_version: int
    timings: dict[str, float] = msgspec.field(default_factory=dict)
    seed: int = 0
    error: str | None = None

    @property
    def success(self) -> bool:
        """Solved: ended by the env (``done``) with full reward."""
        return self.stop_reason == "done" and self.reward >= 1.0 - 1e-6

    @property
    def response_length(self) -> int:
        """Number of model-generated tokens."""
        return sum(self.loss_mask)
