//! Small helpers over pgrx SPI used by every feature module.

use crate::errors::EvResult;
use crate::pg::plan_cache::{self, Plans};
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;

/// Runs each statement in order.
pub fn run_all(statements: &[String]) -> EvResult<()> {
    for sql in statements {
        Spi::run(sql)?;
    }
    Ok(())
}

/// Runs one statement (not a utility statement) on the catalog with arguments, parsed and
/// planned once per backend (`plan_cache`).
pub fn run(sql: &str, args: &[DatumWithOid]) -> EvResult<()> {
    Spi::connect_mut(|client| {
        plan_cache::execute(client, sql, None, args, Plans::Generic).map(|_| ())
    })?;
    Ok(())
}

/// Runs one statement over user data (event tables, changelogs, view storage) with arguments:
/// parsed once per backend, planned at each run for the tables as they are (`plan_cache`;
/// a statement without arguments is planned once, see `Plans::Custom`).
pub fn run_replanned(sql: &str, args: &[DatumWithOid]) -> EvResult<()> {
    run_planned(sql, args, Plans::Custom)
}

/// Runs one statement (not a utility statement) with arguments, kept as `plans` says.
pub fn run_planned(sql: &str, args: &[DatumWithOid], plans: Plans) -> EvResult<()> {
    Spi::connect_mut(|client| plan_cache::execute(client, sql, None, args, plans).map(|_| ()))?;
    Ok(())
}

/// First column of the first row, or None when there is no row or it is NULL. For statements
/// on the catalog: parsed and planned once per backend (`plan_cache`).
pub fn one<T: FromDatum + IntoDatum>(sql: &str, args: &[DatumWithOid]) -> EvResult<Option<T>> {
    first(sql, args, Plans::Generic)
}

/// `one` for a statement over user data: planned at each run (see `run_replanned`).
pub fn one_replanned<T: FromDatum + IntoDatum>(
    sql: &str,
    args: &[DatumWithOid],
) -> EvResult<Option<T>> {
    first(sql, args, Plans::Custom)
}

fn first<T: FromDatum + IntoDatum>(
    sql: &str,
    args: &[DatumWithOid],
    plans: Plans,
) -> EvResult<Option<T>> {
    Ok(Spi::connect_mut(|client| {
        let table = plan_cache::execute(client, sql, Some(1), args, plans)?;
        if table.is_empty() {
            Ok::<_, pgrx::spi::SpiError>(None)
        } else {
            table.first().get_one::<T>()
        }
    })?)
}

/// Whether this transaction reads with one snapshot for all its statements (REPEATABLE READ,
/// SERIALIZABLE), taken at its first statement.
pub fn uses_transaction_snapshot() -> bool {
    // SAFETY: reads a backend global that Postgres sets at transaction start.
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}
