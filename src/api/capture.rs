//! What the capture triggers call besides their changelog insert.

use pgrx::prelude::*;

/// Marks the calling transaction: when it commits, the background worker of this database is
/// woken (see `pg::wakeup`). Returns true, so that a capture statement can call it in a
/// condition. Does nothing without `shared_preload_libraries`.
///
/// Capture functions call it by its C symbol (`wake_worker_on_commit_wrapper`), also while a
/// database's catalog is behind an installed library: every later library keeps the symbol.
#[pg_extern(name = "_wake_worker_on_commit", volatile, parallel_unsafe)]
fn wake_worker_on_commit() -> bool {
    crate::pg::wakeup::wake_worker_on_commit();
    true
}
