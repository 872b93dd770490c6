//! `_core.TrajectoryStore`: token-exact trajectories of live episodes and their packed export.
//! Array inputs are copied into owned vectors, then the work runs with the GIL released;
//! `drain` hands the packed vectors to numpy without copying them again.

use crate::errors::to_py;
use agentgym_core::trajectory::{EpisodeMeta, PackedBatch, TrajectoryStore};
use agentgym_core::StopReason;
use numpy::{Element, IntoPyArray, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

fn owned<T: Element + Copy>(a: &PyReadonlyArray1<'_, T>) -> Vec<T> {
    match a.as_slice() {
        Ok(s) => s.to_vec(),
        Err(_) => a.as_array().iter().copied().collect(),
    }
}

fn reason(name: &str) -> PyResult<StopReason> {
    StopReason::parse(name).ok_or_else(|| {
        let known: Vec<&str> = StopReason::ALL.iter().map(|r| r.as_str()).collect();
        PyValueError::new_err(format!(
            "unknown stop reason {name:?}; expected one of {}",
            known.join(", ")
        ))
    })
}

/// One stop reason for all keys, or one per key.
#[derive(FromPyObject)]
enum ReasonsArg {
    One(String),
    Many(Vec<String>),
}

#[pyclass(name = "TrajectoryStore", module = "agentgym._core")]
pub struct PyTrajectoryStore {
    pub(crate) inner: TrajectoryStore,
}

#[pymethods]
impl PyTrajectoryStore {
    #[new]
    fn new() -> Self {
        Self {
            inner: TrajectoryStore::new(),
        }
    }

    #[pyo3(signature = (key, group_id = 0, sample_index = 0, policy_version = 0, task_id = 0))]
    fn begin(
        &mut self,
        key: u64,
        group_id: u64,
        sample_index: u32,
        policy_version: u32,
        task_id: u64,
    ) -> PyResult<()> {
        let meta = EpisodeMeta {
            group_id,
            sample_index,
            policy_version,
            task_id,
        };
        self.inner.begin(key, meta).map_err(to_py)
    }

    fn begin_batch(
        &mut self,
        py: Python<'_>,
        keys: PyReadonlyArray1<'_, u64>,
        group_ids: PyReadonlyArray1<'_, u64>,
        sample_indices: PyReadonlyArray1<'_, u32>,
        policy_versions: PyReadonlyArray1<'_, u32>,
        task_ids: PyReadonlyArray1<'_, u64>,
    ) -> PyResult<()> {
        let keys = owned(&keys);
        let cols = (
            owned(&group_ids),
            owned(&sample_indices),
            owned(&policy_versions),
            owned(&task_ids),
        );
        let n = keys.len();
        if cols.0.len() != n || cols.1.len() != n || cols.2.len() != n || cols.3.len() != n {
            return Err(to_py(agentgym_core::CoreError::Trajectory(format!(
                "begin_batch got {n} keys and {}, {}, {}, {} metadata values; lengths must match",
                cols.0.len(),
                cols.1.len(),
                cols.2.len(),
                cols.3.len()
            ))));
        }
        let metas: Vec<EpisodeMeta> = (0..n)
            .map(|i| EpisodeMeta {
                group_id: cols.0[i],
                sample_index: cols.1[i],
                policy_version: cols.2[i],
                task_id: cols.3[i],
            })
            .collect();
        let inner = &mut self.inner;
        py.detach(|| inner.begin_batch(&keys, &metas))
            .map_err(to_py)
    }

    #[pyo3(signature = (key, tokens, is_model, logprobs = None))]
    fn append(
        &mut self,
        key: u64,
        tokens: PyReadonlyArray1<'_, u32>,
        is_model: bool,
        logprobs: Option<PyReadonlyArray1<'_, f32>>,
    ) -> PyResult<()> {
        let lp = logprobs.as_ref().map(owned);
        self.inner
            .append(key, &owned(&tokens), is_model, lp.as_deref())
            .map_err(to_py)
    }

    #[pyo3(signature = (keys, flat_tokens, offsets, is_model, flat_logprobs = None))]
    fn append_batch(
        &mut self,
        py: Python<'_>,
        keys: PyReadonlyArray1<'_, u64>,
        flat_tokens: PyReadonlyArray1<'_, u32>,
        offsets: PyReadonlyArray1<'_, i64>,
        is_model: PyReadonlyArray1<'_, bool>,
        flat_logprobs: Option<PyReadonlyArray1<'_, f32>>,
    ) -> PyResult<()> {
        let keys = owned(&keys);
        let tokens = owned(&flat_tokens);
        let offsets = owned(&offsets);
        let is_model = owned(&is_model);
        let lps = flat_logprobs.as_ref().map(owned).unwrap_or_default();
        let inner = &mut self.inner;
        py.detach(|| inner.append_batch(&keys, &tokens, &offsets, &is_model, &lps))
            .map_err(to_py)
    }

    fn add_turn(&mut self, key: u64, reward: f32) -> PyResult<()> {
        self.inner.add_turn(key, reward).map_err(to_py)
    }

    fn add_turns(
        &mut self,
        keys: PyReadonlyArray1<'_, u64>,
        rewards: PyReadonlyArray1<'_, f32>,
    ) -> PyResult<()> {
        self.inner
            .add_turns(&owned(&keys), &owned(&rewards))
            .map_err(to_py)
    }

    #[pyo3(signature = (key, stop_reason, reward_override = None))]
    fn finish(
        &mut self,
        key: u64,
        stop_reason: &str,
        reward_override: Option<f32>,
    ) -> PyResult<()> {
        self.inner
            .finish(key, reason(stop_reason)?, reward_override)
            .map_err(to_py)
    }

    /// `reward_overrides`: one per key (NaN = no override) or None.
    #[pyo3(signature = (keys, stop_reasons, reward_overrides = None))]
    fn finish_batch(
        &mut self,
        py: Python<'_>,
        keys: PyReadonlyArray1<'_, u64>,
        stop_reasons: ReasonsArg,
        reward_overrides: Option<PyReadonlyArray1<'_, f32>>,
    ) -> PyResult<()> {
        let keys = owned(&keys);
        let reasons = match stop_reasons {
            ReasonsArg::One(r) => vec![reason(&r)?],
            ReasonsArg::Many(rs) => rs.iter().map(|r| reason(r)).collect::<PyResult<_>>()?,
        };
        let overrides: Vec<Option<f32>> = reward_overrides
            .as_ref()
            .map(|a| {
                owned(a)
                    .into_iter()
                    .map(|r| (!r.is_nan()).then_some(r))
                    .collect()
            })
            .unwrap_or_default();
        let inner = &mut self.inner;
        py.detach(|| inner.finish_batch(&keys, &reasons, &overrides))
            .map_err(to_py)
    }

    fn discard(&mut self, key: u64) -> PyResult<()> {
        self.inner.discard(key).map_err(to_py)
    }

    fn finish_all(&mut self, stop_reason: &str) -> PyResult<usize> {
        Ok(self.inner.finish_all(reason(stop_reason)?))
    }

    /// Pack completed episodes (the oldest `max`, or all) into a dict of numpy arrays.
    #[pyo3(signature = (max = None))]
    fn drain<'py>(&mut self, py: Python<'py>, max: Option<usize>) -> PyResult<Bound<'py, PyDict>> {
        let inner = &mut self.inner;
        let b: PackedBatch = py.detach(|| inner.drain(max));
        packed_dict(py, b)
    }

    /// Finished trajectories as rows, for consumers that want Python objects per
    /// trajectory: a list of `(key, loss_mask, logprobs, turn_rewards, reward, num_turns,
    /// stop_reason, prompt_len)` with `loss_mask` a list of 0/1, `logprobs` and
    /// `turn_rewards` lists of floats (every 0.0 one shared object) and `stop_reason` an
    /// index into `STOP_REASONS`. Token ids are not included (see `drain`). The lists hold
    /// only numbers and are not tracked by the cyclic GC.
    #[pyo3(signature = (max = None))]
    fn drain_rows<'py>(
        &mut self,
        py: Python<'py>,
        max: Option<usize>,
    ) -> PyResult<Bound<'py, pyo3::types::PyList>> {
        let inner = &mut self.inner;
        let b: PackedBatch = py.detach(|| inner.drain(max));
        rows_list(py, &b)
    }

    /// Both views of the same drained trajectories: `(rows, packed)`, `rows` as
    /// `drain_rows` returns them and `packed` as `drain` does (row `i` of one is
    /// trajectory `i` of the other). The packed arrays are the store's buffers, not copies.
    #[pyo3(signature = (max = None))]
    fn drain_rows_packed<'py>(
        &mut self,
        py: Python<'py>,
        max: Option<usize>,
    ) -> PyResult<(Bound<'py, pyo3::types::PyList>, Bound<'py, PyDict>)> {
        let inner = &mut self.inner;
        let b: PackedBatch = py.detach(|| inner.drain(max));
        let rows = rows_list(py, &b)?;
        Ok((rows, packed_dict(py, b)?))
    }

    fn is_live(&self, key: u64) -> bool {
        self.inner.is_live(key)
    }

    fn __contains__(&self, key: u64) -> bool {
        self.inner.is_live(key)
    }

    fn num_tokens(&self, key: u64) -> PyResult<usize> {
        self.inner.num_tokens(key).map_err(to_py)
    }

    fn num_turns(&self, key: u64) -> PyResult<usize> {
        self.inner.num_turns(key).map_err(to_py)
    }

    #[getter]
    fn num_live(&self) -> usize {
        self.inner.num_live()
    }

    #[getter]
    fn num_completed(&self) -> usize {
        self.inner.num_completed()
    }

    fn heap_bytes(&self) -> usize {
        self.inner.heap_bytes()
    }

    #[staticmethod]
    fn idle_bytes_per_episode() -> usize {
        TrajectoryStore::idle_bytes_per_episode()
    }
}

