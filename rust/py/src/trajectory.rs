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

    /// The sum of the turn rewards recorded so far by a live episode.
    fn reward(&self, key: u64) -> PyResult<f32> {
        self.inner.reward(key).map_err(to_py)
    }

    /// Add ``delta`` to the reward of turn ``turn`` (0-based) of a live episode.
    fn add_reward(&mut self, key: u64, turn: usize, delta: f32) -> PyResult<()> {
        self.inner.add_reward(key, turn, delta).map_err(to_py)
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

    /// Fork live episode `src` into new live episodes `keys` (sample indices
    /// `sample_indices`): each starts with `src`'s tokens, logprobs and turn rewards so far,
    /// its copy of that prefix with loss mask 0 (the prefix is trained once, through
    /// `src`); `src` and each child record the fork (`branch_parent`, `branch_turn`,
    /// `branch_pos` of their rows).
    fn fork(
        &mut self,
        py: Python<'_>,
        src: u64,
        keys: Vec<u64>,
        sample_indices: Vec<u32>,
    ) -> PyResult<()> {
        let inner = &mut self.inner;
        py.detach(|| inner.fork(src, &keys, &sample_indices))
            .map_err(to_py)
    }

    /// Keep the loss mask of live episode `key` only on the model-token runs that begin at
    /// `starts` (token positions); zero it elsewhere.
    fn credit_only(&mut self, key: u64, starts: Vec<u32>) -> PyResult<()> {
        self.inner.credit_only(key, &starts).map_err(to_py)
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
    /// trajectory: a list of `TrajectoryRow`. Token ids are not included (see `drain`).
    #[pyo3(signature = (max = None))]
    fn drain_rows<'py>(
        &mut self,
        py: Python<'py>,
        max: Option<usize>,
    ) -> PyResult<Bound<'py, pyo3::types::PyList>> {
        let inner = &mut self.inner;
        let b: PackedBatch = py.detach(|| inner.drain(max));
        rows_list(py, &Columns::of(&b))
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
        let rows = rows_list(py, &Columns::of(&b))?;
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
    m.add_class::<PyTrajectoryRow>()?;
    m.add_function(wrap_pyfunction!(packed_rows, m)?)?;
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
    d.set_item("branch_parent", b.branch_parent.into_pyarray(py))?;
    d.set_item("branch_turn", b.branch_turn.into_pyarray(py))?;
    d.set_item("branch_pos", b.branch_pos.into_pyarray(py))?;
    Ok(d)
}

/// One finished trajectory as `TrajectoryStore.drain_rows` and `packed_rows` return it,
/// without its token ids: `loss_mask` a list of 0/1, `logprobs` and `turn_rewards` lists of
/// floats (every +0.0 one shared object), `stop_reason` an index into `STOP_REASONS`,
/// `branch_*` the fork it took part in (`TrajectoryStore.fork`; `branch_pos` 0: none). The
/// lists hold only numbers and are not tracked by the cyclic GC.
#[pyclass(frozen, get_all, name = "TrajectoryRow", module = "agentgym._core")]
pub struct PyTrajectoryRow {
    key: u64,
    group_id: u64,
    sample_index: u32,
    policy_version: u32,
    prompt_len: u32,
    loss_mask: Py<pyo3::types::PyList>,
    logprobs: Py<pyo3::types::PyList>,
    turn_rewards: Py<pyo3::types::PyList>,
    reward: f32,
    num_turns: u32,
    stop_reason: u8,
    branch_parent: u32,
    branch_turn: u32,
    branch_pos: u32,
}

/// Borrowed columns of a packed batch (the store's, or numpy arrays of a Python
/// `PackedBatch`), checked so that every row's ranges lie inside its buffers.
struct Columns<'a> {
    keys: Option<&'a [u64]>,
    group_id: &'a [u64],
    sample_index: &'a [u32],
    policy_version: &'a [u32],
    offsets: &'a [i64],
    loss_mask: &'a [u8],
    logprobs: &'a [f32],
    rewards: &'a [f32],
    turn_rewards: &'a [f32],
    turn_offsets: &'a [i64],
    num_turns: &'a [u32],
    stop_reason: &'a [u8],
    prompt_len: &'a [u32],
    branch_parent: &'a [u32],
    branch_turn: &'a [u32],
    branch_pos: &'a [u32],
}

impl<'a> Columns<'a> {
    fn of(b: &'a PackedBatch) -> Self {
        Columns {
            keys: Some(&b.keys),
            group_id: &b.group_id,
            sample_index: &b.sample_index,
            policy_version: &b.policy_version,
            offsets: &b.offsets,
            loss_mask: &b.loss_mask,
            logprobs: &b.logprobs,
            rewards: &b.rewards,
            turn_rewards: &b.turn_rewards,
            turn_offsets: &b.turn_offsets,
            num_turns: &b.num_turns,
            stop_reason: &b.stop_reason,
            prompt_len: &b.prompt_len,
            branch_parent: &b.branch_parent,
            branch_turn: &b.branch_turn,
            branch_pos: &b.branch_pos,
        }
    }

