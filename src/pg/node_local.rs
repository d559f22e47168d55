//! DDL kept on this node. On a Citus coordinator, Citus propagates some DDL to every worker on
//! its own: CREATE FUNCTION (marking the function a distributed object), and ALTER, GRANT and
//! DROP of functions so marked. The extension's run-time objects are each node's own: a
//! coordinator's event table and the shards a worker holds number their event tables in their
//! own catalogs, so a capture function made on the coordinator would replace (and, dropped,
//! drop) the capture of a shard on a worker with the same number. The library makes, replaces
//! and drops capture functions with that propagation off, so none is a distributed object;
//! ALTER FUNCTION of a function that is not one (as `eventview._move_capture` runs) stays on
//! its node too.

use crate::errors::EvResult;
use crate::pg::{guc, spi};

/// Whether the Citus extension is installed in this database.
pub fn citus_installed() -> EvResult<bool> {
    Ok(spi::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')",
        &[],
    )?
    .unwrap_or(false))
}

/// Runs `f` with Citus's DDL propagation off where Citus is installed.
pub fn on_this_node_only<T>(f: impl FnOnce() -> EvResult<T>) -> EvResult<T> {
    if citus_installed()? {
        guc::with_setting(c"citus.enable_ddl_propagation", c"off", f)
    } else {
        f()
    }
}

/// Runs `statements` in order on this node only (see `on_this_node_only`).
pub fn run_all(statements: &[String]) -> EvResult<()> {
    on_this_node_only(|| spi::run_all(statements))
}
