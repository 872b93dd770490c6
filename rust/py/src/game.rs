//! `Game`: one native multi-seat game ([`agentgym_core::game::Game`]) for Python, what the
//! PettingZoo AEC view (`agentgym.envs.games`) plays. A seat out of range or a move list of
//! the wrong length raises `ValueError`/`IndexError`; a panic inside the game raises
//! `EnvError` and leaves the game over; nothing panics across the FFI.

use crate::errors::{to_py, EnvError};
use crate::pool::parse_kwargs;
use agentgym_core::env::Task;
use agentgym_core::game::Game;
use agentgym_core::games::{make_game, specs};
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};

#[pyclass(name = "Game", module = "agentgym._core")]
pub struct PyGame {
    inner: Box<dyn Game>,
    id: String,
    /// A panic ended the game: every call but `reset` refuses until the next reset.
    broken: bool,
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

impl PyGame {
    fn seat(&self, seat: usize) -> PyResult<usize> {
        let n = self.inner.seats();
        if seat >= n {
            return Err(PyIndexError::new_err(format!(
                "seat {seat} out of range: {} has {n} seats",
                self.id
            )));
        }
        Ok(seat)
    }

    fn live(&self) -> PyResult<()> {
        if self.broken {
            return Err(EnvError::new_err(format!(
                "{} failed in its last call; reset it first",
                self.id
            )));
        }
        Ok(())
    }

    fn guard<T>(&mut self, f: impl FnOnce(&mut dyn Game) -> T) -> PyResult<T> {
        match catch_unwind(AssertUnwindSafe(|| f(self.inner.as_mut()))) {
            Ok(v) => Ok(v),
            Err(p) => {
                self.broken = true;
                Err(EnvError::new_err(format!(
                    "{} panicked: {}",
                    self.id,
                    panic_message(p)
                )))
            }
        }
    }
}

#[pymethods]
impl PyGame {
    #[new]
    #[pyo3(signature = (game_id, kwargs_json = "{}"))]
    fn new(game_id: &str, kwargs_json: &str) -> PyResult<Self> {
        let inner = make_game(game_id, &parse_kwargs(kwargs_json)?).map_err(to_py)?;
        Ok(Self {
            inner,
            id: game_id.to_string(),
            broken: false,
        })
    }

    /// The game's id.
    #[getter]
    fn game_id(&self) -> &str {
        &self.id
    }

    /// Seats of every episode.
    #[getter]
    fn seats(&self) -> usize {
        self.inner.seats()
    }

    /// Seat `seat`'s role.
    fn role(&self, seat: usize) -> PyResult<String> {
        Ok(self.inner.role(self.seat(seat)?))
    }

    /// Number of indexed tasks (openings, deals).
    #[getter]
    fn num_tasks(&self) -> u64 {
        self.inner.num_tasks()
    }

    /// Start an episode of task `task` with `seed`.
    #[pyo3(signature = (task, seed = 0))]
    fn reset(&mut self, task: u64, seed: u64) -> PyResult<()> {
        self.broken = false;
        self.guard(|g| g.reset(&Task::Index(task), seed))?
            .map_err(to_py)
    }

    /// The seats that move now (empty once over).
    fn to_move(&self) -> PyResult<Vec<usize>> {
        self.live()?;
        Ok(self.inner.to_move())
    }

    /// The game has ended.
    #[getter]
    fn over(&self) -> bool {
        self.broken || self.inner.over()
    }

    /// What seat `seat` sees now.
    fn observation(&self, seat: usize) -> PyResult<String> {
        self.live()?;
        Ok(self.inner.observation(self.seat(seat)?))
    }

    /// One action per seat to move, in `to_move()` order; returns `(refused, over)`.
    fn step(&mut self, moves: Vec<String>) -> PyResult<(Vec<bool>, bool)> {
        self.live()?;
        let movers = self.inner.to_move();
        if movers.is_empty() {
            return Err(PyValueError::new_err(format!(
                "{}: the game is over; reset it before stepping",
                self.id
            )));
        }
        if moves.len() != movers.len() {
            return Err(PyValueError::new_err(format!(
                "{}: {} seat(s) to move ({movers:?}), got {} move(s)",
                self.id,
                movers.len(),
                moves.len()
            )));
        }
        let refs: Vec<&str> = moves.iter().map(String::as_str).collect();
        let step = self.guard(|g| g.step(&refs))?;
        Ok((step.refused, step.over))
    }

    /// Each seat's return so far.
    fn rewards(&self) -> PyResult<Vec<f32>> {
        self.live()?;
        Ok(self.inner.rewards())
    }

    /// The legal actions of seat `seat` now.
    fn valid_actions(&self, seat: usize) -> PyResult<Vec<String>> {
        self.live()?;
        Ok(self.inner.valid_actions(self.seat(seat)?))
    }

    /// The reference strategy's action for seat `seat` (None when it is not to move).
    fn oracle_action(&self, seat: usize) -> PyResult<Option<String>> {
        self.live()?;
        Ok(self.inner.oracle_action(self.seat(seat)?))
    }

    /// Seat `seat`'s system prompt.
    fn instructions(&self, seat: usize) -> PyResult<String> {
        Ok(self.inner.instructions(self.seat(seat)?))
    }

    /// An independent copy of the whole state.
    fn snapshot(&self) -> PyResult<Self> {
        self.live()?;
        let inner = self.inner.snapshot().ok_or_else(|| {
            PyValueError::new_err(format!("{} cannot snapshot its state", self.id))
        })?;
        Ok(Self {
            inner,
            id: self.id.clone(),
            broken: false,
        })
    }
}

/// The ids of the native multi-seat games (the test-only ones too once registered).
#[pyfunction]
fn native_game_ids() -> Vec<&'static str> {
    specs().map(|g| g.id).collect()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGame>()?;
    m.add_function(wrap_pyfunction!(native_game_ids, m)?)?;
    Ok(())
}
