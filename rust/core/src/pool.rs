//! [`EpisodePool`]: many live episodes of one native env, reset and stepped in batches.
//!
//! Batches run in chunks of consecutive rows on the calling thread, with rayon's workers
//! joining in when they get a core ([`share`]). Each slot sits behind its own
//! (uncontended) mutex, which gives safe disjoint mutable access from worker threads; the
//! pool methods take `&mut self`, so validation happens up front without locking and a bad
//! batch has no side effects. Envs write observations straight into one text buffer per
//! chunk ([`Env::step_into`], [`Observations`]), so a step allocates nothing per row.
//! A panic inside an env is caught at the episode boundary: that episode ends with stop
//! reason `env_error`, its env is dropped (rebuilt on the next reset), the rest of the batch
//! is untouched. A reset batch reports each failed row on its own ([`RowError`]); only a
//! malformed batch (bad or repeated slot ids) fails as a whole.
//! [`snapshot`] saves, restores and forks slot states (envs that implement
//! [`Env::snapshot`]); [`undo`] answers the `undo` action where a pool's undo rules are set.
//! [`frames`] draws the slots' pictures ([`Env::frame_into`]) on demand, one batch at a time.

mod frames;
mod obs;
mod share;
mod snapshot;
pub mod undo;

use crate::env::{Env, Task};
use crate::episode::{Episode, EpisodeStatus, StopReason};
use crate::error::{CoreError, Result};
use crate::registry::{self, Kwargs, MakeFn};
use crate::util::prefetch;
pub use frames::{frame_digest, Frame, Frames};
pub use obs::{Iter as ObservationsIter, Observations, TextChunk};
use parking_lot::Mutex;
use rayon::prelude::*;
pub use snapshot::SnapshotHandle;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
pub use undo::UndoRules;

/// Batches smaller than this run on the calling thread: waking rayon's workers (futex
/// wake-ups and context switches, 10-20 us on a busy 2-core machine) costs more than
/// stepping a few hundred episodes of a fast env.
const PAR_MIN_ROWS: usize = 256;
/// Most rows in one chunk of a parallel batch (keeps each text buffer small).
const MAX_CHUNK_ROWS: usize = 256;

#[derive(Default)]
struct Slot {
    env: Option<Box<dyn Env>>,
    episode: Episode,
    /// The episode's undo history while the pool's undo rules are set ([`undo`]).
    undo: Option<Box<undo::History>>,
}

/// Results of a batched step, in the order of the slot ids given.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StepBatch {
    pub observations: Observations,
    pub rewards: Vec<f32>,
    pub terminated: Vec<bool>,
    pub truncated: Vec<bool>,
}

/// Rewards and end flags of a batched step whose observations went to a sink
/// ([`EpisodePool::step_with`]), in the order of the slot ids given.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StepOutcome {
    pub rewards: Vec<f32>,
    pub terminated: Vec<bool>,
    pub truncated: Vec<bool>,
}

/// One slot's reset request.
#[derive(Debug, Clone)]
pub struct ResetSpec {
    pub slot: usize,
    pub task: Task,
    pub seed: u64,
    pub max_turns: Option<u32>,
}

/// One failed row of a reset batch: its index in the batch and why. The row's episode is
/// left finished with stop reason `env_error`; the other rows of the batch are unaffected.
#[derive(Debug, Clone, PartialEq)]
pub struct RowError {
    pub row: usize,
    pub error: CoreError,
    /// The env panicked (`error` is [`CoreError::EnvFailure`] and the row's observation
    /// says `Environment error: ...`); else the env refused the request (its task, or
    /// building the env) and the row's observation is empty.
    pub panicked: bool,
}

/// Rows per chunk for a batch of `n`: all of it below [`PAR_MIN_ROWS`], else about four
/// chunks per worker thread (load balance), within `PAR_MIN_ROWS / 4 ..= MAX_CHUNK_ROWS`.
fn chunk_rows(n: usize) -> usize {
    if n < PAR_MIN_ROWS {
        return n.max(1);
    }
    let threads = rayon::current_num_threads().max(1);
    n.div_ceil(threads * 4)
        .clamp(PAR_MIN_ROWS / 4, MAX_CHUNK_ROWS)
}

/// Text bytes per row to reserve for the next batch, from this one's `text_len` over `rows`:
/// a quarter above the mean, so that a chunk rarely outgrows its buffer (growing it copies
/// everything written so far).
fn size_hint(text_len: usize, rows: usize) -> usize {
    let mean = text_len / rows.max(1);
    mean + mean / 4 + 16
}

