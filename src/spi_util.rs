//! Small helpers over pgrx SPI used by every feature module.

use crate::errors::EvResult;
use crate::plan_cache;
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;

/// Runs each statement in order.
pub fn run_all(statements: &[String]) -> EvResult<()> {
    for sql in statements {
        Spi::run(sql)?;
    }
    Ok(())
}

/// Runs one statement (not a utility statement) with arguments, planned once per backend
/// (`plan_cache`).
pub fn run(sql: &str, args: &[DatumWithOid]) -> EvResult<()> {
    Spi::connect_mut(|client| plan_cache::execute(client, sql, None, args).map(|_| ()))?;
    Ok(())
}

/// First column of the first row, or None when there is no row or it is NULL. Planned once
/// per backend (`plan_cache`).
pub fn one<T: FromDatum + IntoDatum>(sql: &str, args: &[DatumWithOid]) -> EvResult<Option<T>> {
    Ok(Spi::connect_mut(|client| {
        let table = plan_cache::execute(client, sql, Some(1), args)?;
        if table.is_empty() {
            Ok::<_, pgrx::spi::SpiError>(None)
        } else {
            table.first().get_one::<T>()
        }
    })?)
}
