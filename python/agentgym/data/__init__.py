"""Wire types and exports of trajectories."""

from agentgym.data.schemas import STOP_REASONS, Trajectory

__all__ = ["STOP_REASONS", "Trajectory"]
