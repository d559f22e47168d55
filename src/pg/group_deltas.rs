//! The refresh pass in Rust (`eventview_core::group_deltas`) as PostgreSQL calls it: the state
//! of the aggregate `eventview._group_deltas`, the bucket of an event as `date_bin` gives it,
//! numeric sums, and the set-returning function `eventview._group_delta_rows` that reads the
//! pass's result in parts.
//!
//! The aggregate's final function hands its result over to this backend's registry under a
//! random token, which it returns as its value (bytea); `_group_delta_rows(token, part)` reads
//! the rows of a part from there. The result stays until the aggregate's memory context goes
//! (the end of the statement, or its abort), whose reset callback removes it: no copy of the
//! rows into a value (which could not pass 1 GB), and nothing left behind. The field
//! observer's statement, which runs a view's pass for the view's apply to take
//! (`keeping_pass`), keeps its result until the refresh drops it (`KeptPass`). (A plain aggregate's
//! context is reset only when its node ends or is rescanned, and the statement reads it through
//! a MATERIALIZED CTE, which is never rescanned: the result outlives every reader.)

use std::cell::RefCell;
use std::collections::HashMap;

use eventview_core::group_deltas::{Added, Cell, Deltas, Plan, TypeErrorEvent};
use pgrx::prelude::*;

use crate::errors::{EvError, EvResult};

/// The transition state of `eventview._group_deltas`: the pass, once its plan is read.
#[derive(Default)]
pub struct PassState {
    pass: Option<Pass>,
}

struct Pass {
    deltas: Deltas,
    /// The bucket width (the view's), when the view is bucketed.
    width: Option<pg_sys::Interval>,
}

/// One signed event row of the batch, as the aggregate takes it.
pub struct EventRow<'a> {
    pub sign: i32,
    pub event_id: i64,
    pub event_type: &'a str,
    pub event_version: i32,
    pub producer: &'a str,
    pub occurred_at: i64,
}

/// The bucket width the aggregate was given: months, days, microseconds.
pub type Width = (i32, i32, i64);

impl PassState {
    /// Adds an event row with its payload's stored jsonb root; the first call reads the plan.
    pub fn add(
        &mut self,
        plan: &str,
        width: Option<Width>,
        row: &EventRow,
        payload: &[u8],
    ) -> EvResult<()> {
        if self.pass.is_none() {
            let plan = Plan::from_text(plan).map_err(EvError::invalid)?;
            let width = width.map(|(month, day, time)| pg_sys::Interval { time, day, month });
            self.pass = Some(Pass {
                deltas: Deltas::new(plan),
                width,
            });
        }
        let pass = self.pass.as_mut().expect("made above");
        let bucket = if pass.deltas.plan().bucketed() {
            let Some(width) = &pass.width else {
                return Err(EvError::invalid(
                    "eventview._group_deltas needs the bucket width of a bucketed view",
                ));
            };
            Some(bucket(width, row.occurred_at))
        } else {
            None
        };
        match pass
            .deltas
            .add(row.sign, row.event_type, row.event_version, bucket, payload)
        {
            Added::Counted => {}
            Added::TypeError if row.sign > 0 => pass.deltas.keep_type_error(TypeErrorEvent {
                event_id: row.event_id,
                event_type: row.event_type.to_string(),
                event_version: row.event_version,
                producer: row.producer.to_string(),
                occurred_at: row.occurred_at,
                payload: payload.to_vec(),
            }),
            Added::TypeError => {}
            Added::Unreadable => {
                return Err(EvError::new(
                    pgrx::PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
                    format!(
                        "the payload of event {} is not readable jsonb",
                        row.event_id
                    ),
                ))
            }
        }
        Ok(())
    }
}

