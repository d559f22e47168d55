//! Every statement the extension's Rust code runs on its own tables (`eventview._sources`,
//! `eventview._views`, `eventview._fields`, `eventview._changelog_segments`, and the drift and quarantine rows of a table that is
//! forgotten); those on the catalog of event tables distributed by Citus are in `distributed`. Two kinds of statement read or write catalog rows elsewhere, on purpose: the
//! generated refresh and observer statements (`eventview_core::sqlgen`, `observe_sql`) store
//! the consumer's new position in the same statement that applies the changes, so both commit
//! or neither does; and the pruning of raw events (`event_tables::prune_events`) reads the
//! views' positions in its own statement. The PL/pgSQL of the SQL surface (`schedule`,
//! `run_maintenance`, `_prune`, `_pending`, `_follow_drop`) keeps its own statements. Whether a
//! change is applied is `eventview._applied` everywhere.

pub mod distributed;

use crate::errors::{EvError, EvResult};
use crate::pg::spi;
use crate::relation;
use eventview_core::definition::{
    parse_definition, parse_rollup, DefinitionInput, FieldVariant, LogicalField, RollupInput,
    SqlType, ViewDefinition,
};
use eventview_core::jsonpath;
use pgrx::datum::Interval;
use pgrx::prelude::*;

thread_local! {
    /// Set once this backend saw the catalog at the library's version (it cannot go back).
    static CATALOG_MATCHES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The library generates SQL against the catalog of its own version. After a new build is
/// installed, a database still at an older version must be updated first: say so clearly
/// instead of failing on a missing column or function. Capture triggers are PL/pgSQL whose one
/// call into the library (`eventview._wake_worker_on_commit`) every later library keeps, so they
/// go on working meanwhile; nothing is lost, changes wait in the changelog.
pub fn require_current_version() -> EvResult<()> {
    if CATALOG_MATCHES.get() {
        return Ok(());
    }
    let library = env!("CARGO_PKG_VERSION");
    let installed: Option<String> = spi::one(
        "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pg_eventview'",
        &[],
    )?;
    match installed {
        Some(v) if v == library => {
            CATALOG_MATCHES.set(true);
            Ok(())
        }
        Some(v) => Err(EvError::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("pg_eventview is at version {v} in this database, but the installed library is version {library}"),
        )
        .with_hint("Run ALTER EXTENSION pg_eventview UPDATE; capture keeps recording changes until then.")),
        // Inside CREATE EXTENSION, before pg_extension has the row: nothing to compare with.
        None => Ok(()),
    }
}

/// A registered event table.
pub struct Source {
    pub source_id: i32,
    pub relid: pg_sys::Oid,
    /// Quoted, schema-qualified name.
    pub table_sql: String,
    /// The table as the statements that read its rows name it (`envelope_sql::source_scan`).
    pub scan_sql: String,
}

/// Whether a stored position (the xmax of a consumer's snapshot) lies beyond every transaction
/// id this cluster has given out: restored from another cluster whose counter was ahead, and not
/// renumbered (`eventview._rebase_positions`). Compared with the cluster's next id, not with a
/// snapshot: a position written by a transaction that committed after the statement's snapshot
/// was taken (a row locked after waiting for it) is not from elsewhere.
pub fn position_from_elsewhere(xmax: Option<i64>) -> bool {
    let next = crate::pg::next_full_transaction_id();
    xmax.is_some_and(|x| x as u64 > next)
}

/// What a `eventview_core::batch::pending_check` statement found for one consumer of a changelog.
pub struct Pending {
    /// Some record is in the consumer's batch.
    pub any: bool,
    /// The xmax of the consumer's applied snapshot (see `position_from_elsewhere`).
    pub applied_xmax: Option<i64>,
    /// The check's extra column (a view's `extremes_logged`), 0 when NULL.
    pub extra: i64,
    /// The event rows of the batch, when the check counts them (`ViewSql::pending_check`).
    pub batch_rows: Option<i64>,
}

/// Runs a `eventview_core::batch::pending_check` statement. Read without the consumer's lock: a
/// concurrent run only moves the position on, and a batch empty from an older position is
/// empty from a newer one.
pub fn pending(sql: &str, plans: crate::pg::plan_cache::Plans) -> EvResult<Pending> {
    Ok(Spi::connect_mut(|client| {
        let row = crate::pg::plan_cache::execute(client, sql, Some(1), &[], plans)?.first();
        Ok::<_, pgrx::spi::SpiError>(Pending {
            any: row.get::<bool>(1)?.unwrap_or(true),
            applied_xmax: row.get::<i64>(2)?,
            extra: row.get::<i64>(3)?.unwrap_or(0),
            batch_rows: match row.columns()? {
                4 => row.get::<i64>(4)?,
                _ => None,
            },
        })
    })?)
}

impl Source {
    /// The event table `relid`, registered as `source_id`.
    pub fn found(source_id: i32, relid: pg_sys::Oid) -> EvResult<Source> {
        let table_sql = relation::qualified(relid)?;
        let scan_sql = eventview_core::envelope_sql::source_scan(
            &table_sql,
            crate::pg::relcache::is_partitioned(relid),
        );
        Ok(Source {
            source_id,
            relid,
            table_sql,
            scan_sql,
        })
    }

    /// The sizes the plans of a refresh depend on: the event table's and its changelog's
    /// (`plan_cache::Plans::PerSize`).
    pub fn plan_sizes(&self) -> crate::pg::plan_cache::SizeClass {
        crate::pg::plan_cache::size_class(&[self.relid, self.changelog_relid()])
    }

    /// The sizes the observer's plan depends on: those of `plan_sizes` and what was observed
    /// before.
    pub fn observer_plan_sizes(&self) -> crate::pg::plan_cache::SizeClass {
        crate::pg::plan_cache::size_class(&[
            self.relid,
            self.changelog_relid(),
            relation::extension_relid("_observed"),
        ])
    }

    /// The changelog table (InvalidOid if missing).
    pub fn changelog_relid(&self) -> pg_sys::Oid {
        relation::extension_relid(&eventview_core::names::changelog_table(self.source_id))
    }

    /// Whether the changelog holds a record whose transaction id this cluster has not given out
    /// yet: restored from another cluster and not renumbered.
    pub fn changelog_from_elsewhere(&self) -> EvResult<bool> {
        let newest = spi::one::<i64>(
            &format!(
                "SELECT max(xid)::text::bigint FROM {}",
                eventview_core::names::changelog(self.source_id)
            ),
            &[],
        )?;
        Ok(position_from_elsewhere(newest.map(|x| x + 1)))
    }
}

pub fn source_by_relid(relid: pg_sys::Oid) -> EvResult<Option<Source>> {
    let id = spi::one::<i32>(
        "SELECT source_id FROM eventview._sources WHERE relid = $1::regclass",
        &[relid.into()],
    )?;
    match id {
        None => Ok(None),
        Some(source_id) => Ok(Some(Source::found(source_id, relid)?)),
    }
}

/// The event table named `name`, or a clear error saying why it is not one.
pub fn source_by_name(name: &str) -> EvResult<Source> {
    let relid = relation::resolve(name)?;
    if let Some(source) = source_by_relid(relid)? {
        return Ok(source);
    }
    if crate::citus::distributed_source(relid)?.is_some() {
        return Err(crate::citus::not_supported(
            format!(
                "{} is an event table distributed by Citus, which this call does not support in this version of pg_eventview",
                relation::regclass_text(relid)?
            ),
            "On a distributed event table, create_view, refresh, drop_view and drop_event_table are supported (see Citus in docs/reference.md).",
        ));
    }
    Err(EvError::invalid(format!(
        "relation \"{}\" is not an event table",
        eventview_core::quote::shown_name(name)
    ))
    .with_hint("Create event tables with eventview.create_event_table()."))
}

