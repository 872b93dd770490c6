//! `wordle`: guess the secret five-letter word in six tries from per-letter feedback
//! (`G` right letter in the right spot, `Y` in the word elsewhere, `B` not in the word, with
//! real Wordle's duplicate-letter rule). See `envs/wordle/README.md`.
//!
//! Task `i` is answer `i` of `envs/wordle/answers.txt` (a fixed shuffled order, so any index
//! range is an unbiased sample); guesses must be in `envs/wordle/words.txt`. The episode seed
//! only drives the sampled `valid_actions`. `bench/baselines/wordle_py.py` mirrors it.

use crate::env::{push_decimal, snapshot_of, vec_bytes, Env, Step, Task};
use crate::error::{CoreError, Result};
use crate::registry::{Kwargs, KwargsReader};
use crate::util::splitmix::{derive, SplitMix64};
use std::sync::OnceLock;

const ANSWERS_TXT: &str = include_str!("../../../../../envs/wordle/answers.txt");
const WORDS_TXT: &str = include_str!("../../../../../envs/wordle/words.txt");
const SALT: u64 = 0x776F_7264; // "word"
/// Percent of the answers (at the end of the list) that form the `test` split.
const TEST_PERCENT: usize = 15;
/// The oracle's fixed first guess (best split of the answer list among simple openers).
const OPENER: Word = *b"crate";
/// The oracle scores at most this many candidates as guesses (keeps a call around 1 ms).
const SCORE_LIMIT: usize = 200;

pub type Word = [u8; 5];
/// Feedback of one guess as a base-3 number: digit `i` (most significant first) is 0 = B,
/// 1 = Y, 2 = G for letter `i`; 242 means solved.
pub type Code = u8;
pub const SOLVED: Code = 242;

struct Lists {
    answers: Vec<Word>,
    /// Allowed guesses, sorted for binary search.
    allowed: Vec<Word>,
}

fn read_words(text: &str) -> Vec<Word> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.as_bytes()
                .try_into()
                .expect("word lists hold five-letter words")
        })
        .collect()
}

fn lists() -> &'static Lists {
    static LISTS: OnceLock<Lists> = OnceLock::new();
    LISTS.get_or_init(|| {
        let answers = read_words(ANSWERS_TXT);
        let mut allowed = read_words(WORDS_TXT);
        allowed.sort_unstable();
        Lists { answers, allowed }
    })
}

fn is_allowed(w: &Word) -> bool {
    lists().allowed.binary_search(w).is_ok()
}

/// Wordle feedback of `guess` against `answer`: greens first, then yellows left to right
/// while unmatched copies of the letter remain in the answer.
pub fn feedback(guess: &Word, answer: &Word) -> Code {
    let mut left = [0u8; 26];
    let mut marks = [0u8; 5];
    for i in 0..5 {
        if guess[i] == answer[i] {
            marks[i] = 2;
        } else {
            left[(answer[i] - b'a') as usize] += 1;
        }
    }
    for i in 0..5 {
        let slot = &mut left[(guess[i] - b'a') as usize];
        if marks[i] == 0 && *slot > 0 {
            marks[i] = 1;
            *slot -= 1;
        }
    }
    marks.iter().fold(0, |acc, &m| acc * 3 + m)
}

/// The feedback code as `c=B r=Y a=G n=B e=B`.
pub fn write_feedback(out: &mut String, guess: &Word, code: Code) {
    let mut digits = [0u8; 5];
    let mut c = code;
    for i in (0..5).rev() {
        digits[i] = c % 3;
        c /= 3;
    }
    // `g=M ` five times, built as bytes and appended once (the last space dropped).
    let mut text = [b' '; 20];
    for i in 0..5 {
        text[4 * i] = guess[i];
        text[4 * i + 1] = b'=';
        text[4 * i + 2] = [b'B', b'Y', b'G'][digits[i] as usize];
    }
    out.push_str(std::str::from_utf8(&text[..19]).expect("ascii letters"));
}

/// What an action asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// A five-letter word (lowercased), allowed or not.
    Word(Word),
    /// Anything else.
    Invalid,
}

/// Parse `guess crane`, `Guess: CRANE`, or a bare `crane` (surrounding `.` and spaces ignored).
pub fn parse_guess(action: &str) -> Parsed {
    let s = action.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c' | '.'));
    let b = s.as_bytes();
    let rest =
        if b.len() >= 6 && b[..5].eq_ignore_ascii_case(b"guess") && matches!(b[5], b' ' | b':') {
            s[6..].trim_start_matches(' ')
        } else {
            s
        };
    let r = rest.as_bytes();
    if r.len() != 5 || !r.iter().all(u8::is_ascii_alphabetic) {
        return Parsed::Invalid;
    }
    let mut w = [0u8; 5];
    for (o, c) in w.iter_mut().zip(r) {
        *o = c.to_ascii_lowercase();
    }
    Parsed::Word(w)
}

