//! `negotiation`: a natural-language negotiation with private valuations for two seats
//! ("Deal or No Deal", Lewis et al. 2017). See `envs/negotiation/README.md`.
//!
//! A pool holds 1 to 4 each of three item types, [`ITEMS`] (`book`, `hat`, `ball`). Each
//! seat values each type at a whole number of points per item, privately, so that the whole
//! pool is worth exactly [`POOL_VALUE`] (10) points to it (a type may be worth 0). Seat 0
//! (role `A`) moves first, then the seats alternate, at most `max_turns` turns in all. On its
//! turn a seat says something (`say: <message>`, at most [`MAX_MESSAGE_CHARS`] characters),
//! proposes a split (`propose: book=<n> hat=<n> ball=<n>`, the items it takes; the other seat
//! gets the rest; this becomes the standing offer), accepts the other seat's standing offer
//! (`accept`: the game ends with that split) or walks away (`walk away`: no deal). On a deal
//! each seat's reward is the points of its share divided by 10, in `[0, 1]`; with no deal
//! (a walk away, or `max_turns` turns without an accepted offer) both get 0. The game is
//! general-sum: a split can be worth more than 10 points in all when the seats value the
//! types differently.
//!
//! Tasks are procedural ([`Game::num_tasks`] is `u64::MAX`): the pool and both seats' values
//! are a function of the task index alone ([`task_setup`]). The seed only breaks the ties of
//! the reference negotiator ([`Game::oracle_action`]).
//!
//! A seat's observation shows the pool, its own values (never the other seat's, not even at
//! the end), the exchange so far from its side (every message verbatim, every proposal as
//! what each seat takes), the turn count and whose move it is, or once over the result with
//! its own reward. A keyword is matched in any ASCII case, with surrounding whitespace and
//! one trailing period tolerated (a message keeps its own punctuation); anything else, or an
//! action the rules do not allow now (`accept` without a standing offer of the other seat,
//! counts beyond the pool, an empty or too long message), ends the game with
//! [`ILLEGAL_MOVE_REWARD`] for the mover and 0 for the other seat.

use crate::env::{action_line, Task};
use crate::error::{CoreError, Result};
use crate::game::{game_snapshot_of, task_index, Game, GameStep, ILLEGAL_MOVE_REWARD};
use crate::registry::{Kwargs, KwargsReader};
use crate::util::splitmix::{derive, SplitMix64};
use std::sync::OnceLock;

const SALT: u64 = 0x6E65_676F_7469_6174; // "negotiat"
/// The item types, in the order of every count and value triple.
pub const ITEMS: [&str; 3] = ["book", "hat", "ball"];
/// What the whole pool is worth to each seat.
pub const POOL_VALUE: u32 = 10;
/// The most items of one type in a pool.
pub const MAX_COUNT: u8 = 4;
/// The longest message of a `say:` action, in characters (after the prefix, trimmed).
pub const MAX_MESSAGE_CHARS: usize = 300;
/// The default of the `max_turns` kwarg.
pub const DEFAULT_MAX_TURNS: usize = 10;
/// The least and the greatest `max_turns`.
pub const FEWEST_TURNS: usize = 2;
pub const MOST_TURNS: usize = 40;
const ROLES: [&str; 2] = ["A", "B"];
/// The one message [`Game::valid_actions`] lists.
const SAY_EXAMPLE: &str = "say: Which items matter most to you?";

/// A count (or a value) per item type, in the order of [`ITEMS`].
pub type Items = [u8; 3];

/// One action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Move {
    /// `say: <message>`: the message, trimmed.
    Say(String),
    /// `propose: book=<n> hat=<n> ball=<n>`: the items the proposer takes.
    Propose(Items),
    /// `accept`: take the other seat's standing offer.
    Accept,
    /// `walk away`: end the game without a deal.
    WalkAway,
}

