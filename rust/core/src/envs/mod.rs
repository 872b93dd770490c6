//! The native environments, one module each (`envs/<id>/mod.rs`, its tests beside it in
//! `envs/<id>/tests.rs`), registered by id in [`crate::registry`].
//!
//! - [`textcraft`]: craft a Minecraft item from base items using recipes (AgentGym).
//! - [`maze`]: a grid maze with text observations.
//! - [`wordle`]: guess the five-letter word from per-letter feedback.
//! - [`gridworld`]: a BabyAI-style text grid world.
//! - [`game2048`]: 2048 on a 4x4 board.
//! - [`webshop`]: search a synthetic store and buy what the instruction asks for.
//! - [`search`]: answer multi-hop questions from a local corpus.
//! - [`bench_cartpole`]: `_bench_cartpole`, CartPole-v1's dynamics for the EnvPool
//!   comparison, for benches only (registered with the test envs).
//! - [`test_panic`]: `_test_panic`, an env that fails on demand, for tests only: it is not
//!   in the shipped registry (see [`crate::registry::register_test_envs`]).
//!
//! `props` (tests only) holds the property tests every env passes, `test_util` the checks
//! the envs' unit tests share.

pub mod bench_cartpole;
pub mod game2048;
pub mod gridworld;
pub mod maze;
#[cfg(test)]
mod props;
pub mod search;
pub mod test_panic;
#[cfg(test)]
mod test_util;
pub mod textcraft;
pub mod webshop;
pub mod wordle;