/// A list of `values` as floats in which every +0.0 is the object `zero`: a trajectory's
/// logprobs are 0.0 on all prompt and observation tokens, so this allocates only the model
/// tokens' floats (and the cyclic GC visits one hot object for the rest).
fn shared_zero_floats<'py>(
    zero: &Bound<'py, PyAny>,
    values: impl ExactSizeIterator<Item = f32>,
) -> PyResult<Bound<'py, pyo3::types::PyList>> {
    let py = zero.py();
    pyo3::types::PyList::new(
        py,
        values.map(|v| {
            if v == 0.0 && v.is_sign_positive() {
                zero.clone()
            } else {
                pyo3::types::PyFloat::new(py, f64::from(v)).into_any()
            }
        }),
    )
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTrajectoryStore>()?;
    let names: Vec<&str> = StopReason::ALL.iter().map(|r| r.as_str()).collect();
    m.add("STOP_REASONS", pyo3::types::PyTuple::new(m.py(), names)?)?;
    Ok(())
}

/// A packed batch as a dict of numpy arrays (the vectors move into numpy, no copy).
fn packed_dict(py: Python<'_>, b: PackedBatch) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("keys", b.keys.into_pyarray(py))?;
    d.set_item("group_id", b.group_id.into_pyarray(py))?;
    d.set_item("sample_index", b.sample_index.into_pyarray(py))?;
    d.set_item("policy_version", b.policy_version.into_pyarray(py))?;
    d.set_item("task_id", b.task_id.into_pyarray(py))?;
    d.set_item("token_ids", b.token_ids.into_pyarray(py))?;
    d.set_item("offsets", b.offsets.into_pyarray(py))?;
    d.set_item("loss_mask", b.loss_mask.into_pyarray(py))?;
    d.set_item("logprobs", b.logprobs.into_pyarray(py))?;
    d.set_item("rewards", b.rewards.into_pyarray(py))?;
    d.set_item("turn_rewards", b.turn_rewards.into_pyarray(py))?;
    d.set_item("turn_offsets", b.turn_offsets.into_pyarray(py))?;
    d.set_item("num_turns", b.num_turns.into_pyarray(py))?;
    d.set_item("stop_reason", b.stop_reason.into_pyarray(py))?;
    d.set_item("prompt_len", b.prompt_len.into_pyarray(py))?;
    Ok(d)
}

