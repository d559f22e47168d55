//! The refresh engine: applies a view's pending changes exactly once.
//!
//! Algorithm (exactly once, after PgQ's snapshot batching): each view stores the snapshot up to
//! which it has applied changes (`applied_snapshot`). A refresh takes the view's row lock (so a
//! second refresh of the same view waits, then sees nothing left to do), and in ONE statement
//! takes the current snapshot S, applies every changelog record whose transaction is visible in
//! S but was not in the applied snapshot, and stores S. A transaction that took its changelog
//! position early but commits late is simply not visible yet; it is picked up by the first
//! refresh whose snapshot sees it. Aborted transactions are never visible. The whole refresh is
//! one transaction: a crash or cancel leaves the view, its snapshot and its counters as they were.
//!
//! Transaction boundaries: `refresh` runs inside the caller's transaction; the statements are
//!   1. lock the view row (SELECT ... FOR UPDATE), then observe the source's fields (`observer`);
//!   2. the min/max value logs and the read index created if missing (storage restored from
//!      an older dump, or made by an older version);
//!   3. whether anything is pending (`eventview_core::batch::pending_check`): when nothing is, only the
//!      logs are merged (if they hold values) and the refresh goes on at 6;
//!   4. the apply statement (see `eventview_core::sqlgen`);
//!   5. when a group took a retraction or the logs passed `eventview.extreme_log_limit`: the
//!      logs merged into the multisets; when a group took a retraction, the fix-up statements;
//!      otherwise, when groups passed the min/max values a row keeps, their values moved to
//!      the logs (`ViewSql::spill_past_the_row`);
//!   6. bookkeeping (last_refresh_at, last_refresh_ms).

use crate::catalog::{self, ViewRecord};
use crate::errors::{EvError, EvResult};
use crate::gucs;
use crate::observer;
use crate::pg::group_deltas::KeptPass;
use crate::pg::roles;
use crate::pg::spi;
use crate::privileges;
use crate::progress;
use crate::view_objects;
use eventview_core::definition::TypePolicy;
use eventview_core::sqlgen::{Mode, ViewSql, ViewSqlKey};
use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::prelude::*;
use std::time::Instant;

/// What one apply did.
pub struct Applied {
    pub consumed: i64,
    pub groups_written: i64,
}

/// Runs the apply statement of `mode` and the fix-ups. The caller holds the view's row lock.
/// The steps: the position must be this cluster's; type errors of what is recomputed are
/// forgotten; a delta with nothing pending ends early; the event table is locked and checked;
/// the statement runs as the view's owner; then the value logs and the min/max fix-ups.
pub fn apply(
    view: &ViewRecord,
    mode: Mode,
    from: Option<TimestampWithTimeZone>,
    to: Option<TimestampWithTimeZone>,
) -> EvResult<Applied> {
    apply_with(
        view,
        &view_objects::sql_of(view),
        mode,
        from,
        to,
        IdleLogs::Merge,
        None,
    )
}

