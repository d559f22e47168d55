//! Time partitions of a partitioned event table (API.md section 7): their length, their bounds,
//! their names and the DDL that makes them.
//!
//! A partition covers `[start, start + length)`, its start aligned as
//! `date_bin(length, occurred_at, '2000-01-01 00:00:00+00')` aligns. That origin is PostgreSQL's
//! own timestamp epoch, so a bound is a whole multiple of the length in the microseconds a
//! `timestamptz` stores: the arithmetic here is on those integers, exact, and the bounds reach
//! SQL as UTC literals.

use crate::quote;

/// The longest identifier PostgreSQL keeps (NAMEDATALEN - 1 bytes).
const MAX_IDENTIFIER_BYTES: usize = 63;
/// The longest partition name: one byte short of an identifier, so that the name of each
/// partition's array type (`_` and the table's name) keeps the whole name. Names truncated into
/// one another would leave PostgreSQL no array type name to give a partition, after a few.
const MAX_PARTITION_NAME_BYTES: usize = MAX_IDENTIFIER_BYTES - 1;
const MICROS_PER_MINUTE: i64 = 60_000_000;
const MICROS_PER_DAY: i64 = 86_400_000_000;
/// Days from 1970-01-01 (the civil-date algorithm's epoch) to 2000-01-01.
const DAYS_1970_TO_2000: i64 = 10_957;
/// The first instant past the latest `timestamptz` PostgreSQL stores (294277-01-01 UTC): no
/// partition reaches beyond it.
const END_OF_TIME: i64 = 9_223_371_331_200_000_000;

/// The length in microseconds of a `partition_interval` given as an interval's fields, or why it
/// is not a partition length: months (and years) have no fixed length, and a partition must
/// cover some time. A day counts 24 hours: partitions are UTC-aligned and never shift with
/// daylight saving time.
pub fn length_micros(months: i32, days: i32, micros: i64) -> Result<i64, String> {
    if months != 0 {
        return Err(
            "months and years have no fixed length: use days or weeks (for example '30 days')"
                .into(),
        );
    }
    let total = i64::from(days)
        .checked_mul(MICROS_PER_DAY)
        .and_then(|d| d.checked_add(micros))
        .ok_or("it is too long")?;
    if total <= 0 {
        return Err("it must be a positive length of time".into());
    }

    if total > 366 * MICROS_PER_DAY * 100 {
        return Err("it must be at most 100 years".into());
    }
    Ok(total)
}

/// `length_micros` of the `partition_interval` of a table being made: also at least a minute.
/// Partitions are named to the minute (`partition_name`): partitions shorter than that would
/// share names. (A table made with a shorter length keeps it: `length_micros` alone reads it.)
pub fn new_length_micros(months: i32, days: i32, micros: i64) -> Result<i64, String> {
    let total = length_micros(months, days, micros)?;
    if total < MICROS_PER_MINUTE {
        return Err("it must be at least one minute (partitions are named to the minute)".into());
    }
    Ok(total)
}

/// The start of the partition holding instant `at` (microseconds since 2000-01-01 UTC).
pub fn start_of(at: i64, length: i64) -> i64 {
    at.div_euclid(length) * length
}

/// The starts of the partitions that cover `[from, to]`, in order, as far as PostgreSQL's
/// timestamps reach.
pub fn starts_covering(from: i64, to: i64, length: i64) -> Vec<i64> {
    let mut out = Vec::new();
    let mut start = start_of(from, length);
    while start <= to
        && start
            .checked_add(length)
            .is_some_and(|end| end <= END_OF_TIME)
    {
        out.push(start);
        match start.checked_add(length) {
            Some(next) => start = next,
            None => break,
        }
    }
    out
}

