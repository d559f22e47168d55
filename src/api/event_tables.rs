//! Event tables: create and drop, the lookups the SQL wrappers use, and pruning of raw events.

use super::{at_boundary, lookup, required};
use crate::errors::EvError;
use pgrx::datum::Interval;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

#[pg_extern(name = "_create_event_table", volatile, parallel_unsafe)]
fn create_event_table(
    name: Option<&str>,
    retention: Option<Interval>,
    delta_retention: Option<Interval>,
) -> Result<pg_sys::Oid, ErrorReport> {
    at_boundary(|| {
        crate::event_tables::create_event_table(
            required(name, "name")?,
            retention,
            Some(required_delta_retention(delta_retention)?),
            None,
        )
    })
}

/// `create_event_table` with a `partition_interval` (API.md section 7).
#[pg_extern(name = "_create_partitioned_event_table", volatile, parallel_unsafe)]
fn create_partitioned_event_table(
    name: Option<&str>,
    retention: Option<Interval>,
    delta_retention: Option<Interval>,
    partition_interval: Option<Interval>,
) -> Result<pg_sys::Oid, ErrorReport> {
    at_boundary(|| {
        let partition_interval = partition_interval.ok_or_else(|| {
            EvError::new(
                PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                "argument \"partition_interval\" must not be NULL",
            )
        })?;
        crate::event_tables::create_event_table(
            required(name, "name")?,
            retention,
            Some(required_delta_retention(delta_retention)?),
            Some(partition_interval),
        )
    })
}

/// `create_event_table` with a `distribute_by` (API.md section 10).
#[pg_extern(name = "_create_distributed_event_table", volatile, parallel_unsafe)]
fn create_distributed_event_table(
    name: Option<&str>,
    retention: Option<Interval>,
    delta_retention: Option<Interval>,
    partition_interval: Option<Interval>,
    distribute_by: Option<&str>,
) -> Result<pg_sys::Oid, ErrorReport> {
    at_boundary(|| {
        crate::citus::create_distributed_event_table(
            required(name, "name")?,
            retention,
            required_delta_retention(delta_retention)?,
            partition_interval,
            required(distribute_by, "distribute_by")?,
        )
    })
}

/// Makes the partitions of event table `p_source_id` ahead of time (see
/// `partitions::make_partitions`); returns how many. Called by run_maintenance, for members of
/// the table's owner role.
#[pg_extern(name = "_make_partitions", volatile, strict, parallel_unsafe)]
fn make_partitions(p_source_id: i32) -> Result<i32, ErrorReport> {
    at_boundary(|| {
        let Some(source) = crate::catalog::all_sources()?
            .into_iter()
            .find(|s| s.source_id == p_source_id)
        else {
            return Ok(0);
        };
        crate::privileges::require_table_owner(source.relid, "make partitions of")?;
        Ok(crate::partitions::make_partitions(&source)? as i32)
    })
}

/// Makes the changelog segment of event table `p_source_id` that keeps one wholly ahead of its
/// records (see `changelog::make_segments`); returns how many it made. Called by
/// `eventview._rotate_changelog`, for members of the table's owner role.
#[pg_extern(name = "_make_changelog_segments", volatile, strict, parallel_unsafe)]
fn make_changelog_segments(p_source_id: i32) -> Result<i32, ErrorReport> {
    at_boundary(|| crate::changelog::make_segments(p_source_id))
}

/// Prunes the applied records of the changelog of event table `p_source_id` by whole segments
/// (see `changelog::prune_segments`); returns how many went. Called by
/// `eventview._rotate_changelog`, for members of the table's owner role.
#[pg_extern(name = "_prune_changelog_segments", volatile, strict, parallel_unsafe)]
fn prune_changelog_segments(
    p_source_id: i32,
    p_delta_retention: Interval,
    p_max_rows: i64,
) -> Result<i64, ErrorReport> {
    at_boundary(|| crate::changelog::prune_segments(p_source_id, p_delta_retention, p_max_rows))
}

/// Keeps the capture of event table `p_source_id` in step with its partition tree after DDL
/// (`partitions::follow_partitions`; called by the event trigger eventview_follow_partitions,
/// not executable by PUBLIC).
#[pg_extern(name = "_follow_partition_tree", volatile, strict, parallel_unsafe)]
fn follow_partition_tree(p_source_id: i32) -> Result<(), ErrorReport> {
    at_boundary(|| {
        for source in crate::catalog::all_sources()? {
            if source.source_id == p_source_id {
                crate::partitions::follow_partitions(&source)?;
            }
        }
        Ok(())
    })
}

