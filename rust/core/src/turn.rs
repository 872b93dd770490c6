//! One rollout turn for many episodes in one call: the token bookkeeping of the engine.
//!
//! This is the one implementation of a turn's bookkeeping, for every kind of env. For each
//! episode that just received a model reply:
//! 1. the reply's token ids are decoded (special tokens dropped) and the action parsed
//!    ([`TurnCodec::actions`]);
//! 2. the env steps: a native env inside [`TurnCodec::step_turns`] (one
//!    [`EpisodePool::step`] batch); any other env is stepped by its driver, which hands
//!    the results to [`TurnCodec::record_turns`];
//! 3. [`TurnCodec::record_turns`] appends the reply to the trajectory (model tokens, mask 1,
//!    behaviour logprobs), plus an end-of-turn token as a prompt token when the reply was
//!    cut before it, and the turn reward;
//! 4. for episodes that go on, it wraps the observation in the chat template's user-turn
//!    markers (prefix/suffix computed once from the template by the Python side), tokenizes
//!    it with the same `tokenizer.json` the Python side uses, and appends it as prompt
//!    tokens, unless the context would reach `max_total_tokens` (stop reason `length`).
//!
//! Decoding, parsing and tokenizing run in parallel (rayon); observation token ids are
//! memoised (observations repeat a lot across episodes). The caller gets, per episode, the
//! tokens appended to its context this turn, so its copy of the context stays equal to the
//! stored trajectory.

use crate::episode::StopReason;
use crate::error::{CoreError, Result};
use crate::parse::ActionParser;
use crate::pool::EpisodePool;
use crate::trajectory::TrajectoryStore;
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use tokenizers::Tokenizer;

/// Turn batches of fewer replies are decoded and parsed on the calling thread (a reply's
/// decode costs more than a pool step, so rayon pays off at fewer rows than in `pool.rs`);
/// a quarter of it is the least number of observation-cache misses tokenized in parallel.
const PAR_MIN_REPLIES: usize = 64;

/// Default bound of the observation-token cache, in bytes (see [`TurnCodec::cache_bytes`]).
/// Observations that repeat (a maze's wall and move texts) stay cached; one that never
/// repeats (a TextCraft inventory) only costs resident memory, and 16 MiB keeps a
/// long collection's memory flat at the same throughput as 64 MiB.
pub const DEFAULT_CACHE_MAX_BYTES: usize = 16 << 20;

/// What one cache entry costs besides its text and token ids: the map slot (key `String`,
/// `Arc` fat pointer, control byte) and the `Arc` allocation's counters, rounded up.
const CACHE_ENTRY_OVERHEAD: usize = 64;

/// The bytes one cache entry holds: text, token ids and fixed overhead.
fn entry_bytes(text: &str, ids: &[u32]) -> usize {
    text.len() + std::mem::size_of_val(ids) + CACHE_ENTRY_OVERHEAD
}

/// One episode's model reply for this turn.
#[derive(Debug, Clone, Copy)]
pub struct TurnInput<'a> {
    /// Trajectory-store key of the episode.
    pub key: u64,
    /// Its slot in the episode pool.
    pub slot: usize,
    /// The generated token ids, exactly as the backend returned them.
    pub tokens: &'a [u32],
    /// One behaviour logprob per generated token (empty: all 0.0).
    pub logprobs: &'a [f32],
    /// Whether the reply ends with the end-of-turn token (the model stopped on its own).
    pub ended: bool,
}

/// What the env did with one episode's action this turn.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepResult<'a> {
    /// The next observation (ignored once the episode stopped).
    pub observation: &'a str,
    pub reward: f32,
    /// `None` while the episode goes on; else why it ended (`done`, `horizon`, `env_error`,
    /// `aborted`, ...).
    pub stop: Option<StopReason>,
    /// The env's error message of an `env_error` episode.
    pub error: Option<&'a str>,
}

/// What happened to each episode of a turn batch (input order).
#[derive(Debug, Default)]
pub struct TurnOutput {
    pub rewards: Vec<f32>,
    /// `None` while the episode goes on; else `done`, `horizon`, `env_error`, `length`
    /// (context full) or `aborted` (its slot was no longer running).
    pub stop: Vec<Option<StopReason>>,
    /// The env's error message for `env_error` episodes.
    pub errors: Vec<Option<String>>,
    /// The tokens appended to each episode's context this turn: the reply, the end-of-turn
    /// token if it was missing, and the templated observation when the episode goes on.
    pub appended: Vec<Vec<u32>>,
    /// Observation-cache misses tokenized in this call.
    pub tokenized: usize,
}