/// A sink for [`EpisodePool::step_with`] / [`EpisodePool::reset_with`] that keeps every
/// chunk, at its position, for [`observations`].
fn collect_chunk(chunks: &mut Vec<Option<TextChunk>>, rows: usize, first: usize, c: TextChunk) {
    let k = first / rows;
    if chunks.len() <= k {
        chunks.resize_with(k + 1, || None);
    }
    chunks[k] = Some(c);
}

fn observations(rows: usize, chunks: Vec<Option<TextChunk>>) -> Observations {
    let chunks = chunks
        .into_iter()
        .map(|c| c.expect("every chunk delivered"))
        .collect();
    Observations::from_chunks(rows, chunks)
}

/// Whether a batch of `n` rows runs on more than one thread (else [`EpisodePool::step_with`]
/// and [`EpisodePool::reset_with`] call their sink once, after the whole batch, and a
/// caller gains nothing by giving up a lock for the duration of the sink).
pub fn runs_in_parallel(n: usize) -> bool {
    n >= PAR_MIN_ROWS && rayon::current_num_threads() > 1
}

/// One chunk of a step batch: its rows' inputs and output slices.
struct StepChunk<'a> {
    ids: &'a [usize],
    actions: &'a [&'a str],
    rewards: &'a mut [f32],
    terminated: &'a mut [bool],
    truncated: &'a mut [bool],
    text: TextChunk,
}

/// While row `k` of a batch runs, starts loading what later rows touch first: the slot of
/// row `k + 8`, the env object of row `k + 4` and, through [`Env::prefetch`], the env's own
/// heap state of row `k + 1`. Thousands of episodes do not fit in the core's caches, and
/// without this each step waits for these loads one after another.
#[inline(always)]
fn prefetch_ahead(slots: &[Mutex<Slot>], k: usize, id_at: impl Fn(usize) -> Option<usize>) {
    // SAFETY (both `env` reads): only the `env` field is read, without the lock. The pool
    // is borrowed mutably for the batch and every id occurs once, so these slots belong to
    // this chunk alone: no other thread writes them while this one reads.
    let env_of = |slot: usize| unsafe { (*slots[slot].data_ptr()).env.as_deref() };
    if let Some(far) = id_at(k + 8) {
        prefetch(&slots[far]);
    }
    if let Some(env) = id_at(k + 4).and_then(env_of) {
        prefetch(env);
    }
    if let Some(env) = id_at(k + 1).and_then(env_of) {
        env.prefetch();
    }
}

/// Steps one slot, appending its observation to `text` (a panic's message instead of
/// whatever the env wrote before panicking); returns `(reward, terminated, truncated)`.
fn step_slot(s: &mut Slot, action: &str, text: &mut TextChunk) -> (f32, bool, bool) {
    let env = s.env.as_mut().expect("running episode has an env");
    let out = &mut text.text;
    match catch_unwind(AssertUnwindSafe(|| env.step_into(action, out))) {
        Ok((reward, terminated)) => {
            s.episode.invalid_turns += u32::from(env.refused());
            let truncated = s.episode.record_step(reward, terminated);
            (reward, terminated, truncated)
        }
        Err(payload) => {
            let start = text.row_start();
            text.text.truncate(start);
            s.env = None;
            s.episode.turns += 1;
            s.episode.finish(StopReason::EnvError);
            text.text.push_str("Environment error: ");
            text.text.push_str(&panic_message(payload));
            (0.0, false, true)
        }
    }
}

pub struct EpisodePool {
    env_id: String,
    kwargs: Kwargs,
    make: MakeFn,
    slots: Vec<Mutex<Slot>>,
    instructions: String,
    num_tasks: u64,
    /// Observation bytes per row of the last step, to size the next batch's buffers.
    step_bytes_hint: usize,
    /// The same for resets.
    reset_bytes_hint: usize,
    /// Saved slot states by handle ([`snapshot`]).
    snapshots: HashMap<SnapshotHandle, Mutex<snapshot::Snapshot>>,
    /// The last handle issued (handles are never reused).
    next_snapshot: SnapshotHandle,
    /// Whether this env implements [`Env::snapshot`].
    snapshots_supported: bool,
    /// The undo rules ([`undo`]); `None`: `undo` is an ordinary action.
    undo: Option<UndoRules>,
    /// [`Env::frame_shape`] of the env built at construction ([`frames`]).
    frame_shape: Option<(u32, u32)>,
}

