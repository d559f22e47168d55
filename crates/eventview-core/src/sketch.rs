//! The sketch behind `approx_percentile(ref, p)`: each number goes to a bucket of a
//! logarithmic scale (DDSketch's mapping), and a group keeps, per bucket, how many of its values
//! fall in it, as one `bigint[]` in its storage row: bucket numbers ascending, each followed by
//! its count (`[k1, c1, k2, c2, ...]`, no zero count; NULL for none). Counts add and subtract
//! exactly, so the sketch is retractable and mergeable (`merge`, `add`), and a refresh updates one
//! array per group it changes; its size per group is bounded by the buckets the magnitudes of its
//! values span (about 1,150 per factor of 10^10), whatever the number of events. The SQL
//! functions `eventview._sketch_add`, `_sketch_merge`, `_sketch_negate` and `_sketch_quantile`
//! (and the aggregate `_sketch_sum`) call these.
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

/// The bucket index of a positive magnitude, as `bucket_sql` computes it (for tests).
pub fn bucket_of(x: f64) -> i64 {
    if x.abs() < 1e-300 {
        return 0;
    }
    let i = (x.abs().min(1e300).ln() / gamma().ln()).ceil() as i64;
    x.signum() as i64 * (OFFSET + i)
}

/// The value of bucket number `k`: within `ACCURACY` of every number in the bucket.
pub fn value_of(k: i64) -> f64 {
    if k == 0 {
        return 0.0;
    }
    let g = gamma();
    k.signum() as f64 * 2.0 * g.powf((k.abs() - OFFSET) as f64) / (g + 1.0)
}

/// The (bucket, count) pairs of a sketch array; a trailing odd element is ignored.
fn pairs(sketch: &[i64]) -> impl Iterator<Item = (i64, i64)> + '_ {
    sketch.chunks_exact(2).map(|p| (p[0], p[1]))
}

/// `a` plus `b`, two sketches: counts of the same bucket added, buckets whose count ends at zero
/// left out. Either may hold negative counts (a change that retracts values).
pub fn merge(a: &[i64], b: &[i64]) -> Vec<i64> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut x, mut y) = (pairs(a).peekable(), pairs(b).peekable());
    loop {
        let (k, c) = match (x.peek(), y.peek()) {
            (None, None) => break,
            (Some(&(ka, ca)), Some(&(kb, cb))) if ka == kb => {
                x.next();
                y.next();
                (ka, ca.saturating_add(cb))
            }
            (Some(&(ka, _)), Some(&(kb, _))) if kb < ka => y.next().expect("peeked"),
            (Some(_), _) => x.next().expect("peeked"),
            (None, Some(_)) => y.next().expect("peeked"),
        };
        if c != 0 {
            out.push(k);
            out.push(c);
        }
    }
    out
}

/// `sketch` plus the values of buckets `buckets` with counts `counts` (in any order, repeated
/// buckets added up; pairs with a NULL bucket are left out by the caller).
pub fn add(sketch: &[i64], buckets: &[i64], counts: &[i64]) -> Vec<i64> {
    let mut changes: Vec<(i64, i64)> = buckets
        .iter()
        .copied()
        .zip(counts.iter().copied())
        .collect();
    changes.sort_unstable_by_key(|&(k, _)| k);
    let mut summed: Vec<i64> = Vec::with_capacity(changes.len() * 2);
    for (k, c) in changes {
        let n = summed.len();
        if n >= 2 && summed[n - 2] == k {
            summed[n - 1] = summed[n - 1].saturating_add(c);
        } else {
            summed.push(k);
            summed.push(c);
        }
    }
    merge(sketch, &summed)
}

/// The sketch with every count negated (its retraction).
pub fn negate(sketch: &[i64]) -> Vec<i64> {
    pairs(sketch).flat_map(|(k, c)| [k, -c]).collect()
}

/// `percentile_disc(p)` of the values a sketch counts, as the value of its bucket: the first
/// bucket whose running count reaches `ceil(p * total)` (at least 1), computed in double
/// precision as PostgreSQL's percentile_disc does; None without values.
pub fn quantile(sketch: &[i64], p: f64) -> Option<f64> {
    let total: i64 = pairs(sketch).map(|(_, c)| c.max(0)).sum();
    if total <= 0 {
        return None;
    }
    let rank = (p * total as f64).ceil().max(1.0);
    let mut running = 0i64;
    for (k, c) in pairs(sketch) {
        running += c.max(0);
        if c > 0 && running as f64 >= rank {
            return Some(value_of(k));
        }
    }
    pairs(sketch)
        .filter(|&(_, c)| c > 0)
        .last()
        .map(|(k, _)| value_of(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sketches_merge_bucket_by_bucket_and_drop_emptied_buckets() {
        let a = [-40_010, 2, 0, 1, 40_100, 3];
        let b = [0, -1, 40_050, 4, 40_100, 1];
        assert_eq!(merge(&a, &b), vec![-40_010, 2, 40_050, 4, 40_100, 4]);
        assert_eq!(merge(&a, &negate(&a)), Vec::<i64>::new());
        assert_eq!(merge(&[], &b), b.to_vec());
        assert_eq!(
            add(&a, &[40_100, 7, 40_100, 0], &[-3, 1, 1, -1]),
            vec![-40_010, 2, 7, 1, 40_100, 1]
        );
    }

    #[test]
    fn a_sketch_quantile_is_percentile_disc_of_the_bucket_values() {
        // Values 1..=100, one each: percentile_disc(p) is the ceil(100 p)-th.
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        let buckets: Vec<i64> = values.iter().map(|&v| bucket_of(v)).collect();
        let sketch = add(&[], &buckets, &vec![1; buckets.len()]);
        for (p, expected) in [
            (0.0, 1.0),
            (0.5, 50.0),
            (0.99, 99.0),
            (1.0, 100.0),
            (0.011, 2.0),
        ] {
            let got = quantile(&sketch, p).unwrap();
            assert!((got - expected).abs() <= ACCURACY * expected, "{p}: {got}");
        }
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&negate(&[]), 0.5), None);
    }

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
