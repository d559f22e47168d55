//! The sketch behind `approx_percentile(ref, p)`: each number goes to a bucket of a
//! logarithmic scale (DDSketch's mapping), and a group keeps, per bucket, how many of its values
//! fall in it, in the view's value multiset (bucket numbers as its values). Counts add and
//! subtract exactly, so the sketch is retractable and mergeable; its size per group is bounded
//! by the buckets the magnitudes of its values span (about 1,150 per factor of 10^10), whatever
//! the number of events.
//!
//! Bucket `i` of the positive numbers holds `(GAMMA^(i-1), GAMMA^i]`, with `GAMMA = (1 + A) /
//! (1 - A)`; a bucket's value is `2 GAMMA^i / (GAMMA + 1)`, within relative error `A` of every
//! number in it. Negative numbers mirror the positive ones; numbers of magnitude below
//! `SMALLEST` are 0, and magnitudes above `LARGEST` count as `LARGEST`. The percentile is
//! taken over the bucket numbers, which keep the numbers' order: the bucket of
//! `percentile_disc(p)`, so the answer is within `A` of it.

/// The relative accuracy: 1%.
pub const ACCURACY: f64 = 0.01;
/// Magnitudes below this are 0 (near the smallest normal double).
pub const SMALLEST: &str = "1e-300";
/// Magnitudes above this count as this (beyond it double precision cannot take logarithms of
/// every numeric).
pub const LARGEST: &str = "1e300";
/// Added to the bucket index of a magnitude so that every bucket number of a positive number is
/// positive (the index of `SMALLEST` is about -34540).
const OFFSET: i64 = 40_000;

fn gamma() -> f64 {
    (1.0 + ACCURACY) / (1.0 - ACCURACY)
}

/// The bucket number (bigint) of numeric SQL expression `x`; NULL for NULL.
pub fn bucket_sql(x: &str) -> String {
    format!(
        "CASE WHEN ({x}) IS NULL THEN NULL::int8 WHEN abs({x}) < {SMALLEST} THEN 0::int8 \
         ELSE (sign({x})::float8 * ({OFFSET} + ceil(ln(least(abs({x}), {LARGEST})::float8) / {ln_gamma})))::int8 END",
        ln_gamma = gamma().ln()
    )
}

/// The value (double precision) of bucket number SQL expression `k`.
pub fn value_sql(k: &str) -> String {
    let g = gamma();
    format!(
        "CASE WHEN ({k}) = 0 THEN 0::float8 \
         ELSE sign({k})::float8 * 2 * power({g}::float8, (abs({k}) - {OFFSET})::float8) / {plus_one} END",
        plus_one = g + 1.0
    )
}

/// The bucket index of a positive magnitude, as `bucket_sql` computes it (for tests).
pub fn bucket_of(x: f64) -> i64 {
    if x.abs() < 1e-300 {
        return 0;
    }
    let i = (x.abs().min(1e300).ln() / gamma().ln()).ceil() as i64;
    x.signum() as i64 * (OFFSET + i)
}

/// The value of bucket number `k`, as `value_sql` computes it (for tests).
pub fn value_of(k: i64) -> f64 {
    if k == 0 {
        return 0.0;
    }
    let g = gamma();
    k.signum() as f64 * 2.0 * g.powf((k.abs() - OFFSET) as f64) / (g + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_number_is_within_one_percent_of_its_buckets_value_and_buckets_keep_order() {
        let mut previous = i64::MIN;
        let mut x = -1e12_f64;
        while x < 1e12 {
            let k = bucket_of(x);
            assert!(k >= previous, "{x}");
            previous = k;
            let v = value_of(k);
            if x.abs() >= 1e-300 {
                assert!(
                    (v - x).abs() <= ACCURACY * x.abs() * (1.0 + 1e-9),
                    "{x} -> {v}"
                );
            } else {
                assert_eq!(v, 0.0);
            }
            x = if x.abs() < 1e-10 {
                1e-10
            } else if x < 0.0 {
                x / 1.37
            } else {
                x * 1.37
            };
            if x < 0.0 && x > -1e-10 {
                x = 0.0;
            }
        }
    }

    #[test]
    fn a_magnitude_range_spans_a_bounded_number_of_buckets() {
        // From a microsecond to a day, in milliseconds: about 1,260 buckets.
        let span = bucket_of(86_400_000.0) - bucket_of(0.001);
        assert!(span > 1200 && span < 1300, "{span}");
        assert!(bucket_of(1e-300) > 0 && bucket_of(f64::MAX) < 80_000);
        // Each bucket within 1% down to the smallest magnitude kept.
        for x in [1e-300, 3.7e-200, 1e-9, 1.0, 7.3e150, 1e300] {
            let v = value_of(bucket_of(x));
            assert!((v - x).abs() <= ACCURACY * x * (1.0 + 1e-9), "{x} -> {v}");
        }
    }
}
