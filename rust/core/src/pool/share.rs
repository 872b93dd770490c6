//! [`run_shared`]: run a batch's chunks on the calling thread, with helper threads joining in
//! only if and when they get a core, and hand each chunk's result to the caller's consumer
//! as soon as it is finished.
//!
//! Parking the caller until workers finish (`into_par_iter` from a non-worker thread) costs
//! more than it gains on a busy machine (the second core taken by another process): the
//! workers wait for a core while the caller sleeps. Here the caller runs chunks itself from
//! the start, and a helper that starts late finds nothing left to claim. Between its own
//! chunks the caller consumes every result finished so far (the bindings turn a chunk's
//! observations into Python `str`s there, with the GIL taken back for just that), so the
//! serial work on results overlaps the helpers' stepping instead of following it.
//!
//! Helpers are this module's own threads (one fewer than rayon's worker count, so caller
//! plus helpers match it; none on one core). After a batch a helper spins briefly for the
//! next one (a pool is usually stepped again within microseconds, and waking a parked
//! thread costs tens of microseconds on a virtual machine), then parks.

use parking_lot::Mutex;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long an idle helper watches for the next batch before it parks: about the gap a
/// Python loop leaves between two batches of a few thousand rows (the results read, the
/// finished slots reset), so a busy loop never waits for a wake-up.
const IDLE_SPIN: Duration = Duration::from_micros(500);

/// Claims and runs the next job; false once every job is claimed.
type Work<'a> = dyn Fn() -> bool + Sync + 'a;

/// What a helper shares with the caller's frame.
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
        wait_until(|| self.0.active.load(Ordering::SeqCst) == 0);
    }
}

/// Waits until `done()`. The caller only waits for chunks that a helper is running, usually
/// for some microseconds: it spins, then yields. A longer wait means the helper lost its
/// core (another process runs there): then the caller sleeps in short naps, which leaves its
/// own core idle, so that the scheduler can move the helper over to finish its chunk.
fn wait_until(mut done: impl FnMut() -> bool) {
    let mut spins = 0u32;
    let mut since: Option<Instant> = None;
    while !done() {
        spins += 1;
        if spins < 256 {
            std::hint::spin_loop();
        } else if since.get_or_insert_with(Instant::now).elapsed() < Duration::from_micros(200) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// The process's helper threads and the batch they should join.
struct Helpers {
    /// The latest batch (its [`Shared`]); helpers join it when `generation` moves.
    current: Mutex<Option<Arc<Shared>>>,
    generation: AtomicU64,
    threads: Vec<Thread>,
}

impl Helpers {
    fn get() -> &'static Helpers {
        static HELPERS: OnceLock<Helpers> = OnceLock::new();
        HELPERS.get_or_init(|| {
            let count = rayon::current_num_threads().saturating_sub(1);
            let threads = (0..count)
                .filter_map(|i| {
                    std::thread::Builder::new()
                        .name(format!("agentgym-pool-{i}"))
                        .spawn(|| Helpers::get().run())
                        .ok()
                        .map(|h| h.thread().clone())
                })
                .collect();
            Helpers {
                current: Mutex::new(None),
                generation: AtomicU64::new(0),
                threads,
            }
        })
    }

    /// Publishes a batch and wakes the helpers (`unpark` of a thread that is not parked is
    /// one atomic store: it makes its next `park` return at once).
    fn post(&self, shared: &Arc<Shared>) {
        *self.current.lock() = Some(Arc::clone(shared));
        self.generation.fetch_add(1, Ordering::SeqCst);
        for t in &self.threads {
            t.unpark();
        }
    }

    /// Forgets `shared` if it is still the current batch (it is closed by now).
    fn retire(&self, shared: &Arc<Shared>) {
        let mut current = self.current.lock();
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, shared)) {
            *current = None;
        }
    }

    /// A helper thread's life: join each new batch; between batches spin a little, then park.
    fn run(&self) {
        let mut seen = self.generation.load(Ordering::SeqCst);
        loop {
            let now = self.generation.load(Ordering::SeqCst);
            if now != seen {
                seen = now;
                let batch = self.current.lock().clone();
                if let Some(shared) = batch {
                    shared.help();
                }
                continue;
            }
            let start = Instant::now();
            let mut moved = false;
            'spin: while start.elapsed() < IDLE_SPIN {
                for _ in 0..64 {
                    if self.generation.load(Ordering::Relaxed) != seen {
                        moved = true;
                        break 'spin;
                    }
                    std::hint::spin_loop();
                }
            }
            if !moved {
                // Returns at once if `post` unparked this thread since its last park; a
                // spurious return only leads to another look at `generation`.
                std::thread::park();
            }
        }
    }
}

