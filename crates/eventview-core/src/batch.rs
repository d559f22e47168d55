//! The batch of changelog records a consumer has not applied yet: shared by view refreshes and
//! the per-source field observer, so both have the same exactly-once semantics.
//!
//! Algorithm (snapshot batching, as PgQ does): a consumer has applied exactly the changes of the
//! transactions visible in its applied snapshot, plus the changes its own transaction made up to
//! changelog position `own_seq` (when it ran inside the writing transaction). The batch is what
//! is visible now (the statement's snapshot, or written by our own transaction) and was not
//! applied. The xid range of the two snapshots bounds the index scan.

use super::names;

/// The statement's snapshot without our own transaction, and our own xid (see
/// `eventview._snapshot_without_own`).
pub const SNAP_CTE: &str = "snap AS MATERIALIZED (
    SELECT eventview._snapshot_without_own() AS s, pg_catalog.pg_current_xact_id_if_assigned() AS own
)";

/// `SNAP_CTE` for a statement that reads the changelog of event table `source_scan` (a FROM
/// item, `envelope_sql::source_scan`) with its view owner's rights (a realtime read): it also
/// names the event table, which it never reads, so that an owner who may no longer read the table
/// is refused naming the table (42501), not its changelog, whose read a REVOKE on the table takes
/// along. PostgreSQL checks a statement's tables in the order it plans them, and `snap` first.
pub fn snap_cte_naming(source_scan: &str) -> String {
    SNAP_CTE.replacen(
        "\n)",
        &format!("\n    WHERE NOT EXISTS (SELECT FROM {source_scan} WHERE false)\n)"),
        1,
    )
}

/// After applying a batch: how far our own transaction's changes are applied.
pub const OWN_SEQ_AFTER_DELTA: &str =
    "greatest((SELECT max(seq) FROM chg WHERE xid = (SELECT own FROM snap)),
                          (SELECT own_seq FROM applied WHERE own = (SELECT own FROM snap)))";

/// Whether a consumer has applied the changelog row `c`: its transaction is visible in the
/// consumer's applied snapshot `s`, or it is the consumer's own transaction `own` up to position
/// `own_seq` (a refresh inside the writing transaction). The condition is spelled once, in the
/// SQL function `eventview._applied` (sql/bootstrap.sql), which the planner inlines; every
/// reader of positions calls it: the batch (`in_batch`), prune's protection of events with
/// unapplied updates (the extension's `prune_events`), `eventview._pending`, changelog pruning
/// and position renumbering.
pub fn applied_by(s: &str, own: &str, own_seq: &str) -> String {
    format!("eventview._applied(c.xid, c.seq, {s}, {own}, {own_seq})")
}

/// The records of the batch, as a condition on a changelog row `c`: visible now (or written by
/// our own transaction) and not applied (`applied_by` the consumer's state). Reads the CTEs
/// `snap` and `applied`; the xid range of the two snapshots bounds the index scan.
fn in_batch() -> String {
    in_batch_of("applied")
}

/// `in_batch` for the consumer whose state the CTE `applied` selects.
fn in_batch_of(applied: &str) -> String {
    in_batch_over(
        &Position {
            s: &format!("(SELECT s FROM {applied})"),
            own: &format!("(SELECT own FROM {applied})"),
            own_seq: &format!("(SELECT own_seq FROM {applied})"),
        },
        "(SELECT s FROM snap)",
        "(SELECT own FROM snap)",
    )
}

/// A consumer's position as SQL expressions: its applied snapshot, own xid and own seq.
struct Position<'a> {
    s: &'a str,
    own: &'a str,
    own_seq: &'a str,
}

/// `in_batch` over the consumer position `applied` and the statement's snapshot `snap` and own
/// xid `own`, each an SQL expression.
fn in_batch_over(applied: &Position, snap: &str, own: &str) -> String {
    format!(
        "((c.xid >= pg_catalog.pg_snapshot_xmin({a_s})
            AND c.xid < pg_catalog.pg_snapshot_xmax({snap}))
           OR c.xid = {own} OR c.xid = {a_own})
      AND (pg_catalog.pg_visible_in_snapshot(c.xid, {snap})
           OR coalesce(c.xid = {own}, false))
      AND NOT {}",
        applied_by(applied.s, applied.own, applied.own_seq),
        a_s = applied.s,
        a_own = applied.own,
    )
}

