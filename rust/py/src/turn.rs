//! `_core.TurnCodec`: one rollout turn of many episodes in one call (decode, parse, env
//! step, templated observation tokens, trajectory appends), with the GIL released.
//!
//! A turn row is the engine's `agentgym.engine.orchestrator.Turn` record, a named tuple
//! whose first six fields are read by position: `(key, slot, tokens, logprobs, ended,
//! context, ...)`.

use crate::batch::list_item;
use crate::errors::to_py;
use crate::parse::parser;
use crate::pool::PyEnvPool;
use crate::trajectory::PyTrajectoryStore;
use agentgym_core::episode::StopReason;
use agentgym_core::parse::DEFAULT_MAX_CHARS;
use agentgym_core::turn::{StepResult, TurnCodec, TurnInput, TurnOutput};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use pyo3::Borrowed;

/// `(stopped, errors)` of `step_turn_batch` and `record_turn_batch`: `(i, stop code)` and `(i, message)` rows.
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

/// One row of a turn batch, read from a `Turn` record `(key, slot, tokens, logprobs, ended,
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

fn inputs(rows: &[TurnRow]) -> Vec<TurnInput<'_>> {
    rows.iter()
        .map(|r| TurnInput {
            key: r.key,
            slot: r.slot,
            tokens: &r.tokens,
            logprobs: &r.logprobs,
            ended: r.ended,
        })
        .collect()
}

/// The rows of a turn batch and their context lists.
fn extract_rows<'py>(
    turns: &Bound<'py, PyList>,
) -> PyResult<(Vec<TurnRow>, Vec<Bound<'py, PyList>>)> {
    let mut rows = Vec::with_capacity(turns.len());
    let mut contexts = Vec::with_capacity(turns.len());
    let mut i = 0;
    while i < turns.len() {
        let (row, context) = TurnRow::extract(list_item(turns, i)?)?;
        rows.push(row);
        contexts.push(context);
        i += 1;
    }
    Ok((rows, contexts))
}

/// One env step result, read from a `StepOutcome` (`observation`, `reward`, `stop_reason`,
/// `error` attributes).
struct OutcomeRow {
    observation: String,
    reward: f32,
    stop: Option<StopReason>,
    error: Option<String>,
}

impl OutcomeRow {
    fn extract(outcome: &Bound<'_, PyAny>) -> PyResult<Self> {
        let stop: Option<String> = outcome
            .getattr(intern!(outcome.py(), "stop_reason"))?
            .extract()?;
        let stop =
            match stop {
                None => None,
                Some(name) => Some(StopReason::parse(&name).ok_or_else(|| {
                    PyValueError::new_err(format!("unknown stop reason {name:?}"))
                })?),
            };
        Ok(Self {
            observation: outcome
                .getattr(intern!(outcome.py(), "observation"))?
                .extract()?,
            reward: outcome
                .getattr(intern!(outcome.py(), "reward"))?
                .extract()?,
            stop,
            error: outcome.getattr(intern!(outcome.py(), "error"))?.extract()?,
        })
    }
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

    /// Change the action format (and cap) used by `actions` and `step_turn_batch`.
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

    /// Bytes the observation cache holds (texts, token ids, per-entry overhead).
    #[getter]
    fn cache_bytes(&self) -> usize {
        self.inner.cache_bytes()
    }

    /// The cache's bound in bytes (default 16 MiB); a cache above a lowered bound is
    /// emptied.
    #[getter]
    fn get_cache_max_bytes(&self) -> usize {
        self.inner.cache_max_bytes()
    }

    #[setter]
    fn set_cache_max_bytes(&mut self, max_bytes: usize) {
        self.inner.set_cache_max_bytes(max_bytes);
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

    /// One turn of many episodes of the native env in `pool`: each reply decoded and its
    /// action parsed, the envs stepped, and reply, closing end-of-turn token (where the model
    /// did not emit it), reward and templated observation appended to the store, with the
    /// GIL released. `turns` are `Turn` records `(key, slot, tokens, logprobs, ended,
    /// context, ...)` (extra fields are ignored; `logprobs` may be None). Each `context`
    /// list is extended in place with exactly the tokens appended to the store. Returns
    /// `(stopped, errors)`: `(i, code)` for each episode that ended this turn (`code`
    /// indexes `STOP_REASONS`) and `(i, message)` of `env_error` episodes. A failing call
    /// changes nothing.
    fn step_turn_batch<'py>(
        &mut self,
        py: Python<'py>,
        mut pool: PyRefMut<'py, PyEnvPool>,
        mut store: PyRefMut<'py, PyTrajectoryStore>,
        turns: &Bound<'py, PyList>,
        max_total_tokens: usize,
    ) -> PyResult<BatchResult> {
        let (rows, contexts) = extract_rows(turns)?;
        let (codec, pool, store) = (&mut self.inner, &mut pool.inner, &mut store.inner);
        let out = py
            .detach(|| codec.step_turns(pool, store, &inputs(&rows), max_total_tokens))
            .map_err(to_py)?;
        self.finish_batch(&contexts, out)
    }

    /// `step_turn_batch` for an env its driver stepped: `outcomes[i]` (a `StepOutcome`:
    /// `observation`, `reward`, `stop_reason`, `error`) is what the env did with the action
    /// of `turns[i]`. The same bookkeeping, the same result; a failing call changes nothing.
    fn record_turn_batch<'py>(
        &mut self,
        py: Python<'py>,
        mut store: PyRefMut<'py, PyTrajectoryStore>,
        turns: &Bound<'py, PyList>,
        outcomes: &Bound<'py, PyList>,
        max_total_tokens: usize,
    ) -> PyResult<BatchResult> {
        let (rows, contexts) = extract_rows(turns)?;
        let results: Vec<OutcomeRow> = outcomes
            .iter()
            .map(|o| OutcomeRow::extract(&o))
            .collect::<PyResult<_>>()?;
        let (codec, store) = (&mut self.inner, &mut store.inner);
        let out = py
            .detach(|| {
                let results: Vec<StepResult> = results
                    .iter()
                    .map(|r| StepResult {
                        observation: &r.observation,
                        reward: r.reward,
                        stop: r.stop,
                        error: r.error.as_deref(),
                    })
                    .collect();
                codec.record_turns(store, &inputs(&rows), &results, max_total_tokens)
            })
            .map_err(to_py)?;
        self.finish_batch(&contexts, out)
    }
}

impl PyTurnCodec {
    /// Extend each context with its appended tokens; the `(stopped, errors)` rows.
    fn finish_batch(
        &mut self,
        contexts: &[Bound<'_, PyList>],
        out: TurnOutput,
    ) -> PyResult<BatchResult> {
        for (context, tail) in contexts.iter().zip(&out.appended) {
            self.extend_ints(context, tail)?;
        }
        let stopped = out
            .stop
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|r| (i, r as u8)))
            .collect();
        let errors = out
            .errors
            .into_iter()
            .enumerate()
            .filter_map(|(i, e)| e.map(|m| (i, m)))
            .collect();
        Ok((stopped, errors))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTurnCodec>()?;
    Ok(())
}
