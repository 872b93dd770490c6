//! `agentgym._core`: thin PyO3 bindings over `agentgym-core`.
//!
//! Bindings only convert values and map errors (one file per Python class); every long call
//! copies its inputs into owned Rust values and runs with the GIL released (`py.detach`).

use pyo3::prelude::*;

mod batch;
mod errors;
mod game;
mod game_pool;
mod parse;
mod pool;
mod trajectory;
mod turn;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    pool::register(m)?;
    game::register(m)?;
    game_pool::register(m)?;
    trajectory::register(m)?;
    parse::register(m)?;
    turn::register(m)?;
    Ok(())
}