/// `text` without the ASCII-case-insensitive prefix `prefix`, if it starts with it.
fn strip_prefix_ci<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.get(..prefix.len())
        .filter(|head| head.eq_ignore_ascii_case(prefix))
        .map(|_| &text[prefix.len()..])
}

/// The counts of `book=<n> hat=<n> ball=<n>`: each type exactly once, in any order, terms
/// separated by whitespace, whitespace around `=` allowed, names in any ASCII case.
fn parse_terms(text: &str) -> Option<Items> {
    let mut got: [Option<u8>; 3] = [None; 3];
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let name_end = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let (name, tail) = rest.split_at(name_end);
        let i = ITEMS.iter().position(|n| name.eq_ignore_ascii_case(n))?;
        let tail = tail.trim_start().strip_prefix('=')?.trim_start();
        let digits = tail
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(tail.len());
        let n: u8 = tail[..digits].parse().ok()?;
        if got[i].replace(n).is_some() {
            return None;
        }
        let after = &tail[digits..];
        rest = after.trim_start();
        if !after.is_empty() && rest.len() == after.len() {
            return None; // the next term must follow whitespace
        }
    }
    Some([got[0]?, got[1]?, got[2]?])
}

impl Move {
    /// The action `text` names, if any: `say:` followed by 1 to [`MAX_MESSAGE_CHARS`]
    /// characters without control characters (the message, trimmed, kept verbatim);
    /// `propose:` followed by the three terms; `accept`; `walk away`. Keywords and item names
    /// in any ASCII case, surrounding whitespace and (except after `say:`) one trailing
    /// period tolerated. Counts are not checked against a pool here.
    pub fn parse(text: &str) -> Option<Move> {
        let s = text.trim();
        if let Some(message) = strip_prefix_ci(s, "say:") {
            let message = message.trim();
            let chars = message.chars().count();
            let readable =
                (1..=MAX_MESSAGE_CHARS).contains(&chars) && !message.chars().any(char::is_control);
            return readable.then(|| Move::Say(message.to_string()));
        }
        let s = s.strip_suffix('.').unwrap_or(s).trim_end();
        if let Some(terms) = strip_prefix_ci(s, "propose:") {
            return parse_terms(terms).map(Move::Propose);
        }
        if s.eq_ignore_ascii_case("accept") {
            return Some(Move::Accept);
        }
        let mut words = s.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some(w), Some(a), None)
                if w.eq_ignore_ascii_case("walk") && a.eq_ignore_ascii_case("away") =>
            {
                Some(Move::WalkAway)
            }
            _ => None,
        }
    }
}

/// `book=<n> hat=<n> ball=<n>` of `items`.
pub fn terms(items: &Items) -> String {
    format!(
        "{}={} {}={} {}={}",
        ITEMS[0], items[0], ITEMS[1], items[1], ITEMS[2], items[2]
    )
}

/// The points `items` are worth at `values` per item.
pub fn worth(values: &Items, items: &Items) -> u32 {
    values
        .iter()
        .zip(items)
        .map(|(&v, &n)| u32::from(v) * u32::from(n))
        .sum()
}

/// What is left of `pool` once `taken` is taken out (`taken` within `pool`).
fn rest(pool: &Items, taken: &Items) -> Items {
    [0, 1, 2].map(|i| pool[i] - taken[i])
}

fn item_count(items: &Items) -> u32 {
    items.iter().map(|&n| u32::from(n)).sum()
}

/// Every split of `pool` as the items one seat takes: book count major, ball count minor,
/// ascending (at most 5 * 5 * 5 = 125).
pub fn splits(pool: &Items) -> Vec<Items> {
    let mut out = Vec::with_capacity(125);
    for book in 0..=pool[0] {
        for hat in 0..=pool[1] {
            for ball in 0..=pool[2] {
                out.push([book, hat, ball]);
            }
        }
    }
    out
}

