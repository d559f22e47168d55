//! Every SQL-callable function. Each one parses its arguments, calls a feature module and maps
//! the error; nothing else. JSON arguments arrive as the text of the `json` value (the
//! wrappers cast), which keeps key order and duplicates for the definition parser. The public signatures (names, defaults, regclass results) are
//! declared in `sql/api.sql`, which wraps these `_`-prefixed functions.

use crate::errors::{EvError, EvResult};
use crate::{envelope, fields, refresh, views};
use eventview_core::jsonpath_eval;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

/// Every API entry point: checks the catalog is at the library's version, then runs `f` with
/// the privilege model of `privileges` (checks against the caller, bookkeeping as the
/// extension owner), and maps its error.
fn at_boundary<T>(f: impl FnOnce() -> EvResult<T>) -> Result<T, ErrorReport> {
    crate::errors::at_boundary(|| {
        crate::catalog::require_current_version()?;
        crate::privileges::api_call(|| {
            envelope::upgrade_captures()?;
            f()
        })
    })
}

/// Lookups for the SQL-language functions: the version check, in the caller's own rights.
fn lookup<T>(f: impl FnOnce() -> EvResult<T>) -> Result<T, ErrorReport> {
    crate::errors::at_boundary(|| {
        crate::catalog::require_current_version()?;
        f()
    })
}

/// An argument that may not be SQL NULL (the functions with optional arguments are not STRICT,
/// so NULL reaches them): refused with 22004, naming it.
fn required<'a>(value: Option<&'a str>, argument: &str) -> EvResult<&'a str> {
    value.ok_or_else(|| {
        EvError::new(PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED, format!("argument \"{argument}\" must not be NULL"))
    })
}

#[pg_extern(name = "_create_event_table", volatile, parallel_unsafe)]
fn create_event_table(
    name: Option<&str>,
    retention: Option<Interval>,
    delta_retention: Option<Interval>,
) -> Result<pg_sys::Oid, ErrorReport> {
    at_boundary(|| {
        // NULL retention keeps events; the changelog is always pruned at last (default 7 days).
        let delta_retention = delta_retention.ok_or_else(|| {
            EvError::new(PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED, "argument \"delta_retention\" must not be NULL")
                .with_hint("Leave it out for the default of 7 days: applied changelog records are always pruned at last.")
        })?;
        envelope::create_event_table(required(name, "name")?, retention, Some(delta_retention))
    })
}

#[pg_extern(name = "_drop_event_table", volatile, parallel_unsafe)]
fn drop_event_table(name: &str, cascade: bool) -> Result<(), ErrorReport> {
    at_boundary(|| envelope::drop_event_table(name, cascade))
}

#[allow(clippy::too_many_arguments)]
#[pg_extern(name = "_create_view", volatile, parallel_unsafe)]
fn create_view(
    name: Option<&str>,
    source: Option<&str>,
    group_by: &str,
    measures: &str,
    event_types: Option<Vec<Option<String>>>,
    time_bucket: Option<Interval>,
    filter: Option<&str>,
    realtime: bool,
    on_type_error: &str,
) -> Result<pg_sys::Oid, ErrorReport> {
    at_boundary(|| {
        views::create_view(views::CreateViewArgs {
            name: required(name, "name")?,
            source: required(source, "source")?,
            group_by,
            measures,
            event_types,
            time_bucket,
            filter,
            realtime,
            on_type_error,
        })
    })
}

/// Forgets an event table a plain DROP TABLE took (called by eventview._follow_drop, as the
/// extension owner; not executable by PUBLIC).
#[pg_extern(name = "_forget_source", volatile, strict, parallel_unsafe)]
fn forget_source(p_source_id: i32) -> Result<(), ErrorReport> {
    at_boundary(|| envelope::forget_source(p_source_id))
}

