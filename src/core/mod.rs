//! The pure core: everything that needs no running Postgres. No pgrx imports here, so it is
//! tested with plain `cargo test` and its generated SQL can be read and snapshot-tested.

pub mod batch;
pub mod definition;
pub(crate) mod fuzz;
pub mod envelope_check;
pub mod envelope_sql;
pub mod jsonb_bytes;
pub mod jsonpath;
pub mod names;
pub mod observe_sql;
pub mod ordered_json;
pub mod quote;
pub mod rfc3339;
pub mod sqlgen;
pub mod values;
