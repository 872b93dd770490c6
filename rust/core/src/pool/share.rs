//! [`run_shared`]: run a batch's chunks on the calling thread, with rayon workers joining in
//! only if and when they get a core.
//!
//! `into_par_iter` from a non-worker thread parks the caller until the workers finish; on
//! a busy machine (the second core taken by another process) that costs more than it gains:
//! the workers wait for a core while the caller sleeps. Here the caller steps chunks itself
//! from the start, and a helper task that starts late finds nothing left to claim. The
//! caller never waits for a helper that has not started, only for chunks already running.

use parking_lot::Mutex;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Claims and runs the next job; false once every job is claimed.
type Work<'a> = dyn Fn() -> bool + Sync + 'a;

/// What a helper task shares with the caller's frame.
struct Shared {
    /// Set by the caller once it has claimed every job (or is unwinding).
    closed: AtomicBool,
    /// Helpers between their start and their end.
    active: AtomicUsize,
    /// The caller's `work` closure, its lifetime erased (see [`Shared::help`]).
    work: *const Work<'static>,
}

// SAFETY: `work` points to a `Sync` closure and is only called under the protocol below.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    /// A helper: registers as active, then works only if the caller has not closed yet.
    ///
    /// Protocol (all `SeqCst`): the helper increments `active` before it reads `closed`; the
    /// caller stores `closed` before it waits for `active == 0`. So either the caller sees
    /// this helper as active and waits for it, or the helper sees `closed` and never touches
    /// `work`: the pointer is only dereferenced while the caller's frame is alive.
    fn help(&self) {
        struct Leave<'a>(&'a AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.active.fetch_add(1, Ordering::SeqCst);
        let _leave = Leave(&self.active);
        if !self.closed.load(Ordering::SeqCst) {
            // SAFETY: see the protocol above.
            let work = unsafe { &*self.work };
            while work() {}
        }
    }
}

/// Closes `shared` and waits for the active helpers, also when the caller unwinds.
struct Close<'a>(&'a Shared);

impl Drop for Close<'_> {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::SeqCst);
        let mut spins = 0u32;
        while self.0.active.load(Ordering::SeqCst) != 0 {
            spins += 1;
            if spins < 128 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// `jobs.into_iter().map(f).collect()`, with up to `rayon::current_num_threads() - 1`
/// rayon workers helping (so the caller plus helpers match the worker count).
pub(crate) fn run_shared<J: Send, R: Send>(jobs: Vec<J>, f: impl Fn(J) -> R + Sync) -> Vec<R> {
    let n = jobs.len();
    let helpers = rayon::current_num_threads()
        .saturating_sub(1)
        .min(n.saturating_sub(1));
    if helpers == 0 {
        return jobs.into_iter().map(f).collect();
    }
    let jobs: Vec<Mutex<Option<J>>> = jobs.into_iter().map(|j| Mutex::new(Some(j))).collect();
    // A job that panics (on a helper, where nothing could catch it) is re-raised here.
    let results: Vec<Mutex<Option<std::thread::Result<R>>>> =
        (0..n).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let work = || {
        let k = next.fetch_add(1, Ordering::Relaxed);
        let Some(job) = jobs.get(k).and_then(|j| j.lock().take()) else {
            return false;
        };
        let out = catch_unwind(AssertUnwindSafe(|| f(job)));
        *results[k].lock() = Some(out);
        true
    };
    let work: &Work<'_> = &work;
    // SAFETY: only the lifetime is erased; `Close` below keeps this frame (and so `work`
    // and everything it borrows) alive until no helper can call it any more.
    let work: *const Work<'static> = unsafe { std::mem::transmute(work as *const Work<'_>) };
    let shared = Arc::new(Shared {
        closed: AtomicBool::new(false),
        active: AtomicUsize::new(0),
        work,
    });
    {
        let _close = Close(&shared);
        for _ in 0..helpers {
            let shared = Arc::clone(&shared);
            rayon::spawn(move || shared.help());
        }
        // SAFETY: `work` is alive here (it is this frame's).
        let work = unsafe { &*shared.work };
        while work() {}
    }
    results
        .into_iter()
        .map(|r| match r.into_inner().expect("every job ran") {
            Ok(out) => out,
            Err(payload) => resume_unwind(payload),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_job_runs_once_in_order() {
        for n in [0, 1, 2, 7, 100] {
            let out = run_shared((0..n).collect(), |j: usize| {
                std::thread::yield_now();
                j * 2
            });
            assert_eq!(out, (0..n).map(|j| j * 2).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_panicking_job_reaches_the_caller() {
        let caught = catch_unwind(|| {
            run_shared((0..8).collect(), |j: usize| {
                assert!(j != 5, "job 5 fails");
                j
            })
        });
        assert!(caught.is_err());
    }

    #[test]
    fn borrowed_state_is_safe_across_many_batches() {
        let data: Vec<u64> = (0..1000).collect();
        for _ in 0..200 {
            let sums = run_shared((0..10).collect(), |k: usize| {
                data[k * 100..(k + 1) * 100].iter().sum::<u64>()
            });
            assert_eq!(sums.iter().sum::<u64>(), 499_500);
        }
    }
}
