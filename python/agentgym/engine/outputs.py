"""What a rollout gives back: :class:`EpisodeBatch` (the episodes that ended in one tick, as
packed rows) and :class:`RolloutBatch` (one ``collect``'s trajectories and metrics)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from agentgym.data.trajectories import PackedBatch, RowInfo, Trajectory, pack


class EpisodeBatch(NamedTuple):
    """The episodes that ended in one tick, as :meth:`RolloutEngine.stream_batches` yields
    them: their rows packed (the trajectory store's buffers), the rest of each row, and the
    same episodes as :class:`Trajectory` objects unless the stream was asked for rows only
    (then None). Row ``i`` of each is episode ``i``."""

    packed: PackedBatch
    info: RowInfo
    trajectories: list[Trajectory] | None


@dataclass(repr=False)
class RolloutBatch:
    """Trajectories of one ``collect`` in request order (group, then sample), plus metrics."""

    trajectories: list[Trajectory]
    metrics: dict[str, float]

    def __repr__(self) -> str:  # the default would print every token of every trajectory
        m = self.metrics
        return (f"RolloutBatch({len(self.trajectories)} trajectories, "
                f"reward/mean={m.get('reward/mean', float('nan')):.3f}, "
                f"success_rate={m.get('success_rate', float('nan')):.3f})")

    def __len__(self) -> int:
        return len(self.trajectories)

    def __iter__(self):
        return iter(self.trajectories)

    def packed(self) -> PackedBatch:
        """The batch as one :class:`~agentgym.data.trajectories.PackedBatch` (flat numpy arrays
        with offsets, in request order)."""
        return pack(self.trajectories)
