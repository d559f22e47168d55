//! The statements on the catalog of event tables distributed by Citus and their views
//! (`eventview._distributed_sources`, `_distributed_views`, `_distributed_quarantine`, and the
//! coordinator's drift and quarantine rows of those tables), and those a shard's node runs on
//! its own catalog for the coordinator (`src/citus.rs`).

use crate::errors::EvResult;
use crate::pg::spi;
use pgrx::datum::Interval;
use pgrx::prelude::*;
use std::collections::BTreeMap;

/// A distributed event table's catalog row: (shard registry, distribution column, delta
/// retention as interval text).
pub fn source_row(relid: pg_sys::Oid) -> EvResult<Option<(String, String, String)>> {
    let row = Spi::connect(|client| {
        let rows = client.select(
            "SELECT shards::text, distribute_by, delta_retention::text
             FROM eventview._distributed_sources WHERE relid = $1::regclass",
            Some(1),
            &[relid.into()],
        )?;
        if rows.is_empty() {
            return Ok::<_, pgrx::spi::SpiError>(None);
        }
        let t = rows.first();
        Ok(Some((
            t.get::<String>(1)?,
            t.get::<String>(2)?,
            t.get::<String>(3)?,
        )))
    })?;
    Ok(match row {
        Some((Some(shards), Some(column), Some(retention))) => Some((shards, column, retention)),
        _ => None,
    })
}

/// Catalogues distributed event table `relid`, distributed by `column`, with shard registry
/// `shards` (delta retention `'7 days'` when None).
pub fn insert_source(
    relid: pg_sys::Oid,
    column: &str,
    shards: &str,
    delta_retention: Option<Interval>,
) -> EvResult<()> {
    spi::run(
        "INSERT INTO eventview._distributed_sources (relid, distribute_by, shards, delta_retention)
         VALUES ($1::regclass, $2, $3::regclass, coalesce($4, '7 days'))",
        &[
            relid.into(),
            column.into(),
            shards.into(),
            delta_retention.into(),
        ],
    )
}

/// The row locks on a distributed event table's catalog row.
#[derive(Clone, Copy)]
pub enum SourceLock {
    /// A view over it is being made (`FOR KEY SHARE`): waits for a drop.
    MakesView,
    /// A call runs on its shards (`FOR NO KEY UPDATE`): one at a time.
    RunsOnShards,
    /// It is being dropped (`FOR UPDATE`): waits for everything else.
    Drops,
}

/// Takes `lock` on distributed event table `relid`'s catalog row; whether it is there (a drop
/// that committed meanwhile took it).
pub fn lock_source(relid: pg_sys::Oid, lock: SourceLock) -> EvResult<bool> {
    let clause = match lock {
        SourceLock::MakesView => "FOR KEY SHARE",
        SourceLock::RunsOnShards => "FOR NO KEY UPDATE",
        SourceLock::Drops => "FOR UPDATE",
    };
    Ok(spi::one::<bool>(
        &format!(
            "SELECT true FROM eventview._distributed_sources WHERE relid = $1::regclass {clause}"
        ),
        &[relid.into()],
    )?
    .unwrap_or(false))
}

/// Forgets distributed event table `relid`: its catalog row and the coordinator's drift of it.
pub fn delete_source(relid: pg_sys::Oid) -> EvResult<()> {
    spi::run(
        "DELETE FROM eventview._distributed_sources WHERE relid = $1::regclass",
        &[relid.into()],
    )?;
    spi::run(
        "DELETE FROM eventview.drift WHERE source = $1::regclass",
        &[relid.into()],
    )
}

