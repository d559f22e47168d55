//! The transition states of the extension's aggregates, kept in the aggregate's memory context
//! between calls: the observer's `ShapeCounter` (`eventview._shapes_agg`) and the refresh
//! pass's `PassState` (`eventview._group_deltas`).

use pgrx::prelude::*;

/// A type that is the transition state of exactly one aggregate, whose transition and final
/// functions alone read it: what makes the casts of `pgrx::Internal` below sound.
pub trait AggregateState: Default + 'static {}

impl AggregateState for eventview_core::shapes::ShapeCounter {}
impl AggregateState for crate::pg::group_deltas::PassState {}

/// The state of the aggregate call `fcinfo`, made in the aggregate's memory context when it is
/// still empty; None when the call is not an aggregate's.
pub fn aggregate_state<T: AggregateState>(
    fcinfo: pg_sys::FunctionCallInfo,
    state: &mut pgrx::Internal,
) -> Option<&mut T> {
    let mut context: pg_sys::MemoryContext = std::ptr::null_mut();
    // SAFETY: asks Postgres whether this call is an aggregate's, and for its context.
    if unsafe { pg_sys::AggCheckCallContext(fcinfo, &mut context) } == 0 {
        return None;
    }
    // SAFETY: the state lives in the aggregate's context (dropped with it), so it survives the
    // per-row context this call runs in; it holds a T (`AggregateState`) or nothing.
    Some(unsafe {
        pgrx::PgMemoryContexts::For(context).switch_to(|_| state.get_or_insert_default::<T>())
    })
}

/// The state the transition function made, taken by the final function (the aggregates are
/// FINALFUNC_MODIFY = READ_WRITE: the final function runs once per state, so it may take it).
pub fn take_aggregate_state<T: AggregateState>(state: &mut pgrx::Internal) -> Option<T> {
    // SAFETY: the state holds a T made by `aggregate_state` (`AggregateState`).
    unsafe { state.get_mut::<T>() }.map(std::mem::take)
}
