//! `_core.TurnCodec`: one rollout turn of many episodes in one call (decode, parse, env
//! step, templated observation tokens, trajectory appends), with the GIL released.

use crate::batch::list_item;
use crate::errors::to_py;
use crate::parse::parser;
use crate::pool::PyEnvPool;
use crate::trajectory::PyTrajectoryStore;
use agentgym_core::parse::DEFAULT_MAX_CHARS;
use agentgym_core::turn::{TurnCodec, TurnInput, TurnOutput};
use numpy::{IntoPyArray, PyArray1};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use pyo3::Borrowed;

type TurnResult<'py> = (
    Bound<'py, PyArray1<f32>>,
    Bound<'py, PyArray1<i8>>,
    Vec<(usize, String)>,
    Bound<'py, PyList>,
);

/// `(stopped, errors)` of `step_turn_batch`: `(i, stop code)` and `(i, message)` rows.
type BatchResult = (Vec<(usize, u8)>, Vec<(usize, String)>);

/// Token ids above this are converted without the shared-int cache.
const INT_CACHE_MAX: usize = 1 << 20;

#[pyclass(name = "TurnCodec", module = "agentgym._core")]
pub struct PyTurnCodec {
    inner: TurnCodec,
    /// One Python int per token id seen, shared by every list of ids this codec returns:
    /// contexts hold pointers to a few hundred objects instead of one new int per token
    /// (less memory, fewer allocations, and the cyclic GC scans hot objects).
    ints: Vec<Option<Py<PyAny>>>,
}

impl PyTurnCodec {
    /// The shared int object of token id `t`.
    fn int<'py>(&mut self, py: Python<'py>, t: u32) -> PyResult<Bound<'py, PyAny>> {
        let i = t as usize;
        if i >= INT_CACHE_MAX {
            return Ok(t.into_pyobject(py)?.into_any());
        }
        if i >= self.ints.len() {
            self.ints.resize_with(i + 1, || None);
        }
        Ok(match &self.ints[i] {
            Some(o) => o.bind(py).clone(),
            None => {
                let o = t.into_pyobject(py)?.into_any();
                self.ints[i] = Some(o.clone().unbind());
                o
            }
        })
    }

    fn int_list<'py>(&mut self, py: Python<'py>, ids: &[u32]) -> PyResult<Bound<'py, PyList>> {
        let items = ids
            .iter()
            .map(|&t| self.int(py, t))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// `list.extend(ids)` with the shared int objects.
    fn extend_ints(&mut self, list: &Bound<'_, PyList>, ids: &[u32]) -> PyResult<()> {
        for &t in ids {
            list.append(self.int(list.py(), t)?)?;
        }
        Ok(())
    }
}

/// Takes a list that holds only ints or floats off the cyclic GC's books: it can never be
/// part of a reference cycle, and the collector would otherwise visit each of its items in
/// every collection of its generation (a context holds thousands of token ids).
pub(crate) fn untrack(list: &Bound<'_, PyList>) {
    // SAFETY: `list` is a valid list object and we are attached. `PyObject_GC_UnTrack` is
    // idempotent (list deallocation calls it again) and only stops the collector from
    // traversing the list; a list of atomic objects has no references for it to follow.
    unsafe { pyo3::ffi::PyObject_GC_UnTrack(list.as_ptr().cast()) }
}

/// One row of `step_turn_batch`, read from a tuple `(key, slot, tokens, logprobs, ended,
/// context, ...)`.
struct TurnRow {
    key: u64,
    slot: usize,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    ended: bool,
}

impl TurnRow {
    /// The row and its context list.
    fn extract<'py>(row: Borrowed<'_, 'py, PyAny>) -> PyResult<(Self, Bound<'py, PyList>)> {
        let t = row.cast::<PyTuple>().map_err(|_| {
            PyTypeError::new_err(
                "each turn must be a tuple (key, slot, tokens, logprobs, ended, context, ...)",
            )
        })?;
        if t.len() < 6 {
            return Err(PyValueError::new_err(format!(
                "a turn tuple needs 6 items (key, slot, tokens, logprobs, ended, context), got {}",
                t.len()
            )));
        }
        let logprobs = t.get_borrowed_item(3)?;
        let context = t
            .get_borrowed_item(5)?
            .cast::<PyList>()
            .map_err(|_| PyTypeError::new_err("a turn's context must be a list of token ids"))?
            .to_owned();
        let row = Self {
            key: t.get_borrowed_item(0)?.extract()?,
            slot: t.get_borrowed_item(1)?.extract()?,
            tokens: t.get_borrowed_item(2)?.extract()?,
            logprobs: if logprobs.is_none() {
                Vec::new()
            } else {
                logprobs.extract()?
            },
            ended: t.get_borrowed_item(4)?.extract()?,
        };
        Ok((row, context))
    }
}

