"""``FailureGuard``: stop a training run whose episodes keep failing, with a clear error.

An episode that fails (stop reason in :data:`~agentgym.data.trajectories.FAILED_STOP_REASONS`:
the env raised, the backend failed, a timeout, an abort) is recorded with a zeroed loss mask,
so a run whose every episode fails trains on nothing while looking healthy. The guard counts
consecutive training steps in which at least ``failure_rate`` of the episodes failed and
raises :class:`TrainingAbortedError` after ``patience`` of them, naming the stop reasons and
the first error message. An evaluation in which every episode failed raises at once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from agentgym.data.trajectories import FAILED_STOP_REASONS
from agentgym.errors import AgentGymError

__all__ = ["FailureGuard", "TrainingAbortedError"]


class TrainingAbortedError(AgentGymError):
    """A training run stopped because its episodes kept failing."""


def _summary(trajectories: Sequence) -> tuple[int, Counter, str | None]:
    reasons = Counter(t.stop_reason for t in trajectories)
    failed = sum(n for r, n in reasons.items() if r in FAILED_STOP_REASONS)
    first = next((t.error for t in trajectories
                  if t.stop_reason in FAILED_STOP_REASONS and t.error), None)
    return failed, reasons, first


def _describe(reasons: Counter, first: str | None) -> str:
    counts = ", ".join(f"{r}={n}" for r, n in reasons.most_common())
    return f"stop reasons: {counts}; first error: {first or '(none recorded)'}"


class FailureGuard:
    """Raises :class:`TrainingAbortedError` after ``patience`` consecutive steps in which at
    least ``failure_rate`` of the episodes failed (``patience = 0`` disables the guard)."""

    def __init__(self, env_id: str, patience: int = 3, failure_rate: float = 1.0):
        if patience < 0 or not 0.0 < failure_rate <= 1.0:
            raise ValueError("abort_after_failed_steps must be >= 0 and abort_failure_rate "
                             f"in (0, 1], got {patience} and {failure_rate}")
        self.env_id = env_id
        self.patience = patience
        self.failure_rate = failure_rate
        self.streak = 0

    def check_step(self, trajectories: Sequence, step: int) -> None:
        """Count training step ``step``'s failures; raise once the streak reaches patience."""
        if not self.patience or not trajectories:
            return
        failed, reasons, first = _summary(trajectories)
        if failed < self.failure_rate * len(trajectories):
            self.streak = 0
            return
        self.streak += 1
        if self.streak >= self.patience:
            share = "every episode" if self.failure_rate >= 1.0 else \
                f"at least {self.failure_rate:.0%} of the episodes"
            raise TrainingAbortedError(
                f"training on {self.env_id} stopped at step {step}: {share} failed in each of "
                f"the last {self.streak} steps ({failed}/{len(trajectories)} in the last; "
                f"{_describe(reasons, first)}). Check the env, its task ids and the backend; "
                "abort_after_failed_steps=0 disables this check.")

    def check_eval(self, trajectories: Sequence, step: int) -> None:
        """Raise if every episode of an evaluation failed."""
        if not self.patience or not trajectories:
            return
        failed, reasons, first = _summary(trajectories)
        if failed == len(trajectories):
            raise TrainingAbortedError(
                f"evaluation on {self.env_id} at step {step}: all {failed} episodes failed "
                f"({_describe(reasons, first)}). Check the env, its task ids and the backend; "
                "abort_after_failed_steps=0 disables this check.")