/// The reference solver: the answer-list words consistent with every (guess, feedback)
/// so far (all allowed words if none is), the fixed opener first, then the candidate that
/// splits the candidates into the most feedback groups (ties: earliest in list order).
pub fn solve(history: &[(Word, Code)]) -> Word {
    if history.is_empty() {
        return OPENER;
    }
    let consistent = |w: &Word| history.iter().all(|(g, c)| feedback(g, w) == *c);
    let l = lists();
    let mut cands: Vec<Word> = l
        .answers
        .iter()
        .filter(|w| consistent(w))
        .copied()
        .collect();
    if cands.is_empty() {
        cands = l
            .allowed
            .iter()
            .filter(|w| consistent(w))
            .copied()
            .collect();
    }
    if cands.len() <= 2 {
        return cands.first().copied().unwrap_or(OPENER);
    }
    let mut best = (0usize, cands[0]);
    let mut seen = [false; 243];
    for g in cands.iter().take(SCORE_LIMIT) {
        seen.fill(false);
        let mut groups = 0;
        for a in &cands {
            let c = feedback(g, a) as usize;
            groups += usize::from(!seen[c]);
            seen[c] = true;
        }
        // A guess that may itself be the answer and leaves only singletons is optimal.
        if groups > best.0 {
            best = (groups, *g);
            if groups == cands.len() {
                break;
            }
        }
    }
    best.1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ValidMode {
    Sample,
    Consistent,
}

#[derive(Clone)]
pub struct WordleEnv {
    max_guesses: usize,
    num_valid: usize,
    mode: ValidMode,
    /// Answer-list indices of this split.
    range: std::ops::Range<usize>,
    answer: Word,
    seed: u64,
    history: Vec<(Word, Code)>,
    started: bool,
    done: bool,
    /// The last step refused its action as unreadable ([`Env::refused`]).
    refused: bool,
}

/// `wordle` kwargs: `max_guesses` (1..=20, default 6), `split` (all | train | test),
/// `valid_actions` (`sample`: `num_valid_actions` answer words drawn from the seed and turn,
/// default; `consistent`: the answer words still consistent with the feedback),
/// `num_valid_actions` (0..=200, default 20).
pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Env>> {
    let allowed = ["max_guesses", "split", "valid_actions", "num_valid_actions"];
    let r = KwargsReader::new("wordle", kwargs, &allowed)?;
    let max_guesses = r.u64_or("max_guesses", 6)?;
    if !(1..=20).contains(&max_guesses) {
        return Err(CoreError::InvalidArgument(format!(
            "wordle: max_guesses must be in 1..=20, got {max_guesses}"
        )));
    }
    let n = lists().answers.len();
    let cut = n - n * TEST_PERCENT / 100;
    let range = r.choice(
        "split",
        "all",
        &[("all", 0..n), ("train", 0..cut), ("test", cut..n)],
    )?;
    let mode = r.choice(
        "valid_actions",
        "sample",
        &[
            ("sample", ValidMode::Sample),
            ("consistent", ValidMode::Consistent),
        ],
    )?;
    let num_valid = r.u64_or("num_valid_actions", 20)?;
    if num_valid > 200 {
        return Err(CoreError::InvalidArgument(format!(
            "wordle: num_valid_actions must be in 0..=200, got {num_valid}"
        )));
    }
    Ok(Box::new(WordleEnv {
        max_guesses: max_guesses as usize,
        num_valid: num_valid as usize,
        mode,
        range,
        answer: OPENER,
        seed: 0,
        history: Vec::with_capacity(max_guesses as usize),
        started: false,
        done: false,
        refused: false,
    }))
}

impl WordleEnv {
    fn left(&self) -> usize {
        self.max_guesses - self.history.len()
    }
}

impl Env for WordleEnv {
    fn reset(&mut self, task: &Task, seed: u64) -> Result<String> {
        self.answer = match task {
            Task::Index(i) => {
                let len = self.range.len() as u64;
                lists().answers[self.range.start + (i % len) as usize]
            }
            Task::Spec(text) => match parse_guess(text) {
                Parsed::Word(w) if is_allowed(&w) => w,
                _ => {
                    return Err(CoreError::InvalidTask {
                        env: "wordle".into(),
                        message: format!("{text:?} is not a five-letter word of the word list"),
                    })
                }
            },
        };
        self.seed = seed;
        self.history.clear();
        self.started = true;
        self.done = false;
        Ok(format!(
            "Guess the secret five-letter word. You have {} guesses. Reply: guess <word>.",
            self.max_guesses
        ))
    }

    fn step(&mut self, action: &str) -> Step {
        let mut out = String::with_capacity(64);
        let (reward, terminated) = self.step_into(action, &mut out);
        Step::new(out, reward, terminated)
    }

    fn step_into(&mut self, action: &str, out: &mut String) -> (f32, bool) {
        self.refused = false;
        if self.done || !self.started {
            out.push_str("The episode is over.");
            return (0.0, true);
        }
        let left = |out: &mut String, n: usize| {
            out.push_str(". ");
            push_decimal(out, n as u64);
            out.push_str(" left.");
        };
        let word = match parse_guess(action) {
            Parsed::Word(w) if is_allowed(&w) => w,
            Parsed::Word(w) => {
                out.push_str("Not in the word list: ");
                out.push_str(std::str::from_utf8(&w).expect("ascii"));
                left(out, self.left());
                return (0.0, false);
            }
            Parsed::Invalid => {
                self.refused = true;
                out.push_str("Invalid action. Reply: guess <five-letter word>");
                left(out, self.left());
                return (0.0, false);
            }
        };
        let code = feedback(&word, &self.answer);
        self.history.push((word, code));
        out.push_str("Guess ");
        push_decimal(out, self.history.len() as u64);
        out.push('/');
        push_decimal(out, self.max_guesses as u64);
        out.push_str(": ");
        out.push_str(std::str::from_utf8(&word).expect("ascii"));
        out.push_str(" -> ");
        write_feedback(out, &word, code);
        if code == SOLVED {
            self.done = true;
            out.push_str(". Solved!");
            return (1.0, true);
        }
        if self.left() == 0 {
            self.done = true;
            out.push_str(". Out of guesses; the word was ");
            out.push_str(std::str::from_utf8(&self.answer).expect("ascii"));
            out.push('.');
            return (0.0, true);
        }
        left(out, self.left());
        (0.0, false)
    }

    fn prefetch(&self) {
        crate::util::prefetch(self.history.as_ptr());
    }

    fn refused(&self) -> bool {
        self.refused
    }

    fn valid_actions(&self) -> Vec<String> {
        if self.done || !self.started {
            return Vec::new();
        }
        let answers = &lists().answers;
        let fmt = |w: &Word| format!("guess {}", std::str::from_utf8(w).expect("ascii"));
        match self.mode {
            ValidMode::Consistent => answers
                .iter()
                .filter(|w| self.history.iter().all(|(g, c)| feedback(g, w) == *c))
                .take(self.num_valid)
                .map(fmt)
                .collect(),
            ValidMode::Sample => {
                let turn = self.history.len() as u64;
                let mut rng = SplitMix64::new(derive(&[SALT, self.seed, turn]));
                let want = self.num_valid.min(answers.len());
                let mut picked: Vec<usize> = Vec::with_capacity(want);
                while picked.len() < want {
                    let k = rng.below(answers.len() as u64) as usize;
                    if !picked.contains(&k) {
                        picked.push(k);
                    }
                }
                picked.iter().map(|&k| fmt(&answers[k])).collect()
            }
        }
    }

    fn oracle_action(&self) -> Option<String> {
        if self.done || !self.started {
            return None;
        }
        let w = solve(&self.history);
        Some(format!("guess {}", std::str::from_utf8(&w).expect("ascii")))
    }

    fn snapshot(&self) -> Option<Box<dyn Env>> {
        snapshot_of(self)
    }

    fn heap_bytes(&self) -> usize {
        vec_bytes(&self.history)
    }

    fn num_tasks(&self) -> u64 {
        self.range.len() as u64
    }

    fn instructions(&self) -> String {
        format!(
            "Play Wordle: find the secret five-letter English word in {} guesses. The action \
             is guess <word>. After each guess you get feedback \
             for every letter: G = right letter in the right spot, Y = in the word but in \
             another spot, B = not in the word (a letter guessed more often than it occurs is \
             B for the extra copies). Words outside the word list do not use up a guess. \
             Solving gives reward 1 and ends the episode.{}",
            self.max_guesses,
            crate::env::action_line("guess crane")
        )
    }
}

#[cfg(test)]
mod tests;
