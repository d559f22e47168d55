//! Realtime reads of views over distributed event tables (API.md section 10, with views read as
//! section 3 reads a realtime view).
//!
//! The coordinator's merged groups are as of the last refresh; the changes not applied yet are
//! on the shards' nodes, in each shard's changelog. A realtime read asks every shard's node (one
//! per-shard call, read only) for the groups its shard's pending changes touch, each as it
//! would be after that shard's next refresh: its stored partial group with the pending changes
//! folded in, computed as a realtime read of a view of that node computes it (the same batch
//! under that node's snapshot, the same type checks, min/max of a group that lost values from
//! the shard's multiset), with the deltas of what adds, its stored extremes and the position of
//! its view (which every apply moves). When every shard's position is the one the view's last
//! refresh recorded, the coordinator's merged groups are the sum of the shards' stored partial
//! groups, and the deltas are added onto them (`ViewSql::merge_onto_stored`). Otherwise, and
//! for the groups whose extremes moved inwards on the answering shards (the replacement may be
//! on another shard), the coordinator reads the other shards' partial groups of those groups
//! and merges them all as a refresh merges partial groups (`ViewSql::merge_across_shards`).
//! Every other group is read from the merged storage, through its indexes.
//!
//! Each shard is read under its own node's snapshot, as any read of a distributed table is. A
//! group a shard's pending changes touch is added onto the coordinator's merged copy only when
//! the positions, read under the coordinator's snapshot with that copy, say that every shard's
//! view is where the copy was merged from; else it is merged from every shard's partial group
//! as each node has it: a refresh committing during the read cannot count a change twice or
//! lose one. (The values of count_distinct and percentile
//! measures of the shards that did not answer a group come from the coordinator's value
//! multisets, per shard: a refresh committing during the read may show there a shard's values
//! one refresh ahead of or behind its counters.) A group no pending change touches is read as the
//! coordinator's snapshot has it, which a refresh committing during the read may have moved on
//! from: that read shows the group as of the refresh before.
//!
//! A shard that arrived on its node since the view's last refresh (a move, a split) has no view
//! there yet: its pending changes are unknown until a refresh makes the view, and a realtime
//! read says so (55000) rather than miss them. For count_distinct and exact percentiles, whose
//! values no partial group carries, each shard also answers every value of the groups it
//! touches (its multiset with the pending values added); the coordinator counts and reads them
//! with its value multisets' rows of the other shards.

use super::{
    array_elements, definition_of, distributed_view, each_shard, internal, json_array,
    mapped_shards, not_supported, require_owner, shard_count, sql_for, view_keeping,
    with_shard_access, DistributedView, Registry, ShardAnswer, ShardPositions, ShardViewCall,
};
use crate::catalog::{self, distributed};
use crate::errors::{EvError, EvResult};
use crate::pg::guc;
use crate::pg::roles;
use crate::pg::spi;
use crate::privileges;
use crate::relation;
use eventview_core::sqlgen::{Reads, ViewSql};
use eventview_core::{envelope_sql, quote};
use pgrx::prelude::*;

/// The user relation `user_view` of the distributed view `merged` generates, made (`create`) or
/// replaced in place, reading the merged groups as stored or realtime. Citus does not make it on the workers.
pub fn install_user_view(
    merged: &ViewSql,
    user_view: &str,
    realtime: bool,
    create: bool,
) -> EvResult<()> {
    let reads = if realtime {
        Reads::RealtimeAcrossShards
    } else {
        Reads::Stored
    };
    guc::with_setting(c"citus.enable_ddl_propagation", c"off", || {
        roles::as_caller(|| {
            if create {
                spi::run_all(&[
                    merged.create_user_view(user_view, reads),
                    ViewSql::read_only_trigger(user_view),
                ])
            } else {
                spi::run_all(&[merged.replace_user_view(user_view, reads)])
            }
        })
    })
}

/// `alter_view` of a view over a distributed event table: `realtime` turns realtime reads on or
/// off (the user relation replaced in place); `on_type_error`, which every shard's view applies,
/// is refused with 0A000.
pub fn alter_view(
    view: &DistributedView,
    realtime: Option<bool>,
    on_type_error: Option<&str>,
) -> EvResult<()> {
    require_owner(view, "alter")?;
    if on_type_error.is_some() {
        return Err(not_supported(
            "on_type_error of a view over an event table distributed by Citus cannot be changed by this version of pg_eventview",
            "Drop the view and make it again with the policy you want.",
        ));
    }
    let Some(realtime) = realtime else {
        return Ok(());
    };
    distributed::lock_view(view.view_id)?;
    let (_, definition) = definition_of(view)?;
    distributed::set_view_realtime(view.view_id, realtime)?;
    let merged = sql_for(&definition, view.view_id, "", None);
    install_user_view(
        &merged,
        &relation::regclass_text(view.relid)?,
        realtime,
        false,
    )
}

