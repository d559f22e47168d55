//! A set-returning C function of `record` rows in materialize mode (`materialize`), as
//! `eventview._realtime_pending` is (see `crate::realtime`): who the executor calls it on behalf
//! of (`SetCall`), and the rows it returns (`Rows`), filled from statements run read-only under
//! the calling query's snapshot and kept per backend.
//!
//! Read-only matters: SPI in read-write mode (what pgrx's statements use once the transaction
//! has written) takes a new snapshot for each statement, and the rows returned would then be of
//! a later moment than the rest of the calling query, which reads the view's storage. That is
//! also why these statements are kept here and not in `plan_cache`: pgrx executes its kept
//! statements in that mode.

use crate::errors::{EvError, EvResult};
use crate::pg::plan_cache::SizeClass;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;
use std::rc::Rc;

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

    /// The role this call is made on behalf of, as the executor checks the privileges of what
    /// the call's own FROM item reads: the owner of the view whose query holds the call (its
    /// range table entry's `checkAsUser`), or the current user for a call written in the
    /// query itself. None when the call is not a FROM item of the query running it.
    pub fn acting_role(&self) -> Option<pg_sys::Oid> {
        // SAFETY: `fcinfo` and `rsinfo` are the call's (checked by `materialize`); the
        // expression context belongs to the executor state running the query, whose planned
        // statement and range table outlive the call. `fn_expr` is the function expression of
        // the plan node that calls this function, found by address among the plan's function
        // scans; their `scanrelid` indexes the range table (from 1).
        unsafe {
            let econtext = (*self.rsinfo).econtext;
            if econtext.is_null() || (*econtext).ecxt_estate.is_null() {
                return None;
            }
            let estate = (*econtext).ecxt_estate;
            let call = (*(*self.fcinfo).flinfo).fn_expr;
            let statement = (*estate).es_plannedstmt;
            if call.is_null() || statement.is_null() {
                return None;
            }
            let subplans = pgrx::PgList::<pg_sys::Plan>::from_pg((*statement).subplans);
            let scanrelid = std::iter::once((*statement).planTree)
                .chain(subplans.iter_ptr())
                .find_map(|plan| scanrelid_of_call(plan, call))?;
            let rtable = pgrx::PgList::<pg_sys::RangeTblEntry>::from_pg((*estate).es_range_table);
            let rte = rtable.get_ptr((scanrelid as usize).checked_sub(1)?)?;
            if (*rte).rtekind != pg_sys::RTEKind::RTE_FUNCTION {
                return None;
            }
            Some(if (*rte).checkAsUser == pg_sys::InvalidOid {
                pg_sys::GetUserId()
            } else {
                (*rte).checkAsUser
            })
        }
    }
}

/// The range table index of the function scan under `plan` (itself included) that calls the
/// function expression `call`.
///
/// # Safety
/// `plan` must be null or a valid plan tree; `call` is compared by address only.
unsafe fn scanrelid_of_call(plan: *mut pg_sys::Plan, call: *mut pg_sys::Node) -> Option<u32> {
    if plan.is_null() {
        return None;
    }
    // SAFETY: the caller's plan tree: each node is read as the struct its tag says.
    unsafe {
        let children = |list: *mut pg_sys::List| {
            pgrx::PgList::<pg_sys::Plan>::from_pg(list)
                .iter_ptr()
                .find_map(|child| scanrelid_of_call(child, call))
        };
        let found = match (*plan).type_ {
            pg_sys::NodeTag::T_FunctionScan => {
                let scan = plan.cast::<pg_sys::FunctionScan>();
                let calls = pgrx::PgList::<pg_sys::RangeTblFunction>::from_pg((*scan).functions);
                let ours = calls.iter_ptr().any(|f| (*f).funcexpr == call);
                ours.then_some((*scan).scan.scanrelid)
            }
            pg_sys::NodeTag::T_Append => children((*plan.cast::<pg_sys::Append>()).appendplans),
            pg_sys::NodeTag::T_MergeAppend => {
                children((*plan.cast::<pg_sys::MergeAppend>()).mergeplans)
            }
            pg_sys::NodeTag::T_BitmapAnd => {
                children((*plan.cast::<pg_sys::BitmapAnd>()).bitmapplans)
            }
            pg_sys::NodeTag::T_BitmapOr => children((*plan.cast::<pg_sys::BitmapOr>()).bitmapplans),
            pg_sys::NodeTag::T_SubqueryScan => {
                scanrelid_of_call((*plan.cast::<pg_sys::SubqueryScan>()).subplan, call)
            }
            pg_sys::NodeTag::T_CustomScan => {
                children((*plan.cast::<pg_sys::CustomScan>()).custom_plans)
            }
            _ => None,
        };
        found
            .or_else(|| scanrelid_of_call((*plan).lefttree, call))
            .or_else(|| scanrelid_of_call((*plan).righttree, call))
    }
}

