//! Env snapshots: a running slot's whole state (a copy of its env, [`Env::snapshot`], and
//! its episode bookkeeping, [`Episode`]) saved in a table the pool owns, under an opaque
//! handle; restored into any slot; or copied straight into other slots (a fork).
//!
//! Handles are `u64`s issued in increasing order from 1 and never reused, so a released
//! or foreign handle is always an [`CoreError::UnknownSnapshot`], never another snapshot.
//! A snapshot stays valid until released: it can be restored any number of times, into any
//! slots. Every call checks its whole input before it changes anything.
//!
//! A fork writes into *free* slots: the pool has a fixed number of slots and the caller
//! picks which slot plays what (as for [`EpisodePool::reset`]), so a fork names its
//! targets, and a target must hold no running episode (never reset, or finished). Its
//! previous episode, if any, is replaced.
//!
//! A slot's undo history ([`super::undo`]) is part of its state: a snapshot copies it, a
//! restore or fork puts the copy back with the env.

use super::undo::History;
use super::{EpisodePool, Slot, PAR_MIN_ROWS};
use crate::env::Env;
use crate::episode::{Episode, EpisodeStatus};
use crate::error::{CoreError, Result};
use crate::Task;
use parking_lot::Mutex;
use rayon::prelude::*;

/// An opaque snapshot handle, valid for the pool that issued it until released.
pub type SnapshotHandle = u64;

/// One saved slot state. The table holds each behind a mutex (envs are `Send`, not
/// `Sync`), so that a parallel restore can copy from it on any thread.
pub(super) struct Snapshot {
    env: Box<dyn Env>,
    episode: Episode,
    undo: Option<Box<History>>,
}

impl Snapshot {
    /// A copy of this snapshot (for a slot; the stored one stays as it is).
    fn copy(&self) -> Option<Snapshot> {
        Some(Snapshot {
            env: self.env.snapshot()?,
            episode: self.episode.clone(),
            undo: copy_history(&self.undo),
        })
    }

    /// Bytes this snapshot holds: its table entry (handle, env pointer and episode record),
    /// the env's struct (`size_of_val`), the env's own heap buffers ([`Env::heap_bytes`]:
    /// capacities, not shared read-only data such as word lists or recipe books) and the
    /// episode's task text.
    fn bytes(&self) -> usize {
        let task = match &self.episode.task {
            Task::Spec(s) => s.capacity(),
            Task::Index(_) => 0,
        };
        std::mem::size_of::<(SnapshotHandle, Mutex<Snapshot>)>()
            + std::mem::size_of_val(&*self.env)
            + self.env.heap_bytes()
            + task
    }
}

/// The slot's state, if its episode is running and its env can snapshot.
fn take(slot: &Slot, id: usize, op: &'static str, env_id: &str) -> Result<Snapshot> {
    running(slot, id, op)?;
    let env = slot
        .env
        .as_ref()
        .and_then(|e| e.snapshot())
        .ok_or_else(|| unsupported(env_id))?;
    Ok(Snapshot {
        env,
        episode: slot.episode.clone(),
        undo: copy_history(&slot.undo),
    })
}

/// A copy of an undo history (none where a saved env cannot be copied: no undo then).
fn copy_history(h: &Option<Box<History>>) -> Option<Box<History>> {
    h.as_ref().and_then(|h| h.copy()).map(Box::new)
}

fn running(slot: &Slot, id: usize, op: &'static str) -> Result<()> {
    match slot.episode.status {
        EpisodeStatus::Running => Ok(()),
        EpisodeStatus::Empty => Err(CoreError::NotRunning {
            slot: id,
            op,
            reason: None,
        }),
        EpisodeStatus::Finished(r) => Err(CoreError::NotRunning {
            slot: id,
            op,
            reason: Some(r),
        }),
    }
}

fn unsupported(env_id: &str) -> CoreError {
    CoreError::SnapshotUnsupported {
        env: env_id.to_string(),
    }
}

/// Puts `snap` into `slot`: its env and its episode, exactly as saved.
fn put(slot: &mut Slot, snap: Snapshot) {
    slot.env = Some(snap.env);
    slot.episode = snap.episode;
    slot.undo = snap.undo;
}