unsafe extern "C-unwind" {
    /// `date_bin(interval, timestamptz, timestamptz)`, as a function pointer for
    /// DirectFunctionCall3Coll (pgrx's bindings are Rust wrappers).
    #[link_name = "timestamptz_bin"]
    fn timestamptz_bin_fn(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum;
    /// `numeric_in(cstring, oid, integer)`, likewise.
    #[link_name = "numeric_in"]
    fn numeric_in_fn(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum;
}

/// `date_bin(width, ts, '2000-01-01 00:00:00+00')`, by PostgreSQL's own function (its errors
/// included), as the SQL stages compute the bucket.
fn bucket(width: &pg_sys::Interval, occurred_at: i64) -> i64 {
    // SAFETY: timestamptz_bin reads an interval pointer and two timestamps and returns a
    // timestamp by value; the interval outlives the call. The origin, 2000-01-01 00:00 UTC, is
    // PostgreSQL's epoch: 0.
    unsafe {
        pg_sys::DirectFunctionCall3Coll(
            Some(timestamptz_bin_fn),
            pg_sys::InvalidOid,
            pg_sys::Datum::from(width as *const pg_sys::Interval),
            pg_sys::Datum::from(occurred_at),
            pg_sys::Datum::from(0i64),
        )
        .value() as i64
    }
}

thread_local! {
    /// The results of the passes of the statements running in this backend, by token.
    static RESULTS: RefCell<HashMap<[u8; 16], Deltas>> = RefCell::new(HashMap::new());
    /// While `keeping_pass` runs its statement: the tokens of the results handed over meanwhile,
    /// which outlive the statement (see `keeping_pass`).
    static KEEPING: RefCell<Option<Vec<[u8; 16]>>> = const { RefCell::new(None) };
}

/// A pass's result kept past the end of the statement that made it, for a later statement of
/// the same refresh to read by its token (`token`); removed from the registry when dropped
/// (also when the refresh fails and unwinds).
pub struct KeptPass {
    token: [u8; 16],
    /// The event rows the batch's records name (what the apply counts consumed).
    pub batch_rows: i64,
}

impl KeptPass {
    /// The token to read the result by (`eventview._group_delta_rows`).
    pub fn token(&self) -> Vec<u8> {
        self.token.to_vec()
    }
}

impl Drop for KeptPass {
    fn drop(&mut self) {
        forget(&self.token);
    }
}

/// Removes the result of `token` from the registry. Called while no reader holds the registry
/// (an error in a reader unwinds through it before any context is reset or any `KeptPass` is
/// dropped); try_borrow_mut keeps it from ever panicking (in a reset callback), at the cost of
/// an entry left for the backend's life should that change.
fn forget(token: &[u8; 16]) {
    RESULTS.with(|results| {
        if let Ok(mut results) = results.try_borrow_mut() {
            results.remove(token);
        }
    });
}

/// While `keeping_pass` runs its statement: restores `KEEPING` as it was before, and forgets
/// what the statement kept unless `keeping_pass` took it (when the statement failed).
struct Keeping {
    before: Option<Vec<[u8; 16]>>,
}

impl Keeping {
    /// The tokens kept meanwhile, `KEEPING` restored.
    fn end(mut self) -> Vec<[u8; 16]> {
        let before = self.before.take();
        let kept = KEEPING.with_borrow_mut(|keeping| std::mem::replace(keeping, before));
        std::mem::forget(self);
        kept.unwrap_or_default()
    }
}

impl Drop for Keeping {
    fn drop(&mut self) {
        let before = self.before.take();
        let kept = KEEPING.with(|keeping| {
            keeping
                .try_borrow_mut()
                .ok()
                .and_then(|mut k| std::mem::replace(&mut *k, before))
        });
        for token in kept.into_iter().flatten() {
            forget(&token);
        }
    }
}

/// Runs `statement`, keeping the result of a pass it hands over past its end. `statement`
/// returns the token its pass's result has (the final value of `eventview._group_deltas`, or
/// None) and the event rows of its batch; that result is then kept as a `KeptPass` until it
/// is dropped. Results handed over
/// meanwhile under any other token are forgotten when the statement ends, as are all of them
/// when it fails (only the extension's own statements run here:
/// `observer::observe_with_pass`).
pub fn keeping_pass<E>(
    statement: impl FnOnce() -> Result<(Option<Vec<u8>>, i64), E>,
) -> Result<Option<KeptPass>, E> {
    let keeping = Keeping {
        before: KEEPING.with_borrow_mut(|keeping| keeping.replace(Vec::new())),
    };
    let (token, batch_rows) = statement()?;
    let kept = keeping.end();
    let wanted = token.and_then(|t| <[u8; 16]>::try_from(t.as_slice()).ok());
    let mut out = None;
    for token in kept {
        if Some(token) == wanted {
            out = Some(KeptPass { token, batch_rows });
        } else {
            forget(&token);
        }
    }
    Ok(out)
}

/// How many pass results this backend holds (for tests: none once no statement runs and no
/// `KeptPass` is alive).
#[cfg(any(test, feature = "pg_test"))]
pub fn results_held() -> usize {
    RESULTS.with_borrow(|results| results.len())
}

/// Hands the pass's result over to the registry (see the module's doc) and returns its token;
/// None when no row was added. `fcinfo`: the final function's call, whose aggregate context
/// removes the result when it goes, unless `keeping_pass` keeps it.
pub fn hand_over(fcinfo: pg_sys::FunctionCallInfo, state: PassState) -> EvResult<Option<Vec<u8>>> {
    let Some(pass) = state.pass else {
        return Ok(None);
    };
    let mut token = [0u8; 16];
    let mut context: pg_sys::MemoryContext = std::ptr::null_mut();
    // SAFETY: fills the token from the strong random source; asks for the aggregate's context;
    // registers, in that context, a callback whose argument (a copy of the token) is allocated
    // there too, so both go with the context.
    unsafe {
        if !pg_sys::pg_strong_random(token.as_mut_ptr().cast(), token.len()) {
            return Err(EvError::new(
                pgrx::PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                "could not generate a random token",
            ));
        }
        if pg_sys::AggCheckCallContext(fcinfo, &mut context) == 0 {
            return Err(EvError::invalid(
                "eventview._group_deltas_final is the final function of eventview._group_deltas",
            ));
        }
    }
    // Kept past the statement (`keeping_pass`): no callback ties the result to the context.
    let kept = KEEPING.with_borrow_mut(|keeping| keeping.as_mut().map(|k| k.push(token)).is_some());
    if kept {
        RESULTS.with_borrow_mut(|results| results.insert(token, pass.deltas));
        return Ok(Some(token.to_vec()));
    }
    // SAFETY: as above.
    unsafe {
        let kept = pg_sys::MemoryContextAlloc(context, token.len()).cast::<[u8; 16]>();
        kept.write(token);
        let callback = pg_sys::MemoryContextAlloc(
            context,
            std::mem::size_of::<pg_sys::MemoryContextCallback>(),
        )
        .cast::<pg_sys::MemoryContextCallback>();
        callback.write(pg_sys::MemoryContextCallback {
            func: Some(forget_result),
            arg: kept.cast(),
            next: std::ptr::null_mut(),
        });
        pg_sys::MemoryContextRegisterResetCallback(context, callback);
    }
    RESULTS.with_borrow_mut(|results| results.insert(token, pass.deltas));
    Ok(Some(token.to_vec()))
}

/// The reset callback of `hand_over`: removes the result of the token at `arg`.
unsafe extern "C-unwind" fn forget_result(arg: *mut std::ffi::c_void) {
    // SAFETY: `arg` is the token `hand_over` allocated in the context being reset.
    let token = unsafe { *arg.cast::<[u8; 16]>() };
    forget(&token);
}

/// Tells Postgres that `group_delta_rows` uses the version-1 calling convention.
#[unsafe(no_mangle)]
#[doc(hidden)]
pub extern "C" fn pg_finfo_group_delta_rows() -> &'static pg_sys::Pg_finfo_record {
    const V1_API: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1_API
}

/// `eventview._group_delta_rows(token bytea, part integer) RETURNS SETOF record`, STRICT: the
/// rows of part `part` of the pass's result of `token`, in the columns of the column definition
/// list the call gives (`Plan::group_columns`, `value_columns`, `TYPE_ERROR_COLUMNS`).
///
/// # Safety
/// Called by Postgres' function manager with a valid `fcinfo`.
#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn group_delta_rows(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: the function is STRICT, so both arguments are non-null: a bytea and an integer.
    let (token, part) = unsafe {
        let args = (*fcinfo).args.as_slice(2);
        let value = pg_sys::pg_detoast_datum_packed(args[0].value.cast_mut_ptr());
        let len = pgrx::varsize_any_exhdr(value);
        let bytes = std::slice::from_raw_parts(pgrx::vardata_any(value).cast::<u8>(), len);
        (
            <[u8; 16]>::try_from(bytes).ok(),
            args[1].value.value() as i32,
        )
    };
    // SAFETY: makes the call's result a tuplestore in the column definition list's shape.
    let (store, desc) = unsafe {
        pg_sys::InitMaterializedSRF(fcinfo, pg_sys::MAT_SRF_USE_EXPECTED_DESC);
        let rsinfo = (*fcinfo).resultinfo.cast::<pg_sys::ReturnSetInfo>();
        ((*rsinfo).setResult, (*rsinfo).setDesc)
    };
    // SAFETY: the descriptor InitMaterializedSRF made, with natts attributes.
    let types: Vec<pg_sys::Oid> = unsafe {
        (*desc)
            .attrs
            .as_slice((*desc).natts as usize)
            .iter()
            .map(|a| a.atttypid)
            .collect()
    };
    let found = RESULTS.with_borrow(|results| {
        let deltas = token.and_then(|t| results.get(&t))?;
        let mut values: Vec<pg_sys::Datum> = vec![pg_sys::Datum::from(0); types.len()];
        let mut nulls: Vec<bool> = vec![false; types.len()];
        deltas.rows(part, numeric_sum, |row| {
            if row.len() != types.len() {
                error!(
                    "eventview._group_delta_rows: part {part} has {} columns, not {}",
                    row.len(),
                    types.len()
                );
            }
            for (i, (cell, &type_oid)) in row.iter().zip(&types).enumerate() {
                (values[i], nulls[i]) = datum(cell, type_oid, i);
            }
            // SAFETY: one value and null flag per column of the store's descriptor.
            unsafe {
                pg_sys::tuplestore_putvalues(store, desc, values.as_mut_ptr(), nulls.as_mut_ptr())
            };
        });
        Some(())
    });
    if found.is_none() {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "no result of eventview._group_deltas has this token",
            "eventview._group_delta_rows reads a result in the statement that made it, or in the apply of the refresh whose field observer made it, as a refresh does."
        );
    }
    pg_sys::Datum::from(0)
}

