//! Changelog segments: a changelog is partitioned by range on its record number `seq`, and
//! applied records go by whole segments, a TRUNCATE and a DROP each (PgQ's rotation), never by
//! DELETE. Pruning then costs the same whatever the number of records, and leaves no bloat.
//!
//! Algorithm:
//! - A changelog is `PARTITION BY RANGE (seq)`: segments `[lo, hi)` made ahead of the record
//!   numbers given out, and a default partition for records past every segment made (a capture
//!   never fails for want of a segment; its records are pruned by DELETE, as those of a
//!   changelog made by a version before segments, which becomes the default partition).
//! - `seq` comes from the root's identity (a sequence with cache 1), so numbers are given out in
//!   increasing order across sessions: once the next number is at least `hi`, no record will
//!   enter `[lo, hi)` again, and once no session holds a lock on the segment every record in it
//!   is committed or aborted.
//! - Such a complete segment is applied by every consumer when its newest transaction id is
//!   below every consumer's horizon (`applied_horizon`), and past `delta_retention` when its
//!   newest record is.
//! - Widths follow the record rate: a segment aims at `span_seconds` of records, so a changelog
//!   keeps about `delta_retention / span + 3` segments whatever the rate.

/// The first record number of a changelog, where its first segment starts.
pub const FIRST_SEQ: i64 = 1;
/// How many times the narrowest segment a changelog's first segment is wide, before any rate is
/// known.
pub const FIRST_WIDTHS: i64 = 10;

/// The width of a changelog's first segment, between `narrowest` and `widest`.
pub fn first_width(narrowest: i64, widest: i64) -> i64 {
    narrowest.saturating_mul(FIRST_WIDTHS).min(widest).max(1)
}
/// The widest segment made.
pub const MAX_WIDTH: i64 = 1 << 36;

/// How long a segment aims to take to fill: a quarter of `delta_retention`, at least five
/// minutes (a segment per maintenance run would be DDL for nothing, and one segment is made
/// ahead per run: runs of pg_cron's, a minute apart, keep ahead) and at most a day.
pub fn span_seconds(delta_retention_seconds: f64) -> f64 {
    (delta_retention_seconds / 4.0).clamp(300.0, 86_400.0)
}

/// The width of the next segment: `span` seconds of records at `rate` records per second, or
/// the previous width when no rate is known; at least `narrowest` (a slow changelog's segments
/// fill over more than their span) and at most `widest`.
pub fn width(
    rate_per_second: Option<f64>,
    span: f64,
    previous: i64,
    narrowest: i64,
    widest: i64,
) -> i64 {
    let wanted = match rate_per_second {
        Some(rate) if rate.is_finite() && rate >= 0.0 => (rate * span).min(MAX_WIDTH as f64) as i64,
        _ => previous,
    };
    let widest = widest.clamp(1, MAX_WIDTH);
    wanted.clamp(narrowest.clamp(1, widest), widest)
}

/// The range `[lo, hi)` of the segment to make next, or None while a segment wholly ahead of
/// `next_seq` (the first record number not given out yet) exists. `segments` are the bounds of
/// the segments made, in any order. The next segment follows the last one, or starts at
/// `next_seq` when the numbers have run past every segment (records went to the default
/// partition meanwhile). The caller holds the changelog against writes: no record number is on
/// its way into the changelog meanwhile.
pub fn next_segment(segments: &[(i64, i64)], next_seq: i64, width: i64) -> Option<(i64, i64)> {
    if segments.iter().any(|&(lo, _)| lo >= next_seq) {
        return None;
    }
    let lo = segments
        .iter()
        .map(|&(_, hi)| hi)
        .max()
        .map_or(next_seq, |hi| hi.max(next_seq));
    Some((lo, lo.saturating_add(width)))
}

/// The segments of a changelog that are complete: every record number of their range given out
/// (`next_seq` at or past `hi`). In ascending order.
pub fn complete(segments: &[(i64, i64)], next_seq: i64) -> Vec<(i64, i64)> {
    let mut out: Vec<(i64, i64)> = segments
        .iter()
        .copied()
        .filter(|&(_, hi)| hi <= next_seq)
        .collect();
    out.sort_unstable();
    out
}

/// The bounds `(lo, hi)` of a segment from its partition bound as `pg_get_expr` prints it
/// (`FOR VALUES FROM ('1') TO ('10001')`); None for the default partition and for bounds that
/// are not two numbers (MINVALUE, MAXVALUE: not a segment this module made).
pub fn parse_bound(bound: &str) -> Option<(i64, i64)> {
    let rest = bound.strip_prefix("FOR VALUES FROM ('")?;
    let (lo, rest) = rest.split_once("') TO ('")?;
    let hi = rest.strip_suffix("')")?;
    let (lo, hi) = (lo.parse::<i64>().ok()?, hi.parse::<i64>().ok()?);
    (lo < hi).then_some((lo, hi))
}