/// A distributed view's catalog row, by its user relation: (view id, event table, partial
/// groups, owner).
pub fn view_row(relid: pg_sys::Oid) -> EvResult<Option<(i32, pg_sys::Oid, String, pg_sys::Oid)>> {
    let row = Spi::connect(|client| {
        let rows = client.select(
            "SELECT view_id, source::oid, groups::text, owner::oid
             FROM eventview._distributed_views WHERE relid = $1::regclass",
            Some(1),
            &[relid.into()],
        )?;
        if rows.is_empty() {
            return Ok::<_, pgrx::spi::SpiError>(None);
        }
        let t = rows.first();
        Ok(Some((
            t.get::<i32>(1)?,
            t.get::<pg_sys::Oid>(2)?,
            t.get::<String>(3)?,
            t.get::<pg_sys::Oid>(4)?,
        )))
    })?;
    Ok(match row {
        Some((Some(view_id), Some(source), Some(groups), Some(owner))) => {
            Some((view_id, source, groups, owner))
        }
        _ => None,
    })
}

/// A distributed view to catalogue: `create_view`'s arguments as every shard's node parses them.
pub struct NewView<'a> {
    pub view_id: i32,
    pub relid: pg_sys::Oid,
    pub source: pg_sys::Oid,
    pub groups: &'a str,
    pub group_by: &'a str,
    pub measures: &'a str,
    pub event_types: Option<Vec<String>>,
    pub time_bucket: Option<Interval>,
    pub filter: Option<&'a str>,
    pub on_type_error: &'a str,
    pub time_zone: Option<&'a str>,
    pub unnest: Option<&'a str>,
    pub owner: pg_sys::Oid,
    pub realtime: bool,
}

/// Catalogues distributed view `v`; returns its arguments as `_distributed_views` keeps them.
pub fn insert_view(v: NewView) -> EvResult<String> {
    Ok(spi::one::<String>(
        "INSERT INTO eventview._distributed_views (view_id, relid, source, groups, arguments, owner, realtime)
         VALUES ($1, $2::regclass, $3::regclass, $4::regclass,
                 json_build_object('group_by', $5::json, 'measures', $6::json, 'event_types', $7::text[],
                                   'time_bucket', $8::interval, 'filter', $9::json,
                                   'on_type_error', $10::text, 'time_zone', $11::text, 'unnest', $12::text),
                 $13::oid::regrole, $14)
         RETURNING arguments::text",
        &[
            v.view_id.into(),
            v.relid.into(),
            v.source.into(),
            v.groups.into(),
            v.group_by.into(),
            v.measures.into(),
            v.event_types.into(),
            v.time_bucket.into(),
            v.filter.into(),
            v.on_type_error.into(),
            v.time_zone.into(),
            v.unnest.into(),
            v.owner.into(),
            v.realtime.into(),
        ],
    )?
    .unwrap_or_default())
}

/// Whether distributed view `view_id` is read realtime.
pub fn view_realtime(view_id: i32) -> EvResult<bool> {
    Ok(spi::one::<bool>(
        "SELECT realtime FROM eventview._distributed_views WHERE view_id = $1",
        &[view_id.into()],
    )? == Some(true))
}

/// Sets whether distributed view `view_id` is read realtime (`eventview.views.realtime`).
pub fn set_view_realtime(view_id: i32, realtime: bool) -> EvResult<()> {
    spi::run(
        "UPDATE eventview._distributed_views SET realtime = $2 WHERE view_id = $1",
        &[view_id.into(), realtime.into()],
    )
}

/// The arguments distributed view `view_id` was made with, as `_distributed_views` keeps them.
pub fn view_arguments(view_id: i32) -> EvResult<Option<String>> {
    spi::one::<String>(
        "SELECT arguments::text FROM eventview._distributed_views WHERE view_id = $1",
        &[view_id.into()],
    )
}

/// The user relation of distributed view `view_id`, if it is catalogued.
/// Whether distributed table `relid` has a shard placed on node `host`:`port`.
pub fn placed_on(relid: pg_sys::Oid, host: &str, port: i32) -> EvResult<bool> {
    Ok(spi::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_shard s
                        JOIN pg_catalog.pg_dist_placement p ON p.shardid = s.shardid
                        JOIN pg_catalog.pg_dist_node n ON n.groupid = p.groupid
                        WHERE s.logicalrelid = $1::regclass AND n.nodename = $2 AND n.nodeport = $3)",
        &[relid.into(), host.into(), port.into()],
    )?
    .unwrap_or(false))
}