/// The record numbers (`seq`) of the batch of another consumer of changelog `log`, whose state
/// the CTE `applied` selects, under the statement's `snap`, as an ordered array (empty when
/// none): equal to `seqs_of_chg` exactly when both consumers have the same batch.
pub fn batch_seqs_of(log: &str, applied: &str) -> String {
    format!(
        "(SELECT coalesce(pg_catalog.array_agg(c.seq ORDER BY c.seq), '{{}}') FROM {log} c WHERE {})",
        in_batch_of(applied)
    )
}

/// The record numbers of the batch (`chg`), as `batch_seqs_of` gives another consumer's.
pub const SEQS_OF_CHG: &str =
    "(SELECT coalesce(pg_catalog.array_agg(seq ORDER BY seq), '{}') FROM chg)";

/// CTEs `snap`, `applied`, `chg` (the records of the batch), `ids` (one row per changed
/// event row, with its record `seq` and `op`), and `record_runs` and `by_record` for
/// `touched_rows` (a statement that reads none of them does not run them). `applied_sql`
/// selects the consumer's state as `(s pg_snapshot, own xid8, own_seq bigint)`.
pub fn ctes(source_id: i32, applied_sql: &str) -> String {
    let batch = log_ctes(
        &names::changelog(source_id),
        "c.seq, c.xid, c.op, c.event_ids, c.event_id, c.old_event_type, c.old_event_version,
           c.old_producer, c.old_occurred_at, c.old_payload",
        applied_sql,
    );
    format!(
        "{batch},
ids AS MATERIALIZED (
    SELECT seq, op, unnest(event_ids) AS event_id FROM chg WHERE op = 'I'
    UNION ALL
    SELECT seq, op, event_id FROM chg WHERE op <> 'I'
),
record_runs AS MATERIALIZED (
    SELECT r.lo, r.hi
    FROM chg CROSS JOIN LATERAL eventview._id_runs(chg.event_ids) r
    WHERE {FEW_INSERTS}
),
by_record AS MATERIALIZED (
    SELECT {FEW_INSERTS}
           AND NOT EXISTS (SELECT 1 FROM (SELECT lo, lag(hi) OVER (ORDER BY lo) AS before FROM record_runs) o
                           WHERE o.lo <= o.before) AS yes
)"
    )
}

/// The field observer's position in the changelog of the source: the snapshot `s` it has
/// consumed up to, its own transaction `own` and how far into it `own_seq`, as `ctes` reads an
/// `applied` position.
pub fn observed_position(source_id: i32) -> String {
    format!(
        "SELECT observed_snapshot AS s, observed_own_xid AS own, observed_own_seq AS own_seq
    FROM eventview._sources WHERE source_id = {source_id}"
    )
}

/// CTEs `snap`, `applied` and `chg` (seq, xid, op, event_ids) of a statement that takes the
/// batch its event table's field observer took in an earlier statement of the transaction:
/// `snap` is the observer's new position, which that statement wrote
/// (`observe_sql::new_observed_position`), as the snapshot and own transaction id (and
/// `own_seq`, which the batch does not need).
pub fn observed_batch_ctes(source_id: i32, applied_sql: &str) -> String {
    let snap = format!(
        "snap AS MATERIALIZED (
    {}
)",
        observed_position(source_id)
    );
    log_ctes_under(
        &snap,
        &names::changelog(source_id),
        "c.seq, c.xid, c.op, c.event_ids",
        applied_sql,
    )
}

/// CTEs `snap`, `applied` and `chg` over any log that has the changelog's `seq` and `xid`
/// (a view's group changes, which its rollups consume): `chg` holds `columns` of the records
/// of the batch, read as `c`.
pub fn log_ctes(log: &str, columns: &str, applied_sql: &str) -> String {
    log_ctes_under(SNAP_CTE, log, columns, applied_sql)
}