pub fn insert_source(
    relid: pg_sys::Oid,
    retention: Option<Interval>,
    delta_retention: Option<Interval>,
    partition_interval: Option<Interval>,
) -> EvResult<i32> {
    spi::one::<i32>(
        "WITH source AS (
             INSERT INTO eventview._sources (relid, retention, delta_retention, partition_interval)
             VALUES ($1::regclass, $2, coalesce($3, interval '7 days'), $4) RETURNING source_id),
         guard AS (INSERT INTO eventview._prune_guards (source_id) SELECT source_id FROM source)
         SELECT source_id FROM source",
        &[
            relid.into(),
            retention.into(),
            delta_retention.into(),
            partition_interval.into(),
        ],
    )?
    .ok_or_else(|| EvError::invalid("could not register the event table"))
}

/// Whether the event table `source_id` has a key table (it is partitioned).
pub fn has_key_table(source_id: i32) -> bool {
    relation::extension_relid(&eventview_core::names::key_table_name(source_id))
        != pg_sys::InvalidOid
}

/// The partition length of an event table whose partitions pg_eventview makes
/// (`create_event_table(..., partition_interval)`); None for every other table.
pub fn partition_interval(source_id: i32) -> EvResult<Option<Interval>> {
    spi::one::<Interval>(
        "SELECT partition_interval FROM eventview._sources WHERE source_id = $1",
        &[source_id.into()],
    )
}

/// How an API call locks an event table's catalog row (there are no foreign keys to it, see
/// sql/bootstrap.sql): `AddsRows` for what adds a view, `Redeclares` for a field declaration,
/// `Drops` for drop_event_table, so that none commits rows for a table another is dropping. A
/// declaration also waits for views being created (and they for it): it checks and updates the
/// views that read the field, which must include one whose creation has not committed yet
/// (created with the old declaration, it would read the old path until rebuilt, or no longer
/// load at all after a type change).
pub enum SourceLock {
    AddsRows,
    Redeclares,
    Drops,
}

/// Takes `lock` on the table's catalog row; a table dropped meanwhile is an error.
pub fn lock_source(source: &Source, lock: SourceLock) -> EvResult<()> {
    let sql = match lock {
        SourceLock::AddsRows => {
            "SELECT source_id FROM eventview._sources WHERE source_id = $1 FOR KEY SHARE"
        }
        SourceLock::Redeclares | SourceLock::Drops => {
            "SELECT source_id FROM eventview._sources WHERE source_id = $1 FOR UPDATE"
        }
    };
    match spi::one::<i32>(sql, &[source.source_id.into()])? {
        Some(_) => Ok(()),
        None => Err(EvError::invalid(format!(
            "event table {} was dropped meanwhile",
            source.table_sql
        ))),
    }
}

/// Keeps `prune` off the table until this transaction ends: its row in
/// `eventview._prune_guards` held FOR KEY SHARE, which prune's FOR UPDATE SKIP LOCKED skips
/// (`lock_source_for_prune`). A view being created is invisible to prune until it commits, and
/// needs every change committed after its starting snapshot, which the other consumers may have
/// applied already. The row is made first where the table has none (see `make_prune_guard`).
pub fn hold_off_prune(source: &Source) -> EvResult<()> {
    make_prune_guard(source.source_id)?;
    spi::run(
        "SELECT 1 FROM eventview._prune_guards WHERE source_id = $1 FOR KEY SHARE",
        &[source.source_id.into()],
    )
}

/// The row of event table `source_id` in `eventview._prune_guards`, made where it is missing:
/// `insert_source` makes it with the table, but a catalog restored from a dump of a release
/// without the guards (or by a data-only restore) has tables without one. Of two sessions
/// making the same row, the second waits for the first to commit, once.
fn make_prune_guard(source_id: i32) -> EvResult<()> {
    spi::run(
        "INSERT INTO eventview._prune_guards (source_id)
         SELECT $1 WHERE NOT EXISTS (SELECT 1 FROM eventview._prune_guards WHERE source_id = $1)
         ON CONFLICT (source_id) DO NOTHING",
        &[source_id.into()],
    )
}

/// prune's hold on event table `source_id` while no view of it is being made: its row in
/// `eventview._prune_guards` locked FOR UPDATE, unless `hold_off_prune` holds it (false: the
/// table is left to a later prune, never waited for). Only for members of the table's owner
/// role, as prune: a row lock is a lock others wait for. Row locks take UPDATE on the table,
/// which only the extension owner has: no other role can lock a table's row, and so hold
/// prune, `create_view` or `rebuild` off it.
pub fn lock_source_for_prune(source_id: i32) -> EvResult<bool> {
    let relid = spi::one::<pg_sys::Oid>(
        "SELECT relid::oid FROM eventview._sources WHERE source_id = $1",
        &[source_id.into()],
    )?;
    let Some(relid) = relid.filter(|r| *r != pg_sys::InvalidOid) else {
        return Ok(false);
    };
    crate::privileges::require_table_owner(relid, "prune")?;
    make_prune_guard(source_id)?;
    Ok(spi::one::<bool>(
        "WITH held AS (SELECT 1 FROM eventview._prune_guards WHERE source_id = $1
                       FOR UPDATE SKIP LOCKED)
         SELECT EXISTS (SELECT 1 FROM held)",
        &[source_id.into()],
    )?
    .unwrap_or(false))
}

/// Raw events older than this may have been pruned, if the source has a retention: the
/// retention back from the clock, not from the transaction's start (`now()`). The caller holds
/// prune off the table (`hold_off_prune`) first, so every prune that deleted anything committed
/// before this is read, with a horizon at or before this one. Computed in UTC, as prune's cutoff
/// is (`event_tables::prune_events`): in a time zone with daylight saving time, subtracting days
/// or months across a change gives another instant, and a rebuild in such a session could take
/// a horizon before prune's and recompute buckets whose events prune had deleted.
pub fn retention_horizon(source: &Source) -> EvResult<Option<pgrx::datum::TimestampWithTimeZone>> {
    spi::one(
        "SELECT ((pg_catalog.clock_timestamp() AT TIME ZONE 'UTC') - retention) AT TIME ZONE 'UTC'
         FROM eventview._sources WHERE source_id = $1",
        &[source.source_id.into()],
    )
}

/// Removes an event table's catalog rows: its field declarations and observations, then the
/// table itself (no foreign keys cascade: see sql/bootstrap.sql). Its views are dropped first.
pub fn delete_source(source_id: i32) -> EvResult<()> {
    spi::run(
        "WITH fields AS (DELETE FROM eventview._fields WHERE source_id = $1 RETURNING 1),
              observed AS (DELETE FROM eventview._observed WHERE source_id = $1 RETURNING 1),
              versions AS (DELETE FROM eventview._observed_versions WHERE source_id = $1 RETURNING 1),
              segments AS (DELETE FROM eventview._changelog_segments WHERE source_id = $1 RETURNING 1),
              guard AS (DELETE FROM eventview._prune_guards WHERE source_id = $1 RETURNING 1)
         DELETE FROM eventview._sources WHERE source_id = $1",
        &[source_id.into()],
    )
}

/// What `eventview._changelog_segments` knows of one changelog segment: when it was made, and
/// the first record number not given out then.
pub struct SegmentMade {
    pub lo: i64,
    /// Seconds since the Unix epoch.
    pub made_at: f64,
    pub made_seq: i64,
}

/// The segments of source `source_id` noted as made, in ascending order.
pub fn segments_made(source_id: i32) -> EvResult<Vec<SegmentMade>> {
    Ok(Spi::connect(|client| {
        let mut out = Vec::new();
        for row in client.select(
            "SELECT lo, EXTRACT(epoch FROM made_at)::float8, made_seq
             FROM eventview._changelog_segments WHERE source_id = $1 ORDER BY lo",
            None,
            &[source_id.into()],
        )? {
            if let (Some(lo), Some(made_at), Some(made_seq)) =
                (row.get::<i64>(1)?, row.get::<f64>(2)?, row.get::<i64>(3)?)
            {
                out.push(SegmentMade {
                    lo,
                    made_at,
                    made_seq,
                });
            }
        }
        Ok::<_, pgrx::spi::SpiError>(out)
    })?)
}