/// Tokenizer, template markers, action parser and observation-token cache of one engine.
pub struct TurnCodec {
    tokenizer: Tokenizer,
    obs_prefix: String,
    obs_suffix: String,
    end_of_turn: u32,
    parser: ActionParser,
    cache: HashMap<String, Arc<[u32]>>,
    /// Bytes the cache's entries hold ([`entry_bytes`] summed).
    cache_bytes: usize,
    cache_max_bytes: usize,
    cache_max_chars: usize,
}

impl std::fmt::Debug for TurnCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnCodec")
            .field("obs_prefix", &self.obs_prefix)
            .field("obs_suffix", &self.obs_suffix)
            .field("end_of_turn", &self.end_of_turn)
            .field("parser", &self.parser)
            .field("cached", &self.cache.len())
            .field("cache_bytes", &self.cache_bytes)
            .finish()
    }
}

/// A templated observation's token ids, or the tokenizer's message for a text it refuses.
pub type ObservationIds = std::result::Result<Arc<[u32]>, String>;

fn tok_err(e: impl std::fmt::Display) -> CoreError {
    CoreError::InvalidArgument(format!("tokenizer: {e}"))
}

impl TurnCodec {
    /// `tokenizer_json`: the content of a Hugging Face `tokenizer.json`.
    pub fn new(
        tokenizer_json: &str,
        obs_prefix: &str,
        obs_suffix: &str,
        end_of_turn: u32,
        parser: ActionParser,
    ) -> Result<Self> {
        let mut tokenizer: Tokenizer = tokenizer_json.parse().map_err(tok_err)?;
        // A serialized Hugging Face tokenizer may carry the truncation/padding of its last
        // call; an observation must never be cut or padded.
        tokenizer.with_truncation(None).map_err(tok_err)?;
        tokenizer.with_padding(None);
        if tokenizer.id_to_token(end_of_turn).is_none() {
            return Err(CoreError::InvalidArgument(format!(
                "end-of-turn id {end_of_turn} is not in the tokenizer's vocabulary"
            )));
        }
        Ok(Self {
            tokenizer,
            obs_prefix: obs_prefix.to_string(),
            obs_suffix: obs_suffix.to_string(),
            end_of_turn,
            parser,
            cache: HashMap::new(),
            cache_bytes: 0,
            cache_max_bytes: DEFAULT_CACHE_MAX_BYTES,
            cache_max_chars: 2_048,
        })
    }

    pub fn end_of_turn(&self) -> u32 {
        self.end_of_turn
    }

    pub fn parser(&self) -> ActionParser {
        self.parser
    }

    pub fn set_parser(&mut self, parser: ActionParser) {
        self.parser = parser;
    }

    /// Observations cached (their token ids).
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// Bytes the observation cache holds: per entry its text, its token ids and a fixed
    /// overhead. Never above [`TurnCodec::cache_max_bytes`].
    pub fn cache_bytes(&self) -> usize {
        self.cache_bytes
    }

    pub fn cache_max_bytes(&self) -> usize {
        self.cache_max_bytes
    }

    /// Bound the observation cache to `max_bytes` (0: no caching); a cache above the new
    /// bound is emptied.
    pub fn set_cache_max_bytes(&mut self, max_bytes: usize) {
        self.cache_max_bytes = max_bytes;
        if self.cache_bytes > max_bytes {
            self.cache.clear();
            self.cache_bytes = 0;
        }
    }

