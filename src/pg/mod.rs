//! The PostgreSQL layer: SPI helpers, statements prepared once per backend, relation locks,
//! role switches, GUC nest levels and stored jsonb datums. Every `unsafe` block of the
//! extension is here, each with a `SAFETY:` line; the modules above call safe functions.

pub mod guc;
pub mod locks;
pub mod plan_cache;
pub mod roles;
pub mod spi;
pub mod stored_jsonb;