impl EpisodePool {
    /// Whether this pool's env can snapshot ([`Env::snapshot`] of a fresh env), known
    /// before any episode starts.
    pub fn snapshots_supported(&self) -> bool {
        self.snapshots_supported
    }

    /// Live (issued, not released) snapshots.
    pub fn num_snapshots(&self) -> usize {
        self.snapshots.len()
    }

    fn check_handles(&self, handles: &[SnapshotHandle]) -> Result<()> {
        match handles.iter().find(|h| !self.snapshots.contains_key(h)) {
            Some(&handle) => Err(CoreError::UnknownSnapshot { handle }),
            None => Ok(()),
        }
    }

    /// Saves the state of each of slots `ids` (a running episode each): one new handle per
    /// slot, in order. Fails as a whole, before saving anything, on bad or repeated ids, a
    /// slot without a running episode ([`CoreError::NotRunning`]) or an env that cannot
    /// snapshot ([`CoreError::SnapshotUnsupported`]).
    pub fn snapshot(&mut self, ids: &[usize]) -> Result<Vec<SnapshotHandle>> {
        self.check_ids(ids.iter().copied())?;
        for &id in ids {
            running(self.slots[id].get_mut(), id, "snapshot")?;
        }
        if !ids.is_empty() && !self.snapshots_supported {
            return Err(unsupported(&self.env_id));
        }
        let slots = &self.slots;
        let env_id = self.env_id.as_str();
        let f = |&id: &usize| take(&slots[id].lock(), id, "snapshot", env_id);
        let saved: Result<Vec<Snapshot>> = if ids.len() < PAR_MIN_ROWS {
            ids.iter().map(f).collect()
        } else {
            ids.par_iter().map(f).collect()
        };
        let saved = saved?;
        self.snapshots.reserve(saved.len());
        Ok(saved
            .into_iter()
            .map(|snap| {
                self.next_snapshot += 1;
                self.snapshots.insert(self.next_snapshot, Mutex::new(snap));
                self.next_snapshot
            })
            .collect())
    }

    /// Puts slot `ids[i]` back into the state saved under `handles[i]`: its env and its
    /// episode (task, seed, turns, horizon, status, total reward, refused turns) exactly as
    /// they were, whatever the slot holds now. A handle may be restored any number of times,
    /// into any slots of this pool, and stays valid. Fails as a whole, before changing
    /// anything, on bad or repeated ids, unequal lengths or an unknown handle.
    pub fn restore(&mut self, ids: &[usize], handles: &[SnapshotHandle]) -> Result<()> {
        if ids.len() != handles.len() {
            return Err(CoreError::InvalidArgument(format!(
                "restore got {} ids and {} handles; lengths must match",
                ids.len(),
                handles.len()
            )));
        }
        self.check_ids(ids.iter().copied())?;
        self.check_handles(handles)?;
        let table = &self.snapshots;
        let env_id = self.env_id.as_str();
        let copy = |h: &SnapshotHandle| table[h].lock().copy().ok_or_else(|| unsupported(env_id));
        let copies: Result<Vec<Snapshot>> = if ids.len() < PAR_MIN_ROWS {
            handles.iter().map(copy).collect()
        } else {
            handles.par_iter().map(copy).collect()
        };
        for (&id, snap) in ids.iter().zip(copies?) {
            put(self.slots[id].get_mut(), snap);
        }
        Ok(())
    }

