//! `tictactoe`: tic-tac-toe for two seats, perfect information, zero-sum. Seat 0 plays `X`
//! and moves first, seat 1 plays `O`; a move is the number of a free cell (1-9, left to
//! right, top to bottom). Three in a row wins (+1, the loser -1), a full board without one is
//! a draw (0 each). See `envs/tictactoe/README.md`.
//!
//! Tasks are openings, in a fixed order: the empty board (task 0), the 9 boards with X's
//! first move placed (tasks 1-9, X in cell `i`) and the 72 boards with X's and O's first
//! moves placed (tasks 10-81: X's cell major, O's cell ascending among the other eight).
//! The board is a function of the task only; the seed only breaks the ties of the reference
//! solver, a negamax over every position reachable from the empty board (solved once per
//! process and shared) that prefers faster wins and slower losses.

use crate::env::{action_line, Task};
use crate::error::Result;
use crate::game::{game_snapshot_of, task_index, Game, GameStep, ILLEGAL_MOVE_REWARD};
use crate::registry::{Kwargs, KwargsReader};
use crate::util::splitmix::derive;
use std::sync::OnceLock;

const SALT: u64 = 0x7469_6374_6163_746F; // "tictacto"
/// The openings: 1 empty board, 9 with X's first move, 9 * 8 with X's and O's.
const NUM_TASKS: u64 = 1 + 9 + 9 * 8;
const EMPTY: u8 = 0;
/// The mark of seat `s` is `s + 1`; its letter is `ROLES[s]`.
const ROLES: [&str; 2] = ["X", "O"];
/// Rows, columns, diagonals (cell indices 0-8).
const LINES: [[usize; 3]; 8] = [
    [0, 1, 2],
    [3, 4, 5],
    [6, 7, 8],
    [0, 3, 6],
    [1, 4, 7],
    [2, 5, 8],
    [0, 4, 8],
    [2, 4, 6],
];
/// A position not solved yet (solver values lie in -10..=10).
const UNKNOWN: i8 = i8::MIN;

/// A board, cells 1-9 at indices 0-8: `0` free, else the mark (`seat + 1`: X 1, O 2) of the
/// seat that took the cell.
pub type Board = [u8; 9];

/// A tic-tac-toe game (one episode at a time).
#[derive(Debug, Clone)]
pub struct TicTacToe {
    board: Board,
    seed: u64,
    /// The last move of this episode, `(seat, cell index)` (opening marks are not moves).
    last: Option<(usize, usize)>,
    /// The seat whose unreadable or illegal move ended the game.
    forfeit: Option<usize>,
}

/// `tictactoe` takes no kwargs.
pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Game>> {
    KwargsReader::new("tictactoe", kwargs, &[])?;
    Ok(Box::new(TicTacToe::new()))
}

/// The board of opening `index` (taken modulo the number of openings).
pub fn opening(index: u64) -> Board {
    let mut board = [EMPTY; 9];
    let i = (index % NUM_TASKS) as usize;
    if i >= 1 {
        let k = if i < 10 { i - 1 } else { (i - 10) / 8 };
        board[k] = 1;
        if i >= 10 {
            let o = (0..9)
                .filter(|&c| c != k)
                .nth((i - 10) % 8)
                .expect("8 other cells");
            board[o] = 2;
        }
    }
    board
}

/// The cell index (0-8) of a move: one digit 1-9, surrounding whitespace and one trailing
/// period allowed.
pub fn parse_cell(action: &str) -> Option<usize> {
    let s = action.trim();
    let s = s.strip_suffix('.').unwrap_or(s).trim_end();
    match s.as_bytes() {
        [d @ b'1'..=b'9'] => Some((d - b'1') as usize),
        _ => None,
    }
}

/// The seat with three in a row, if any.
fn winner(board: &Board) -> Option<usize> {
    LINES.iter().find_map(|&[a, b, c]| {
        (board[a] != EMPTY && board[a] == board[b] && board[b] == board[c])
            .then(|| board[a] as usize - 1)
    })
}

/// The seat whose turn it is on `board` if the game goes on (X when the counts are equal).
fn side_to_move(board: &Board) -> usize {
    let xs = board.iter().filter(|&&m| m == 1).count();
    let os = board.iter().filter(|&&m| m == 2).count();
    usize::from(xs > os)
}

