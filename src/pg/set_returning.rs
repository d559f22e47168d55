//! A set-returning C function of `record` rows in materialize mode (`materialize`), as
//! `eventview._realtime_pending` is (see `crate::realtime`): what the executor tells it about
//! the query that calls it (`SetCall`), and the rows it returns (`Rows`), filled from statements
//! run read-only under that query's snapshot and kept per backend.
//!
//! Read-only matters: SPI in read-write mode (what pgrx chooses once the transaction has written)
//! takes a new snapshot for each statement, and the rows returned would then be of a later
//! moment than the rest of the calling query, which reads the view's storage.

use crate::errors::{EvError, EvResult};
use crate::pg::plan_cache::SizeClass;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;

/// The call in progress of a function that returns a set of records.
pub struct SetCall {
    fcinfo: pg_sys::FunctionCallInfo,
    rsinfo: *mut pg_sys::ReturnSetInfo,
}

impl SetCall {
    /// Argument `n` as an integer (None when NULL or absent).
    pub fn int_argument(&self, n: usize) -> Option<i32> {
        // SAFETY: `fcinfo` is the call's (checked by `materialize`); `nargs` bounds the array,
        // and an int4 argument is passed by value.
        unsafe {
            let nargs = usize::try_from((*self.fcinfo).nargs).unwrap_or(0);
            if n >= nargs {
                return None;
            }
            let arg = (*self.fcinfo).args.as_slice(nargs)[n];
            (!arg.isnull).then(|| arg.value.value() as i32)
        }
    }

    /// The role whose SELECT on relation `relid` the executor checked for the query that calls
    /// this function, when that query reads the relation (a view it reads keeps an entry in the
    /// query's range table for that check, with the role of the view that reads it, if any):
    /// the entry's `checkAsUser`, or the current user. None when the query does not read it.
    pub fn role_reading(&self, relid: pg_sys::Oid) -> Option<pg_sys::Oid> {
        // SAFETY: `rsinfo` is the call's ReturnSetInfo (checked by `materialize`); its
        // expression context belongs to the executor state running the query, whose range
        // table is a list of RangeTblEntry nodes.
        unsafe {
            let econtext = (*self.rsinfo).econtext;
            if econtext.is_null() || (*econtext).ecxt_estate.is_null() {
                return None;
            }
            let rtable = pgrx::PgList::<pg_sys::RangeTblEntry>::from_pg(
                (*(*econtext).ecxt_estate).es_range_table,
            );
            let found = rtable.iter_ptr().find(|&rte| {
                (*rte).rtekind == pg_sys::RTEKind::RTE_RELATION
                    && (*rte).relid == relid
                    && (*rte).requiredPerms & pg_sys::AclMode::from(pg_sys::ACL_SELECT) != 0
            });
            found.map(|rte| {
                if (*rte).checkAsUser == pg_sys::InvalidOid {
                    pg_sys::GetUserId()
                } else {
                    (*rte).checkAsUser
                }
            })
        }
    }
}

/// The rows a `materialize` call returns: a tuple store of the query's lifetime, with the row
/// type the call site expects (its column definition list).
pub struct Rows {
    store: *mut pg_sys::Tuplestorestate,
    desc: pg_sys::TupleDesc,
}

impl Rows {
    /// Adds every row of the read-only statement `sql` (see `execute_read_only`), kept for the
    /// size class `sizes` of the tables it reads, whose columns must be of the types the call
    /// site expects; `what` names the rows in the error otherwise.
    pub fn add_rows_of(
        &mut self,
        sql: &str,
        sizes: SizeClass,
        what: impl FnOnce() -> String,
    ) -> EvResult<()> {
        Spi::connect(|_| {
            let table = execute_read_only(sql, Some(sizes))?;
            // SAFETY: a SELECT's result in SPI_tuptable: `vals` holds `numvals` tuples of
            // `tupdesc`; the tuple store copies each into its own memory context.
            unsafe {
                if !same_column_types((*table).tupdesc, self.desc) {
                    return Err(EvError::new(
                        PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                        format!("{} do not have the columns its relation reads", what()),
                    )
                    .with_hint(
                        "Make the relation anew with eventview.alter_view(name, realtime => true).",
                    ));
                }
                let count = (*table).numvals as usize;
                for &tuple in std::slice::from_raw_parts((*table).vals, count) {
                    pg_sys::tuplestore_puttuple(self.store, tuple);
                }
            }
            Ok(())
        })
    }
}

/// Whether two row types have the same number of columns, of the same types.
///
/// # Safety
/// Both must be valid tuple descriptors.
unsafe fn same_column_types(a: pg_sys::TupleDesc, b: pg_sys::TupleDesc) -> bool {
    // SAFETY: the caller's descriptors; `natts` bounds their attribute arrays.
    unsafe {
        let n = (*a).natts;
        n == (*b).natts
            && (0..n as usize).all(|i| {
                let (x, y) = (
                    (*a).attrs.as_slice(n as usize),
                    (*b).attrs.as_slice(n as usize),
                );
                x[i].atttypid == y[i].atttypid
            })
    }
}

