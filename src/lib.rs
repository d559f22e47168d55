//! pg_eventview: incremental aggregate views over envelope-typed, schema-evolving event tables.
//!
//! Layout, top to bottom:
//!
//! - `api/`: every `#[pg_extern]`, grouped by what users do (event tables, ingest, views,
//!   refresh, fields, the observer, JSONPath). Each parses its arguments, calls a feature module
//!   and maps the error. Nothing imports it (only the `requires` lists below name its functions,
//!   to order the SQL files); `sql/api.sql` wraps these functions in the public signatures.
//! - `scheduler`: the background worker; it calls `eventview.run_maintenance()` through SQL.
//! - Feature modules: `teardown` (dropping an event table with its views), `event_tables`
//!   (creating, forgetting, pruning raw events), `capture` (keeping capture functions current),
//!   `envelope` (the envelope contract, checked before every read), `views` (creating, altering,
//!   dropping), `view_objects` (a view's generated SQL, value logs and user relation), `refresh`
//!   (refresh and rebuild), `observer` (observed fields and drift), `fields` (logical fields),
//!   `realtime` (the pending groups a realtime view's relation reads).
//! - `catalog` (every statement on the extension's tables `eventview._*`), `relation` (user
//!   relation names, resolved as the caller), `privileges` (the caller's rights).
//! - `pg/`: SPI helpers, the per-backend plan cache, relation locks, role switches, GUC nest
//!   levels, the relation cache, the observer aggregate's state, stored jsonb datums and the
//!   worker's wake-up at commit. Every
//!   `unsafe` block of the extension is there, each with a `SAFETY:` line; the modules above
//!   call safe functions. (The worker's entry point and `api::realtime`'s C function carry
//!   `#[unsafe(no_mangle)]`: PostgreSQL finds them by name; the latter hands its `fcinfo` to
//!   `pg::set_returning` in its one `unsafe` block.)
//! - `errors`: the error type and its SQLSTATE mapping at the SQL boundary.
//! - `gucs` (configuration parameters) and `progress` (NOTICEs from inside long
//!   recomputations): leaves that import no other module of the crate.
//! - `eventview_core` (crates/eventview-core): the pgrx-free crate, tested with plain
//!   `cargo test`: definition parsing, JSONPath planning and evaluation, the stored-jsonb reader
//!   and the observer's walk, value rules, every SQL text builder, and when the worker runs.
//!
//! Dependencies point one way: `api` and `scheduler` -> feature modules -> `catalog`,
//! `relation`, `privileges` -> `pg` -> `errors` -> `eventview_core`. A module may reach past the
//! layer below it, never above its own; within a layer imports form no cycle (`teardown` ->
//! `views` -> `refresh` -> `observer` -> `envelope`; `catalog` and `privileges` -> `relation`).

// Every SQL-callable function returns pgrx's `ErrorReport` as its error (the type pgrx raises
// as a Postgres error), which is large; boxing it is not an option there.
#![allow(clippy::result_large_err)]

use pgrx::prelude::*;

mod api;
mod capture;
mod catalog;
mod changelog;
mod citus;
mod envelope;
mod errors;
mod event_tables;
mod fields;
mod gucs;
mod observer;
mod partitions;
mod pg;
mod privileges;
mod progress;
mod realtime;
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
    let preloading = pg::preloading();
    gucs::define(preloading);
    pg::changelog_append::watch_changelogs();
    if preloading {
        pg::wakeup::init_shared_memory();
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
