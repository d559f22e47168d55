//! Realtime reads of the views of this node (API.md section 3): the groups a view's pending
//! changes touch, which its relation reads from `eventview._realtime_pending(view_id)` in
//! place of those stored groups (`eventview_core::sqlgen::ViewSql::realtime_groups`).
//!
//! The function first asks a short statement whether the reader's batch of the view's
//! changelog holds anything (`realtime_pending_check`); only then does it run the pending
//! groups' statement (`realtime_pending_groups`, hundreds of lines). A read with nothing
//! pending costs a read of the storage and that check: the pending part's plan is neither made
//! nor set up by the executor, which PostgreSQL does for every node of a query at each read.
//!
//! Who may call it: a role with SELECT on the whole view, on whose behalf the executor runs
//! the call (`SetCall::acting_role`). Inside the view's own query that is the view's owner (the
//! executor has checked the reader's SELECT on the view itself, column privileges included);
//! anywhere else, the role that wrote the call (the querying role, or the owner of another
//! view holding it), who could read the view there just as well. Then it reads as the view's
//! owner, as a view does (security-restricted, like REFRESH MATERIALIZED VIEW): the owner must
//! still read the event table, or the read is refused naming it, as a refresh is. Its
//! statements run read-only, under the calling query's snapshot, so that the groups it returns
//! and the stored groups the query reads are of one moment.

use crate::catalog;
use crate::errors::{EvError, EvResult};
use crate::pg::locks;
use crate::pg::relcache;
use crate::pg::roles;
use crate::pg::set_returning::{self, Rows, SetCall};
use crate::privileges;
use crate::relation;
use crate::view_objects::sql_of;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

/// What a realtime read needs of a view before it knows whether anything is pending. None of
/// it changes in the view's life (its relation, event table and logs are its for good), so it
/// is kept per backend, for the catalog it was read from (`catalog_generation`).
struct ViewFacts {
    relid: pg_sys::Oid,
    source_relid: pg_sys::Oid,
    /// `realtime_pending_check`.
    pending_check: String,
}

/// Views kept per backend; when full, all are forgotten.
const KEPT_VIEWS: usize = 256;

thread_local! {
    /// (catalog generation, view id) -> facts.
    static FACTS: RefCell<HashMap<(pg_sys::Oid, i32), Rc<ViewFacts>>> = RefCell::new(HashMap::new());
    /// How many times this backend ran a view's pending groups' statement (for tests).
    static PENDING_STATEMENTS: Cell<u64> = const { Cell::new(0) };
}

/// How many times this backend ran a view's pending groups' statement (for tests).
#[cfg(any(test, feature = "pg_test"))]
pub fn pending_statements() -> u64 {
    PENDING_STATEMENTS.with(|n| n.get())
}

/// Which catalog the kept facts were read from: the extension's catalog table of views, made
/// anew with the extension, whose view ids then start again.
fn catalog_generation() -> pg_sys::Oid {
    relation::extension_relid("_views")
}

fn view_facts(view_id: i32) -> EvResult<Rc<ViewFacts>> {
    let key = (catalog_generation(), view_id);
    if let Some(facts) = FACTS.with(|f| f.borrow().get(&key).cloned()) {
        return Ok(facts);
    }
    // The reader's own rights, with search_path pinned as for every statement the extension
    // runs: on the reader's path, the catalog reads could resolve an operator of theirs.
    let facts = roles::as_role(roles::current_user(), || {
        if catalog::view_relid_if_any(view_id)?.is_none() {
            return Err(EvError::new(
                PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
                format!("no view has id {view_id}"),
            ));
        }
        let view = catalog::load_view(view_id)?;
        Ok(Rc::new(ViewFacts {
            relid: view.relid,
            source_relid: view.source.relid,
            pending_check: sql_of(&view).realtime_pending_check(),
        }))
    })?;
    FACTS.with(|f| {
        let mut f = f.borrow_mut();
        if f.len() >= KEPT_VIEWS {
            f.clear();
        }
        f.insert(key, Rc::clone(&facts));
    });
    Ok(facts)
}

/// `eventview._realtime_pending(view_id)`: the rows of the groups the changes pending for the
/// reader touch, each as the view's next refresh would store it (none when nothing is
/// pending).
pub fn pending_groups(call: &SetCall, rows: &mut Rows) -> EvResult<()> {
    let view_id = call.int_argument(0).ok_or_else(|| {
        EvError::new(
            PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            "argument \"view_id\" must not be NULL",
        )
    })?;
    let view = view_facts(view_id)?;
    require_reader(call, &view, view_id)?;
    // As the view's relation is locked by a query reading it (the owner's rights are read as
    // of that lock).
    locks::lock_for_reading(view.relid);
    let owner = relcache::owner_of_locked(view.relid).ok_or_else(|| {
        EvError::new(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            format!("the relation of view {view_id} was dropped"),
        )
    })?;
    roles::as_role(owner, || {
        privileges::require_owner_reads(view.relid, owner, view.source_relid)?;
        if set_returning::read_only_bool(&view.pending_check)? != Some(true) {
            return Ok(());
        }
        PENDING_STATEMENTS.with(|n| n.set(n.get() + 1));
        let record = catalog::load_view(view_id)?;
        let sizes = record.source.plan_sizes();
        rows.add_rows_of(&sql_of(&record).realtime_pending_groups(), sizes, || {
            format!(
                "the pending groups of realtime view {}",
                relation::regclass_text(view.relid).unwrap_or_default()
            )
        })
    })
}

/// The role the call is made on behalf of (`SetCall::acting_role`: the owner of the view whose
/// query holds the call, or the querying role for a call of its own) has SELECT on the whole
/// view; 42501 otherwise. A read of the view itself qualifies as its owner, once the executor
/// has checked the reader's SELECT on the view; a call anywhere else qualifies as whoever wrote
/// it, as a read of the view there would.
fn require_reader(call: &SetCall, view: &ViewFacts, view_id: i32) -> EvResult<()> {
    match call.acting_role() {
        Some(role) if relcache::role_may_select(role, view.relid) => Ok(()),
        _ => Err(not_read(view_id)),
    }
}

fn not_read(view_id: i32) -> EvError {
    EvError::new(
        PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
        format!(
            "permission denied for the pending groups of view {view_id}: eventview._realtime_pending serves a role with SELECT on the whole view"
        ),
    )
    .with_hint("Read the view itself; its owner can GRANT SELECT on it.")
}
