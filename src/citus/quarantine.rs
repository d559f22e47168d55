//! The quarantine of views over distributed event tables, shown on the coordinator (API.md
//! section 10: `quarantine` shows the whole table).
//!
//! Each shard's view files its entries in the quarantine of its own node, as any view does, and
//! takes an entry back when its event changes. The coordinator keeps a copy of every shard's
//! entries, filed under the distributed view's name, with the shard each came from
//! (`eventview._distributed_quarantine`). Every refresh compares, per shard, a mark of the
//! shard's entries (their count and the sum of their ids) with the same mark of its copies,
//! and copies again the entries of every shard whose mark differs. Entry ids only grow on a
//! node, so an entry filed or taken back always changes the mark; a shard's view made anew on a
//! node it moved to (ids of another sequence) is copied again whatever its mark.

use super::{each_shard_where, mapped_shards, view_keeping, with_shard_access, Registry};
use super::{DistributedView, ShardArgs};
use crate::errors::EvResult;
use crate::pg::spi;
use pgrx::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// The mark of no entries.
const EMPTY: &str = "0:0";

/// The entries of this node's view `relid`, as the quarantine holds them.
const ENTRIES_OF_VIEW: &str = "FROM eventview.quarantine q
     WHERE q.view_name = (SELECT known_name FROM eventview._views WHERE relid = $1::regclass)";

/// On a shard's node: the mark of the quarantine entries of this node's view `relid`,
/// `<count>:<sum of ids>`.
pub(super) fn mark_of(relid: pg_sys::Oid) -> EvResult<String> {
    Ok(spi::one::<String>(
        &format!("SELECT count(*)::text || ':' || coalesce(sum(q.id), 0)::text {ENTRIES_OF_VIEW}"),
        &[relid.into()],
    )?
    .unwrap_or_else(|| EMPTY.into()))
}

/// On a shard's node: the quarantine entries of the view keeping the groups shard co-located
/// with registry shard `registry_shard` (as `shards` lists them), as a JSON array of
/// `{"shard": <value>, "shard_entry": <id>, "event_id", "reason", "event", "quarantined_at"}`;
/// `[]` when this node has no such view.
pub fn shard_entries(registry_shard: &str, value: &str, shards: &str) -> EvResult<String> {
    with_shard_access(|| {
        let (_, names) = mapped_shards(registry_shard, shards)?;
        let Some(groups_shard) = names.get(1) else {
            return Ok("[]".into());
        };
        let Some(relid) = view_keeping(groups_shard)? else {
            return Ok("[]".into());
        };
        Ok(spi::one::<String>(
            &format!(
                "SELECT coalesce(pg_catalog.json_agg(pg_catalog.json_build_object(
                     'shard', $2::text, 'shard_entry', q.id, 'event_id', q.event_id,
                     'reason', q.reason, 'event', q.event, 'quarantined_at', q.quarantined_at)
                     ORDER BY q.id), '[]')::text {ENTRIES_OF_VIEW}"
            ),
            &[relid.into(), value.into()],
        )?
        .unwrap_or_else(|| "[]".into()))
    })
}

/// What the shards' refreshes of a view answered about their quarantine entries.
#[derive(Default)]
pub(super) struct ShardMarks {
    /// Each shard's tag, with the mark of its view's entries.
    marks: BTreeMap<String, String>,
    /// The shards whose views were made anew by this refresh.
    remade: BTreeSet<String>,
}

impl ShardMarks {
    /// A shard's answer (`refresh_shard_view`) added.
    pub(super) fn add(&mut self, answer: &serde_json::Value) {
        let (Some(shard), Some(mark)) = (answer["shard"].as_str(), answer["quarantine"].as_str())
        else {
            return;
        };
        self.marks.insert(shard.to_string(), mark.to_string());
        if answer["rebuilt"].as_bool().unwrap_or(false) {
            self.remade.insert(shard.to_string());
        }
    }
}