/// Whether the changelog of event table `p_source_id` can be read now without waiting (taking
/// ACCESS SHARE on it if so; true when it is gone). eventview._pending (as the extension owner;
/// not executable by PUBLIC) leaves `pending_changes` NULL rather than make every reader of
/// eventview.views wait for a session holding the changelog (a VACUUM FULL or LOCK TABLE of it).
#[pg_extern(name = "_changelog_free", stable, strict, parallel_unsafe)]
fn changelog_free(p_source_id: i32) -> Result<bool, ErrorReport> {
    at_boundary(|| {
        let relid = crate::relation::extension_relid(&eventview_core::names::changelog_table(p_source_id));
        if relid == pg_sys::InvalidOid {
            return Ok(true);
        }
        envelope::lock_for_reading_if_free(relid)
    })
}

#[pg_extern(name = "_define_field", volatile, parallel_unsafe)]
fn define_field(
    source: Option<&str>,
    field: Option<&str>,
    path: Option<&str>,
    event_type: Option<&str>,
    version: Option<i32>,
    field_type: &str,
) -> Result<(), ErrorReport> {
    at_boundary(|| {
        fields::define_field(fields::FieldDeclaration {
            source: required(source, "source")?,
            field: required(field, "field")?,
            path: required(path, "path")?,
            event_type,
            version,
            type_name: field_type,
        })
    })
}

#[pg_extern(name = "_refresh", volatile, parallel_unsafe)]
fn refresh_view(name: &str) -> Result<i64, ErrorReport> {
    at_boundary(|| refresh::refresh(name))
}

/// `run_maintenance`'s refresh of a scheduled view: NULL, skipped, while its event table is
/// locked by another session (see `refresh::refresh_unless_locked`).
#[pg_extern(name = "_refresh_unless_locked", volatile, parallel_unsafe)]
fn refresh_view_unless_locked(name: &str) -> Result<Option<i64>, ErrorReport> {
    at_boundary(|| refresh::refresh_unless_locked(name))
}

/// `refresh_all` up to 0.6.0, which stopped at the first view that failed (0.7.0 refreshes each
/// view in a subtransaction, in SQL: sql/api.sql). Not in the current SQL (`sql = false`): the
/// symbol stays because earlier releases' install scripts declare the function, and a database
/// is created at such a version with the current library (tests/test_upgrade.py does).
#[pg_extern(name = "_refresh_all", volatile, parallel_unsafe, sql = false)]
fn refresh_all() -> Result<i64, ErrorReport> {
    at_boundary(refresh::refresh_all)
}

#[pg_extern(name = "_rebuild", volatile, parallel_unsafe)]
fn rebuild(
    name: Option<&str>,
    from_time: Option<TimestampWithTimeZone>,
    to_time: Option<TimestampWithTimeZone>,
) -> Result<i64, ErrorReport> {
    at_boundary(|| refresh::rebuild(required(name, "name")?, from_time, to_time))
}

#[pg_extern(name = "_drop_view", volatile, parallel_unsafe)]
fn drop_view(name: &str) -> Result<(), ErrorReport> {
    at_boundary(|| views::drop_view(name))
}

#[pg_extern(name = "_alter_view", volatile, parallel_unsafe)]
fn alter_view(name: Option<&str>, realtime: Option<bool>, on_type_error: Option<&str>) -> Result<(), ErrorReport> {
    at_boundary(|| views::alter_view(required(name, "name")?, realtime, on_type_error))
}

/// The event table named `name` (42P01 when missing, 22023 when not an event table), as the
/// fully qualified, quoted name that generated SQL uses.
#[pg_extern(name = "_event_table_sql", stable, parallel_safe)]
pub fn event_table_sql(name: &str) -> Result<String, ErrorReport> {
    lookup(|| crate::catalog::source_by_name(name).map(|s| s.table_sql))
}

/// The observer's payload walk before 0.6.0 (over arrays of payloads; see `shapes_step` for
/// today's). Not in the current SQL (`sql = false`): the symbol stays because the install
/// scripts of earlier releases declare the function, and a database is created at such a
/// version with the current library (tests/test_upgrade.py does) before it is updated.
#[allow(clippy::type_complexity)] // pgrx reads the column names from the type as written
#[pg_extern(name = "_payload_shapes", immutable, parallel_safe, sql = false)]
fn payload_shapes(
    event_types: Vec<Option<String>>,
    event_versions: Vec<Option<i32>>,
    payloads: pgrx::AnyArray,
) -> Result<
    TableIterator<
        'static,
        (
            name!(event_type, String),
            name!(event_version, i32),
            name!(path, String),
            name!(json_type, String),
            name!(events, i64),
        ),
    >,
    ErrorReport,