/// The message of a caught panic (its `&str` or `String` payload).
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Resets one slot (building its env first if it has none), appending the observation to
/// `text`. A failure leaves the episode finished with `env_error` and is returned with
/// whether it was a panic: a refusal (`Err` from building the env or from its reset)
/// leaves the row empty, a panic drops the env and writes `Environment error: ...`.
fn reset_slot(
    slot: &mut Slot,
    spec: &ResetSpec,
    make: MakeFn,
    kwargs: &Kwargs,
    undo: Option<UndoRules>,
    text: &mut TextChunk,
) -> std::result::Result<(), (CoreError, bool)> {
    slot.episode
        .start(spec.task.clone(), spec.seed, spec.max_turns);
    if slot.env.is_none() {
        match make(kwargs) {
            Ok(env) => slot.env = Some(env),
            Err(e) => {
                slot.episode.finish(StopReason::EnvError);
                return Err((e, false));
            }
        }
    }
    let env = slot.env.as_mut().expect("env just built");
    let out = &mut text.text;
    let result = catch_unwind(AssertUnwindSafe(|| {
        env.reset_into(&spec.task, spec.seed, out)
    }));
    if matches!(result, Ok(Ok(()))) {
        if undo.is_some() || slot.undo.is_some() {
            undo::start(slot, undo, &text.text[text.row_start()..]);
        }
        return Ok(());
    }
    let start = text.row_start();
    text.text.truncate(start);
    slot.episode.finish(StopReason::EnvError);
    match result {
        Ok(r) => r.map_err(|e| (e, false)),
        Err(payload) => {
            slot.env = None;
            let message = panic_message(payload);
            text.text.push_str("Environment error: ");
            text.text.push_str(&message);
            Err((
                CoreError::EnvFailure {
                    slot: spec.slot,
                    message,
                },
                true,
            ))
        }
    }
}

/// The first row error that is a refusal (not a panic), for the raising [`EpisodePool::reset`].
pub fn first_refusal(errors: Vec<RowError>) -> Option<CoreError> {
    errors.into_iter().find(|e| !e.panicked).map(|e| e.error)
}

impl EpisodePool {
    /// A pool of `num_envs` empty slots. Envs are built lazily at each slot's first reset
    /// (an idle slot costs only its bookkeeping); one env is built now to validate kwargs.
    pub fn new(env_id: &str, num_envs: usize, kwargs: Kwargs) -> Result<Self> {
        if num_envs == 0 {
            return Err(CoreError::InvalidArgument(
                "num_envs must be at least 1".into(),
            ));
        }
        let spec = registry::spec(env_id)?;
        let probe = (spec.make)(&kwargs)?;
        let instructions = probe.instructions();
        let num_tasks = probe.num_tasks();
        let snapshots_supported = probe.snapshot().is_some();
        let frame_shape = probe.frame_shape();
        let mut slots = Vec::with_capacity(num_envs);
        slots.push(Mutex::new(Slot {
            env: Some(probe),
            episode: Episode::default(),
            undo: None,
        }));
        slots.resize_with(num_envs, || Mutex::new(Slot::default()));
        Ok(Self {
            env_id: env_id.to_string(),
            kwargs,
            make: spec.make,
            slots,
            instructions,
            num_tasks,
            step_bytes_hint: 64,
            reset_bytes_hint: 256,
            snapshots: HashMap::new(),
            next_snapshot: 0,
            snapshots_supported,
            undo: None,
            frame_shape,
        })
    }