pub fn view_relid(view_id: i32) -> EvResult<Option<pg_sys::Oid>> {
    spi::one::<pg_sys::Oid>(
        "SELECT relid::oid FROM eventview._distributed_views WHERE view_id = $1",
        &[view_id.into()],
    )
}

/// The user relations of the views over distributed event table `relid`, oldest first.
pub fn views_of(relid: pg_sys::Oid) -> EvResult<Vec<pg_sys::Oid>> {
    Ok(Spi::connect(|client| {
        client
            .select(
                "SELECT relid::oid FROM eventview._distributed_views WHERE source = $1::regclass
                 ORDER BY view_id",
                None,
                &[relid.into()],
            )?
            .map(|row| row.get::<pg_sys::Oid>(1))
            .collect::<Result<Vec<_>, _>>()
    })?
    .into_iter()
    .flatten()
    .collect())
}

/// Locks distributed view `view_id`'s catalog row: one refresh or rebuild of it at a time.
pub fn lock_view(view_id: i32) -> EvResult<()> {
    spi::run(
        "SELECT 1 FROM eventview._distributed_views WHERE view_id = $1 FOR UPDATE",
        &[view_id.into()],
    )
}

/// Records a refresh of distributed view `view_id` that succeeded, with the position of every
/// shard's view it merged the groups from (`positions`, a JSON object: shard to position; None
/// when some shard did not answer its position), which realtime reads compare with the shards'
/// (`ViewSql::merge_onto_stored`).
pub fn record_refresh(view_id: i32, positions: Option<&str>) -> EvResult<()> {
    spi::run(
        "UPDATE eventview._distributed_views
         SET last_refresh_at = clock_timestamp(), last_error = NULL, shard_positions = $2::json
         WHERE view_id = $1",
        &[view_id.into(), positions.into()],
    )
}

/// Records the position of every shard's view of distributed view `view_id` (`positions`, as
/// `record_refresh` takes them) without a refresh: those of the views as `create_view` made
/// them.
pub fn record_positions(view_id: i32, positions: &str) -> EvResult<()> {
    spi::run(
        "UPDATE eventview._distributed_views SET shard_positions = $2::json WHERE view_id = $1",
        &[view_id.into(), positions.into()],
    )
}

/// Forgets distributed view `view_id`: its coordinator's quarantine entries and its catalog
/// row. Whether it was catalogued.
pub fn delete_view(view_id: i32) -> EvResult<bool> {
    forget_quarantine_copies(view_id, None)?;
    Ok(spi::one::<bool>(
        "WITH gone AS (DELETE FROM eventview._distributed_views WHERE view_id = $1 RETURNING 1)
         SELECT EXISTS (SELECT 1 FROM gone)",
        &[view_id.into()],
    )? == Some(true))
}

/// Whether distributed view `view_id` is catalogued.
pub fn view_exists(view_id: i32) -> EvResult<bool> {
    Ok(spi::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM eventview._distributed_views WHERE view_id = $1)",
        &[view_id.into()],
    )? == Some(true))
}

/// On the coordinator: the drift the shards of distributed event table `relid` recorded (`rows`,
/// a JSON array as `take_shard_drift` lists them), each change once in `eventview.drift` (a change
/// every shard's observer saw, as a path appearing, once, at the first detection; one already
/// there is not added again).
pub fn merge_drift(relid: pg_sys::Oid, rows: &str) -> EvResult<()> {
    spi::run(
        "INSERT INTO eventview.drift (source, event_type, event_version, path, change, old_type, new_type, detected_at)
         SELECT $1::regclass, d.event_type, d.event_version, d.path, d.change, d.old_type, d.new_type, min(d.detected_at)
         FROM pg_catalog.json_to_recordset($2::json)
              AS d(event_type text, event_version integer, path text, change text, old_type text,
                   new_type text, detected_at timestamptz)
         WHERE NOT EXISTS (SELECT 1 FROM eventview.drift x
                           WHERE x.source = $1::regclass AND x.event_type = d.event_type
                             AND x.event_version = d.event_version AND x.path = d.path
                             AND x.change = d.change
                             AND x.old_type IS NOT DISTINCT FROM d.old_type
                             AND x.new_type IS NOT DISTINCT FROM d.new_type)
         GROUP BY d.event_type, d.event_version, d.path, d.change, d.old_type, d.new_type
         ORDER BY min(d.detected_at)",
        &[relid.into(), rows.into()],
    )
}