/// The board as a base-3 number (cell `i` is digit `i`), below 3^9.
fn code(board: &Board) -> usize {
    board.iter().rev().fold(0, |acc, &m| acc * 3 + m as usize)
}

/// The negamax value of `board` for the side to move: `1 + empty cells` when it wins with
/// perfect play (a faster win leaves more cells empty), minus that when it loses, 0 for a
/// draw. Memoised in `memo` (indexed by [`code`]).
fn negamax(board: &mut Board, memo: &mut [i8]) -> i8 {
    let key = code(board);
    if memo[key] != UNKNOWN {
        return memo[key];
    }
    let mover = side_to_move(board);
    let empties = board.iter().filter(|&&m| m == EMPTY).count() as i8;
    let value = match winner(board) {
        Some(w) if w == mover => 1 + empties,
        Some(_) => -(1 + empties),
        None if empties == 0 => 0,
        None => {
            let mut best = i8::MIN;
            for c in 0..9 {
                if board[c] == EMPTY {
                    board[c] = mover as u8 + 1;
                    best = best.max(-negamax(board, memo));
                    board[c] = EMPTY;
                }
            }
            best
        }
    };
    memo[key] = value;
    value
}

/// The solved values of every position reachable from the empty board (computed once).
fn solved() -> &'static [i8] {
    static TABLE: OnceLock<Vec<i8>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut memo = vec![UNKNOWN; 19_683];
        negamax(&mut [EMPTY; 9], &mut memo);
        memo
    })
}

/// The perfect-play value of `board` for the side to move (see [`negamax`]).
pub fn value(board: &Board) -> i8 {
    match solved()[code(board)] {
        UNKNOWN => negamax(&mut { *board }, &mut vec![UNKNOWN; 19_683]),
        v => v,
    }
}

/// The free cells (indices 0-8, ascending) of best perfect-play value for the side to move;
/// empty once the game is decided.
pub fn best_moves(board: &Board) -> Vec<usize> {
    if winner(board).is_some() {
        return Vec::new();
    }
    let mover = side_to_move(board) as u8 + 1;
    let mut best = i8::MIN;
    let mut cells = Vec::new();
    for c in (0..9).filter(|&c| board[c] == EMPTY) {
        let mut child = *board;
        child[c] = mover;
        let v = -value(&child);
        if v > best {
            best = v;
            cells.clear();
        }
        if v == best {
            cells.push(c);
        }
    }
    cells
}

impl Default for TicTacToe {
    fn default() -> Self {
        Self::new()
    }
}

impl TicTacToe {
    /// A game on the empty board (task 0, seed 0) until the first reset.
    pub fn new() -> Self {
        Self {
            board: [EMPTY; 9],
            seed: 0,
            last: None,
            forfeit: None,
        }
    }

    /// The board: `0` free, `1` X, `2` O, cells 1-9 at indices 0-8.
    pub fn board(&self) -> &Board {
        &self.board
    }

    fn full(&self) -> bool {
        self.board.iter().all(|&m| m != EMPTY)
    }

    /// The seat to move, `None` once the game is over.
    fn mover(&self) -> Option<usize> {
        if self.forfeit.is_some() || winner(&self.board).is_some() || self.full() {
            None
        } else {
            Some(side_to_move(&self.board))
        }
    }
}

impl Game for TicTacToe {
    fn seats(&self) -> usize {
        2
    }

    fn role(&self, seat: usize) -> String {
        ROLES[seat].to_string()
    }

    fn reset(&mut self, task: &Task, seed: u64) -> Result<()> {
        let index = task_index(
            "tictactoe",
            task,
            &format!("opening indices (0..{NUM_TASKS})"),
        )?;
        self.board = opening(index);
        self.seed = seed;
        self.last = None;
        self.forfeit = None;
        Ok(())
    }

    fn to_move(&self) -> Vec<usize> {
        self.mover().into_iter().collect()
    }

