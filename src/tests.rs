//! In-backend unit tests (`cargo pgrx test`). User-visible behaviour is covered by pg_regress.
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn placeholder_compiles() {
        assert_eq!(Spi::get_one::<i32>("SELECT 1").unwrap(), Some(1));
    }
}
