//! The field observer: brings `eventview.observed_fields` and `eventview.drift` up to date with
//! the changes of one source (see `eventview_core::observe_sql`). Runs inside refresh, never on insert.

use crate::catalog;
use crate::errors::EvResult;
use crate::pg::group_deltas::{keeping_pass, KeptPass};
use crate::pg::plan_cache::Plans;
use eventview_core::definition::FieldRef;
use eventview_core::observe_sql;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;

thread_local! {
    /// Event tables this session has warned about (see `observe`).
    static WARNED: RefCell<std::collections::HashSet<i32>> = RefCell::new(std::collections::HashSet::new());
}

/// Observes the source's pending changes once. When another session is observing the same
/// source right now, or holds its event table locked against reading, this one skips (that
/// session, or the next refresh, covers the changes): refreshes of different views never wait
/// on each other here. NO KEY UPDATE: the weakest lock that keeps a second observer out.
///
/// A table whose owner dropped or retyped an envelope column is not observed. A retyped one is
/// said with a WARNING, once per session for as long as it stays so (the worker's session
/// comes back to it every few seconds, `refresh_all` once per view); a dropped one fails the
/// view's refresh with the same message, so it is only noted at DEBUG1.
pub fn observe(source: &catalog::Source) -> EvResult<()> {
    observe_with_pass(source, || None).map(drop)
}

/// The refresh pass of a view of the source that the observer runs over its batch too, when
/// the view's batch is the observer's (see `observe_sql::shared_pass`): the view, its pass's
/// plan, bucket width and event types (None: any).
pub struct PassRequest {
    pub view_id: i32,
    pub plan: String,
    pub width: Option<pgrx::datum::Interval>,
    pub event_types: Option<Vec<String>>,
}

/// `observe`, also running the refresh pass `pass` gives (asked once the observer has a batch)
/// over the batch when the view's batch is the observer's: that pass's result, kept for the
/// view's apply (`ViewSql::apply_from_shared_pass`), which then does not read the events.
pub fn observe_with_pass(
    source: &catalog::Source,
    pass: impl FnOnce() -> Option<PassRequest>,
) -> EvResult<Option<KeptPass>> {
    let source_id = source.source_id;
    // Not waited for: another session holds the table or its changelog locked (the next
    // refresh observes it).
    if !crate::pg::locks::lock_for_reading_if_free(source.relid)?
        || !crate::pg::locks::lock_for_reading_if_free(source.changelog_relid())?
    {
        return Ok(None);
    }
    // The observer reads the table as the extension owner: not one its owner has altered.
    if let Err(e) = crate::envelope::require_intact(source.relid, true) {
        let missing = crate::envelope::require_intact(source.relid, false).is_err();
        if missing || !WARNED.with_borrow_mut(|warned| warned.insert(source_id)) {
            pgrx::debug1!(
                "{}; observed_fields and drift are not updated for it",
                e.message
            );
        } else {
            pgrx::warning!(
                "{}; observed_fields and drift are not updated for it",
                e.message
            );
        }
        return Ok(None);
    }
    WARNED.with_borrow_mut(|warned| warned.remove(&source_id));
    // Nothing new since the observer's position: nothing to do (not even the paths the views
    // read, which loading every view's definition costs). A position from elsewhere goes on to
    // the warning below.
    let plans = Plans::PerSize(source.plan_sizes());
    let pending = catalog::pending(&observe_sql::pending_check(source_id), plans)?;
    if !pending.any && !catalog::position_from_elsewhere(pending.applied_xmax) {
        return Ok(None);
    }
    let locked = catalog::lock_observer_position(source_id)?;
    let Some(observed_xmax) = locked else {
        return Ok(None);
    };
    if catalog::position_from_elsewhere(Some(observed_xmax)) {
        // Restored from another cluster whose transaction ids are ahead, and not renumbered at
        // restore: from this position, this cluster's changes would count as observed already.
        // Left as it is for eventview._rebase_positions, which needs the old position.
        pgrx::warning!(
            "observed_fields of event table {} are not updated: its position came from another cluster and was not renumbered at restore",
            crate::relation::regclass_text(source.relid)?
        );
        return Ok(None);
    }
    crate::relation::require_same_storage_as_snapshot(source.relid)?;
    let read = paths_read_by_views_kept(source_id)?;
    let paths: Vec<Option<String>> = read.iter().map(|r| r.path.clone()).collect();
    let types: Vec<Option<String>> = read.iter().map(|r| r.event_type.clone()).collect();
    let versions: Vec<Option<i32>> = read.iter().map(|r| r.event_version).collect();
    let fields: Vec<i32> = read.iter().map(|r| r.field).collect();
    let ranks: Vec<i32> = read.iter().map(|r| r.rank).collect();
    let pass = pass();
    let pass = pass.as_ref();
    let plans = Plans::PerSize(source.observer_plan_sizes());
    let args = [
        paths.into(),
        types.into(),
        versions.into(),
        fields.into(),
        ranks.into(),
        pass.map(|p| p.plan.clone()).into(),
        pass.and_then(|p| p.width).into(),
        pass.and_then(|p| p.event_types.clone()).into(),
        pass.map(|p| p.view_id).into(),
    ];
    // Most batches hold no drift: the statement without the drift joins observes them; a batch
    // that may hold drift it leaves as it was, for the whole statement (its pass, run again
    // there, is the one kept).
    let without_drift = observe_sql::observe_unless_drift(source_id, &source.scan_sql);
    Ok(keeping_pass(|| {
        Spi::connect_mut(|client| {
            let mut observe = |sql: &str| {
                let row =
                    crate::pg::plan_cache::execute(client, sql, Some(1), &args, plans)?.first();
                Ok::<_, pgrx::spi::SpiError>((
                    row.get::<Vec<u8>>(3)?,
                    row.get::<i64>(4)?.unwrap_or(0),
                    row.get::<bool>(5)?.unwrap_or(true),
                ))
            };
            let (token, batch_rows, may_drift) = observe(&without_drift)?;
            if may_drift {
                #[cfg(any(test, feature = "pg_test"))]
                DRIFT_STATEMENTS.with(|n| n.set(n.get() + 1));
                let (token, batch_rows, _) =
                    observe(&observe_sql::observe(source_id, &source.scan_sql))?;
                return Ok((token, batch_rows));
            }
            Ok::<_, pgrx::spi::SpiError>((token, batch_rows))
        })
    })?)
}

