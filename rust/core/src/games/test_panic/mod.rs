//! `_test_panic_game`: a test-only two-seat game, not shipped (registered with the test envs
//! by [`crate::registry::register_test_envs`]), so that tests can show a game that panics
//! ends only its own episode. The seats alternate, seat 0 first (with the kwarg
//! `simultaneous=true` both seats move at once, every round); any move is accepted and the
//! game ends after 4 moves with 0 for both, except the move `panic`, which panics inside
//! `step`.

use crate::env::Task;
use crate::error::Result;
use crate::game::{Game, GameStep};
use crate::registry::{Kwargs, KwargsReader};

#[derive(Default, Clone)]
pub struct PanicGame {
    moves: Vec<String>,
    simultaneous: bool,
}

pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Game>> {
    let kw = KwargsReader::new("_test_panic_game", kwargs, &["simultaneous"])?;
    Ok(Box::new(PanicGame {
        moves: Vec::new(),
        simultaneous: kw.bool_or("simultaneous", false)?,
    }))
}

const MOVES: usize = 4;

impl Game for PanicGame {
    fn seats(&self) -> usize {
        2
    }

    fn role(&self, seat: usize) -> String {
        ["first", "second"][seat.min(1)].into()
    }

    fn reset(&mut self, _task: &Task, _seed: u64) -> Result<()> {
        self.moves.clear();
        Ok(())
    }

    fn to_move(&self) -> Vec<usize> {
        match (self.moves.len() < MOVES, self.simultaneous) {
            (false, _) => vec![],
            (true, true) => vec![0, 1],
            (true, false) => vec![self.moves.len() % 2],
        }
    }

    fn observation(&self, seat: usize) -> String {
        format!("seat {seat}; moves so far: {}", self.moves.join(", "))
    }

    fn step(&mut self, moves: &[&str]) -> GameStep {
        if moves.iter().any(|m| m.trim() == "panic") {
            panic!("test game asked to panic");
        }
        self.moves.extend(moves.iter().map(|m| m.to_string()));
        GameStep {
            refused: vec![false; moves.len()],
            over: self.over(),
        }
    }

    fn rewards(&self) -> Vec<f32> {
        vec![0.0, 0.0]
    }

    fn valid_actions(&self, seat: usize) -> Vec<String> {
        if self.to_move().contains(&seat) {
            vec!["noop".into(), "panic".into()]
        } else {
            vec![]
        }
    }

    fn oracle_action(&self, seat: usize) -> Option<String> {
        self.to_move().contains(&seat).then(|| "noop".into())
    }

    fn num_tasks(&self) -> u64 {
        1
    }

    fn instructions(&self, seat: usize) -> String {
        format!("Test game, seat {seat}. Reply with Action: noop")
    }
}
