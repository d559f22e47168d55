//! Partitioned event tables (API.md section 7): partitions made ahead of time, the capture of
//! every partition, and retention by dropping whole partitions.
//!
//! A table made by `create_event_table(..., partition_interval)` is partitioned by range on
//! `occurred_at`, one partition per interval (`eventview_core::partitions` has their bounds and
//! names), plus a default partition that takes every event outside the partitions made so far:
//! a producer never gets an error for an event's time. `run_maintenance` keeps
//! `eventview.partition_premake` partitions made ahead of the present one; one whose range
//! holds events in the default partition (events from the future) takes them over when it is
//! made.
//!
//! Capture: a statement writing a partition directly fires that partition's statement triggers,
//! not the root's, so every member of the tree has the capture and key triggers
//! (`envelope_sql::partition_capture`). Partitions made by anyone (this module, `CREATE TABLE
//! ... PARTITION OF`, `ATTACH PARTITION`, pg_partman) get them from the event trigger
//! `eventview_follow_partitions`; rows a table brings along when it is attached are logged as
//! inserted, since views have never seen them.

use crate::catalog::{self, Source};
use crate::errors::{EvError, EvResult};
use crate::gucs;
use crate::pg::{locks, roles, spi};
use crate::privileges;
use eventview_core::{batch, envelope_sql, names, partitions as layout};
use pgrx::datum::Interval;
use pgrx::prelude::*;

/// The members of the partition tree below `$1` (itself included) as `tree(relid, level)`,
/// read from `pg_inherits` without the locks `pg_partition_tree` takes on every member: the
/// event trigger runs inside other sessions' DDL (a parallel restore's, each holding some
/// partition), and a lock on every partition there deadlocks.
const TREE: &str = "WITH RECURSIVE tree(relid, level) AS (
         SELECT $1::pg_catalog.oid, 0
         UNION ALL
         SELECT i.inhrelid, t.level + 1 FROM pg_catalog.pg_inherits i JOIN tree t ON i.inhparent = t.relid)";

thread_local! {
    /// Set while `take_over_from_default` has the default partition detached: that partition
    /// keeps its capture (`follow_partitions` leaves it alone).
    static MOVING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The partition `drop_expired` is dropping, checked and its keys forgotten under the lock
    /// the drop takes: `before_removal` does not do it again (for a leaf; the leaves of a
    /// partitioned one it checks).
    static DROPPING_CHECKED: std::cell::Cell<pg_sys::Oid> =
        const { std::cell::Cell::new(pg_sys::InvalidOid) };
}

/// Microseconds since 2000-01-01 UTC of a `timestamptz` expression of the statement (EXTRACT's
/// numeric is exact; the grammar makes it `pg_catalog.extract` whatever the search_path).
const MICROS_SINCE_2000: &str =
    "((EXTRACT(epoch FROM {}) OPERATOR(pg_catalog.-) 946684800) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8";

fn micros_since_2000(expression: &str) -> String {
    MICROS_SINCE_2000.replace("{}", expression)
}

/// The partition length of a table's `partition_interval` (22023 saying why it is not one).
pub fn length_of(interval: &Interval) -> EvResult<i64> {
    layout::length_micros(interval.months(), interval.days(), interval.micros())
        .map_err(invalid_partition_interval)
}

/// The partition length of the `partition_interval` of a table being made: `length_of`, and at
/// least a minute (`layout::new_length_micros`).
pub fn new_length_of(interval: &Interval) -> EvResult<i64> {
    layout::new_length_micros(interval.months(), interval.days(), interval.micros())
        .map_err(invalid_partition_interval)
}

fn invalid_partition_interval(why: String) -> EvError {
    EvError::invalid(format!("invalid partition_interval: {why}")).with_hint(
        "A partition covers a fixed length of time: minutes, hours, days or weeks, such as '1 day' or '1 hour'.",
    )
}

/// One member of a partitioned event table's tree, directly below its root.
struct Partition {
    relid: pg_sys::Oid,
    /// Quoted, qualified name.
    name_sql: String,
    is_default: bool,
    /// `[from, to)` in microseconds since 2000-01-01 UTC; None for MINVALUE / MAXVALUE.
    from: Option<i64>,
    to: Option<i64>,
}

impl Partition {
    fn overlaps(&self, from: i64, to: i64) -> bool {
        !self.is_default && self.from.is_none_or(|lo| lo < to) && self.to.is_none_or(|hi| hi > from)
    }
}

