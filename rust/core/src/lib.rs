//! Pure-Rust core of agentgym-rl (no PyO3 here; see `rust/py` for the bindings).
//!
//! - [`env`]: the native environment contract ([`env::Env`]) and tasks.
//! - [`game`]: the multi-seat game contract ([`game::Game`], self-play); [`games`]: the
//!   native games.
//! - [`game_pool`]: [`game_pool::GamePool`], batched reset/step over many games (the
//!   engine's self-play path).
//! - [`episode`]: one live episode's bookkeeping (turns, horizon, stop reason).
//! - [`pool`]: [`pool::EpisodePool`], batched parallel reset/step over many episodes.
//! - [`trajectory`]: per-episode token segments and packed export of completed ones.
//! - [`parse`]: extraction of the action from model text.
//! - [`turn`]: one rollout turn of many episodes in one call (decode, parse, step,
//!   template and tokenize the observation, append to the trajectory).
//! - [`registry`]: native environment ids and their constructors.
//! - [`envs`]: the native environments, one module each under `envs/<id>/`, tests beside
//!   them.
//! - [`util`]: helpers shared by the above (the envs' RNG and retrieval index, a prefetch
//!   hint).

pub mod env;
pub mod envs;
pub mod episode;
pub mod error;
pub mod game;
pub mod game_pool;
pub mod games;
pub mod parse;
pub mod pool;
pub mod registry;
pub mod trajectory;
pub mod turn;
pub mod util;

pub use env::{Env, Step, Task};
pub use episode::{Episode, EpisodeStatus, StopReason};
pub use error::{CoreError, Result};
pub use pool::{EpisodePool, StepBatch};
