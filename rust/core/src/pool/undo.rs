//! Self-correction: the `undo` action (`undo` or `undo N`) of a pool whose undo rules are
//! set ([`EpisodePool::set_undo`]).
//!
//! While the rules are set, every running slot keeps a bounded history: before each step
//! whose action is not an undo, a copy of its env ([`Env::snapshot`]), and after it that
//! step's reward and the observation the model saw before it. An accepted `undo N` puts
//! back the env saved before the last `N` such turns (those not undone already), answers
//! with [`undone`] (which repeats the observation of that point) and rewards the turn with
//! minus the sum of the undone turns' rewards, so that the episode's return is the return
//! of the path that survives. The episode's counters are never rolled back: an undo is a
//! turn (the horizon still ends the episode), and it counts in [`Episode::undo_turns`].
//!
//! An undo past [`UndoRules::max_undos`], of more turns than the history holds (at most
//! [`UndoRules::depth`]), or in a slot without history is refused like an unreadable
//! action: reward 0, nothing changes, it counts in [`Episode::invalid_turns`], and the
//! observation says why ([`refusal`]). The texts and the grammar here are the only ones:
//! the Python drivers read them through `agentgym._core`.

use super::{step_slot, EpisodePool, Slot};
use crate::env::{push_decimal, Env};
use crate::episode::EpisodeStatus;
use crate::error::{CoreError, Result};
use crate::pool::obs::TextChunk;
use std::collections::VecDeque;

/// The undo rules of a pool (of a rollout: `RolloutConfig.undo`, `max_undos`,
/// `undo_depth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UndoRules {
    /// Accepted undos per episode; further ones are refused.
    pub max_undos: u32,
    /// Turns kept in each slot's history: the most one `undo N` can reach back.
    pub depth: usize,
}

/// Why an undo was refused ([`refusal`] words it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The episode used its `max_undos` accepted undos.
    Cap { max_undos: u32 },
    /// `undo N` of more turns than can be undone (`available`).
    TooMany { asked: u32, available: u32 },
    /// The env could not copy its state, so it keeps no history.
    Unsupported,
}

/// `Some(n)` when `action` (as the action parser extracted it) is an undo: `undo` (n = 1)
/// or `undo N` with `N >= 1` in decimal digits, case-insensitive, surrounding whitespace
/// ignored, one or more spaces or tabs between the two. Anything else, `undo 0` included,
/// is an ordinary action. A number too large for `u32` is `u32::MAX` (then refused).
pub fn parse_undo(action: &str) -> Option<u32> {
    let a = action.trim();
    if a.len() < 4 || !a.as_bytes()[..4].eq_ignore_ascii_case(b"undo") {
        return None;
    }
    let rest = &a[4..];
    if rest.is_empty() {
        return Some(1);
    }
    let digits = rest.trim_start_matches([' ', '\t']);
    if digits.len() == rest.len() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = digits.bytes().fold(0u64, |n, b| {
        (n * 10 + u64::from(b - b'0')).min(u64::from(u32::MAX))
    });
    (n >= 1).then_some(n as u32)
}

/// The observation of an accepted `undo n`: `Undid the last n turn(s). ` followed by the
/// observation the env gave at the point it went back to.
pub fn undone(out: &mut String, n: u32, observation: &str) {
    out.push_str("Undid the last ");
    push_decimal(out, u64::from(n));
    out.push_str(" turn(s). ");
    out.push_str(observation);
}

/// The observation of a refused undo.
pub fn refusal(why: Refusal) -> String {
    match why {
        Refusal::Cap { max_undos } => format!(
            "Cannot undo: this episode has used all {max_undos} of its undos. Nothing changed."
        ),
        Refusal::TooMany { asked, available } => format!(
            "Cannot undo {asked} turn(s): only {available} turn(s) can be undone now. \
             Nothing changed."
        ),
        Refusal::Unsupported => {
            "Cannot undo: this environment cannot restore an earlier state. Nothing changed."
                .to_string()
        }
    }
}

/// One turn that can be undone: the env before it, its reward and the observation the
/// model saw before it.
struct Entry {
    env: Box<dyn Env>,
    reward: f32,
    observation: String,
}

/// A slot's undo history (see the module docs).
#[derive(Default)]
pub(super) struct History {
    /// Undoable turns, oldest first; at most `UndoRules::depth`.
    entries: VecDeque<Entry>,
    /// The observation the env gave last (a reset's, a step's, or the one an undo went
    /// back to): what the next entry saves.
    observation: String,
    /// The env could not copy its state at some step: no undo in this episode any more.
    broken: bool,
}

impl History {
    /// An independent copy (each saved env copied), `None` where an env cannot snapshot.
    pub(super) fn copy(&self) -> Option<History> {
        let entries = self
            .entries
            .iter()
            .map(|e| {
                Some(Entry {
                    env: e.env.snapshot()?,
                    reward: e.reward,
                    observation: e.observation.clone(),
                })
            })
            .collect::<Option<_>>()?;
        Some(History {
            entries,
            observation: self.observation.clone(),
            broken: self.broken,
        })
    }