/// DDL making segment `[lo, hi)` of changelog `log` (qualified) in schema `schema` as table
/// `table`: a table like the changelog, then attached (readers of the changelog go on, where
/// CREATE TABLE ... PARTITION OF would take ACCESS EXCLUSIVE on it). The changelog's index is
/// built on the empty table as it is attached; its columns keep the changelog's storage (the id
/// arrays stay uncompressed).
pub fn create_segment(log: &str, schema: &str, table: &str, lo: i64, hi: i64) -> Vec<String> {
    let segment = format!(
        "{}.{}",
        crate::quote::ident(schema),
        crate::quote::ident(table)
    );
    vec![
        format!("CREATE TABLE {segment} (LIKE {log} INCLUDING DEFAULTS INCLUDING STORAGE)"),
        format!("ALTER TABLE {log} ATTACH PARTITION {segment} FOR VALUES FROM ({lo}) TO ({hi})"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_segment_keeps_one_wholly_ahead_of_the_record_numbers() {
        // Numbers inside the last segment: the next follows it.
        assert_eq!(next_segment(&[(1, 101)], 50, 200), Some((101, 301)));
        assert_eq!(next_segment(&[(1, 101)], 100, 200), Some((101, 301)));
        // One ahead already.
        assert_eq!(next_segment(&[(1, 101), (101, 301)], 50, 200), None);
        assert_eq!(next_segment(&[(101, 301), (1, 101)], 101, 200), None);
        // Numbers past every segment: from the next number on.
        assert_eq!(next_segment(&[(1, 101)], 150, 200), Some((150, 350)));
        assert_eq!(next_segment(&[(1, 101)], 102, 200), Some((102, 302)));
        // No segment at all.
        assert_eq!(next_segment(&[], 7, 200), Some((7, 207)));
    }

    #[test]
    fn widths_follow_the_rate_within_bounds() {
        assert_eq!(width(Some(1000.0), 60.0, 5, 1000, i64::MAX), 60_000);
        assert_eq!(span_seconds(0.0), 300.0);
        assert_eq!(width(Some(0.01), 60.0, 5_000, 1000, i64::MAX), 1000);
        assert_eq!(width(Some(1e30), 60.0, 5, 1000, i64::MAX), MAX_WIDTH);
        assert_eq!(width(None, 60.0, 5_000, 1000, i64::MAX), 5_000);
        assert_eq!(width(Some(f64::NAN), 60.0, 5_000, 1000, i64::MAX), 5_000);
        assert_eq!(width(None, 60.0, 5, 20, i64::MAX), 20);
        // The widest bound wins over the narrowest.
        assert_eq!(width(Some(1000.0), 60.0, 5, 1000, 50_000), 50_000);
        assert_eq!(width(None, 60.0, 5, 1000, 500), 500);
        assert_eq!(span_seconds(7.0 * 86_400.0), 86_400.0);
        assert_eq!(span_seconds(3600.0), 900.0);
    }

    #[test]
    fn complete_segments_are_those_whose_numbers_were_all_given_out() {
        assert_eq!(
            complete(&[(101, 301), (1, 101), (301, 501)], 301),
            vec![(1, 101), (101, 301)]
        );
        assert!(complete(&[(1, 101)], 100).is_empty());
    }

    #[test]
    fn bounds_read_back_as_postgres_prints_them() {
        assert_eq!(
            parse_bound("FOR VALUES FROM ('1') TO ('10001')"),
            Some((1, 10001))
        );
        assert_eq!(parse_bound("DEFAULT"), None);
        assert_eq!(parse_bound("FOR VALUES FROM (MINVALUE) TO ('5')"), None);
        assert_eq!(parse_bound("FOR VALUES FROM ('5') TO ('5')"), None);
    }

    #[test]
    fn a_segment_is_a_table_like_the_changelog_then_attached() {
        let ddl = create_segment(
            "eventview._changes_3",
            "eventview",
            "_changes_3_from_1",
            1,
            101,
        );
        assert_eq!(
            ddl[0],
            "CREATE TABLE \"eventview\".\"_changes_3_from_1\" (LIKE eventview._changes_3 INCLUDING DEFAULTS INCLUDING STORAGE)"
        );
        assert_eq!(
            ddl[1],
            "ALTER TABLE eventview._changes_3 ATTACH PARTITION \"eventview\".\"_changes_3_from_1\" FOR VALUES FROM (1) TO (101)"
        );
    }
}
