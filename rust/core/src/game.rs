//! The multi-seat game contract: several agents (seats) in one episode (self-play).
//!
//! A [`Game`] is deterministic like an [`Env`](crate::env::Env): `reset(task, seed)`
//! followed by the same moves always gives the same observations, rewards and outcome. It
//! differs in three ways:
//!
//! - **Seats.** Every episode has [`Game::seats`] players, each with a role
//!   ([`Game::role`], e.g. `X`/`O`, `first`/`second`). [`Game::to_move`] says which seats move
//!   now: one in a turn-taking game, several where they move at once, none once the game is
//!   over. [`Game::step`] takes one action per seat to move, in that order.
//! - **Private views.** [`Game::observation`] is what one seat sees: the public state, its
//!   own private information (a Kuhn poker seat's card) and the other seats' moves since it
//!   last looked, and never another seat's private information. The property tests check
//!   this for every game (`games::props`).
//! - **Per-seat rewards.** [`Game::rewards`] gives each seat's return, final once
//!   [`Game::over`]; zero-sum games sum to 0.
//!
//! An action that does not parse, or a move the rules forbid, ends the game: the seat that
//! made it gets [`ILLEGAL_MOVE_REWARD`] and every other seat 0 (SPIRAL's rule; a seat is
//! never paid for its opponent's format error). [`GameStep::refused`] names the seats whose
//! action ended it so.

use crate::env::Task;
use crate::error::{CoreError, Result};

/// The reward of a seat whose action was unreadable or illegal (the game ends there; the
/// other seats get 0).
pub const ILLEGAL_MOVE_REWARD: f32 = -1.0;

/// What one [`Game::step`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GameStep {
    /// Per acting seat (in the order of the step's moves): its action was unreadable or
    /// illegal, which ended the game.
    pub refused: Vec<bool>,
    /// The game is over after this step.
    pub over: bool,
}

impl GameStep {
    /// The step of a game already over: nobody moved, nothing was refused.
    pub fn already_over() -> Self {
        GameStep {
            refused: Vec::new(),
            over: true,
        }
    }
}

/// A native multi-seat game. `Send` and `Sync` so that a pool can step games on worker
/// threads and the bindings can share one.
pub trait Game: Send + Sync {
    /// The number of seats of every episode of this game.
    fn seats(&self) -> usize;
    /// Seat `seat`'s role, a short name that is the same for that seat in every episode
    /// (per-role baselines group by it).
    fn role(&self, seat: usize) -> String;
    /// Start an episode of `task` (an opening, a deal); `seed` drives every random choice.
    fn reset(&mut self, task: &Task, seed: u64) -> Result<()>;
    /// The seats that move now, ascending (empty once the game is over).
    fn to_move(&self) -> Vec<usize>;
    /// What seat `seat` sees now, from its side: the public state, its own private
    /// information and what happened since it last looked; never another seat's private
    /// information. Calling it changes nothing.
    fn observation(&self, seat: usize) -> String;
    /// Apply `moves[i]` for seat `to_move()[i]`. The caller passes exactly one action per
    /// seat to move; an unreadable or illegal one ends the game (see the module docs).
    fn step(&mut self, moves: &[&str]) -> GameStep;
    /// The game has ended.
    fn over(&self) -> bool {
        self.to_move().is_empty()
    }
    /// Each seat's return so far (final once [`Game::over`]).
    fn rewards(&self) -> Vec<f32>;
    /// The legal actions of seat `seat` now (empty when it is not to move).
    fn valid_actions(&self, seat: usize) -> Vec<String>;
    /// The reference strategy's action for seat `seat` now (a solver, an equilibrium
    /// strategy or a scripted negotiator; `None` when it is not to move). A mixed strategy
    /// draws from the episode's seed and the moves so far, so it is deterministic too.
    fn oracle_action(&self, seat: usize) -> Option<String>;
    /// Number of distinct indexed tasks (openings or deals).
    fn num_tasks(&self) -> u64;
    /// The system prompt of seat `seat`: the rules, its role and the action format.
    fn instructions(&self, seat: usize) -> String;
    /// A copy of the whole state, independent from now on (see
    /// [`Env::snapshot`](crate::env::Env::snapshot)); `None`: cannot snapshot.
    fn snapshot(&self) -> Option<Box<dyn Game>> {
        None
    }
}

/// The index of `task` for a game whose tasks are indices only (`what`: what an index is,
/// for the error); a task text is `InvalidTask`.
pub fn task_index(game: &str, task: &Task, what: &str) -> Result<u64> {
    match task {
        Task::Index(i) => Ok(*i),
        Task::Spec(_) => Err(CoreError::InvalidTask {
            env: game.to_string(),
            message: format!("{game} tasks are {what}, not text"),
        }),
    }
}

/// [`Game::snapshot`] of a game that is `Clone`.
pub fn game_snapshot_of<G: Game + Clone + 'static>(game: &G) -> Option<Box<dyn Game>> {
    Some(Box::new(game.clone()))
}
