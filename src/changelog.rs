//! Changelog rotation: segments made ahead of the records, and applied records pruned by whole
//! segments (a TRUNCATE, then a DROP), not by DELETE (`eventview_core::changelog_segments` has
//! the algorithm). Records past `delta_retention` that no whole segment took along yet go by the
//! batched DELETE of `eventview._prune_changelog`, as a record always could at the first prune
//! after every consumer applied it: those of the segment still filling, of the default partition
//! (past every segment made, or kept from a changelog made before segments). In a changelog that
//! fills its segments within `delta_retention`, as the widths aim at, that DELETE finds nothing
//! past it; at a shorter `delta_retention` it keeps the changelog short, and the segments it
//! emptied are dropped, dead rows and all.
//!
//! Every step runs as the changelog's owner (the extension owner) for a member of the event
//! table's owner role, from `eventview._rotate_changelog` (sql/maintenance.sql), which bounds
//! every lock wait with a short `lock_timeout` and leaves a changelog it would wait longer for
//! to a later run. Locks:
//! - a segment is emptied under ACCESS EXCLUSIVE on it alone: captures write the newest
//!   segment, refreshes read it (ACCESS SHARE) for the length of their statement;
//! - a segment emptied by an earlier run is dropped under ACCESS EXCLUSIVE on the changelog,
//!   which every capture waits for meanwhile (milliseconds);
//! - a segment is made under SHARE on the changelog (captures wait meanwhile: one running with
//!   the partitions it started with would route a record of the new range to the default
//!   partition, which no longer takes it) and ACCESS EXCLUSIVE on its default partition.

use crate::catalog::{self, SegmentMade};
use crate::errors::{EvError, EvResult};
use crate::gucs;
use crate::pg::{locks, roles, spi};
use crate::privileges;
use eventview_core::{changelog_segments as layout, envelope_sql, names};
use pgrx::datum::Interval;
use pgrx::prelude::*;

/// One partition of a changelog.
struct Segment {
    relid: pg_sys::Oid,
    /// Quoted, qualified name.
    name_sql: String,
    /// `[lo, hi)`; None for the default partition.
    bounds: Option<(i64, i64)>,
}

/// The changelog of a source as it is now.
enum Changelog {
    Missing,
    /// A plain table, made by a version before segments.
    Plain(pg_sys::Oid),
    Partitioned(pg_sys::Oid),
}

fn changelog_of(source_id: i32) -> EvResult<Changelog> {
    let kind = spi::one::<String>(
        "SELECT c.oid::text || ',' || c.relkind::text FROM pg_catalog.pg_class c
         WHERE c.oid = pg_catalog.to_regclass($1)",
        &[names::changelog(source_id).into()],
    )?;
    let Some((oid, kind)) = kind.as_deref().and_then(|k| k.split_once(',')) else {
        return Ok(Changelog::Missing);
    };
    let relid = pg_sys::Oid::from(oid.parse::<u32>().unwrap_or(0));
    Ok(match kind {
        "p" => Changelog::Partitioned(relid),
        _ => Changelog::Plain(relid),
    })
}

fn segments_of(root: pg_sys::Oid) -> EvResult<Vec<Segment>> {
    Ok(Spi::connect(|client| {
        let mut out = Vec::new();
        for row in client.select(
            "SELECT c.oid, pg_catalog.format('%I.%I', n.nspname, c.relname),
                    pg_catalog.pg_get_expr(c.relpartbound, c.oid)
             FROM pg_catalog.pg_inherits i
             JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE i.inhparent = $1",
            None,
            &[root.into()],
        )? {
            let (Some(relid), Some(name_sql)) = (row.get::<pg_sys::Oid>(1)?, row.get::<String>(2)?)
            else {
                continue;
            };
            let bound = row.get::<String>(3)?.unwrap_or_default();
            out.push(Segment {
                relid,
                name_sql,
                bounds: layout::parse_bound(&bound),
            });
        }
        out.sort_by_key(|s| s.bounds);
        Ok::<_, pgrx::spi::SpiError>(out)
    })?)
}

