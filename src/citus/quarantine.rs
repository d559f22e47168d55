//! The quarantine of views over distributed event tables, shown on the coordinator (API.md
//! section 10: `quarantine` shows the whole table).
//!
//! Each shard's view files its entries in the quarantine of its own node, as any view does, and
//! takes an entry back when its event changes. The coordinator keeps a copy of every shard's
//! entries, filed under the distributed view's name, with the shard each came from and the
//! entry's id there (`eventview._distributed_quarantine`).
//!
//! Every shard's refresh answers a mark of its entries: their count and their largest id. Ids
//! only grow on a node, so a filed entry raises the largest id and an entry taken back lowers
//! the count: the mark changes whenever the entries do. The coordinator compares it with the
//! same mark of its copies and, for each shard whose mark differs, asks the shard (one more
//! per-shard call, on those shards only) for the entries above its largest copied id, and for
//! the ids at or below it that are still there when their count differs from that of the
//! copies (entries there are only ever taken back, so equal counts mean equal entries). It
//! copies the new entries and drops the copies of entries taken back: what travels is the
//! entries that changed (and, when some were taken back, the ids of those still there), not all
//! of them. The coordinator reads the catalog rows of a view's copies once per refresh.
//!
//! A shard's view made anew (on a node the shard moved to, or by `rebuild`) numbers its entries
//! afresh: its copies are replaced whole. So are those of a shard some of whose copies were
//! deleted by hand (their catalog rows stay behind): the copies are the extension's. A node
//! whose sequence of entry ids went back (restored to an earlier point in time) can give a new
//! entry the id of one already copied; `rebuild` of the view copies everything anew. The copies
//! of a renamed view take its new name in `_follow_ddl`.

use super::{each_shard_where, mapped_shards, view_keeping, with_shard_access, Registry};
use super::{internal, DistributedView, ShardAnswer, ShardArgs};
use crate::catalog::distributed;
use crate::errors::EvResult;
use eventview_core::quote;
use pgrx::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// The mark of no entries.
const EMPTY: &str = "0:0";

/// On a shard's node: the mark of the quarantine entries of this node's view `relid`,
/// `<count>:<largest id>`.
pub(super) fn mark_of(relid: pg_sys::Oid) -> EvResult<String> {
    Ok(distributed::quarantine_mark(relid)?.unwrap_or_else(|| EMPTY.into()))
}