    pub fn env_id(&self) -> &str {
        &self.env_id
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn instructions(&self) -> &str {
        &self.instructions
    }

    pub fn num_tasks(&self) -> u64 {
        self.num_tasks
    }

    fn check_slot(&self, slot: usize) -> Result<()> {
        if slot >= self.slots.len() {
            return Err(CoreError::SlotOutOfRange {
                slot,
                size: self.slots.len(),
            });
        }
        Ok(())
    }

    /// Range and uniqueness check of a batch of slot ids.
    fn check_ids(&self, ids: impl IntoIterator<Item = usize>) -> Result<()> {
        let mut seen = vec![0u64; self.slots.len().div_ceil(64)];
        for slot in ids {
            self.check_slot(slot)?;
            let (word, bit) = (slot / 64, 1u64 << (slot % 64));
            if seen[word] & bit != 0 {
                return Err(CoreError::DuplicateSlot { slot });
            }
            seen[word] |= bit;
        }
        Ok(())
    }

    /// Reset the given slots. An env that refuses its task (or cannot be built) makes this
    /// return that error, the first in row order, after the whole batch ran (the refusing
    /// slots are left finished with `env_error`, the others are reset). A panicking env ends
    /// its episode with `env_error` and its observation says so; that is not an error here,
    /// as in [`step`](Self::step). [`reset_rows`](Self::reset_rows) reports every row.
    pub fn reset(&mut self, specs: &[ResetSpec]) -> Result<Observations> {
        let (obs, errors) = self.reset_rows(specs)?;
        match first_refusal(errors) {
            Some(e) => Err(e),
            None => Ok(obs),
        }
    }

    /// [`reset`](Self::reset) that reports each failed row ([`RowError`], in row order)
    /// instead of failing the batch: a bad task, a failed env build or a panic ends only
    /// its own episode. Errors are only those of the batch as a whole (slot ids).
    pub fn reset_rows(&mut self, specs: &[ResetSpec]) -> Result<(Observations, Vec<RowError>)> {
        let rows = chunk_rows(specs.len());
        let mut chunks = Vec::new();
        let errors = self.reset_with(specs, |first, chunk| {
            collect_chunk(&mut chunks, rows, first, chunk)
        })?;
        Ok((observations(rows, chunks), errors))
    }

    /// [`reset_rows`](Self::reset_rows) that hands the observations to `sink` chunk by
    /// chunk, on the calling thread, as soon as each chunk of consecutive rows is done (in
    /// any order): `sink(first_row, chunk)`; every row is delivered, failed ones included
    /// (empty, or the panic's message). Returns the failed rows in row order. A malformed
    /// batch (slot ids) fails before anything is reset and the sink is not called.
    pub fn reset_with(
        &mut self,
        specs: &[ResetSpec],
        mut sink: impl FnMut(usize, TextChunk),
    ) -> Result<Vec<RowError>> {
        self.check_ids(specs.iter().map(|s| s.slot))?;
        let make = self.make;
        let kwargs = &self.kwargs;
        let undo = self.undo;
        let slots = &self.slots;
        let rows = chunk_rows(specs.len());
        let bytes = rows * self.reset_bytes_hint;
        let run = |specs: &[ResetSpec]| -> (TextChunk, Vec<(usize, CoreError, bool)>) {
            let mut text = TextChunk::with_capacity(specs.len(), bytes);
            let mut errors = Vec::new();
            for (k, spec) in specs.iter().enumerate() {
                prefetch_ahead(slots, k, |i| specs.get(i).map(|s| s.slot));
                if let Err((e, panicked)) = reset_slot(
                    &mut slots[spec.slot].lock(),
                    spec,
                    make,
                    kwargs,
                    undo,
                    &mut text,
                ) {
                    errors.push((k, e, panicked));
                }
                text.end_row();
            }
            (text, errors)
        };
        let mut errors = Vec::new();
        let mut text_len = 0;
        share::run_shared(specs.chunks(rows).collect(), run, |k, (text, errs)| {
            errors.extend(errs.into_iter().map(|(i, error, panicked)| RowError {
                row: k * rows + i,
                error,
                panicked,
            }));
            text_len += text.text_len();
            sink(k * rows, text);
        });
        // Chunks finish in any order; rows within a chunk are in order.
        errors.sort_unstable_by_key(|e| e.row);
        self.reset_bytes_hint = size_hint(text_len, specs.len());
        Ok(errors)
    }

    /// Step the given slots with one action each. Errors (out of range, duplicate id, a slot
    /// not running) are reported before anything is stepped.
    pub fn step(&mut self, ids: &[usize], actions: &[&str]) -> Result<StepBatch> {
        let rows = chunk_rows(ids.len());
        let mut chunks = Vec::new();
        let out = self.step_with(ids, actions, |first, chunk| {
            collect_chunk(&mut chunks, rows, first, chunk)
        })?;
        Ok(StepBatch {
            observations: observations(rows, chunks),
            rewards: out.rewards,
            terminated: out.terminated,
            truncated: out.truncated,
        })
    }

    /// [`step`](Self::step) that hands the observations to `sink` chunk by chunk, on the
    /// calling thread, as soon as each chunk of consecutive rows is done (in any order):
    /// `sink(first_row, chunk)`. The bindings build Python strings there while other
    /// threads keep stepping. On an error nothing is stepped and the sink is not called.
    pub fn step_with(
        &mut self,
        ids: &[usize],
        actions: &[&str],
        mut sink: impl FnMut(usize, TextChunk),
    ) -> Result<StepOutcome> {
        if ids.len() != actions.len() {
            return Err(CoreError::InvalidArgument(format!(
                "got {} slot ids but {} actions",
                ids.len(),
                actions.len()
            )));
        }
        self.check_ids(ids.iter().copied())?;
        for &slot in ids {
            let ep = &self.slots[slot].get_mut().episode;
            match ep.status {
                EpisodeStatus::Running => {}
                EpisodeStatus::Empty => return Err(CoreError::EpisodeNotStarted { slot }),
                EpisodeStatus::Finished(r) => {
                    return Err(CoreError::EpisodeFinished {
                        slot,
                        reason: r.as_str().to_string(),
                    })
                }
            }
        }
        let n = ids.len();
        let (mut rewards, mut terminated, mut truncated) =
            (vec![0.0; n], vec![false; n], vec![false; n]);
        let rows = chunk_rows(n);
        let bytes = rows * self.step_bytes_hint;
        let mut jobs = Vec::with_capacity(n.div_ceil(rows));
        let (mut rw, mut te, mut tr) = (&mut rewards[..], &mut terminated[..], &mut truncated[..]);
        for (ids, actions) in ids.chunks(rows).zip(actions.chunks(rows)) {
            let m = ids.len();
            let (r, rest_r) = rw.split_at_mut(m);
            let (e, rest_e) = te.split_at_mut(m);
            let (t, rest_t) = tr.split_at_mut(m);
            (rw, te, tr) = (rest_r, rest_e, rest_t);
            jobs.push(StepChunk {
                ids,
                actions,
                rewards: r,
                terminated: e,
                truncated: t,
                text: TextChunk::with_capacity(m, bytes),
            });
        }
        let slots = &self.slots;
        let undo = self.undo;
        let mut text_len = 0;
        share::run_shared(
            jobs,
            |mut job: StepChunk<'_>| {
                for (k, (&slot, &action)) in job.ids.iter().zip(job.actions).enumerate() {
                    prefetch_ahead(slots, k, |i| job.ids.get(i).copied());
                    let s = &mut slots[slot].lock();
                    let (r, te, tr) = match undo {
                        None => step_slot(s, action, &mut job.text),
                        Some(rules) => undo::step_slot_undo(s, action, &mut job.text, rules),
                    };
                    job.text.end_row();
                    (job.rewards[k], job.terminated[k], job.truncated[k]) = (r, te, tr);
                }
                job.text
            },
            |k, text| {
                text_len += text.text_len();
                sink(k * rows, text);
            },
        );
        self.step_bytes_hint = size_hint(text_len, n);
        Ok(StepOutcome {
            rewards,
            terminated,
            truncated,
        })
    }