/// The groups the shards' pending changes touch in distributed view `view_id`, merged across
/// shards (`ViewSql::merge_across_shards`), as a JSON array's text: what its realtime user
/// relation reads in place of those stored groups. The caller needs SELECT on the view; the
/// view's owner must still read its event table, as for a refresh.
pub fn realtime_groups(view_id: i32) -> EvResult<String> {
    let relid = distributed::view_relid(view_id)?;
    let Some(view) = relid.map(distributed_view).transpose()?.flatten() else {
        return Err(EvError::new(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            format!("no view over a distributed event table has id {view_id}"),
        ));
    };
    require_reader(&view)?;
    privileges::require_owner_reads(view.relid, view.owner, view.source.relid)?;
    let (arguments, definition) = definition_of(&view)?;
    let table_sql = view.source.table_sql()?;
    with_cached_connections(|| merged_across_shards(&view, &arguments, &definition, &table_sql))
}

/// Runs `f`, whose queries reach every shard, with no more connections per worker than Citus
/// keeps open between statements (`citus.max_cached_conns_per_worker`, 1 by default): a
/// connection opened beyond those starts a backend on its worker at every read, which costs more
/// than the small per-shard calls of a read that it would run in parallel.
fn with_cached_connections<T>(f: impl FnOnce() -> EvResult<T>) -> EvResult<T> {
    let cached = spi::one::<String>(
        "SELECT pg_catalog.current_setting('citus.max_cached_conns_per_worker', true)",
        &[],
    )?
    .and_then(|c| c.parse::<i32>().ok())
    .unwrap_or(1)
    .max(1);
    let pool = std::ffi::CString::new(cached.to_string())
        .map_err(|e| internal(format!("a pool size is not a C string: {e}")))?;
    guc::with_setting(c"citus.max_adaptive_executor_pool_size", &pool, f)
}

/// The groups the shards' pending changes touch in `view`, merged across shards (see
/// `realtime_groups`): added onto the coordinator's merged groups when every shard's view is
/// where the last refresh merged it from (`ViewSql::merge_onto_stored`), otherwise, and for the
/// groups whose extremes a retraction moved inwards, merged from every shard's partial groups
/// (`ViewSql::merge_across_shards`).
fn merged_across_shards(
    view: &DistributedView,
    arguments: &str,
    definition: &eventview_core::definition::ViewDefinition,
    table_sql: &str,
) -> EvResult<String> {
    let answers = pending_groups_of_shards(view, arguments, table_sql)?;
    require_every_shard_answered(view, answers.len())?;
    let mut pending = Vec::new();
    let mut values = Vec::new();
    let mut positions = ShardPositions::default();
    for answer in &answers {
        let answer = ShardAnswer::parse(answer)?;
        pending.extend(answer.elements("groups")?);
        values.extend(answer.elements("values")?);
        positions.add(&answer)?;
    }
    if pending.is_empty() {
        return Ok("[]".into());
    }
    let pending = json_array(&pending);
    let values = json_array(&values);
    let positions_answered = positions.answered();
    let merged = sql_for(definition, view.view_id, table_sql, None);
    let onto_stored = spi::one_replanned::<String>(
        &merged.merge_onto_stored(),
        &[
            pending.as_str().into(),
            positions.to_json().as_str().into(),
            values.as_str().into(),
        ],
    )?
    .unwrap_or_else(|| "{}".into());
    let onto_stored = ShardAnswer::parse_from(&onto_stored, "the coordinator's merge")?;
    // Every shard must have answered its position (a node with an older library answers none).
    if positions_answered != answers.len() || !onto_stored.flag("same")? {
        pgrx::debug1!(
            "realtime read of distributed view {}: every touched group merged from the shards' partial groups: the shards' positions are not those recorded with the merged groups",
            view.view_id
        );
        return merged_from_partial_groups(view, &merged, &pending, &values, None);
    }
    let exact = onto_stored.elements("groups")?;
    let Some(inexact) = onto_stored.elements("inexact")? else {
        pgrx::debug1!(
            "realtime read of distributed view {}: the pending changes added onto the merged groups",
            view.view_id
        );
        return Ok(json_array(&exact.into_iter().collect::<Vec<_>>()));
    };
    pgrx::debug1!(
        "realtime read of distributed view {}: the pending changes added onto the merged groups, but for the groups whose extremes moved inwards",
        view.view_id
    );
    let inexact = json_array(&[inexact]);
    let rest = merged_from_partial_groups(view, &merged, &pending, &values, Some(&inexact))?;
    let rest = array_elements(&rest, "the coordinator's merged groups")?;
    Ok(json_array(
        &exact.into_iter().chain(rest).collect::<Vec<_>>(),
    ))
}

/// Every shard's answer to `_shard_pending_groups` for `view` (see `shard_pending_groups`), in
/// this transaction, read only.
pub(super) fn pending_groups_of_shards(
    view: &DistributedView,
    arguments: &str,
    table_sql: &str,
) -> EvResult<Vec<String>> {
    each_shard(
        &view.source,
        &[table_sql, &view.groups],
        Registry::Read,
        |a| {
            format!(
                "eventview._shard_pending_groups({}, {}, {}, {}, {}, {})",
                a.shard,
                a.value,
                a.shards,
                view.view_id,
                quote::literal(arguments),
                a.delta_retention
            )
        },
    )
}

