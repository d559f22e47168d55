//! Event tables: creating one (envelope DDL, changelog, capture triggers), forgetting one that
//! is gone, and pruning its raw events past retention.

use crate::catalog;
use crate::citus;
use crate::errors::{EvError, EvResult};
use crate::gucs;
use crate::partitions;
use crate::pg::node_local;
use crate::pg::roles;
use crate::pg::spi;
use crate::privileges;
use crate::relation;
use eventview_core::{envelope_sql, names};
use pgrx::datum::Interval;
use pgrx::prelude::*;

/// Creates an event table: a plain one, or with `partition_interval` one partitioned by range
/// on `occurred_at` (see `partitions`), with its default partition and its partitions from the
/// present one through `eventview.partition_premake` ahead.
pub fn create_event_table(
    name: &str,
    retention: Option<Interval>,
    delta_retention: Option<Interval>,
    partition_interval: Option<Interval>,
) -> EvResult<pg_sys::Oid> {
    require_retentions(&retention, &delta_retention)?;
    if let Some(interval) = &partition_interval {
        partitions::new_length_of(interval)?;
    }
    let quoted = relation::qualified_for_create(name)?;
    refuse_schema(&quoted, "create")?;
    // The table is the caller's: created in their name, with their rights on the schema.
    let ddl = match partition_interval {
        Some(_) => envelope_sql::create_partitioned_event_table(&quoted),
        None => envelope_sql::create_event_table(&quoted),
    };
    roles::as_caller(|| spi::run_all(&[ddl]))?;
    let relid = relation::created(&quoted)?;
    if partition_interval.is_some() {
        roles::as_caller(|| partitions::create_default_partition(relid))?;
    }
    start_capture(
        relid,
        retention,
        delta_retention,
        partition_interval,
        partition_interval.is_some(),
    )?;
    if partition_interval.is_some() {
        let source = catalog::source_by_relid(relid)?
            .ok_or_else(|| EvError::invalid("the event table just created is not registered"))?;
        partitions::make_partitions(&source)?;
    }
    Ok(relid)
}

/// Adopts an existing table as an event table (API.md section 7): a permanent plain table with
/// the envelope columns of section 1 (names, types, NOT NULL; other columns are ignored) and
/// unique indexes on `event_id` and `event_key` (refresh reads events by id; ingest finds
/// duplicates by key), or a table partitioned by range on `occurred_at` with those columns, a
/// unique index on `(event_id, occurred_at)` and unique keys, which then gets a key table (see
/// `require_adoptable`). Its owner (or a member of that role) registers it. Capture starts at
/// once: the capture triggers are created under a lock that waits for the transactions writing
/// the table, so every row is either there before capture (read by a view's first build) or
/// captured, never neither, while producers keep writing. The rows already there are included by
/// every view created later, exactly once; the field observer observes changes from
/// registration on.
pub fn register_event_table(
    name: &str,
    retention: Option<Interval>,
    delta_retention: Option<Interval>,
) -> EvResult<pg_sys::Oid> {
    require_retentions(&retention, &delta_retention)?;
    let relid = relation::resolve(name)?;
    let table = relation::qualified(relid)?;
    if catalog::source_by_relid(relid)?.is_some() {
        return Err(EvError::new(
            PgSqlErrorCode::ERRCODE_DUPLICATE_OBJECT,
            format!(
                "{} is an event table already",
                relation::regclass_text(relid)?
            ),
        )
        .with_hint("Its capture runs; create views over it with eventview.create_view."));
    }
    privileges::require_table_owner(relid, "register")?;
    refuse_schema(&table, "register")?;
    if let Some(relid) = citus::register_managed(relid, &retention, delta_retention)? {
        return Ok(relid);
    }
    // The lock CREATE TRIGGER takes anyway, taken before the checks so that nothing changes the
    // table between them and the capture (producers wait from here until the call commits).
    roles::as_caller(|| {
        spi::run_all(&[format!("LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")])
    })?;
    let partitioned = require_adoptable(relid)?;
    start_capture(relid, retention, delta_retention, None, partitioned)?;
    Ok(relid)
}

/// Raw events are kept for a positive time; applied changelog records may go at once
/// (`delta_retention => '0 seconds'`): a record every consumer has applied is never read again.
pub fn require_retentions(
    retention: &Option<Interval>,
    delta_retention: &Option<Interval>,
) -> EvResult<()> {
    for (arg, value, least, rule) in [
        ("retention", retention, ">", "a positive interval"),
        (
            "delta_retention",
            delta_retention,
            ">=",
            "zero or a positive interval",
        ),
    ] {
        if let Some(v) = value {
            let allowed =
                spi::one::<bool>(&format!("SELECT $1 {least} interval '0'"), &[(*v).into()])?;
            if allowed != Some(true) {
                return Err(EvError::invalid(format!(
                    "invalid {arg}: it must be {rule}"
                )));
            }
        }
    }
    Ok(())
}