    /// Copies the state of slot `src` (a running episode) into each of slots `targets`:
    /// every target then holds the same env state and episode bookkeeping as `src`, and
    /// from then on each slot steps on its own. A target must hold no running episode
    /// ([`CoreError::SlotBusy`]); `src` keeps running. Fails as a whole, before changing
    /// anything, on bad or repeated ids (`src` among the targets included), a `src` without
    /// a running episode ([`CoreError::NotRunning`], e.g. one that ended with `env_error`)
    /// or an env that cannot snapshot.
    pub fn fork(&mut self, src: usize, targets: &[usize]) -> Result<()> {
        self.check_ids(std::iter::once(src).chain(targets.iter().copied()))?;
        running(self.slots[src].get_mut(), src, "fork")?;
        if let Some(&busy) = targets
            .iter()
            .find(|&&t| self.slots[t].get_mut().episode.status == EpisodeStatus::Running)
        {
            return Err(CoreError::SlotBusy { slot: busy });
        }
        if !self.snapshots_supported {
            return Err(unsupported(&self.env_id));
        }
        let Some((&last, rest)) = targets.split_last() else {
            return Ok(());
        };
        let base = take(self.slots[src].get_mut(), src, "fork", &self.env_id)?;
        // The copies are made one after another: they all read `base`.
        let copies: Option<Vec<Snapshot>> = rest.iter().map(|_| base.copy()).collect();
        let copies = copies.ok_or_else(|| unsupported(&self.env_id))?;
        for (&id, snap) in rest.iter().zip(copies) {
            put(self.slots[id].get_mut(), snap);
        }
        put(self.slots[last].get_mut(), base);
        Ok(())
    }

    /// Frees the snapshots under `handles`; they become unknown. Fails as a whole, before
    /// freeing anything, on an unknown (or already released) handle or one given twice.
    pub fn release(&mut self, handles: &[SnapshotHandle]) -> Result<()> {
        self.check_handles(handles)?;
        let mut seen = std::collections::HashSet::with_capacity(handles.len());
        if let Some(&twice) = handles.iter().find(|h| !seen.insert(**h)) {
            return Err(CoreError::InvalidArgument(format!(
                "snapshot handle {twice} appears more than once in one release"
            )));
        }
        for h in handles {
            self.snapshots.remove(h);
        }
        Ok(())
    }

