//! Pure-Rust core of agentgym-rl (no PyO3 here; see `rust/py` for the bindings).
//!
//! - [`env`]: the native environment contract ([`env::Env`]) and tasks.
//! - [`episode`]: one live episode's bookkeeping (turns, horizon, stop reason).
//! - [`pool`]: [`pool::EpisodePool`], batched parallel reset/step over many episodes.
//! - [`trajectory`]: per-episode token segments and packed export of completed ones.
//! - [`parse`]: extraction of the action from model text.
//! - [`turn`]: one rollout turn of many episodes in one call (decode, parse, step,
//!   template and tokenize the observation, append to the trajectory).
//! - [`registry`]: native environment ids and their constructors.
//! - native environments: [`textcraft`], [`maze`], [`wordle`], [`gridworld`], [`game2048`],
//!   [`webshop`], [`search`] (one module each, tests beside them); [`splitmix`] is their
//!   shared RNG and [`bm25`] their shared retrieval index.

pub mod bm25;
pub mod env;
#[cfg(test)]
mod env_props;
pub mod episode;
pub mod error;
pub mod game2048;
pub mod gridworld;
pub mod maze;
pub mod parse;
pub mod pool;
pub mod registry;
pub mod search;
pub mod splitmix;
pub mod testenv;
pub mod textcraft;
pub mod trajectory;
pub mod turn;
pub mod webshop;
pub mod wordle;

pub use env::{Env, Step, Task};
pub use episode::{Episode, EpisodeStatus, StopReason};
pub use error::{CoreError, Result};
pub use pool::{EpisodePool, StepBatch};