/// On a shard's node: the drift rows of event table shard `relid` that no coordinator has taken
/// yet, taken: a JSON array of rows of `eventview.drift` (without `id` and `source`), and the
/// table's `drift_taken` moved to the largest id among them, in this transaction (a
/// coordinator's transaction that fails takes nothing). Each row is answered once, whichever
/// call observed it (a refresh, maintenance, or a call on this node alone): the rows of a table
/// get their ids in the order its observers run, one at a time, each holding the table's
/// `_sources` row (`observer::observe`), so a row not committed yet has a larger id than any
/// taken. The take holds that row too, and takes nothing while another session on this node
/// holds it (an observer running there: the next call takes what is left) instead of waiting
/// for it. A mark above the ids given out (the identity restarted by hand) counts as 0.
pub fn take_shard_drift(relid: pg_sys::Oid) -> EvResult<String> {
    Ok(spi::one::<String>(
        "WITH mark AS MATERIALIZED (
             SELECT CASE WHEN (SELECT NOT q.is_called OR s.drift_taken > q.last_value
                               FROM eventview.drift_id_seq q)
                         THEN 0 ELSE s.drift_taken END AS drift_taken
             FROM eventview._sources s
             WHERE s.relid = $1::regclass FOR NO KEY UPDATE OF s SKIP LOCKED
         ),
         new AS MATERIALIZED (
             SELECT d.id, d.event_type, d.event_version, d.path, d.change, d.old_type, d.new_type, d.detected_at
             FROM eventview.drift d
             WHERE d.source = $1::regclass AND d.id > (SELECT drift_taken FROM mark)
         ),
         taken AS (
             UPDATE eventview._sources s SET drift_taken = (SELECT max(id) FROM new)
             WHERE s.relid = $1::regclass AND EXISTS (SELECT 1 FROM new)
         )
         SELECT coalesce(pg_catalog.json_agg(d), '[]')::text
         FROM (SELECT event_type, event_version, path, change, old_type, new_type, detected_at
               FROM new ORDER BY id) d",
        &[relid.into()],
    )?
    .unwrap_or_else(|| "[]".into()))
}

/// On a shard's node: the observed paths of event table `source_id`, as a JSON array of rows of
/// `eventview._observed`.
pub fn shard_observed(source_id: i32) -> EvResult<String> {
    Ok(spi::one::<String>(
        "SELECT coalesce(pg_catalog.json_agg(o), '[]')::text
         FROM (SELECT event_type, event_version, path, json_type, first_seen, last_seen, seen
               FROM eventview._observed WHERE source_id = $1) o",
        &[source_id.into()],
    )?
    .unwrap_or_else(|| "[]".into()))
}

/// On a shard's node: the user relation of the view of this node whose storage is
/// `data_relation` (a shard of a distributed view's partial groups), if there is one.
pub fn view_keeping(data_relation: &str) -> EvResult<Option<pg_sys::Oid>> {
    spi::one::<pg_sys::Oid>(
        "SELECT relid::oid FROM eventview._views WHERE data_relation = $1::regclass",
        &[data_relation.into()],
    )
}

/// On a shard's node: `eventview.views`' figures of the view of this node whose storage is
/// `data_relation`, as a JSON object (`{"pending_changes": null}` when there is none).
pub fn shard_view_figures(data_relation: &str) -> EvResult<String> {
    // (As eventview.views figures them, for this one view.)
    Ok(spi::one::<String>(
        "SELECT coalesce((SELECT pg_catalog.json_build_object(
                              'pending_changes', p.changes,
                              'lag', CASE WHEN p.changes IS NULL THEN NULL
                                          WHEN p.oldest IS NULL THEN interval '0'
                                          ELSE greatest(now() - p.oldest, interval '0') END,
                              'quarantined', eventview._quarantined(w.view_id),
                              'skipped', w.skipped)
                          FROM eventview._views w
                          CROSS JOIN LATERAL eventview._pending(w.view_id) p
                          WHERE w.data_relation = $1::regclass),
                         '{\"pending_changes\": null}')::text",
        &[data_relation.into()],
    )?
    .unwrap_or_else(|| "{}".into()))
}

