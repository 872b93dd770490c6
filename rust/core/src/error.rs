//! Typed errors of the core. The bindings map each variant to a named Python exception.

use crate::episode::StopReason;
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
    #[error("{env} cannot snapshot its state: snapshot, restore and fork need an env that implements Env::snapshot")]
    SnapshotUnsupported { env: String },
    #[error("unknown snapshot handle {handle}: this pool never issued it, or it was released")]
    UnknownSnapshot { handle: u64 },
    /// A snapshot or fork of a slot without a running episode (`reason`: `None` if the slot
    /// was never reset, else how its episode ended).
    #[error("cannot {op} slot {slot}: {}", not_running(*.reason))]
    NotRunning {
        slot: usize,
        op: &'static str,
        reason: Option<StopReason>,
    },
    #[error("slot {slot} holds a running episode; a fork target must hold none (never reset, or finished)")]
    SlotBusy { slot: usize },
}

fn not_running(reason: Option<StopReason>) -> String {
    match reason {
        None => "its episode has not been reset yet".into(),
        Some(r) => format!(
            "its episode has finished ({}); only a running episode can be snapshotted or forked",
            r.as_str()
        ),
    }
}

pub type Result<T> = std::result::Result<T, CoreError>;