    /// End running episodes from outside (backend error, timeout, abort, context length).
    /// Finished or empty slots are left as they are.
    pub fn finish(&mut self, ids: &[usize], reason: StopReason) -> Result<()> {
        self.check_ids(ids.iter().copied())?;
        for &slot in ids {
            let s = self.slots[slot].get_mut();
            if s.episode.status == EpisodeStatus::Running {
                s.episode.finish(reason);
                if let Some(h) = s.undo.as_mut() {
                    h.clear();
                }
            }
        }
        Ok(())
    }

    fn with_slot<T>(&mut self, slot: usize, f: impl FnOnce(&mut Slot) -> T) -> Result<T> {
        self.check_slot(slot)?;
        Ok(f(self.slots[slot].get_mut()))
    }

    pub fn episode(&mut self, slot: usize) -> Result<Episode> {
        self.with_slot(slot, |s| s.episode.clone())
    }

    /// Valid actions of a running (or finished) episode's current state.
    pub fn valid_actions(&mut self, slot: usize) -> Result<Vec<String>> {
        self.with_slot(slot, |s| s.env.as_ref().map(|e| e.valid_actions()))?
            .ok_or(CoreError::EpisodeNotStarted { slot })
    }

    pub fn oracle_action(&mut self, slot: usize) -> Result<Option<String>> {
        self.with_slot(slot, |s| {
            if s.episode.status == EpisodeStatus::Empty {
                return Err(CoreError::EpisodeNotStarted { slot });
            }
            Ok(s.env.as_ref().and_then(|e| e.oracle_action()))
        })?
    }