/// The catalog row, changelog and capture of a new event table. The changelog (and the key
/// table of a partitioned one) belongs to the extension owner: producers and readers never
/// write it. The capture functions (SECURITY DEFINER, so producers need no right on the
/// changelog) belong to the table's owner, who may write, read and prune its changelog: they
/// run the table's own types and casts, which must never run with more rights than the table's
/// owner has.
fn start_capture(
    relid: pg_sys::Oid,
    retention: Option<Interval>,
    delta_retention: Option<Interval>,
    partition_interval: Option<Interval>,
    partitioned: bool,
) -> EvResult<()> {
    // The capture functions are this node's own (see `pg::node_local`).
    node_local::on_this_node_only(|| {
        start_capture_here(
            relid,
            retention,
            delta_retention,
            partition_interval,
            partitioned,
        )
    })
}

fn start_capture_here(
    relid: pg_sys::Oid,
    retention: Option<Interval>,
    delta_retention: Option<Interval>,
    partition_interval: Option<Interval>,
    partitioned: bool,
) -> EvResult<()> {
    let source_id = catalog::insert_source(relid, retention, delta_retention, partition_interval)?;
    let table_sql = relation::qualified(relid)?;
    spi::run_all(&envelope_sql::create_changelog(
        source_id,
        gucs::changelog_first_segment(),
    ))?;
    let first = eventview_core::changelog_segments::FIRST_SEQ;
    catalog::note_segment_made(source_id, first, first)?;
    let owner = privileges::role_ident(privileges::table_owner(relid)?)?;
    spi::run_all(&[format!(
        "GRANT SELECT, INSERT, DELETE ON {} TO {owner}",
        names::changelog(source_id)
    )])?;
    if partitioned {
        spi::run_all(&envelope_sql::create_partitioned_capture(
            source_id, &table_sql,
        ))?;
        // The keys of the rows there already (a registered table's; checked to be unique).
        spi::run_all(&[
            format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {owner}",
                names::key_table(source_id)
            ),
            format!(
                "INSERT INTO {} (event_key, occurred_at)
                 SELECT event_key, occurred_at FROM {table_sql} WHERE event_key IS NOT NULL",
                names::key_table(source_id)
            ),
        ])?;
    } else {
        spi::run_all(&envelope_sql::create_capture(source_id, &table_sql))?;
    }
    spi::run_all(&envelope_sql::capture_owner(source_id, &owner, partitioned))?;
    if partitioned {
        let source = catalog::source_by_relid(relid)?
            .ok_or_else(|| EvError::invalid("the event table just registered is missing"))?;
        partitions::capture_tree(&source)?;
    }
    Ok(())
}

