//! The transition state of the aggregate `eventview._shapes_agg`: the observer's
//! `ShapeCounter`, kept in the aggregate's memory context between calls.

use eventview_core::shapes::ShapeCounter;
use pgrx::prelude::*;

/// The counter of the aggregate call `fcinfo`, made in the aggregate's memory context when the
/// state is still empty; None when the call is not an aggregate's. Only `eventview._shapes_agg`
/// passes its state here, so the state is always a `ShapeCounter`.
pub fn shape_counter(
    fcinfo: pg_sys::FunctionCallInfo,
    state: &mut pgrx::Internal,
) -> Option<&mut ShapeCounter> {
    let mut context: pg_sys::MemoryContext = std::ptr::null_mut();
    // SAFETY: asks Postgres whether this call is an aggregate's, and for its context.
    if unsafe { pg_sys::AggCheckCallContext(fcinfo, &mut context) } == 0 {
        return None;
    }
    // SAFETY: the state lives in the aggregate's context (dropped with it), so it survives the
    // per-row context this call runs in; it holds a ShapeCounter or nothing.
    Some(unsafe {
        pgrx::PgMemoryContexts::For(context)
            .switch_to(|_| state.get_or_insert_default::<ShapeCounter>())
    })
}

/// The counter the transition function made, taken by the final function (the aggregate is
/// FINALFUNC_MODIFY = READ_WRITE: the final function runs once per state, so it may take it).
pub fn take_shape_counter(state: &mut pgrx::Internal) -> Option<ShapeCounter> {
    // SAFETY: the state of `eventview._shapes_agg` holds a ShapeCounter made by `shape_counter`.
    unsafe { state.get_mut::<ShapeCounter>() }.map(std::mem::take)
}
