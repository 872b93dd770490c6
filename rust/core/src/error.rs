//! Typed errors of the core. The bindings map each variant to a named Python exception.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum CoreError {
    #[error("unknown environment id {id:?}; known ids: {known}")]
    UnknownEnv { id: String, known: String },
    #[error("slot {slot} out of range for a pool of {size} episodes")]
    SlotOutOfRange { slot: usize, size: usize },
    #[error("slot {slot} appears more than once in one batch")]
    DuplicateSlot { slot: usize },
    #[error("episode in slot {slot} has finished ({reason}); reset it before stepping")]
    EpisodeFinished { slot: usize, reason: String },
    #[error("episode in slot {slot} has not been reset yet")]
    EpisodeNotStarted { slot: usize },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("invalid task for {env}: {message}")]
    InvalidTask { env: String, message: String },
    #[error("environment error in slot {slot}: {message}")]
    EnvFailure { slot: usize, message: String },
    #[error("trajectory error: {0}")]
    Trajectory(String),
}

pub type Result<T> = std::result::Result<T, CoreError>;