/// The partitions directly below `root`, with their bounds. The bounds are read back from the
/// text of `pg_get_expr`, which the same session parses as it printed them.
fn partitions_of(root: pg_sys::Oid) -> EvResult<Vec<Partition>> {
    // An infinite bound is no bound, as MINVALUE and MAXVALUE (which have no quotes) are.
    let sql = format!(
        "SELECT c.oid, pg_catalog.format('%I.%I', n.nspname, c.relname), b.bound = 'DEFAULT',
                CASE WHEN pg_catalog.isfinite(t.lo) THEN {from} END,
                CASE WHEN pg_catalog.isfinite(t.hi) THEN {to} END
         FROM pg_catalog.pg_inherits i
         JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
         CROSS JOIN LATERAL (SELECT pg_catalog.pg_get_expr(c.relpartbound, c.oid) AS bound) b
         CROSS JOIN LATERAL (
             SELECT substring(b.bound FROM $r$FROM \\('([^']*)'\\)$r$)::pg_catalog.timestamptz AS lo,
                    substring(b.bound FROM $r$TO \\('([^']*)'\\)$r$)::pg_catalog.timestamptz AS hi) t
         WHERE i.inhparent = $1
         ORDER BY 4 NULLS FIRST",
        from = micros_since_2000("t.lo"),
        to = micros_since_2000("t.hi"),
    );
    Ok(Spi::connect(|client| {
        let mut out = Vec::new();
        for row in client.select(&sql, None, &[root.into()])? {
            let (Some(relid), Some(name_sql)) = (row.get::<pg_sys::Oid>(1)?, row.get::<String>(2)?)
            else {
                continue;
            };
            out.push(Partition {
                relid,
                name_sql,
                is_default: row.get::<bool>(3)?.unwrap_or(false),
                from: row.get::<i64>(4)?,
                to: row.get::<i64>(5)?,
            });
        }
        Ok::<_, pgrx::spi::SpiError>(out)
    })?)
}

fn now_micros() -> EvResult<i64> {
    spi::one::<i64>(
        &format!("SELECT {}", micros_since_2000("pg_catalog.now()")),
        &[],
    )?
    .ok_or_else(|| EvError::invalid("no current time"))
}

/// The schema and name of a relation, unquoted.
fn schema_and_name(relid: pg_sys::Oid) -> EvResult<(String, String)> {
    let row = spi::one::<Vec<String>>(
        "SELECT ARRAY[n.nspname::text, c.relname::text] FROM pg_catalog.pg_class c
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
        &[relid.into()],
    )?
    .unwrap_or_default();
    match row.as_slice() {
        [schema, name] => Ok((schema.clone(), name.clone())),
        _ => Err(EvError::invalid("the event table is gone")),
    }
}

/// The default partition of a partitioned event table, at its creation.
pub fn create_default_partition(relid: pg_sys::Oid) -> EvResult<()> {
    let (schema, name) = schema_and_name(relid)?;
    let table = crate::relation::qualified(relid)?;
    spi::run_all(&[layout::create_default_partition(
        &table,
        &schema,
        &layout::default_partition_name(&name),
    )])
}

/// Makes the partitions of `source` from the one holding the present through
/// `eventview.partition_premake` ahead (as the table's owner), skipping ranges a partition
/// covers already, and captures them. Returns how many it made (none for a table whose
/// partitions pg_eventview does not make).
pub fn make_partitions(source: &Source) -> EvResult<usize> {
    let Some(interval) = catalog::partition_interval(source.source_id)? else {
        return Ok(0);
    };
    let length = length_of(&interval)?;
    let owner = privileges::table_owner(source.relid)?;
    let (schema, name) = schema_and_name(source.relid)?;
    let now = now_micros()?;
    let ahead = i64::from(gucs::PARTITION_PREMAKE.get()).saturating_mul(length);
    let mut made = 0;
    let mut present = partitions_of(source.relid)?;
    for start in layout::starts_covering(now, now.saturating_add(ahead), length) {
        let end = start.saturating_add(length);
        if present.iter().any(|p| p.overlaps(start, end)) {
            continue;
        }
        let partition = layout::partition_name(&name, start, length);
        let create = layout::create_partition(&source.table_sql, &schema, &partition, start, end);
        match present.iter().find(|p| p.is_default) {
            Some(default) if holds_rows_between(default, start, end)? => {
                struct Moved;
                impl Drop for Moved {
                    fn drop(&mut self) {
                        MOVING.set(false);
                    }
                }
                MOVING.set(true);
                let _moved = Moved;
                roles::as_role(owner, || {
                    take_over_from_default(source, default, &create, start, end)
                })?;
            }
            _ => roles::as_role(owner, || spi::run_all(&create))?,
        }
        made += 1;
        present = partitions_of(source.relid)?;
    }
    if made > 0 {
        follow_partitions(source)?;
    }
    Ok(made)
}

fn holds_rows_between(partition: &Partition, from: i64, to: i64) -> EvResult<bool> {
    Ok(spi::one::<bool>(
        &format!(
            "SELECT EXISTS (SELECT 1 FROM ONLY {} WHERE occurred_at >= {} AND occurred_at < {})",
            partition.name_sql,
            layout::utc_literal(from),
            layout::utc_literal(to)
        ),
        &[],
    )?
    .unwrap_or(false))
}

/// Makes a partition whose range holds events of the default partition, and moves them into it.
/// PostgreSQL cannot add such a partition while the default one holds its rows, so the default
/// partition is detached for the move and attached again. The events keep their ids and
/// contents: a move is no change, and runs with the user triggers of both partitions (capture
/// and keys included) disabled, under the ACCESS EXCLUSIVE locks the detach takes, so nobody
/// writes either meanwhile.
fn take_over_from_default(
    source: &Source,
    default: &Partition,
    create: &[String],
    from: i64,
    to: i64,
) -> EvResult<()> {
    let columns = spi::one::<String>(
        "SELECT pg_catalog.string_agg(pg_catalog.quote_ident(a.attname), ', ' ORDER BY a.attnum)
         FROM pg_catalog.pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped",
        &[source.relid.into()],
    )?
    .unwrap_or_default();
    let table = &source.table_sql;
    let default_sql = &default.name_sql;
    spi::run_all(&[format!(
        "ALTER TABLE {table} DETACH PARTITION {default_sql}"
    )])?;
    spi::run_all(create)?;
    let made = partitions_of(source.relid)?
        .into_iter()
        .find(|p| p.from == Some(from) && p.to == Some(to))
        .ok_or_else(|| EvError::invalid("the partition just made is missing"))?;
    let made_sql = &made.name_sql;
    let range = format!(
        "occurred_at >= {} AND occurred_at < {}",
        layout::utc_literal(from),
        layout::utc_literal(to)
    );
    spi::run_all(&[
        format!("ALTER TABLE {default_sql} DISABLE TRIGGER USER"),
        format!("ALTER TABLE {made_sql} DISABLE TRIGGER USER"),
        format!(
            "INSERT INTO {made_sql} ({columns}) SELECT {columns} FROM ONLY {default_sql} WHERE {range}"
        ),
        format!("DELETE FROM ONLY {default_sql} WHERE {range}"),
        format!("ALTER TABLE {made_sql} ENABLE TRIGGER USER"),
        format!("ALTER TABLE {default_sql} ENABLE TRIGGER USER"),
        format!("ALTER TABLE {table} ATTACH PARTITION {default_sql} DEFAULT"),
    ])
}

/// Keeps capture in step with `source`'s partition tree after DDL (the event trigger
/// `eventview_follow_partitions`, and this module's own changes):
/// - a table detached from the tree (ALTER TABLE ... DETACH PARTITION, pg_partman's retention)
///   goes only once every view has applied its events, else the command fails with 55000; it
///   loses its capture triggers, and its events' keys leave the key table;
/// - every member of the tree that lacks them gets the capture and key triggers. A leaf that has
///   rows already (a table attached with its contents) has them logged as inserted and its keys
///   taken.
///
/// Nothing happens while the root has no capture (a restore creates partitions, loads their
/// rows and only then creates the triggers it dumped).
pub fn follow_partitions(source: &Source) -> EvResult<()> {
    let captured = spi::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger g
                        WHERE g.tgrelid = $1 AND g.tgname = 'eventview_capture_insert')",
        &[source.relid.into()],
    )?;
    if captured != Some(true) {
        return Ok(());
    }
    if !MOVING.get() {
        release_detached(source)?;
    }
    capture_partitions(source, true)
}

