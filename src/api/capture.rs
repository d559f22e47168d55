//! What the capture triggers call besides their changelog insert.

use pgrx::prelude::*;

/// Marks the calling transaction: when it commits, the background worker of this database is
/// woken (see `pg::wakeup`). Returns true, so that a capture statement can call it in a
/// condition. Does nothing without `shared_preload_libraries`.
#[pg_extern(name = "_wake_worker_on_commit", volatile, parallel_unsafe)]
fn wake_worker_on_commit() -> bool {
    crate::pg::wakeup::wake_worker_on_commit();
    true
}