/// Notes segment `lo` of source `source_id` as made now, when record number `made_seq` was the
/// next to be given out (a segment found without a note, as after a restore, is noted when it
/// is found: no earlier than it was made).
pub fn note_segment_made(source_id: i32, lo: i64, made_seq: i64) -> EvResult<()> {
    spi::run(
        "INSERT INTO eventview._changelog_segments (source_id, lo, made_seq) VALUES ($1, $2, $3)
         ON CONFLICT (source_id, lo) DO NOTHING",
        &[source_id.into(), lo.into(), made_seq.into()],
    )
}

/// Forgets the notes of the segments of source `source_id` starting at `los` (dropped), or of
/// all of its segments (None: the changelog is gone).
pub fn forget_segments(source_id: i32, los: Option<Vec<i64>>) -> EvResult<()> {
    spi::run(
        "DELETE FROM eventview._changelog_segments
         WHERE source_id = $1 AND ($2::int8[] IS NULL OR lo = ANY ($2))",
        &[source_id.into(), los.into()],
    )
}

/// The `delta_retention` of source `source_id`, in seconds.
pub fn delta_retention_seconds(source_id: i32) -> EvResult<f64> {
    Ok(spi::one::<f64>(
        "SELECT EXTRACT(epoch FROM delta_retention)::float8 FROM eventview._sources WHERE source_id = $1",
        &[source_id.into()],
    )?
    .unwrap_or(0.0))
}

/// The transaction id below which every consumer of source `source_id` (its views and its
/// field observer) has applied every changelog record: the smallest xmin of their applied
/// snapshots, and of their own transactions (a consumer that ran inside a writing transaction
/// applied that transaction's records only up to a position). As text of a number; None without
/// consumers.
pub fn applied_horizon(source_id: i32) -> EvResult<Option<i64>> {
    spi::one::<i64>(
        "SELECT pg_catalog.min(LEAST(pg_catalog.pg_snapshot_xmin(k.s), k.own))::text::int8
         FROM (SELECT applied_snapshot AS s, applied_own_xid AS own FROM eventview._views WHERE source_id = $1 AND source_view IS NULL
               UNION ALL
               SELECT observed_snapshot, observed_own_xid FROM eventview._sources WHERE source_id = $1) k",
        &[source_id.into()],
    )
}

/// A registered view, with its definition parsed.
pub struct ViewRecord {
    pub view_id: i32,
    pub relid: pg_sys::Oid,
    pub source: Source,
    pub definition: ViewDefinition,
    pub time_bucket: Option<Interval>,
    /// The role the view belongs to: refreshes run as this role.
    pub owner: pg_sys::Oid,
    /// Reads see pending changes (`eventview.alter_view(realtime => ...)`).
    pub realtime: bool,
    /// Its applied snapshot is ahead of this cluster's transactions: restored from another
    /// cluster and not renumbered (`eventview._rebase_positions`).
    pub positions_from_elsewhere: bool,
    /// The bucket width as the text of an interval.
    pub bucket_width: Option<String>,
    /// Rollups read it: its applies write its group changes.
    pub feeds_rollups: bool,
    /// A rollup: the view it reads (`source` is that view's event table).
    pub source_view: Option<Box<ViewRecord>>,
    /// Its storage, when it is not `eventview._v<id>_data` (`_views.data_relation`).
    pub data_table: Option<String>,
}

/// Loads a view by its user relation; with `lock`, takes the row lock that serializes
/// refreshes of one view (a second refresh waits here, then sees the first one's result).
pub fn view_by_relid(relid: pg_sys::Oid, lock: bool) -> EvResult<Option<ViewRecord>> {
    let sql = format!(
        "SELECT view_id FROM eventview._views WHERE relid = $1::regclass{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    let Some(view_id) = spi::one::<i32>(&sql, &[relid.into()])? else {
        return Ok(None);
    };
    Ok(Some(load_view(view_id)?))
}

pub fn view_by_name(name: &str, lock: bool) -> EvResult<ViewRecord> {
    let relid = relation::resolve(name)?;
    match view_by_relid(relid, lock)? {
        Some(view) => Ok(view),
        None => Err(not_a_view(relid, name)?),
    }
}

/// Why relation `relid`, named `name` by the caller, is refused where a view of this node is
/// expected: 0A000 for a view over an event table distributed by Citus (which only some calls
/// take), 22023 for anything else.
fn not_a_view(relid: pg_sys::Oid, name: &str) -> EvResult<EvError> {
    if crate::citus::distributed_view(relid)?.is_some() {
        return Ok(crate::citus::not_supported(
            format!(
                "{} is a view over an event table distributed by Citus, which this call does not support in this version of pg_eventview",
                relation::regclass_text(relid)?
            ),
            "On such a view, refresh, rebuild, schedule, alter_view (realtime) and drop_view are supported (see Citus in docs/reference.md).",
        ));
    }
    Ok(EvError::invalid(format!(
        "relation \"{}\" is not an incremental view",
        eventview_core::quote::shown_name(name)
    ))
    .with_hint("Create incremental views with eventview.create_view()."))
}

/// The view named `name` (read unlocked before, as `unlocked`) with its row locked: the lock
/// waits for a refresh or change of it in progress. Dropped meanwhile (by the transaction
/// waited for): SQLSTATE 42P01, as if the name had not resolved (`refresh_all` skips it).
pub fn lock_view(unlocked: &ViewRecord, name: &str) -> EvResult<ViewRecord> {
    lock_view_by_relid(unlocked.relid, name)
}

/// `lock_view` for a view whose relation is `relid` (found unlocked by `view_ref_by_name`).
pub fn lock_view_by_relid(relid: pg_sys::Oid, name: &str) -> EvResult<ViewRecord> {
    view_by_relid(relid, true)?.ok_or_else(|| {
        EvError::new(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!(
                "view \"{}\" was dropped by another transaction",
                eventview_core::quote::shown_name(name)
            ),
        )
    })
}

