//! eventview-core: everything of pg_eventview that needs no running PostgreSQL. It imports
//! nothing of pgrx, so it builds and tests with plain `cargo test -p eventview-core`, and the
//! SQL it generates can be read and compared with golden files.

pub mod array_text;
pub mod batch;
pub mod changelog_segments;
pub mod citus_errors;
pub mod definition;
pub mod envelope_check;
pub mod envelope_sql;
pub mod fuzz;
pub mod group_deltas;
pub mod json_text;
pub mod jsonb_bytes;
pub mod jsonpath;
pub mod jsonpath_eval;
pub mod names;
pub mod observe_sql;
pub mod ordered_json;
pub mod partitions;
pub mod quote;
pub mod rfc3339;
pub mod shapes;
pub mod sketch;
pub mod snapshot;
pub mod sqlgen;
pub mod ticks;
pub mod values;
