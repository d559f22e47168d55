//! Per-backend cache of prepared statements: each statement the extension runs again and again
//! (a view's apply, the observer of a source, the catalog reads of every call) is parsed once
//! per backend instead of once per call, and a catalog statement is also planned once.
//!
//! Why: parsed and planned at every call, the apply and observer statements (a few hundred
//! lines of SQL each) take about 40% of a refresh of a handful of events. The background worker
//! and connection pools keep their backends, so they run the kept statements.
//!
//! How: statements are prepared with `SPI_prepare` and kept (`SPI_keepplan`), keyed by their
//! text and argument types, as PL/pgSQL keeps its statements. Postgres' plan cache keeps them
//! valid: DDL on a table a plan reads, ANALYZE, a changed search_path or (for tables with row
//! security) another role all make it re-plan before the next execution, and a plan refers to
//! relations by the names in its text, so a dropped and recreated view re-resolves them.
//! Statements on the catalog run with a generic plan (planned once). A plan over user data is
//! only as good as the table sizes it was made for: the statements of every refresh keep a
//! generic plan per size class of the tables they read (planned again when one of them has
//! doubled or halved, `Plans::PerSize`); the rarer ones are planned afresh each time
//! (`Plans::Custom`), so only their parsing is saved. At most CAPACITY statements are kept; a
//! new one takes the place of one picked at random (see `evicted`).

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{self, PgOid};
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiResult, SpiTupleTable};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Statements kept per backend. A Citus worker's connection refreshes the views of each of
/// its shards in turn, each with statements of its own (16 shards of a table with 3 views:
/// about 200, and the field observer's whole statement of each shard whose batch may hold
/// drift); a cycle through more than CAPACITY statements parses and plans the share of them
/// evicted since the last cycle again (see `evicted`). A kept apply or observer statement holds
/// about 0.5 MB, so a backend that refreshes that many views holds up to about 120 MB of them;
/// one that refreshes a few views holds a few MB.
pub(crate) const CAPACITY: usize = 256;

/// (text, argument types, may write, size class for `Plans::PerSize`).
type Key = (String, Vec<pg_sys::Oid>, bool, Option<SizeClass>);

#[derive(Default)]
struct Cache {
    plans: HashMap<Key, Rc<OwnedPreparedStatement>>,
    /// The state of the generator that picks the statement a new one replaces.
    draws: u64,
    /// Statements prepared so far (for tests).
    prepared: u64,
}

/// Which of `kept` statements a new one replaces, from a pseudo-random draw: at random, not the
/// least recently used. The background worker and a Citus worker's connection run the same
/// statements in the same order at every cycle (each view's, each shard's); with more of them
/// than CAPACITY, evicting the least recently used always evicts the very statement needed
/// next, and none is ever found kept. Evicted at random, a cycle of W statements finds a good
/// share of them kept (in a simulation, about 70-80% for W = 1.125 CAPACITY, 35-40% for
/// W = 1.5 CAPACITY), and a cycle within CAPACITY finds every one.
fn evicted(kept: usize, draws: &mut u64) -> usize {
    // xorshift64 (any spread-out pick will do; the map's own order is arbitrary too).
    let mut x = if *draws == 0 {
        0x9E37_79B9_7F4A_7C15
    } else {
        *draws
    };
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *draws = x;
    (x % kept as u64) as usize
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
    /// are kept): statements over event tables, changelogs and view storage. Only a statement
    /// with parameters: PostgreSQL plans one without any once (a generic plan, kept until an
    /// invalidation such as an ANALYZE of a table it reads), whatever plan_cache_mode says. A plan made once
    /// goes stale as they grow: one made while an event table was nearly empty reads each run
    /// of changed ids with a sequential scan of the table (with such plans the worker's
    /// refreshes take 2-4 times as long within a minute of ingest at 5,000 events/s).
    Custom,
    /// Once per size class of the tables the statement reads (`size_class`): the statements of
    /// every refresh (the apply, the observer). Planning them costs about 2.5 ms each, a third
    /// of a refresh of a few events; a plan made for a table of one size is kept until the
    /// table has doubled or halved, which also covers a table that was empty when first read.
    PerSize(SizeClass),
}

/// The sizes of some tables, each rounded to a power of two of its pages (see `size_class`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SizeClass(u64);