/// The civil UTC date and time of `at`: (year, month, day, hour, minute, second, microsecond).
fn civil(at: i64) -> (i64, u32, u32, u32, u32, u32, u32) {
    let days = at.div_euclid(MICROS_PER_DAY) + DAYS_1970_TO_2000;
    let in_day = at.rem_euclid(MICROS_PER_DAY);
    // Days to a proleptic Gregorian date (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let seconds = in_day / 1_000_000;
    (
        year,
        month,
        day,
        (seconds / 3600) as u32,
        (seconds / 60 % 60) as u32,
        (seconds % 60) as u32,
        (in_day % 1_000_000) as u32,
    )
}

/// `at` as a `timestamptz` literal in UTC, exact to the microsecond.
pub fn utc_literal(at: i64) -> String {
    let (y, mo, d, h, mi, s, us) = civil(at);
    let year = if y > 0 {
        format!("{y:04}")
    } else {
        format!("{:04}", 1 - y)
    };
    let era = if y > 0 { "" } else { " BC" };
    format!("'{year}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}.{us:06}+00{era}'::timestamptz")
}

/// The unqualified name of the partition of `table` (its unqualified name) starting at `start`:
/// `<table>_p<yyyymmdd>`, with `_<hhmm>` for lengths that are not whole days; the table's name is
/// shortened (at a character boundary) to keep the whole within `MAX_PARTITION_NAME_BYTES`.
pub fn partition_name(table: &str, start: i64, length: i64) -> String {
    let (y, mo, d, h, mi, ..) = civil(start);
    let mut suffix = format!("_p{y:04}{mo:02}{d:02}");
    if length % MICROS_PER_DAY != 0 {
        suffix.push_str(&format!("_{h:02}{mi:02}"));
    }
    format!("{}{suffix}", shortened(table, suffix.len()))
}

/// The unqualified name of the default partition of `table`: where events outside every
/// partition made so far go.
pub fn default_partition_name(table: &str) -> String {
    format!("{}_default", shortened(table, "_default".len()))
}