/// The tables that carry `source`'s capture but are no longer in its tree: checked, their keys
/// forgotten, their capture triggers dropped.
fn release_detached(source: &Source) -> EvResult<()> {
    let detached = Spi::connect(|client| {
        let mut out = Vec::new();
        for row in client.select(
            &format!("{TREE}
             SELECT g.tgrelid, pg_catalog.format('%I.%I', n.nspname, c.relname), c.relkind = 'r'
             FROM pg_catalog.pg_trigger g
             JOIN pg_catalog.pg_class c ON c.oid = g.tgrelid
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE g.tgname = 'eventview_capture_insert'
               AND g.tgfoid = pg_catalog.to_regprocedure(pg_catalog.format('eventview._capture_%s_insert()', $2))
               AND g.tgrelid <> $1
               AND g.tgrelid NOT IN (SELECT t.relid FROM tree t)
             ORDER BY g.tgrelid"),
            None,
            &[source.relid.into(), source.source_id.into()],
        )? {
            if let (Some(relid), Some(name), Some(leaf)) = (
                row.get::<pg_sys::Oid>(1)?,
                row.get::<String>(2)?,
                row.get::<bool>(3)?,
            ) {
                out.push((relid, name, leaf));
            }
        }
        Ok::<_, pgrx::spi::SpiError>(out)
    })?;
    for (relid, name, leaf) in detached {
        if leaf {
            require_applied(source, &name, "detach")?;
            forget_keys_of(source, relid, &name)?;
        }
        let triggers = spi::one::<Vec<String>>(
            "SELECT coalesce(pg_catalog.array_agg(pg_catalog.format('DROP TRIGGER %I ON %s', g.tgname, $2)), '{}')
             FROM pg_catalog.pg_trigger g
             WHERE g.tgrelid = $1 AND g.tgname IN ('eventview_capture_insert', 'eventview_capture_update',
                                                   'eventview_capture_delete', 'eventview_capture_truncate',
                                                   'eventview_keys_update', 'eventview_keys_delete',
                                                   'eventview_keys_truncate')",
            &[relid.into(), name.as_str().into()],
        )?
        .unwrap_or_default();
        spi::run_all(&triggers)?;
    }
    Ok(())
}

/// The capture of a partitioned event table's tree as it starts (`create_event_table`,
/// `register_event_table`): every member gets the triggers; the rows there already are not
/// changes (a view's first build reads them), and their keys are in the key table already.
pub fn capture_tree(source: &Source) -> EvResult<()> {
    capture_partitions(source, false)
}

/// Gives every member of `source`'s partition tree that lacks them the capture and key triggers
/// (see `follow_partitions`); with `new_rows`, a leaf's rows are new events (a table attached
/// with its contents).
fn capture_partitions(source: &Source, new_rows: bool) -> EvResult<()> {
    let members = Spi::connect(|client| {
        let mut out = Vec::new();
        for row in client.select(
            &format!(
                "{TREE}
             SELECT t.relid, pg_catalog.format('%I.%I', n.nspname, c.relname), c.relkind = 'r'
             FROM tree t
             JOIN pg_catalog.pg_class c ON c.oid = t.relid
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE t.relid <> $1
               AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger g
                               WHERE g.tgrelid = t.relid AND g.tgname = 'eventview_capture_insert')
             ORDER BY t.level, t.relid"
            ),
            None,
            &[source.relid.into()],
        )? {
            if let (Some(relid), Some(name), Some(leaf)) = (
                row.get::<pg_sys::Oid>(1)?,
                row.get::<String>(2)?,
                row.get::<bool>(3)?,
            ) {
                out.push((relid, name, leaf));
            }
        }
        Ok::<_, pgrx::spi::SpiError>(out)
    })?;
    for (_, name, leaf) in members {
        spi::run_all(&envelope_sql::partition_capture(
            source.source_id,
            &name,
            leaf,
        ))?;
        if leaf && new_rows {
            spi::run_all(&[
                format!(
                    "INSERT INTO {} (op, event_ids)
                     SELECT 'I', pg_catalog.array_agg(event_id ORDER BY event_id) FROM ONLY {name}
                     HAVING pg_catalog.count(*) > 0",
                    names::changelog(source.source_id)
                ),
                format!(
                    "INSERT INTO {} (event_key, occurred_at)
                     SELECT event_key, occurred_at FROM ONLY {name} WHERE event_key IS NOT NULL",
                    names::key_table(source.source_id)
                ),
            ])?;
        }
    }
    Ok(())
}

