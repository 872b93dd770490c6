"""Named exceptions. They are defined in the Rust extension so that errors raised in Rust
and in Python are the same classes; import them from here."""

from agentgym._core import (
    AgentGymError,
    EnvError,
    EpisodeFinishedError,
    EpisodeNotStartedError,
    InvalidTaskError,
    SnapshotUnsupportedError,
    TrajectoryError,
    UnknownEnvError,
    UnknownSnapshotError,
)

__all__ = [
    "AgentGymError",
    "EnvError",
    "EpisodeFinishedError",
    "EpisodeNotStartedError",
    "InvalidTaskError",
    "SnapshotUnsupportedError",
    "TrajectoryError",
    "UnknownEnvError",
    "UnknownSnapshotError",
]