/// Runs `f` on every job and gives each result to `done(index, result)` on the calling
/// thread, in the order the results become available (a job's index is its position in
/// `jobs`). Up to `rayon::current_num_threads() - 1` helper threads run jobs too.
///
/// A job that panics (on any thread) does not stop the others; once every job has run, its
/// panic is resumed here (the first one, if several did).
pub(crate) fn run_shared<J: Send, R: Send>(
    jobs: Vec<J>,
    f: impl Fn(J) -> R + Sync,
    mut done: impl FnMut(usize, R),
) {
    let n = jobs.len();
    let helpers = Helpers::get();
    if helpers.threads.is_empty() || n < 2 {
        // No helpers (one core, or RAYON_NUM_THREADS=1): the same contract, serially.
        let mut first_panic = None;
        for (k, job) in jobs.into_iter().enumerate() {
            match catch_unwind(AssertUnwindSafe(|| f(job))) {
                Ok(r) => done(k, r),
                Err(p) => {
                    first_panic.get_or_insert(p);
                }
            }
        }
        if let Some(p) = first_panic {
            resume_unwind(p);
        }
        return;
    }
    let jobs: Vec<Mutex<Option<J>>> = jobs.into_iter().map(|j| Mutex::new(Some(j))).collect();
    // Results of the jobs that helpers ran, and their indices in the order they finished.
    let results: Vec<Mutex<Option<std::thread::Result<R>>>> =
        (0..n).map(|_| Mutex::new(None)).collect();
    let finished: Mutex<Vec<usize>> = Mutex::new(Vec::with_capacity(n));
    let next = AtomicUsize::new(0);
    let claim = || {
        let k = next.fetch_add(1, Ordering::Relaxed);
        jobs.get(k)
            .and_then(|j| j.lock().take())
            .map(|job| (k, job))
    };
    let work = || {
        let Some((k, job)) = claim() else {
            return false;
        };
        let out = catch_unwind(AssertUnwindSafe(|| f(job)));
        *results[k].lock() = Some(out);
        finished.lock().push(k);
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
    let mut first_panic = None;
    {
        let _close = Close(&shared);
        helpers.post(&shared);
        let mut delivered = 0;
        let mut ready = Vec::with_capacity(n);
        let mut deliver = |k: usize, out: std::thread::Result<R>| match out {
            Ok(r) => done(k, r),
            Err(payload) => {
                first_panic.get_or_insert(payload);
            }
        };
        // Delivers what the helpers finished since the last look; returns how many.
        let mut take_finished = |deliver: &mut dyn FnMut(usize, std::thread::Result<R>)| {
            std::mem::swap(&mut ready, &mut *finished.lock());
            let count = ready.len();
            for k in ready.drain(..) {
                let out = results[k]
                    .lock()
                    .take()
                    .expect("a finished job has a result");
                deliver(k, out);
            }
            count
        };
        // The caller's own jobs, each followed by whatever the helpers finished meanwhile.
        loop {
            delivered += take_finished(&mut deliver);
            let Some((k, job)) = claim() else { break };
            deliver(k, catch_unwind(AssertUnwindSafe(|| f(job))));
            delivered += 1;
        }
        // Every job is claimed: collect the ones still running on helpers.
        while delivered < n {
            wait_until(|| !finished.lock().is_empty());
            delivered += take_finished(&mut deliver);
        }
    }
    helpers.retire(&shared);
    if let Some(payload) = first_panic {
        resume_unwind(payload);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect<R: Send>(n: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
        let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
        run_shared((0..n).collect(), f, |k, r| {
            assert!(out[k].is_none(), "job {k} delivered twice");
            out[k] = Some(r);
        });
        out.into_iter()
            .map(|r| r.expect("every job delivered"))
            .collect()
    }

    #[test]
    fn every_job_runs_once_and_is_delivered_once() {
        for n in [0, 1, 2, 7, 100] {
            let out = collect(n, |j| {
                std::thread::yield_now();
                j * 2
            });
            assert_eq!(out, (0..n).map(|j| j * 2).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_panicking_job_reaches_the_caller_after_the_others_ran() {
        let ran = AtomicUsize::new(0);
        let caught = catch_unwind(AssertUnwindSafe(|| {
            collect(8, |j| {
                ran.fetch_add(1, Ordering::SeqCst);
                assert!(j != 5, "job 5 fails");
                j
            })
        }));
        assert!(caught.is_err());
        assert_eq!(ran.load(Ordering::SeqCst), 8);
    }

    #[test]
    fn a_panicking_consumer_still_waits_for_the_helpers() {
        let data: Vec<u64> = (0..1000).collect();
        let caught = catch_unwind(AssertUnwindSafe(|| {
            run_shared(
                (0..10).collect(),
                |k: usize| data[k * 100..(k + 1) * 100].iter().sum::<u64>(),
                |k, _| assert!(k != 3, "consumer fails"),
            )
        }));
        assert!(caught.is_err());
        // The pool still works afterwards.
        assert_eq!(collect(4, |k| k + 1), vec![1, 2, 3, 4]);
    }

    #[test]
    fn borrowed_state_is_safe_across_many_batches() {
        let data: Vec<u64> = (0..1000).collect();
        for _ in 0..200 {
            let sums = collect(10, |k| data[k * 100..(k + 1) * 100].iter().sum::<u64>());
            assert_eq!(sums.iter().sum::<u64>(), 499_500);
        }
    }

    #[test]
    fn concurrent_callers_share_the_helpers() {
        std::thread::scope(|s| {
            for t in 0..4u64 {
                s.spawn(move || {
                    for _ in 0..50 {
                        let out = collect(16, |k| k as u64 * t);
                        assert_eq!(out, (0..16).map(|k| k * t).collect::<Vec<_>>());
                    }
                });
            }
        });
    }
}