    /// Oracle actions for many slots at once (`None` where the env has none or the slot is
    /// not running); used by the scripted policy.
    pub fn oracle_actions(&mut self, ids: &[usize]) -> Result<Vec<Option<String>>> {
        self.check_ids(ids.iter().copied())?;
        let slots = &self.slots;
        let f = |&slot: &usize| {
            let s = slots[slot].lock();
            match s.episode.status {
                EpisodeStatus::Running => s.env.as_ref().and_then(|e| e.oracle_action()),
                _ => None,
            }
        };
        Ok(if ids.len() < PAR_MIN_ROWS {
            ids.iter().map(f).collect()
        } else {
            ids.par_iter().map(f).collect()
        })
    }

    /// Turn counts of all slots.
    pub fn turns(&mut self) -> Vec<u32> {
        self.slots
            .iter_mut()
            .map(|s| s.get_mut().episode.turns)
            .collect()
    }

    /// Stop reasons of all slots (`None` while running or never reset).
    pub fn stop_reasons(&mut self) -> Vec<Option<StopReason>> {
        self.slots
            .iter_mut()
            .map(|s| s.get_mut().episode.stop_reason())
            .collect()
    }

    /// Stop reasons of the given slots only (the engine asks for the ones that just ended).
    pub fn stop_reasons_of(&mut self, ids: &[usize]) -> Result<Vec<Option<StopReason>>> {
        ids.iter()
            .map(|&slot| self.with_slot(slot, |s| s.episode.stop_reason()))
            .collect()
    }

    /// Refused steps ([`Episode::invalid_turns`]) of the episode each of `ids` holds or last
    /// held.
    pub fn invalid_turns_of(&mut self, ids: &[usize]) -> Result<Vec<u32>> {
        ids.iter()
            .map(|&slot| self.with_slot(slot, |s| s.episode.invalid_turns))
            .collect()
    }

    /// Whether each of the given slots holds a running episode (after the range and
    /// uniqueness check of a batch).
    pub fn running_of(
        &mut self,
        ids: impl IntoIterator<Item = usize> + Clone,
    ) -> Result<Vec<bool>> {
        self.check_ids(ids.clone())?;
        Ok(ids
            .into_iter()
            .map(|slot| self.slots[slot].get_mut().episode.status == EpisodeStatus::Running)
            .collect())
    }