pub(crate) fn load_view(view_id: i32) -> EvResult<ViewRecord> {
    let row = Spi::connect(|client| {
        let t = crate::pg::plan_cache::select(
            client,
            "SELECT v.relid::oid, v.source_id, s.relid::oid,
                    (v.definition -> 'group_by')::text, (v.definition -> 'measures')::text,
                    CASE WHEN json_typeof(v.definition -> 'event_types') = 'array'
                         THEN ARRAY(SELECT json_array_elements_text(v.definition -> 'event_types')) END,
                    json_typeof(v.definition -> 'event_types'),
                    (v.definition -> 'filter')::text, json_typeof(v.definition -> 'filter'),
                    v.on_type_error, v.time_bucket, v.owner::oid, v.realtime,
                    pg_snapshot_xmax(v.applied_snapshot)::text::bigint, v.definition ->> 'time_zone',
                    v.definition ->> 'unnest', v.time_bucket::text, v.feeds_rollups, v.source_view,
                    v.data_relation::text
             FROM eventview._views v JOIN eventview._sources s USING (source_id)
             WHERE v.view_id = $1",
            Some(1),
            &[view_id.into()],
        )?
        .first();
        Ok::<_, pgrx::spi::SpiError>((
            t.get::<pg_sys::Oid>(1)?,
            t.get::<i32>(2)?,
            t.get::<pg_sys::Oid>(3)?,
            t.get::<String>(4)?,
            t.get::<String>(5)?,
            t.get::<Vec<String>>(6)?,
            t.get::<String>(7)?,
            t.get::<String>(8)?,
            t.get::<String>(9)?,
            t.get::<String>(10)?,
            t.get::<Interval>(11)?,
            t.get::<pg_sys::Oid>(12)?,
            t.get::<bool>(13)?,
            t.get::<i64>(14)?,
            t.get::<String>(15)?,
            t.get::<String>(16)?,
            t.get::<String>(17)?,
            t.get::<bool>(18)?,
            t.get::<i32>(19)?,
            t.get::<String>(20)?,
        ))
    })?;
    let (
        relid,
        source_id,
        source_relid,
        group_by,
        measures,
        types,
        types_kind,
        filter,
        filter_kind,
        policy,
        bucket,
        owner,
        realtime,
        applied_xmax,
        time_zone,
        unnest,
        bucket_width,
        feeds_rollups,
        source_view_id,
        data_table,
    ) = row;
    let missing = || EvError::invalid(format!("view {view_id} has an incomplete catalog entry"));
    let filter = if filter_kind.as_deref() == Some("object") {
        filter.as_deref()
    } else {
        None
    };
    let source_view = match source_view_id {
        Some(id) => Some(Box::new(load_view(id)?)),
        None => None,
    };
    let definition = match &source_view {
        Some(source) => parse_rollup(&RollupInput {
            source: &source.definition,
            group_by: group_by.as_deref().unwrap_or("{}"),
            measures: measures.as_deref().unwrap_or("{}"),
            filter,
            bucketed: bucket.is_some(),
        })?,
        None => load_definition(
            source_id.ok_or_else(missing)?,
            &DefinitionTexts {
                group_by: group_by.as_deref().unwrap_or("{}"),
                measures: measures.as_deref().unwrap_or("{}"),
                event_types: if types_kind.as_deref() == Some("array") {
                    Some(types.unwrap_or_default().into_iter().map(Some).collect())
                } else {
                    None
                },
                bucketed: bucket.is_some(),
                time_zone: time_zone.as_deref(),
                unnest: unnest.as_deref(),
                filter,
                on_type_error: policy.as_deref().unwrap_or("quarantine"),
            },
        )?,
    };
    let source_relid = source_relid.ok_or_else(missing)?;
    let relid = relid.ok_or_else(missing)?;
    Ok(ViewRecord {
        view_id,
        relid,
        source: Source::found(source_id.ok_or_else(missing)?, source_relid)
            .map_err(|_| event_table_gone(relid))?,
        definition,
        time_bucket: bucket,
        owner: owner.ok_or_else(missing)?,
        realtime: realtime.unwrap_or(false),
        positions_from_elsewhere: position_from_elsewhere(applied_xmax),
        bucket_width,
        feeds_rollups: feeds_rollups.unwrap_or(false),
        source_view,
        data_table,
    })
}

/// The texts of a view's definition as the catalog keeps them.
struct DefinitionTexts<'a> {
    group_by: &'a str,
    measures: &'a str,
    event_types: Option<Vec<Option<String>>>,
    bucketed: bool,
    time_zone: Option<&'a str>,
    unnest: Option<&'a str>,
    filter: Option<&'a str>,
    on_type_error: &'a str,
}

/// A view's definition over the events of source `source_id`, parsed with the source's logical
/// fields as they are declared now.
fn load_definition(source_id: i32, texts: &DefinitionTexts) -> EvResult<ViewDefinition> {
    let fields = fields_of_source(source_id)?;
    Ok(parse_definition(&DefinitionInput {
        fields: &fields,
        group_by: texts.group_by,
        measures: texts.measures,
        event_types: texts.event_types.clone(),
        bucketed: texts.bucketed,
        time_zone: texts.time_zone,
        unnest: texts.unnest,
        filter: texts.filter,
        on_type_error: texts.on_type_error,
    })?)
}

/// The event table of view `relid` is gone: dropped by a plain DROP TABLE while the view read it
/// (see `eventview._follow_drop`).
pub fn event_table_gone(relid: pg_sys::Oid) -> EvError {
    let view = relation::regclass_text(relid).unwrap_or_else(|_| relid.to_u32().to_string());
    // Not 42P01 (undefined_table): refresh_all takes that for a view dropped while it ran and
    // goes on silently; this view is there, and fails.
    EvError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("the event table of view {view} was dropped"),
    )
    .with_hint("The view can no longer be refreshed: drop it with eventview.drop_view. Drop event tables with eventview.drop_event_table.")
}

/// A view as `view_ref_by_name` finds it.
pub struct ViewRef {
    pub relid: pg_sys::Oid,
    pub owner: pg_sys::Oid,
    /// Its event table's (which may be gone).
    pub source_relid: pg_sys::Oid,
}

/// The view named `name`, without loading its definition or its event table: what dropping it
/// takes (also when its event table is gone), and a refresh's check of the caller's rights
/// before it takes the view's row and loads the view once.
pub fn view_ref_by_name(name: &str) -> EvResult<ViewRef> {
    view_ref(relation::resolve(name)?, name)
}

/// The view whose relation is `relid`, named `name` by the caller (22023 when it is none).
pub fn view_ref(relid: pg_sys::Oid, name: &str) -> EvResult<ViewRef> {
    let row = Spi::connect(|client| {
        let t = crate::pg::plan_cache::select(
            client,
            "SELECT v.owner::oid, s.relid::oid FROM eventview._views v JOIN eventview._sources s USING (source_id)
             WHERE v.relid = $1::regclass",
            Some(1),
            &[relid.into()],
        )?;
        if t.is_empty() {
            return Ok::<_, pgrx::spi::SpiError>(None);
        }
        let row = t.first();
        Ok(row.get::<pg_sys::Oid>(1)?.zip(row.get::<pg_sys::Oid>(2)?))
    })?;
    let Some((owner, source_relid)) = row else {
        return Err(not_a_view(relid, name)?);
    };
    Ok(ViewRef {
        relid,
        owner,
        source_relid,
    })
}

/// Whether the caller acts as the owner of some view reading the source (`privileges::caller_acts_as`).
pub fn caller_owns_a_view_of(source_id: i32) -> EvResult<bool> {
    Ok(spi::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM eventview._views v WHERE v.source_id = $1
                          AND pg_catalog.pg_has_role($2, v.owner::oid, 'MEMBER'))",
        &[source_id.into(), crate::pg::roles::caller().into()],
    )?
    .unwrap_or(false))
}

/// Views reading a source, as (view_id, relid), oldest first (a rollup after the view it
/// reads); rollups of its views included.
pub fn views_of_source(source_id: i32) -> EvResult<Vec<(i32, pg_sys::Oid)>> {
    id_relid_pairs(
        "SELECT view_id, relid::oid FROM eventview._views WHERE source_id = $1 ORDER BY view_id",
        &[source_id.into()],
    )
}

/// The views reading a source's events themselves (no rollups), oldest first.
pub fn event_views_of_source(source_id: i32) -> EvResult<Vec<(i32, pg_sys::Oid)>> {
    id_relid_pairs(
        "SELECT view_id, relid::oid FROM eventview._views WHERE source_id = $1 AND source_view IS NULL
         ORDER BY view_id",
        &[source_id.into()],
    )
}

/// The views a view (relation `relid`) reads through when it is a rollup, as (relid, owner):
/// the view over the event table first, then each rollup above it (a source always has a lower
/// id than its rollups).
pub fn sources_below(relid: pg_sys::Oid) -> EvResult<Vec<(pg_sys::Oid, pg_sys::Oid)>> {
    // A view over an event table (most views) reads through no other: one lookup says so.
    let Some(view_id) = spi::one::<i32>(
        "SELECT view_id FROM eventview._views WHERE relid = $1::regclass AND source_view IS NOT NULL",
        &[relid.into()],
    )?
    else {
        return Ok(Vec::new());
    };
    let ids = view_ids_below(view_id)?;
    Ok(Spi::connect(|client| {
        let mut out = Vec::new();
        for row in crate::pg::plan_cache::select(
            client,
            "SELECT relid::oid, owner::oid FROM eventview._views WHERE view_id = ANY ($1) ORDER BY view_id",
            None,
            &[ids.into()],
        )? {
            if let (Some(r), Some(o)) = (row.get::<pg_sys::Oid>(1)?, row.get::<pg_sys::Oid>(2)?) {
                out.push((r, o));
            }
        }
        Ok::<_, pgrx::spi::SpiError>(out)
    })?)
}

