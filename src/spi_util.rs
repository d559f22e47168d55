//! Small helpers over pgrx SPI used by every feature module.

use crate::errors::EvResult;
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;

/// Runs each statement in order.
pub fn run_all(statements: &[String]) -> EvResult<()> {
    for sql in statements {
        Spi::run(sql)?;
    }
    Ok(())
}

/// Runs one statement with arguments.
pub fn run(sql: &str, args: &[DatumWithOid]) -> EvResult<()> {
    Spi::run_with_args(sql, args)?;
    Ok(())
}

/// First column of the first row, or None when there is no row or it is NULL.
pub fn one<T: FromDatum + IntoDatum>(sql: &str, args: &[DatumWithOid]) -> EvResult<Option<T>> {
    Ok(Spi::connect_mut(|client| {
        let table = client.update(sql, Some(1), args)?;
        if table.is_empty() {
            Ok::<_, pgrx::spi::SpiError>(None)
        } else {
            table.first().get_one::<T>()
        }
    })?)
}