/// A table that `register_event_table` may adopt (22023 naming what is missing, 42809 for what is
/// not a table, 0A000 for what is not supported): a permanent plain table outside any
/// partitioning or inheritance tree, or the root of a tree partitioned by range on
/// `occurred_at`. Returns whether it is partitioned.
fn require_adoptable(relid: pg_sys::Oid) -> EvResult<bool> {
    let name = relation::regclass_text(relid)?;
    // (A temporary table was refused by refuse_schema.) relkind, relpersistence, whether the
    // table is a partition, whether it is in an inheritance tree.
    let class = spi::one::<String>(
        "SELECT c.relkind::text || c.relpersistence::text || c.relispartition::text || ','
                || EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i
                           WHERE i.inhrelid = c.oid OR i.inhparent = c.oid)::text
         FROM pg_catalog.pg_class c WHERE c.oid = $1",
        &[relid.into()],
    )?
    .unwrap_or_default();
    let (kind, persistence) = (class.get(..1), class.get(1..2));
    let is_partition = class.get(2..).is_some_and(|rest| rest.starts_with("true"));
    let in_a_tree = class.ends_with(",true");
    let partitioned = match kind {
        Some("r" | "p") if is_partition => {
            return Err(EvError::new(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                format!("cannot register {name}: it is a partition of another table"),
            )
            .with_hint("Register the partitioned table it belongs to: its capture covers every partition."))
        }
        Some("r") if persistence == Some("u") => {
            return Err(EvError::new(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                format!("cannot register {name}: it is unlogged"),
            )
            .with_hint("A crash empties an unlogged table without a record of the rows it loses, which its views would keep: ALTER TABLE ... SET LOGGED first."))
        }
        Some("r") if in_a_tree => {
            return Err(EvError::new(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                format!("cannot register {name}: it is a parent or child in an inheritance tree"),
            )
            .with_hint("Capture sees the rows written through the table itself only; register a table outside any inheritance tree."))
        }
        Some("r") => false,
        Some("p") => {
            if catalog::range_partition_column(relid)?.as_deref() != Some("occurred_at") {
                return Err(EvError::invalid(format!(
                    "cannot register {name} as an event table: it is not partitioned by range on occurred_at"
                ))
                .with_hint("A partitioned event table is PARTITION BY RANGE (occurred_at), as pg_partman's time-based partitioning makes it."));
            }
            true
        }
        _ => {
            return Err(EvError::new(
                PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
                format!("cannot register {name}: it is not a table"),
            )
            .with_hint("An event table is a table with the envelope columns."))
        }
    };
    let columns = catalog::table_columns(relid)?;
    if let Some(problem) = envelope_sql::envelope_problem(&columns) {
        return Err(EvError::invalid(format!("cannot register {name} as an event table: {problem}"))
            .with_hint("An event table has the envelope columns of create_event_table, with those names, types and NOT NULL constraints; other columns are allowed."));
    }
    let table = relation::qualified(relid)?;
    if partitioned {
        // A unique index of a partitioned table includes its partition key.
        if !catalog::has_unique_index_leading(relid, "event_id", &["event_id", "occurred_at"])? {
            return Err(EvError::invalid(format!(
                "cannot register {name} as an event table: no unique index on (event_id, occurred_at)"
            ))
            .with_hint(format!(
                "Refreshes read events by event_id: ALTER TABLE {table} ADD PRIMARY KEY (event_id, occurred_at)."
            )));
        }
        // event_key is kept unique by the key table the registration fills.
        if let Some(key) = spi::one::<String>(
            &format!(
                "SELECT event_key FROM {table} WHERE event_key IS NOT NULL
                 GROUP BY event_key HAVING pg_catalog.count(*) > 1 LIMIT 1"
            ),
            &[],
        )? {
            return Err(EvError::invalid(format!(
                "cannot register {name} as an event table: its event_key {} is not unique",
                eventview_core::quote::literal(&key)
            ))
            .with_hint("An event table stores each event_key once; remove the duplicates (or set their event_key to NULL) first."));
        }
        return Ok(true);
    }
    for column in ["event_id", "event_key"] {
        if !catalog::has_unique_index_on(relid, column)? {
            return Err(EvError::invalid(format!(
                "cannot register {name} as an event table: no unique index on {column} alone"
            ))
            .with_hint(format!(
                "Refreshes read events by event_id, and ingest finds duplicates by event_key with ON CONFLICT: CREATE UNIQUE INDEX ON {table} ({column}) (not deferrable, not NULLS NOT DISTINCT)."
            )));
        }
    }
    Ok(false)
}

/// Schemas an event table cannot be in: the extension's own (`DROP SCHEMA eventview CASCADE`
/// removes what is in it, events included, and everything else there is the extension's) and a
/// temporary one
/// (the table would go with the session, leaving its changelog and catalog row behind).
pub fn refuse_schema(quoted: &str, action: &str) -> EvResult<()> {
    let parts = eventview_core::quote::split_name(quoted).unwrap_or_default();
    let Some(schema) = parts.first().filter(|_| parts.len() == 2) else {
        return Ok(());
    };
    if schema == names::SCHEMA {
        return Err(EvError::invalid(format!("cannot {action} an event table in schema {}", names::SCHEMA))
            .with_hint("That schema holds the extension's own objects, and DROP SCHEMA eventview CASCADE takes what is in it; use a schema of your own."));
    }
    relation::refuse_temporary(quoted, "an event table")
}

/// Forgets an event table that is gone or going: what was recorded about it (drift,
/// quarantine, observed fields, field declarations; its regclass would dangle), its changelog
/// and its capture functions. No view may read it any more. A no-op for a forgotten table.
pub fn forget_source(source_id: i32) -> EvResult<()> {
    // Forgotten already (by the sql_drop event trigger of the DROP TABLE drop_event_table ran):
    // nothing left to drop, and no "does not exist, skipping" notices.
    match catalog::source_state(source_id)? {
        catalog::SourceState::Forgotten => return Ok(()),
        catalog::SourceState::TableExists => {
            return Err(EvError::new(
                PgSqlErrorCode::ERRCODE_OBJECT_IN_USE,
                format!("event table {source_id} still exists"),
            )
            .with_hint("Drop event tables with eventview.drop_event_table."))
        }
        catalog::SourceState::TableGone => {}
    }
    catalog::delete_drift_and_quarantine(source_id)?;
    node_local::run_all(&envelope_sql::drop_capture(
        source_id,
        catalog::has_key_table(source_id),
    ))?;
    catalog::delete_source(source_id)
}

