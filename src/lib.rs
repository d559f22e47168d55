//! pg_eventview: incremental aggregate views over envelope-typed, schema-evolving event tables.
//!
//! Module map (dependencies point downwards):
//!   api            every SQL-callable function (thin)
//!   views, refresh, envelope, fields   feature modules: view lifecycle, refresh engine,
//!                  event tables, logical fields
//!   catalog, relation          the extension's tables; user relation names
//!   spi_util, plan_cache, errors   SPI helpers, statements kept per backend; the error
//!                  type and its SQLSTATE mapping
//!   core           pure: definitions, JSONPath planning, quoting, SQL generation
//!   jsonpath_eval  per-backend evaluation of rich JSONPaths
//!   progress       NOTICEs from inside long recomputations
//!   scheduler, gucs  the background worker and configuration parameters

// Every SQL-callable function returns pgrx's `ErrorReport` as its error (the type pgrx raises
// as a Postgres error), which is large; boxing it is not an option there.
#![allow(clippy::result_large_err)]

use pgrx::prelude::*;

mod api;
mod capture;
mod catalog;
mod envelope;
mod errors;
mod event_tables;
mod fields;
mod gucs;
mod observer;
mod pg;
mod privileges;
mod progress;
mod refresh;
mod relation;
mod scheduler;
mod teardown;
mod view_objects;
mod views;

#[cfg(any(test, feature = "pg_test"))]
mod tests;

::pgrx::pg_module_magic!();

extension_sql_file!("../sql/bootstrap.sql", name = "bootstrap", bootstrap);
extension_sql_file!(
    "../sql/ingest.sql",
    name = "ingest",
    requires = [
        api::event_tables::event_table_sql,
        api::ingest::rfc3339_valid,
        api::ingest::envelope_problem
    ]
);
extension_sql_file!(
    "../sql/maintenance.sql",
    name = "maintenance",
    requires = [api::event_tables::event_table_sql, api::views::view_id]
);
extension_sql_file!("../sql/api.sql", name = "api", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // SAFETY: reading a Postgres global during library load, in the loading process.
    let preloading = unsafe { pg_sys::process_shared_preload_libraries_in_progress };
    gucs::define(preloading);
    if preloading {
        scheduler::register_workers();
    }
}

/// Test-harness hooks required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