/// Serves a call of a set-returning function declared `RETURNS SETOF record`, called with a
/// column definition list: `fill` adds the rows (it may add none); its error is raised.
///
/// # Safety
/// `fcinfo` must be the valid `fcinfo` Postgres' function manager passed to the function.
pub unsafe fn materialize(
    fcinfo: pg_sys::FunctionCallInfo,
    fill: impl FnOnce(&SetCall, &mut Rows) -> EvResult<()>,
) -> pg_sys::Datum {
    // SAFETY: the caller's fcinfo; `resultinfo` is checked to be a ReturnSetInfo node that
    // accepts a materialized set with an expected row type before it is used. The tuple store
    // and the row type's copy live in the query's memory context, as the executor reads them
    // after this call returns.
    unsafe {
        let rsinfo = (*fcinfo).resultinfo.cast::<pg_sys::ReturnSetInfo>();
        let accepts = !rsinfo.is_null()
            && (*rsinfo).type_ == pg_sys::NodeTag::T_ReturnSetInfo
            && ((*rsinfo).allowedModes as u32 & pg_sys::SetFunctionReturnMode::SFRM_Materialize)
                != 0
            && !(*rsinfo).expectedDesc.is_null();
        if !accepts {
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                "this function returns a set of records: call it in FROM, with a column definition list"
            );
        }
        let old = pg_sys::MemoryContextSwitchTo((*(*rsinfo).econtext).ecxt_per_query_memory);
        let random = (*rsinfo).allowedModes as u32
            & pg_sys::SetFunctionReturnMode::SFRM_Materialize_Random
            != 0;
        let mut rows = Rows {
            store: pg_sys::tuplestore_begin_heap(random, false, pg_sys::work_mem),
            desc: pg_sys::CreateTupleDescCopy((*rsinfo).expectedDesc),
        };
        pg_sys::MemoryContextSwitchTo(old);
        let call = SetCall { fcinfo, rsinfo };
        if let Err(e) = fill(&call, &mut rows) {
            e.into_report().report(PgLogLevel::ERROR);
        }
        (*rsinfo).returnMode = pg_sys::SetFunctionReturnMode::SFRM_Materialize;
        (*rsinfo).setResult = rows.store;
        (*rsinfo).setDesc = rows.desc;
        (*fcinfo).isnull = true;
        pg_sys::Datum::from(0)
    }
}

/// Statements kept per backend by `execute_read_only`; when full, all are dropped (a backend
/// reads few realtime views).
const KEPT_STATEMENTS: usize = 64;

/// A statement prepared and kept (`SPI_keepplan`), freed when dropped.
struct KeptPlan(pg_sys::SPIPlanPtr);

impl Drop for KeptPlan {
    fn drop(&mut self) {
        // SAFETY: a plan this backend kept and frees once.
        unsafe {
            pg_sys::SPI_freeplan(self.0);
        }
    }
}

thread_local! {
    static KEPT: RefCell<HashMap<(String, Option<SizeClass>), KeptPlan>> = RefCell::new(HashMap::new());
}

/// Runs the SELECT `sql` (no parameters) read-only, under the active snapshot (the calling
/// query's), from a plan kept per backend: one generic plan, which PostgreSQL's plan cache
/// makes again after DDL on a table it reads or an ANALYZE of one, and which is made anew for
/// another size class `sizes` of the tables it reads, as the refresh's statements are
/// (`plan_cache::Plans::PerSize`). Inside an SPI connection; the result is SPI_tuptable's.
fn execute_read_only(sql: &str, sizes: Option<SizeClass>) -> EvResult<*mut pg_sys::SPITupleTable> {
    let key = (sql.to_string(), sizes);
    let plan = KEPT.with(|kept| kept.borrow().get(&key).map(|p| p.0));
    let plan = match plan {
        Some(plan) => plan,
        None => {
            let text = CString::new(sql).map_err(|_| {
                EvError::new(
                    PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                    "a generated statement holds a NUL character",
                )
            })?;
            // SAFETY: prepares a statement without parameters in the current SPI connection
            // and moves it to a long-lived context; a parse error raises.
            let plan = unsafe {
                let plan = pg_sys::SPI_prepare(text.as_ptr(), 0, std::ptr::null_mut());
                if plan.is_null() || pg_sys::SPI_keepplan(plan) != 0 {
                    return Err(EvError::new(
                        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                        "pg_eventview: SPI could not prepare a realtime read's statement",
                    ));
                }
                plan
            };
            KEPT.with(|kept| {
                let mut kept = kept.borrow_mut();
                // The same statement kept for the tables' former sizes is of no more use.
                kept.retain(|(text, _), _| text != sql);
                if kept.len() >= KEPT_STATEMENTS {
                    kept.clear();
                }
                kept.insert(key, KeptPlan(plan));
            });
            plan
        }
    };
    // SAFETY: executes a kept plan without parameters, read-only (the active snapshot, no
    // command counter increment); its result is SPI_tuptable until the next SPI call.
    unsafe {
        pg_sys::SPI_tuptable = std::ptr::null_mut();
        let status =
            pg_sys::SPI_execute_plan(plan, std::ptr::null_mut(), std::ptr::null(), true, 0);
        if status != pg_sys::SPI_OK_SELECT as i32 || pg_sys::SPI_tuptable.is_null() {
            return Err(EvError::new(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                format!("pg_eventview: a realtime read's statement failed in SPI ({status})"),
            ));
        }
        Ok(pg_sys::SPI_tuptable)
    }
}

/// The first column of the first row of the read-only SELECT `sql` (see `execute_read_only`),
/// as a boolean; None when there is no row or it is NULL.
pub fn read_only_bool(sql: &str) -> EvResult<Option<bool>> {
    Spi::connect(|_| {
        let table = execute_read_only(sql, None)?;
        // SAFETY: SPI_tuptable of a SELECT: `numvals` tuples of `tupdesc`; column 1 is read
        // as a boolean (by value).
        unsafe {
            if (*table).numvals == 0 {
                return Ok(None);
            }
            let mut isnull = false;
            let value = pg_sys::SPI_getbinval(*(*table).vals, (*table).tupdesc, 1, &mut isnull);
            Ok((!isnull).then(|| value.value() != 0))
        }
    })
}