/// Deletes raw events older than `retention` from an event table, in batches of 10,000, at most
/// `max_rows`; returns how many. Runs as the table's owner, security-restricted: the table's
/// own triggers and rules fire with its owner's rights, never with those of whoever runs
/// maintenance (the worker is a superuser). The caller (prune) has switched capture off for
/// these rows (`eventview.pruning`).
///
/// Pruning is not a retraction, so an event stays while some view has not applied an update of
/// it: that view would retract the old version it aggregated and find no new one to add. An
/// update that gives the row a new event_id (`SET event_id = DEFAULT`) logs the new id as
/// inserted, in the same transaction as its 'U' record: those ids are kept too. Each
/// batch first locks rows past retention that have no such update (skipping rows an unfinished
/// transaction is changing), then, in a statement whose snapshot sees every update that
/// committed before the lock, deletes those that still have none. A later update of a locked
/// row waits for the prune and then finds it gone, so it logs nothing. Rows kept for a view
/// are left out of the next batches' candidates, so they never stop the pruning of the others.
///
/// A partitioned event table drops its partitions past retention instead
/// (`partitions::drop_expired`); only its default partition has rows deleted.
pub fn prune_events(relid: pg_sys::Oid, retention: Interval, max_rows: i64) -> EvResult<i64> {
    privileges::require_table_owner(relid, "prune")?;
    let owner = privileges::table_owner(relid)?;
    let source = catalog::source_by_relid(relid)?.ok_or_else(|| {
        EvError::invalid(format!(
            "{} is not an event table",
            relation::regclass_text(relid).unwrap_or_default()
        ))
    })?;
    let mut dropped = 0;
    let table = if crate::pg::relcache::is_partitioned(relid) {
        dropped = partitions::drop_expired(&source, retention)?;
        match partitions::default_partition(relid)? {
            Some(default) => default,
            None => return Ok(dropped),
        }
    } else {
        relation::qualified(relid)?
    };
    // Events with an update some view has not applied (the changelog's xid index bounds the
    // scan by the oldest view's position): the ids of its 'U' records, and the ids its
    // transactions logged as inserted, which include the new ids of rows an update moved.
    // Tested by anti-joins, not NOT IN: a NOT IN over more ids than fit in work_mem is not
    // hashed and would compare every candidate with every id.
    let updated = format!(
        "consumers AS (
             SELECT applied_snapshot AS s, applied_own_xid AS own, applied_own_seq AS own_seq
             FROM eventview._views WHERE source_id = {sid} AND source_view IS NULL
         ),
         updates AS MATERIALIZED (
             SELECT c.xid, c.event_id FROM {log} c
             WHERE c.xid >= (SELECT min(pg_catalog.pg_snapshot_xmin(s)) FROM consumers)
               AND c.op = 'U'
               AND EXISTS (SELECT 1 FROM consumers k WHERE NOT {applied})
         ),
         updated AS MATERIALIZED (
             SELECT event_id FROM updates WHERE event_id IS NOT NULL
             UNION ALL
             SELECT pg_catalog.unnest(c.event_ids) FROM {log} c
             WHERE c.xid IN (SELECT xid FROM updates) AND c.op = 'I'
         )",
        applied = eventview_core::batch::applied_by("k.s", "k.own", "k.own_seq"),
        sid = source.source_id,
        log = names::changelog(source.source_id)
    );
    let lock = format!(
        "WITH {updated}
         SELECT coalesce(pg_catalog.array_agg(event_id), '{{}}') FROM
             (SELECT t.event_id FROM {table} t
              WHERE occurred_at < now() - $1
                AND NOT EXISTS (SELECT 1 FROM updated u WHERE u.event_id = t.event_id)
              LIMIT $2 FOR UPDATE SKIP LOCKED) old"
    );
    let delete = format!(
        "WITH {updated},
         gone AS (DELETE FROM {table} t WHERE t.event_id = ANY ($1)
                    AND NOT EXISTS (SELECT 1 FROM updated u WHERE u.event_id = t.event_id) RETURNING 1)
         SELECT count(*) FROM gone"
    );
    // The cutoff `now() - retention`, in the lock statement and in the delete capture's
    // exemption of pruned rows, is computed in UTC whatever the session's time zone, as
    // rebuild's horizon is (`catalog::retention_horizon`).
    roles::as_role_with_setting(owner, c"TimeZone", c"UTC", || {
        let mut done: i64 = dropped;
        loop {
            let want = (max_rows - done).min(10_000);
            if want <= 0 {
                return Ok(done);
            }
            let locked = spi::one_replanned::<Vec<i64>>(&lock, &[retention.into(), want.into()])?
                .unwrap_or_default();
            // (Counted with RETURNING: the capture trigger's own SPI use resets the row count.)
            let n = spi::one_replanned::<i64>(&delete, &[locked.clone().into()])?.unwrap_or(0);
            done += n;
            if (locked.len() as i64) < want || n == 0 {
                return Ok(done);
            }
        }
    })
}