/// Every pool (counts 1..=[`MAX_COUNT`] per type) that some values make worth exactly
/// [`POOL_VALUE`], with those values (book value major, ascending); computed once.
fn pools() -> &'static [(Items, Vec<Items>)] {
    static TABLE: OnceLock<Vec<(Items, Vec<Items>)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut out = Vec::new();
        for pool in splits(&[MAX_COUNT - 1; 3]) {
            let pool = pool.map(|n| n + 1);
            let values: Vec<Items> = splits(&[POOL_VALUE as u8; 3])
                .into_iter()
                .filter(|v| worth(v, &pool) == POOL_VALUE)
                .collect();
            if !values.is_empty() {
                out.push((pool, values));
            }
        }
        out
    })
}

/// Task `index`'s pool and both seats' values (seat 0's, seat 1's): a pool drawn uniformly
/// among those some values make worth exactly [`POOL_VALUE`], then each seat's values
/// uniformly and independently among those values, all from
/// `SplitMix64::new(derive([SALT, index]))`.
pub fn task_setup(index: u64) -> (Items, [Items; 2]) {
    let table = pools();
    let mut rng = SplitMix64::new(derive(&[SALT, index]));
    let (pool, values) = &table[rng.below(table.len() as u64) as usize];
    let a = values[rng.below(values.len() as u64) as usize];
    let b = values[rng.below(values.len() as u64) as usize];
    (*pool, [a, b])
}

/// Whether an offer worth `got` points clears the acceptance threshold of `seat` on the
/// game's turn `turn` (0-based) of `max_turns`: 7 points on the seat's first turn, falling
/// linearly to 3 on its last possible turn (3 when that is its only turn).
pub fn meets_threshold(got: u32, seat: usize, turn: usize, max_turns: usize) -> bool {
    let own_turns = (max_turns + 1 - seat.min(1)) / 2;
    let k = (turn / 2) as u32; // this is the seat's k-th turn, from 0
    if own_turns <= 1 {
        return got >= 3;
    }
    let span = own_turns as u32 - 1;
    // got >= 7 - 4 k / span, in whole numbers
    got * span + 4 * k >= 7 * span
}

/// A negotiation game (one pool per episode).
#[derive(Debug, Clone)]
pub struct Negotiation {
    max_turns: usize,
    /// The counts of the pool.
    pool: Items,
    /// Each seat's value per item.
    values: [Items; 2],
    seed: u64,
    /// The moves so far; seat `k % 2` made move `k`.
    history: Vec<Move>,
    /// The standing offer: the seat that proposed it and the items it takes.
    offer: Option<(usize, Items)>,
    /// The seat whose unreadable or illegal action ended the game.
    refused: Option<usize>,
    started: bool,
}

/// `negotiation` kwargs: `max_turns` (the most turns of both seats together, 2..=40,
/// default 10).
pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Game>> {
    let r = KwargsReader::new("negotiation", kwargs, &["max_turns"])?;
    let max_turns = r.u64_or("max_turns", DEFAULT_MAX_TURNS as u64)?;
    if !(FEWEST_TURNS as u64..=MOST_TURNS as u64).contains(&max_turns) {
        return Err(CoreError::InvalidArgument(format!(
            "negotiation: max_turns must be in {FEWEST_TURNS}..={MOST_TURNS}, got {max_turns}"
        )));
    }
    Ok(Box::new(Negotiation::new(max_turns as usize)))
}

impl Default for Negotiation {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_TURNS)
    }
}

fn plural(n: u8, name: &str) -> String {
    if n == 1 {
        format!("{n} {name}")
    } else {
        format!("{n} {name}s")
    }
}

/// A reward of `points` out of [`POOL_VALUE`] as a decimal (`0`, `0.3`, `1`).
fn tenths(points: u32) -> String {
    match points {
        0 => "0".into(),
        10 => "1".into(),
        p => format!("0.{p}"),
    }
}