/// The id of the view whose relation is `relid`, unlocked.
fn view_id_of_relid(relid: pg_sys::Oid) -> EvResult<Option<i32>> {
    spi::one::<i32>(
        "SELECT view_id FROM eventview._views WHERE relid = $1::regclass",
        &[relid.into()],
    )
}

/// Locks the catalog rows of the views a rollup with id `view_id` reads through, oldest first,
/// as refreshes take them: before the rollup's own row.
pub fn lock_sources_of(view_id: i32) -> EvResult<()> {
    let ids = view_ids_below(view_id)?;
    if ids.is_empty() {
        return Ok(());
    }
    spi::run(
        "SELECT 1 FROM eventview._views WHERE view_id = ANY ($1) ORDER BY view_id FOR UPDATE",
        &[ids.into()],
    )
}

/// `lock_sources_of` for the view whose relation is `relid`.
pub fn lock_sources_of_relid(relid: pg_sys::Oid) -> EvResult<()> {
    match view_id_of_relid(relid)? {
        Some(view_id) => lock_sources_of(view_id),
        None => Ok(()),
    }
}

/// The view whose relation is `relid` with its row locked, or None when another session holds
/// the row (`run_maintenance` never waits for a view's row).
pub fn try_lock_view_by_relid(relid: pg_sys::Oid) -> EvResult<Option<ViewRecord>> {
    let id = spi::one::<i32>(
        "SELECT view_id FROM eventview._views WHERE relid = $1::regclass FOR UPDATE SKIP LOCKED",
        &[relid.into()],
    )?;
    id.map(load_view).transpose()
}

/// The ids of the views a rollup with id `view_id` reads through (its source, that view's
/// source, ...); none for a view over an event table.
pub fn view_ids_below(view_id: i32) -> EvResult<Vec<i32>> {
    Ok(spi::one::<Vec<i32>>(
        "WITH RECURSIVE chain AS (
             SELECT v.source_view AS id, 1 AS depth FROM eventview._views v WHERE v.view_id = $1
             UNION ALL
             SELECT v.source_view, c.depth + 1 FROM chain c JOIN eventview._views v ON v.view_id = c.id
             WHERE c.depth < 100)
         SELECT coalesce(array_agg(id ORDER BY depth), '{}') FROM chain WHERE id IS NOT NULL",
        &[view_id.into()],
    )?
    .unwrap_or_default())
}

/// The views whose storage the rollups of `owner` read: every view below one of them.
pub fn views_read_by_rollups_of(owner: pg_sys::Oid) -> EvResult<Vec<i32>> {
    Ok(spi::one::<Vec<i32>>(
        "WITH RECURSIVE below AS (
             SELECT v.source_view AS id, 1 AS depth FROM eventview._views v
             WHERE v.owner::oid = $1 AND v.source_view IS NOT NULL
             UNION ALL
             SELECT v.source_view, b.depth + 1 FROM below b JOIN eventview._views v ON v.view_id = b.id
             WHERE v.source_view IS NOT NULL AND b.depth < 100)
         SELECT coalesce(array_agg(DISTINCT id), '{}') FROM below",
        &[owner.into()],
    )?
    .unwrap_or_default())
}

/// The rollups reading view `view_id` directly, as (view_id, relid), oldest first.
pub fn rollups_of(view_id: i32) -> EvResult<Vec<(i32, pg_sys::Oid)>> {
    id_relid_pairs(
        "SELECT view_id, relid::oid FROM eventview._views WHERE source_view = $1 ORDER BY view_id",
        &[view_id.into()],
    )
}

/// Marks whether rollups read view `view_id` (its applies write its group changes).
pub fn set_feeds_rollups(view_id: i32, feeds: bool) -> EvResult<()> {
    spi::run(
        "UPDATE eventview._views SET feeds_rollups = $2 WHERE view_id = $1",
        &[view_id.into(), feeds.into()],
    )
}

/// The rows of `query`, each an id and a relation (both non-null), in its order.
fn id_relid_pairs(
    query: &str,
    args: &[pgrx::datum::DatumWithOid],
) -> EvResult<Vec<(i32, pg_sys::Oid)>> {
    Ok(Spi::connect(|client| {
        let mut out = Vec::new();
        for row in crate::pg::plan_cache::select(client, query, None, args)? {
            if let (Some(id), Some(relid)) = (row.get::<i32>(1)?, row.get::<pg_sys::Oid>(2)?) {
                out.push((id, relid));
            }
        }
        Ok::<_, pgrx::spi::SpiError>(out)
    })?)
}

/// The columns of a table as `register_event_table` checks them.
pub fn table_columns(
    relid: pg_sys::Oid,
) -> EvResult<Vec<eventview_core::envelope_sql::OfferedColumn>> {
    Ok(Spi::connect(|client| {
        let mut out = Vec::new();
        for row in client.select(
            "SELECT attname::text, pg_catalog.format_type(atttypid, NULL), attnotnull
             FROM pg_catalog.pg_attribute
             WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            None,
            &[relid.into()],
        )? {
            if let (Some(name), Some(type_name), Some(not_null)) = (
                row.get::<String>(1)?,
                row.get::<String>(2)?,
                row.get::<bool>(3)?,
            ) {
                out.push(eventview_core::envelope_sql::OfferedColumn {
                    name,
                    type_name,
                    not_null,
                });
            }
        }
        Ok::<_, pgrx::spi::SpiError>(out)
    })?)
}

/// Whether a valid unique index of `relid` has `column` as its one key column, with no
/// predicate, checked at once and with NULLs distinct (a primary key or a UNIQUE constraint
/// among them): the index `INSERT ... ON CONFLICT (column)` takes as its arbiter, and that lets
/// any number of NULL keys in.
pub fn has_unique_index_on(relid: pg_sys::Oid, column: &str) -> EvResult<bool> {
    Ok(spi::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a
                          ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                        WHERE i.indrelid = $1 AND i.indisunique AND i.indisvalid AND i.indnkeyatts = 1
                          AND i.indimmediate AND NOT i.indnullsnotdistinct
                          AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = $2)",
        &[relid.into(), column.into()],
    )?
    .unwrap_or(false))
}

/// Whether a valid unique index of `relid`, checked at once and without predicate or
/// expressions, has `first` as its first key column and only columns of `allowed` as keys (a
/// unique index of a partitioned table includes the partition key).
pub fn has_unique_index_leading(
    relid: pg_sys::Oid,
    first: &str,
    allowed: &[&str],
) -> EvResult<bool> {
    Ok(spi::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a
                          ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                        WHERE i.indrelid = $1 AND i.indisunique AND i.indisvalid AND i.indimmediate
                          AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = $2
                          AND NOT EXISTS (
                              SELECT 1 FROM pg_catalog.generate_series(0, i.indnkeyatts - 1) k
                              JOIN pg_catalog.pg_attribute b ON b.attrelid = i.indrelid AND b.attnum = i.indkey[k]
                              WHERE b.attname <> ALL ($3)))",
        &[relid.into(), first.into(), allowed.to_vec().into()],
    )?
    .unwrap_or(false))
}

/// The column a partitioned table is partitioned on by range, when it is one plain column.
pub fn range_partition_column(relid: pg_sys::Oid) -> EvResult<Option<String>> {
    spi::one::<String>(
        "SELECT a.attname::text FROM pg_catalog.pg_partitioned_table p
         JOIN pg_catalog.pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]
         WHERE p.partrelid = $1 AND p.partstrat = 'r' AND p.partnatts = 1",
        &[relid.into()],
    )
}

/// Every incremental view, as (view_id, relid), oldest first.
pub fn all_views() -> EvResult<Vec<(i32, pg_sys::Oid)>> {
    id_relid_pairs(
        "SELECT view_id, relid::oid FROM eventview._views ORDER BY view_id",
        &[],
    )
}