fn log_ctes_under(snap_cte: &str, log: &str, columns: &str, applied_sql: &str) -> String {
    let in_batch = in_batch();
    format!(
        "{snap_cte},
applied AS MATERIALIZED (
    {applied_sql}
),
chg AS MATERIALIZED (
    SELECT {columns}
    FROM {log} c
    WHERE {in_batch}
)"
    )
}

/// The number of event rows the records of the batch in `log` name (an insert's ids, one for
/// any other record), counted over at most `limit` records: a read of the log bounded whatever
/// the batch, which exceeds `limit` - 1 whenever the batch has `limit` records or more. For the
/// `also` of `log_pending_check`.
pub fn rows_in_batch(log: &str, limit: i64) -> String {
    let in_batch = in_batch();
    format!(
        "(SELECT coalesce(pg_catalog.sum(CASE WHEN c.op = 'I' THEN pg_catalog.cardinality(c.event_ids) ELSE 1 END), 0)::bigint
        FROM (SELECT c.op, c.event_ids FROM {log} c WHERE {in_batch} LIMIT {limit}) c)"
    )
}

/// `pending_check` over any log with `seq` and `xid` (see `log_ctes`).
pub fn log_pending_check(log: &str, applied_sql: &str, also: &str) -> String {
    let in_batch = in_batch();
    format!(
        "WITH {SNAP_CTE},
applied AS MATERIALIZED (
    {applied_sql}
)
SELECT EXISTS (SELECT 1 FROM {log} c WHERE {in_batch}) AS pending,
       (SELECT pg_catalog.pg_snapshot_xmax(s)::text::bigint FROM applied) AS applied_xmax,
       {also}"
    )
}

/// Whether a realtime read of a consumer of `log` has anything to fold in, as a query of one
/// boolean (NULL when the consumer's row is gone): the reader's batch (under the statement's
/// snapshot) is not empty. One join of the consumer's row and the snapshot, where the batch
/// statements read both from CTEs: a read with nothing pending runs only this, and a plan of
/// a few nodes starts faster than one with a subplan per reference. It names only the
/// extension's own tables, whose names never change, so a statement kept by its text stays
/// valid for the consumer's life (the read checks the owner's SELECT on the event table itself).
///
/// ```sql
/// SELECT EXISTS (SELECT 1 FROM <log> c WHERE <in batch of a, under n>)
/// FROM (<applied_sql>) a,
///      (SELECT eventview._snapshot_without_own() AS s, ... AS own OFFSET 0) n
/// ```
pub fn log_realtime_pending_check(log: &str, applied_sql: &str) -> String {
    let in_batch = in_batch_over(
        &Position {
            s: "a.s",
            own: "a.own",
            own_seq: "a.own_seq",
        },
        "n.s",
        "n.own",
    );
    format!(
        "SELECT EXISTS (SELECT 1 FROM {log} c WHERE {in_batch})
FROM ({applied_sql}) a,
     (SELECT eventview._snapshot_without_own() AS s, pg_catalog.pg_current_xact_id_if_assigned() AS own OFFSET 0) n"
    )
}

/// Whether the consumer has anything to apply: one row, `(pending boolean, applied_xmax
/// bigint, <also>)`, the xmax of its applied snapshot (for the extension's
/// `position_from_elsewhere`)
/// and the expression `also` over the catalog. A consumer with nothing pending skips its
/// statement (hundreds of lines, whose executor start-up alone costs more than this whole
/// check): the batch semantics make that exactly a run over an empty batch, whose only effect
/// would be to move the applied snapshot past transactions that wrote nothing it reads.
pub fn pending_check(source_id: i32, applied_sql: &str, also: &str) -> String {
    log_pending_check(&names::changelog(source_id), applied_sql, also)
}

/// A FROM item giving, as `e`, the current row of every event the batch touched (`ids`) that
/// still exists, each once, by one index lookup per id. The planner's estimates stay small
/// (realtime view reads use it: a read must never be planned as big enough to JIT-compile).
pub fn touched_rows_by_id(source_scan: &str) -> String {
    format!("(SELECT DISTINCT event_id FROM ids) k JOIN {source_scan} e ON e.event_id = k.event_id")
}

