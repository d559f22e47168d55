//! The PostgreSQL layer: SPI helpers, statements prepared once per backend, relation locks,
//! role switches, GUC nest levels, the relation cache and stored jsonb datums. The extension's
//! `unsafe` blocks are here, each with a `SAFETY:` line, apart from the few the module map in
//! lib.rs lists (where pgrx hands over raw backend state); the modules above call safe functions.

pub mod guc;
pub mod locks;
pub mod plan_cache;
pub mod relcache;
pub mod roles;
pub mod spi;
pub mod stored_jsonb;

use pgrx::prelude::*;

/// The next transaction id the cluster will give out, as a 64-bit number.
pub fn next_full_transaction_id() -> u64 {
    // SAFETY: reads the shared next transaction id (under its lock); no side effects.
    unsafe { pg_sys::ReadNextFullTransactionId() }.value
}