/// The quarantine entries of this node's view `relid`, as the quarantine holds them.
const ENTRIES_OF_VIEW: &str = "FROM eventview.quarantine q
     WHERE q.view_name = (SELECT known_name FROM eventview._views WHERE relid = $1::regclass)";

/// On a shard's node: the mark of the quarantine entries of this node's view `relid`,
/// `<count>:<largest id>`.
pub fn quarantine_mark(relid: pg_sys::Oid) -> EvResult<Option<String>> {
    spi::one::<String>(
        &format!("SELECT count(*)::text || ':' || coalesce(max(q.id), 0)::text {ENTRIES_OF_VIEW}"),
        &[relid.into()],
    )
}

/// On a shard's node: the quarantine entries of this node's view `relid` (tagged `shard`) that
/// a coordinator holding `copies` copies up to id `above` lacks, as a JSON object: `{"shard":
/// <shard>, "entries": [<the entries above that id>], "present": [<the ids at or below it>], or
/// null when as many as the copies are there}`. Each entry is `{"shard", "shard_entry": <id>,
/// "event_id", "reason", "event", "quarantined_at"}`.
pub fn quarantine_changes(
    relid: pg_sys::Oid,
    shard: &str,
    above: i64,
    copies: i64,
) -> EvResult<String> {
    Ok(spi::one::<String>(
        &format!(
            "SELECT pg_catalog.json_build_object(
                 'shard', $2::text,
                 'entries', (SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_object(
                                 'shard', $2::text, 'shard_entry', q.id, 'event_id', q.event_id,
                                 'reason', q.reason, 'event', q.event, 'quarantined_at', q.quarantined_at)
                                 ORDER BY q.id), '[]')
                             {ENTRIES_OF_VIEW} AND q.id > $3),
                 'present', (SELECT CASE WHEN count(*) = $4 THEN NULL
                                         ELSE coalesce(pg_catalog.json_agg(q.id ORDER BY q.id), '[]') END
                             {ENTRIES_OF_VIEW} AND q.id <= $3))::text"
        ),
        &[relid.into(), shard.into(), above.into(), copies.into()],
    )?
    .unwrap_or_else(|| "{}".into()))
}

/// The copies of one shard's quarantine entries of a distributed view, on the coordinator.
pub struct CopiedEntries {
    /// Their mark, as `quarantine_mark` gives the shard's.
    pub mark: String,
    /// The largest id on the shard's node among them.
    pub above: i64,
    /// How many there are.
    pub copies: i64,
    /// Whether some were deleted from the quarantine by hand (their catalog rows stay).
    pub lost: bool,
}

/// On the coordinator: the copies of each shard's quarantine entries of distributed view
/// `view_id`, by shard, in one pass over their catalog rows.
pub fn quarantine_copies(view_id: i32) -> EvResult<BTreeMap<String, CopiedEntries>> {
    Ok(Spi::connect(|client| {
        client
            .select(
                "SELECT m.shard, count(q.id),
                        coalesce(max(m.shard_entry) FILTER (WHERE q.id IS NOT NULL), 0),
                        count(*) > count(q.id)
                 FROM eventview._distributed_quarantine m
                 LEFT JOIN eventview.quarantine q ON q.id = m.id
                 WHERE m.view_id = $1 GROUP BY m.shard",
                None,
                &[view_id.into()],
            )?
            .map(|row| {
                Ok::<_, pgrx::spi::SpiError>((
                    row.get::<String>(1)?,
                    row.get::<i64>(2)?,
                    row.get::<i64>(3)?,
                    row.get::<bool>(4)?,
                ))
            })
            .collect::<Result<Vec<_>, _>>()
    })?
    .into_iter()
    .filter_map(|(shard, copies, above, lost)| {
        let (copies, above) = (copies?, above?);
        Some((
            shard?,
            CopiedEntries {
                mark: format!("{copies}:{above}"),
                above,
                copies,
                lost: lost.unwrap_or(false),
            },
        ))
    })
    .collect())
}

