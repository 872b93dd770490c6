//! `_core.EnvPool`: the Rust episode pool. The Python wrapper `agentgym.EnvPool` fills in
//! defaults; this class takes fully specified batches.

use crate::batch::{self, Actions};
use crate::errors::to_py;
use agentgym_core::pool::undo::{self, Refusal};
use agentgym_core::pool::{first_refusal, frame_digest as digest_of, Frame, ResetSpec, UndoRules};
use agentgym_core::registry::{self, Kwargs};
use agentgym_core::{EpisodePool, StopReason, Task};
use numpy::{IntoPyArray, PyArray1, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

/// A task as Python gives it: an index or the env's explicit task text.
#[derive(FromPyObject)]
pub enum TaskArg {
    Index(u64),
    Spec(String),
}

impl From<TaskArg> for Task {
    fn from(t: TaskArg) -> Task {
        match t {
            TaskArg::Index(i) => Task::Index(i),
            TaskArg::Spec(s) => Task::Spec(s),
        }
    }
}

type StepResult<'py> = (
    Bound<'py, PyList>,
    Bound<'py, PyArray1<f32>>,
    Bound<'py, PyArray1<bool>>,
    Bound<'py, PyArray1<bool>>,
);

/// What `reset` returns: the observations, or with `errors="return"`
/// `(observations, [(row, exception), ...])`.
#[derive(IntoPyObject)]
pub enum ResetResult<'py> {
    Observations(Bound<'py, PyList>),
    Rows((Bound<'py, PyList>, Vec<(usize, Py<PyAny>)>)),
}

pub(crate) fn parse_kwargs(kwargs_json: &str) -> PyResult<Kwargs> {
    match serde_json::from_str::<serde_json::Value>(kwargs_json) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err(PyValueError::new_err("env kwargs must be a JSON object")),
        Err(e) => Err(PyValueError::new_err(format!(
            "env kwargs are not valid JSON: {e}"
        ))),
    }
}

#[pyclass(name = "EnvPool", module = "agentgym._core")]
pub struct PyEnvPool {
    pub(crate) inner: EpisodePool,
}

#[pymethods]
impl PyEnvPool {
    #[new]
    #[pyo3(signature = (env_id, num_envs, kwargs_json = "{}"))]
    fn new(env_id: &str, num_envs: usize, kwargs_json: &str) -> PyResult<Self> {
        let kwargs = parse_kwargs(kwargs_json)?;
        let inner = EpisodePool::new(env_id, num_envs, kwargs).map_err(to_py)?;
        Ok(Self { inner })
    }

    /// Reset slots `ids` with one task, seed and horizon (None = unlimited) each. The whole
    /// batch runs with the GIL released. With `errors="raise"` the result is the
    /// observations, and a task the env refuses (or an env that cannot be built) raises its
    /// named error after the batch ran (those slots end with `env_error`); a panic only ends
    /// its own episode, its observation says so. With `errors="return"` nothing raises per
    /// row: the result is `(observations, errors)`, `errors` listing `(row, exception)` in
    /// row order for each row whose env refused its task, could not be built or panicked
    /// (its observation is empty, or the panic's message). A malformed batch always raises.
    #[pyo3(signature = (ids, tasks, seeds, max_turns, errors = "raise"))]
    fn reset<'py>(
        &mut self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
        tasks: Vec<TaskArg>,
        seeds: &Bound<'py, PyAny>,
        max_turns: &Bound<'py, PyAny>,
        errors: &str,
    ) -> PyResult<ResetResult<'py>> {
        let return_errors = match errors {
            "raise" => false,
            "return" => true,
            other => {
                return Err(PyValueError::new_err(format!(
                    "errors must be \"raise\" or \"return\", got {other:?}"
                )))
            }
        };
        let ids = batch::slot_ids(ids)?;
        // Lists of ints (or anything `int()` takes) for seeds, of ints or None for horizons.
        let seeds: Vec<u64> = match seeds.cast::<PyList>() {
            Ok(list) => batch::python_ints(list, false)?
                .into_iter()
                .flatten()
                .collect(),
            Err(_) => seeds.extract()?,
        };
        let max_turns: Vec<Option<u32>> = match max_turns.cast::<PyList>() {
            Ok(list) => batch::python_ints(list, true)?,
            Err(_) => max_turns.extract()?,
        };
        let n = ids.len();
        if tasks.len() != n || seeds.len() != n || max_turns.len() != n {
            return Err(PyValueError::new_err(format!(
                "reset got {n} ids, {} tasks, {} seeds, {} max_turns; lengths must match",
                tasks.len(),
                seeds.len(),
                max_turns.len()
            )));
        }
        let specs: Vec<ResetSpec> = ids
            .into_iter()
            .zip(tasks)
            .zip(seeds)
            .zip(max_turns)
            .map(|(((slot, task), seed), max_turns)| ResetSpec {
                slot,
                task: task.into(),
                seed,
                max_turns,
            })
            .collect();
        let inner = &mut self.inner;
        let (list, failed) =
            batch::with_str_list(py, specs.len(), |sink| inner.reset_with(&specs, sink))?;
        if return_errors {
            let failed = failed
                .into_iter()
                .map(|e| (e.row, to_py(e.error).into_value(py).into_any()))
                .collect();
            return Ok(ResetResult::Rows((list, failed)));
        }
        match first_refusal(failed) {
            Some(e) => Err(to_py(e)),
            None => Ok(ResetResult::Observations(list)),
        }
    }

    /// Step slots `ids` (a list or numpy array of ints) with one action each (a list of
    /// str): (observations, rewards, terminated, truncated). The envs step without the GIL;
    /// the observation strings are built chunk by chunk as chunks finish, while the other
    /// threads keep stepping.
    fn step<'py>(
        &mut self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
        actions: &Bound<'py, PyAny>,
    ) -> PyResult<StepResult<'py>> {
        let ids = batch::slot_ids(ids)?;
        let actions = Actions::extract(actions)?;
        let inner = &mut self.inner;
        let actions = actions.as_strs();
        let (list, out) =
            batch::with_str_list(py, ids.len(), |sink| inner.step_with(&ids, &actions, sink))?;
        Ok((
            list,
            PyArray1::from_slice(py, &out.rewards),
            PyArray1::from_slice(py, &out.terminated),
            PyArray1::from_slice(py, &out.truncated),
        ))
    }

    /// The current picture of each of slots `ids` (a list or numpy array of ints), drawn on
    /// demand in one batch with the GIL released: per slot, in the order given, a
    /// `(height, width, 3)` uint8 array (RGB, row-major), or None where the env draws no
    /// picture (text mode, an env without pictures, or an env dropped after a panic), or,
    /// where the env panicked while drawing or drew a malformed frame (a byte count other
    /// than height * width * 3), an `EnvError` instance in that row (returned, not raised):
    /// that slot's running episode ends with `env_error`, the other rows are unaffected.
    /// Raises before drawing anything: IndexError / ValueError (bad or repeated ids),
    /// `EpisodeNotStartedError` (a slot never reset).
    fn frames<'py>(
        &mut self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        self.drawn(py, ids, |py, pixels, height, width, _| {
            Ok(PyArray1::from_slice(py, pixels)
                .reshape([height as usize, width as usize, 3])?
                .into_any()
                .unbind())
        })
    }

    /// The pictures of slots `ids` as `(height, width, rgb bytes, digest)` rows (None: no
    /// picture; an `EnvError` value: drawing failed, as in `frames`), drawn in one call with
    /// the GIL released. `digest` is `frame_digest` of the row, computed in the same call:
    /// what `agentgym.data.frames.Frame` holds.
    fn frame_records<'py>(
        &mut self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        self.drawn(py, ids, |py, pixels, height, width, digest| {
            Ok((height, width, PyBytes::new(py, pixels), hex(digest))
                .into_pyobject(py)?
                .into_any()
                .unbind())
        })
    }

    /// `(height, width)` of this pool's frames (`frames`), fixed by its env kwargs (a maze
    /// task text of another size draws its own size); None when the env draws none.
    #[getter]
    fn frame_shape(&self) -> Option<(u32, u32)> {
        self.inner.frame_shape()
    }

    /// End running episodes from outside with a stop reason (e.g. "timeout").
    fn finish(&mut self, ids: Vec<usize>, reason: &str) -> PyResult<()> {
        let reason = StopReason::parse(reason)
            .ok_or_else(|| PyValueError::new_err(format!("unknown stop reason {reason:?}")))?;
        self.inner.finish(&ids, reason).map_err(to_py)
    }

    fn valid_actions(&mut self, slot: usize) -> PyResult<Vec<String>> {
        self.inner.valid_actions(slot).map_err(to_py)
    }

    fn oracle_action(&mut self, slot: usize) -> PyResult<Option<String>> {
        self.inner.oracle_action(slot).map_err(to_py)
    }

    fn oracle_actions(&mut self, py: Python<'_>, ids: Vec<usize>) -> PyResult<Vec<Option<String>>> {
        let inner = &mut self.inner;
        py.detach(|| inner.oracle_actions(&ids)).map_err(to_py)
    }

    /// Turn counts of all slots.
    fn turns<'py>(&mut self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        self.inner.turns().into_pyarray(py)
    }

    /// Stop reason of every slot, or of slots `ids` (None while running or never reset).
    #[pyo3(signature = (ids = None))]
    fn stop_reasons(&mut self, ids: Option<Vec<usize>>) -> PyResult<Vec<Option<&'static str>>> {
        let reasons = match ids {
            None => self.inner.stop_reasons(),
            Some(ids) => self.inner.stop_reasons_of(&ids).map_err(to_py)?,
        };
        Ok(reasons
            .into_iter()
            .map(|r| r.map(StopReason::as_str))
            .collect())
    }

    /// Steps of each of slots `ids` whose action the env refused as unreadable (the
    /// episode the slot holds or last held).
    fn invalid_turns(&mut self, ids: Vec<usize>) -> PyResult<Vec<u32>> {
        self.inner.invalid_turns_of(&ids).map_err(to_py)
    }

    /// Accepted `undo` turns of each of slots `ids` (the episode the slot holds or last
    /// held).
    fn undo_turns(&mut self, ids: Vec<usize>) -> PyResult<Vec<u32>> {
        self.inner.undo_turns_of(&ids).map_err(to_py)
    }

    /// Turn the `undo` action on (`max_undos` accepted undos per episode, the last `depth`
    /// turns undoable) from each slot's next reset, or off with `max_undos=None`. Raises
    /// `SnapshotUnsupportedError` on an env that cannot snapshot, ValueError on depth 0.
    #[pyo3(signature = (max_undos, depth = 16))]
    fn set_undo(&mut self, max_undos: Option<u32>, depth: usize) -> PyResult<()> {
        let rules = max_undos.map(|max_undos| UndoRules { max_undos, depth });
        self.inner.set_undo(rules).map_err(to_py)
    }

    /// `(max_undos, depth)` while the `undo` action is on, else None.
    #[getter]
    fn undo(&self) -> Option<(u32, usize)> {
        self.inner.undo_rules().map(|r| (r.max_undos, r.depth))
    }

    /// Whether each of slots `ids` holds a running episode (ids in range, each once).
    fn running(&mut self, ids: Vec<usize>) -> PyResult<Vec<bool>> {
        self.inner.running_of(ids.iter().copied()).map_err(to_py)
    }

    #[pyo3(signature = (slot, max_turns))]
    fn set_max_turns(&mut self, slot: usize, max_turns: Option<u32>) -> PyResult<()> {
        self.inner.set_max_turns(slot, max_turns).map_err(to_py)
    }

    /// (task, seed, turns, max_turns, stop_reason, total_reward) of one slot.
    #[allow(clippy::type_complexity)]
    fn episode(
        &mut self,
        py: Python<'_>,
        slot: usize,
    ) -> PyResult<(Py<PyAny>, u64, u32, Option<u32>, Option<&'static str>, f32)> {
        let ep = self.inner.episode(slot).map_err(to_py)?;
        let task = match &ep.task {
            Task::Index(i) => i.into_pyobject(py)?.into_any().unbind(),
            Task::Spec(s) => s.into_pyobject(py)?.into_any().unbind(),
        };
        Ok((
            task,
            ep.seed,
            ep.turns,
            ep.max_turns,
            ep.stop_reason().map(StopReason::as_str),
            ep.total_reward,
        ))
    }

    /// Save the state of each of slots `ids` (a running episode each: the env's whole
    /// state and the episode's bookkeeping); returns one new opaque handle per slot. Raises
    /// before saving anything: `SnapshotUnsupportedError` (env), `EpisodeNotStartedError` /
    /// `EpisodeFinishedError` (a slot without a running episode), IndexError / ValueError
    /// (bad or repeated ids). Runs with the GIL released.
    fn snapshot(&mut self, py: Python<'_>, ids: Vec<usize>) -> PyResult<Vec<u64>> {
        let inner = &mut self.inner;
        py.detach(|| inner.snapshot(&ids)).map_err(to_py)
    }

    /// Put slot `ids[i]` back into the state saved under `handles[i]` (env and episode
    /// bookkeeping, exactly), whatever the slot holds now; handles stay valid. Raises before
    /// changing anything: `UnknownSnapshotError`, IndexError / ValueError (ids, lengths).
    /// Runs with the GIL released.
    fn restore(&mut self, py: Python<'_>, ids: Vec<usize>, handles: Vec<u64>) -> PyResult<()> {
        let inner = &mut self.inner;
        py.detach(|| inner.restore(&ids, &handles)).map_err(to_py)
    }

    /// Copy slot `src`'s state (a running episode) into each of slots `targets` (none of
    /// which may hold a running episode); from then on every slot steps on its own. Raises
    /// before changing anything: `SnapshotUnsupportedError`, `EpisodeFinishedError` (e.g. a
    /// `src` that ended with `env_error`), `EpisodeNotStartedError`, ValueError (a busy or
    /// repeated target), IndexError. Runs with the GIL released.
    fn fork(&mut self, py: Python<'_>, src: usize, targets: Vec<usize>) -> PyResult<()> {
        let inner = &mut self.inner;
        py.detach(|| inner.fork(src, &targets)).map_err(to_py)
    }

    /// Free the snapshots under `handles` (all or nothing: an unknown or repeated handle
    /// raises `UnknownSnapshotError` / ValueError first).
    fn release(&mut self, py: Python<'_>, handles: Vec<u64>) -> PyResult<()> {
        let inner = &mut self.inner;
        py.detach(|| inner.release(&handles)).map_err(to_py)
    }

    /// Bytes each snapshot holds: its table entry, the env struct, the env's own heap
    /// buffers (capacities; shared read-only data such as word lists is not counted) and
    /// the task text.
    fn snapshot_bytes(&self, handles: Vec<u64>) -> PyResult<Vec<usize>> {
        self.inner.snapshot_bytes(&handles).map_err(to_py)
    }

    /// Whether this pool's env can snapshot (known before any episode starts).
    #[getter]
    fn snapshots_supported(&self) -> bool {
        self.inner.snapshots_supported()
    }

    /// Live (issued, not released) snapshots.
    #[getter]
    fn num_snapshots(&self) -> usize {
        self.inner.num_snapshots()
    }

    #[getter]
    fn env_id(&self) -> &str {
        self.inner.env_id()
    }

    #[getter]
    fn instructions(&self) -> &str {
        self.inner.instructions()
    }

    #[getter]
    fn num_tasks(&self) -> u64 {
        self.inner.num_tasks()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }
}

