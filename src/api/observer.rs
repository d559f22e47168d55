//! The field observer's payload walk, as the aggregate `eventview._shapes_agg`, and
//! `observe_all`.

use super::at_boundary;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

/// Declared by the install scripts of releases up to 0.5.0, whose observer walked arrays of
/// payloads with it; not in the current SQL (`sql = false`). The symbol lets a database at such
/// a version load this library until `ALTER EXTENSION pg_eventview UPDATE`, and says so when
/// called.
/// (The Rust name gives the C symbol, `<name>_wrapper`, those install scripts name.)
#[allow(clippy::type_complexity)] // pgrx reads the column names from the type as written
#[pg_extern(name = "_payload_shapes", immutable, parallel_safe, sql = false)]
fn payload_shapes(
    _event_types: Vec<Option<String>>,
    _event_versions: Vec<Option<i32>>,
    _payloads: pgrx::AnyArray,
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
    Err(super::needs_update(
        "eventview._payload_shapes(text[], integer[], anyarray)",
    ))
}

/// Transition function of `eventview._shapes_agg(event_type, event_version, payload)`, the
/// observer's payload walk (see `eventview_core::shapes`): walks each payload as it comes, in
/// place (declared anyelement so the stored jsonb reaches it as it is, not as text; one call per
/// event, as an array of payloads would cost a copy of each payload twice).
#[pg_extern(name = "_shapes_step", immutable, parallel_safe)]
fn shapes_step(
    mut state: pgrx::Internal,
    event_type: Option<&str>,
    event_version: Option<i32>,
    payload: Option<pgrx::AnyElement>,
    fcinfo: pg_sys::FunctionCallInfo,
) -> Result<pgrx::Internal, ErrorReport> {
    crate::errors::at_boundary(|| {
        let Some(counter) = crate::pg::aggregate::aggregate_state::<
            eventview_core::shapes::ShapeCounter,
        >(fcinfo, &mut state) else {
            return Err(crate::errors::EvError::invalid(
                "eventview._shapes_step is the transition function of eventview._shapes_agg",
            ));
        };
        if let (Some(t), Some(v), Some(doc)) = (event_type, event_version, payload) {
            let Some(root) = crate::pg::stored_jsonb::jsonb_argument(&doc, false) else {
                return Err(crate::errors::EvError::invalid(
                    "eventview._shapes_agg takes a jsonb payload",
                ));
            };
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
    let rows = crate::pg::aggregate::take_aggregate_state::<eventview_core::shapes::ShapeCounter>(
        &mut state,
    )?
    .rows();
    let json: Vec<serde_json::Value> = rows
        .into_iter()
        .map(|r| {
            serde_json::json!([
                r.event_type,
                r.event_version,
                r.path,
                r.kind,
                r.events,
                r.first,
                r.first_without,
                r.last,
                r.before,
                r.before_without
            ])
        })
        .collect();
    Some(serde_json::Value::Array(json).to_string())
}

/// Brings observed_fields and drift up to date for every event table the caller owns or reads
/// through its views (all, for a superuser); run_maintenance calls it so that a table without
/// refreshed views still moves its observer on (its changelog could never be pruned otherwise).
#[pg_extern(name = "_observe_all", volatile, parallel_unsafe)]
fn observe_all() -> Result<(), ErrorReport> {
    at_boundary(crate::refresh::observe_all)
}