/// The first record number the changelog `log` (qualified) has not given out yet.
fn next_seq(log: &str) -> EvResult<i64> {
    spi::one::<i64>(
        &format!(
            "SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END FROM {} s",
            spi::one::<String>(
                "SELECT pg_catalog.pg_get_serial_sequence($1, 'seq')",
                &[log.into()],
            )?
            .ok_or_else(|| EvError::invalid(format!("changelog {log} has no record numbers")))?
        ),
        &[],
    )?
    .ok_or_else(|| EvError::invalid(format!("changelog {log} has no record numbers")))
}

fn now_epoch() -> EvResult<f64> {
    Ok(spi::one::<f64>("SELECT EXTRACT(epoch FROM pg_catalog.now())::float8", &[])?.unwrap_or(0.0))
}

/// Runs `work` as the owner of the changelog of the event table `source_id`, for a member of
/// the table's owner role; nothing for a table that is not an event table (any more).
fn as_changelog_owner<T: Default>(
    source_id: i32,
    action: &str,
    work: impl FnOnce(&catalog::Source) -> EvResult<T>,
) -> EvResult<T> {
    let Some(source) = catalog::all_sources()?
        .into_iter()
        .find(|s| s.source_id == source_id)
    else {
        return Ok(T::default());
    };
    privileges::require_table_owner(source.relid, action)?;
    let log = source.changelog_relid();
    if log == pg_sys::InvalidOid {
        return Ok(T::default());
    }
    let owner = privileges::table_owner(log)?;
    roles::as_role(owner, || work(&source))
}

/// Whether this transaction's statements see every transaction committed before them (READ
/// COMMITTED): under one snapshot for the whole transaction, a record committed after it would
/// look absent from a segment that holds it, and that segment empty. Rotation waits for a
/// READ COMMITTED run (the worker's, pg_cron's) otherwise, with a NOTICE.
fn sees_every_commit(source: &catalog::Source) -> EvResult<bool> {
    if spi::uses_transaction_snapshot() {
        pgrx::notice!(
            "pg_eventview: changelog segments of {} not rotated: rotation runs in READ COMMITTED transactions only",
            source.table_sql
        );
        return Ok(false);
    }
    Ok(true)
}

/// Makes the segment that keeps one segment wholly ahead of the records of event table
/// `source_id` (and turns a changelog made before segments into a partitioned one first).
/// Returns how many it made.
pub fn make_segments(source_id: i32) -> EvResult<i32> {
    as_changelog_owner(source_id, "rotate the changelog of", |source| {
        if !sees_every_commit(source)? {
            return Ok(0);
        }
        let mut made = 0;
        if let Changelog::Plain(relid) = changelog_of(source_id)? {
            partition_plain(source, relid)?;
            made += 1;
        }
        let Changelog::Partitioned(root) = changelog_of(source_id)? else {
            return Ok(made);
        };
        let log = names::changelog(source_id);
        let segments = segments_of(root)?;
        let bounds: Vec<(i64, i64)> = segments.iter().filter_map(|s| s.bounds).collect();
        if layout::next_segment(&bounds, next_seq(&log)?, 1).is_none() {
            return Ok(made);
        }
        // One is due. The changelog against writes first (SHARE, waiting for the captures of
        // the moment): a statement that started before the new segment is attached routes its
        // records by the partitions it started with, and would send a record of the new range
        // to the default partition, which no longer takes it. Then the default partition, which
        // ATTACH takes next anyway. No record number is given out meanwhile.
        locks::lock_against_writes(root);
        if let Some(default) = segments.iter().find(|s| s.bounds.is_none()) {
            locks::lock_for_dropping(default.relid);
        }
        let next = next_seq(&log)?;
        let notes = notes_of(source_id, &bounds, next)?;
        let narrowest = gucs::changelog_segment_min();
        let previous_width = bounds
            .last()
            .map_or(gucs::changelog_first_segment(), |(lo, hi)| hi - lo);
        let rate = notes.last().and_then(|last| {
            let elapsed = now_epoch().ok()? - last.made_at;
            (elapsed >= 1.0).then(|| (next - last.made_seq) as f64 / elapsed)
        });
        let delta_retention = catalog::delta_retention_seconds(source_id)?;
        let width = layout::width(
            rate,
            layout::span_seconds(delta_retention),
            previous_width,
            narrowest,
            gucs::changelog_segment_max(),
        );
        if let Some((lo, hi)) = layout::next_segment(&bounds, next, width) {
            let table = names::changelog_segment_table(source_id, lo);
            spi::run_all(&layout::create_segment(&log, names::SCHEMA, &table, lo, hi))?;
            catalog::note_segment_made(source_id, lo, next)?;
            made += 1;
        }
        Ok(made)
    })
}

