//! `game2048`: the sliding-tile game 2048 on a 4x4 board, as text. Each turn the agent slides
//! the tiles up, down, left or right; equal tiles merge; a new tile (2 with probability 0.9,
//! else 4) appears on a random empty cell. Reaching the target tile gives reward 1. The task
//! index fixes the opening board and the episode seed drives the tile spawns (a chance game:
//! equal (task, seed) replay equal games). See `envs/game2048/README.md`.
//!
//! The board is a `u64` of 16 four-bit exponents (cell `(r, c)` at nibble `4r + c`) with
//! per-row move tables, so a step costs a few table lookups; `oracle_action()` is a depth-2
//! expectimax (move, spawn, move) over a row heuristic.

use crate::env::{snapshot_of, Env, Step, Task};
use crate::error::{CoreError, Result};
use crate::registry::{Kwargs, KwargsReader};
use crate::util::splitmix::{derive, SplitMix64};
use std::fmt::Write;
use std::sync::OnceLock;

const SALT: u64 = 0x3230_3438; // "2048"
/// Move order everywhere: up, down, left, right.
pub const MOVES: [&str; 4] = ["up", "down", "left", "right"];

struct Tables {
    left: Vec<u16>,
    right: Vec<u16>,
    /// Points scored by a row move (the same for left and right of the mirrored row).
    left_score: Vec<u32>,
    right_score: Vec<u32>,
    heur: Vec<f32>,
}

fn reverse_row(row: u16) -> u16 {
    (row >> 12) | ((row >> 4) & 0x00F0) | ((row << 4) & 0x0F00) | (row << 12)
}

fn slide_left(row: u16) -> (u16, u32) {
    let cells: Vec<u16> = (0..4)
        .map(|i| (row >> (4 * i)) & 0xF)
        .filter(|&e| e != 0)
        .collect();
    let mut out = Vec::with_capacity(4);
    let mut score = 0;
    let mut i = 0;
    while i < cells.len() {
        if i + 1 < cells.len() && cells[i] == cells[i + 1] && cells[i] < 15 {
            out.push(cells[i] + 1);
            score += 1u32 << (cells[i] + 1);
            i += 2;
        } else {
            out.push(cells[i]);
            i += 1;
        }
    }
    let packed = out
        .iter()
        .enumerate()
        .fold(0u16, |acc, (k, &e)| acc | (e << (4 * k)));
    (packed, score)
}

/// A row's heuristic value: empty cells and merge chances are good; non-monotone rows and
/// large scattered tiles are bad.
fn row_heuristic(row: u16) -> f32 {
    let e: [u32; 4] = std::array::from_fn(|i| u32::from((row >> (4 * i)) & 0xF));
    let empty = e.iter().filter(|&&x| x == 0).count() as f32;
    let sum: f32 = e.iter().map(|&x| (x as f32).powf(3.5)).sum();
    let mut merges = 0.0;
    let mut prev = 0;
    let mut run = 0;
    for &x in &e {
        if x == 0 {
            continue;
        }
        if x == prev {
            run += 1;
        } else {
            if run > 0 {
                merges += 1.0 + run as f32;
            }
            run = 0;
            prev = x;
        }
    }
    if run > 0 {
        merges += 1.0 + run as f32;
    }
    let (mut mono_l, mut mono_r) = (0.0f32, 0.0f32);
    for i in 1..4 {
        let (a, b) = ((e[i - 1] as f32).powi(4), (e[i] as f32).powi(4));
        if e[i - 1] > e[i] {
            mono_l += a - b;
        } else {
            mono_r += b - a;
        }
    }
    200_000.0 + 270.0 * empty + 700.0 * merges - 47.0 * mono_l.min(mono_r) - 11.0 * sum
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let n = 1 << 16;
        let (mut left, mut right) = (vec![0u16; n], vec![0u16; n]);
        let (mut left_score, mut right_score) = (vec![0u32; n], vec![0u32; n]);
        let mut heur = vec![0f32; n];
        for row in 0..n {
            let r = row as u16;
            let (l, s) = slide_left(r);
            left[row] = l;
            left_score[row] = s;
            let rev = reverse_row(r);
            let (rl, rs) = slide_left(rev);
            right[row] = reverse_row(rl);
            right_score[row] = rs;
            heur[row] = row_heuristic(r);
        }
        Tables {
            left,
            right,
            left_score,
            right_score,
            heur,
        }
    })
}