/// On a shard's node: what the coordinator lacks of the quarantine entries of the view keeping
/// the groups shard co-located with registry shard `registry_shard` (as `shards` lists them;
/// `value` its tag), given `copied`, `{"<tag>": [<largest id copied>, <copies>], ...}`: `{"shard":
/// <tag>, "entries": [<entries above the largest id copied>], "present": [<ids at or below it
/// still there>] or null when there are as many as copies}`. Entries are as
/// `catalog::distributed::quarantine_changes` lists them; a node without the view answers none.
pub fn shard_entries(
    registry_shard: &str,
    value: &str,
    shards: &str,
    copied: &str,
) -> EvResult<String> {
    let (above, copies) = match serde_json::from_str::<serde_json::Value>(copied) {
        Ok(map) => (
            map[value][0].as_i64().unwrap_or(0),
            map[value][1].as_i64().unwrap_or(0),
        ),
        Err(e) => {
            return Err(internal(format!(
                "copied quarantine marks are not JSON: {e}"
            )))
        }
    };
    with_shard_access(|| {
        let (_, names) = mapped_shards(registry_shard, shards)?;
        let view = match names.get(1) {
            Some(groups_shard) => view_keeping(groups_shard)?,
            None => None,
        };
        let Some(relid) = view else {
            return Ok(
                serde_json::json!({"shard": value, "entries": [], "present": []}).to_string(),
            );
        };
        distributed::quarantine_changes(relid, value, above, copies)
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
    pub(super) fn add(&mut self, answer: &ShardAnswer) -> EvResult<()> {
        let (Some(shard), Some(mark)) = (answer.text("shard")?, answer.text("quarantine")?) else {
            return Ok(());
        };
        if answer.flag("rebuilt")? {
            self.remade.insert(shard.clone());
        }
        self.marks.insert(shard, mark);
        Ok(())
    }
}

/// After the shards' refreshes of `view`, in the same transaction: the copies of every shard
/// whose mark differs from theirs follow the shard's entries; those of shards that no longer
/// answer (split into others) go.
pub(super) fn follow(view: &DistributedView, answered: &ShardMarks) -> EvResult<()> {
    let mut copied = distributed::quarantine_copies(view.view_id)?;
    // Copied whole: the shards whose views were made anew, and those some of whose copies
    // were deleted by hand; gone: those that no longer answer.
    let forgotten: Vec<String> = copied
        .iter()
        .filter(|(shard, c)| {
            c.lost || answered.remade.contains(*shard) || !answered.marks.contains_key(*shard)
        })
        .map(|(shard, _)| shard.clone())
        .collect();
    for shard in &forgotten {
        copied.remove(shard);
    }
    distributed::forget_quarantine_copies(view.view_id, Some(forgotten))?;
    let stale: BTreeMap<String, (i64, i64)> = answered
        .marks
        .iter()
        .filter(|(shard, mark)| {
            mark.as_str() != copied.get(*shard).map_or(EMPTY, |c| c.mark.as_str())
        })
        .map(|(shard, _)| {
            let known = copied.get(shard).map_or((0, 0), |c| (c.above, c.copies));
            (shard.clone(), known)
        })
        .collect();
    if stale.is_empty() {
        return Ok(());
    }
    let lacking = follow_shards(view, Following::These(&stale))?;
    if !lacking.is_empty() {
        // (Copies of entries still there are missing: only hand deletions of copies with
        // their catalog rows do that.)
        distributed::forget_quarantine_copies(view.view_id, Some(lacking.clone()))?;
        let all: BTreeMap<String, (i64, i64)> =
            lacking.into_iter().map(|shard| (shard, (0, 0))).collect();
        follow_shards(view, Following::These(&all))?;
    }
    Ok(())
}

/// The shards whose copies `follow_shards` makes follow their entries.
enum Following<'a> {
    /// These, each with the largest id copied and its number of copies.
    These(&'a BTreeMap<String, (i64, i64)>),
    /// Every shard, none copied yet.
    Every,
}

/// The copies of `view`'s entries of the shards `following` names made to follow the shards'
/// entries. Returns the shards some of whose entries still there have no copy.
fn follow_shards(view: &DistributedView, following: Following) -> EvResult<Vec<String>> {
    let none = BTreeMap::new();
    let (stale, tags) = match following {
        Following::These(stale) => (stale, Some(stale.keys().cloned().collect::<Vec<_>>())),
        Following::Every => (&none, None),
    };
    let copied = serde_json::Value::Object(
        stale
            .iter()
            .map(|(shard, (above, copies))| (shard.clone(), serde_json::json!([above, copies])))
            .collect(),
    )
    .to_string();
    let table_sql = view.source.table_sql()?;
    let answers = each_shard_where(
        &view.source,
        &[&table_sql, &view.groups],
        Registry::AsItIs,
        tags.as_deref(),
        |a: &ShardArgs| {
            format!(
                "eventview._shard_quarantine({}, {}, {}, {}::json)",
                a.shard,
                a.value,
                a.shards,
                quote::literal(&copied)
            )
        },
    )?;
    let mut lacking = Vec::new();
    for answer in answers {
        let parsed: serde_json::Value = serde_json::from_str(&answer)
            .map_err(|e| internal(format!("a shard's quarantine answered {answer}: {e}")))?;
        let shard = parsed["shard"].as_str().unwrap_or_default().to_string();
        let (above, _) = stale.get(&shard).copied().unwrap_or((0, 0));
        if let Some(present) = parsed["present"].as_array() {
            let present: Vec<i64> = present.iter().filter_map(|id| id.as_i64()).collect();
            if distributed::forget_quarantine_copies_taken_back(
                view.view_id,
                &shard,
                above,
                present,
            )? {
                lacking.push(shard.clone());
            }
        }
        let entries = parsed["entries"].to_string();
        if entries != "[]" {
            distributed::copy_quarantine_entries(
                view.view_id,
                view.relid,
                view.source.relid,
                &entries,
            )?;
        }
    }
    Ok(lacking)
}

/// The copies of every shard's entries of `view`, made with it.
pub(super) fn copy_entries(view: &DistributedView) -> EvResult<()> {
    follow_shards(view, Following::Every).map(|_| ())
}
