//! Event tables distributed by Citus (see `citus`): the work the coordinator runs on the node of
//! each shard (not API calls: the coordinator's queries over a table's shard registry call them
//! on every shard's node, as the extension owner; EXECUTE is revoked from PUBLIC in
//! sql/api.sql), and what scheduling and maintenance call on the coordinator.

use super::at_boundary;
use pgrx::datum::Interval;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

/// Registers the event table shard co-located with `registry_shard` as an event table of this
/// node.
#[pg_extern(name = "_attach_shard_capture", volatile, strict, parallel_unsafe)]
fn attach_shard_capture(
    registry_shard: &str,
    shards: pgrx::Json,
    delta_retention: Interval,
) -> Result<i32, ErrorReport> {
    at_boundary(|| {
        crate::citus::attach_shard_capture(registry_shard, &shards.0.to_string(), delta_retention)
    })
}

/// Makes the view of distributed view `view_id` over the event table shard co-located with
/// `registry_shard`, its groups kept in the co-located groups shard; returns the values of its
/// count_distinct and percentile measures.
#[pg_extern(name = "_attach_shard_view", volatile, strict, parallel_unsafe)]
fn attach_shard_view(
    registry_shard: &str,
    value: &str,
    shards: pgrx::Json,
    view_id: i32,
    arguments: &str,
    delta_retention: Interval,
) -> Result<String, ErrorReport> {
    on_shard_view(
        crate::citus::attach_shard_view,
        registry_shard,
        value,
        shards,
        view_id,
        arguments,
        delta_retention,
    )
}

/// Refreshes the view keeping the groups shard co-located with `registry_shard` (made first,
/// when the shard arrived on this node since).
#[pg_extern(name = "_refresh_shard_view", volatile, strict, parallel_unsafe)]
fn refresh_shard_view(
    registry_shard: &str,
    value: &str,
    shards: pgrx::Json,
    view_id: i32,
    arguments: &str,
    delta_retention: Interval,
) -> Result<String, ErrorReport> {
    on_shard_view(
        crate::citus::refresh_shard_view,
        registry_shard,
        value,
        shards,
        view_id,
        arguments,
        delta_retention,
    )
}

/// `work` on the view of a shard its arguments name (see `citus::ShardViewCall`).
fn on_shard_view(
    work: fn(&crate::citus::ShardViewCall) -> crate::errors::EvResult<String>,
    registry_shard: &str,
    value: &str,
    shards: pgrx::Json,
    view_id: i32,
    arguments: &str,
    delta_retention: Interval,
) -> Result<String, ErrorReport> {
    let shards = shards.0.to_string();
    at_boundary(|| {
        work(&crate::citus::ShardViewCall {
            registry_shard,
            value,
            shards: &shards,
            view_id,
            arguments,
            delta_retention,
        })
    })
}

/// The groups the pending changes of the view keeping the groups shard co-located with
/// `registry_shard` touch, as they would be after its next refresh (see
/// `citus::shard_pending_groups`).
#[pg_extern(name = "_shard_pending_groups", volatile, strict, parallel_unsafe)]
fn shard_pending_groups(
    registry_shard: &str,
    value: &str,
    shards: pgrx::Json,
    view_id: i32,
    arguments: &str,
    delta_retention: Interval,
) -> Result<String, ErrorReport> {
    on_shard_view(
        crate::citus::shard_pending_groups,
        registry_shard,
        value,
        shards,
        view_id,
        arguments,
        delta_retention,
    )
}

/// The groups the shards' pending changes touch in view `view_id` over a distributed event
/// table, merged across shards (a JSON array's text): what its realtime user relation reads in place of those
/// stored groups (see `citus::realtime_groups`). Callable by anyone with SELECT on the view.
#[pg_extern(name = "_distributed_realtime", volatile, strict, parallel_unsafe)]
fn distributed_realtime(view_id: i32) -> Result<String, ErrorReport> {
    at_boundary(|| crate::citus::realtime_groups(view_id))
}

