//! Helpers that are neither environments nor pool or trajectory bookkeeping.
//!
//! - [`splitmix`]: the small, fully specified RNG of the procedural envs.
//! - [`bm25`]: the text retrieval index of the `webshop` and `search` envs.
//! - [`prefetch()`]: a cache-line prefetch hint for the batch loops.

pub mod bm25;
mod prefetch;
pub mod splitmix;

pub use prefetch::prefetch;