/// Drops the partitions of `source` whose whole range lies before `now() - retention` and that
/// hold no event a view has not applied yet; returns how many events went with them. A
/// partition another session is using, or that some view still needs, is left to a later run.
/// Not a retraction: views keep what they aggregated. The dropped events' keys go from the
/// key table (a producer may send such a key again).
pub fn drop_expired(source: &Source, retention: Interval) -> EvResult<i64> {
    let owner = privileges::table_owner(source.relid)?;
    roles::as_role(owner, || drop_expired_as_owner(source, retention))
}

/// `drop_expired`, as the table's owner, who reads the changelog, writes the key table and
/// drops partitions.
fn drop_expired_as_owner(source: &Source, retention: Interval) -> EvResult<i64> {
    // In UTC, as the retention horizon of rebuild and of the delete capture's exemption.
    let cutoff = crate::pg::guc::with_setting(c"TimeZone", c"UTC", || {
        spi::one::<i64>(
            &format!(
                "SELECT {}",
                micros_since_2000("(pg_catalog.now() OPERATOR(pg_catalog.-) $1)")
            ),
            &[retention.into()],
        )
    })?
    .ok_or_else(|| EvError::invalid("no retention horizon"))?;
    let mut dropped = 0;
    for partition in partitions_of(source.relid)? {
        if partition.is_default || partition.to.is_none_or(|to| to > cutoff) {
            continue;
        }
        if !locks::lock_for_dropping_if_free(partition.relid) {
            pgrx::notice!(
                "pg_eventview: partition {} not dropped: another session is using it",
                partition.name_sql
            );
            continue;
        }
        let mut unapplied = false;
        for (_, leaf) in leaves_of(partition.relid)? {
            unapplied = unapplied || holds_unapplied_events(source, &leaf)?;
        }
        if unapplied {
            pgrx::notice!(
                "pg_eventview: partition {} not dropped yet: views have not applied all of its events",
                partition.name_sql
            );
            continue;
        }
        let name = &partition.name_sql;
        let events =
            spi::one::<i64>(&format!("SELECT pg_catalog.count(*) FROM {name}"), &[])?.unwrap_or(0);
        forget_keys_of(source, partition.relid, name)?;
        struct Checked;
        impl Drop for Checked {
            fn drop(&mut self) {
                DROPPING_CHECKED.set(pg_sys::InvalidOid);
            }
        }
        DROPPING_CHECKED.set(partition.relid);
        let checked = Checked;
        spi::run_all(&[format!("DROP TABLE {name}")])?;
        drop(checked);
        dropped += events;
    }
    Ok(dropped)
}

