//! A persistent thread pool for fork-join parallel kernels.
//!
//! Kernels split their work into more [`Parts`] than threads and call
//! [`ThreadPool::run_parts`] (or [`ThreadPool::run_taking`] with a queue of
//! their own): each thread takes the parts of its own share in order, then
//! what is left of the others', and the call returns when every part is done
//! and every thread that joined has left, **without waiting for a thread
//! that never joined**. On a busy machine a worker the OS has not scheduled
//! yet then costs nothing (the running threads take its parts), and one
//! descheduled in the middle of a part delays only that part. The pool
//! remembers whether recent jobs had a thread start late (another took the
//! first part of its share: [`ThreadPool::contended`]), so that kernels
//! whose finer parts repeat work (a product's parts each pack operands)
//! split finely only on a busy machine. `run(f)` calls
//! `f(i)` once on every thread (calibration, populating per-thread state).
//! Workers spin briefly on a generation counter before parking, so
//! back-to-back kernels (a model's layers) pay microseconds, not a thread
//! spawn. Concurrent calls from several threads take turns: the pool is
//! `Send + Sync`.
//!
//! A waiting thread gets off its CPU when the thread it waits for shares that
//! CPU (each thread publishes the CPU it runs on): the OS may wake a worker on
//! its waker's CPU, and two threads taking turns there (spinning, yielding)
//! look cache-hot to the load balancer, which then leaves the other CPU idle
//! for thousands of calls (fused attention at 64 keys: 128 µs a call instead
//! of 42 for the first 18 ms after compiling, in most processes; a virtual
//! machine's idle CPU is not one the OS wakes a thread on). So a worker that
//! finds itself on the caller's CPU moves off it (its affinity, briefly), and
//! a caller that finds a worker on its own CPU yields that CPU to it (see
//! [`caller_wait`] for why it does not sleep).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Iterations a worker spins on the generation counter before it parks.
const SPIN: usize = 1 << 14;

/// The longest a thread spins (or yields) before it parks, whatever `SPIN`
/// says: with another pool's threads or another process on its CPU, each
/// yield hands the CPU over for a time slice, and 240 of them kept an idle
/// pool's worker in the way of the next model's threads for 10-20 ms (a
/// compiled model's first ~140 calls at 64 keys, or the second of two models
/// run in turn, at a third of their speed).
const SPIN_TIME: std::time::Duration = std::time::Duration::from_micros(200);

/// Past this many spins, a waiting thread yields its CPU every `YIELD_EVERY`
/// spins: when the OS has put a woken worker on the waiter's own CPU (a cold
/// wake-up after an idle gap), spinning would keep it from running for the whole
/// spin budget (hundreds of µs); a yield with nothing else to run returns at once.
const YIELD_AFTER: usize = 1 << 10;
const YIELD_EVERY: usize = 64;

/// An unknown CPU (never equal to a known one).
const NO_CPU: usize = usize::MAX;

/// Spins between two looks at where the threads run.
const CPU_EVERY: usize = 64;

/// The CPU this thread runs on now, or `NO_CPU`.
#[cfg(target_os = "linux")]
fn current_cpu() -> usize {
    // SAFETY: `sched_getcpu` takes no arguments and touches no memory of ours.
    let c = unsafe { libc::sched_getcpu() };
    usize::try_from(c).unwrap_or(NO_CPU)
}

/// Where the system does not say, every CPU is unknown (no thread is ever crowded).
#[cfg(not(target_os = "linux"))]
fn current_cpu() -> usize {
    NO_CPU
}