> {
    crate::errors::at_boundary(|| {
        // SAFETY: reading the element type of the array argument's type.
        if unsafe { pg_sys::get_element_type(payloads.oid()) } != pg_sys::JSONBOID {
            return Err(crate::errors::EvError::invalid("eventview._payload_shapes takes a jsonb[]"));
        }
        let mut counter = eventview_core::shapes::ShapeCounter::default();
        let mut docs = payloads.into_iter();
        for (t, v) in event_types.iter().zip(&event_versions) {
            let Some(doc) = docs.next() else { break };
            let (Some(t), Some(v), Some(doc)) = (t, v, doc) else { continue };
            pgrx::check_for_interrupts!();
            // SAFETY: a non-null element of a jsonb[] argument, alive for this call.
            let root = unsafe { crate::stored_jsonb::jsonb_root(doc.datum()) };
            counter.add_shaped(t, *v, || eventview_core::jsonb_bytes::JsonbBytes::new(root));
        }
        Ok(TableIterator::new(counter.rows().into_iter().map(|r| (r.event_type, r.event_version, r.path, r.kind.to_string(), r.events))))
    })
}

/// Transition function of `eventview._shapes_agg(event_type, event_version, payload)`, the
/// observer's payload walk (see `shapes`): walks each payload as it comes, in place (declared
/// anyelement so the stored jsonb reaches it as it is, not as text; one call per event instead
/// of arrays of payloads, which cost a copy of each payload twice).
#[pg_extern(name = "_shapes_step", immutable, parallel_safe)]
fn shapes_step(
    mut state: pgrx::Internal,
    event_type: Option<&str>,
    event_version: Option<i32>,
    payload: Option<pgrx::AnyElement>,
    fcinfo: pg_sys::FunctionCallInfo,
) -> Result<pgrx::Internal, ErrorReport> {
    crate::errors::at_boundary(|| {
        let mut context: pg_sys::MemoryContext = std::ptr::null_mut();
        // SAFETY: asks Postgres whether this call is an aggregate's, and for its context.
        if unsafe { pg_sys::AggCheckCallContext(fcinfo, &mut context) } == 0 {
            return Err(crate::errors::EvError::invalid("eventview._shapes_step is the transition function of eventview._shapes_agg"));
        }
        // SAFETY: the state lives in the aggregate's context (dropped with it), so it survives
        // the per-row context this call runs in.
        let counter = unsafe {
            pgrx::PgMemoryContexts::For(context).switch_to(|_| state.get_or_insert_default::<eventview_core::shapes::ShapeCounter>())
        };
        if let (Some(t), Some(v), Some(doc)) = (event_type, event_version, payload) {
            if doc.oid() != pg_sys::JSONBOID {
                return Err(crate::errors::EvError::invalid("eventview._shapes_agg takes a jsonb payload"));
            }
            // SAFETY: a non-null jsonb argument, alive for this call.
            let root = unsafe { crate::stored_jsonb::jsonb_root(doc.datum()) };
            counter.add_shaped(t, v, || eventview_core::jsonb_bytes::JsonbBytes::new(root));
        }
        Ok(state)
    })
}