/// The size class of `relations` now: per relation, the number of binary digits of its page
/// count (0 when empty or missing), so a class changes when a table doubles or halves. Takes
/// the relations' ACCESS SHARE locks, which the statement reading them takes anyway.
pub fn size_class(relations: &[pg_sys::Oid]) -> SizeClass {
    // 6 bits per relation (a page count has at most 32 digits); more than 10 relations share bits.
    SizeClass(relations.iter().fold(0u64, |class, &relid| {
        class.rotate_left(6) ^ page_digits(relid)
    }))
}

fn page_digits(relid: pg_sys::Oid) -> u64 {
    // SAFETY: try_relation_open returns NULL for a relation that does not exist, and the
    // relation is closed before returning; only kinds with table storage are measured.
    unsafe {
        let rel = pg_sys::try_relation_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        if rel.is_null() {
            return 0;
        }
        let kind = (*(*rel).rd_rel).relkind as u8;
        let pages = if kind == pg_sys::RELKIND_RELATION || kind == pg_sys::RELKIND_MATVIEW {
            pg_sys::RelationGetNumberOfBlocksInFork(rel, pg_sys::ForkNumber::MAIN_FORKNUM)
        } else {
            0
        };
        pg_sys::relation_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        u64::from(32 - pages.leading_zeros())
    }
}

/// Restores plan_cache_mode after an execution (also when it unwinds; after an error the
/// (sub)transaction abort does the same).
struct PlanMode(i32);

impl PlanMode {
    fn force(plans: Plans) -> Self {
        let mode = match plans {
            Plans::Generic | Plans::PerSize(_) => c"force_generic_plan",
            Plans::Custom => c"force_custom_plan",
        };
        // SAFETY: a new GUC nest level and a SAVE-action set, as a function's SET clause does.
        unsafe {
            let level = pg_sys::NewGUCNestLevel();
            crate::pg::guc::set_in_nest_level(c"plan_cache_mode", mode);
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
    plans: Plans,
) -> SpiResult<Rc<OwnedPreparedStatement>> {
    let class = match plans {
        Plans::PerSize(class) => Some(class),
        Plans::Generic | Plans::Custom => None,
    };
    let key: Key = (
        sql.to_string(),
        args.iter().map(|a| a.oid()).collect(),
        writes,
        class,
    );
    let found = CACHE.with(|c| c.borrow().plans.get(&key).map(Rc::clone));
    if let Some(stmt) = found {
        return Ok(stmt);
    }
    let types: Vec<PgOid> = key.1.iter().map(|&oid| PgOid::from_untagged(oid)).collect();
    let prepared = if writes {
        client.prepare_mut(sql, &types)?
    } else {
        client.prepare(sql, &types)?
    };
    let stmt = Rc::new(prepared.keep());
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        c.prepared += 1;
        // The same statement kept for the tables' former sizes is of no more use.
        if class.is_some() {
            c.plans
                .retain(|k, _| !(k.0 == key.0 && k.1 == key.1 && k.2 == key.2));
        }
        if c.plans.len() >= CAPACITY {
            let kept = c.plans.len();
            let pick = evicted(kept, &mut c.draws);
            if let Some(victim) = c.plans.keys().nth(pick).cloned() {
                c.plans.remove(&victim);
            }
        }
        c.plans.insert(key, Rc::clone(&stmt));
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
    let stmt = statement(client, sql, args, true, plans)?;
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
    let stmt = statement(client, sql, args, false, Plans::Generic)?;
    let _mode = PlanMode::force(Plans::Generic);
    client.select(&*stmt, limit.map(|l| l as _), args)
}

/// How many statements this backend keeps (for tests).
#[cfg(any(test, feature = "pg_test"))]
pub fn kept() -> usize {
    CACHE.with(|c| c.borrow().plans.len())
}

/// Forgets every kept statement (for tests that count what is prepared from an empty cache).
#[cfg(any(test, feature = "pg_test"))]
pub fn forget_all() {
    CACHE.with(|c| c.borrow_mut().plans.clear());
}

/// How many statements this backend has prepared (for tests).
#[cfg(any(test, feature = "pg_test"))]
pub fn prepared() -> u64 {
    CACHE.with(|c| c.borrow().prepared)
}
