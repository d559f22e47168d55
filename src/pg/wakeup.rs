//! Waking a database's background worker when a transaction that captured changes commits, so
//! that views on a short schedule are refreshed within moments of a commit rather than at the
//! worker's next naptime.
//!
//! Shared memory (with `shared_preload_libraries` only) holds one slot per running worker: its
//! database and its PGPROC number, and whether it wants a wake-up. A capture trigger calls
//! `wake_worker_on_commit`, which marks the transaction; at its commit (after the commit is
//! visible to new snapshots) a transaction callback sets the latch of every worker of its
//! database that wants one, taking the want: a worker is woken once per run it makes (it asks
//! again as each run starts, `want_wake_up`), not once per commit, so a busy producer costs it
//! one context switch per run rather than thousands. An aborted or prepared transaction
//! wakes nobody (the worker's naptime covers a prepared one). Without preloading, there is no
//! worker to wake and the call returns at once.

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Most workers that can be woken: one per database in `eventview.databases`.
pub const MAX_WORKERS: usize = 64;

/// The slots: `(database oid << 32) | (pgprocno + 1)`, 0 for a free slot; and whether the
/// slot's worker wants to be woken by the next commit.
pub struct WorkerSlots {
    slots: [AtomicU64; MAX_WORKERS],
    wants: [AtomicBool; MAX_WORKERS],
}

impl Default for WorkerSlots {
    fn default() -> Self {
        WorkerSlots {
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
            wants: std::array::from_fn(|_| AtomicBool::new(false)),
        }
    }
}

// SAFETY: plain atomics, valid at any address and in every process that maps the segment.
unsafe impl PGRXSharedMemory for WorkerSlots {}

// SAFETY: the name is this extension's own.
static WORKERS: PgAtomic<WorkerSlots> = unsafe { PgAtomic::new(c"pg_eventview worker slots") };

/// Set in the postmaster while the library is preloaded (and inherited by every process it
/// starts): the slots exist.
static SLOTS_EXIST: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This worker's slot, once it has one.
    static MY_SLOT: Cell<Option<usize>> = const { Cell::new(None) };
    /// This transaction captured changes: wake the workers at its commit.
    static WAKE_AT_COMMIT: Cell<bool> = const { Cell::new(false) };
    /// The transaction callback is registered in this backend.
    static CALLBACK_REGISTERED: Cell<bool> = const { Cell::new(false) };
}

/// Requests the slots. Only while shared_preload_libraries is processed.
// pgrx's macro tests the features of every PostgreSQL version it supports; this crate has pg15's.
#[allow(unexpected_cfgs)]
pub fn init_shared_memory() {
    pg_shmem_init!(WORKERS);
    SLOTS_EXIST.store(true, Ordering::Relaxed);
}

fn slot_value(database: pg_sys::Oid, pgprocno: i32) -> u64 {
    (u64::from(database.to_u32()) << 32) | (pgprocno as u64 + 1)
}

/// Takes a slot for this worker process, given back when it exits. Without a free slot the
/// worker still runs every naptime; commits just do not wake it.
pub fn register_this_worker() {
    if !SLOTS_EXIST.load(Ordering::Relaxed) {
        return;
    }
    // SAFETY: MyProc is this process's PGPROC, set once it is attached to shared memory (the
    // worker is connected to its database); MyDatabaseId is set by then too.
    let (database, pgprocno) = unsafe { (pg_sys::MyDatabaseId, (*pg_sys::MyProc).pgprocno) };
    let mine = slot_value(database, pgprocno);
    for (index, slot) in WORKERS.get().slots.iter().enumerate() {
        if slot
            .compare_exchange(0, mine, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            MY_SLOT.set(Some(index));
            WORKERS.get().wants[index].store(true, Ordering::Release);
            // SAFETY: registers a plain callback with a by-value argument, run at process exit.
            unsafe {
                pg_sys::before_shmem_exit(Some(release_slot), pg_sys::Datum::from(index));
            }
            return;
        }
    }
    warning!(
        "pg_eventview worker: more than {MAX_WORKERS} workers; commits do not wake this one, it runs every eventview.naptime"
    );
}

#[pg_guard]
unsafe extern "C-unwind" fn release_slot(_code: i32, index: pg_sys::Datum) {
    WORKERS.get().wants[index.value()].store(false, Ordering::Release);
    WORKERS.get().slots[index.value()].store(0, Ordering::Release);
}

/// This worker wants (or not) to be woken by the next commit that captured changes. Called as
/// each run starts (before its snapshot, so that no commit after it goes unnoticed: the
/// snapshot and a commit's end both take ProcArrayLock, so a commit the snapshot misses ends
/// after this store and its callback reads the want), and with false while the worker is
/// switched off.
pub fn want_wake_up(want: bool) {
    if let Some(index) = MY_SLOT.get() {
        WORKERS.get().wants[index].store(want, Ordering::Release);
    }
}

/// Marks the current transaction: at its commit, the workers of this database are woken.
pub fn wake_worker_on_commit() {
    if !SLOTS_EXIST.load(Ordering::Relaxed) || WAKE_AT_COMMIT.get() {
        return;
    }
    if !CALLBACK_REGISTERED.get() {
        // SAFETY: registers a plain callback for the life of the backend, once.
        unsafe { pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut()) };
        CALLBACK_REGISTERED.set(true);
    }
    WAKE_AT_COMMIT.set(true);
}

#[pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::XactEvent::*;
    let committed = matches!(event, XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT);
    let ended = committed
        || matches!(
            event,
            XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT | XACT_EVENT_PREPARE
        );
    if ended && WAKE_AT_COMMIT.replace(false) && committed {
        wake_workers();
    }
}

/// Sets the latch of every worker of this database that wants a wake-up, taking the want.
fn wake_workers() {
    // SAFETY: MyDatabaseId is set in a backend connected to a database.
    let database = unsafe { pg_sys::MyDatabaseId }.to_u32();
    let workers = WORKERS.get();
    for (slot, wants) in workers.slots.iter().zip(workers.wants.iter()) {
        let value = slot.load(Ordering::Acquire);
        if value != 0
            && (value >> 32) as u32 == database
            && wants.load(Ordering::Relaxed)
            && wants.swap(false, Ordering::AcqRel)
        {
            let pgprocno = ((value & 0xffff_ffff) - 1) as i32;
            // SAFETY: pgprocno is a valid PGPROC number (a worker's, or, had it exited since,
            // of whatever process uses that PGPROC now: a spurious latch wake-up is harmless).
            unsafe { pg_sys::ProcSendSignal(pgprocno) };
        }
    }
}