/// After the shards' refreshes of `view`, in the same transaction: the copies of every shard
/// whose entries differ from them (`answered`) are replaced by the shard's entries now; the
/// copies of shards that no longer answer (split into others) go; every copy carries the view's
/// name now (a renamed view's entries take the new name at its next refresh).
pub(super) fn follow(view: &DistributedView, answered: &ShardMarks) -> EvResult<()> {
    let copied = copied_marks(view.view_id)?;
    let stale: Vec<String> = answered
        .marks
        .iter()
        .filter(|(shard, mark)| {
            answered.remade.contains(*shard)
                || copied.get(*shard).map_or(EMPTY, String::as_str) != mark.as_str()
        })
        .map(|(shard, _)| shard.clone())
        .collect();
    let gone = copied
        .keys()
        .filter(|shard| !answered.marks.contains_key(*shard))
        .cloned();
    forget_copies(
        view.view_id,
        Some(stale.iter().cloned().chain(gone).collect()),
    )?;
    let to_copy: Vec<String> = stale
        .into_iter()
        .filter(|shard| answered.marks[shard] != EMPTY)
        .collect();
    if !to_copy.is_empty() {
        copy_entries(view, Some(&to_copy))?;
    }
    spi::run(
        "UPDATE eventview.quarantine q
         SET view_name = pg_catalog.format('%I.%I', n.nspname, c.relname)
         FROM eventview._distributed_quarantine m, pg_catalog.pg_class c, pg_catalog.pg_namespace n
         WHERE m.view_id = $1 AND q.id = m.id AND c.oid = $2 AND n.oid = c.relnamespace
           AND q.view_name IS DISTINCT FROM pg_catalog.format('%I.%I', n.nspname, c.relname)",
        &[view.view_id.into(), view.relid.into()],
    )
}

/// The copies of `view`'s entries on the coordinator: the entries of every shard, or of the
/// shards `shards` tags, copied from their nodes under the view's name.
pub(super) fn copy_entries(view: &DistributedView, shards: Option<&[String]>) -> EvResult<()> {
    let table_sql = view.source.table_sql()?;
    let answers = each_shard_where(
        &view.source,
        &[&table_sql, &view.groups],
        Registry::AsItIs,
        shards,
        |a: &ShardArgs| {
            format!(
                "eventview._shard_quarantine({}, {}, {})",
                a.shard, a.value, a.shards
            )
        },
    )?;
    for entries in answers.iter().filter(|e| e.as_str() != "[]") {
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
            &[
                entries.as_str().into(),
                view.source.relid.into(),
                view.relid.into(),
                view.view_id.into(),
            ],
        )?;
    }
    Ok(())
}

/// The copies of `view_id`'s entries deleted: of the shards `shards` tags, or all of them.
pub(super) fn forget_copies(view_id: i32, shards: Option<Vec<String>>) -> EvResult<()> {
    match shards {
        Some(shards) if shards.is_empty() => Ok(()),
        Some(shards) => spi::run(
            "DELETE FROM eventview.quarantine WHERE id IN
                 (SELECT id FROM eventview._distributed_quarantine
                  WHERE view_id = $1 AND shard = ANY($2::text[]))",
            &[view_id.into(), shards.into()],
        ),
        None => spi::run(
            "DELETE FROM eventview.quarantine WHERE id IN
                 (SELECT id FROM eventview._distributed_quarantine WHERE view_id = $1)",
            &[view_id.into()],
        ),
    }
}

/// The mark of the copies of each shard's entries of `view_id` (shards without copies left out).
fn copied_marks(view_id: i32) -> EvResult<BTreeMap<String, String>> {
    Ok(Spi::connect(|client| {
        client
            .select(
                "SELECT shard, count(*)::text || ':' || sum(shard_entry)::text
                 FROM eventview._distributed_quarantine WHERE view_id = $1 GROUP BY shard",
                None,
                &[view_id.into()],
            )?
            .map(|row| Ok::<_, pgrx::spi::SpiError>((row.get::<String>(1)?, row.get::<String>(2)?)))
            .collect::<Result<Vec<_>, _>>()
    })?
    .into_iter()
    .filter_map(|(shard, mark)| Some((shard?, mark?)))
    .collect())
}
