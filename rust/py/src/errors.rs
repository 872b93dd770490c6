//! Named Python exceptions for every core error.

use agentgym_core::CoreError;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyIndexError, PyValueError};
use pyo3::prelude::*;

create_exception!(
    _core,
    AgentGymError,
    PyException,
    "Base class of agentgym errors."
);
create_exception!(
    _core,
    UnknownEnvError,
    AgentGymError,
    "No environment is registered under this id."
);
create_exception!(
    _core,
    EpisodeFinishedError,
    AgentGymError,
    "The episode has ended; reset it first."
);
create_exception!(
    _core,
    EpisodeNotStartedError,
    AgentGymError,
    "The episode was never reset."
);
create_exception!(
    _core,
    InvalidTaskError,
    AgentGymError,
    "The environment rejected the task."
);
create_exception!(_core, EnvError, AgentGymError, "The environment failed.");
create_exception!(
    _core,
    TrajectoryError,
    AgentGymError,
    "Invalid trajectory operation."
);

create_exception!(
    _core,
    SnapshotUnsupportedError,
    AgentGymError,
    "The environment cannot snapshot its state (snapshot, restore, fork)."
);
create_exception!(
    _core,
    UnknownSnapshotError,
    AgentGymError,
    "No live snapshot has this handle in this pool (never issued, or released)."
);

pub fn to_py(err: CoreError) -> PyErr {
    let msg = err.to_string();
    match err {
        CoreError::UnknownEnv { .. } => UnknownEnvError::new_err(msg),
        CoreError::SlotOutOfRange { .. } => PyIndexError::new_err(msg),
        CoreError::DuplicateSlot { .. } | CoreError::InvalidArgument(_) => {
            PyValueError::new_err(msg)
        }
        CoreError::EpisodeFinished { .. } => EpisodeFinishedError::new_err(msg),
        CoreError::EpisodeNotStarted { .. } => EpisodeNotStartedError::new_err(msg),
        CoreError::InvalidTask { .. } => InvalidTaskError::new_err(msg),
        CoreError::EnvFailure { .. } => EnvError::new_err(msg),
        CoreError::Trajectory(_) => TrajectoryError::new_err(msg),
        CoreError::SnapshotUnsupported { .. } => SnapshotUnsupportedError::new_err(msg),
        CoreError::UnknownSnapshot { .. } => UnknownSnapshotError::new_err(msg),
        CoreError::NotRunning { reason: None, .. } => EpisodeNotStartedError::new_err(msg),
        CoreError::NotRunning { .. } => EpisodeFinishedError::new_err(msg),
        CoreError::SlotBusy { .. } => PyValueError::new_err(msg),
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("AgentGymError", py.get_type::<AgentGymError>())?;
    m.add("UnknownEnvError", py.get_type::<UnknownEnvError>())?;
    m.add(
        "EpisodeFinishedError",
        py.get_type::<EpisodeFinishedError>(),
    )?;
    m.add(
        "EpisodeNotStartedError",
        py.get_type::<EpisodeNotStartedError>(),
    )?;
    m.add("InvalidTaskError", py.get_type::<InvalidTaskError>())?;
    m.add("EnvError", py.get_type::<EnvError>())?;
    m.add("TrajectoryError", py.get_type::<TrajectoryError>())?;
    m.add(
        "SnapshotUnsupportedError",
        py.get_type::<SnapshotUnsupportedError>(),
    )?;
    m.add(
        "UnknownSnapshotError",
        py.get_type::<UnknownSnapshotError>(),
    )?;
    Ok(())
}