    /// The number of rows, or why the columns do not form a packed batch.
    fn check(&self) -> Result<usize, String> {
        let n = self
            .offsets
            .len()
            .checked_sub(1)
            .ok_or("offsets is empty")?;
        let per_row = [
            ("group_id", self.group_id.len()),
            ("sample_index", self.sample_index.len()),
            ("policy_version", self.policy_version.len()),
            ("rewards", self.rewards.len()),
            ("num_turns", self.num_turns.len()),
            ("stop_reason", self.stop_reason.len()),
            ("prompt_len", self.prompt_len.len()),
            ("branch_parent", self.branch_parent.len()),
            ("branch_turn", self.branch_turn.len()),
            ("branch_pos", self.branch_pos.len()),
            ("turn_offsets", self.turn_offsets.len().saturating_sub(1)),
        ];
        if let Some((name, len)) = per_row.iter().find(|(_, len)| *len != n) {
            return Err(format!("{name} has {len} rows, offsets {n}"));
        }
        if self.turn_offsets.is_empty() {
            return Err("turn_offsets is empty".into());
        }
        if self.loss_mask.len() != self.logprobs.len() {
            return Err("loss_mask and logprobs differ in length".into());
        }
        let within = |offs: &[i64], len: usize| {
            offs.first() == Some(&0)
                && offs.windows(2).all(|w| w[0] <= w[1])
                && offs.last().is_some_and(|&z| z as usize <= len)
        };
        if !within(self.offsets, self.loss_mask.len()) {
            return Err("offsets must rise from 0 within the token buffers".into());
        }
        if !within(self.turn_offsets, self.turn_rewards.len()) {
            return Err("turn_offsets must rise from 0 within turn_rewards".into());
        }
        Ok(n)
    }
}

/// A Python `PackedBatch`'s rows as `TrajectoryRow`s (row `i`'s `key` is `i`): what
/// `TrajectoryStore.drain_rows` gives for the store's own rows, for a batch that came
/// from elsewhere (a Ray worker's message, a Parquet shard). A `ValueError` names the
/// first inconsistent column.
#[pyfunction]
fn packed_rows<'py>(
    py: Python<'py>,
    batch: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, pyo3::types::PyList>> {
    fn col<'py, T: Element + Copy>(b: &Bound<'py, PyAny>, name: &str) -> PyResult<Vec<T>> {
        let arr = b.getattr(name)?;
        let arr = arr.extract::<PyReadonlyArray1<'_, T>>().map_err(|_| {
            PyValueError::new_err(format!(
                "packed batch field {name:?} must be a 1-D numpy array of {}",
                std::any::type_name::<T>()
            ))
        })?;
        Ok(owned(&arr))
    }
    let (group_id, sample_index, policy_version) = (
        col::<u64>(batch, "group_id")?,
        col::<u32>(batch, "sample_index")?,
        col::<u32>(batch, "policy_version")?,
    );
    let (offsets, loss_mask, logprobs) = (
        col::<i64>(batch, "offsets")?,
        col::<u8>(batch, "loss_mask")?,
        col::<f32>(batch, "logprobs")?,
    );
    let (rewards, turn_rewards, turn_offsets) = (
        col::<f32>(batch, "rewards")?,
        col::<f32>(batch, "turn_rewards")?,
        col::<i64>(batch, "turn_offsets")?,
    );
    let (num_turns, stop_reason, prompt_len) = (
        col::<u32>(batch, "num_turns")?,
        col::<u8>(batch, "stop_reason")?,
        col::<u32>(batch, "prompt_len")?,
    );
    let (branch_parent, branch_turn, branch_pos) = (
        col::<u32>(batch, "branch_parent")?,
        col::<u32>(batch, "branch_turn")?,
        col::<u32>(batch, "branch_pos")?,
    );
    rows_list(
        py,
        &Columns {
            keys: None,
            group_id: &group_id,
            sample_index: &sample_index,
            policy_version: &policy_version,
            offsets: &offsets,
            loss_mask: &loss_mask,
            logprobs: &logprobs,
            rewards: &rewards,
            turn_rewards: &turn_rewards,
            turn_offsets: &turn_offsets,
            num_turns: &num_turns,
            stop_reason: &stop_reason,
            prompt_len: &prompt_len,
            branch_parent: &branch_parent,
            branch_turn: &branch_turn,
            branch_pos: &branch_pos,
        },
    )
}

/// The `TrajectoryRow`s of packed columns.
fn rows_list<'py>(py: Python<'py>, c: &Columns<'_>) -> PyResult<Bound<'py, pyo3::types::PyList>> {
    let n = c.check().map_err(PyValueError::new_err)?;
    let zero = pyo3::types::PyFloat::new(py, 0.0).into_any();
    let floats = |vals: &[f32]| -> PyResult<Bound<'py, pyo3::types::PyList>> {
        let list = shared_zero_floats(&zero, vals.iter().copied())?;
        crate::turn::untrack(&list);
        Ok(list)
    };
    let rows = (0..n)
        .map(|i| {
            let (a, z) = (c.offsets[i] as usize, c.offsets[i + 1] as usize);
            let (ta, tz) = (c.turn_offsets[i] as usize, c.turn_offsets[i + 1] as usize);
            let mask = pyo3::types::PyList::new(py, &c.loss_mask[a..z])?;
            crate::turn::untrack(&mask);
            Bound::new(
                py,
                PyTrajectoryRow {
                    key: c.keys.map_or(i as u64, |k| k[i]),
                    group_id: c.group_id[i],
                    sample_index: c.sample_index[i],
                    policy_version: c.policy_version[i],
                    prompt_len: c.prompt_len[i],
                    loss_mask: mask.unbind(),
                    logprobs: floats(&c.logprobs[a..z])?.unbind(),
                    turn_rewards: floats(&c.turn_rewards[ta..tz])?.unbind(),
                    reward: c.rewards[i],
                    num_turns: c.num_turns[i],
                    stop_reason: c.stop_reason[i],
                    branch_parent: c.branch_parent[i],
                    branch_turn: c.branch_turn[i],
                    branch_pos: c.branch_pos[i],
                },
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    pyo3::types::PyList::new(py, rows)
}