    /// Change the horizon of a running episode (ScalingInter-RL may tighten or widen it).
    pub fn set_max_turns(&mut self, slot: usize, max_turns: Option<u32>) -> Result<()> {
        self.with_slot(slot, |s| s.episode.max_turns = max_turns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs(ids: impl IntoIterator<Item = usize>, max_turns: Option<u32>) -> Vec<ResetSpec> {
        ids.into_iter()
            .map(|slot| ResetSpec {
                slot,
                task: Task::Index(slot as u64),
                seed: 1,
                max_turns,
            })
            .collect()
    }

    #[test]
    fn rejects_bad_batches_without_side_effects() {
        let mut pool = EpisodePool::new("_test_panic", 4, Kwargs::new()).unwrap();
        assert!(matches!(
            pool.step(&[0], &["noop"]),
            Err(CoreError::EpisodeNotStarted { slot: 0 })
        ));
        pool.reset(&specs(0..4, None)).unwrap();
        assert!(matches!(
            pool.step(&[1, 9], &["noop", "noop"]),
            Err(CoreError::SlotOutOfRange { slot: 9, size: 4 })
        ));
        assert!(matches!(
            pool.step(&[1, 1], &["noop", "noop"]),
            Err(CoreError::DuplicateSlot { slot: 1 })
        ));
        assert!(pool.step(&[0, 1], &["noop"]).is_err());
        assert_eq!(pool.turns(), vec![0, 0, 0, 0]);
        pool.step(&[2], &["stop"]).unwrap();
        assert!(matches!(
            pool.step(&[2], &["noop"]),
            Err(CoreError::EpisodeFinished { slot: 2, .. })
        ));
    }

    #[test]
    fn panic_in_one_env_leaves_the_batch_intact() {
        let n = 200;
        let mut pool = EpisodePool::new("_test_panic", n, Kwargs::new()).unwrap();
        pool.reset(&specs(0..n, None)).unwrap();
        let ids: Vec<usize> = (0..n).collect();
        let actions: Vec<&str> = (0..n)
            .map(|i| if i == 17 { "panic" } else { "noop" })
            .collect();
        let out = pool.step(&ids, &actions).unwrap();
        assert!(out.observations[17].starts_with("Environment error"));
        assert!(out.truncated[17] && !out.terminated[17]);
        assert_eq!(pool.stop_reasons()[17], Some(StopReason::EnvError));
        for i in (0..n).filter(|&i| i != 17) {
            assert_eq!(&out.observations[i], "step 1 noop");
            assert_eq!(out.rewards[i], 1.0);
        }
        // The broken slot is rebuilt on reset and works again.
        pool.reset(&specs([17], None)).unwrap();
        assert_eq!(
            &pool.step(&[17], &["noop"]).unwrap().observations[0],
            "step 1 noop"
        );
    }

    /// `specs(0..n)` with the task text `text` at the rows in `at`.
    fn specs_with(n: usize, at: &[usize], text: &str) -> Vec<ResetSpec> {
        let mut out = specs(0..n, None);
        for &i in at {
            out[i].task = Task::Spec(text.into());
        }
        out
    }

    /// Every slot but `bad` is running and steps normally, in one batch.
    fn others_step_normally(pool: &mut EpisodePool, n: usize, bad: &[usize]) {
        let ids: Vec<usize> = (0..n).filter(|i| !bad.contains(i)).collect();
        let out = pool.step(&ids, &vec!["noop"; ids.len()]).unwrap();
        assert!(out.observations.iter().all(|o| o == "step 1 noop"));
        assert!(out.rewards.iter().all(|&r| r == 1.0));
        for (i, reason) in pool.stop_reasons().into_iter().enumerate().take(n) {
            let want = bad.contains(&i).then_some(StopReason::EnvError);
            assert_eq!(reason, want, "slot {i}");
        }
    }

    #[test]
    fn panic_in_reset_ends_only_that_episode() {
        // Over PAR_MIN_ROWS rows: several chunks, possibly on several threads.
        let n = 600;
        let bad = [3, 450];
        let mut pool = EpisodePool::new("_test_panic", n, Kwargs::new()).unwrap();
        let (obs, errors) = pool.reset_rows(&specs_with(n, &bad, "panic")).unwrap();
        assert_eq!(errors.iter().map(|e| e.row).collect::<Vec<_>>(), bad);
        for e in &errors {
            assert!(e.panicked);
            assert!(matches!(&e.error, CoreError::EnvFailure { slot, message }
                if *slot == e.row && message.contains("panic on reset")));
            assert!(obs[e.row].starts_with("Environment error: test env asked to panic"));
        }
        assert_eq!(&obs[4], "reset task=Index(4) seed=1");
        others_step_normally(&mut pool, n, &bad);
        assert!(matches!(
            pool.step(&[3], &["noop"]),
            Err(CoreError::EpisodeFinished { slot: 3, .. })
        ));
        // The raising `reset` treats a panic as `step` does: the episode ends, no error.
        let obs = pool.reset(&specs_with(4, &[1], "panic")).unwrap();
        assert!(obs[1].starts_with("Environment error"));
        assert_eq!(pool.stop_reasons()[1], Some(StopReason::EnvError));
        // The panicked slot's env was dropped; the next reset rebuilds it.
        pool.reset(&specs([3], None)).unwrap();
        assert_eq!(
            &pool.step(&[3], &["noop"]).unwrap().observations[0],
            "step 1 noop"
        );
    }

    #[test]
    fn partial_reset_batch_rejects_only_the_bad_rows() {
        let n = 600;
        let bad = [5, 300, 599];
        let mut pool = EpisodePool::new("_test_panic", n, Kwargs::new()).unwrap();
        let (obs, errors) = pool.reset_rows(&specs_with(n, &bad, "reject")).unwrap();
        assert_eq!(errors.iter().map(|e| e.row).collect::<Vec<_>>(), bad);
        for e in &errors {
            assert!(!e.panicked);
            assert!(matches!(&e.error, CoreError::InvalidTask { env, .. } if env == "_test_panic"));
            assert_eq!(&obs[e.row], "");
        }
        assert_eq!(&obs[6], "reset task=Index(6) seed=1");
        others_step_normally(&mut pool, n, &bad);
        // The raising reset: same effect on the pool, the first refusal comes back.
        let mut pool = EpisodePool::new("_test_panic", n, Kwargs::new()).unwrap();
        let err = pool.reset(&specs_with(n, &bad, "reject")).unwrap_err();
        assert!(matches!(err, CoreError::InvalidTask { .. }));
        others_step_normally(&mut pool, n, &bad);
        // A refused slot keeps its env: a valid task resets it again.
        pool.reset(&specs([5], None)).unwrap();
        assert_eq!(
            &pool.step(&[5], &["noop"]).unwrap().observations[0],
            "step 1 noop"
        );
    }

    #[test]
    fn malformed_reset_batch_fails_whole_and_changes_nothing() {
        let mut pool = EpisodePool::new("_test_panic", 4, Kwargs::new()).unwrap();
        let mut bad = specs(0..3, None);
        bad[2].slot = 0;
        assert!(matches!(
            pool.reset_rows(&bad),
            Err(CoreError::DuplicateSlot { slot: 0 })
        ));
        assert_eq!(pool.stop_reasons(), vec![None; 4]);
        assert!(matches!(
            pool.step(&[1], &["noop"]),
            Err(CoreError::EpisodeNotStarted { slot: 1 })
        ));
    }

    #[test]
    fn env_construction_failure_is_a_clear_error() {
        let mut kw = Kwargs::new();
        kw.insert("fail_make".into(), serde_json::Value::from(true));
        let err = EpisodePool::new("_test_panic", 4, kw.clone())
            .err()
            .unwrap();
        assert!(matches!(&err, CoreError::InvalidArgument(m) if m.contains("construction failed")));
        assert!(registry::make_env("_test_panic", &kw).is_err());
        // Envs are built lazily: a build that fails at a slot's first reset fails that row
        // only (slot 0 holds the env built by `new`, the others have none yet).
        let n = 4;
        let mut pool = EpisodePool::new("_test_panic", n, Kwargs::new()).unwrap();
        pool.kwargs = kw;
        let (obs, errors) = pool.reset_rows(&specs(0..n, None)).unwrap();
        assert_eq!(errors.iter().map(|e| e.row).collect::<Vec<_>>(), [1, 2, 3]);
        assert!(errors
            .iter()
            .all(|e| !e.panicked && matches!(e.error, CoreError::InvalidArgument(_))));
        assert_eq!(&obs[0], "reset task=Index(0) seed=1");
        others_step_normally(&mut pool, n, &[1, 2, 3]);
        assert!(matches!(
            pool.reset(&specs([2], None)),
            Err(CoreError::InvalidArgument(_))
        ));
    }

    #[test]
    fn horizon_truncates_and_finish_records_reason() {
        let mut pool = EpisodePool::new("_test_panic", 3, Kwargs::new()).unwrap();
        pool.reset(&specs(0..3, Some(2))).unwrap();
        let a = pool.step(&[0, 1, 2], &["noop"; 3]).unwrap();
        assert_eq!(a.truncated, vec![false; 3]);
        let b = pool.step(&[0, 1], &["noop", "stop"]).unwrap();
        assert_eq!(b.truncated, vec![true, false]);
        assert_eq!(b.terminated, vec![false, true]);
        pool.finish(&[2], StopReason::Timeout).unwrap();
        assert_eq!(
            pool.stop_reasons_of(&[2, 0]).unwrap(),
            vec![Some(StopReason::Timeout), Some(StopReason::Horizon)]
        );
        assert!(pool.stop_reasons_of(&[3]).is_err());
        let reasons = pool.stop_reasons();
        assert_eq!(
            reasons,
            vec![
                Some(StopReason::Horizon),
                Some(StopReason::Done),
                Some(StopReason::Timeout)
            ]
        );
    }

    #[test]
    fn large_pool_is_cheap_until_reset() {
        let mut pool = EpisodePool::new("_test_panic", 100_000, Kwargs::new()).unwrap();
        assert_eq!(pool.len(), 100_000);
        pool.reset(&specs(0..100_000, Some(5))).unwrap();
        let ids: Vec<usize> = (0..100_000).collect();
        let out = pool.step(&ids, &vec!["noop"; 100_000]).unwrap();
        assert_eq!(out.observations.len(), 100_000);
    }
}