/// The keys of `keys` that ingest may insert into the partitioned event table `source`: those
/// not present yet, claimed for the calling transaction (see `envelope_sql::key_function`).
/// The caller needs INSERT on the table, as ingest does.
#[pg_extern(name = "_claim_event_keys", volatile, parallel_unsafe)]
fn claim_event_keys(
    source: pg_sys::Oid,
    keys: Option<Vec<Option<String>>>,
) -> Result<Vec<String>, ErrorReport> {
    at_boundary(|| crate::partitions::claim_keys(source, keys.unwrap_or_default()))
}

/// NULL retention keeps events; the changelog is always pruned at last (default 7 days).
fn required_delta_retention(delta_retention: Option<Interval>) -> Result<Interval, EvError> {
    delta_retention.ok_or_else(|| {
        EvError::new(PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED, "argument \"delta_retention\" must not be NULL")
            .with_hint("Leave it out for the default of 7 days: applied changelog records are always pruned at last.")
    })
}

#[pg_extern(name = "_register_event_table", volatile, parallel_unsafe)]
fn register_event_table(
    name: Option<&str>,
    retention: Option<Interval>,
    delta_retention: Option<Interval>,
) -> Result<pg_sys::Oid, ErrorReport> {
    at_boundary(|| {
        crate::event_tables::register_event_table(
            required(name, "name")?,
            retention,
            Some(required_delta_retention(delta_retention)?),
        )
    })
}

#[pg_extern(name = "_drop_event_table", volatile, parallel_unsafe)]
fn drop_event_table(name: &str, cascade: bool) -> Result<(), ErrorReport> {
    at_boundary(|| {
        crate::citus::or_distributed(
            crate::teardown::drop_event_table(name, cascade),
            || crate::citus::distributed_source_named(name),
            |source| crate::citus::drop_event_table(source, cascade),
        )
    })
}

/// Forgets an event table a plain DROP TABLE took (called by eventview._follow_drop, as the
/// extension owner; not executable by PUBLIC).
#[pg_extern(name = "_forget_source", volatile, strict, parallel_unsafe)]
fn forget_source(p_source_id: i32) -> Result<(), ErrorReport> {
    at_boundary(|| crate::event_tables::forget_source(p_source_id))
}

/// Whether the changelog of event table `p_source_id` can be read now without waiting (taking
/// ACCESS SHARE on it if so; true when it is gone). eventview._pending (as the extension owner;
/// not executable by PUBLIC) leaves `pending_changes` NULL rather than make every reader of
/// eventview.views wait for a session holding the changelog (a VACUUM FULL or LOCK TABLE of it).
#[pg_extern(name = "_changelog_free", stable, strict, parallel_unsafe)]
fn changelog_free(p_source_id: i32) -> Result<bool, ErrorReport> {
    at_boundary(|| {
        let relid =
            crate::relation::extension_relid(&eventview_core::names::changelog_table(p_source_id));
        if relid == pg_sys::InvalidOid {
            return Ok(true);
        }
        crate::pg::locks::lock_for_reading_if_free(relid)
    })
}

/// The event table named `name` (42P01 when missing, 22023 when not an event table), as the
/// fully qualified, quoted name that generated SQL uses.
#[pg_extern(name = "_event_table_sql", stable, parallel_safe)]
pub fn event_table_sql(name: &str) -> Result<String, ErrorReport> {
    lookup(|| crate::catalog::source_by_name(name).map(|s| s.table_sql))
}

/// Whether `_prune_events` may delete from the event table without waiting for a lock (taking
/// the lock when it may; see `pg::locks::lock_for_writing_if_free`). Only for members of the
/// table's owner role, as prune: nobody else may hold locks on it. Callable by anyone (prune
/// runs in its caller's rights), so an API call: the check runs with search_path pinned, against
/// the role that called it.
#[pg_extern(name = "_lock_for_pruning_if_free", volatile, parallel_unsafe)]
fn lock_for_pruning_if_free(source: pg_sys::Oid) -> Result<bool, ErrorReport> {
    at_boundary(|| {
        crate::privileges::require_table_owner(source, "prune")?;
        crate::pg::locks::lock_for_writing_if_free(source)
    })
}

/// prune's hold on an event table while no view of it is being made (`catalog::lock_source_for_prune`).
#[pg_extern(name = "_lock_source_for_prune", volatile, parallel_unsafe)]
fn lock_source_for_prune(p_source_id: i32) -> Result<bool, ErrorReport> {
    at_boundary(|| crate::catalog::lock_source_for_prune(p_source_id))
}

/// prune's deletion of raw events past retention (see `event_tables::prune_events`), as the
/// table's owner, for members of that role only. An API call, as `_lock_for_pruning_if_free`.
#[pg_extern(name = "_prune_events", volatile, parallel_unsafe)]
fn prune_events(
    source: pg_sys::Oid,
    retention: pgrx::datum::Interval,
    max_rows: i64,
) -> Result<i64, ErrorReport> {
    at_boundary(|| crate::event_tables::prune_events(source, retention, max_rows))
}