/// The ids of every catalogued event table, those whose table is gone included, oldest first.
pub fn all_source_ids() -> EvResult<Vec<i32>> {
    Ok(id_relid_pairs(
        "SELECT source_id, relid::oid FROM eventview._sources ORDER BY source_id",
        &[],
    )?
    .into_iter()
    .map(|(id, _)| id)
    .collect())
}

/// Every event table, oldest first. A table dropped with a plain DROP TABLE (not
/// drop_event_table) keeps its catalog row, but is left out here: the work over every table
/// (refresh_all's and run_maintenance's field observer) goes on for the others.
pub fn all_sources() -> EvResult<Vec<Source>> {
    let rows = id_relid_pairs(
        "SELECT s.source_id, s.relid::oid FROM eventview._sources s
         WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = s.relid::oid)
         ORDER BY s.source_id",
        &[],
    )?;
    rows.into_iter()
        .map(|(source_id, relid)| Source::found(source_id, relid))
        .collect()
}

pub fn next_view_id() -> EvResult<i32> {
    spi::one::<i64>("SELECT nextval('eventview._views_view_id_seq')", &[])?
        .map(|v| v as i32)
        .ok_or_else(|| EvError::invalid("could not allocate a view id"))
}

pub fn record_refresh(view_id: i32, elapsed_ms: f64) -> EvResult<()> {
    spi::run(
        "UPDATE eventview._views SET last_refresh_at = clock_timestamp(), last_refresh_ms = $2,
                last_error = NULL, failures = 0, retry_at = NULL WHERE view_id = $1",
        &[view_id.into(), elapsed_ms.into()],
    )
}

/// The logical fields declared for a source, each with its declarations.
pub fn fields_of_source(source_id: i32) -> EvResult<Vec<LogicalField>> {
    let rows = Spi::connect(|client| {
        let mut out = Vec::new();
        for row in crate::pg::plan_cache::select(
            client,
            "SELECT field, event_type, event_version, path, field_type FROM eventview._fields
             WHERE source_id = $1 ORDER BY field, event_type NULLS LAST, event_version NULLS LAST",
            None,
            &[source_id.into()],
        )? {
            out.push((
                row.get::<String>(1)?.unwrap_or_default(),
                row.get::<String>(2)?,
                row.get::<i32>(3)?,
                row.get::<String>(4)?.unwrap_or_default(),
                row.get::<String>(5)?.unwrap_or_default(),
            ));
        }
        Ok::<_, pgrx::spi::SpiError>(out)
    })?;
    let mut fields: Vec<LogicalField> = Vec::new();
    for (name, event_type, version, path, type_name) in rows {
        let plan = jsonpath::plan(&path).map_err(|e| {
            EvError::invalid(format!(
                "field \"{name}\" has an invalid stored path \"{path}\": {}",
                e.0
            ))
        })?;
        let sql_type = SqlType::parse_declared(&type_name).ok_or_else(|| {
            EvError::invalid(format!(
                "field \"{name}\" has an unknown stored type \"{type_name}\""
            ))
        })?;
        let variant = FieldVariant {
            event_type,
            version,
            path,
            plan,
        };
        match fields.iter_mut().find(|f| f.name == name) {
            Some(f) => f.variants.push(variant),
            None => fields.push(LogicalField {
                name,
                sql_type,
                variants: vec![variant],
            }),
        }
    }
    Ok(fields
        .into_iter()
        .map(|f| LogicalField::new(f.name, f.sql_type, f.variants))
        .collect())
}

/// Declares (or redeclares) one variant of a logical field.
pub fn upsert_field(
    source_id: i32,
    field: &str,
    path: &str,
    event_type: Option<&str>,
    version: Option<i32>,
    type_name: &str,
) -> EvResult<()> {
    spi::run(
        "INSERT INTO eventview._fields (source_id, field, event_type, event_version, path, field_type)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (source_id, field, event_type, event_version)
         DO UPDATE SET path = EXCLUDED.path, field_type = EXCLUDED.field_type, defined_at = now()",
        &[source_id.into(), field.into(), event_type.into(), version.into(), path.into(), type_name.into()],
    )
}

// ---- Sources: capture repairs and forgetting a dropped table ----

/// A capture function of an event table that needs a repair: made by an older library
/// (`stale`, without the current one's mark) or executable by PUBLIC (`public`).
pub struct CaptureState {
    pub source_id: i32,
    pub op: String,
    pub stale: bool,
    pub public: bool,
}

/// The capture functions of every event table, for the operations `ops` whose current
/// functions carry the marks `marks` (same order), with what each needs.
pub fn capture_states(ops: &[&str], marks: &[&str]) -> EvResult<Vec<CaptureState>> {
    Ok(Spi::connect(|client| {
        let mut out = Vec::new();
        for row in client.select(
            "SELECT s.source_id, op.name,
                    op.mark <> '' AND pg_catalog.strpos(p.prosrc, op.mark) = 0,
                    EXISTS (SELECT FROM pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
                            WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE')
             FROM eventview._sources s
             CROSS JOIN ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[])) AS op(name, mark)
             JOIN pg_catalog.pg_proc p
               ON p.oid = pg_catalog.to_regprocedure(pg_catalog.format('eventview._capture_%s_%s()', s.source_id, op.name))
             ORDER BY s.source_id, op.name",
            None,
            &[ops.to_vec().into(), marks.to_vec().into()],
        )? {
            let (Some(source_id), Some(op)) = (row.get::<i32>(1)?, row.get::<String>(2)?) else {
                continue;
            };
            out.push(CaptureState {
                source_id,
                op,
                stale: row.get::<bool>(3)? == Some(true),
                public: row.get::<bool>(4)? == Some(true),
            });
        }
        Ok::<_, pgrx::spi::SpiError>(out)
    })?)
}

/// Where an event table stands in the catalog.
#[derive(PartialEq, Eq)]
pub enum SourceState {
    /// No catalog row: forgotten already.
    Forgotten,
    /// A catalog row whose table is gone.
    TableGone,
    /// A catalog row and its table.
    TableExists,
}

pub fn source_state(source_id: i32) -> EvResult<SourceState> {
    let state = spi::one::<i32>(
        "SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM eventview._sources WHERE source_id = $1) THEN 0
                     WHEN EXISTS (SELECT 1 FROM eventview._sources s JOIN pg_catalog.pg_class c ON c.oid = s.relid::oid
                                  WHERE s.source_id = $1) THEN 2
                     ELSE 1 END",
        &[source_id.into()],
    )?;
    Ok(match state {
        Some(0) => SourceState::Forgotten,
        Some(2) => SourceState::TableExists,
        _ => SourceState::TableGone,
    })
}

/// Deletes the drift and quarantine entries of an event table.
pub fn delete_drift_and_quarantine(source_id: i32) -> EvResult<()> {
    spi::run_replanned(
        "WITH s AS (SELECT relid FROM eventview._sources WHERE source_id = $1),
              d AS (DELETE FROM eventview.drift WHERE source = (SELECT relid FROM s) RETURNING 1)
         DELETE FROM eventview.quarantine WHERE source = (SELECT relid FROM s)",
        &[source_id.into()],
    )
}

/// Locks the source's row for the field observer unless another session holds it (another
/// observer of the same table: this one has nothing to add), returning the xmax of its
/// observed snapshot as a number; None when the row is locked elsewhere.
pub fn lock_observer_position(source_id: i32) -> EvResult<Option<i64>> {
    spi::one::<i64>(
        "SELECT pg_snapshot_xmax(observed_snapshot)::text::bigint
         FROM eventview._sources WHERE source_id = $1 FOR NO KEY UPDATE SKIP LOCKED",
        &[source_id.into()],
    )
}