/// The rows a `materialize` call returns: the call's tuple store, with the row type the call
/// site expects (its column definition list).
pub struct Rows {
    store: *mut pg_sys::Tuplestorestate,
    desc: pg_sys::TupleDesc,
}

impl Rows {
    /// Adds every row of the read-only statement `sql` (see `execute_read_only`), kept for the
    /// size class `sizes` of the tables it reads. Each row goes into the tuple store as the
    /// executor makes it (the store spills to disk past `work_mem`). Its columns must be of the
    /// types the call site expects: otherwise nothing is added, and the error says `what`.
    pub fn add_rows_of(
        &mut self,
        sql: &str,
        sizes: SizeClass,
        what: impl FnOnce() -> String,
    ) -> EvResult<()> {
        let mut receiver = StoreReceiver {
            receiver: pg_sys::DestReceiver {
                receiveSlot: Some(store_row),
                rStartup: Some(check_row_type),
                rShutdown: Some(do_nothing),
                rDestroy: Some(do_nothing),
                // (SPI answers SPI_OK_SELECT for a SELECT to any destination but DestNone.)
                mydest: pg_sys::CommandDest::DestTuplestore,
            },
            store: self.store,
            expected: self.desc,
            matches: false,
        };
        Spi::connect(|_| {
            let dest = (&raw mut receiver).cast::<pg_sys::DestReceiver>();
            execute_read_only(sql, Some(sizes), dest)?;
            Ok::<_, EvError>(())
        })?;
        if receiver.matches {
            Ok(())
        } else {
            Err(EvError::new(
                PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                format!("{} do not have the columns its relation reads", what()),
            )
            .with_hint("The view changed after this transaction's snapshot was taken: read it again in a new transaction."))
        }
    }
}

/// A destination of a statement's rows that appends each to a tuple store, once its startup has
/// found their columns of the expected types.
#[repr(C)]
struct StoreReceiver {
    /// First, so that a pointer to it is one to the receiver.
    receiver: pg_sys::DestReceiver,
    store: *mut pg_sys::Tuplestorestate,
    expected: pg_sys::TupleDesc,
    matches: bool,
}

/// `rStartup`: whether the statement's rows have the expected columns.
///
/// # Safety
/// Called by the executor with the `StoreReceiver` it was given and the rows' descriptor.
#[pg_guard]
unsafe extern "C-unwind" fn check_row_type(
    receiver: *mut pg_sys::DestReceiver,
    _operation: std::ffi::c_int,
    rows: pg_sys::TupleDesc,
) {
    // SAFETY: the receiver is a StoreReceiver (its first field); both descriptors are valid.
    unsafe {
        let receiver = receiver.cast::<StoreReceiver>();
        (*receiver).matches = same_column_types(rows, (*receiver).expected);
    }
}

/// `receiveSlot`: appends the row to the store (the store copies it).
///
/// # Safety
/// Called by the executor with the `StoreReceiver` it was given and a valid slot.
#[pg_guard]
unsafe extern "C-unwind" fn store_row(
    slot: *mut pg_sys::TupleTableSlot,
    receiver: *mut pg_sys::DestReceiver,
) -> bool {
    // SAFETY: the receiver is a StoreReceiver whose store lives in the query's memory context.
    unsafe {
        let receiver = receiver.cast::<StoreReceiver>();
        if (*receiver).matches {
            pg_sys::tuplestore_puttupleslot((*receiver).store, slot);
        }
    }
    true
}

/// `rShutdown` and `rDestroy`: the receiver lives on the caller's stack.
#[pg_guard]
unsafe extern "C-unwind" fn do_nothing(_receiver: *mut pg_sys::DestReceiver) {}

/// Whether two row types have the same number of columns, of the same types.
///
/// # Safety
/// Both must be valid tuple descriptors.
unsafe fn same_column_types(a: pg_sys::TupleDesc, b: pg_sys::TupleDesc) -> bool {
    // SAFETY: the caller's descriptors; `natts` bounds their attribute arrays.
    unsafe {
        let n = (*a).natts;
        if n != (*b).natts {
            return false;
        }
        let (x, y) = (
            (*a).attrs.as_slice(n as usize),
            (*b).attrs.as_slice(n as usize),
        );
        x.iter().zip(y).all(|(x, y)| x.atttypid == y.atttypid)
    }
}