impl Negotiation {
    /// A game of at most `max_turns` turns (clamped to 2..=40); it starts at the first reset.
    pub fn new(max_turns: usize) -> Self {
        let max_turns = max_turns.clamp(FEWEST_TURNS, MOST_TURNS);
        Self {
            max_turns,
            pool: [1; 3],
            values: [[0; 3]; 2],
            seed: 0,
            history: Vec::with_capacity(max_turns),
            offer: None,
            refused: None,
            started: false,
        }
    }

    /// Start an episode on `pool` with `values` (seat 0's, seat 1's), which must make the
    /// pool worth exactly [`POOL_VALUE`] to each seat (counts 1..=[`MAX_COUNT`]).
    pub(crate) fn reset_with(&mut self, pool: Items, values: [Items; 2], seed: u64) {
        assert!(pool.iter().all(|n| (1..=MAX_COUNT).contains(n)), "{pool:?}");
        assert!(
            values.iter().all(|v| worth(v, &pool) == POOL_VALUE),
            "{values:?} on {pool:?}"
        );
        self.pool = pool;
        self.values = values;
        self.seed = seed;
        self.history.clear();
        self.offer = None;
        self.refused = None;
        self.started = true;
    }

    /// The most turns of an episode.
    pub fn max_turns(&self) -> usize {
        self.max_turns
    }

    /// The counts of the pool.
    pub fn pool(&self) -> Items {
        self.pool
    }

    /// Seat `seat`'s value per item.
    pub fn values(&self, seat: usize) -> Items {
        self.values[seat.min(1)]
    }

    /// The moves so far (seat `k % 2` made move `k`).
    pub fn history(&self) -> &[Move] {
        &self.history
    }

    /// The items each seat gets (seat 0's, seat 1's) once an offer was accepted.
    pub fn deal(&self) -> Option<[Items; 2]> {
        match (self.history.last(), self.offer) {
            (Some(Move::Accept), Some((proposer, taken))) if self.refused.is_none() => {
                let other = rest(&self.pool, &taken);
                Some(if proposer == 0 {
                    [taken, other]
                } else {
                    [other, taken]
                })
            }
            _ => None,
        }
    }

    /// The seat to move, `None` before the first reset and once the game is over.
    fn mover(&self) -> Option<usize> {
        let ended = matches!(self.history.last(), Some(Move::Accept | Move::WalkAway));
        (self.started && self.refused.is_none() && !ended && self.history.len() < self.max_turns)
            .then_some(self.history.len() % 2)
    }

    /// `mv` by `seat` is allowed now: counts within the pool, `accept` only of the other
    /// seat's standing offer.
    fn allowed(&self, seat: usize, mv: &Move) -> bool {
        match mv {
            Move::Propose(taken) => taken.iter().zip(&self.pool).all(|(t, p)| t <= p),
            Move::Accept => self.offer.is_some_and(|(proposer, _)| proposer != seat),
            Move::Say(_) | Move::WalkAway => true,
        }
    }

    /// Move `k` (by seat `k % 2`) as seat `seat` reads it.
    fn told(&self, seat: usize, k: usize, mv: &Move) -> String {
        let by = k % 2;
        let (who, other) = (ROLES[by], ROLES[1 - by]);
        let mine = by == seat;
        match mv {
            Move::Say(text) if mine => format!("You said: \"{text}\""),
            Move::Say(text) => format!("{who} said: \"{text}\""),
            Move::Propose(taken) => {
                let left = terms(&rest(&self.pool, taken));
                if mine {
                    format!(
                        "You proposed: you take {}, {other} takes {left}.",
                        terms(taken)
                    )
                } else {
                    format!(
                        "{who} proposed: {who} takes {}, you take {left}.",
                        terms(taken)
                    )
                }
            }
            Move::Accept if mine => "You accepted.".into(),
            Move::Accept => format!("{who} accepted."),
            Move::WalkAway if mine => "You walked away.".into(),
            Move::WalkAway => format!("{who} walked away."),
        }
    }
}

impl Game for Negotiation {
    fn seats(&self) -> usize {
        2
    }

    fn role(&self, seat: usize) -> String {
        ROLES[seat.min(1)].to_string()
    }