/// Move the calling thread (a pool worker, never the caller of `run`) off CPU
/// `cpu`, where it crowds another of the pool's threads: its affinity is set
/// to every other CPU it may run on, which moves it at once, and then back to
/// what it was. Returns whether it moved (not when `cpu` is its only one).
#[cfg(target_os = "linux")]
fn leave_cpu(cpu: usize) -> bool {
    const SET_BITS: usize = 8 * std::mem::size_of::<libc::cpu_set_t>();
    if cpu >= SET_BITS {
        return false;
    }
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `cpu_set_t` is plain bits (all zeros is the empty set); the affinity
    // calls read and write exactly `size` bytes of the sets given, for this
    // thread (pid 0); the bit helpers index below `SET_BITS` (checked above).
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size, &mut allowed) != 0 {
            return false;
        }
        let mut others = allowed;
        libc::CPU_CLR(cpu, &mut others);
        if libc::CPU_COUNT(&others) == 0 || libc::sched_setaffinity(0, size, &others) != 0 {
            return false;
        }
        libc::sched_setaffinity(0, size, &allowed);
    }
    true
}

#[cfg(not(target_os = "linux"))]
fn leave_cpu(_cpu: usize) -> bool {
    false
}

impl Shared {
    /// Publish that thread `index` runs on the CPU it runs on now; returns it.
    fn here(&self, index: usize) -> usize {
        let c = current_cpu();
        self.cpus[index].store(c, Ordering::Relaxed);
        c
    }

    /// Whether the caller of `run`, on `cpu`, shares it with a worker.
    fn caller_crowded(&self, cpu: usize) -> bool {
        cpu != NO_CPU && self.cpus[1..].iter().any(|c| c.load(Ordering::Relaxed) == cpu)
    }

    /// Whether a worker on `cpu` shares it with the caller of `run`. (Only the
    /// caller's CPU is left: with more threads than CPUs, workers moving away
    /// from each other would only chase one another.)
    fn with_caller(&self, cpu: usize) -> bool {
        cpu != NO_CPU && self.cpus[0].load(Ordering::Relaxed) == cpu
    }

    /// Worker `index` publishes its CPU and moves off it when the caller is
    /// there too (publishing the new one); returns whether it still shares the
    /// caller's CPU (when it could not leave).
    fn keep_off_caller(&self, index: usize) -> bool {
        let cpu = self.here(index);
        if !self.with_caller(cpu) {
            return false;
        }
        if leave_cpu(cpu) {
            self.here(index);
            return false;
        }
        true
    }
}

/// Whether a spin-wait that began at `since` (set on the first look) has
/// gone on for `SPIN_TIME`.
fn spun_long(since: &mut Option<std::time::Instant>) -> bool {
    since.get_or_insert_with(std::time::Instant::now).elapsed() >= SPIN_TIME
}