/// `n` when `action` (an extracted action) is an undo (`undo` = 1, `undo N` with N >= 1,
/// case-insensitive), else None: the one grammar of the `undo` action.
#[pyfunction]
fn parse_undo(action: &str) -> Option<u32> {
    undo::parse_undo(action)
}

/// The observation of an accepted `undo n`: `Undid the last n turn(s). <observation>`.
#[pyfunction]
fn undo_reply(n: u32, observation: &str) -> String {
    let mut out = String::new();
    undo::undone(&mut out, n, observation);
    out
}

/// The observation of a refused undo: `reason` is "cap" (`max_undos` used), "too_many"
/// (`asked` turns, `available` undoable) or "unsupported" (the env could not copy its
/// state).
#[pyfunction]
#[pyo3(signature = (reason, *, asked = 0, available = 0, max_undos = 0))]
fn undo_refusal(reason: &str, asked: u32, available: u32, max_undos: u32) -> PyResult<String> {
    let why = match reason {
        "cap" => Refusal::Cap { max_undos },
        "too_many" => Refusal::TooMany { asked, available },
        "unsupported" => Refusal::Unsupported,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown undo refusal {other:?}: use \"cap\", \"too_many\" or \"unsupported\""
            )))
        }
    };
    Ok(undo::refusal(why))
}