#[cfg(any(test, feature = "pg_test"))]
thread_local! {
    /// How many batches this backend observed with the whole statement, drift joins included
    /// (for tests).
    static DRIFT_STATEMENTS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many batches this backend observed with the drift joins (for tests).
#[cfg(any(test, feature = "pg_test"))]
pub fn drift_statements() -> u64 {
    DRIFT_STATEMENTS.with(|n| n.get())
}

thread_local! {
    /// Per source: the definitions its paths were made from (`catalog::definitions_of_source`), and the paths.
    /// Every refresh with work observes its source; loading and parsing each view of the
    /// source for the paths cost a refresh of a few events about 0.1 ms per view.
    static READ_PATHS: RefCell<HashMap<i32, (String, Vec<ReadPath>)>> = RefCell::new(HashMap::new());
    /// How many times the paths were made (for tests).
    static PATHS_MADE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// `paths_read_by_views`, kept per backend while the definitions they come from are unchanged.
fn paths_read_by_views_kept(source_id: i32) -> EvResult<Vec<ReadPath>> {
    let definitions = catalog::definitions_of_source(source_id)?;
    let kept = READ_PATHS.with(|kept| {
        kept.borrow()
            .get(&source_id)
            .filter(|(d, _)| *d == definitions)
            .map(|(_, paths)| paths.clone())
    });
    if let Some(paths) = kept {
        return Ok(paths);
    }
    let paths = paths_read_by_views(source_id)?;
    PATHS_MADE.with(|n| n.set(n.get() + 1));
    READ_PATHS.with(|kept| {
        kept.borrow_mut()
            .insert(source_id, (definitions, paths.clone()))
    });
    Ok(paths)
}

/// How many times this backend made the paths its views read (for tests).
#[cfg(any(test, feature = "pg_test"))]
pub fn paths_made() -> u64 {
    PATHS_MADE.with(|n| n.get())
}

/// A payload path some view reads (in observed form), and the event type and version it reads
/// it for (`None`: any), as one of the declarations of one field reference: `field` numbers the
/// references, `rank` orders a reference's declarations as resolution does (most specific
/// first). A path that cannot be observed (a rich JSONPath) is `None`: it is read nowhere, but
/// still overrides the less specific declarations of its reference where it applies.
#[derive(Debug, Clone, PartialEq)]
struct ReadPath {
    path: Option<String>,
    event_type: Option<String>,
    event_version: Option<i32>,
    field: i32,
    rank: i32,
}

/// Every simple payload path that some view of the source reads (directly or through a logical
/// field's declarations), in observed form, with the event type and version it is read for:
/// the view's `event_types`, and a declaration's own type and version. For a type and version
/// that a more specific declaration of the same field covers, the less specific ones are not
/// read (the observer SQL picks, per field, the first rank that applies). `missing` drift is
/// only about the paths read.
fn paths_read_by_views(source_id: i32) -> EvResult<Vec<ReadPath>> {
    let mut out: Vec<ReadPath> = Vec::new();
    let mut field = 0;
    for (_, relid) in catalog::event_views_of_source(source_id)? {
        let Some(view) = catalog::view_by_relid(relid, false)? else {
            continue;
        };
        let view_types: Vec<Option<String>> = match &view.definition.event_types {
            Some(types) => types.iter().cloned().map(Some).collect(),
            None => vec![None],
        };
        for r in view.definition.references() {
            let forms: Vec<(Option<String>, Option<String>, Option<i32>)> = match r {
                // (A reference to an unnested element is not a path of the payload's own.)
                FieldRef::Path { element: true, .. } => continue,
                FieldRef::Path { plan, .. } => vec![(plan.observed_form(), None, None)],
                FieldRef::Logical(f) => f
                    .variants
                    .iter()
                    .map(|v| (v.plan.observed_form(), v.event_type.clone(), v.version))
                    .collect(),
                FieldRef::Envelope(_) => continue,
            };
            field += 1;
            for (rank, (path, declared_type, event_version)) in forms.into_iter().enumerate() {
                for view_type in &view_types {
                    let event_type = match (view_type, &declared_type) {
                        (Some(v), Some(d)) if v != d => continue, // never read: the view takes no such events
                        (Some(v), _) => Some(v.clone()),
                        (None, d) => d.clone(),
                    };
                    out.push(ReadPath {
                        path: path.clone(),
                        event_type,
                        event_version,
                        field,
                        rank: rank as i32,
                    });
                }
            }
        }
    }
    Ok(out)
}
