//! The refresh pass in Rust as the aggregate `eventview._group_deltas` (see
//! `eventview_core::group_deltas` and `crate::pg::group_deltas`, which also has the
//! set-returning function that reads its result).

use crate::errors::{at_boundary, EvError};
use crate::pg::group_deltas::{EventRow, PassState};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

/// Transition function of `eventview._group_deltas(plan, width, sign, event_id, event_type,
/// event_version, producer, occurred_at, payload)`: one signed event row of a refresh's batch
/// (the payload declared anyelement, so the stored jsonb reaches it as it is, not as text).
#[allow(clippy::too_many_arguments)]
#[pg_extern(name = "_group_deltas_step", parallel_unsafe)]
fn group_deltas_step(
    mut state: pgrx::Internal,
    plan: Option<&str>,
    width: Option<Interval>,
    sign: Option<i32>,
    event_id: Option<i64>,
    event_type: Option<&str>,
    event_version: Option<i32>,
    producer: Option<&str>,
    occurred_at: Option<TimestampWithTimeZone>,
    payload: Option<pgrx::AnyElement>,
    fcinfo: pg_sys::FunctionCallInfo,
) -> Result<pgrx::Internal, ErrorReport> {
    at_boundary(|| {
        let Some(pass) = crate::pg::aggregate::aggregate_state::<PassState>(fcinfo, &mut state)
        else {
            return Err(EvError::invalid(
                "eventview._group_deltas_step is the transition function of eventview._group_deltas",
            ));
        };
        let (
            Some(plan),
            Some(sign),
            Some(event_id),
            Some(event_type),
            Some(event_version),
            Some(producer),
            Some(occurred_at),
            Some(payload),
        ) = (
            plan,
            sign,
            event_id,
            event_type,
            event_version,
            producer,
            occurred_at,
            payload,
        )
        else {
            return Err(EvError::invalid(
                "eventview._group_deltas takes no NULL but the bucket width",
            ));
        };
        let Some(root) = crate::pg::stored_jsonb::jsonb_argument(&payload, false) else {
            return Err(EvError::invalid(
                "eventview._group_deltas takes a jsonb payload",
            ));
        };
        let row = EventRow {
            sign,
            event_id,
            event_type,
            event_version,
            producer,
            occurred_at: occurred_at.into_inner(),
        };
        let width = width.map(|w| (w.months(), w.days(), w.micros()));
        pass.add(plan, width, &row, root)?;
        Ok(state)
    })
}

/// Final function of `eventview._group_deltas`: the token under which
/// `eventview._group_delta_rows` reads the pass's result in the same statement; NULL when the
/// batch had no row.
#[pg_extern(name = "_group_deltas_final", parallel_unsafe)]
fn group_deltas_final(
    mut state: pgrx::Internal,
    fcinfo: pg_sys::FunctionCallInfo,
) -> Result<Option<Vec<u8>>, ErrorReport> {
    at_boundary(|| {
        let Some(pass) = crate::pg::aggregate::take_aggregate_state::<PassState>(&mut state) else {
            return Ok(None);
        };
        crate::pg::group_deltas::hand_over(fcinfo, pass)
    })
}