/// The same rows as `touched_rows_by_id`, read as runs of consecutive ids, one index range scan
/// per run: an INSERT ... SELECT or COPY of n rows takes n consecutive ids, so its rows are read
/// like a table range (about a tenth of the buffer visits of one lookup per id). Every id of a
/// run is in the batch, so a run never reads a row the batch did not touch, and runs are
/// disjoint, so no row is read twice. Runs are found by `eventview._id_runs` (Rust, see
/// `id_runs`), and come in ascending order, so the rows come in event id order (the field
/// observer's drift follows it):
/// - A batch of at most 64 records, all inserts (the common case), takes the runs of each
///   record's id array (`record_runs`) as they are, when no two of them overlap (`by_record`):
///   no id then needs to be matched against the other records. The `ids` CTE is then never
///   read: unnesting, sorting and regrouping every id cost more than the index scans did (about
///   8 ms of a 10,000-event refresh). Records of inserts alone normally hold disjoint ids (an
///   id is inserted again only after a delete or an update moved it, and both log a record
///   that is not an insert), except when a delete logged nothing (retention pruning, which is
///   not a retraction; capture switched off by `session_replication_role = replica` or a
///   disabled trigger) and the event was inserted again under its id; overlapping runs catch
///   every such case (sorted by `lo`, two runs overlap only if some run overlaps the one
///   before it).
/// - Any other batch groups its distinct ids (`ids`) into blocks of 2^RUN_BLOCK_BITS ids (a run
///   crossing a block boundary is read as two; a block's array stays far below the 1 GB limit
///   of a value however large the batch) and takes the runs of each block. Runs then span
///   records: many small inserts of consecutive ids are read by one range scan, not one each.
///
/// Both branches are planned; a one-time filter (`by_record`) runs one of them. Runs are at
/// most RUN_CHUNK ids long (`id_runs` cuts longer ones; no statement reads the chunk numbers it
/// also gives). The scan is a LATERAL
/// subquery kept from being pulled up (by its LIMIT), so it can only be planned as a range scan
/// per run: the planner cannot know how short the runs are and would otherwise prefer one
/// sequential scan of the table. The LIMIT never cuts a run short (event_id is the key, so a
/// run of n ids holds at most n rows; runs are at most RUN_CHUNK long, so it cannot overflow):
/// it is there for the estimates, which it divides by ten (a LIMIT the planner cannot compute
/// counts as 10% of the rows). Without it, with `_id_runs` estimated at its default 1000 runs,
/// a batch of ten events is planned as tens of millions of rows, and every hash aggregate
/// above it allocates and scans a table sized for them (a quarter of such a refresh's time).
/// `_id_runs` is declared with a small row estimate for the same reason (sql/api.sql).
/// Statements using this still run with JIT off (the extension's `as_role`): the estimates
/// stay rough.
pub fn touched_rows(source_scan: &str) -> String {
    rows_by_runs(source_scan, "true")
}

/// The same as `touched_rows`, for the events the batch inserted only: those an insert record
/// holds (an event inserted and then updated in the batch is read once, as it is now). Events
/// the batch only updated are left out. When the batch is all inserts, both read the same runs.
pub fn inserted_rows(source_scan: &str) -> String {
    rows_by_runs(source_scan, "op = 'I'")
}

/// `touched_rows` over the ids of `ids` that meet `which` (a condition on its columns).
fn rows_by_runs(source_scan: &str, which: &str) -> String {
    format!(
        "(SELECT lo, hi FROM record_runs WHERE (SELECT yes FROM by_record)
     UNION ALL
     SELECT r.lo, r.hi
      FROM (SELECT pg_catalog.array_agg(event_id) AS ids
            FROM ids WHERE {which} GROUP BY event_id OPERATOR(pg_catalog.>>) {RUN_BLOCK_BITS}) blocks
      CROSS JOIN LATERAL eventview._id_runs(blocks.ids) r
      WHERE NOT (SELECT yes FROM by_record)
     ORDER BY 1) runs
    CROSS JOIN LATERAL (SELECT * FROM {source_scan} x
                        WHERE x.event_id >= runs.lo AND x.event_id <= runs.hi
                        LIMIT runs.hi - runs.lo + 1) e"
    )
}