/// One step of a spin-wait: a pause, or a yield now and then once it has gone on long.
fn spin_step(spins: usize) {
    if spins > YIELD_AFTER && spins.is_multiple_of(YIELD_EVERY) {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// What the caller of `run` does next while the workers finish.
#[derive(Debug, PartialEq, Eq)]
enum Wait {
    Spin,
    Yield,
    Park,
}

/// The caller's next step of waiting, its `spins`-th: `crowded` when a worker
/// shares its CPU, `long` once it has waited `SPIN_TIME`.
///
/// A crowded caller yields its CPU (the worker moves off it at its next look)
/// and does not sleep: the worker's wake-up would put the caller on the
/// worker's new CPU, where the worker moves off again, and so on, the two
/// taking turns on one CPU at every fork (BERT-base at one token: 14-16.5 ms a
/// call instead of 5 after an idle pause of 50 ms or more, in 4 of 6 processes).
fn caller_wait(crowded: bool, long: bool, spins: usize) -> Wait {
    match (crowded, long) {
        (_, true) => Wait::Park,
        (true, false) => Wait::Yield,
        (false, false) if spins < SPIN => Wait::Spin,
        (false, false) => Wait::Park,
    }
}

type Job = dyn Fn(usize) + Sync;

/// How the workers take a job.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Every worker calls it once with its index; `run` waits for all.
    EachThread,
    /// Workers that find it published call it with their index and count
    /// themselves in `active`; the caller closes it (clears the slot) when the
    /// work is done and waits only for those.
    Joining,
}

/// The published job, its generation and how it is taken.
#[derive(Clone, Copy)]
struct Published {
    generation: u64,
    job: JobPtr,
    mode: Mode,
}

struct Shared {
    generation: AtomicU64,
    /// The current job. Written by the caller under the lock; a worker reads it
    /// under the lock, and for a `Joining` job counts itself `active` there, so
    /// the caller's clearing (under the lock) leaves no worker about to call it
    /// uncounted.
    job: Mutex<Option<Published>>,
    pending: AtomicUsize,
    /// Workers inside a `Joining` job.
    active: AtomicUsize,
    /// Tests hold workers here, after they see a new generation and before
    /// they read the job: a thread the OS has not scheduled yet.
    #[cfg(test)]
    hold: AtomicBool,
    /// Workers parked on `wake` (or about to be): only then does `run` pay for a
    /// notification (a system call), not when every worker is still spinning.
    parked: AtomicUsize,
    /// The caller of `run` is parked on `done` (or about to be).
    caller_parked: AtomicBool,
    shutdown: AtomicBool,
    /// The CPU each thread last ran on (`NO_CPU` when unknown): the caller's
    /// of `run` at index 0, each worker's at its own index.
    cpus: Vec<AtomicUsize>,
    wake: Condvar,
    wake_lock: Mutex<()>,
    done: Condvar,
    done_lock: Mutex<()>,
}

/// A borrowed job, its lifetime erased.
#[derive(Clone, Copy)]
struct JobPtr(*const Job);
// SAFETY: the pointer is only dereferenced by workers between the moment `run`
// publishes it and the moment `run` sees every worker finish, while `run` holds
// the borrow it was made from; the job itself is `Sync`.
unsafe impl Send for JobPtr {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    turn: Mutex<()>,
    /// How often a thread of a recent job started late (see
    /// [`ThreadPool::contended`]): raised by [`CONTENDED_STEP`] for a job
    /// whose parts moved, lowered by one for one whose did not.
    contention: AtomicUsize,
}

/// What a job whose parts moved between threads adds to the pool's
/// contention, and the most it holds: four quiet jobs undo one that moved.
const CONTENDED_STEP: usize = 4;
const CONTENDED_MAX: usize = 16;

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool").field("threads", &self.threads()).finish()
    }
}