/// The groups `only` lists (a JSON array of key objects; every group `pending` touches when
/// None) merged from the shards' answers `pending` (with their `values`) and the other shards'
/// partial groups of them, read from the distributed table (`ViewSql::merge_across_shards`).
fn merged_from_partial_groups(
    view: &DistributedView,
    merged: &ViewSql,
    pending: &str,
    values: &str,
    only: Option<&str>,
) -> EvResult<String> {
    let (type_name, _) = envelope_sql::distribution_value_of(&view.source.distribute_by)
        .ok_or_else(|| internal("no distribution column".into()))?;
    let stored: Vec<String> = Spi::connect(|client| {
        client
            .select(
                &merged.partial_groups_of(
                    &view.groups,
                    &quote::literal(only.unwrap_or(pending)),
                    &envelope_sql::canonical_text("__shard", type_name),
                ),
                None,
                &[],
            )?
            .map(|row| row.get::<String>(1))
            .collect::<Result<Vec<_>, _>>()
    })?
    .into_iter()
    .flatten()
    .collect();
    let stored: Vec<&str> = stored.iter().map(String::as_str).collect();
    Ok(spi::one_replanned::<String>(
        &merged.merge_across_shards(),
        &[
            pending.into(),
            json_array(&stored).as_str().into(),
            values.into(),
            only.into(),
        ],
    )?
    .unwrap_or_else(|| "[]".into()))
}

/// A realtime read of `view` by a role with SELECT on its user relation (42501 otherwise: the
/// function the relation calls is callable by anyone and answers every column, so a grant of
/// some columns does not do). The role is the one running the query: a realtime distributed
/// view read through another role's view needs the reader's own SELECT on it.
fn require_reader(view: &DistributedView) -> EvResult<()> {
    let allowed = spi::one::<bool>(
        "SELECT pg_catalog.has_table_privilege($1, $2, 'SELECT')",
        &[roles::caller().into(), view.relid.into()],
    )?;
    if allowed == Some(true) {
        return Ok(());
    }
    Err(EvError::new(
        PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
        format!(
            "permission denied for view {}",
            relation::regclass_text(view.relid)?
        ),
    )
    .with_hint("Ask the view's owner to GRANT SELECT on it to you."))
}

/// Every shard of `view`'s event table answered (`answers` of them): a split leaves the shards
/// it made without a registry row until the next refresh, and their pending changes unknown
/// (55000).
fn require_every_shard_answered(view: &DistributedView, answers: usize) -> EvResult<()> {
    if answers as i64 == shard_count(&view.source.shards)? {
        return Ok(());
    }
    Err(needs_refresh(&relation::regclass_text(view.relid)?))
}

/// A realtime read that cannot know some shard's pending changes until the view's next refresh
/// makes that shard's view on its node (55000).
fn needs_refresh(view: &str) -> EvError {
    EvError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("realtime view {view} cannot be read until its next refresh: shards of its event table moved or were split since the last one"),
    )
    .with_hint(format!(
        "Run SELECT eventview.refresh({}); it makes the views of those shards on their new nodes.",
        quote::literal(view)
    ))
}

/// On a shard's node: the groups the pending changes of the shard's view touch, as they would be
/// after its next refresh, and the values of their count_distinct and percentile measures
/// (`ViewSql::pending_partial_groups`), tagged with the registry shard's value:
/// `{"groups": [...], "values": [...]}`. Read only. 55000 when the shard has no view on this node
/// (it arrived since the view's last refresh).
pub fn shard_pending_groups(call: &ShardViewCall) -> EvResult<String> {
    with_shard_access(|| {
        let (_, names) = mapped_shards(call.registry_shard, call.shards)?;
        let Some(groups_shard) = names.get(1) else {
            return Err(super::shard_not_found(call.registry_shard));
        };
        let view = match view_keeping(groups_shard)? {
            Some(relid) => catalog::view_by_relid(relid, false)?,
            None => None,
        };
        let Some(view) = view else {
            return Err(EvError::new(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!(
                    "shard {} of a realtime view's event table arrived on this node since the view's last refresh: its pending changes are unknown until then",
                    call.registry_shard
                ),
            )
            .with_hint("Refresh the view: that makes the shard's view on this node."));
        };
        let (_, width) = catalog::view_reads(view.view_id)?;
        // Parsed once per connection. (Without parameters its plan is made once too, and made
        // again after an invalidation of a table it reads, such as autovacuum's ANALYZE.)
        Ok(spi::one_replanned::<String>(
            &crate::view_objects::sql_of(&view)
                .pending_partial_groups(&quote::literal(call.value), width.as_deref()),
            &[],
        )?
        .unwrap_or_else(|| "{}".into()))
    })
}