/// Serves a call of a set-returning function declared `RETURNS SETOF record`, called with a
/// column definition list, in materialize mode (`InitMaterializedSRF`: a tuple store of the
/// query's lifetime, the call site's row type): `fill` adds the rows (it may add none); its
/// error is raised.
///
/// # Safety
/// `fcinfo` must be the valid `fcinfo` Postgres' function manager passed to the function.
pub unsafe fn materialize(
    fcinfo: pg_sys::FunctionCallInfo,
    fill: impl FnOnce(&SetCall, &mut Rows) -> EvResult<()>,
) -> pg_sys::Datum {
    // SAFETY: the caller's fcinfo. InitMaterializedSRF raises an error unless `resultinfo` is a
    // ReturnSetInfo that accepts a materialized set with an expected row type; it then holds
    // the tuple store and the copy of that row type.
    unsafe {
        pg_sys::InitMaterializedSRF(fcinfo, pg_sys::MAT_SRF_USE_EXPECTED_DESC);
        let rsinfo = (*fcinfo).resultinfo.cast::<pg_sys::ReturnSetInfo>();
        let mut rows = Rows {
            store: (*rsinfo).setResult,
            desc: (*rsinfo).setDesc,
        };
        let call = SetCall { fcinfo, rsinfo };
        if let Err(e) = fill(&call, &mut rows) {
            e.into_report().report(PgLogLevel::ERROR);
        }
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
        // SAFETY: a plan this backend kept and frees once, when no execution holds it (each
        // holds an Rc of it).
        unsafe {
            pg_sys::SPI_freeplan(self.0);
        }
    }
}

type KeptKey = (String, Option<SizeClass>);

thread_local! {
    static KEPT: RefCell<HashMap<KeptKey, Rc<KeptPlan>>> = RefCell::new(HashMap::new());
}

/// The kept plan of `sql` for `sizes`, prepared now if needed.
fn kept_plan(sql: &str, sizes: Option<SizeClass>) -> EvResult<Rc<KeptPlan>> {
    let key = (sql.to_string(), sizes);
    if let Some(plan) = KEPT.with(|kept| kept.borrow().get(&key).cloned()) {
        return Ok(plan);
    }
    let text = CString::new(sql).map_err(|_| {
        EvError::new(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            "a generated statement holds a NUL character",
        )
    })?;
    // SAFETY: prepares a statement without parameters in the current SPI connection and moves
    // it to a long-lived context; a parse error raises.
    let plan = unsafe {
        let plan = pg_sys::SPI_prepare(text.as_ptr(), 0, std::ptr::null_mut());
        if plan.is_null() || pg_sys::SPI_keepplan(plan) != 0 {
            return Err(EvError::new(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                "pg_eventview: SPI could not prepare a realtime read's statement",
            ));
        }
        Rc::new(KeptPlan(plan))
    };
    KEPT.with(|kept| {
        let mut kept = kept.borrow_mut();
        // The same statement kept for the tables' former sizes is of no more use.
        kept.retain(|(text, _), _| text != sql);
        if kept.len() >= KEPT_STATEMENTS {
            kept.clear();
        }
        kept.insert(key, Rc::clone(&plan));
    });
    Ok(plan)
}

/// Runs the SELECT `sql` (no parameters) read-only, under the active snapshot (the calling
/// query's), from a plan kept per backend: one generic plan, which PostgreSQL's plan cache
/// makes again after DDL on a table it reads or an ANALYZE of one, and which is made anew for
/// another size class `sizes` of the tables it reads, as the refresh's statements are
/// (`plan_cache::Plans::PerSize`). Its rows go to `dest`, or to SPI_tuptable when it is null.
/// Inside an SPI connection.
fn execute_read_only(
    sql: &str,
    sizes: Option<SizeClass>,
    dest: *mut pg_sys::DestReceiver,
) -> EvResult<()> {
    // Held until the execution ends: a statement run meanwhile may replace it in the map.
    let plan = kept_plan(sql, sizes)?;
    let options = pg_sys::SPIExecuteOptions {
        params: std::ptr::null_mut(),
        read_only: true,
        allow_nonatomic: false,
        must_return_tuples: false,
        tcount: 0,
        dest,
        owner: std::ptr::null_mut(),
    };
    // SAFETY: executes a kept plan without parameters, read-only (the active snapshot, no
    // command counter increment); without `dest`, its result is SPI_tuptable until the next
    // SPI call.
    let status = unsafe {
        pg_sys::SPI_tuptable = std::ptr::null_mut();
        pg_sys::SPI_execute_plan_extended(plan.0, &options)
    };
    if status != pg_sys::SPI_OK_SELECT as i32 {
        return Err(EvError::new(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("pg_eventview: a realtime read's statement failed in SPI ({status})"),
        ));
    }
    Ok(())
}

/// The first column of the first row of the read-only SELECT `sql` (see `execute_read_only`),
/// as a boolean; None when there is no row or it is NULL.
pub fn read_only_bool(sql: &str) -> EvResult<Option<bool>> {
    Spi::connect(|_| {
        execute_read_only(sql, None, std::ptr::null_mut())?;
        // SAFETY: SPI_tuptable of the SELECT just run: `numvals` tuples of `tupdesc`; column 1
        // is read as a boolean (by value).
        unsafe {
            let table = pg_sys::SPI_tuptable;
            if table.is_null() || (*table).numvals == 0 {
                return Ok(None);
            }
            let mut isnull = false;
            let value = pg_sys::SPI_getbinval(*(*table).vals, (*table).tupdesc, 1, &mut isnull);
            Ok((!isnull).then(|| value.value() != 0))
        }
    })
}