    /// Bytes each snapshot holds (see `Snapshot::bytes`: table entry, env struct, the env's
    /// own heap buffers, task text; shared read-only data is not counted).
    pub fn snapshot_bytes(&self, handles: &[SnapshotHandle]) -> Result<Vec<usize>> {
        self.check_handles(handles)?;
        Ok(handles
            .iter()
            .map(|h| self.snapshots[h].lock().bytes())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use crate::episode::StopReason;
    use crate::error::CoreError;
    use crate::pool::{EpisodePool, ResetSpec};
    use crate::registry::Kwargs;
    use crate::Task;

    fn reset(pool: &mut EpisodePool, slot: usize, task: Task) {
        let spec = ResetSpec {
            slot,
            task,
            seed: 3,
            max_turns: None,
        };
        pool.reset(std::slice::from_ref(&spec)).unwrap();
    }

    fn maze(n: usize) -> EpisodePool {
        EpisodePool::new("maze", n, Kwargs::new()).unwrap()
    }

    #[test]
    fn an_env_without_snapshots_is_refused_by_name() {
        crate::registry::register_test_envs();
        let mut pool = EpisodePool::new("_test_panic", 3, Kwargs::new()).unwrap();
        assert!(!pool.snapshots_supported());
        reset(&mut pool, 0, Task::Index(0));
        let unsupported = Some(CoreError::SnapshotUnsupported {
            env: "_test_panic".into(),
        });
        assert_eq!(pool.snapshot(&[0]).err(), unsupported);
        assert_eq!(pool.fork(0, &[1]).err(), unsupported);
        assert_eq!(pool.num_snapshots(), 0);
        // A fork from an episode that ended with `env_error` names that first.
        pool.step(&[0], &["panic"]).unwrap();
        assert_eq!(
            pool.fork(0, &[1]).err(),
            Some(CoreError::NotRunning {
                slot: 0,
                op: "fork",
                reason: Some(StopReason::EnvError)
            })
        );
    }

    #[test]
    fn slots_without_a_running_episode_are_refused() {
        let mut pool = maze(4);
        assert!(pool.snapshots_supported());
        let never = CoreError::NotRunning {
            slot: 1,
            op: "snapshot",
            reason: None,
        };
        assert_eq!(pool.snapshot(&[1]).err(), Some(never.clone()));
        assert!(never.to_string().contains("not been reset"));
        // A task the env refuses leaves the slot finished with env_error.
        let bad = ResetSpec {
            slot: 2,
            task: Task::Spec("not a maze".into()),
            seed: 0,
            max_turns: None,
        };
        assert!(pool.reset(&[bad]).is_err());
        let failed = pool.fork(2, &[3]).unwrap_err();
        assert_eq!(
            failed,
            CoreError::NotRunning {
                slot: 2,
                op: "fork",
                reason: Some(StopReason::EnvError)
            }
        );
        assert!(failed.to_string().contains("env_error"), "{failed}");
        // One bad slot in a batch: nothing is saved.
        reset(&mut pool, 0, Task::Index(0));
        assert!(pool.snapshot(&[0, 2]).is_err());
        assert_eq!(pool.num_snapshots(), 0);
    }

    #[test]
    fn malformed_batches_change_nothing() {
        let mut pool = maze(3);
        reset(&mut pool, 0, Task::Index(0));
        reset(&mut pool, 1, Task::Index(1));
        assert_eq!(
            pool.snapshot(&[0, 5]).err(),
            Some(CoreError::SlotOutOfRange { slot: 5, size: 3 })
        );
        assert_eq!(
            pool.snapshot(&[0, 0]).err(),
            Some(CoreError::DuplicateSlot { slot: 0 })
        );
        let h = pool.snapshot(&[0]).unwrap();
        assert!(pool.restore(&[0, 1], &h).is_err());
        assert_eq!(
            pool.restore(&[1], &[h[0] + 7]).err(),
            Some(CoreError::UnknownSnapshot { handle: h[0] + 7 })
        );
        assert_eq!(pool.episode(1).unwrap().task, Task::Index(1));
        assert_eq!(
            pool.fork(0, &[0]).err(),
            Some(CoreError::DuplicateSlot { slot: 0 })
        );
        assert_eq!(
            pool.fork(0, &[2, 1]).err(),
            Some(CoreError::SlotBusy { slot: 1 })
        );
        assert_eq!(pool.stop_reasons()[2], None);
        assert!(pool.release(&[h[0], h[0]]).is_err());
        assert_eq!(pool.num_snapshots(), 1);
        pool.release(&h).unwrap();
        assert_eq!(
            pool.release(&h).err(),
            Some(CoreError::UnknownSnapshot { handle: h[0] })
        );
        assert_eq!(
            pool.snapshot_bytes(&h).err(),
            Some(CoreError::UnknownSnapshot { handle: h[0] })
        );
        // Handles are never reused.
        assert!(pool.snapshot(&[0]).unwrap()[0] > h[0]);
    }

    #[test]
    fn restore_puts_back_the_episode_bookkeeping() {
        let mut pool = maze(2);
        let spec = ResetSpec {
            slot: 0,
            task: Task::Index(4),
            seed: 9,
            max_turns: Some(3),
        };
        pool.reset(&[spec]).unwrap();
        pool.step(&[0], &["xyzzy"]).unwrap();
        let before = pool.episode(0).unwrap();
        let h = pool.snapshot(&[0]).unwrap();
        pool.step(&[0], &["xyzzy"]).unwrap();
        pool.step(&[0], &["xyzzy"]).unwrap();
        assert_eq!(pool.stop_reasons()[0], Some(StopReason::Horizon));
        // Back to running, one turn and one refusal in, into a finished and an empty slot.
        pool.restore(&[0, 1], &[h[0], h[0]]).unwrap();
        for slot in [0, 1] {
            let ep = pool.episode(slot).unwrap();
            assert_eq!(format!("{ep:?}"), format!("{before:?}"));
            assert_eq!((ep.turns, ep.invalid_turns, ep.max_turns), (1, 1, Some(3)));
        }
        // A fork into the slot that just finished, and an empty fork.
        pool.step(&[1], &["xyzzy"]).unwrap();
        pool.step(&[1], &["xyzzy"]).unwrap();
        pool.fork(0, &[1]).unwrap();
        assert_eq!(pool.episode(1).unwrap().turns, 1);
        pool.fork(0, &[]).unwrap();
    }
}
