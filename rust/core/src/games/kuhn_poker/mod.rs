//! `kuhn_poker`: Kuhn poker for two seats, the smallest poker with hidden information. See
//! `envs/kuhn_poker/README.md`.
//!
//! The deck is Jack < Queen < King. Each seat antes 1 chip and is dealt one card the other
//! cannot see. Seat 0 (role `first`) checks or bets 1 chip. After a check, seat 1 (role
//! `second`) checks (showdown for the 2-chip pot) or bets; after a bet the other seat calls
//! (showdown for the 4-chip pot) or folds (the bettor takes the pot unseen). A seat's reward
//! is the chips it won or lost: +-1 after check-check or a fold, +-2 after a call.
//!
//! Tasks are the 6 deals (ordered pairs of distinct cards, [`DEALS`]); the seed drives only
//! the mixed equilibrium strategy of [`Game::oracle_action`] (Kuhn's Nash equilibrium with
//! alpha = 1/3, [`bet_or_call_thirds`]), whose draws are a function of the seed, the deal and
//! the number of actions so far.
//!
//! A seat's observation shows its own card, the betting so far from its side and, once
//! over, the result. The opponent's card appears only at a showdown (public in poker); a
//! folded hand is never revealed. An action is `check`, `bet`, `call` or `fold` (any ASCII
//! case, surrounding whitespace and one trailing period tolerated); anything else, or a word
//! the rules do not allow now, ends the game with [`ILLEGAL_MOVE_REWARD`] for the mover and
//! 0 for the other seat.

use crate::env::{action_line, Task};
use crate::error::Result;
use crate::game::{game_snapshot_of, task_index, Game, GameStep, ILLEGAL_MOVE_REWARD};
use crate::registry::{Kwargs, KwargsReader};
use crate::util::splitmix::{derive, SplitMix64};

const SALT: u64 = 0x6B75_686E; // "kuhn"
/// Card names by rank (0 = Jack, 1 = Queen, 2 = King).
pub const CARDS: [&str; 3] = ["Jack", "Queen", "King"];
/// The deals by task index (modulo 6): (seat 0's card, seat 1's card).
pub const DEALS: [(u8, u8); 6] = [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)];
const ROLES: [&str; 2] = ["first", "second"];

/// One betting action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    Check,
    Bet,
    Call,
    Fold,
}

impl Act {
    pub fn word(self) -> &'static str {
        match self {
            Act::Check => "check",
            Act::Bet => "bet",
            Act::Call => "call",
            Act::Fold => "fold",
        }
    }

    /// Bet or call (the chips go in), as opposed to check or fold.
    pub fn aggressive(self) -> bool {
        matches!(self, Act::Bet | Act::Call)
    }

    /// The action `text` names (any ASCII case, surrounding whitespace and one trailing
    /// period tolerated), if any.
    pub fn parse(text: &str) -> Option<Act> {
        let s = text.trim();
        let s = s.strip_suffix('.').unwrap_or(s).trim_end();
        [Act::Check, Act::Bet, Act::Call, Act::Fold]
            .into_iter()
            .find(|a| s.eq_ignore_ascii_case(a.word()))
    }

    /// What the seat that made it did, from its side and from the other's.
    fn told(self, mine: bool) -> &'static str {
        match (self, mine) {
            (Act::Check, true) => "You checked.",
            (Act::Bet, true) => "You bet.",
            (Act::Call, true) => "You called.",
            (Act::Fold, true) => "You folded.",
            (Act::Check, false) => "The opponent checked.",
            (Act::Bet, false) => "The opponent bet.",
            (Act::Call, false) => "The opponent called.",
            (Act::Fold, false) => "The opponent folded.",
        }
    }
}

/// The seat to move after `history` (`None` once the betting is over).
pub fn mover(history: &[Act]) -> Option<usize> {
    match history {
        [] | [Act::Check, Act::Bet] => Some(0),
        [Act::Check] | [Act::Bet] => Some(1),
        _ => None,
    }
}

/// The legal actions after `history`: check or bet, call or fold (empty once the betting is
/// over).
pub fn legal(history: &[Act]) -> &'static [Act] {
    match history {
        [] | [Act::Check] => &[Act::Check, Act::Bet],
        [Act::Bet] | [Act::Check, Act::Bet] => &[Act::Call, Act::Fold],
        _ => &[],
    }
}