    fn reset(&mut self, task: &Task, seed: u64) -> Result<()> {
        let index = task_index(
            "negotiation",
            task,
            "indices (any u64 draws a pool and values)",
        )?;
        let (pool, values) = task_setup(index);
        self.reset_with(pool, values, seed);
        Ok(())
    }

    fn to_move(&self) -> Vec<usize> {
        self.mover().into_iter().collect()
    }

    fn observation(&self, seat: usize) -> String {
        if !self.started {
            return "The game has not started.".into();
        }
        let seat = seat.min(1);
        let other = ROLES[1 - seat];
        let mine = &self.values[seat];
        let mut out = String::with_capacity(400);
        out.push_str(&format!(
            "You are {}. Pool: {}, {}, {}.\nYour values: {} {}, {} {}, {} {}. The other \
             player's values are private.\n",
            ROLES[seat],
            plural(self.pool[0], ITEMS[0]),
            plural(self.pool[1], ITEMS[1]),
            plural(self.pool[2], ITEMS[2]),
            ITEMS[0],
            mine[0],
            ITEMS[1],
            mine[1],
            ITEMS[2],
            mine[2],
        ));
        for (k, mv) in self.history.iter().enumerate() {
            out.push_str(&format!("Turn {}: {}\n", k + 1, self.told(seat, k, mv)));
        }
        if let Some(bad) = self.refused {
            let turn = self.history.len() + 1;
            out.push_str(&if bad == seat {
                format!(
                    "Turn {turn}: Your move was unreadable or illegal. The game is over. Your \
                     reward is -1."
                )
            } else {
                format!(
                    "Turn {turn}: {other}'s move was unreadable or illegal. The game is over. \
                     Your reward is 0."
                )
            });
            return out;
        }
        if let Some(m) = self.mover() {
            out.push_str(&format!(
                "Turn {} of {}. ",
                self.history.len() + 1,
                self.max_turns
            ));
            if m == seat {
                out.push_str("Your move.");
            } else {
                out.push_str("Waiting for ");
                out.push_str(ROLES[m]);
                out.push('.');
            }
            return out;
        }
        match self.deal() {
            Some(shares) => out.push_str(&format!(
                "Deal: you take {}, {other} takes {}. Your reward is {}.",
                terms(&shares[seat]),
                terms(&shares[1 - seat]),
                tenths(worth(mine, &shares[seat]))
            )),
            None if self.history.last() == Some(&Move::WalkAway) => {
                out.push_str("No deal. Your reward is 0.")
            }
            None => out.push_str(&format!(
                "No deal after {} turns. Your reward is 0.",
                self.max_turns
            )),
        }
        out
    }

    fn step(&mut self, moves: &[&str]) -> GameStep {
        let Some(seat) = self.mover() else {
            return GameStep::already_over();
        };
        let text = moves.first().copied().unwrap_or("");
        match Move::parse(text).filter(|mv| self.allowed(seat, mv)) {
            Some(mv) => {
                if let Move::Propose(taken) = mv {
                    self.offer = Some((seat, taken));
                }
                self.history.push(mv);
            }
            None => self.refused = Some(seat),
        }
        GameStep {
            refused: vec![self.refused.is_some()],
            over: self.mover().is_none(),
        }
    }

    fn rewards(&self) -> Vec<f32> {
        if let Some(bad) = self.refused {
            let mut r = vec![0.0; 2];
            r[bad] = ILLEGAL_MOVE_REWARD;
            return r;
        }
        match self.deal() {
            Some(shares) => (0..2)
                .map(|s| worth(&self.values[s], &shares[s]) as f32 / POOL_VALUE as f32)
                .collect(),
            None => vec![0.0; 2],
        }
    }