impl ThreadPool {
    /// A pool of `threads` (the caller counts as one).
    pub fn new(threads: usize) -> ThreadPool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            pending: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            #[cfg(test)]
            hold: AtomicBool::new(false),
            parked: AtomicUsize::new(0),
            caller_parked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            cpus: (0..threads).map(|_| AtomicUsize::new(NO_CPU)).collect(),
            wake: Condvar::new(),
            wake_lock: Mutex::new(()),
            done: Condvar::new(),
            done_lock: Mutex::new(()),
        });
        let workers = (1..threads)
            .map(|index| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("anyshape-{index}"))
                    .spawn(move || worker(&s, index))
                    .expect("spawning a pool thread")
            })
            .collect();
        ThreadPool { shared, workers, turn: Mutex::new(()), contention: AtomicUsize::new(0) }
    }

    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Call `f(i)` once on every thread, `i` its index (the caller's is 0), in
    /// parallel; return when all are done. For work that needs every thread
    /// (calibrating them, per-thread state); kernels call [`Self::run_parts`].
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            f(0);
            return;
        }
        let _turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        let s = &self.shared;
        s.pending.store(self.workers.len(), Ordering::SeqCst);
        self.publish(f, Mode::EachThread);
        f(0);
        self.wait_for(&s.pending);
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Call `f(p)` for every part `p` of `parts`, the threads taking them as
    /// [`Parts::take`] deals them; return when all are done (not waiting for a
    /// thread that never joined).
    pub fn run_parts(&self, parts: &Parts, f: &(dyn Fn(usize) + Sync)) {
        self.run_taking(&|me| {
            while let Some(p) = parts.take(me) {
                f(p);
            }
        });
        // One update (concurrent callers' jobs each count).
        let moved = parts.moved();
        let _ = self.contention.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
            Some(if moved { (c + CONTENDED_STEP).min(CONTENDED_MAX) } else { c.saturating_sub(1) })
        });
    }

    /// Whether a recent job's parts moved between threads: a thread took the
    /// first part of another's share, which on a quiet machine (every thread
    /// running and joining at once) does not happen. Kernels whose finer parts
    /// cost work of their own (a product's parts each pack their operands
    /// again) split finely only then: a descheduled thread's share is then
    /// taken over in small steps, and on a quiet machine nothing is done
    /// twice.
    pub fn contended(&self) -> bool {
        self.contention.load(Ordering::Relaxed) > 0
    }

    /// Call `f(me)` on the caller (`me` = 0) and on every worker that joins
    /// before the caller's call returns; return when every joined call has
    /// returned. `f` must take its work from a shared queue (a [`Parts`]) until
    /// none is left: a worker that joins late, or never, finds nothing to do.
    pub fn run_taking(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            f(0);
            return;
        }
        let _turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        let s = &self.shared;
        self.publish(f, Mode::Joining);
        f(0);
        // Every part is taken: close the job (no worker joins from now on) and
        // wait for those inside.
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.wait_for(&s.active);
    }

    /// Publish `f` as the next generation's job and wake parked workers.
    fn publish(&self, f: &(dyn Fn(usize) + Sync), mode: Mode) {
        let s = &self.shared;
        // SAFETY: erasing the lifetime is sound because `run` and `run_taking` do
        // not return before every worker that read the job has finished calling
        // it (`pending` or `active` is 0), and clear the slot before they return,
        // so the borrow outlives every use.
        let job = JobPtr(unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Job>(f) });
        let generation = s.generation.load(Ordering::Relaxed) + 1;
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(Published { generation, job, mode });
        s.generation.store(generation, Ordering::SeqCst);
        // A worker counts itself parked (SeqCst) before it checks the generation under
        // `wake_lock`; so either it sees the new generation, or this sees it parked and
        // notifies under the lock (which it cannot miss: it waits holding the lock).
        if s.parked.load(Ordering::SeqCst) > 0 {
            let _g = s.wake_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
    }

    /// The caller waits until `count` (workers still inside the job) is 0.
    fn wait_for(&self, count: &AtomicUsize) {
        let s = &self.shared;
        let mut cpu = s.here(0);
        let mut spins: usize = 0;
        let mut since = None;
        while count.load(Ordering::Acquire) != 0 {
            let look = spins.is_multiple_of(CPU_EVERY);
            if look && spins > 0 {
                cpu = s.here(0);
            }
            let crowded = look && s.caller_crowded(cpu);
            let long = look && spun_long(&mut since);
            spins += 1;
            match caller_wait(crowded, long, spins) {
                Wait::Spin => spin_step(spins),
                Wait::Yield => std::thread::yield_now(),
                Wait::Park => {
                    let g = s.done_lock.lock().unwrap_or_else(|e| e.into_inner());
                    s.caller_parked.store(true, Ordering::SeqCst);
                    if count.load(Ordering::SeqCst) != 0 {
                        drop(s.done.wait_timeout(g, std::time::Duration::from_millis(1)));
                    }
                    s.caller_parked.store(false, Ordering::SeqCst);
                }
            }
        }
    }
}

/// Parts of a job dealt to threads: `n` parts in `threads` contiguous shares
/// (a thread's consecutive parts are neighbouring rows or blocks, read and
/// written in address order, as the hardware's prefetchers expect, and on a
/// quiet machine each thread does exactly its share); a thread whose share is
/// done takes what is left of the others', the nearest first.
pub struct Parts {
    /// The shares of up to [`INLINE_SHARES`] threads, in place: a fork-join
    /// on the run path allocates nothing.
    inline: [Share; INLINE_SHARES],
    /// The shares of more threads.
    heap: Vec<Share>,
    threads: usize,
    /// Whether a thread took the first part of another's share: that thread
    /// had not started (not running, or late), which the parts the last
    /// threads take from each other as they finish do not say.
    moved: AtomicBool,
}