/// Seat 0's chips at the end of a finished betting `history` with `cards` (seat 0's, seat
/// 1's); seat 1 gets the opposite.
pub fn payoff(cards: (u8, u8), history: &[Act]) -> i32 {
    let showdown = |stake: i32| if cards.0 > cards.1 { stake } else { -stake };
    match history {
        [Act::Check, Act::Check] => showdown(1),
        [Act::Check, Act::Bet, Act::Call] | [Act::Bet, Act::Call] => showdown(2),
        [Act::Check, Act::Bet, Act::Fold] => -1,
        [Act::Bet, Act::Fold] => 1,
        _ => 0,
    }
}

/// The equilibrium strategy (Kuhn's, alpha = 1/3): in thirds, the probability that the seat
/// to move after `history` holding `card` takes the aggressive action (bet after nothing or
/// a check, call facing a bet). First seat: Jack bets 1/3 and folds to a bet after checking;
/// Queen checks and calls a bet 2/3 (alpha + 1/3); King bets 3/3 (3 * alpha) and calls.
/// Second seat: facing a bet King calls, Queen calls 1/3, Jack folds; facing a check King
/// bets, Queen checks, Jack bets 1/3. The game's value for the first seat is -1/18.
pub fn bet_or_call_thirds(card: u8, history: &[Act]) -> u64 {
    const BY_CARD: [[u64; 3]; 4] = [
        [1, 0, 3], // seat 0 opens: bet
        [1, 0, 3], // seat 1 after a check: bet
        [0, 1, 3], // seat 1 facing a bet: call
        [0, 2, 3], // seat 0 after check-bet: call
    ];
    let row = match history {
        [] => 0,
        [Act::Check] => 1,
        [Act::Bet] => 2,
        _ => 3,
    };
    BY_CARD[row][card as usize]
}

/// A Kuhn poker game (one deal per episode).
#[derive(Debug, Clone)]
pub struct KuhnPoker {
    /// The deal index (0..6) and its cards.
    deal: usize,
    cards: (u8, u8),
    seed: u64,
    history: Vec<Act>,
    /// The seat whose unreadable or illegal action ended the game.
    refused: Option<usize>,
    started: bool,
}

/// `kuhn_poker` takes no kwargs.
pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Game>> {
    KwargsReader::new("kuhn_poker", kwargs, &[])?;
    Ok(Box::new(KuhnPoker::new()))
}

impl Default for KuhnPoker {
    fn default() -> Self {
        Self::new()
    }
}

impl KuhnPoker {
    pub fn new() -> Self {
        Self {
            deal: 0,
            cards: DEALS[0],
            seed: 0,
            history: Vec::with_capacity(3),
            refused: None,
            started: false,
        }
    }

    /// The cards of the current deal: (seat 0's, seat 1's).
    pub fn cards(&self) -> (u8, u8) {
        self.cards
    }

    /// The betting so far.
    pub fn history(&self) -> &[Act] {
        &self.history
    }

    fn card(&self, seat: usize) -> u8 {
        if seat == 0 {
            self.cards.0
        } else {
            self.cards.1
        }
    }

    fn playing(&self) -> bool {
        self.started && self.refused.is_none() && mover(&self.history).is_some()
    }

    /// Chips in the pot (the antes and the bets so far).
    fn pot(&self) -> usize {
        2 + self.history.iter().filter(|a| a.aggressive()).count()
    }
}

fn chips(n: i32) -> &'static str {
    if n.abs() == 1 {
        "chip"
    } else {
        "chips"
    }
}

impl Game for KuhnPoker {
    fn seats(&self) -> usize {
        2
    }

    fn role(&self, seat: usize) -> String {
        ROLES[seat.min(1)].to_string()
    }

    fn reset(&mut self, task: &Task, seed: u64) -> Result<()> {
        let i = task_index("kuhn_poker", task, "deal indices (0..6)")?;
        self.deal = (i % DEALS.len() as u64) as usize;
        self.cards = DEALS[self.deal];
        self.seed = seed;
        self.history.clear();
        self.refused = None;
        self.started = true;
        Ok(())
    }

    fn to_move(&self) -> Vec<usize> {
        if self.playing() {
            mover(&self.history).into_iter().collect()
        } else {
            Vec::new()
        }
    }

