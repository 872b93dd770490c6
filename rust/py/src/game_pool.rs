//! `_core.GamePool`: many episodes of one native multi-seat game, reset and stepped in
//! batches with the GIL released ([`agentgym_core::game_pool::GamePool`]); what the rollout
//! engine's self-play path drives. Each row's result is a view tuple `(to_move,
//! observations, over, rewards, refused)` or, for a row whose game panicked or refused its
//! task, the named exception (returned, not raised: one bad game never sinks a batch). A
//! malformed batch raises before any game moves.

use crate::errors::to_py;
use crate::pool::{parse_kwargs, TaskArg};
use agentgym_core::error::Result as CoreResult;
use agentgym_core::game_pool::{GamePool, GameView};
use agentgym_core::Task;
use pyo3::prelude::*;

#[pyclass(name = "GamePool", module = "agentgym._core")]
pub struct PyGamePool {
    inner: GamePool,
}

fn rows(py: Python<'_>, out: Vec<CoreResult<GameView>>) -> Vec<Py<PyAny>> {
    out.into_iter()
        .map(|r| match r {
            Ok(v) => (v.to_move, v.observations, v.over, v.rewards, v.refused)
                .into_pyobject(py)
                .expect("a tuple of lists converts")
                .into_any()
                .unbind(),
            Err(e) => to_py(e).into_value(py).into_any(),
        })
        .collect()
}

#[pymethods]
impl PyGamePool {
    #[new]
    #[pyo3(signature = (game_id, num_slots, kwargs_json = "{}"))]
    fn new(game_id: &str, num_slots: usize, kwargs_json: &str) -> PyResult<Self> {
        let inner = GamePool::new(game_id, num_slots, parse_kwargs(kwargs_json)?).map_err(to_py)?;
        Ok(Self { inner })
    }

    #[getter]
    fn game_id(&self) -> &str {
        self.inner.game_id()
    }

    #[getter]
    fn seats(&self) -> usize {
        self.inner.seats()
    }

    /// Each seat's role.
    #[getter]
    fn roles(&self) -> Vec<String> {
        self.inner.roles().to_vec()
    }

    /// Each seat's system prompt.
    #[getter]
    fn instructions(&self) -> Vec<String> {
        self.inner.instructions().to_vec()
    }

    #[getter]
    fn num_tasks(&self) -> u64 {
        self.inner.num_tasks()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// Start a game in each slot of `slots` with its task and seed; per row, its first view
    /// or the exception that kept it from starting.
    fn reset(
        &mut self,
        py: Python<'_>,
        slots: Vec<usize>,
        tasks: Vec<TaskArg>,
        seeds: Vec<u64>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        if tasks.len() != slots.len() || seeds.len() != slots.len() {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "{} slots, {} tasks and {} seeds",
                slots.len(),
                tasks.len(),
                seeds.len()
            )));
        }
        let batch: Vec<(usize, Task, u64)> = slots
            .into_iter()
            .zip(tasks)
            .zip(seeds)
            .map(|((s, t), seed)| (s, Task::from(t), seed))
            .collect();
        let inner = &mut self.inner;
        let out = py.detach(|| inner.reset(&batch)).map_err(to_py)?;
        Ok(rows(py, out))
    }

    /// One move list per slot (one move per seat to move, in `to_move` order); per row, its
    /// view after the step or the exception of a game that panicked.
    fn step(
        &mut self,
        py: Python<'_>,
        slots: Vec<usize>,
        moves: Vec<Vec<String>>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        if moves.len() != slots.len() {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "{} slots and {} move lists",
                slots.len(),
                moves.len()
            )));
        }
        let batch: Vec<(usize, Vec<String>)> = slots.into_iter().zip(moves).collect();
        let inner = &mut self.inner;
        let out = py.detach(|| inner.step(&batch)).map_err(to_py)?;
        Ok(rows(py, out))
    }

    /// The reference strategy's action for each `(slot, seat)` (None where it is not to
    /// move).
    fn oracle_actions(
        &self,
        py: Python<'_>,
        slots: Vec<usize>,
        seats: Vec<usize>,
    ) -> PyResult<Vec<Option<String>>> {
        let batch: Vec<(usize, usize)> = slots.into_iter().zip(seats).collect();
        let inner = &self.inner;
        py.detach(|| inner.oracle_actions(&batch)).map_err(to_py)
    }

    /// The legal actions of `seat` in `slot` now.
    fn valid_actions(&self, slot: usize, seat: usize) -> PyResult<Vec<String>> {
        self.inner.valid_actions(slot, seat).map_err(to_py)
    }

    /// End the games of `slots`.
    fn finish(&mut self, slots: Vec<usize>) -> PyResult<()> {
        self.inner.finish(&slots).map_err(to_py)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGamePool>()
}