/// The rows of `drain_rows` for a packed batch.
fn rows_list<'py>(py: Python<'py>, b: &PackedBatch) -> PyResult<Bound<'py, pyo3::types::PyList>> {
    let zero = pyo3::types::PyFloat::new(py, 0.0).into_any();
    let floats = |vals: &[f32]| -> PyResult<Bound<'py, pyo3::types::PyList>> {
        let list = shared_zero_floats(&zero, vals.iter().copied())?;
        crate::turn::untrack(&list);
        Ok(list)
    };
    let rows = (0..b.keys.len())
        .map(|i| {
            let (a, z) = (b.offsets[i] as usize, b.offsets[i + 1] as usize);
            let (ta, tz) = (b.turn_offsets[i] as usize, b.turn_offsets[i + 1] as usize);
            let mask = pyo3::types::PyList::new(py, &b.loss_mask[a..z])?;
            crate::turn::untrack(&mask);
            (
                b.keys[i],
                mask,
                floats(&b.logprobs[a..z])?,
                floats(&b.turn_rewards[ta..tz])?,
                b.rewards[i],
                b.num_turns[i],
                b.stop_reason[i],
                b.prompt_len[i],
            )
                .into_pyobject(py)
        })
        .collect::<PyResult<Vec<_>>>()?;
    pyo3::types::PyList::new(py, rows)
}
