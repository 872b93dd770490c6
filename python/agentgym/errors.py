"""Named exceptions. The first ones are defined in the Rust extension so that errors raised
in Rust and in Python are the same classes; import them from here.

:class:`UsageError` is the base of the mistakes a user makes in what they ask for (a flag's
value, an env's keyword arguments, an output folder): the command line prints one of them
as one line, ``agentgym-rl <command>: error: <message>``, and exits 2, never with a
traceback. Its message names the flag or key at fault and says what to do. An error that
is not a :class:`UsageError` (nor :class:`UnknownEnvError`) is a bug and keeps its
traceback.
"""

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


class UsageError(Exception):
    """A mistake in what was asked for (the message names the flag or key and what to do)."""


class ConfigError(UsageError, ValueError):
    """A setting's value is refused (out of range, inconsistent with another, unknown)."""


class OutputPathError(UsageError, ValueError):
    """An output path cannot be used as asked: a file where a folder is expected, a folder
    that is not empty, the input folder itself."""


class ModelNotFoundError(UsageError, ValueError):
    """``--model`` (a model folder) does not exist, and is not a named model or a model on
    the Hugging Face hub."""


__all__ = [
    "AgentGymError",
    "ConfigError",
    "EnvError",
    "EpisodeFinishedError",
    "EpisodeNotStartedError",
    "InvalidTaskError",
    "ModelNotFoundError",
    "OutputPathError",
    "SnapshotUnsupportedError",
    "TrajectoryError",
    "UnknownEnvError",
    "UnknownSnapshotError",
    "UsageError",
]
