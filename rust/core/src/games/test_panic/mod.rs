//! `_test_panic_game`: a test-only two-seat game, not shipped (registered with the test envs
//! by [`crate::registry::register_test_envs`]), so that tests can show a game that panics
//! ends only its own episode. The seats alternate, seat 0 first; any move is accepted and the
//! game ends after 4 moves with 0 for both, except the move `panic`, which panics inside
//! `step`.

use crate::env::Task;
use crate::error::Result;
use crate::game::{Game, GameStep};
use crate::registry::{Kwargs, KwargsReader};

#[derive(Default, Clone)]
pub struct PanicGame {
    moves: Vec<String>,
}

pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Game>> {
    KwargsReader::new("_test_panic_game", kwargs, &[])?;
    Ok(Box::new(PanicGame::default()))
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
        if self.moves.len() < MOVES {
            vec![self.moves.len() % 2]
        } else {
            vec![]
        }
    }

    fn observation(&self, seat: usize) -> String {
        format!("seat {seat}; moves so far: {}", self.moves.join(", "))
    }

    fn step(&mut self, moves: &[&str]) -> GameStep {
        if moves[0].trim() == "panic" {
            panic!("test game asked to panic");
        }
        self.moves.push(moves[0].to_string());
        GameStep {
            refused: vec![false],
            over: self.over(),
        }
    }

    fn rewards(&self) -> Vec<f32> {
        vec![0.0, 0.0]
    }

    fn valid_actions(&self, seat: usize) -> Vec<String> {
        if self.to_move() == [seat] {
            vec!["noop".into(), "panic".into()]
        } else {
            vec![]
        }
    }

    fn oracle_action(&self, seat: usize) -> Option<String> {
        (self.to_move() == [seat]).then(|| "noop".into())
    }

    fn num_tasks(&self) -> u64 {
        1
    }

    fn instructions(&self, seat: usize) -> String {
        format!("Test game, seat {seat}. Reply with Action: noop")
    }
}
