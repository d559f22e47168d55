//! The sketch of `approx_percentile` (see `eventview_core::sketch`): functions the generated
//! statements and relations call on a group's sketch array. NULL is the empty sketch.

use pgrx::prelude::*;

fn values(a: Option<Vec<Option<i64>>>) -> Vec<i64> {
    a.unwrap_or_default().into_iter().flatten().collect()
}

fn sketch_or_null(sketch: Vec<i64>) -> Option<Vec<i64>> {
    (!sketch.is_empty()).then_some(sketch)
}

/// `sketch` plus the values of `buckets` counted `counts` times (a refresh's changes of one
/// group; pairs with a NULL bucket are left out).
#[pg_extern(name = "_sketch_add", immutable, parallel_safe)]
fn sketch_add(
    sketch: Option<Vec<Option<i64>>>,
    buckets: Option<Vec<Option<i64>>>,
    counts: Option<Vec<Option<i64>>>,
) -> Option<Vec<i64>> {
    let (mut ks, mut cs) = (Vec::new(), Vec::new());
    for (k, c) in buckets
        .unwrap_or_default()
        .into_iter()
        .zip(counts.unwrap_or_default())
    {
        if let (Some(k), Some(c)) = (k, c) {
            ks.push(k);
            cs.push(c);
        }
    }
    sketch_or_null(eventview_core::sketch::add(&values(sketch), &ks, &cs))
}

/// Two sketches added bucket by bucket.
#[pg_extern(name = "_sketch_merge", immutable, parallel_safe)]
fn sketch_merge(a: Option<Vec<Option<i64>>>, b: Option<Vec<Option<i64>>>) -> Option<Vec<i64>> {
    sketch_or_null(eventview_core::sketch::merge(&values(a), &values(b)))
}

/// The sketch with its counts negated (what retracting its values changes).
#[pg_extern(name = "_sketch_negate", immutable, strict, parallel_safe)]
fn sketch_negate(sketch: Vec<Option<i64>>) -> Option<Vec<i64>> {
    sketch_or_null(eventview_core::sketch::negate(&values(Some(sketch))))
}

/// `percentile_disc(p)` of the values the sketch counts, within its accuracy; NULL without values.
#[pg_extern(name = "_sketch_quantile", immutable, parallel_safe)]
fn sketch_quantile(sketch: Option<Vec<Option<i64>>>, p: f64) -> Option<f64> {
    eventview_core::sketch::quantile(&values(sketch), p)
}
