//! The sketch of `approx_percentile` (see `eventview_core::sketch`): functions the generated
//! statements and relations call on a group's sketch array. NULL is the empty sketch.

use pgrx::prelude::*;

/// The (bucket, count) pairs of a sketch array, flattened; a pair with a NULL half is left out
/// (the extension's statements never write one), never shifting the pairs after it.
fn sketch(a: Option<Vec<Option<i64>>>) -> Vec<i64> {
    a.unwrap_or_default()
        .chunks_exact(2)
        .filter_map(|p| Some([p[0]?, p[1]?]))
        .flatten()
        .collect()
}

fn sketch_or_null(sketch: Vec<i64>) -> Option<Vec<i64>> {
    (!sketch.is_empty()).then_some(sketch)
}

/// `sketch` plus the values of `buckets` counted `counts` times (a refresh's changes of one
/// group; pairs with a NULL bucket or count are left out).
#[pg_extern(name = "_sketch_add", immutable, parallel_safe)]
fn sketch_add(
    sketch_array: Option<Vec<Option<i64>>>,
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
    sketch_or_null(eventview_core::sketch::add(&sketch(sketch_array), &ks, &cs))
}

/// Two sketches added bucket by bucket.
#[pg_extern(name = "_sketch_merge", immutable, parallel_safe)]
fn sketch_merge(a: Option<Vec<Option<i64>>>, b: Option<Vec<Option<i64>>>) -> Option<Vec<i64>> {
    sketch_or_null(eventview_core::sketch::merge(&sketch(a), &sketch(b)))
}

/// The sketch with its counts negated (what retracting its values changes).
#[pg_extern(name = "_sketch_negate", immutable, strict, parallel_safe)]
fn sketch_negate(sketch_array: Vec<Option<i64>>) -> Option<Vec<i64>> {
    sketch_or_null(eventview_core::sketch::negate(&sketch(Some(sketch_array))))
}

/// `percentile_disc(p)` of the values the sketch counts, within its accuracy; NULL without values
/// (and, as any strict function, for a NULL sketch or fraction).
#[pg_extern(name = "_sketch_quantile", immutable, strict, parallel_safe)]
fn sketch_quantile(sketch_array: Vec<Option<i64>>, p: f64) -> Option<f64> {
    eventview_core::sketch::quantile(&sketch(Some(sketch_array)), p)
}