/// What the coordinator lacks of the quarantine entries of the view keeping the groups shard
/// co-located with `registry_shard` (tagged with `value`), given what it has copied (see
/// `citus::shard_entries`).
#[pg_extern(name = "_shard_quarantine", volatile, strict, parallel_unsafe)]
fn shard_quarantine(
    registry_shard: &str,
    value: &str,
    shards: pgrx::Json,
    copied: pgrx::Json,
) -> Result<String, ErrorReport> {
    at_boundary(|| {
        crate::citus::shard_entries(
            registry_shard,
            value,
            &shards.0.to_string(),
            &copied.0.to_string(),
        )
    })
}

/// Drops the view keeping the groups shard co-located with `registry_shard`.
#[pg_extern(name = "_detach_shard_view", volatile, strict, parallel_unsafe)]
fn detach_shard_view(registry_shard: &str, shards: pgrx::Json) -> Result<i32, ErrorReport> {
    at_boundary(|| crate::citus::detach_shard_view(registry_shard, &shards.0.to_string()))
}

/// Moves the field observer of the event table shard co-located with `registry_shard` on, and
/// prunes its changelog; returns the records pruned and the drift rows there that no
/// coordinator has taken yet (JSON).
#[pg_extern(name = "_maintain_shard", volatile, strict, parallel_unsafe)]
fn maintain_shard(
    registry_shard: &str,
    shards: pgrx::Json,
    delta_retention: Interval,
) -> Result<String, ErrorReport> {
    at_boundary(|| {
        crate::citus::maintain_shard(registry_shard, &shards.0.to_string(), delta_retention)
    })
}

/// `run_maintenance` on the coordinator: every shard of distributed event table `relid` observed
/// and pruned (see `citus::maintain_shards`).
#[pg_extern(name = "_maintain_distributed", volatile, strict, parallel_unsafe)]
fn maintain_distributed(relid: pg_sys::Oid) -> Result<i64, ErrorReport> {
    at_boundary(|| crate::citus::maintain_shards(relid))
}

/// The id of the view over a distributed event table named `name`; NULL for any other name.
#[pg_extern(name = "_distributed_view_id", stable, parallel_safe)]
fn distributed_view_id(name: &str) -> Result<Option<i32>, ErrorReport> {
    at_boundary(|| Ok(crate::citus::distributed_view_named(name)?.map(|v| v.view_id)))
}

/// Forgets a view over a distributed event table, or a distributed event table, whose relation
/// a DROP took (called by `eventview._follow_drop`, as the extension owner; nobody else).
#[pg_extern(name = "_forget_distributed", volatile, strict, parallel_unsafe)]
fn forget_distributed(relid: pg_sys::Oid) -> Result<(), ErrorReport> {
    crate::api::lookup(|| crate::citus::forget_dropped(relid))
}

/// `eventview.views`' figures of the view over a distributed event table `view_id` (JSON).
#[pg_extern(name = "_distributed_view_stats", volatile, strict, parallel_unsafe)]
fn distributed_view_stats(view_id: i32) -> Result<pgrx::Json, ErrorReport> {
    at_boundary(|| json(crate::citus::view_stats(view_id)?))
}

/// On a shard's node: `eventview.views`' figures of the view keeping the groups shard
/// co-located with `registry_shard`.
#[pg_extern(name = "_shard_view_stats", volatile, strict, parallel_unsafe)]
fn shard_view_stats(registry_shard: &str, shards: pgrx::Json) -> Result<String, ErrorReport> {
    at_boundary(|| crate::citus::shard_view_stats(registry_shard, &shards.0.to_string()))
}

/// `eventview.observed_fields` of distributed event table `relid`: every shard's rows (JSON).
#[pg_extern(name = "_distributed_observed", volatile, strict, parallel_unsafe)]
fn distributed_observed(relid: pg_sys::Oid) -> Result<pgrx::Json, ErrorReport> {
    at_boundary(|| json(crate::citus::observed(relid)?))
}

/// On a shard's node: the observed paths of the event table shard co-located with
/// `registry_shard`.
#[pg_extern(name = "_shard_observed", volatile, strict, parallel_unsafe)]
fn shard_observed(registry_shard: &str, shards: pgrx::Json) -> Result<String, ErrorReport> {
    at_boundary(|| crate::citus::shard_observed(registry_shard, &shards.0.to_string()))
}

fn json(text: String) -> crate::errors::EvResult<pgrx::Json> {
    serde_json::from_str(&text)
        .map(pgrx::Json)
        .map_err(|e| crate::errors::EvError::invalid(format!("not JSON: {e}")))
}