thread_local! {
    /// While `collecting_handed_back` runs for a view: its id, and the group changes its applies
    /// handed back (`ViewSql::apply_handing_back_changes`), each a JSON array of column texts.
    static HANDED_BACK: std::cell::RefCell<Option<(i32, Vec<String>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` with the applies of view `view_id` handing their group changes back instead of
/// writing them to its group changelog (when it can: `ViewSql::hands_back_changes`); returns
/// what `f` returns and the changes handed back. Whatever `f` does, the collection ends with
/// it (on an error too), and what was being collected before goes on.
pub(crate) fn collecting_handed_back<T>(
    view_id: i32,
    f: impl FnOnce() -> EvResult<T>,
) -> EvResult<(T, Vec<String>)> {
    struct StopCollecting(Option<(i32, Vec<String>)>);
    impl Drop for StopCollecting {
        fn drop(&mut self) {
            let before = self.0.take();
            HANDED_BACK.with_borrow_mut(|collected| *collected = before);
        }
    }
    let before = HANDED_BACK.with_borrow_mut(|collected| collected.replace((view_id, Vec::new())));
    let stop = StopCollecting(before);
    let out = f()?;
    let collected = HANDED_BACK.with_borrow_mut(|collected| collected.take());
    drop(stop);
    Ok((out, collected.map(|(_, c)| c).unwrap_or_default()))
}

/// Whether the applies of view `view_id` hand their group changes back now.
pub(crate) fn collecting_for(view_id: i32) -> bool {
    HANDED_BACK.with_borrow(|collected| matches!(collected, Some((id, _)) if *id == view_id))
}

/// What a refresh with nothing to apply does with the min/max value logs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum IdleLogs {
    /// Merges them (the view is idle: a good moment).
    Merge,
    /// Leaves them: the refresh of a rollup's source, which a rollup's refresh runs first every
    /// time (merged there, the logs would be merged at every rollup refresh).
    Keep,
}

/// `pass`: the result of the view's refresh pass that the field observer ran over its batch in
/// this refresh (`observer::observe_with_pass`): a delta then applies it as it is, without
/// reading the events (but those with a type error, for their quarantine entries) or checking
/// whether anything is pending (the pass holds rows).
fn apply_with(
    view: &ViewRecord,
    sql: &ViewSql,
    mode: Mode,
    from: Option<TimestampWithTimeZone>,
    to: Option<TimestampWithTimeZone>,
    idle_logs: IdleLogs,
    pass: Option<KeptPass>,
) -> EvResult<Applied> {
    privileges::require_owner_reads(view.relid, view.owner, view.source.relid)?;
    require_position_of_this_cluster(view)?;
    let args: [DatumWithOid; 3] = [view.time_bucket.into(), from.into(), to.into()];
    forget_type_errors(sql, mode, &args)?;
    view_objects::create_missing_objects(view, sql)?;
    let hand_back = mode == Mode::Delta && sql.hands_back_changes() && collecting_for(view.view_id);
    let shared = pass
        .filter(|_| mode == Mode::Delta && !hand_back)
        .and_then(|pass| {
            generated(sql, Generated::ApplyFromSharedPass, |sql| {
                sql.apply_from_shared_pass()
            })
            .map(|statement| (pass, statement))
        });
    let mut batch_rows = None;
    if mode == Mode::Delta && shared.is_none() {
        match pending_batch(view, sql, idle_logs)? {
            None => {
                return Ok(Applied {
                    consumed: 0,
                    groups_written: 0,
                })
            }
            Some(rows) => batch_rows = rows,
        }
    }
    if view.source_view.is_none() {
        lock_and_check_event_table(view)?;
    }
    if mode != Mode::Delta && view.feeds_rollups {
        // Its rollups take back what it held of the groups recomputed (the multisets give the
        // values, once the logs are in them).
        view_objects::merge_logs(view)?;
        roles::as_role(view.owner, || {
            spi::run_replanned(&sql.retract_into_changes(mode == Mode::Window), &args)
        })?;
    }
    // The pass in Rust keeps the batch's groups in memory: not for a batch past
    // ONE_PASS_MAX_ROWS (counted by the pending check of a view it covers).
    let one_pass = || {
        let small =
            batch_rows.is_some_and(|rows| rows <= eventview_core::sqlgen::ONE_PASS_MAX_ROWS);
        let on = mode == Mode::Delta && small && crate::gucs::ONE_PASS_REFRESH.get();
        on.then(|| {
            generated(sql, Generated::ApplyInOnePass, |sql| {
                sql.apply_in_one_pass()
            })
        })
        .flatten()
    };
    let statement: std::rc::Rc<str> = if let Some((_, statement)) = &shared {
        statement.clone()
    } else if hand_back {
        sql.apply_handing_back_changes().into()
    } else {
        match one_pass() {
            Some(statement) => statement,
            None if mode == Mode::Delta => {
                generated(sql, Generated::Apply, |sql| Some(sql.apply(Mode::Delta)))
                    .expect("an apply statement")
            }
            None => sql.apply(mode).into(),
        }
    };
    if mode == Mode::Full {
        start_progress(view)?;
    }
    let result = match &shared {
        Some((pass, _)) => {
            #[cfg(any(test, feature = "pg_test"))]
            SHARED_APPLIES.with(|n| n.set(n.get() + 1));
            // SAFETY: a check of the log levels in force.
            if unsafe { pg_sys::message_level_is_interesting(pg_sys::DEBUG1 as i32) } {
                pgrx::debug1!(
                    "pg_eventview: the refresh of view {} takes the pass the field observer ran over its batch",
                    relname(view)?
                );
            }
            let [width, from, to] = args;
            let args = [width, from, to, pass.token().into()];
            let result = run_apply_statement(view, sql, mode, &statement, &args)?;
            // The batch the apply read is the one the pass ran over (nothing wrote to the
            // changelog in between): checked, as an error rather than a view off by a batch.
            if result.consumed != pass.batch_rows {
                return Err(EvError::new(
                    PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                    format!(
                        "the refresh of view {} applied a batch of {} event rows where the field observer's pass read {}",
                        relname(view)?,
                        result.consumed,
                        pass.batch_rows
                    ),
                ));
            }
            result
        }
        None => run_apply_statement(view, sql, mode, &statement, &args)?,
    };
    drop(shared);
    progress::finish();
    if let Some(changes) = result.handed_back {
        HANDED_BACK.with_borrow_mut(|collected| match collected {
            Some((id, collected)) if *id == view.view_id => collected.push(changes),
            _ => {}
        });
    }
    if view.definition.on_type_error == TypePolicy::Fail {
        if let Some(reason) = result.first_error {
            return Err(EvError::invalid(format!("type error in view {}: {reason}", relname(view)?))
                .with_hint("Nothing was applied. Fix the event, or leave such events out with on_type_error => 'quarantine' or 'skip' (alter_view, for a view that exists)."));
        }
    }
    // The fix-up reads the multisets, so the logs go into them first; so does a refresh that
    // finds them past the limit. (An idle refresh merges them in `pending_batch`; an apply
    // that consumed nothing counts as idle too.)
    let idle = mode == Mode::Delta && result.consumed == 0 && idle_logs == IdleLogs::Merge;
    if result.logged > 0
        && (result.retracted > 0 || idle || result.logged > gucs::extreme_log_limit())
    {
        view_objects::merge_logs(view)?;
    }
    if result.retracted > 0 {
        roles::as_role(view.owner, || spi::run_all(&sql.fixup()))?;
    } else if result.dirty > 0 {
        // Groups past the min/max values a row keeps, and no retraction: their values go where
        // this apply's went (the logs or the multisets), and no extreme needs the multisets.
        roles::as_role(view.owner, || {
            spi::run_all(&sql.spill_past_the_row(sql.logs_extremes(mode)))
        })?;
    }
    if let (Some(source), Some(source_view), true) =
        (&sql.rollup_source, &view.source_view, result.consumed > 0)
    {
        // The group changes every rollup of the source has applied go, as the source's owner,
        // whose table the group changelog is.
        roles::as_role(source_view.owner, || {
            spi::run_all(&[source.prune_changes()])
        })?;
    }
    Ok(Applied {
        consumed: result.consumed,
        groups_written: result.groups_written,
    })
}

/// The statements every refresh of a view generates, kept by `generated`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Generated {
    PendingCheck,
    Apply,
    ApplyInOnePass,
    ApplyFromSharedPass,
    SharedPassPlan,
}

/// Views whose statements `generated` keeps at most; past it, it starts over.
const GENERATED_VIEWS: usize = 256;

/// Per view and statement: the generator's key and the statement it generated (`None`: a view
/// the pass does not cover).
type GeneratedStatements =
    std::collections::HashMap<(i32, Generated), (ViewSqlKey, Option<std::rc::Rc<str>>)>;

thread_local! {
    static GENERATED: std::cell::RefCell<GeneratedStatements> =
        std::cell::RefCell::new(GeneratedStatements::new());
}

/// The statement `which` of `sql`, generated by `generate` unless this backend generated it
/// before from the same inputs (`ViewSql::matches`): a refresh of a few events spends about 5%
/// of its time generating text it generated last time.
fn generated(
    sql: &ViewSql,
    which: Generated,
    generate: impl FnOnce(&ViewSql) -> Option<String>,
) -> Option<std::rc::Rc<str>> {
    let slot = (sql.view_id, which);
    let kept = GENERATED.with_borrow(|kept| {
        kept.get(&slot)
            .filter(|(key, _)| sql.matches(key))
            .map(|(_, statement)| statement.clone())
    });
    if let Some(statement) = kept {
        return statement;
    }
    let statement: Option<std::rc::Rc<str>> = generate(sql).map(Into::into);
    GENERATED.with_borrow_mut(|kept| {
        if kept.len() >= GENERATED_VIEWS * 3 {
            kept.clear();
        }
        kept.insert(slot, (sql.key(), statement.clone()));
    });
    statement
}

/// A view whose position (or its changelog's) came from another cluster whose transaction ids
/// are ahead cannot be applied: applying changes from this position would count this
/// cluster's transactions as applied already (or skip records whose ids this cluster has not
/// reached yet), and a full recompute would store a position of this cluster under which the
/// restored records still read as pending, to be applied once more after the renumbering.
fn require_position_of_this_cluster(view: &ViewRecord) -> EvResult<()> {
    if !view.positions_from_elsewhere && !view.source.changelog_from_elsewhere()? {
        return Ok(());
    }
    Err(EvError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("view {} was restored from another cluster whose transaction ids are ahead of this one's, and its position was not renumbered at restore", relname(view)?),
    )
    .with_hint(format!(
        "As a superuser, SELECT eventview._rebase_positions({}) renumbers the positions of its event table (a serial restore does it itself; see Dump and restore in docs/reference.md); run it before new events are written, or rebuild the table's views after it.",
        view.source.source_id
    )))
}

/// Before a recomputation: the quarantine entries of what it recomputes go (the quarantine is
/// the extension's; the recomputation files them again).
fn forget_type_errors(sql: &ViewSql, mode: Mode, args: &[DatumWithOid; 3]) -> EvResult<()> {
    match mode {
        Mode::Window => spi::run_replanned(&sql.forget_type_errors_in_window(), args),
        Mode::Full => spi::run_all(&[sql.forget_type_errors()]),
        Mode::Delta => Ok(()),
    }
}

/// The batch of a delta: None when nothing is pending (the apply statement would change
/// nothing but the view's position; an idle refresh still merges the min/max logs when they
/// hold values), else Some of its event rows when the check counts them (see
/// `ViewSql::pending_check`).
fn pending_batch(
    view: &ViewRecord,
    sql: &ViewSql,
    idle_logs: IdleLogs,
) -> EvResult<Option<Option<i64>>> {
    let plans = crate::pg::plan_cache::Plans::PerSize(view.source.plan_sizes());
    let check = generated(sql, Generated::PendingCheck, |sql| {
        Some(sql.pending_check())
    })
    .expect("a pending check");
    let pending = catalog::pending(&check, plans)?;
    if pending.any {
        return Ok(Some(pending.batch_rows));
    }
    if pending.extra > 0 && idle_logs == IdleLogs::Merge {
        view_objects::merge_logs(view)?;
    }
    Ok(None)
}

/// The event table is read as the view's owner: not one whose owner gave an envelope column a
/// type of theirs, whose casts would run with the view owner's rights (unless that owner has
/// the view owner's rights anyway), nor one missing an envelope column, which the apply
/// statement would fail on with a bare "column does not exist" (see
/// `envelope::require_intact`). Called after the idle check: an idle refresh reads nothing, and
/// waits for no lock on the table.
fn lock_and_check_event_table(view: &ViewRecord) -> EvResult<()> {
    crate::pg::locks::lock_for_reading(view.source.relid);
    // (Dropped while this waited for the lock: as if it had been before.)
    let table_owner = crate::pg::relcache::owner_of_locked(view.source.relid)
        .ok_or_else(|| catalog::event_table_gone(view.relid))?;
    crate::envelope::require_intact_for(view.source.relid, table_owner, view.owner)?;
    crate::relation::require_same_storage_as_snapshot(view.source.relid)
}

/// Progress NOTICEs of a full recomputation, against the rows the planner estimates: rows per
/// page from the last ANALYZE or VACUUM, times the table's pages now (stale statistics, after
/// a crash or a bulk load, are off by far).
fn start_progress(view: &ViewRecord) -> EvResult<()> {
    let estimate: Option<f32> = spi::one(
        "SELECT (CASE WHEN c.reltuples < 0 THEN NULL
                      WHEN c.relpages > 0 THEN c.reltuples / c.relpages
                           * (pg_catalog.pg_relation_size(c.oid) / pg_catalog.current_setting('block_size')::integer)
                      ELSE c.reltuples END)::real
         FROM pg_catalog.pg_class c WHERE c.oid = $1::regclass",
        &[view.source.table_sql.as_str().into()],
    )?;
    progress::start(
        format!("recomputing {}", relname(view)?),
        estimate.map(|e| e as i64),
    );
    Ok(())
}

/// What the apply statement returned.
struct StatementResult {
    consumed: i64,
    groups_written: i64,
    /// Groups that took a retraction or passed the min/max values a row keeps (`__dirty`).
    dirty: i64,
    /// Of those, the groups that took a retraction (their min/max need the fix-up).
    retracted: i64,
    /// The first type error, for views whose policy is `fail`.
    first_error: Option<String>,
    /// Rows the statement appended to the value logs.
    logged: i64,
    /// The group changes the statement handed back (`ViewSql::apply_handing_back_changes`).
    handed_back: Option<String>,
}

/// Clears what a recomputation replaces and runs the apply statement, as the view's owner. A
/// refresh runs the same statement every time: parsed once per backend and planned once per
/// size of the event table and changelog. A rebuild is rare and long: planned at each run.
fn run_apply_statement(
    view: &ViewRecord,
    sql: &ViewSql,
    mode: Mode,
    statement: &str,
    args: &[DatumWithOid],
) -> EvResult<StatementResult> {
    roles::as_role(view.owner, || {
        match mode {
            Mode::Window => {
                for statement in sql.clear_window() {
                    spi::run_replanned(&statement, args)?;
                }
            }
            Mode::Full => spi::run_all(&sql.clear_all())?,
            Mode::Delta => {}
        }
        Ok(Spi::connect_mut(|client| {
            let result = if mode == Mode::Delta {
                let plans = crate::pg::plan_cache::Plans::PerSize(view.source.plan_sizes());
                crate::pg::plan_cache::execute(client, statement, Some(1), args, plans)?
            } else {
                client.update(statement, Some(1), args)?
            };
            let row = result.first();
            Ok::<_, pgrx::spi::SpiError>(StatementResult {
                consumed: row.get::<i64>(1)?.unwrap_or(0),
                groups_written: row.get::<i64>(2)?.unwrap_or(0),
                dirty: row.get::<i64>(3)?.unwrap_or(0),
                first_error: row.get::<String>(4)?,
                logged: row.get::<i64>(5)?.unwrap_or(0),
                retracted: row.get::<i64>(6)?.unwrap_or(0),
                handed_back: match row.columns()? {
                    7 => row.get::<String>(7)?,
                    _ => None,
                },
            })
        })?)
    })
}

fn relname(view: &ViewRecord) -> EvResult<String> {
    crate::relation::regclass_text(view.relid)
}

/// Applies the pending changes of the view named `name`; returns how many change records
/// (changed event rows) it consumed.
pub fn refresh(name: &str) -> EvResult<i64> {
    let (view, below) = lock_for_refresh(name, false)?;
    Ok(below + observe_and_refresh(&view, IdleLogs::Merge)?)
}

/// Refreshes the view whose relation is `relid` (named `name`) as `refresh` does, with the
/// views it reads through first.
pub fn refresh_with_sources(relid: pg_sys::Oid, name: &str) -> EvResult<i64> {
    Ok(refresh_keeping_view(relid, name, false)?.0)
}

/// `refresh_with_sources`, returning also the view as its refresh locked it and, when
/// `collect_handed_back`, the group changes its applies handed back instead of writing them to
/// its group changelog (`collecting_handed_back`): what a shard's refresh for a coordinator
/// runs.
pub fn refresh_keeping_view(
    relid: pg_sys::Oid,
    name: &str,
    collect_handed_back: bool,
) -> EvResult<(i64, ViewRecord, Vec<String>)> {
    let below = refresh_sources(relid, false)?;
    let view = catalog::lock_view_by_relid(relid, name)?;
    let (consumed, handed_back) = if collect_handed_back {
        if view.source_view.is_none() {
            observer::observe(&view.source)?;
        }
        collecting_handed_back(view.view_id, || {
            refresh_locked(&view, &view_objects::sql_of(&view), IdleLogs::Merge, None)
        })?
    } else {
        (observe_and_refresh(&view, IdleLogs::Merge)?, Vec::new())
    };
    Ok((below + consumed, view, handed_back))
}

/// For a rollup: refreshes the views it reads through, down to the view over the event table,
/// each one the caller owns, oldest first (as every refresh locks them: a source before its
/// rollups). A rollup's own refresh then applies what they wrote. `unless_locked`: a view whose event table
/// another session holds is skipped (see `refresh_unless_locked`). Returns the changed event rows
/// the view over the event table consumed.
fn refresh_sources(relid: pg_sys::Oid, unless_locked: bool) -> EvResult<i64> {
    let mut consumed = 0;
    for (source_relid, owner) in catalog::sources_below(relid)? {
        let name = crate::relation::regclass_text(source_relid)?;
        if !privileges::caller_acts_as(owner) {
            continue;
        }
        // run_maintenance holds the rollup's row already (taken SKIP LOCKED): it never waits
        // for a source's row, which a refresh of the rollup may hold while it waits for the
        // rollup's.
        let view = if unless_locked {
            match catalog::try_lock_view_by_relid(source_relid)? {
                Some(view) => view,
                None => continue,
            }
        } else {
            catalog::lock_view_by_relid(source_relid, &name)?
        };
        if view.source_view.is_none()
            && unless_locked
            && !crate::pg::locks::lock_for_reading_if_free(view.source.relid)?
        {
            continue;
        }
        consumed += observe_and_refresh(&view, IdleLogs::Keep)?;
    }
    Ok(consumed)
}

/// `refresh` as `run_maintenance` runs it: `None`, having done nothing, when another session
/// holds the view's event table locked against reading (an open ALTER TABLE, VACUUM FULL, LOCK
/// TABLE or REINDEX, or one waiting for its lock: see `pg::locks::lock_for_reading_if_free`).
/// Waiting would cost the worker's one loop up to its lock_timeout per such view and run, and
/// failing would back the view off for up to an hour after the lock is gone; skipped, it is
/// tried again at the next run, at no cost.
pub fn refresh_unless_locked(name: &str) -> EvResult<Option<i64>> {
    let (view, below) = lock_for_refresh(name, true)?;
    if view.source_view.is_none() && !crate::pg::locks::lock_for_reading_if_free(view.source.relid)?
    {
        return Ok(None);
    }
    Ok(Some(below + observe_and_refresh(&view, IdleLogs::Merge)?))
}

#[cfg(any(test, feature = "pg_test"))]
thread_local! {
    /// How many applies took the refresh pass the field observer ran (for tests).
    static SHARED_APPLIES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many applies in this backend took the refresh pass the field observer ran (for tests).
#[cfg(any(test, feature = "pg_test"))]
pub fn shared_applies() -> u64 {
    SHARED_APPLIES.with(|n| n.get())
}

/// Runs the field observer of the view's event table (nothing for a rollup), with the view's
/// refresh pass when it covers the view, then the view's refresh, which takes the pass's
/// result when the observer ran it (the view's batch was the observer's).
fn observe_and_refresh(view: &ViewRecord, idle_logs: IdleLogs) -> EvResult<i64> {
    let sql = view_objects::sql_of(view);
    let pass = match view.source_view {
        Some(_) => None,
        None => observer::observe_with_pass(&view.source, || pass_request(view, &sql))?,
    };
    refresh_locked(view, &sql, idle_logs, pass)
}

/// The refresh pass the observer may run for the view: for a view over an event table of this
/// node whose delta the pass covers (`ViewSql::shared_pass_plan`), while
/// `eventview.one_pass_refresh` is on and the view's applies hand nothing back.
fn pass_request(view: &ViewRecord, sql: &ViewSql) -> Option<observer::PassRequest> {
    if view.source_view.is_some()
        || view.data_table.is_some()
        || !crate::gucs::ONE_PASS_REFRESH.get()
        || collecting_for(view.view_id)
    {
        return None;
    }
    // Not for an owner whose apply will be refused (it reads as the extension's owner).
    let (owner, table) = (view.owner, view.source.relid);
    if !crate::pg::relcache::role_may_select(owner, table)
        || crate::pg::relcache::row_security_applies_to(owner, table)
    {
        return None;
    }
    let plan = generated(sql, Generated::SharedPassPlan, |sql| sql.shared_pass_plan())?;
    Some(observer::PassRequest {
        view_id: view.view_id,
        plan: plan.to_string(),
        width: view.time_bucket,
        event_types: view.definition.event_types.clone(),
    })
}

/// The view named `name`, its row locked for a refresh by the caller (who must own it); a
/// rollup's sources refreshed first (`refresh_sources`), with the event rows they consumed.
fn lock_for_refresh(name: &str, unless_locked: bool) -> EvResult<(ViewRecord, i64)> {
    // Lock order everywhere: the view's row, then its event table (the field observer's lock,
    // then the apply's), as drop_event_table and run_maintenance take them. (Observing first
    // held the table while waiting for the row: a deadlock with drop_event_table, which holds
    // the row while waiting for the table.) The observer's own catalog row is taken SKIP LOCKED.
    // The rights from the catalog row alone; the definition is loaded once, under the lock.
    let unlocked = catalog::view_ref_by_name(name)?;
    privileges::require_view_owner(unlocked.relid, unlocked.owner, "refresh")?;
    let below = refresh_sources(unlocked.relid, unless_locked)?;
    Ok((catalog::lock_view_by_relid(unlocked.relid, name)?, below))
}

/// Applies the view's pending changes; returns the changed event rows consumed (none for a
/// rollup, which consumes group changes).
fn refresh_locked(
    view: &ViewRecord,
    sql: &ViewSql,
    idle_logs: IdleLogs,
    pass: Option<KeptPass>,
) -> EvResult<i64> {
    let started = Instant::now();
    let applied = apply_with(view, sql, Mode::Delta, None, None, idle_logs, pass)?;
    catalog::record_refresh(view.view_id, started.elapsed().as_secs_f64() * 1000.0)?;
    Ok(match view.source_view {
        Some(_) => 0,
        None => applied.consumed,
    })
}

/// Observes the event tables the caller's views read or the caller owns. (Only the tables
/// are loaded, never the views: a view that cannot be loaded fails its own refresh, not this.)
pub fn observe_all() -> EvResult<()> {
    for source in catalog::all_sources()? {
        if catalog::caller_owns_a_view_of(source.source_id)?
            || privileges::caller_acts_as(privileges::table_owner(source.relid)?)
        {
            observer::observe(&source)?;
        }
    }
    Ok(())
}

/// Recomputes the buckets starting in `[from, to)` (or the whole view) from the raw events,
/// applying the other pending changes in the same statement so the view stays consistent.
pub fn rebuild(
    name: &str,
    from: Option<TimestampWithTimeZone>,
    to: Option<TimestampWithTimeZone>,
) -> EvResult<i64> {
    if let (Some(f), Some(t)) = (from, to) {
        if f >= t {
            return Err(EvError::invalid(format!(
                "invalid rebuild window: from_time {f} is not before to_time {t}"
            ))
            .with_hint("The window is [from_time, to_time): from_time inclusive, to_time exclusive. Pass NULL for an open end."));
        }
    }
    // Rights first, then the lock: a refused caller must not hold the view's row.
    let unlocked = catalog::view_by_name(name, false)?;
    privileges::require_view_owner(unlocked.relid, unlocked.owner, "rebuild")?;
    if let Some(source) = &unlocked.source_view {
        // A rollup recomputes from its source's stored groups: its sources are brought up to
        // date first, and the source's multisets hold every value once its logs are merged.
        refresh_sources(unlocked.relid, false)?;
        let source = catalog::lock_view_by_relid(source.relid, name)?;
        view_objects::merge_logs(&source)?;
    }
    let view = catalog::lock_view(&unlocked, name)?;
    let started = Instant::now();
    // Everything still retained is recomputed: no window asked for (the horizon may impose one).
    let whole_view = from.is_none() && to.is_none();
    let mut from = from;
    // No prune of the table from here on; the horizon is taken after every prune that started
    // before (a horizon from the transaction's start would be older than theirs: the events
    // they deleted between the two would be missing from buckets recomputed as complete).
    catalog::hold_off_prune(&view.source)?;
    // A rollup's source keeps what pruned events contributed: a rollup recomputes every bucket.
    let retention_horizon = match view.source_view {
        Some(_) => None,
        None => catalog::retention_horizon(&view.source)?,
    };
    if view.definition.bucketed {
        // Recompute only from raw events still retained: pruned history stays as aggregated.
        // In a time zone a bucket may hold events from before its start (a repeated local hour
        // starts at its later instant), so the buckets within two days of the horizon stay too.
        let retention_horizon = match retention_horizon {
            Some(h) if view.definition.time_zone.is_some() => spi::one::<TimestampWithTimeZone>(
                "SELECT $1 OPERATOR(pg_catalog.+) interval '2 days'",
                &[h.into()],
            )?,
            other => other,
        };
        if let Some(horizon) = retention_horizon {
            if from.is_none_or(|f| f < horizon) {
                pgrx::notice!(
                    "rebuild of {} starts at the retention horizon {}: older events may have been pruned, their buckets are kept as they are",
                    relname(&view)?,
                    horizon
                );
                from = Some(horizon);
            }
        }
    }
    let windowed = from.is_some() || to.is_some();
    if windowed && !view.definition.bucketed {
        return Err(EvError::invalid(format!(
            "view {} has no time_bucket, so rebuild takes no time window",
            relname(&view)?
        ))
        .with_hint(
            "Call rebuild(name) without from_time and to_time to recompute the whole view.",
        ));
    }
    if !view.definition.bucketed {
        if let Some(horizon) = retention_horizon {
            // A view without buckets can only be recomputed whole, from the events still there.
            pgrx::ereport!(
                WARNING,
                PgSqlErrorCode::ERRCODE_WARNING,
                format!(
                    "rebuild of {} recomputes the whole view from the events still retained: pruned events are no longer counted",
                    relname(&view)?
                ),
                format!("Events older than the retention horizon {horizon} may have been pruned.")
            );
        }
    }
    let applied = if windowed {
        let lower = from.unwrap_or(TimestampWithTimeZone::negative_infinity());
        let upper = to.unwrap_or(TimestampWithTimeZone::positive_infinity());
        apply(&view, Mode::Window, Some(lower), Some(upper))?
    } else {
        apply(&view, Mode::Full, None, None)?
    };
    if whole_view {
        // The view now follows the current field declarations, as far as events are retained
        // (buckets past the retention horizon cannot be recomputed by any rebuild), and so do a
        // realtime view's reads (their SQL may come from an older version). Last: replacing the
        // relation locks out its readers until commit.
        catalog::set_rebuild_note(view.view_id, None)?;
        if view.realtime {
            view_objects::install_user_view(&view)?;
        }
    }
    catalog::record_refresh(view.view_id, started.elapsed().as_secs_f64() * 1000.0)?;
    Ok(applied.groups_written)
}