/// On the coordinator: copies of the quarantine entries `entries` (a JSON array, as
/// `quarantine_changes` lists them) of distributed view `view_id` (user relation `relid`, over
/// distributed event table `source`), filed under the view's name.
pub fn copy_quarantine_entries(
    view_id: i32,
    relid: pg_sys::Oid,
    source: pg_sys::Oid,
    entries: &str,
) -> EvResult<()> {
    spi::run(
        "WITH entries AS MATERIALIZED (
             SELECT pg_catalog.nextval('eventview.quarantine_id_seq'::regclass) AS id, e.*
             FROM pg_catalog.json_to_recordset($1::json) AS e(shard text, shard_entry bigint,
                  event_id bigint, reason text, event jsonb, quarantined_at timestamptz)),
         filed AS (
             INSERT INTO eventview.quarantine (id, source, view_name, event_id, reason, event, quarantined_at)
             OVERRIDING SYSTEM VALUE
             SELECT e.id, $2::regclass, pg_catalog.format('%I.%I', n.nspname, c.relname),
                    e.event_id, e.reason, e.event, e.quarantined_at
             FROM entries e, pg_catalog.pg_class c, pg_catalog.pg_namespace n
             WHERE c.oid = $3 AND n.oid = c.relnamespace)
         INSERT INTO eventview._distributed_quarantine (id, view_id, shard, shard_entry)
         SELECT id, $4, shard, shard_entry FROM entries",
        &[entries.into(), source.into(), relid.into(), view_id.into()],
    )
}

/// On the coordinator: the copies of distributed view `view_id`'s quarantine entries deleted,
/// of the shards `shards` lists, or all of them.
pub fn forget_quarantine_copies(view_id: i32, shards: Option<Vec<String>>) -> EvResult<()> {
    let filter = match &shards {
        Some(shards) if shards.is_empty() => return Ok(()),
        Some(_) => "AND shard = ANY($2::text[])",
        None => "",
    };
    spi::run(
        &format!(
            "WITH gone AS (DELETE FROM eventview._distributed_quarantine
                           WHERE view_id = $1 {filter} RETURNING id)
             DELETE FROM eventview.quarantine WHERE id IN (SELECT id FROM gone)"
        ),
        &[view_id.into(), shards.unwrap_or_default().into()],
    )
}

/// On the coordinator: the copies of distributed view `view_id`'s quarantine entries of shard
/// `shard`, up to its id `above`, whose entries are not among `present` (taken back there)
/// deleted. Whether `present` has entries without a copy.
pub fn forget_quarantine_copies_taken_back(
    view_id: i32,
    shard: &str,
    above: i64,
    present: Vec<i64>,
) -> EvResult<bool> {
    spi::run(
        "WITH gone AS (DELETE FROM eventview._distributed_quarantine m
                       WHERE m.view_id = $1 AND m.shard = $2 AND m.shard_entry <= $3
                         AND NOT EXISTS (SELECT 1 FROM pg_catalog.unnest($4::bigint[]) p(id)
                                         WHERE p.id = m.shard_entry)
                       RETURNING m.id)
         DELETE FROM eventview.quarantine WHERE id IN (SELECT id FROM gone)",
        &[
            view_id.into(),
            shard.into(),
            above.into(),
            present.clone().into(),
        ],
    )?;
    Ok(spi::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.unnest($3::bigint[]) p(id)
                        WHERE NOT EXISTS (SELECT 1 FROM eventview._distributed_quarantine m
                                          WHERE m.view_id = $1 AND m.shard = $2 AND m.shard_entry = p.id))",
        &[view_id.into(), shard.into(), present.into()],
    )? == Some(true))
}
