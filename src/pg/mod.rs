//! The PostgreSQL layer: SPI helpers, statements prepared once per backend, relation locks,
//! role switches, GUC nest levels, the relation cache, the observer aggregate's state, stored
//! jsonb datums, waking the worker at commit and DDL kept on this node. Every `unsafe` block of
//! the extension is here, each with a `SAFETY:` line; the modules above call safe functions.

pub mod aggregate;
pub mod capture_trigger;
pub mod changelog_append;
pub mod drop_extension;
pub mod group_deltas;
pub mod guc;
pub mod locks;
pub mod node_local;
pub mod partition_removal;
pub mod plan_cache;
pub mod relcache;
pub mod roles;
pub mod set_returning;
pub mod snapshot;
pub mod spi;
pub mod stored_jsonb;
pub mod subtransaction;
pub mod wakeup;

use pgrx::prelude::*;

/// The next transaction id the cluster will give out, as a 64-bit number.
pub fn next_full_transaction_id() -> u64 {
    // SAFETY: reads the shared next transaction id (under its lock); no side effects.
    unsafe { pg_sys::ReadNextFullTransactionId() }.value
}

/// What tells the calls of one statement from those of the next: the start time of the current
/// top-level statement (`statement_timestamp()`) and the backend's number of its transaction
/// (a procedure's COMMIT starts another within the same statement). The statements of one
/// query string share it, as do the calls of one function.
pub fn statement_key() -> (i64, u32) {
    // SAFETY: reads the start time of the current statement and this backend's PGPROC (set for
    // the life of the backend); no side effects.
    unsafe {
        (
            pg_sys::GetCurrentStatementStartTimestamp(),
            (*pg_sys::MyProc).lxid,
        )
    }
}

/// Whether the library is being loaded from `shared_preload_libraries`.
pub fn preloading() -> bool {
    // SAFETY: reads a Postgres global during library load, in the loading process.
    unsafe { pg_sys::process_shared_preload_libraries_in_progress }
}

/// Ends this (background worker) process with `code`.
pub fn exit_process(code: i32) -> ! {
    // SAFETY: ends the process; the caller holds nothing outside a transaction.
    unsafe { pg_sys::proc_exit(code) }
}