/// Whether `partition` (quoted) holds an event some view of `source` has not applied yet: an
/// inserted or updated event whose changelog record the view's position does not include. (A
/// deleted event's record carries the old row itself.)
fn holds_unapplied_events(source: &Source, partition: &str) -> EvResult<bool> {
    let sql = format!(
        "WITH consumers AS (
             SELECT applied_snapshot AS s, applied_own_xid AS own, applied_own_seq AS own_seq
             FROM eventview._views WHERE source_id = {sid} AND source_view IS NULL
         ),
         pending AS (
             SELECT c.op, c.event_ids, c.event_id FROM {log} c
             WHERE c.xid >= (SELECT pg_catalog.min(pg_catalog.pg_snapshot_xmin(s)) FROM consumers)
               AND c.op IN ('I', 'U')
               AND EXISTS (SELECT 1 FROM consumers k WHERE NOT {applied})
         )
         SELECT EXISTS (
             SELECT 1 FROM pending p
             CROSS JOIN LATERAL pg_catalog.unnest(CASE WHEN p.op = 'I' THEN p.event_ids
                                                       ELSE ARRAY[p.event_id] END) AS i(id)
             JOIN ONLY {partition} e ON e.event_id = i.id)",
        sid = source.source_id,
        log = names::changelog(source.source_id),
        applied = batch::applied_by("k.s", "k.own", "k.own_seq"),
    );
    Ok(spi::one::<bool>(&sql, &[])?.unwrap_or(true))
}

/// The default partition of a partitioned event table (quoted), if it has one.
pub fn default_partition(root: pg_sys::Oid) -> EvResult<Option<String>> {
    Ok(partitions_of(root)?
        .into_iter()
        .find(|p| p.is_default)
        .map(|p| p.name_sql))
}