/// Threads whose shares [`Parts`] holds in place.
const INLINE_SHARES: usize = 16;

/// A share's next part and its end, on a cache line of its own (the threads
/// take from their own shares at once; neighbouring counters would bounce
/// one line between their cores at every part).
#[repr(align(64))]
struct Share {
    next: AtomicUsize,
    start: usize,
    end: usize,
}

impl Parts {
    pub fn new(n: usize, threads: usize) -> Parts {
        let t = threads.max(1);
        let share =
            |i: usize| Share { next: AtomicUsize::new(n * i / t), start: n * i / t, end: n * (i + 1) / t };
        let inline = std::array::from_fn(|i| {
            if i < t {
                share(i)
            } else {
                Share { next: AtomicUsize::new(0), start: 0, end: 0 }
            }
        });
        let heap = if t > INLINE_SHARES { (0..t).map(share).collect() } else { Vec::new() };
        Parts { inline, heap, threads: t, moved: AtomicBool::new(false) }
    }

    /// Whether a thread took the first part of another thread's share.
    pub fn moved(&self) -> bool {
        self.moved.load(Ordering::Relaxed)
    }

    fn shares(&self) -> &[Share] {
        if self.threads > INLINE_SHARES {
            &self.heap
        } else {
            &self.inline[..self.threads]
        }
    }

    /// Thread `me`'s next part: from its own share, then from the others'.
    pub fn take(&self, me: usize) -> Option<usize> {
        let shares = self.shares();
        let k = shares.len();
        (0..k).find_map(|d| {
            let share = &shares[(me + d) % k];
            // Look before taking: a share that is done stays done, and the
            // increment would only grow it.
            if share.next.load(Ordering::Relaxed) >= share.end {
                return None;
            }
            let t = share.next.fetch_add(1, Ordering::Relaxed);
            if t == share.start && d > 0 {
                self.moved.store(true, Ordering::Relaxed);
            }
            (t < share.end).then_some(t)
        })
    }
}