/// The datum of a cell for a column of type `type_oid` (the `i`th), and whether it is NULL.
/// Each kind of cell fills only a column of its own type: the column definition list is the
/// caller's, and a text or numeric read as another type could be read out of its bounds.
fn datum(cell: &Cell, type_oid: pg_sys::Oid, i: usize) -> (pg_sys::Datum, bool) {
    let wanted = match cell {
        Cell::Null => type_oid,
        Cell::Bool(_) => pg_sys::BOOLOID,
        Cell::Int4(_) => pg_sys::INT4OID,
        Cell::Int8(_) => pg_sys::INT8OID,
        Cell::Timestamptz(_) => pg_sys::TIMESTAMPTZOID,
        Cell::Text(_) => pg_sys::TEXTOID,
        Cell::Numeric(_) => pg_sys::NUMERICOID,
        Cell::Jsonb(_) => pg_sys::JSONBOID,
        Cell::NumericArray(_) => pg_sys::NUMERICARRAYOID,
    };
    if wanted != type_oid {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
            format!(
                "column {} of eventview._group_delta_rows is of type {}, not {}",
                i + 1,
                type_oid.to_u32(),
                wanted.to_u32()
            )
        );
    }
    match cell {
        Cell::Null => (pg_sys::Datum::from(0), true),
        Cell::Bool(v) => (pg_sys::Datum::from(*v), false),
        Cell::Int4(v) => (pg_sys::Datum::from(*v), false),
        Cell::Int8(v) | Cell::Timestamptz(v) => (pg_sys::Datum::from(*v), false),
        Cell::Text(bytes) | Cell::Numeric(bytes) | Cell::Jsonb(bytes) => (varlena(bytes), false),
        Cell::NumericArray(items) => {
            let mut datums: Vec<pg_sys::Datum> = items.iter().map(|b| varlena(b)).collect();
            // SAFETY: an array of numeric datums (varlena, 4-byte aligned), copied into it.
            let array = unsafe {
                pg_sys::construct_array(
                    datums.as_mut_ptr(),
                    datums.len() as i32,
                    pg_sys::NUMERICOID,
                    -1,
                    false,
                    pg_sys::TYPALIGN_INT as std::ffi::c_char,
                )
            };
            (pg_sys::Datum::from(array), false)
        }
    }
}