    /// Tokenize `text` (special-token markers in it are recognised, none are added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.tokenizer.encode_fast(text, false).map_err(tok_err)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Model text for action parsing (special tokens dropped).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer.decode(ids, true).map_err(tok_err)
    }

    /// Actions parsed from many replies ("" where none parses), in parallel.
    pub fn actions(&self, replies: &[&[u32]]) -> Result<Vec<String>> {
        let one = |ids: &&[u32]| -> Result<String> {
            let text = self.decode(ids)?;
            Ok(self.parser.parse(&text).unwrap_or_default())
        };
        if replies.len() >= PAR_MIN_REPLIES {
            replies.par_iter().with_min_len(16).map(one).collect()
        } else {
            replies.iter().map(one).collect()
        }
    }

    /// Each observation as a user turn plus the next assistant header, tokenized once per
    /// distinct text (memoised; misses are tokenized in parallel). Returns the ids and the
    /// number of misses; the first observation the tokenizer refuses fails the call.
    pub fn observation_ids(&mut self, observations: &[&str]) -> Result<(Vec<Arc<[u32]>>, usize)> {
        let (ids, misses) = self.observation_ids_each(observations);
        let ids = ids
            .into_iter()
            .map(|r| r.map_err(CoreError::InvalidArgument))
            .collect::<Result<_>>()?;
        Ok((ids, misses))
    }

    /// [`observation_ids`](Self::observation_ids) with one result per observation (see
    /// [`ObservationIds`]): a text
    /// the tokenizer refuses gets its error message (and is not cached); the others their
    /// ids.
    pub fn observation_ids_each(&mut self, observations: &[&str]) -> (Vec<ObservationIds>, usize) {
        let mut out: Vec<Option<Arc<[u32]>>> = observations
            .iter()
            .map(|o| self.cache.get(*o).cloned())
            .collect();
        let mut misses: Vec<usize> = (0..out.len()).filter(|&i| out[i].is_none()).collect();
        // The same new observation may appear several times in one batch: tokenize it once.
        misses.sort_by_key(|&i| observations[i]);
        misses.dedup_by_key(|i| observations[*i]);
        let encode = |&i: &usize| -> ObservationIds {
            let text = format!("{}{}{}", self.obs_prefix, observations[i], self.obs_suffix);
            self.encode(&text).map(Arc::from).map_err(|e| match e {
                CoreError::InvalidArgument(message) => message,
                e => e.to_string(),
            })
        };
        let encoded: Vec<ObservationIds> = if misses.len() >= PAR_MIN_REPLIES / 4 {
            misses.par_iter().map(encode).collect()
        } else {
            misses.iter().map(encode).collect()
        };
        for (&i, ids) in misses.iter().zip(&encoded) {
            let Ok(ids) = ids else { continue };
            let text = observations[i];
            let size = entry_bytes(text, ids);
            if text.len() > self.cache_max_chars || size > self.cache_max_bytes {
                continue;
            }
            if self.cache_bytes + size > self.cache_max_bytes {
                // Full: start over (observations of the current tasks come back at once).
                self.cache.clear();
                self.cache_bytes = 0;
            }
            self.cache.insert(text.to_string(), ids.clone());
            self.cache_bytes += size;
        }
        let fresh: HashMap<&str, &ObservationIds> = misses
            .iter()
            .zip(&encoded)
            .map(|(&i, ids)| (observations[i], ids))
            .collect();
        let ids = observations
            .iter()
            .zip(out.iter_mut())
            .map(|(o, slot)| match slot.take() {
                Some(ids) => Ok(ids),
                None => fresh[o].clone(),
            })
            .collect();
        (ids, misses.len())
    }

    /// Validation shared by both turn calls: every key live, logprobs one per token.
    fn check_turns(store: &TrajectoryStore, turns: &[TurnInput<'_>]) -> Result<()> {
        for t in turns {
            if !store.is_live(t.key) {
                return Err(CoreError::Trajectory(format!(
                    "episode {} is not live in the trajectory store",
                    t.key
                )));
            }
            if !t.logprobs.is_empty() && t.logprobs.len() != t.tokens.len() {
                return Err(CoreError::InvalidArgument(format!(
                    "episode {}: {} logprobs for {} tokens",
                    t.key,
                    t.logprobs.len(),
                    t.tokens.len()
                )));
            }
        }
        Ok(())
    }

    /// One turn of many episodes of a native env; see the module docs. Validation happens
    /// before anything changes: unknown keys, out-of-range slots, a slot twice, logprobs of
    /// the wrong length or a reply that does not decode fail the whole call. A slot whose
    /// episode is no longer running is not stepped: its reply is recorded and it ends with
    /// `aborted`. The observations exist only after the step, so their tokenization cannot
    /// come first: an observation the tokenizer refuses ends only its own episode
    /// (`env_error`, the message in its error), never the call.
    pub fn step_turns(
        &mut self,
        pool: &mut EpisodePool,
        store: &mut TrajectoryStore,
        turns: &[TurnInput<'_>],
        max_total_tokens: usize,
    ) -> Result<TurnOutput> {
        // Range and uniqueness of the slots, and which of them still run.
        let running = pool.running_of(turns.iter().map(|t| t.slot))?;
        Self::check_turns(store, turns)?;
        let replies: Vec<&[u32]> = turns.iter().map(|t| t.tokens).collect();
        let actions = self.actions(&replies)?;

        let live: Vec<usize> = (0..turns.len()).filter(|&i| running[i]).collect();
        let slots: Vec<usize> = live.iter().map(|&i| turns[i].slot).collect();
        let acts: Vec<&str> = live.iter().map(|&i| actions[i].as_str()).collect();
        let batch = pool.step(&slots, &acts)?;
        let ended: Vec<usize> = (0..live.len())
            .filter(|&k| batch.terminated[k] || batch.truncated[k])
            .collect();
        let reasons = pool.stop_reasons_of(&ended.iter().map(|&k| slots[k]).collect::<Vec<_>>())?;

        let aborted = StepResult {
            stop: Some(StopReason::Aborted),
            ..StepResult::default()
        };
        let mut results = vec![aborted; turns.len()];
        for (k, &i) in live.iter().enumerate() {
            results[i] = StepResult {
                observation: &batch.observations[k],
                reward: batch.rewards[k],
                stop: None,
                error: None,
            };
        }
        for (&k, reason) in ended.iter().zip(reasons) {
            let r = &mut results[live[k]];
            r.stop = Some(reason.unwrap_or(StopReason::Done));
            if r.stop == Some(StopReason::EnvError) {
                r.error = Some(r.observation);
            }
        }
        self.record_turns(store, turns, &results, max_total_tokens)
    }

    /// The bookkeeping of one turn of many episodes, given what the env did with each
    /// action (`results[i]` for `turns[i]`, however the env was stepped): the reply (mask 1,
    /// behaviour logprobs), a closing end-of-turn token (mask 0) where the model did not emit
    /// it, the turn reward, and for episodes that go on the templated observation (mask 0)
    /// unless the context would reach `max_total_tokens` (then the episode stops with
    /// `length`). Unknown keys or logprobs of the wrong length fail the whole call before
    /// anything changes.
    pub fn record_turns(
        &mut self,
        store: &mut TrajectoryStore,
        turns: &[TurnInput<'_>],
        results: &[StepResult<'_>],
        max_total_tokens: usize,
    ) -> Result<TurnOutput> {
        if results.len() != turns.len() {
            return Err(CoreError::InvalidArgument(format!(
                "{} step results for {} turns; pass one per turn",
                results.len(),
                turns.len()
            )));
        }
        Self::check_turns(store, turns)?;
        let going: Vec<usize> = (0..turns.len())
            .filter(|&i| results[i].stop.is_none())
            .collect();
        let texts: Vec<&str> = going.iter().map(|&i| results[i].observation).collect();
        // An observation the tokenizer refuses (the one failure possible after the envs
        // stepped) ends only its episode, as an env error does.
        let (obs_ids, misses) = self.observation_ids_each(&texts);
        let mut observation: Vec<Option<Arc<[u32]>>> = vec![None; turns.len()];
        let mut refused: Vec<(usize, String)> = Vec::new();
        for (&i, ids) in going.iter().zip(obs_ids) {
            match ids {
                Ok(ids) => observation[i] = Some(ids),
                Err(e) => refused.push((i, e)),
            }
        }

        let mut out = TurnOutput {
            rewards: results.iter().map(|r| r.reward).collect(),
            stop: results.iter().map(|r| r.stop).collect(),
            errors: results
                .iter()
                .map(|r| r.error.map(str::to_string))
                .collect(),
            appended: Vec::with_capacity(turns.len()),
            tokenized: misses,
        };
        for (i, e) in refused {
            out.stop[i] = Some(StopReason::EnvError);
            out.errors[i] = Some(format!("the observation could not be tokenized: {e}"));
        }
        for (i, t) in turns.iter().enumerate() {
            let close = (!t.ended).then_some(self.end_of_turn);
            let obs = observation[i].take();
            let fits = store.append_turn(
                t.key,
                t.tokens,
                t.logprobs,
                close,
                out.rewards[i],
                obs.as_deref(),
                max_total_tokens,
            )?;
            // Cut before its end-of-turn token, the reply is closed with one as a prompt
            // token (mask 0): the conversation stays well-formed, the token is not trained on.
            let mut tail =
                Vec::with_capacity(t.tokens.len() + 1 + obs.as_ref().map_or(0, |o| o.len()));
            tail.extend_from_slice(t.tokens);
            tail.extend(close);
            match obs {
                Some(ids) if fits => tail.extend_from_slice(&ids),
                // No room for the observation and a reply: the context is full.
                Some(_) => out.stop[i] = Some(StopReason::Length),
                None => {}
            }
            out.appended.push(tail);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