fn worker(s: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        // Wait for a new generation: spin, then park (at once when the caller
        // shares this CPU: it cannot publish the next job while this spins).
        let mut spins: usize = 0;
        let mut since = None;
        loop {
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            let look = spins.is_multiple_of(CPU_EVERY);
            let crowded = look && s.keep_off_caller(index);
            if spins < SPIN && !crowded && !(look && spun_long(&mut since)) {
                spins += 1;
                spin_step(spins);
            } else {
                spins = 0;
                since = None;
                let guard = s.wake_lock.lock().unwrap_or_else(|e| e.into_inner());
                s.parked.fetch_add(1, Ordering::SeqCst);
                if s.generation.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::Acquire) {
                    drop(s.wake.wait(guard));
                } else {
                    drop(guard);
                }
                s.parked.fetch_sub(1, Ordering::SeqCst);
            }
        }
        s.keep_off_caller(index);
        #[cfg(test)]
        while s.hold.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        let published = {
            let slot = s.job.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_some_and(|p| p.mode == Mode::Joining) {
                s.active.fetch_add(1, Ordering::SeqCst);
            }
            *slot
        };
        let Some(p) = published else { continue };
        // The slot holds the latest published job (set before its generation):
        // this is the generation now taken.
        seen = seen.max(p.generation);
        // SAFETY: see `JobPtr`: the caller keeps the job alive until `pending`
        // (each-thread jobs) or `active` (joining jobs, counted above under the
        // slot's lock) is 0.
        unsafe { (*p.job.0)(index) };
        let count = match p.mode {
            Mode::EachThread => &s.pending,
            Mode::Joining => &s.active,
        };
        // The caller parks (a job longer than its spin) with `caller_parked`
        // set before it re-checks the count under `done_lock`, and wakes every
        // millisecond anyway.
        if count.fetch_sub(1, Ordering::SeqCst) == 1 && s.caller_parked.load(Ordering::SeqCst) {
            let _g = s.done_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.done.notify_all();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        {
            let _g = self.shared.wake_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {

    /// A thread taking the first part of another's share (that thread had
    /// not started) marks the parts moved; taking the last parts of a
    /// share its owner is working through does not.
    #[test]
    fn parts_move_only_when_a_share_was_not_started() {
        let parts = Parts::new(4, 2);
        assert_eq!((parts.take(1), parts.take(0), parts.take(0)), (Some(2), Some(0), Some(1)));
        assert_eq!(parts.take(0), Some(3));
        assert!(!parts.moved(), "the last part of a started share");
        assert_eq!(parts.take(0), None);
        let parts = Parts::new(4, 2);
        assert_eq!((parts.take(0), parts.take(0), parts.take(0)), (Some(0), Some(1), Some(2)));
        assert!(parts.moved(), "thread 1's share taken before it started");
    }

    /// The pool's contention rises with a job whose parts moved and decays
    /// over the jobs after it whose parts did not.
    #[test]
    fn contention_decays_over_quiet_jobs() {
        let pool = ThreadPool::new(1);
        assert!(!pool.contended());
        // One thread, shares of two threads: it takes the second share's first part.
        pool.run_parts(&Parts::new(4, 2), &|_| {});
        assert!(pool.contended());
        for _ in 0..CONTENDED_STEP {
            pool.run_parts(&Parts::new(4, 1), &|_| {});
        }
        assert!(!pool.contended());
    }

    use super::*;

    /// The CPUs this thread may run on.
    #[cfg(target_os = "linux")]
    fn allowed() -> Vec<usize> {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: as in `leave_cpu`: a zeroed set, read by the call at its size.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(libc::sched_getaffinity(0, size, &mut set), 0);
            (0..8 * size).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
        }
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_worker_leaves_a_crowded_cpu_and_keeps_its_affinity() {
        let before = allowed();
        let cpu = current_cpu();
        assert!(before.contains(&cpu), "runs on CPU {cpu}, allowed {before:?}");
        let moved = leave_cpu(cpu);
        assert_eq!(moved, before.len() > 1, "allowed {before:?}");
        if moved {
            assert_ne!(current_cpu(), cpu, "still on CPU {cpu}");
        }
        assert_eq!(allowed(), before, "the affinity is restored");
        assert!(!leave_cpu(usize::MAX), "an unknown CPU is not left");
    }

    #[test]
    fn a_crowded_caller_yields_until_it_has_waited_long() {
        for spins in [1, 64, SPIN - 1, SPIN, 10 * SPIN] {
            assert_eq!(caller_wait(true, false, spins), Wait::Yield, "crowded, {spins} spins");
            assert_eq!(caller_wait(true, true, spins), Wait::Park, "crowded and long, {spins} spins");
            assert_eq!(caller_wait(false, true, spins), Wait::Park, "long, {spins} spins");
        }
        assert_eq!(caller_wait(false, false, 1), Wait::Spin);
        assert_eq!(caller_wait(false, false, SPIN - 1), Wait::Spin);
        assert_eq!(caller_wait(false, false, SPIN), Wait::Park);
    }

    #[test]
    fn every_index_runs_once_per_call() {
        let pool = ThreadPool::new(3);
        for _ in 0..1000 {
            let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn parked_workers_and_a_parked_caller_wake_up() {
        let pool = ThreadPool::new(3);
        for round in 0..20 {
            // Idle long enough for the workers to park.
            std::thread::sleep(std::time::Duration::from_millis(3));
            let hits = AtomicUsize::new(0);
            pool.run(&|i| {
                // A worker slower than the caller's spin: the caller parks.
                if i == 2 && round % 2 == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                hits.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(hits.load(Ordering::Relaxed), 3, "round {round}");
        }
    }

    #[test]
    fn every_part_runs_once_whatever_the_count() {
        let pool = ThreadPool::new(3);
        for n in [0, 1, 2, 3, 5, 7, 31, 64, 97, 1000] {
            for _ in 0..50 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run_parts(&Parts::new(n, pool.threads()), &|p| {
                    hits[p].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{n} parts");
            }
        }
    }

    /// Every task is taken exactly once, whether every thread shows up or one
    /// does all the work; a thread takes its own run first, in order.
    #[test]
    fn the_queue_deals_every_task_once() {
        // Up to 16 threads the shares are held in place, past that on the heap.
        for (n, threads) in
            [(0usize, 1usize), (1, 2), (5, 2), (12, 2), (13, 3), (48, 4), (7, 8), (40, 16), (41, 17), (3, 20)]
        {
            let q = Parts::new(n, threads);
            let got: Vec<usize> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|me| {
                        let q = &q;
                        s.spawn(move || std::iter::from_fn(|| q.take(me)).collect::<Vec<_>>())
                    })
                    .collect();
                handles.into_iter().flat_map(|h| h.join().expect("thread")).collect()
            });
            let mut all = got;
            all.sort_unstable();
            assert_eq!(all, (0..n).collect::<Vec<_>>(), "{n} tasks over {threads} threads");
            // The last thread alone: its run, then the others' from the first.
            let q = Parts::new(n, threads);
            let alone: Vec<usize> = std::iter::from_fn(|| q.take(threads - 1)).collect();
            let own = n * (threads - 1) / threads;
            let want: Vec<usize> = (own..n).chain(0..own).collect();
            assert_eq!(alone, want, "{n} tasks, thread {} of {threads} alone", threads - 1);
        }
    }

    #[test]
    fn a_thread_takes_its_share_first_then_the_others() {
        let parts = Parts::new(10, 3);
        // Shares [0, 3), [3, 6), [6, 10).
        assert_eq!(parts.take(1), Some(3));
        assert_eq!(parts.take(1), Some(4));
        assert_eq!(parts.take(1), Some(5));
        assert_eq!(parts.take(1), Some(6), "its own done, the next share's");
        assert_eq!(parts.take(0), Some(0));
        let rest: Vec<_> = std::iter::from_fn(|| parts.take(2)).collect();
        assert_eq!(rest, vec![7, 8, 9, 1, 2]);
        assert_eq!(parts.take(0), None);
    }

    /// A worker the OS has not run yet (held before it reads the job) does not
    /// hold up the call: the caller takes its parts and returns; the worker,
    /// let go, finds the job closed and calls nothing of it.
    #[test]
    fn a_call_does_not_wait_for_a_worker_that_never_joined() {
        let pool = ThreadPool::new(2);
        pool.shared.hold.store(true, Ordering::Release);
        for _ in 0..20 {
            let by: Vec<AtomicUsize> = (0..40).map(|_| AtomicUsize::new(usize::MAX)).collect();
            let parts = Parts::new(by.len(), pool.threads());
            pool.run_taking(&|me| {
                while let Some(p) = parts.take(me) {
                    by[p].store(me, Ordering::Relaxed);
                }
            });
            assert!(by.iter().all(|b| b.load(Ordering::Relaxed) == 0), "the caller did every part");
        }
        pool.shared.hold.store(false, Ordering::Release);
        // Let go, the worker joins later calls again; each-thread calls still reach it.
        let hits: Vec<AtomicUsize> = (0..2).map(|_| AtomicUsize::new(0)).collect();
        pool.run(&|i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn joining_and_each_thread_calls_interleave() {
        let pool = ThreadPool::new(3);
        for round in 0..300 {
            if round % 7 == 0 {
                std::thread::sleep(std::time::Duration::from_micros(300));
            }
            let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "round {round}");
            let total = AtomicUsize::new(0);
            pool.run_parts(&Parts::new(round % 11, 3), &|_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(total.load(Ordering::Relaxed), round % 11, "round {round}");
        }
    }

    #[test]
    fn concurrent_callers_take_turns() {
        let pool = Arc::new(ThreadPool::new(2));
        let total = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (pool, total) = (pool.clone(), total.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        pool.run(&|_| {
                            total.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().expect("caller"));
        assert_eq!(total.load(Ordering::Relaxed), 4 * 200 * 2);
    }
}