    fn observation(&self, seat: usize) -> String {
        if !self.started {
            return "The game has not started.".into();
        }
        let seat = seat.min(1);
        let mut out = String::with_capacity(200);
        out.push_str("Your card: the ");
        out.push_str(CARDS[self.card(seat) as usize]);
        out.push('.');
        for (k, a) in self.history.iter().enumerate() {
            // seats alternate: seat 0 made actions 0 and 2, seat 1 action 1
            out.push(' ');
            out.push_str(a.told(k % 2 == seat));
        }
        if let Some(bad) = self.refused {
            out.push_str(if bad == seat {
                " Your action was not a legal move. The game is over: your reward is -1."
            } else {
                " The opponent's action was not a legal move. The game is over: your reward \
                 is 0."
            });
            return out;
        }
        match mover(&self.history) {
            Some(m) => {
                out.push_str(" Pot: ");
                out.push_str(&self.pot().to_string());
                out.push_str(" chips.");
                if m == seat {
                    let words = legal(&self.history);
                    out.push_str(" Your move: ");
                    out.push_str(words[0].word());
                    out.push_str(" or ");
                    out.push_str(words[1].word());
                    out.push('.');
                } else {
                    out.push_str(" Waiting for the opponent.");
                }
            }
            None => {
                let won = if seat == 0 {
                    payoff(self.cards, &self.history)
                } else {
                    -payoff(self.cards, &self.history)
                };
                if self.history.last() == Some(&Act::Fold) {
                    // the folded hand stays hidden
                } else {
                    out.push_str(" Showdown: you had the ");
                    out.push_str(CARDS[self.card(seat) as usize]);
                    out.push_str(", the opponent the ");
                    out.push_str(CARDS[self.card(1 - seat) as usize]);
                    out.push('.');
                }
                out.push_str(if won > 0 { " You win " } else { " You lose " });
                out.push_str(&won.abs().to_string());
                out.push(' ');
                out.push_str(chips(won));
                out.push('.');
            }
        }
        out
    }

    fn step(&mut self, moves: &[&str]) -> GameStep {
        let Some(seat) = self.to_move().first().copied() else {
            return GameStep::already_over();
        };
        let text = moves.first().copied().unwrap_or("");
        match Act::parse(text).filter(|a| legal(&self.history).contains(a)) {
            Some(a) => self.history.push(a),
            None => self.refused = Some(seat),
        }
        GameStep {
            refused: vec![self.refused.is_some()],
            over: !self.playing(),
        }
    }

    fn rewards(&self) -> Vec<f32> {
        if let Some(bad) = self.refused {
            let mut r = vec![0.0; 2];
            r[bad] = ILLEGAL_MOVE_REWARD;
            return r;
        }
        let p = payoff(self.cards, &self.history) as f32;
        vec![p, -p]
    }

    fn valid_actions(&self, seat: usize) -> Vec<String> {
        if !self.playing() || mover(&self.history) != Some(seat) {
            return Vec::new();
        }
        legal(&self.history)
            .iter()
            .map(|a| a.word().to_string())
            .collect()
    }

    fn oracle_action(&self, seat: usize) -> Option<String> {
        if !self.playing() || mover(&self.history) != Some(seat) {
            return None;
        }
        let thirds = bet_or_call_thirds(self.card(seat), &self.history);
        let key = derive(&[SALT, self.seed, self.deal as u64, self.history.len() as u64]);
        let aggressive = SplitMix64::new(key).below(3) < thirds;
        legal(&self.history)
            .iter()
            .find(|a| a.aggressive() == aggressive)
            .map(|a| a.word().to_string())
    }

    fn num_tasks(&self) -> u64 {
        DEALS.len() as u64
    }

    fn instructions(&self, seat: usize) -> String {
        let mut s = String::from(
            "You are playing Kuhn poker against one opponent. The deck has three cards: Jack, \
             Queen and King (King is highest). Each player puts 1 chip in the pot and gets one \
             card that the other cannot see. The first player checks or bets 1 chip. After a \
             check, the second player checks (showdown) or bets 1 chip. Facing a bet, a player \
             calls (puts in 1 chip too, showdown) or folds (the bettor takes the pot and no \
             card is shown). At a showdown the higher card wins the pot. Your reward is the \
             chips you win or lose: 1 after check-check or a fold, 2 after a call. The actions \
             are check, bet, call and fold; an unreadable or illegal action ends the game with \
             reward -1 for you and 0 for the opponent.",
        );
        s.push_str(if seat == 0 {
            " You are the first player: you act first."
        } else {
            " You are the second player: the opponent acts first."
        });
        s.push_str(&action_line("check"));
        s
    }

    fn snapshot(&self) -> Option<Box<dyn Game>> {
        game_snapshot_of(self)
    }
}

#[cfg(test)]
mod tests;