    fn observation(&self, seat: usize) -> String {
        let mut out = String::with_capacity(160);
        for row in 0..3 {
            for col in 0..3 {
                let c = row * 3 + col;
                out.push_str(if col == 0 { " " } else { " | " });
                match self.board[c] {
                    EMPTY => out.push(char::from(b'1' + c as u8)),
                    m => out.push_str(ROLES[m as usize - 1]),
                }
            }
            out.push('\n');
        }
        let other = 1 - seat;
        out.push_str("You are ");
        out.push_str(ROLES[seat]);
        out.push_str(".\n");
        if let Some((who, c)) = self.last.filter(|&(who, _)| who == other) {
            out.push_str(ROLES[who]);
            out.push_str(" took cell ");
            out.push(char::from(b'1' + c as u8));
            out.push_str(".\n");
        }
        match (self.forfeit, self.mover(), winner(&self.board)) {
            (Some(s), _, _) if s == seat => {
                out.push_str("You made an illegal move; the game is over.")
            }
            (Some(s), _, _) => {
                out.push_str(ROLES[s]);
                out.push_str(" made an illegal move; the game is over.");
            }
            (None, Some(m), _) if m == seat => {
                out.push_str("Your move: reply with a free cell number.")
            }
            (None, Some(m), _) => {
                out.push_str("Waiting for ");
                out.push_str(ROLES[m]);
                out.push('.');
            }
            (None, None, Some(w)) if w == seat => out.push_str("You won."),
            (None, None, Some(_)) => out.push_str("You lost."),
            (None, None, None) => out.push_str("Draw."),
        }
        out
    }

    fn step(&mut self, moves: &[&str]) -> GameStep {
        let Some(seat) = self.mover() else {
            return GameStep::already_over();
        };
        let cell = moves
            .first()
            .and_then(|m| parse_cell(m))
            .filter(|&c| self.board[c] == EMPTY);
        let refused = match cell {
            Some(c) => {
                self.board[c] = seat as u8 + 1;
                self.last = Some((seat, c));
                false
            }
            None => {
                self.forfeit = Some(seat);
                true
            }
        };
        GameStep {
            refused: vec![refused],
            over: self.over(),
        }
    }

    fn rewards(&self) -> Vec<f32> {
        match (self.forfeit, winner(&self.board)) {
            (Some(s), _) => {
                let mut r = vec![0.0; 2];
                r[s] = ILLEGAL_MOVE_REWARD;
                r
            }
            (None, Some(w)) => {
                let mut r = vec![-1.0; 2];
                r[w] = 1.0;
                r
            }
            (None, None) => vec![0.0; 2],
        }
    }

    fn valid_actions(&self, seat: usize) -> Vec<String> {
        if self.mover() != Some(seat) {
            return Vec::new();
        }
        (0..9)
            .filter(|&c| self.board[c] == EMPTY)
            .map(|c| (c + 1).to_string())
            .collect()
    }

    fn oracle_action(&self, seat: usize) -> Option<String> {
        if self.mover() != Some(seat) {
            return None;
        }
        let cells = best_moves(&self.board);
        let k = derive(&[SALT, self.seed, code(&self.board) as u64]) % cells.len() as u64;
        Some((cells[k as usize] + 1).to_string())
    }

    fn num_tasks(&self) -> u64 {
        NUM_TASKS
    }

    fn instructions(&self, seat: usize) -> String {
        let (me, them) = (ROLES[seat], ROLES[1 - seat]);
        let mut out = format!(
            "You are playing tic-tac-toe as {me}; your opponent plays {them}. X moves first, \
             but a game may start from an opening with some marks already on the board. The \
             cells are numbered 1 to 9, left to right and top to bottom:\n"
        );
        out.push_str(" 1 | 2 | 3\n 4 | 5 | 6\n 7 | 8 | 9\n");
        out.push_str(
            "On your turn, reply with the number of a free cell to put your mark there. Three \
             of your marks in a row, column or diagonal win: +1 for the winner, -1 for the \
             loser; a full board without a line is a draw (0 each). An unreadable move or a \
             taken cell ends the game: -1 for you, 0 for your opponent.",
        );
        out.push_str(&action_line("5"));
        out
    }

    fn snapshot(&self) -> Option<Box<dyn Game>> {
        game_snapshot_of(self)
    }
}

#[cfg(test)]
mod tests;