/// The notes of the segments `bounds`, noting those without one as made now.
fn notes_of(source_id: i32, bounds: &[(i64, i64)], next: i64) -> EvResult<Vec<SegmentMade>> {
    let notes = catalog::segments_made(source_id)?;
    let unnoted: Vec<i64> = bounds
        .iter()
        .map(|&(lo, _)| lo)
        .filter(|lo| !notes.iter().any(|n| n.lo == *lo))
        .collect();
    if unnoted.is_empty() {
        return Ok(notes);
    }
    for lo in unnoted {
        catalog::note_segment_made(source_id, lo, next)?;
    }
    catalog::segments_made(source_id)
}

/// Turns the plain changelog `relid` of `source` into the default partition of a partitioned
/// changelog with one segment from the next record number on. Takes ACCESS EXCLUSIVE on it
/// (waiting at most the caller's lock_timeout): no capture writes it meanwhile. The new
/// changelog gets the rights of the old one, and realtime views, whose reads name the
/// changelog by oid, are installed again.
fn partition_plain(source: &catalog::Source, relid: pg_sys::Oid) -> EvResult<()> {
    locks::lock_for_dropping(relid);
    let source_id = source.source_id;
    let log = names::changelog(source_id);
    let next = next_seq(&log)?;
    spi::run_all(&envelope_sql::partition_changelog(source_id, next))?;
    let table = names::changelog_segment_table(source_id, next);
    spi::run_all(&layout::create_segment(
        &log,
        names::SCHEMA,
        &table,
        next,
        next.saturating_add(gucs::changelog_first_segment()),
    ))?;
    catalog::note_segment_made(source_id, next, next)?;
    let owner = privileges::role_ident(privileges::table_owner(source.relid)?)?;
    spi::run_all(&[format!("GRANT SELECT, INSERT, DELETE ON {log} TO {owner}")])?;
    spi::run("SELECT eventview._sync_changelog_readers()", &[])?;
    for (view_id, relid) in catalog::views_of_source(source_id)? {
        if catalog::view_reads(view_id)?.0 {
            if let Some(view) = catalog::view_by_relid(relid, false)? {
                crate::view_objects::install_user_view(&view)?;
            }
        }
    }
    Ok(())
}

/// Prunes the changelog of event table `source_id`: drops the segments an earlier run emptied,
/// empties every complete segment (oldest first) whose records every consumer has applied and
/// that is past `delta_retention`, then deletes the applied records past `delta_retention` that
/// remain, wherever they are (at most `max_rows`). Returns the number of records pruned.
pub fn prune_segments(source_id: i32, delta_retention: Interval, max_rows: i64) -> EvResult<i64> {
    as_changelog_owner(source_id, "prune the changelog of", |source| {
        let mut pruned = 0;
        match changelog_of(source_id)? {
            Changelog::Missing => return Ok(0),
            Changelog::Plain(_) => {}
            Changelog::Partitioned(root) => {
                if sees_every_commit(source)? {
                    drop_emptied(source_id, root)?;
                    pruned += empty_applied(source_id, root, &delta_retention)?;
                }
            }
        }
        pruned += spi::one::<i64>(
            "SELECT eventview._prune_changelog($1, $2::regclass, $3, $4)",
            &[
                source_id.into(),
                names::changelog(source_id).into(),
                delta_retention.into(),
                max_rows.into(),
            ],
        )?
        .unwrap_or(0);
        Ok(pruned)
    })
}

