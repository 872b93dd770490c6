//! The native multi-seat games ([`crate::game::Game`]), one module each
//! (`games/<id>/mod.rs`, its tests beside it in `games/<id>/tests.rs`), registered by id in
//! [`GAMES`].
//!
//! - [`tictactoe`]: tic-tac-toe, perfect information, zero-sum; a minimax solver.
//! - [`kuhn_poker`]: Kuhn poker, hidden information (each seat sees only its own card),
//!   zero-sum; the game's Nash equilibrium strategy.
//! - [`negotiation`]: a natural-language negotiation over a pool of items with private
//!   valuations ("Deal or No Deal"), general-sum; a scripted negotiator that concedes over
//!   time.
//!
//! `props` (tests only) holds the property tests every game passes.

use crate::error::{CoreError, Result};
use crate::game::Game;
use crate::registry::Kwargs;

pub mod kuhn_poker;
pub mod negotiation;
#[cfg(test)]
mod props;
pub mod test_panic;
#[cfg(test)]
mod test_util;
pub mod tictactoe;

/// A game id and its constructor (kwargs as a JSON object, as the envs take them).
pub struct GameSpec {
    pub id: &'static str,
    pub description: &'static str,
    pub make: fn(&Kwargs) -> Result<Box<dyn Game>>,
}

/// The shipped games.
pub static GAMES: &[GameSpec] = &[
    GameSpec {
        id: "tictactoe",
        description: "Tic-tac-toe for two seats (X moves first); tasks are openings",
        make: tictactoe::make,
    },
    GameSpec {
        id: "kuhn_poker",
        description: "Kuhn poker for two seats: one private card each, one betting round",
        make: kuhn_poker::make,
    },
    GameSpec {
        id: "negotiation",
        description: "Deal or No Deal for two seats: split a pool of items, each seat's values \
                      private, by messages and offers",
        make: negotiation::make,
    },
];

/// Test-only games, registered with the test envs
/// ([`crate::registry::register_test_envs`]).
static TEST_GAMES: &[GameSpec] = &[GameSpec {
    id: "_test_panic_game",
    description: "Test-only game that panics on demand (see games/test_panic)",
    make: test_panic::make,
}];

/// Every registered game: the shipped ones, then the test-only ones once registered.
pub fn specs() -> impl Iterator<Item = &'static GameSpec> {
    let tests: &'static [GameSpec] = if crate::registry::test_envs_registered() {
        TEST_GAMES
    } else {
        &[]
    };
    GAMES.iter().chain(tests)
}

/// The game `id` built with `kwargs`.
pub fn make_game(id: &str, kwargs: &Kwargs) -> Result<Box<dyn Game>> {
    match specs().find(|g| g.id == id) {
        Some(g) => (g.make)(kwargs),
        None => Err(CoreError::UnknownEnv {
            id: id.to_string(),
            known: GAMES.iter().map(|g| g.id).collect::<Vec<_>>().join(", "),
        }),
    }
}