/// The core turn over `rows`, with the GIL released.
fn run_turns(
    py: Python<'_>,
    codec: &mut TurnCodec,
    pool: &mut PyEnvPool,
    store: &mut PyTrajectoryStore,
    rows: &[TurnRow],
    max_total_tokens: usize,
) -> PyResult<TurnOutput> {
    let (pool, store) = (&mut pool.inner, &mut store.inner);
    py.detach(|| {
        let inputs: Vec<TurnInput> = rows
            .iter()
            .map(|r| TurnInput {
                key: r.key,
                slot: r.slot,
                tokens: &r.tokens,
                logprobs: &r.logprobs,
                ended: r.ended,
            })
            .collect();
        codec.step_turns(pool, store, &inputs, max_total_tokens)
    })
    .map_err(to_py)
}

/// `(i, message)` of the episodes that have an error message.
fn error_rows(errors: Vec<Option<String>>) -> Vec<(usize, String)> {
    errors
        .into_iter()
        .enumerate()
        .filter_map(|(i, e)| e.map(|m| (i, m)))
        .collect()
}

#[pymethods]
impl PyTurnCodec {
    /// `tokenizer_json`: a Hugging Face `tokenizer.json` (e.g. `backend_tokenizer.to_str()`);
    /// `obs_prefix`/`obs_suffix`: the chat template's text around a user turn (up to the
    /// next assistant header); `end_of_turn`: the token id that ends an assistant message.
    #[new]
    #[pyo3(signature = (tokenizer_json, obs_prefix, obs_suffix, end_of_turn,
                        action_format = "auto", max_action_chars = DEFAULT_MAX_CHARS))]
    fn new(
        tokenizer_json: &str,
        obs_prefix: &str,
        obs_suffix: &str,
        end_of_turn: u32,
        action_format: &str,
        max_action_chars: usize,
    ) -> PyResult<Self> {
        let p = parser(action_format, max_action_chars)?;
        let inner = TurnCodec::new(tokenizer_json, obs_prefix, obs_suffix, end_of_turn, p)
            .map_err(to_py)?;
        Ok(Self {
            inner,
            ints: Vec::new(),
        })
    }

    #[getter]
    fn end_of_turn(&self) -> u32 {
        self.inner.end_of_turn()
    }

    #[getter]
    fn action_format(&self) -> &'static str {
        self.inner.parser().format.as_str()
    }

    /// Change the action format (and cap) used by `actions` and `step_turns`.
    #[pyo3(signature = (action_format, max_action_chars = DEFAULT_MAX_CHARS))]
    fn set_action_format(&mut self, action_format: &str, max_action_chars: usize) -> PyResult<()> {
        self.inner
            .set_parser(parser(action_format, max_action_chars)?);
        Ok(())
    }

    /// Number of memoised observations.
    #[getter]
    fn cached(&self) -> usize {
        self.inner.cached()
    }

    fn encode(&self, py: Python<'_>, text: &str) -> PyResult<Vec<u32>> {
        let inner = &self.inner;
        py.detach(|| inner.encode(text)).map_err(to_py)
    }

    fn decode(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<String> {
        let inner = &self.inner;
        py.detach(|| inner.decode(&ids)).map_err(to_py)
    }

    /// The action of each reply ("" where none parses): decoded and parsed in parallel.
    fn actions(&self, py: Python<'_>, replies: Vec<Vec<u32>>) -> PyResult<Vec<String>> {
        let inner = &self.inner;
        py.detach(|| {
            let refs: Vec<&[u32]> = replies.iter().map(Vec::as_slice).collect();
            inner.actions(&refs)
        })
        .map_err(to_py)
    }

    /// Token ids of each observation as a templated user turn (memoised).
    fn observation_ids<'py>(
        &mut self,
        py: Python<'py>,
        observations: Vec<String>,
    ) -> PyResult<Vec<Bound<'py, PyList>>> {
        let inner = &mut self.inner;
        let ids = py
            .detach(|| {
                let refs: Vec<&str> = observations.iter().map(String::as_str).collect();
                inner.observation_ids(&refs).map(|(ids, _)| ids)
            })
            .map_err(to_py)?;
        ids.iter().map(|a| self.int_list(py, a)).collect()
    }

    /// One turn of many episodes. Returns `(rewards float32[n], stop int8[n], errors,
    /// appended)`: `stop[i]` is -1 while episode i goes on, else its `StopReason` code
    /// (index into `STOP_REASONS`); `errors` lists `(i, message)` of `env_error` episodes;
    /// `appended[i]` are the tokens added to episode i's context this turn.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (pool, store, keys, slots, tokens, ended, max_total_tokens,
                        logprobs = None))]
    fn step_turns<'py>(
        &mut self,
        py: Python<'py>,
        mut pool: PyRefMut<'py, PyEnvPool>,
        mut store: PyRefMut<'py, PyTrajectoryStore>,
        keys: Vec<u64>,
        slots: Vec<usize>,
        tokens: Vec<Vec<u32>>,
        ended: Vec<bool>,
        max_total_tokens: usize,
        logprobs: Option<Vec<Vec<f32>>>,
    ) -> PyResult<TurnResult<'py>> {
        let n = keys.len();
        let lp_len = logprobs.as_ref().map_or(n, Vec::len);
        if slots.len() != n || tokens.len() != n || ended.len() != n || lp_len != n {
            return Err(PyValueError::new_err(format!(
                "step_turns got {n} keys, {} slots, {} token lists, {} ended flags and {lp_len} \
                 logprob lists; lengths must match",
                slots.len(),
                tokens.len(),
                ended.len()
            )));
        }
        let mut logprobs = logprobs.map(Vec::into_iter);
        let rows: Vec<TurnRow> = keys
            .into_iter()
            .zip(slots)
            .zip(tokens)
            .zip(ended)
            .map(|(((key, slot), tokens), ended)| TurnRow {
                key,
                slot,
                tokens,
                logprobs: logprobs
                    .as_mut()
                    .and_then(Iterator::next)
                    .unwrap_or_default(),
                ended,
            })
            .collect();
        let out = run_turns(
            py,
            &mut self.inner,
            &mut pool,
            &mut store,
            &rows,
            max_total_tokens,
        )?;
        let stop: Vec<i8> = out.stop.iter().map(|s| s.map_or(-1, |r| r as i8)).collect();
        let appended = out
            .appended
            .iter()
            .map(|a| self.int_list(py, a))
            .collect::<PyResult<Vec<_>>>()?;
        Ok((
            out.rewards.into_pyarray(py),
            stop.into_pyarray(py),
            error_rows(out.errors),
            PyList::new(py, appended)?,
        ))
    }

    /// The first prompt of many episodes: `head` (the conversation's token ids before the
    /// first user turn) followed by each observation as a templated user turn, appended to
    /// the store as episode `keys[i]`'s prompt (mask 0) and returned as one list of token
    /// ids per episode. Every key must be live in the store; a failing call changes nothing.
    fn prompts<'py>(
        &mut self,
        py: Python<'py>,
        mut store: PyRefMut<'py, PyTrajectoryStore>,
        keys: Vec<u64>,
        head: Vec<u32>,
        observations: Vec<String>,
    ) -> PyResult<Vec<Bound<'py, PyList>>> {
        if keys.len() != observations.len() {
            return Err(PyValueError::new_err(format!(
                "prompts got {} keys and {} observations; lengths must match",
                keys.len(),
                observations.len()
            )));
        }
        let inner = &mut self.inner;
        let store = &mut store.inner;
        let flat = py
            .detach(|| -> agentgym_core::Result<(Vec<u32>, Vec<i64>)> {
                let refs: Vec<&str> = observations.iter().map(String::as_str).collect();
                let (ids, _) = inner.observation_ids(&refs)?;
                let mut flat = Vec::with_capacity(ids.iter().map(|o| head.len() + o.len()).sum());
                let mut offsets = Vec::with_capacity(ids.len() + 1);
                offsets.push(0i64);
                for o in &ids {
                    flat.extend_from_slice(&head);
                    flat.extend_from_slice(o);
                    offsets.push(flat.len() as i64);
                }
                let model = vec![false; keys.len()];
                store.append_batch(&keys, &flat, &offsets, &model, &[])?;
                Ok((flat, offsets))
            })
            .map_err(to_py)?;
        let (flat, offsets) = flat;
        offsets
            .windows(2)
            .map(|w| {
                let list = self.int_list(py, &flat[w[0] as usize..w[1] as usize])?;
                untrack(&list);
                Ok(list)
            })
            .collect()
    }

    /// `step_turns` for an engine that keeps each episode's context as a Python list:
    /// `turns` are tuples `(key, slot, tokens, logprobs, ended, context, ...)` (extra items
    /// are ignored; `logprobs` may be None). Each `context` list is extended in place with
    /// exactly the tokens appended to the store (reply, closing end-of-turn token where the
    /// model did not emit it, templated observation). Returns `(stopped, errors)`:
    /// `(i, code)` for each episode that ended this turn (`code` indexes `STOP_REASONS`) and
    /// `(i, message)` of `env_error` episodes. A failing call changes nothing.
    fn step_turn_batch<'py>(
        &mut self,
        py: Python<'py>,
        mut pool: PyRefMut<'py, PyEnvPool>,
        mut store: PyRefMut<'py, PyTrajectoryStore>,
        turns: &Bound<'py, PyList>,
        max_total_tokens: usize,
    ) -> PyResult<BatchResult> {
        let mut rows = Vec::with_capacity(turns.len());
        let mut contexts = Vec::with_capacity(turns.len());
        let mut i = 0;
        while i < turns.len() {
            let (row, context) = TurnRow::extract(list_item(turns, i)?)?;
            rows.push(row);
            contexts.push(context);
            i += 1;
        }
        let out = run_turns(
            py,
            &mut self.inner,
            &mut pool,
            &mut store,
            &rows,
            max_total_tokens,
        )?;
        for (context, tail) in contexts.iter().zip(&out.appended) {
            self.extend_ints(context, tail)?;
        }
        let stopped = out
            .stop
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|r| (i, r as u8)))
            .collect();
        Ok((stopped, error_rows(out.errors)))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTurnCodec>()?;
    Ok(())
}