/// Whether the batch (`chg`) is at most 64 records, all inserts: `record_runs` reads only such a
/// batch, and `by_record` takes its runs only then.
const FEW_INSERTS: &str =
    "(SELECT count(*) <= 64 AND coalesce(pg_catalog.bool_and(op = 'I'), true) FROM chg)";

/// How many changed event rows the batch holds (the rows of `ids`, counted without them).
pub const CONSUMED: &str =
    "(SELECT coalesce(sum(CASE WHEN op = 'I' THEN pg_catalog.cardinality(event_ids) ELSE 1 END), 0)::bigint FROM chg)";

/// Ids of one block of `touched_rows` share all but their low RUN_BLOCK_BITS bits.
pub const RUN_BLOCK_BITS: u32 = 20;
/// Most ids in one chunk of runs (see `id_runs`).
pub const RUN_CHUNK: usize = 4096;

/// The runs of consecutive values among `ids` (in any order, with repeats), as inclusive
/// (lo, hi) pairs in ascending order, none longer than RUN_CHUNK ids, each with a chunk number:
/// runs of one chunk hold at most RUN_CHUNK ids together. Any i64 is a valid id: no arithmetic
/// can overflow.
pub fn id_runs(ids: &mut Vec<i64>) -> Vec<(i64, i64, i32)> {
    ids.sort_unstable();
    ids.dedup();
    let mut runs: Vec<(i64, i64, i32)> = Vec::new();
    let (mut chunk, mut in_chunk) = (0i32, 0usize);
    for &id in ids.iter() {
        if in_chunk == RUN_CHUNK {
            chunk += 1;
            in_chunk = 0;
        }
        in_chunk += 1;
        match runs.last_mut() {
            Some((_, hi, c)) if *c == chunk && hi.checked_add(1) == Some(id) => *hi = id,
            _ => runs.push((id, id, chunk)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_consecutive_ids() {
        let lo_hi = |ids: Vec<i64>| {
            id_runs(&mut ids.clone())
                .into_iter()
                .map(|(lo, hi, _)| (lo, hi))
                .collect::<Vec<_>>()
        };
        assert_eq!(lo_hi(vec![]), vec![]);
        assert_eq!(
            lo_hi(vec![5, 3, 4, 4, 9, 10, 1]),
            vec![(1, 1), (3, 5), (9, 10)]
        );
        assert_eq!(
            lo_hi(vec![i64::MAX, i64::MIN, i64::MAX - 1, i64::MIN + 1, 0]),
            vec![(i64::MIN, i64::MIN + 1), (0, 0), (i64::MAX - 1, i64::MAX)]
        );
        // Chunks: at most RUN_CHUNK ids each, long runs split, scattered ids packed together.
        let long = id_runs(&mut (1..=10_000).collect());
        assert_eq!(long, vec![(1, 4096, 0), (4097, 8192, 1), (8193, 10_000, 2)]);
        let scattered = id_runs(&mut (0..10_000).map(|i| i * 3).collect());
        assert_eq!(scattered.len(), 10_000);
        assert_eq!(scattered.iter().filter(|r| r.2 == 0).count(), RUN_CHUNK);
        assert_eq!(scattered.last().unwrap().2, 2);
        // Every id is in exactly one run, and no run holds an id that was not given.
        let mut rng = crate::fuzz::Rng(0x1d_5eed);
        for _ in 0..500 {
            let given: Vec<i64> = (0..rng.below(60))
                .map(|_| rng.below(80) as i64 - 40)
                .collect();
            let runs: Vec<(i64, i64)> = id_runs(&mut given.clone())
                .into_iter()
                .map(|(lo, hi, _)| (lo, hi))
                .collect();
            let covered: Vec<i64> = runs.iter().flat_map(|&(lo, hi)| lo..=hi).collect();
            let mut want = given.clone();
            want.sort_unstable();
            want.dedup();
            assert_eq!(covered, want);
            assert!(runs.windows(2).all(|w| w[0].1 < w[1].0));
        }
    }
}
