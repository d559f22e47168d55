//! Per-backend cache of prepared statements: each statement the extension runs again and again
//! (a view's apply, the observer of a source, the catalog reads of every call) is parsed once
//! per backend instead of once per call, and a catalog statement is also planned once.
//!
//! Why: a refresh of a handful of events spent about 40% of its time in the parser and the
//! planner (the apply and observer statements are a few hundred lines of SQL each). The
//! background worker and connection pools keep their backends, so they run the kept statements.
//!
//! How: statements are prepared with `SPI_prepare` and kept (`SPI_keepplan`), keyed by their
//! text and argument types, as PL/pgSQL keeps its statements. Postgres' plan cache keeps them
//! valid: DDL on a table a plan reads, ANALYZE, a changed search_path or (for tables with row
//! security) another role all make it re-plan before the next execution, and a plan refers to
//! relations by the names in its text, so a dropped and recreated view re-resolves them.
//! Statements on the catalog run with a generic plan (planned once); statements over user data
//! are planned afresh each time (`Plans`), so only their parsing is saved: a plan is only as
//! good as the table sizes it was made for. At most CAPACITY statements are kept; the least
//! recently used goes first.

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{self, PgOid};
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiResult, SpiTupleTable};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Statements kept per backend.
const CAPACITY: usize = 96;

/// (text, argument types, may write).
type Key = (String, Vec<pg_sys::Oid>, bool);

#[derive(Default)]
struct Cache {
    plans: HashMap<Key, (Rc<OwnedPreparedStatement>, u64)>,
    clock: u64,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// How a kept statement is planned at each execution.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Plans {
    /// Once, for any parameters: statements on the extension's small catalog tables, whose best
    /// plan does not change as data grows.
    Generic,
    /// Afresh at each execution, for the tables as they are then (only parsing and analysis
    /// are kept): statements over event tables, changelogs and view storage. A plan made once
    /// goes stale as they grow: one made while an event table was nearly empty reads each run
    /// of changed ids with a sequential scan of the table (measured: the worker's refreshes
    /// took 2-4 times as long within a minute of ingest at 5,000 events/s).
    Custom,
}

/// Restores plan_cache_mode after an execution (also when it unwinds; after an error the
/// (sub)transaction abort does the same).
struct PlanMode(i32);

impl PlanMode {
    fn force(plans: Plans) -> Self {
        let mode = match plans {
            Plans::Generic => c"force_generic_plan",
            Plans::Custom => c"force_custom_plan",
        };
        // SAFETY: a new GUC nest level and a SAVE-action set, as a function's SET clause does.
        unsafe {
            let level = pg_sys::NewGUCNestLevel();
            crate::gucs::set_in_nest_level(c"plan_cache_mode", mode);
            PlanMode(level)
        }
    }
}

impl Drop for PlanMode {
    fn drop(&mut self) {
        // SAFETY: pops the nest level pushed by `force`, keeping settings made inside.
        unsafe { pg_sys::AtEOXact_GUC(true, self.0) }
    }
}

/// The kept statement for `sql` with arguments of `args`' types, prepared now if needed.
fn statement(
    client: &SpiClient<'_>,
    sql: &str,
    args: &[DatumWithOid],
    writes: bool,
) -> SpiResult<Rc<OwnedPreparedStatement>> {
    let key: Key = (sql.to_string(), args.iter().map(|a| a.oid()).collect(), writes);
    let found = CACHE.with(|c| {
        let mut c = c.borrow_mut();
        c.clock += 1;
        let now = c.clock;
        c.plans.get_mut(&key).map(|(stmt, used)| {
            *used = now;
            Rc::clone(stmt)
        })
    });
    if let Some(stmt) = found {
        return Ok(stmt);
    }
    let types: Vec<PgOid> = key.1.iter().map(|&oid| PgOid::from_untagged(oid)).collect();
    let prepared = if writes { client.prepare_mut(sql, &types)? } else { client.prepare(sql, &types)? };
    let stmt = Rc::new(prepared.keep());
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.plans.len() >= CAPACITY {
            if let Some(oldest) = c.plans.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone()) {
                c.plans.remove(&oldest);
            }
        }
        let now = c.clock;
        c.plans.insert(key, (Rc::clone(&stmt), now));
    });
    Ok(stmt)
}

/// Executes `sql` (any statement but a utility one) through the cache; as `SpiClient::update`.
pub fn execute<'conn>(
    client: &mut SpiClient<'conn>,
    sql: &str,
    limit: Option<i64>,
    args: &[DatumWithOid],
    plans: Plans,
) -> SpiResult<SpiTupleTable<'conn>> {
    // The Rc keeps the statement alive if a statement nested in this one evicts it.
    let stmt = statement(client, sql, args, true)?;
    let _mode = PlanMode::force(plans);
    client.update(&*stmt, limit.map(|l| l as _), args)
}

/// Executes a query on the catalog that writes nothing through the cache, with a generic
/// plan; as `SpiClient::select` (read-only while the transaction has written nothing).
pub fn select<'conn>(
    client: &SpiClient<'conn>,
    sql: &str,
    limit: Option<i64>,
    args: &[DatumWithOid],
) -> SpiResult<SpiTupleTable<'conn>> {
    let stmt = statement(client, sql, args, false)?;
    let _mode = PlanMode::force(Plans::Generic);
    client.select(&*stmt, limit.map(|l| l as _), args)
}

/// How many statements this backend keeps (for tests).
#[cfg(any(test, feature = "pg_test"))]
pub fn kept() -> usize {
    CACHE.with(|c| c.borrow().plans.len())
}