/// Swap rows and columns of the 4x4 nibble board.
pub fn transpose(x: u64) -> u64 {
    let a1 = x & 0xF0F0_0F0F_F0F0_0F0F;
    let a2 = x & 0x0000_F0F0_0000_F0F0;
    let a3 = x & 0x0F0F_0000_0F0F_0000;
    let a = a1 | (a2 << 12) | (a3 >> 12);
    let b1 = a & 0xFF00_FF00_00FF_00FF;
    let b2 = a & 0x00FF_00FF_0000_0000;
    let b3 = a & 0x0000_0000_FF00_FF00;
    b1 | (b2 >> 24) | (b3 << 24)
}

fn rows_apply(b: u64, table: &[u16], score: &[u32]) -> (u64, u32) {
    let mut out = 0;
    let mut pts = 0;
    for i in 0..4 {
        let row = ((b >> (16 * i)) & 0xFFFF) as usize;
        out |= u64::from(table[row]) << (16 * i);
        pts += score[row];
    }
    (out, pts)
}

/// The board after move `m` (0 up, 1 down, 2 left, 3 right) and the points it scores.
pub fn apply_move(b: u64, m: usize) -> (u64, u32) {
    let t = tables();
    match m {
        0 => {
            let (x, p) = rows_apply(transpose(b), &t.left, &t.left_score);
            (transpose(x), p)
        }
        1 => {
            let (x, p) = rows_apply(transpose(b), &t.right, &t.right_score);
            (transpose(x), p)
        }
        2 => rows_apply(b, &t.left, &t.left_score),
        _ => rows_apply(b, &t.right, &t.right_score),
    }
}

fn heuristic(b: u64) -> f32 {
    let t = tables();
    let tb = transpose(b);
    (0..4)
        .map(|i| {
            t.heur[((b >> (16 * i)) & 0xFFFF) as usize]
                + t.heur[((tb >> (16 * i)) & 0xFFFF) as usize]
        })
        .sum()
}

fn empties(b: u64) -> u32 {
    (0..16).filter(|i| (b >> (4 * i)) & 0xF == 0).count() as u32
}

pub fn max_exp(b: u64) -> u32 {
    (0..16)
        .map(|i| ((b >> (4 * i)) & 0xF) as u32)
        .max()
        .unwrap_or(0)
}

/// Place a 2 (p = 0.9) or 4 on a uniformly random empty cell.
fn spawn(b: u64, rng: &mut SplitMix64) -> u64 {
    let n = empties(b);
    if n == 0 {
        return b;
    }
    let mut k = rng.below(u64::from(n));
    let exp = if rng.below(10) == 0 { 2 } else { 1 };
    for i in 0..16 {
        if (b >> (4 * i)) & 0xF == 0 {
            if k == 0 {
                return b | (exp << (4 * i));
            }
            k -= 1;
        }
    }
    unreachable!("an empty cell was counted")
}

/// Depth-2 expectimax: the move whose expected best follow-up heuristic is highest.
pub fn best_move(b: u64) -> Option<usize> {
    let mut best: Option<(f32, usize)> = None;
    for m in 0..4 {
        let (after, _) = apply_move(b, m);
        if after == b {
            continue;
        }
        let mut total = 0.0;
        let mut weight = 0.0;
        for i in 0..16 {
            if (after >> (4 * i)) & 0xF != 0 {
                continue;
            }
            for (exp, p) in [(1u64, 0.9f32), (2, 0.1)] {
                let child = after | (exp << (4 * i));
                let follow = (0..4)
                    .filter_map(|m2| {
                        let (x, _) = apply_move(child, m2);
                        (x != child).then(|| heuristic(x))
                    })
                    .fold(0.0f32, f32::max);
                total += p * follow;
                weight += p;
            }
        }
        let value = if weight > 0.0 {
            total / weight
        } else {
            heuristic(after)
        };
        if best.is_none_or(|(v, _)| value > v) {
            best = Some((value, m));
        }
    }
    best.map(|(_, m)| m)
}

/// Parse `up`, `move up`, `slide Left.`, `swipe right` ... into a move index.
pub fn parse_move(action: &str) -> Option<usize> {
    let s = action.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c' | '.'));
    let mut rest = s;
    for prefix in ["move ", "slide ", "swipe "] {
        let p = prefix.len();
        if s.len() >= p && s.as_bytes()[..p].eq_ignore_ascii_case(prefix.as_bytes()) {
            rest = s[p..].trim_start_matches(' ');
            break;
        }
    }
    (0..4).find(|&m| rest.eq_ignore_ascii_case(MOVES[m]))
}

#[derive(Clone)]
pub struct Game2048 {
    target_exp: u32,
    board: u64,
    score: u64,
    moves: u64,
    rng: SplitMix64,
    started: bool,
    done: bool,
    /// The last step refused its action as unreadable ([`Env::refused`]).
    refused: bool,
}