fn shortened(name: &str, room: usize) -> &str {
    let mut end = name.len().min(MAX_PARTITION_NAME_BYTES - room);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// A new partition of `parent` (quoted, qualified) in `schema`, named `name` (both unquoted),
/// for `[from, to)`: a table like the parent, then attached. `ATTACH PARTITION` takes SHARE
/// UPDATE EXCLUSIVE on the parent, which producers' inserts and readers do not conflict with
/// (`CREATE TABLE ... PARTITION OF` takes ACCESS EXCLUSIVE, waiting for every transaction that
/// wrote the table and making every later one wait behind it); it locks the default partition
/// while it checks that none of its rows belong to the new range.
pub fn create_partition(parent: &str, schema: &str, name: &str, from: i64, to: i64) -> [String; 2] {
    let partition = format!("{}.{}", quote::ident(schema), quote::ident(name));
    [
        format!(
            "CREATE TABLE {partition} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        ),
        format!(
            "ALTER TABLE {parent} ATTACH PARTITION {partition} FOR VALUES FROM ({}) TO ({})",
            utc_literal(from),
            utc_literal(to)
        ),
    ]
}

/// `CREATE TABLE` of the default partition of `parent` (quoted, qualified).
pub fn create_default_partition(parent: &str, schema: &str, name: &str) -> String {
    format!(
        "CREATE TABLE {}.{} PARTITION OF {parent} DEFAULT",
        quote::ident(schema),
        quote::ident(name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: i64 = 3_600_000_000;

    #[test]
    fn partition_lengths_are_fixed_and_positive() {
        assert_eq!(length_micros(0, 1, 0), Ok(MICROS_PER_DAY));
        assert_eq!(length_micros(0, 7, 0), Ok(7 * MICROS_PER_DAY));
        assert_eq!(length_micros(0, 0, HOUR), Ok(HOUR));
        assert_eq!(length_micros(0, 1, -HOUR), Ok(23 * HOUR));
        assert!(length_micros(1, 0, 0).unwrap_err().contains("months"));
        assert!(length_micros(0, 0, 0).unwrap_err().contains("positive"));
        assert!(length_micros(0, -1, HOUR).unwrap_err().contains("positive"));
        assert!(length_micros(0, i32::MAX, 0).is_err());
        assert_eq!(length_micros(0, 0, 30_000_000), Ok(30_000_000));
        assert_eq!(new_length_micros(0, 0, 90_000_000), Ok(90_000_000));
        assert_eq!(new_length_micros(0, 0, 60_000_000), Ok(60_000_000));
        for seconds in [1, 30, 59] {
            assert!(new_length_micros(0, 0, seconds * 1_000_000)
                .unwrap_err()
                .contains("at least one minute"));
        }
        assert!(new_length_micros(1, 0, 0).unwrap_err().contains("months"));
    }

    #[test]
    fn partitions_align_on_the_origin_before_and_after_it() {
        let day = MICROS_PER_DAY;
        assert_eq!(start_of(0, day), 0);
        assert_eq!(start_of(day - 1, day), 0);
        assert_eq!(start_of(-1, day), -day);
        assert_eq!(start_of(5 * HOUR, 7 * day), 0);
        assert_eq!(starts_covering(HOUR, 2 * day, day), vec![0, day, 2 * day]);
        assert_eq!(starts_covering(HOUR, HOUR, day), vec![0]);
        assert!(starts_covering(day, 0, day).is_empty());
        assert_eq!(
            starts_covering(END_OF_TIME - 2 * day, i64::MAX, day),
            vec![END_OF_TIME - 2 * day, END_OF_TIME - day]
        );
        assert_eq!(
            utc_literal(END_OF_TIME),
            "'294277-01-01 00:00:00.000000+00'::timestamptz"
        );
    }

    #[test]
    fn bounds_are_exact_utc_literals() {
        assert_eq!(
            utc_literal(0),
            "'2000-01-01 00:00:00.000000+00'::timestamptz"
        );
        assert_eq!(
            utc_literal(-1),
            "'1999-12-31 23:59:59.999999+00'::timestamptz"
        );
        // 2026-12-05 is day 9835 after 2000-01-01; a leap day on the way.
        assert_eq!(
            utc_literal(9835 * MICROS_PER_DAY + 13 * HOUR + 7),
            "'2026-12-05 13:00:00.000007+00'::timestamptz"
        );
        assert_eq!(
            utc_literal(59 * MICROS_PER_DAY),
            "'2000-02-29 00:00:00.000000+00'::timestamptz"
        );
        let year_one_bc = -730_485 * MICROS_PER_DAY;
        assert_eq!(
            utc_literal(year_one_bc),
            "'0001-01-01 00:00:00.000000+00 BC'::timestamptz"
        );
    }

    #[test]
    fn partition_names_fit_an_identifier_and_sort_by_time() {
        let day = MICROS_PER_DAY;
        assert_eq!(
            partition_name("events", 9835 * day, day),
            "events_p20261205"
        );
        assert_eq!(
            partition_name("events", 9835 * day + 13 * HOUR, HOUR),
            "events_p20261205_1300"
        );
        assert_eq!(default_partition_name("events"), "events_default");
        let long = "é".repeat(40);
        let name = partition_name(&long, 0, day);
        assert!(name.len() <= 62 && name.ends_with("_p20000101"), "{name}");
        assert!(default_partition_name(&long).len() <= 62);
        let long = "p".repeat(63);
        let name = partition_name(&long, 0, HOUR);
        assert_eq!(name.len(), 62);
        assert!(name.ends_with("_p20000101_0000"), "{name}");
        assert_eq!(
            create_partition("\"s\".\"e\"", "s", "e_p20000101", 0, day),
            [
                "CREATE TABLE \"s\".\"e_p20000101\" (LIKE \"s\".\"e\" INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
                "ALTER TABLE \"s\".\"e\" ATTACH PARTITION \"s\".\"e_p20000101\" FOR VALUES FROM ('2000-01-01 00:00:00.000000+00'::timestamptz) TO ('2000-01-02 00:00:00.000000+00'::timestamptz)"
            ]
        );
    }
}