/// What the paths of a source's views are made from, as text: each view's definition (with
/// what its parsing takes besides) and each field declaration of the source, in a fixed order.
/// Content, not row versions: every refresh rewrites its view's catalog row (its position and
/// counters), which must not count as a change.
pub fn definitions_of_source(source_id: i32) -> EvResult<String> {
    Ok(spi::one::<String>(
        "SELECT coalesce((SELECT pg_catalog.json_agg(pg_catalog.json_build_array(v.view_id, v.definition, v.time_bucket IS NULL, v.on_type_error) ORDER BY v.view_id)::text
                          FROM eventview._views v WHERE v.source_id = $1 AND v.source_view IS NULL), '[]')
       || coalesce((SELECT pg_catalog.json_agg(pg_catalog.json_build_array(f.field, f.event_type, f.event_version, f.path, f.field_type)
                                               ORDER BY f.field, f.event_type, f.event_version)::text
                    FROM eventview._fields f WHERE f.source_id = $1), '[]')",
        &[source_id.into()],
    )?
    .unwrap_or_default())
}

// ---- Fields ----

/// Gives every declaration of a logical field the type `field_type`.
pub fn retype_field(source_id: i32, field: &str, field_type: &str) -> EvResult<()> {
    spi::run(
        "UPDATE eventview._fields SET field_type = $3 WHERE source_id = $1 AND field = $2",
        &[source_id.into(), field.into(), field_type.into()],
    )
}

// ---- Views ----

/// What a new view's catalog row holds besides its definition's parts.
pub struct NewView<'a> {
    pub view_id: i32,
    pub relid: pg_sys::Oid,
    pub source_id: i32,
    pub group_by: &'a str,
    pub measures: &'a str,
    pub event_types: Option<Vec<String>>,
    pub time_bucket: Option<Interval>,
    pub time_zone: Option<&'a str>,
    pub unnest: Option<&'a str>,
    pub filter: Option<&'a str>,
    pub on_type_error: &'a str,
    pub realtime: bool,
    pub owner: pg_sys::Oid,
    /// A rollup: the view it reads.
    pub source_view: Option<i32>,
    /// Its storage, when it is not `eventview._v<id>_data` (a shard of a distributed view's
    /// partial groups, `citus`).
    pub data_table: Option<&'a str>,
}

/// Records a new view, with the current snapshot as the one it has applied (its storage is
/// filled from scratch in the same transaction) and the name its quarantine rows carry (kept
/// up to date by eventview._follow_ddl).
pub fn insert_view(v: NewView) -> EvResult<()> {
    spi::run(
        "INSERT INTO eventview._views (view_id, relid, source_id, definition, time_bucket, on_type_error, realtime,
                                       owner, applied_snapshot, source_view, data_relation)
         VALUES ($1, $2::regclass, $3,
                 json_build_object('group_by', $4::json, 'measures', $5::json, 'event_types', $6::text[],
                                   'time_bucket', $7::interval, 'time_zone', $12::text, 'unnest', $13::text,
                                   'filter', $8::json),
                 $7, $9, $10, $11::oid::regrole, pg_current_snapshot(), $14, $15::regclass)",
        &[
            v.view_id.into(),
            v.relid.into(),
            v.source_id.into(),
            v.group_by.into(),
            v.measures.into(),
            v.event_types.into(),
            v.time_bucket.into(),
            v.filter.into(),
            v.on_type_error.into(),
            v.realtime.into(),
            v.owner.into(),
            v.time_zone.into(),
            v.unnest.into(),
            v.source_view.into(),
            v.data_table.into(),
        ],
    )?;
    spi::run(
        "UPDATE eventview._views SET known_name = eventview._view_name(view_id) WHERE view_id = $1",
        &[v.view_id.into()],
    )
}

/// The id of the incremental view named `name`; None when the name resolves to no relation or
/// to one that is no incremental view (the caller then reads it as an event table's name).
pub fn view_id_named(name: &str) -> EvResult<Option<i32>> {
    let Ok(relid) = relation::resolve(name) else {
        return Ok(None);
    };
    view_id_of_relid(relid)
}

/// The name view `view_id`'s quarantine entries carry (`_views.known_name`).
pub fn known_name(view_id: i32) -> EvResult<Option<String>> {
    spi::one::<String>(
        "SELECT known_name FROM eventview._views WHERE view_id = $1",
        &[view_id.into()],
    )
}

/// The relation of view `view_id`, if it is catalogued.
pub fn view_relid_if_any(view_id: i32) -> EvResult<Option<pg_sys::Oid>> {
    spi::one::<pg_sys::Oid>(
        "SELECT relid::oid FROM eventview._views WHERE view_id = $1",
        &[view_id.into()],
    )
}

/// The relation of view `view_id` (22023 when it is not catalogued).
pub fn view_relid(view_id: i32) -> EvResult<pg_sys::Oid> {
    view_relid_if_any(view_id)?
        .ok_or_else(|| EvError::invalid(format!("view {view_id} is not catalogued")))
}

/// The id of the view whose relation is `relid`, its catalog row locked (a refresh in
/// progress finishes first); None for a relation that is no view.
pub fn lock_view_id(relid: pg_sys::Oid) -> EvResult<Option<i32>> {
    spi::one::<i32>(
        "SELECT view_id FROM eventview._views WHERE relid = $1::regclass FOR UPDATE",
        &[relid.into()],
    )
}

/// Whether the view is read as stored groups or realtime, and its bucket width as text.
pub fn view_reads(view_id: i32) -> EvResult<(bool, Option<String>)> {
    Ok(Spi::connect(|client| {
        let row = client
            .select(
                "SELECT realtime, time_bucket::text FROM eventview._views WHERE view_id = $1",
                Some(1),
                &[view_id.into()],
            )?
            .first();
        Ok::<_, pgrx::spi::SpiError>((row.get::<bool>(1)?.unwrap_or(false), row.get::<String>(2)?))
    })?)
}

pub fn set_on_type_error(view_id: i32, policy: &str) -> EvResult<()> {
    spi::run(
        "UPDATE eventview._views SET on_type_error = $2 WHERE view_id = $1",
        &[view_id.into(), policy.into()],
    )
}

pub fn set_realtime(view_id: i32, realtime: bool) -> EvResult<()> {
    spi::run(
        "UPDATE eventview._views SET realtime = $2 WHERE view_id = $1",
        &[view_id.into(), realtime.into()],
    )
}

/// How many rows the view's min/max value logs hold, as counted by its refreshes.
pub fn extremes_logged(view_id: i32) -> EvResult<i64> {
    Ok(spi::one::<i64>(
        "SELECT extremes_logged FROM eventview._views WHERE view_id = $1",
        &[view_id.into()],
    )?
    .unwrap_or(0))
}

/// The note `eventview.views` shows until the view is rebuilt (None clears it).
pub fn set_rebuild_note(view_id: i32, note: Option<&str>) -> EvResult<()> {
    spi::run(
        "UPDATE eventview._views SET rebuild_note = $2 WHERE view_id = $1",
        &[view_id.into(), note.into()],
    )
}

/// The owner the catalog records for view `view_id` and the owner of its relation, its row
/// locked (a refresh of it running now finishes first); None for an unknown view or one whose
/// relation is gone.
pub fn lock_view_owners(view_id: i32) -> EvResult<Option<(pg_sys::Oid, pg_sys::Oid)>> {
    let owners = spi::one::<Vec<pg_sys::Oid>>(
        "SELECT ARRAY[v.owner::oid, c.relowner] FROM eventview._views v
         JOIN pg_catalog.pg_class c ON c.oid = v.relid::oid
         WHERE v.view_id = $1 FOR UPDATE OF v",
        &[view_id.into()],
    )?;
    Ok(owners.and_then(|o| match o[..] {
        [recorded, relation] => Some((recorded, relation)),
        _ => None,
    }))
}

/// What a change of view `view_id`'s owner needs of its catalog row: its event table (id, and
/// relation, 0 once dropped) and whether it is a rollup or rollups read it. From the row alone:
/// the view's definition is not loaded (it may no longer load, its event table gone).
pub struct ViewRelations {
    pub source_id: i32,
    pub source_relid: pg_sys::Oid,
    pub in_rollup_chain: bool,
}

