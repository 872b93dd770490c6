"""Trajectories: the stop reasons, the ``Trajectory`` struct, the packed batch and its
packer (``agentgym.data.trajectories``), and verl/SkyRL exports (``agentgym.data.exports``)."""

from agentgym.data.trajectories import (
    FAILED_STOP_CODES,
    FAILED_STOP_REASONS,
    STOP_CODES,
    STOP_REASONS,
    BatchFormatError,
    PackedBatch,
    Trajectory,
    pack,
)

__all__ = [
    "FAILED_STOP_CODES",
    "FAILED_STOP_REASONS",
    "STOP_CODES",
    "STOP_REASONS",
    "BatchFormatError",
    "PackedBatch",
    "Trajectory",
    "pack",
]