    fn valid_actions(&self, seat: usize) -> Vec<String> {
        if self.mover() != Some(seat) {
            return Vec::new();
        }
        let mut out = vec!["walk away".to_string()];
        if self.allowed(seat, &Move::Accept) {
            out.push("accept".into());
        }
        out.push(SAY_EXAMPLE.into());
        out.extend(
            splits(&self.pool)
                .iter()
                .map(|s| format!("propose: {}", terms(s))),
        );
        out
    }

    /// Accept the other seat's standing offer when it is worth at least the seat's
    /// threshold ([`meets_threshold`]), or, on the game's last turn, anything above 0;
    /// otherwise walk away on the last turn, else propose the split worth most to the seat
    /// among those leaving the other seat at least `1 + p` items (`p`: the seat's proposals
    /// so far; at most all items but one), ties broken by `derive([SALT, seed, turn])` (turn
    /// counted from 1) over those splits in [`splits`] order. Uses only the seat's own values.
    fn oracle_action(&self, seat: usize) -> Option<String> {
        if self.mover() != Some(seat) {
            return None;
        }
        let turn = self.history.len();
        let last = turn + 1 == self.max_turns;
        let mine = &self.values[seat];
        if let Some((_, taken)) = self.offer.filter(|&(proposer, _)| proposer != seat) {
            let got = worth(mine, &rest(&self.pool, &taken));
            if (last && got > 0) || meets_threshold(got, seat, turn, self.max_turns) {
                return Some("accept".into());
            }
        }
        if last {
            return Some("walk away".into());
        }
        let proposals = self
            .history
            .iter()
            .skip(seat)
            .step_by(2)
            .filter(|mv| matches!(mv, Move::Propose(_)))
            .count() as u32;
        let total = item_count(&self.pool);
        let give = (1 + proposals).min(total - 1);
        let candidates: Vec<Items> = splits(&self.pool)
            .into_iter()
            .filter(|s| total - item_count(s) >= give)
            .collect();
        let best = candidates.iter().map(|s| worth(mine, s)).max()?;
        let ties: Vec<&Items> = candidates
            .iter()
            .filter(|s| worth(mine, s) == best)
            .collect();
        let k = derive(&[SALT, self.seed, turn as u64 + 1]) % ties.len() as u64;
        Some(format!("propose: {}", terms(ties[k as usize])))
    }

    fn num_tasks(&self) -> u64 {
        u64::MAX
    }

    fn instructions(&self, seat: usize) -> String {
        let n = self.max_turns;
        let mut s = format!(
            "You are negotiating with another player over how to split a pool of items: \
             books, hats and balls, 1 to 4 of each. Each of you values each kind of item at a \
             whole number of points per item, and the whole pool is worth exactly 10 points to \
             each of you; your values are shown to you, the other player's are private and may \
             differ from yours. The players take turns, A first, at most {n} turns in all. On \
             your turn reply with exactly one of these actions:\n\
             - say: <message> sends the other player a message of at most {MAX_MESSAGE_CHARS} \
             characters. Example: say: I mostly care about the hats.\n\
             - propose: book=<n> hat=<n> ball=<n> offers a split: the items you take, the \
             other player gets the rest. It becomes the standing offer, replacing any earlier \
             one. Example: propose: book=1 hat=2 ball=0\n\
             - accept takes the standing offer when the other player made it: the game ends \
             with that split. Example: accept\n\
             - walk away ends the game without a deal. Example: walk away\n\
             With a deal your reward is the points of the items you get divided by 10 (0 to 1); \
             without one (a walk away, or no accepted offer after {n} turns) both rewards are \
             0. An unreadable or illegal action (accepting your own offer or none, more items \
             than the pool has, an empty or longer message) ends the game: -1 for you, 0 for \
             the other player."
        );
        s.push_str(if seat == 0 {
            " You are A: you move first."
        } else {
            " You are B: A moves first."
        });
        s.push_str(&action_line("propose: book=1 hat=2 ball=0"));
        s
    }

    fn snapshot(&self) -> Option<Box<dyn Game>> {
        game_snapshot_of(self)
    }
}

#[cfg(test)]
mod tests;
