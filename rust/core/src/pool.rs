//! [`EpisodePool`]: many live episodes of one native env, reset and stepped in batches.
//!
//! Batches run on rayon's pool. Each slot sits behind its own (uncontended) mutex, which
//! gives safe disjoint mutable access from worker threads; the pool methods take `&mut self`,
//! so validation happens up front without locking and a bad batch has no side effects.
//! A panic inside an env is caught at the episode boundary: that episode ends with stop
//! reason `env_error`, its env is dropped (rebuilt on the next reset), the rest of the batch
//! is untouched.

use crate::env::{Env, Task};
use crate::episode::{Episode, EpisodeStatus, StopReason};
use crate::error::{CoreError, Result};
use crate::registry::{self, Kwargs, MakeFn};
use parking_lot::Mutex;
use rayon::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Batches smaller than this run on the calling thread (rayon's fork cost dominates).
const PAR_MIN_LEN: usize = 64;

#[derive(Default)]
struct Slot {
    env: Option<Box<dyn Env>>,
    episode: Episode,
}

/// Results of a batched step, in the order of the slot ids given.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StepBatch {
    pub observations: Vec<String>,
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

pub struct EpisodePool {
    env_id: String,
    kwargs: Kwargs,
    make: MakeFn,
    slots: Vec<Mutex<Slot>>,
    instructions: String,
    num_tasks: u64,
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
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
        let mut slots = Vec::with_capacity(num_envs);
        slots.push(Mutex::new(Slot {
            env: Some(probe),
            episode: Episode::default(),
        }));
        slots.resize_with(num_envs, || Mutex::new(Slot::default()));
        Ok(Self {
            env_id: env_id.to_string(),
            kwargs,
            make: spec.make,
            slots,
            instructions,
            num_tasks,
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

    /// Reset the given slots. An env that rejects its task returns `InvalidTask` (after the
    /// whole batch ran; the rejecting slots are left finished with `env_error`). A panicking
    /// env ends its episode with `env_error` and its observation says so.
    pub fn reset(&mut self, specs: &[ResetSpec]) -> Result<Vec<String>> {
        self.check_ids(specs.iter().map(|s| s.slot))?;
        let make = self.make;
        let kwargs = &self.kwargs;
        let slots = &self.slots;
        let run = |spec: &ResetSpec| -> Result<String> {
            let mut guard = slots[spec.slot].lock();
            let slot = &mut *guard;
            slot.episode
                .start(spec.task.clone(), spec.seed, spec.max_turns);
            if slot.env.is_none() {
                match make(kwargs) {
                    Ok(env) => slot.env = Some(env),
                    Err(e) => {
                        slot.episode.finish(StopReason::EnvError);
                        return Err(e);
                    }
                }
            }
            let env = slot.env.as_mut().expect("env just built");
            match catch_unwind(AssertUnwindSafe(|| env.reset(&spec.task, spec.seed))) {
                Ok(Ok(obs)) => Ok(obs),
                Ok(Err(e)) => {
                    slot.episode.finish(StopReason::EnvError);
                    Err(e)
                }
                Err(payload) => {
                    slot.env = None;
                    slot.episode.finish(StopReason::EnvError);
                    Ok(format!("Environment error: {}", panic_message(payload)))
                }
            }
        };
        let results: Vec<Result<String>> = if specs.len() < PAR_MIN_LEN {
            specs.iter().map(run).collect()
        } else {
            specs
                .par_iter()
                .with_min_len(PAR_MIN_LEN / 2)
                .map(run)
                .collect()
        };
        results.into_iter().collect()
    }

    /// Step the given slots with one action each. Errors (out of range, duplicate id, a slot
    /// not running) are reported before anything is stepped.
    pub fn step(&mut self, ids: &[usize], actions: &[&str]) -> Result<StepBatch> {
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
        let slots = &self.slots;
        let run = |(&slot, &action): (&usize, &&str)| -> (String, f32, bool, bool) {
            let mut guard = slots[slot].lock();
            let s = &mut *guard;
            let env = s.env.as_mut().expect("running episode has an env");
            match catch_unwind(AssertUnwindSafe(|| env.step(action))) {
                Ok(step) => {
                    let truncated = s.episode.record_step(step.reward, step.terminated);
                    (step.observation, step.reward, step.terminated, truncated)
                }
                Err(payload) => {
                    s.env = None;
                    s.episode.turns += 1;
                    s.episode.finish(StopReason::EnvError);
                    let msg = format!("Environment error: {}", panic_message(payload));
                    (msg, 0.0, false, true)
                }
            }
        };
        let rows: Vec<(String, f32, bool, bool)> = if ids.len() < PAR_MIN_LEN {
            ids.iter().zip(actions.iter()).map(run).collect()
        } else {
            ids.par_iter()
                .zip(actions.par_iter())
                .with_min_len(PAR_MIN_LEN / 2)
                .map(run)
                .collect()
        };
        let mut out = StepBatch {
            observations: Vec::with_capacity(rows.len()),
            rewards: Vec::with_capacity(rows.len()),
            terminated: Vec::with_capacity(rows.len()),
            truncated: Vec::with_capacity(rows.len()),
        };
        for (o, r, te, tr) in rows {
            out.observations.push(o);
            out.rewards.push(r);
            out.terminated.push(te);
            out.truncated.push(tr);
        }
        Ok(out)
    }

    /// End running episodes from outside (backend error, timeout, abort, context length).
    /// Finished or empty slots are left as they are.
    pub fn finish(&mut self, ids: &[usize], reason: StopReason) -> Result<()> {
        self.check_ids(ids.iter().copied())?;
        for &slot in ids {
            let ep = &mut self.slots[slot].get_mut().episode;
            if ep.status == EpisodeStatus::Running {
                ep.finish(reason);
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
        Ok(if ids.len() < PAR_MIN_LEN {
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
            assert_eq!(out.observations[i], "step 1 noop");
            assert_eq!(out.rewards[i], 1.0);
        }
        // The broken slot is rebuilt on reset and works again.
        pool.reset(&specs([17], None)).unwrap();
        assert_eq!(
            pool.step(&[17], &["noop"]).unwrap().observations[0],
            "step 1 noop"
        );
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