/// Final function of `eventview._shapes_agg`: the walk's counts as a JSON array of
/// [event type, event version, path, JSON type, events, first, first without, last, before,
/// before without] (see
/// `ShapeCounter::rows`), plus per type and version a row with path and JSON type '' counting
/// the events walked (NULL when no event was walked).
#[pg_extern(name = "_shapes_final", immutable, parallel_safe)]
fn shapes_final(mut state: pgrx::Internal) -> Option<String> {
    // SAFETY: the state `_shapes_step` made (the aggregate is FINALFUNC_MODIFY = READ_WRITE:
    // the final function runs once per state, so it may take it).
    let counter = unsafe { state.get_mut::<eventview_core::shapes::ShapeCounter>() }?;
    let rows = std::mem::take(counter).rows();
    let json: Vec<serde_json::Value> =
        rows.into_iter().map(|r| {
        serde_json::json!([
            r.event_type, r.event_version, r.path, r.kind, r.events, r.first, r.first_without, r.last, r.before, r.before_without
        ])
    }).collect();
    Some(serde_json::Value::Array(json).to_string())
}

/// The runs of consecutive ids among `ids`, as (lo, hi) with a chunk number, for reading a
/// batch's changed rows by index range scans (see `eventview_core::batch::touched_rows` and `id_runs`).
#[pg_extern(name = "_id_runs", immutable, strict, parallel_safe)]
fn id_runs(ids: Vec<Option<i64>>) -> TableIterator<'static, (name!(lo, i64), name!(hi, i64), name!(chunk, i32))> {
    let mut ids: Vec<i64> = ids.into_iter().flatten().collect();
    TableIterator::new(eventview_core::batch::id_runs(&mut ids))
}

/// `eventview.views.groups` (see `views::group_count`). Not an API call: a read of the catalog
/// view, by anyone, also before the catalog is updated to the library's version. Declared in
/// sql/bootstrap.sql (`sql = false`), ahead of the catalog view that calls it.
#[pg_extern(name = "_group_count", stable, strict, parallel_unsafe, sql = false)]
pub fn group_count(p_view_id: i32) -> Result<Option<i64>, ErrorReport> {
    crate::errors::at_boundary(|| views::group_count(p_view_id))
}

/// `eventview.views.last_error` when something keeps the view from being refreshed now (see
/// `views::refresh_problem`). Not an API call, as `group_count`; declared in sql/bootstrap.sql.
#[pg_extern(name = "_refresh_problem", stable, strict, parallel_unsafe, sql = false)]
pub fn refresh_problem(p_view_id: i32) -> Result<Option<String>, ErrorReport> {
    // As the API says it (relations named with search_path pinned); only catalogs are read.
    crate::errors::at_boundary(|| crate::privileges::api_call(|| views::refresh_problem(p_view_id)))
}

/// The internal id of the incremental view named `name` (42P01 / 22023 otherwise).
#[pg_extern(name = "_view_id", stable, parallel_safe)]
pub fn view_id(name: &str) -> Result<i32, ErrorReport> {
    lookup(|| crate::catalog::view_by_name(name, false).map(|v| v.view_id))
}

/// First match of a JSONPath that native operators cannot evaluate (see `eventview_core::jsonpath`), as
/// a refresh evaluates it: NULL for a payload nested too deep to evaluate, which the refresh then
/// tells apart from a missing value with `_jsonpath_too_deep` and handles per its type policy.
#[pg_extern(name = "_jsonpath_match", immutable, strict, parallel_safe)]
fn jsonpath_match(doc: &str, path: &str) -> Result<Option<pgrx::JsonB>, ErrorReport> {
    crate::errors::at_boundary(|| {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(doc) else {
            return Ok(None);
        };
        jsonpath_eval::first_match(&value, path)
            .map(|v| v.map(pgrx::JsonB))
            .map_err(|e| crate::errors::EvError::invalid(format!("invalid JSONPath \"{path}\": {e}")))
    })
}

/// Brings observed_fields and drift up to date for every event table the caller owns or reads
/// through its views (all, for a superuser); run_maintenance calls it so that a table without
/// refreshed views still moves its observer on (its changelog could never be pruned otherwise).
#[pg_extern(name = "_observe_all", volatile, parallel_unsafe)]
fn observe_all() -> Result<(), ErrorReport> {
    at_boundary(refresh::observe_all)
}

