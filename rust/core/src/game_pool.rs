//! [`GamePool`]: many live episodes of one native multi-seat game ([`Game`]), reset and
//! stepped in batches: the self-play twin of [`EpisodePool`](crate::pool::EpisodePool).
//!
//! Every call takes the rows of many episodes at once (one row per game) and returns one
//! [`GameView`] per row: the seats to move next with each one's private observation, or the
//! final per-seat rewards once the game is over. Large batches run on rayon's workers; each
//! slot sits behind its own (uncontended) mutex for disjoint mutable access. A batch is
//! checked whole before anything changes (slot ids in range and not repeated, a running
//! game in every stepped slot, one move per seat to move), so a malformed batch has no side
//! effects. A panic inside a game is caught at the row: that row's result is
//! [`CoreError::EnvFailure`], its game is dropped (rebuilt on the next reset), the rest of
//! the batch is untouched.

use crate::env::Task;
use crate::error::{CoreError, Result};
use crate::game::Game;
use crate::games::make_game;
use crate::pool::panic_message;
use crate::registry::Kwargs;
use parking_lot::Mutex;
use rayon::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Batches smaller than this run on the calling thread (as for the env pool: waking rayon's
/// workers costs more than a few hundred moves of a board game).
const PAR_MIN_ROWS: usize = 256;

/// One row's state after a reset or a step.
#[derive(Debug, Clone, PartialEq)]
pub struct GameView {
    /// The seats to move now, ascending (empty once over).
    pub to_move: Vec<usize>,
    /// `observations[i]`: what seat `to_move[i]` sees now (its own side only).
    pub observations: Vec<String>,
    /// The game has ended.
    pub over: bool,
    /// Each seat's return so far (final once over).
    pub rewards: Vec<f32>,
    /// Per seat that moved in this step (in the step's order): its move was unreadable or
    /// illegal and ended the game. Empty after a reset.
    pub refused: Vec<bool>,
}

#[derive(Default)]
struct GameSlot {
    game: Option<Box<dyn Game>>,
    /// A game was reset here and has not ended (a step is allowed).
    running: bool,
}

/// One row of a batch: its slot and its input.
pub struct Row<'a, T> {
    pub slot: usize,
    pub input: &'a T,
}

pub struct GamePool {
    game_id: String,
    kwargs: Kwargs,
    slots: Vec<Mutex<GameSlot>>,
    seats: usize,
    roles: Vec<String>,
    instructions: Vec<String>,
    num_tasks: u64,
}

fn view(game: &dyn Game, refused: Vec<bool>) -> GameView {
    let to_move = game.to_move();
    let observations = to_move.iter().map(|&s| game.observation(s)).collect();
    GameView {
        over: to_move.is_empty(),
        to_move,
        observations,
        rewards: game.rewards(),
        refused,
    }
}

/// Runs `f` on every row, on rayon's workers for a large batch; results in row order.
fn each<I: Sync, O: Send>(rows: &[I], f: impl Fn(&I) -> O + Sync + Send) -> Vec<O> {
    if rows.len() >= PAR_MIN_ROWS && rayon::current_num_threads() > 1 {
        rows.par_iter().map(f).collect()
    } else {
        rows.iter().map(f).collect()
    }
}

impl GamePool {
    /// A pool of `num_slots` episodes of game `game_id` built with `kwargs`.
    pub fn new(game_id: &str, num_slots: usize, kwargs: Kwargs) -> Result<Self> {
        let probe = make_game(game_id, &kwargs)?;
        let seats = probe.seats();
        Ok(Self {
            game_id: game_id.to_string(),
            roles: (0..seats).map(|s| probe.role(s)).collect(),
            instructions: (0..seats).map(|s| probe.instructions(s)).collect(),
            num_tasks: probe.num_tasks(),
            seats,
            kwargs,
            slots: (0..num_slots).map(|_| Mutex::default()).collect(),
        })
    }