/// Drops the complete segments of changelog `root` that are empty: emptied by an earlier run.
/// (Not the ones this run empties: a capture that took its record number just before the
/// segment became complete may still be on its way into it, and must find it there.)
fn drop_emptied(source_id: i32, root: pg_sys::Oid) -> EvResult<()> {
    let log = names::changelog(source_id);
    let next = next_seq(&log)?;
    let complete: Vec<Segment> = segments_of(root)?
        .into_iter()
        .filter(|s| s.bounds.is_some_and(|(_, hi)| hi <= next))
        .collect();
    // Complete already when an earlier run made a segment (the record number then was past
    // its end): no capture is still on its way into it.
    let notes = catalog::segments_made(source_id)?;
    let mut empty = Vec::new();
    for segment in complete {
        let hi = segment.bounds.map_or(i64::MAX, |(_, hi)| hi);
        if !notes.iter().any(|n| n.made_seq >= hi) {
            continue;
        }
        if !spi::one::<bool>(
            &format!("SELECT EXISTS (SELECT 1 FROM ONLY {})", segment.name_sql),
            &[],
        )?
        .unwrap_or(true)
        {
            empty.push(segment);
        }
    }
    if empty.is_empty() {
        return Ok(());
    }
    locks::lock_for_dropping(root);
    let mut dropped = Vec::new();
    for segment in empty {
        locks::lock_for_dropping(segment.relid);
        // Again under the lock: a record committed meanwhile stays.
        let holds_records = spi::one::<bool>(
            &format!("SELECT EXISTS (SELECT 1 FROM ONLY {})", segment.name_sql),
            &[],
        )?
        .unwrap_or(true);
        if !holds_records {
            spi::run_all(&[format!("DROP TABLE {}", segment.name_sql)])?;
            dropped.extend(segment.bounds.map(|(lo, _)| lo));
        }
    }
    catalog::forget_segments(source_id, Some(dropped))
}

/// Empties (TRUNCATE) the complete segments of changelog `root`, oldest first, whose records
/// every consumer has applied and whose newest record is past `delta_retention`; stops at the
/// first that is not. Returns how many records went.
fn empty_applied(source_id: i32, root: pg_sys::Oid, delta_retention: &Interval) -> EvResult<i64> {
    let log = names::changelog(source_id);
    let next = next_seq(&log)?;
    let segments = segments_of(root)?;
    let bounds: Vec<(i64, i64)> = segments.iter().filter_map(|s| s.bounds).collect();
    let notes = notes_of(source_id, &bounds, next)?;
    let Some(horizon) = catalog::applied_horizon(source_id)? else {
        return Ok(0);
    };
    let oldest_kept = spi::one::<f64>(
        "SELECT EXTRACT(epoch FROM pg_catalog.now() OPERATOR(pg_catalog.-) $1)::float8",
        &[(*delta_retention).into()],
    )?
    .unwrap_or(f64::NEG_INFINITY);
    let mut emptied = 0;
    for (lo, hi) in layout::complete(&bounds, next) {
        // Every record of the segment was logged before any segment past its end was made
        // (one is made only once record numbers passed the segments before it).
        let logged_by = notes
            .iter()
            .filter(|n| n.lo > hi)
            .map(|n| n.made_at)
            .fold(f64::INFINITY, f64::min);
        if logged_by >= oldest_kept {
            break;
        }
        let Some(segment) = segments.iter().find(|s| s.bounds == Some((lo, hi))) else {
            continue;
        };
        locks::lock_for_dropping(segment.relid);
        let name = &segment.name_sql;
        let newest = spi::one::<i64>(
            &format!("SELECT pg_catalog.max(xid)::text::int8 FROM ONLY {name}"),
            &[],
        )?;
        if newest.is_some_and(|xid| xid >= horizon) {
            break;
        }
        let records =
            spi::one::<i64>(&format!("SELECT pg_catalog.count(*) FROM ONLY {name}"), &[])?
                .unwrap_or(0);
        if records > 0 {
            spi::run_all(&[format!("TRUNCATE {name}")])?;
        }
        emptied += records;
    }
    Ok(emptied)
}