/// `game2048` kwargs: `difficulty` (easy: 64, medium: 256, hard: 2048) or `target` (a power of
/// two, 8..=32768).
pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Env>> {
    let r = KwargsReader::new("game2048", kwargs, &["difficulty", "target"])?;
    let target = r.choice(
        "difficulty",
        "medium",
        &[("easy", 64), ("medium", 256), ("hard", 2048)],
    )?;
    let target = r.u64_or("target", target)?;
    if !target.is_power_of_two() || !(8..=32768).contains(&target) {
        return Err(CoreError::InvalidArgument(format!(
            "game2048: target must be a power of two in 8..=32768, got {target}"
        )));
    }
    Ok(Box::new(Game2048 {
        target_exp: target.trailing_zeros(),
        board: 0,
        score: 0,
        moves: 0,
        rng: SplitMix64::new(0),
        started: false,
        done: false,
        refused: false,
    }))
}

impl Game2048 {
    pub fn board(&self) -> u64 {
        self.board
    }

    fn render(&self, out: &mut String) {
        let _ = write!(out, " Score {}, move {}.", self.score, self.moves);
        for r in 0..4 {
            out.push('\n');
            for c in 0..4 {
                if c > 0 {
                    out.push(' ');
                }
                match (self.board >> (4 * (4 * r + c))) & 0xF {
                    0 => out.push('.'),
                    e => {
                        let _ = write!(out, "{}", 1u32 << e);
                    }
                }
            }
        }
    }

    fn movable(&self) -> bool {
        (0..4).any(|m| apply_move(self.board, m).0 != self.board)
    }
}

impl Env for Game2048 {
    fn reset(&mut self, task: &Task, seed: u64) -> Result<String> {
        let Task::Index(i) = task else {
            return Err(CoreError::InvalidTask {
                env: "game2048".into(),
                message: "game2048 tasks are indices only".into(),
            });
        };
        let mut opening = SplitMix64::new(derive(&[SALT, *i]));
        self.board = spawn(spawn(0, &mut opening), &mut opening);
        self.rng = SplitMix64::new(derive(&[SALT, *i, seed]));
        self.score = 0;
        self.moves = 0;
        self.started = true;
        self.done = false;
        let mut out = String::with_capacity(96);
        let _ = write!(out, "Make a {} tile.", 1u32 << self.target_exp);
        self.render(&mut out);
        Ok(out)
    }

    fn step(&mut self, action: &str) -> Step {
        self.refused = false;
        if self.done || !self.started {
            return Step::new("The episode is over.", 0.0, true);
        }
        let mut out = String::with_capacity(96);
        let Some(m) = parse_move(action) else {
            self.refused = true;
            out.push_str("Invalid action. Use up, down, left or right.");
            self.render(&mut out);
            return Step::new(out, 0.0, false);
        };
        let (after, points) = apply_move(self.board, m);
        if after == self.board {
            let _ = write!(out, "Nothing moves {}.", MOVES[m]);
            self.render(&mut out);
            return Step::new(out, 0.0, false);
        }
        self.board = spawn(after, &mut self.rng);
        self.score += u64::from(points);
        self.moves += 1;
        let _ = write!(out, "You slide {}: +{points}.", MOVES[m]);
        self.render(&mut out);
        if max_exp(self.board) >= self.target_exp {
            self.done = true;
            let _ = write!(out, "\nYou made a {} tile!", 1u32 << self.target_exp);
            return Step::new(out, 1.0, true);
        }
        if !self.movable() {
            self.done = true;
            out.push_str("\nNo moves left. Game over.");
            return Step::new(out, 0.0, true);
        }
        Step::new(out, 0.0, false)
    }

    fn refused(&self) -> bool {
        self.refused
    }

    fn valid_actions(&self) -> Vec<String> {
        if self.done || !self.started {
            return Vec::new();
        }
        (0..4)
            .filter(|&m| apply_move(self.board, m).0 != self.board)
            .map(|m| MOVES[m].to_string())
            .collect()
    }

    fn oracle_action(&self) -> Option<String> {
        if self.done || !self.started {
            return None;
        }
        best_move(self.board).map(|m| MOVES[m].to_string())
    }

    fn snapshot(&self) -> Option<Box<dyn Env>> {
        snapshot_of(self)
    }

    fn num_tasks(&self) -> u64 {
        u64::MAX
    }

    fn instructions(&self) -> String {
        format!(
            "Play 2048 on a 4x4 board (. is an empty cell). The actions are up, down, left \
             and right. All tiles slide that way; two equal tiles that meet merge into \
             their sum, which adds to your score; then a 2 (sometimes a 4) appears on a random \
             empty cell. A move that changes nothing does not count. Making a {} tile gives \
             reward 1 and ends the episode; the game is lost when no move is left.{}",
            1u32 << self.target_exp,
            crate::env::action_line("left")
        )
    }
}

#[cfg(test)]
mod tests;