    pub fn game_id(&self) -> &str {
        &self.game_id
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Seats of every episode.
    pub fn seats(&self) -> usize {
        self.seats
    }

    /// Each seat's role.
    pub fn roles(&self) -> &[String] {
        &self.roles
    }

    /// Each seat's system prompt.
    pub fn instructions(&self) -> &[String] {
        &self.instructions
    }

    /// Number of indexed tasks (openings, deals).
    pub fn num_tasks(&self) -> u64 {
        self.num_tasks
    }

    /// Slot ids in range and none repeated.
    fn check_slots(&self, slots: impl Iterator<Item = usize>) -> Result<()> {
        let mut seen = vec![false; self.slots.len()];
        for slot in slots {
            if slot >= self.slots.len() {
                return Err(CoreError::SlotOutOfRange {
                    slot,
                    size: self.slots.len(),
                });
            }
            if std::mem::replace(&mut seen[slot], true) {
                return Err(CoreError::DuplicateSlot { slot });
            }
        }
        Ok(())
    }

    /// Start one game per row: `(slot, task, seed)`. Each row's result is its first view, or
    /// why it could not start (a task the game refuses, a panic); a malformed batch (a slot
    /// out of range or repeated) fails whole.
    pub fn reset(&mut self, rows: &[(usize, Task, u64)]) -> Result<Vec<Result<GameView>>> {
        self.check_slots(rows.iter().map(|r| r.0))?;
        let (slots, id, kwargs) = (&self.slots, &self.game_id, &self.kwargs);
        Ok(each(rows, |(slot, task, seed)| {
            let mut s = slots[*slot].lock();
            s.running = false;
            if s.game.is_none() {
                s.game = Some(make_game(id, kwargs)?);
            }
            let game = s.game.as_mut().expect("game just built");
            match catch_unwind(AssertUnwindSafe(|| {
                game.reset(task, *seed)?;
                Ok(view(game.as_ref(), Vec::new()))
            })) {
                Ok(Ok(v)) => {
                    s.running = !v.over;
                    Ok(v)
                }
                Ok(Err(e)) => Err(e),
                Err(p) => {
                    s.game = None;
                    Err(CoreError::EnvFailure {
                        slot: *slot,
                        message: panic_message(p),
                    })
                }
            }
        }))
    }

    /// One move per seat to move for each row: `(slot, moves)`, `moves[i]` for seat
    /// `to_move()[i]`. Each row's result is its view after the step, or the panic that ended
    /// its game. A malformed batch (a slot out of range, repeated or without a running game,
    /// a move count that is not the number of seats to move) fails whole, before any move.
    pub fn step<S: AsRef<str> + Sync>(
        &mut self,
        rows: &[(usize, Vec<S>)],
    ) -> Result<Vec<Result<GameView>>> {
        self.check_slots(rows.iter().map(|r| r.0))?;
        for (slot, moves) in rows {
            let s = self.slots[*slot].get_mut();
            let game = match (&s.game, s.running) {
                (Some(g), true) => g,
                _ => {
                    return Err(CoreError::EpisodeFinished {
                        slot: *slot,
                        reason: "no game is running there".into(),
                    })
                }
            };
            let movers = game.to_move().len();
            if moves.len() != movers {
                return Err(CoreError::InvalidArgument(format!(
                    "slot {slot}: {movers} seat(s) to move, got {} move(s)",
                    moves.len()
                )));
            }
        }
        let slots = &self.slots;
        Ok(each(rows, |(slot, moves)| {
            let mut s = slots[*slot].lock();
            let game = s.game.as_mut().expect("checked above");
            let refs: Vec<&str> = moves.iter().map(AsRef::as_ref).collect();
            match catch_unwind(AssertUnwindSafe(|| {
                let step = game.step(&refs);
                view(game.as_ref(), step.refused)
            })) {
                Ok(v) => {
                    s.running = !v.over;
                    Ok(v)
                }
                Err(p) => {
                    s.game = None;
                    s.running = false;
                    Err(CoreError::EnvFailure {
                        slot: *slot,
                        message: panic_message(p),
                    })
                }
            }
        }))
    }

    fn with_game<T>(&self, slot: usize, f: impl FnOnce(&dyn Game) -> T) -> Result<T> {
        self.check_slots(std::iter::once(slot))?;
        let s = self.slots[slot].lock();
        match &s.game {
            Some(g) if s.running => Ok(f(g.as_ref())),
            _ => Err(CoreError::EpisodeFinished {
                slot,
                reason: "no game is running there".into(),
            }),
        }
    }

    /// The reference strategy's action for each `(slot, seat)` (None where the seat is not
    /// to move); a solver's search runs on rayon's workers for a large batch. A slot out of
    /// range or without a running game, or a seat out of range, fails the whole call.
    pub fn oracle_actions(&self, rows: &[(usize, usize)]) -> Result<Vec<Option<String>>> {
        for &(slot, seat) in rows {
            self.with_game(slot, |_| ())?;
            self.check_seat(seat)?;
        }
        let slots = &self.slots;
        Ok(each(rows, |&(slot, seat)| {
            let s = slots[slot].lock();
            let game = s.game.as_ref().expect("checked above");
            catch_unwind(AssertUnwindSafe(|| game.oracle_action(seat))).unwrap_or(None)
        }))
    }

    /// The legal actions of `seat` in `slot` now.
    pub fn valid_actions(&self, slot: usize, seat: usize) -> Result<Vec<String>> {
        self.check_seat(seat)?;
        self.with_game(slot, |g| g.valid_actions(seat))
    }

    fn check_seat(&self, seat: usize) -> Result<()> {
        if seat >= self.seats {
            return Err(CoreError::InvalidArgument(format!(
                "seat {seat} out of range: {} has {} seats",
                self.game_id, self.seats
            )));
        }
        Ok(())
    }

    /// End the games of `slots` (a stepped slot needs a new reset).
    pub fn finish(&mut self, slots: &[usize]) -> Result<()> {
        self.check_slots(slots.iter().copied())?;
        for &slot in slots {
            self.slots[slot].get_mut().running = false;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> GamePool {
        GamePool::new("kuhn_poker", n, Kwargs::new()).unwrap()
    }

    #[test]
    fn a_batch_plays_many_games_to_their_end() {
        let mut p = pool(300); // above PAR_MIN_ROWS: the parallel path
        let rows: Vec<_> = (0..300).map(|s| (s, Task::Index(s as u64), 7)).collect();
        let views = p.reset(&rows).unwrap();
        assert!(views.iter().all(|v| v.as_ref().unwrap().to_move == vec![0]));
        let bets: Vec<_> = (0..300).map(|s| (s, vec!["bet"])).collect();
        let after = p.step(&bets).unwrap();
        assert!(after.iter().all(|v| v.as_ref().unwrap().to_move == vec![1]));
        let folds: Vec<_> = (0..300).map(|s| (s, vec!["fold"])).collect();
        for v in p.step(&folds).unwrap() {
            let v = v.unwrap();
            assert!(v.over && v.to_move.is_empty());
            assert_eq!(v.rewards, vec![1.0, -1.0]);
            assert_eq!(v.refused, vec![false]);
        }
        // a finished game refuses a further step, and the batch changes nothing
        let err = p.step(&[(0, vec!["bet"])]).unwrap_err();
        assert!(matches!(err, CoreError::EpisodeFinished { slot: 0, .. }));
    }

    #[test]
    fn a_malformed_batch_fails_whole_before_any_move() {
        let mut p = pool(3);
        p.reset(&[(0, Task::Index(0), 1), (1, Task::Index(1), 1)])
            .unwrap();
        for bad in [
            vec![(0, vec!["bet"]), (0, vec!["check"])], // repeated slot
            vec![(0, vec!["bet"]), (5, vec!["check"])], // out of range
            vec![(0, vec!["bet"]), (2, vec!["check"])], // never reset
            vec![(0, vec!["bet"]), (1, vec![])],        // wrong move count
        ] {
            assert!(p.step(&bad).is_err());
        }
        // slot 0 did not move: seat 0 is still to move
        let v = p.step(&[(0, vec!["check"])]).unwrap().remove(0).unwrap();
        assert_eq!(v.to_move, vec![1]);
    }

    #[test]
    fn an_illegal_move_ends_the_row_and_names_its_seat() {
        let mut p = pool(2);
        p.reset(&[(0, Task::Index(0), 1), (1, Task::Index(0), 1)])
            .unwrap();
        let out = p.step(&[(0, vec!["raise"]), (1, vec!["check"])]).unwrap();
        let bad = out[0].as_ref().unwrap();
        assert!(bad.over && bad.refused == vec![true]);
        assert_eq!(bad.rewards, vec![-1.0, 0.0]);
        assert!(!out[1].as_ref().unwrap().over);
    }

    #[test]
    fn views_hold_only_the_movers_own_observation() {
        let mut p = pool(1);
        let v = p
            .reset(&[(0, Task::Index(0), 3)])
            .unwrap()
            .remove(0)
            .unwrap();
        // deal 0: seat 0 holds the Jack, seat 1 the Queen
        assert!(v.observations[0].contains("Jack"));
        assert!(!v.observations[0].contains("Queen"));
        let v = p.step(&[(0, vec!["check"])]).unwrap().remove(0).unwrap();
        assert!(v.observations[0].contains("Queen") && !v.observations[0].contains("Jack"));
    }

    #[test]
    fn solver_and_valid_actions_answer_for_the_seat_to_move() {
        let mut p = GamePool::new("tictactoe", 2, Kwargs::new()).unwrap();
        p.reset(&[(0, Task::Index(0), 0), (1, Task::Index(3), 0)])
            .unwrap();
        let acts = p.oracle_actions(&[(0, 0), (0, 1), (1, 0)]).unwrap();
        assert!(acts[0].is_some() && acts[1].is_none());
        let legal = p.valid_actions(0, 0).unwrap();
        assert!(legal.contains(acts[0].as_ref().unwrap()));
        assert!(p.valid_actions(0, 1).unwrap().is_empty());
        assert!(p.oracle_actions(&[(0, 2)]).is_err());
    }
}