/// Whether `_prune_events` may delete from the event table without waiting for a lock (taking
/// the lock when it may; see `envelope::lock_for_writing_if_free`). Only for members of the
/// table's owner role, as prune: nobody else may hold locks on it.
#[pg_extern(name = "_lock_for_pruning_if_free", volatile, parallel_unsafe)]
fn lock_for_pruning_if_free(source: pg_sys::Oid) -> Result<bool, ErrorReport> {
    lookup(|| {
        crate::privileges::require_table_owner(source, "prune")?;
        envelope::lock_for_writing_if_free(source)
    })
}

/// prune's deletion of raw events past retention (see `envelope::prune_events`).
#[pg_extern(name = "_prune_events", volatile, parallel_unsafe)]
fn prune_events(source: pg_sys::Oid, retention: pgrx::datum::Interval, max_rows: i64) -> Result<i64, ErrorReport> {
    lookup(|| envelope::prune_events(source, retention, max_rows))
}

/// Whether a string is an RFC 3339 timestamp (see `eventview_core::rfc3339`); `eventview._rfc3339` uses it.
#[pg_extern(name = "_rfc3339_valid", immutable, strict, parallel_safe)]
pub fn rfc3339_valid(s: &str) -> bool {
    eventview_core::rfc3339::is_valid(s)
}

/// The ingest gate's check of one envelope (see `eventview_core::envelope_check`): NULL when it is good,
/// else the number of its first problem. `envelope` is a jsonb, declared anyelement so that the
/// stored value reaches the check as it is (pgrx would pass a jsonb argument through its text).
#[pg_extern(name = "_envelope_problem", immutable, strict, parallel_safe)]
pub fn envelope_problem(envelope: pgrx::AnyElement, max_payload_bytes: i64) -> Result<Option<i32>, ErrorReport> {
    crate::errors::at_boundary(|| {
        // SAFETY: a catalog lookup of the argument's type.
        if unsafe { pg_sys::getBaseType(envelope.oid()) } != pg_sys::JSONBOID {
            return Err(crate::errors::EvError::new(
                PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                "eventview._envelope_problem takes a jsonb",
            ));
        }
        // SAFETY: a non-null jsonb argument (the function is strict), alive for this call.
        let root = unsafe { crate::stored_jsonb::jsonb_root(envelope.datum()) };
        let limit = u64::try_from(max_payload_bytes).unwrap_or(0);
        Ok(eventview_core::envelope_check::check(root, limit).map(|problem| problem as i32))
    })
}

/// Counts one event read by a full recomputation and reports progress (see `progress`).
#[pg_extern(name = "_progress_tick", volatile, parallel_unsafe)]
fn progress_tick() -> bool {
    crate::progress::tick()
}

/// Whether a payload nests deeper than rich JSONPaths can evaluate (`eventview_core::jsonpath::RICH_MAX_NESTING`).
#[pg_extern(name = "_jsonpath_too_deep", immutable, strict, parallel_safe)]
fn jsonpath_too_deep(doc: &str) -> bool {
    jsonpath_eval::too_deep(doc)
}

/// First match of a JSONPath that native operators cannot evaluate (see `eventview_core::jsonpath`),
/// taking the document as JSON text: a document too deep to evaluate gets a clear 22023 error
/// naming the path, not an internal one. `eventview.jsonpath_first(jsonb, text)` wraps it.
#[pg_extern(name = "_jsonpath_first", immutable, strict, parallel_safe)]
fn jsonpath_first(doc: &str, path: &str) -> Result<Option<pgrx::JsonB>, ErrorReport> {
    crate::errors::at_boundary(|| {
        let value: serde_json::Value = serde_json::from_str(doc).map_err(|e| {
            crate::errors::EvError::invalid(format!("cannot evaluate JSONPath \"{path}\" on this payload: {e}"))
                .with_hint("Paths with wildcards, filters or descendants (..) are evaluated on payloads nested at most 127 levels deep; use a path of names and indexes.")
        })?;
        jsonpath_eval::first_match(&value, path)
            .map(|v| v.map(pgrx::JsonB))
            .map_err(|e| crate::errors::EvError::invalid(format!("invalid JSONPath \"{path}\": {e}")))
    })
}