/// Claims for the calling transaction the keys of `keys` that the partitioned event table
/// `relid` does not hold yet, in key order (bytewise, as every caller takes them: two callers
/// with the same keys wait for each other without deadlocking), and returns them. A key another
/// transaction holds uncommitted is waited for: a duplicate once it commits, claimed once it
/// rolls back. The caller (ingest, as its caller) needs INSERT on the table; the claims are
/// taken over by the key function when the events are inserted (`envelope_sql::key_function`).
pub fn claim_keys(relid: pg_sys::Oid, keys: Vec<Option<String>>) -> EvResult<Vec<String>> {
    let caller = roles::caller();
    let may_insert = spi::one::<bool>(
        "SELECT pg_catalog.has_table_privilege($1, $2, 'INSERT')",
        &[caller.into(), relid.into()],
    )?;
    if may_insert != Some(true) {
        return Err(EvError::new(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!(
                "permission denied to ingest into event table {}",
                crate::relation::regclass_text(relid)?
            ),
        )
        .with_hint("Its owner may grant INSERT on it."));
    }
    let source = catalog::source_by_relid(relid)?.ok_or_else(|| {
        EvError::invalid(format!(
            "{} is not an event table",
            crate::relation::regclass_text(relid).unwrap_or_default()
        ))
    })?;
    let keys: Vec<String> = keys.into_iter().flatten().collect();
    // (ingest marks the transaction, `eventview.keys_claimed`, in its own statement: a setting
    // made here would end with this call's role switch.)
    let claimed = spi::one::<Vec<String>>(
        &format!(
            "WITH claimed AS (
                 INSERT INTO {} (event_key, claimed_by)
                 SELECT k, pg_catalog.pg_current_xact_id()
                 FROM (SELECT DISTINCT k FROM pg_catalog.unnest($1::text[]) k) u
                 ORDER BY k COLLATE \"C\"
                 ON CONFLICT (event_key) DO NOTHING
                 RETURNING event_key)
             SELECT coalesce(pg_catalog.array_agg(event_key), '{{}}') FROM claimed",
            names::key_table(source.source_id)
        ),
        &[keys.into()],
    )?
    .unwrap_or_default();
    Ok(claimed)
}

/// What removes a partition from an event table's reads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// DROP TABLE.
    Drop,
    /// ALTER TABLE ... DETACH PARTITION [CONCURRENTLY].
    Detach { concurrently: bool },
}

/// What a DROP command names that can take partitions of event tables along.
pub enum Dropped {
    /// DROP TABLE: these tables.
    Tables(Vec<pg_sys::Oid>),
    /// DROP SCHEMA ... CASCADE: every table in these schemas.
    Schemas(Vec<pg_sys::Oid>),
    /// DROP OWNED BY: the tables these roles own, and with CASCADE every table in the schemas
    /// they own.
    OwnedBy {
        roles: Vec<pg_sys::Oid>,
        cascade: bool,
    },
}

/// The tables `dropped` removes, for `before_removal`. A DROP SCHEMA or DROP OWNED removes a
/// partition kept apart from its table (in a schema of its own, or owned by another role, as
/// pg_partman can set up) while the table stays: those are the partitions whose partitioned
/// table does not go with them. (When the event table goes too, it is dropped, which
/// `_follow_drop` handles, as a DROP TABLE of it.)
pub fn tables_dropped(dropped: Dropped) -> EvResult<Vec<pg_sys::Oid>> {
    let (sql, args): (&str, Vec<pgrx::datum::DatumWithOid>) = match dropped {
        Dropped::Tables(tables) => return Ok(tables),
        Dropped::Schemas(schemas) if schemas.is_empty() => return Ok(Vec::new()),
        Dropped::OwnedBy { roles, .. } if roles.is_empty() => return Ok(Vec::new()),
        // The topmost partitions the command drops (a partitioned one takes its own partitions
        // along, wherever they are: `before_removal` walks its tree), below a parent it keeps.
        Dropped::Schemas(schemas) => (
            "SELECT c.oid
             FROM pg_catalog.pg_class c
             JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.oid
             JOIN pg_catalog.pg_class parent ON parent.oid = i.inhparent
             WHERE c.relispartition AND c.relkind IN ('r', 'p', 'f')
               AND c.relnamespace = ANY($1) AND parent.relnamespace <> ALL($1)
             ORDER BY c.oid",
            vec![schemas.into()],
        ),
        Dropped::OwnedBy { roles, cascade } => (
            "WITH their_schemas AS (
                 SELECT n.oid FROM pg_catalog.pg_namespace n WHERE $2 AND n.nspowner = ANY($1))
             SELECT c.oid
             FROM pg_catalog.pg_class c
             JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.oid
             JOIN pg_catalog.pg_class parent ON parent.oid = i.inhparent
             WHERE c.relispartition AND c.relkind IN ('r', 'p', 'f')
               AND (c.relowner = ANY($1) OR c.relnamespace IN (SELECT oid FROM their_schemas))
               AND NOT (parent.relowner = ANY($1) OR parent.relnamespace IN (SELECT oid FROM their_schemas))
             ORDER BY c.oid",
            vec![roles.into(), cascade.into()],
        ),
    };
    Ok(Spi::connect(|client| {
        let mut out = Vec::new();
        for row in client.select(sql, None, &args)? {
            if let Some(relid) = row.get::<pg_sys::Oid>(1)? {
                out.push(relid);
            }
        }
        Ok::<_, pgrx::spi::SpiError>(out)
    })?)
}