/// Registered native env ids: the shipped envs, and the test-only ones once
/// `_register_test_envs` has run.
#[pyfunction]
fn native_env_ids() -> Vec<&'static str> {
    registry::env_ids()
}

/// For tests only: registers the test-only native envs (`_test_panic`, which fails on
/// demand) in this process; calling it again changes nothing. Returns their ids.
#[pyfunction]
fn _register_test_envs() -> Vec<&'static str> {
    registry::register_test_envs()
}

/// One-line description of a registered native env.
#[pyfunction]
fn native_env_description(env_id: &str) -> PyResult<&'static str> {
    registry::spec(env_id).map(|s| s.description).map_err(to_py)
}

/// How a native env's tasks are split: `(splits, held_out, tasks)` (see `EnvSpec`).
#[pyfunction]
#[allow(clippy::type_complexity)]
fn native_env_tasks(
    env_id: &str,
) -> PyResult<(Vec<&'static str>, Option<&'static str>, &'static str)> {
    registry::spec(env_id)
        .map(|s| (s.splits.to_vec(), s.held_out, s.tasks))
        .map_err(to_py)
}

impl PyEnvPool {
    /// The pool's frames of `ids` (drawn with the GIL released), each image row made into a
    /// Python value by `image(py, pixels, height, width, digest)`; None and `EnvError` rows
    /// as `frames` gives them.
    fn drawn<'py>(
        &mut self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
        image: impl Fn(Python<'py>, &[u8], u32, u32, &[u8; 16]) -> PyResult<Py<PyAny>>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        let ids = batch::slot_ids(ids)?;
        let inner = &mut self.inner;
        let frames = py.detach(|| inner.frames(&ids)).map_err(to_py)?;
        let mut out = Vec::with_capacity(frames.rows.len());
        for (row, frame) in frames.rows.iter().enumerate() {
            out.push(match frame {
                Frame::Missing => py.None(),
                Frame::Image {
                    height,
                    width,
                    digest,
                    ..
                } => {
                    let pixels = frames.pixels(row).expect("an image row has pixels");
                    image(py, pixels, *height, *width, digest)?
                }
                Frame::Failed(e) => to_py(e.clone()).into_value(py).into_any(),
            });
        }
        Ok(out)
    }
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The content id of an RGB frame of `height` x `width` pixels with bytes `rgb` (row-major,
/// `height * width * 3` of them): BLAKE3 of the bytes and the sizes, 16 bytes as hex. The
/// id `frame_records` gives the pool's frames.
#[pyfunction]
fn frame_digest(py: Python<'_>, height: u32, width: u32, rgb: &[u8]) -> PyResult<String> {
    let want = height as usize * width as usize * 3;
    if rgb.len() != want || want == 0 {
        return Err(PyValueError::new_err(format!(
            "a {height}x{width} frame has {want} bytes (at least one pixel), got {}",
            rgb.len()
        )));
    }
    Ok(py.detach(|| hex(&digest_of(height, width, rgb))))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEnvPool>()?;
    m.add_function(wrap_pyfunction!(frame_digest, m)?)?;
    m.add_function(wrap_pyfunction!(native_env_ids, m)?)?;
    m.add_function(wrap_pyfunction!(_register_test_envs, m)?)?;
    m.add_function(wrap_pyfunction!(native_env_description, m)?)?;
    m.add_function(wrap_pyfunction!(native_env_tasks, m)?)?;
    m.add_function(wrap_pyfunction!(parse_undo, m)?)?;
    m.add_function(wrap_pyfunction!(undo_reply, m)?)?;
    m.add_function(wrap_pyfunction!(undo_refusal, m)?)?;
    Ok(())
}