    /// Forget every saved turn (the episode ended, or a new one starts).
    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.observation.clear();
        self.broken = false;
    }
}

/// Called after a successful reset of `slot` whose observation is `observation`: a fresh
/// history under `rules`, none without (the old one's buffers are reused).
pub(super) fn start(slot: &mut Slot, rules: Option<UndoRules>, observation: &str) {
    match rules {
        None => slot.undo = None,
        Some(_) => {
            let h = slot.undo.get_or_insert_with(Box::default);
            h.clear();
            h.observation.push_str(observation);
        }
    }
}

/// [`step_slot`] under undo rules: an undo action is answered here, any other action
/// steps the env with its state saved first.
pub(super) fn step_slot_undo(
    s: &mut Slot,
    action: &str,
    text: &mut TextChunk,
    rules: UndoRules,
) -> (f32, bool, bool) {
    if let Some(n) = parse_undo(action) {
        return undo_slot(s, n, text, rules);
    }
    let Some(mut h) = s.undo.take() else {
        return step_slot(s, action, text);
    };
    let saved = if h.broken {
        None
    } else {
        s.env.as_ref().and_then(|e| e.snapshot())
    };
    let out = step_slot(s, action, text);
    if s.episode.status != EpisodeStatus::Running {
        h.clear();
    } else if let Some(env) = saved {
        let now = &text.text[text.row_start()..];
        let observation = std::mem::replace(&mut h.observation, now.to_string());
        h.entries.push_back(Entry {
            env,
            reward: out.0,
            observation,
        });
        if h.entries.len() > rules.depth {
            h.entries.pop_front();
        }
    } else {
        h.entries.clear();
        h.broken = true;
    }
    s.undo = Some(h);
    out
}

/// One undo turn of `n` turns in slot `s` (running).
fn undo_slot(s: &mut Slot, n: u32, text: &mut TextChunk, rules: UndoRules) -> (f32, bool, bool) {
    let ep = &mut s.episode;
    let available = s.undo.as_ref().map_or(0, |h| h.entries.len());
    let why = match &s.undo {
        None => Some(Refusal::TooMany {
            asked: n,
            available: 0,
        }),
        Some(h) if h.broken => Some(Refusal::Unsupported),
        Some(_) if ep.undo_turns >= rules.max_undos => Some(Refusal::Cap {
            max_undos: rules.max_undos,
        }),
        Some(_) if n as usize > available => Some(Refusal::TooMany {
            asked: n,
            available: available as u32,
        }),
        Some(_) => None,
    };
    if let Some(why) = why {
        text.text.push_str(&refusal(why));
        ep.invalid_turns += 1;
        let truncated = ep.record_step(0.0, false);
        if truncated {
            if let Some(h) = s.undo.as_mut() {
                h.clear();
            }
        }
        return (0.0, false, truncated);
    }
    let h = s.undo.as_mut().expect("checked above");
    let mut undone_reward = 0.0f32;
    let mut oldest = None;
    for _ in 0..n {
        let e = h.entries.pop_back().expect("n <= entries");
        undone_reward += e.reward;
        oldest = Some(e);
    }
    let e = oldest.expect("n >= 1");
    s.env = Some(e.env);
    h.observation = e.observation;
    undone(&mut text.text, n, &h.observation);
    ep.undo_turns += 1;
    let reward = -undone_reward;
    let truncated = ep.record_step(reward, false);
    if truncated {
        h.clear();
    }
    (reward, false, truncated)
}

impl EpisodePool {
    /// Sets (or with `None` clears) the undo rules: from each slot's next reset on, its
    /// episode keeps an undo history and `undo` / `undo N` actions are undos (see
    /// [`undo`](self)); without rules they are ordinary actions. Episodes running when the
    /// rules are set have no history (their undos are refused); clearing the rules drops
    /// every history. Fails, changing nothing, on an env that cannot snapshot
    /// ([`CoreError::SnapshotUnsupported`]) or a depth of 0.
    pub fn set_undo(&mut self, rules: Option<UndoRules>) -> Result<()> {
        if let Some(r) = rules {
            if !self.snapshots_supported {
                return Err(CoreError::SnapshotUnsupported {
                    env: self.env_id.clone(),
                });
            }
            if r.depth == 0 {
                return Err(CoreError::InvalidArgument(
                    "undo depth must be at least 1".into(),
                ));
            }
        } else {
            for s in &mut self.slots {
                s.get_mut().undo = None;
            }
        }
        self.undo = rules;
        Ok(())
    }

    /// The undo rules in force (`None`: undo is off).
    pub fn undo_rules(&self) -> Option<UndoRules> {
        self.undo
    }

    /// Accepted undos ([`Episode::undo_turns`]) of the episode each of `ids` holds or last
    /// held.
    pub fn undo_turns_of(&mut self, ids: &[usize]) -> Result<Vec<u32>> {
        ids.iter()
            .map(|&slot| self.with_slot(slot, |s| s.episode.undo_turns))
            .collect()
    }
}

#[cfg(test)]
mod tests;