/// Before a DROP of `tables` (DROP TABLE, DROP SCHEMA, DROP OWNED: `tables_dropped`), or a DETACH
/// PARTITION of them (the event trigger `eventview_before_partition_removal`): a partition of an
/// event table goes only once every view has applied its events, else the command fails with
/// 55000 (dropping or detaching is not a retraction: what a view has applied stays, and what it
/// has not would be lost).
///
/// Locks, taken before the check so that nobody writes the partition after it, top-down as
/// writers take them (a partition locked before its parent would deadlock with a producer
/// writing it):
/// - the partitioned table the partition is in, in the mode the command takes it next (ACCESS
///   EXCLUSIVE; SHARE UPDATE EXCLUSIVE for a DETACH ... CONCURRENTLY);
/// - the partition and every partition below it: ACCESS EXCLUSIVE for a drop, as the drop will;
///   SHARE for a detach, which a DETACH ... CONCURRENTLY holds until its first transaction has
///   taken the partition out of the table's reads.
///
/// A dropped partition's keys leave the key table here; a detached one's when the detach is
/// done (`follow_partitions`).
pub fn before_removal(tables: &[pg_sys::Oid], removal: Removal) -> EvResult<()> {
    // (The default partition detached for a move keeps its events: `take_over_from_default`.)
    if MOVING.get() {
        return Ok(());
    }
    roles::api_call(|| {
        for &table in tables {
            let Some(source) = source_of_partition(table)? else {
                continue;
            };
            // Named along with its event table: the event table's drop (`_follow_drop`).
            if removal == Removal::Drop && tables.contains(&source.relid) {
                continue;
            }
            // A role PostgreSQL will refuse the command to (after this trigger) takes no lock:
            // queued behind a reader, its lock would hold up every producer meanwhile.
            if !may_remove(table, removal)? {
                continue;
            }
            // Top-down, as writers lock them: the partitioned table above, then `table` and the
            // partitioned tables below it.
            if let Some(parent) = parent_of(table)? {
                match removal {
                    Removal::Detach { concurrently: true } => {
                        locks::lock_against_schema_changes(parent)
                    }
                    _ => locks::lock_for_dropping(parent),
                }
            }
            for level in partitioned_below(table)? {
                match removal {
                    Removal::Drop => locks::lock_for_dropping(level),
                    Removal::Detach { .. } => locks::lock_against_writes(level),
                }
            }
            for (leaf, name) in leaves_of(table)? {
                match removal {
                    // prune checked it and forgot its keys, under the same lock.
                    Removal::Drop if leaf == DROPPING_CHECKED.get() => {}
                    Removal::Drop => {
                        locks::lock_for_dropping(leaf);
                        require_applied(&source, &name, "drop")?;
                        forget_keys_of(&source, leaf, &name)?;
                    }
                    Removal::Detach { .. } => {
                        locks::lock_against_writes(leaf);
                        require_applied(&source, &name, "detach")?;
                    }
                }
            }
        }
        Ok(())
    })
}

/// Whether the role running the DDL may drop or detach partition `table`, as PostgreSQL decides
/// it: a drop (DROP TABLE, DROP SCHEMA, DROP OWNED) with the privileges of the owner of the
/// table or of its schema, a detach with those of the owner of the partitioned table above it.
fn may_remove(table: pg_sys::Oid, removal: Removal) -> EvResult<bool> {
    let sql = match removal {
        Removal::Drop => {
            "SELECT pg_catalog.pg_has_role($1, c.relowner, 'USAGE')
                 OR pg_catalog.pg_has_role($1, n.nspowner, 'USAGE')
             FROM pg_catalog.pg_class c
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE c.oid = $2"
        }
        Removal::Detach { .. } => {
            "SELECT pg_catalog.pg_has_role($1, p.relowner, 'USAGE')
             FROM pg_catalog.pg_inherits i
             JOIN pg_catalog.pg_class p ON p.oid = i.inhparent
             WHERE i.inhrelid = $2"
        }
    };
    Ok(spi::one::<bool>(sql, &[roles::caller().into(), table.into()])?.unwrap_or(false))
}