/// A varlena with a 4-byte header holding `payload`, in the current memory context.
fn varlena(payload: &[u8]) -> pg_sys::Datum {
    // SAFETY: a fresh palloc of the header and payload (MAXALIGNed), its header set, the
    // payload copied after it.
    unsafe {
        let total = payload.len() + pg_sys::VARHDRSZ;
        let value = pg_sys::palloc(total).cast::<pg_sys::varlena>();
        pgrx::set_varsize_4b(value, total as i32);
        std::ptr::copy_nonoverlapping(
            payload.as_ptr(),
            value.cast::<u8>().add(pg_sys::VARHDRSZ),
            payload.len(),
        );
        pg_sys::Datum::from(value)
    }
}

/// The payload of the numeric sum of `decimal` (its text) and the signed values (numeric
/// payloads) after it: as `coalesce(sum(sign * value), 0)` gives it (its display scale the
/// largest of the values').
fn numeric_sum(decimal: &str, signed: &[(bool, &[u8])]) -> Vec<u8> {
    let text = std::ffi::CString::new(decimal).expect("a decimal's text has no NUL");
    // SAFETY: numeric_in reads a C string (alive for the call) and returns a numeric; numeric
    // arithmetic on numeric datums made here; the result is read as a varlena.
    unsafe {
        let mut sum = pg_sys::DirectFunctionCall3Coll(
            Some(numeric_in_fn),
            pg_sys::InvalidOid,
            pg_sys::Datum::from(text.as_ptr()),
            pg_sys::Datum::from(pg_sys::InvalidOid),
            pg_sys::Datum::from(-1i32),
        )
        .cast_mut_ptr::<pg_sys::NumericData>();
        for (added, value) in signed {
            let value = varlena(value).cast_mut_ptr::<pg_sys::NumericData>();
            // No error flag: an overflow raises PostgreSQL's own error, as sum() would.
            sum = if *added {
                pg_sys::numeric_add_opt_error(sum, value, std::ptr::null_mut())
            } else {
                pg_sys::numeric_sub_opt_error(sum, value, std::ptr::null_mut())
            };
        }
        let sum = sum.cast::<pg_sys::varlena>();
        std::slice::from_raw_parts(
            pgrx::vardata_any(sum).cast::<u8>(),
            pgrx::varsize_any_exhdr(sum),
        )
        .to_vec()
    }
}
