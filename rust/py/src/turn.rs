//! `_core.TurnCodec`: one rollout turn of many episodes in one call (decode, parse, env
//! step, templated observation tokens, trajectory appends), with the GIL released.

use crate::errors::to_py;
use crate::parse::parser;
use crate::pool::PyEnvPool;
use crate::trajectory::PyTrajectoryStore;
use agentgym_core::parse::DEFAULT_MAX_CHARS;
use agentgym_core::turn::{TurnCodec, TurnInput};
use numpy::{IntoPyArray, PyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;

type TurnResult<'py> = (
    Bound<'py, PyArray1<f32>>,
    Bound<'py, PyArray1<i8>>,
    Vec<(usize, String)>,
    Bound<'py, PyList>,
);

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
    fn int_list<'py>(&mut self, py: Python<'py>, ids: &[u32]) -> PyResult<Bound<'py, PyList>> {
        let mut items = Vec::with_capacity(ids.len());
        for &t in ids {
            let i = t as usize;
            if i >= INT_CACHE_MAX {
                items.push(t.into_pyobject(py)?.into_any());
                continue;
            }
            if i >= self.ints.len() {
                self.ints.resize_with(i + 1, || None);
            }
            let obj = match &self.ints[i] {
                Some(o) => o.bind(py).clone(),
                None => {
                    let o = t.into_pyobject(py)?.into_any();
                    self.ints[i] = Some(o.clone().unbind());
                    o
                }
            };
            items.push(obj);
        }
        PyList::new(py, items)
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
        let inner = &mut self.inner;
        let pool = &mut pool.inner;
        let store = &mut store.inner;
        let out = py
            .detach(|| {
                let inputs: Vec<TurnInput> = (0..n)
                    .map(|i| TurnInput {
                        key: keys[i],
                        slot: slots[i],
                        tokens: &tokens[i],
                        logprobs: logprobs.as_ref().map_or(&[][..], |l| &l[i]),
                        ended: ended[i],
                    })
                    .collect();
                inner.step_turns(pool, store, &inputs, max_total_tokens)
            })
            .map_err(to_py)?;
        let stop: Vec<i8> = out.stop.iter().map(|s| s.map_or(-1, |r| r as i8)).collect();
        let errors = out
            .errors
            .into_iter()
            .enumerate()
            .filter_map(|(i, e)| e.map(|m| (i, m)))
            .collect();
        let appended = out
            .appended
            .iter()
            .map(|a| self.int_list(py, a))
            .collect::<PyResult<Vec<_>>>()?;
        Ok((
            out.rewards.into_pyarray(py),
            stop.into_pyarray(py),
            errors,
            PyList::new(py, appended)?,
        ))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTurnCodec>()?;
    Ok(())
}