/// The partitioned tables of the tree below `table` (itself included), top-down.
fn partitioned_below(table: pg_sys::Oid) -> EvResult<Vec<pg_sys::Oid>> {
    Ok(Spi::connect(|client| {
        let mut out = Vec::new();
        for row in client.select(
            &format!(
                "{TREE}
             SELECT t.relid FROM tree t JOIN pg_catalog.pg_class c ON c.oid = t.relid
             WHERE c.relkind = 'p' ORDER BY t.level, t.relid"
            ),
            None,
            &[table.into()],
        )? {
            if let Some(relid) = row.get::<pg_sys::Oid>(1)? {
                out.push(relid);
            }
        }
        Ok::<_, pgrx::spi::SpiError>(out)
    })?)
}

/// The partitioned table `table` is a partition of.
fn parent_of(table: pg_sys::Oid) -> EvResult<Option<pg_sys::Oid>> {
    spi::one::<pg_sys::Oid>(
        "SELECT inhparent FROM pg_catalog.pg_inherits WHERE inhrelid = $1",
        &[table.into()],
    )
}

/// The event table whose partition tree `table` is in, below its root.
fn source_of_partition(table: pg_sys::Oid) -> EvResult<Option<Source>> {
    let root = spi::one::<pg_sys::Oid>(
        "SELECT pg_catalog.pg_partition_root($1)::oid",
        &[table.into()],
    )?;
    match root {
        Some(root) if root != table => catalog::source_by_relid(root),
        _ => Ok(None),
    }
}

/// The leaves (tables with rows of their own) of the partition tree below `table`, with their
/// quoted names: `table` itself when it is one.
fn leaves_of(table: pg_sys::Oid) -> EvResult<Vec<(pg_sys::Oid, String)>> {
    Ok(Spi::connect(|client| {
        let mut out = Vec::new();
        for row in client.select(
            &format!(
                "{TREE}
             SELECT t.relid, pg_catalog.format('%I.%I', n.nspname, c.relname)
             FROM tree t
             JOIN pg_catalog.pg_class c ON c.oid = t.relid
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE c.relkind <> 'p' ORDER BY t.relid"
            ),
            None,
            &[table.into()],
        )? {
            if let (Some(relid), Some(name)) = (row.get::<pg_sys::Oid>(1)?, row.get::<String>(2)?) {
                out.push((relid, name));
            }
        }
        Ok::<_, pgrx::spi::SpiError>(out)
    })?)
}

/// 55000 when `partition` (quoted) holds events some view of `source` has not applied.
fn require_applied(source: &Source, partition: &str, action: &str) -> EvResult<()> {
    if holds_unapplied_events(source, partition)? {
        let table = crate::relation::regclass_text(source.relid)?;
        return Err(EvError::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "cannot {action} partition {partition} of event table {table}: views have not applied all of its events"
            ),
        )
        .with_hint(format!(
            "Refresh the views of {table} first (eventview.refresh, or eventview.refresh_all()), then {action} it: its events would be lost to them."
        )));
    }
    Ok(())
}

/// Removes the keys of the events in `partition` (quoted) from the key table.
///
/// A partition directly below the root with a finite range has exactly the keys whose
/// `occurred_at` is in its range (the key table follows every change of an event's time): they
/// are deleted by that range, a few runs of pages found by the key table's BRIN index. Any other
/// partition's keys are looked up one by one.
fn forget_keys_of(source: &Source, partition: pg_sys::Oid, name: &str) -> EvResult<()> {
    let keys = names::key_table(source.source_id);
    let range = partitions_of(source.relid)?
        .into_iter()
        .find(|p| p.relid == partition)
        .and_then(|p| p.from.zip(p.to));
    let delete = match range {
        Some((from, to)) => format!(
            "DELETE FROM {keys} WHERE occurred_at >= {} AND occurred_at < {}",
            layout::utc_literal(from),
            layout::utc_literal(to)
        ),
        None => {
            format!("DELETE FROM {keys} WHERE event_key IN (SELECT event_key FROM ONLY {name})")
        }
    };
    spi::run(&delete, &[])
}