pub fn view_relations(view_id: i32) -> EvResult<Option<ViewRelations>> {
    let row = spi::one::<Vec<i64>>(
        "SELECT ARRAY[v.source_id::bigint, s.relid::oid::bigint,
                      (v.source_view IS NOT NULL OR v.feeds_rollups)::int::bigint]
         FROM eventview._views v JOIN eventview._sources s USING (source_id)
         WHERE v.view_id = $1",
        &[view_id.into()],
    )?;
    Ok(row.and_then(|r| match r[..] {
        [source_id, relid, chain] => Some(ViewRelations {
            source_id: source_id as i32,
            source_relid: pg_sys::Oid::from(relid as u32),
            in_rollup_chain: chain != 0,
        }),
        _ => None,
    }))
}

/// Records `owner` as the owner of view `view_id`.
pub fn set_view_owner(view_id: i32, owner: pg_sys::Oid) -> EvResult<()> {
    spi::run(
        "UPDATE eventview._views SET owner = $2::regrole WHERE view_id = $1",
        &[view_id.into(), owner.into()],
    )
}

/// The owner of the view with id `view_id` (None for an unknown view).
pub fn view_owner(view_id: i32) -> EvResult<Option<pg_sys::Oid>> {
    spi::one::<pg_sys::Oid>(
        "SELECT owner::oid FROM eventview._views WHERE view_id = $1",
        &[view_id.into()],
    )
}

/// A view's relation, owner and event table, and whether that table still exists; None for
/// an unknown view. Read from the catalog only (`eventview.views` reads it for anyone).
pub struct ViewTable {
    pub relid: Option<pg_sys::Oid>,
    pub owner: Option<pg_sys::Oid>,
    pub source_relid: Option<pg_sys::Oid>,
    pub table_exists: Option<bool>,
}

pub fn view_table(view_id: i32) -> EvResult<Option<ViewTable>> {
    Ok(Spi::connect(|client| {
        let t = crate::pg::plan_cache::select(
            client,
            "SELECT v.relid::oid, v.owner::oid, s.relid::oid,
                    EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = s.relid::oid)
             FROM eventview._views v JOIN eventview._sources s USING (source_id)
             WHERE v.view_id = $1",
            Some(1),
            &[view_id.into()],
        )?;
        if t.is_empty() {
            return Ok::<_, pgrx::spi::SpiError>(None);
        }
        let row = t.first();
        Ok(Some(ViewTable {
            relid: row.get::<pg_sys::Oid>(1)?,
            owner: row.get::<pg_sys::Oid>(2)?,
            source_relid: row.get::<pg_sys::Oid>(3)?,
            table_exists: row.get::<bool>(4)?,
        }))
    })?)
}

// ---- Forgetting a view ----

/// A view's catalog facts that forgetting it needs.
pub struct ForgottenView {
    pub view_id: i32,
    pub source_id: i32,
    pub owner: pg_sys::Oid,
    /// None when the owner role is gone.
    pub owner_name: Option<String>,
    pub source_relid: pg_sys::Oid,
    /// A rollup: the view it read.
    pub source_view: Option<i32>,
}

/// Locks the view's catalog row, deletes its quarantine entries (unless another view has the
/// same name: a view dropped behind the API's back and made again under its name shares
/// them) and the row itself, and returns what the rest of forgetting the view needs; None
/// for a view already forgotten. The row is taken before the quarantine rows, as a refresh
/// takes them (the other order deadlocks with one).
pub fn delete_view(view_id: i32) -> EvResult<Option<ForgottenView>> {
    let row = Spi::connect_mut(|client| {
        let t = crate::pg::plan_cache::execute(
            client,
            "SELECT w.source_id, w.known_name, w.owner::oid, o.rolname::text, s.relid::oid, w.source_view
             FROM eventview._views w
             JOIN eventview._sources s ON s.source_id OPERATOR(pg_catalog.=) w.source_id
             LEFT JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) w.owner::oid
             WHERE w.view_id OPERATOR(pg_catalog.=) $1
             FOR UPDATE OF w",
            Some(1),
            &[view_id.into()],
            crate::pg::plan_cache::Plans::Generic,
        )?;
        if t.is_empty() {
            return Ok::<_, pgrx::spi::SpiError>(None);
        }
        let row = t.first();
        Ok(Some((
            row.get::<i32>(1)?,
            row.get::<String>(2)?,
            row.get::<pg_sys::Oid>(3)?,
            row.get::<String>(4)?,
            row.get::<pg_sys::Oid>(5)?,
            row.get::<i32>(6)?,
        )))
    })?;
    let Some((
        Some(source_id),
        known_name,
        Some(owner),
        owner_name,
        Some(source_relid),
        source_view,
    )) = row
    else {
        return Ok(None);
    };
    spi::run(
        "DELETE FROM eventview.quarantine
         WHERE view_name OPERATOR(pg_catalog.=) $2 AND source OPERATOR(pg_catalog.=) $3::regclass
           AND NOT EXISTS (SELECT 1 FROM eventview._views o
                           WHERE o.known_name OPERATOR(pg_catalog.=) $2
                             AND o.view_id OPERATOR(pg_catalog.<>) $1)",
        &[view_id.into(), known_name.into(), source_relid.into()],
    )?;
    spi::run(
        "DELETE FROM eventview._views WHERE view_id OPERATOR(pg_catalog.=) $1",
        &[view_id.into()],
    )?;
    Ok(Some(ForgottenView {
        view_id,
        source_id,
        owner,
        owner_name,
        source_relid,
        source_view,
    }))
}

/// The storage tables of a view that exist (`_v<id>_data`, `_v<id>_m<n>`, `_v<id>_m<n>_log`,
/// `_v<id>_changes`),
/// as quoted qualified names: the logs and multisets before the data (none depends on
/// another; the same order every time keeps two drops from waiting on each other).
pub fn storage_tables(view_id: i32) -> EvResult<Vec<String>> {
    Ok(spi::one::<Vec<String>>(
        "SELECT coalesce(pg_catalog.array_agg(c.oid::pg_catalog.regclass::text
                                              ORDER BY c.relname OPERATOR(pg_catalog.~) '_data$', c.relname), '{}')
         FROM pg_catalog.pg_class c
         WHERE c.relnamespace OPERATOR(pg_catalog.=) 'eventview'::pg_catalog.regnamespace
           AND c.relkind OPERATOR(pg_catalog.=) 'r'
           AND c.relname OPERATOR(pg_catalog.~) pg_catalog.format('^_v%s_(data|changes|m[0-9]+(_log)?)$', $1)",
        &[view_id.into()],
    )?
    .unwrap_or_default())
}

/// Whether the owner of a forgotten view still needs to read the changelog of its event table:
/// another view of theirs reads the table, or they own the table. False when the changelog is
/// gone.
pub fn owner_still_reads_changelog(view: &ForgottenView) -> EvResult<bool> {
    Ok(spi::one::<bool>(
        "SELECT pg_catalog.to_regclass(pg_catalog.format('eventview._changes_%s', $1)) IS NULL
             OR EXISTS (SELECT 1 FROM eventview._views w
                        WHERE w.source_id OPERATOR(pg_catalog.=) $1
                          AND w.owner::oid OPERATOR(pg_catalog.=) $2)
             OR EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                        WHERE c.oid OPERATOR(pg_catalog.=) $3
                          AND c.relowner OPERATOR(pg_catalog.=) $2)",
        &[
            view.source_id.into(),
            view.owner.into(),
            view.source_relid.into(),
        ],
    )?
    .unwrap_or(true))
}

/// Whether an event table whose relation is gone has no view left: then it is forgotten too.
pub fn dropped_source_unread(source_id: i32, source_relid: pg_sys::Oid) -> EvResult<bool> {
    Ok(spi::one::<bool>(
        "SELECT NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) $2)
            AND NOT EXISTS (SELECT 1 FROM eventview._views w WHERE w.source_id OPERATOR(pg_catalog.=) $1)",
        &[source_id.into(), source_relid.into()],
    )?
    .unwrap_or(false))
}
