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

/// After applying a batch: how far our own transaction's changes are applied.
pub const OWN_SEQ_AFTER_DELTA: &str = "greatest((SELECT max(seq) FROM chg WHERE xid = (SELECT own FROM snap)),
                          (SELECT own_seq FROM applied WHERE own = (SELECT own FROM snap)))";

/// CTEs `snap`, `applied`, `chg` (the records of the batch) and `ids` (one row per changed
/// event row, with its record `seq` and `op`). `applied_sql` selects the consumer's state as
/// `(s pg_snapshot, own xid8, own_seq bigint)`.
pub fn ctes(source_id: i32, applied_sql: &str) -> String {
    let log = names::changelog(source_id);
    format!(
        "{SNAP_CTE},
applied AS MATERIALIZED (
    {applied_sql}
),
chg AS MATERIALIZED (
    SELECT c.seq, c.xid, c.op, c.event_ids, c.event_id, c.old_event_type, c.old_event_version,
           c.old_producer, c.old_occurred_at, c.old_payload
    FROM {log} c
    WHERE ((c.xid >= pg_catalog.pg_snapshot_xmin((SELECT s FROM applied))
            AND c.xid < pg_catalog.pg_snapshot_xmax((SELECT s FROM snap)))
           OR c.xid = (SELECT own FROM snap) OR c.xid = (SELECT own FROM applied))
      AND (pg_catalog.pg_visible_in_snapshot(c.xid, (SELECT s FROM snap))
           OR coalesce(c.xid = (SELECT own FROM snap), false))
      AND NOT (pg_catalog.pg_visible_in_snapshot(c.xid, (SELECT s FROM applied))
               OR coalesce(c.xid = (SELECT own FROM applied) AND c.seq <= (SELECT own_seq FROM applied), false))
),
ids AS MATERIALIZED (
    SELECT seq, op, unnest(event_ids) AS event_id FROM chg WHERE op = 'I'
    UNION ALL
    SELECT seq, op, event_id FROM chg WHERE op <> 'I'
)"
    )
}

/// A FROM item giving, as `e`, the current row of every event the batch touched (`ids`) that
/// still exists, each once, by one index lookup per id. The planner's estimates stay small
/// (realtime view reads use it: a read must never be planned as big enough to JIT-compile).
pub fn touched_rows_by_id(source_table: &str) -> String {
    format!("(SELECT DISTINCT event_id FROM ids) k JOIN {source_table} e ON e.event_id = k.event_id")
}

/// The same rows as `touched_rows_by_id`, read as runs of consecutive ids, one index range scan
/// per run: an INSERT ... SELECT or COPY of n rows takes n consecutive ids, so its rows are read
/// like a table range (about a tenth of the buffer visits of one lookup per id). Every id of a
/// run is in the batch, so a run never reads a row the batch did not touch (runs are found in
/// numeric: any bigint is a valid event_id, and bigint arithmetic could overflow). The scan is a
/// LATERAL subquery kept from being pulled up (OFFSET 0), so it can only be planned as a range
/// scan per run: the planner cannot know how short the runs are, estimates far too many rows,
/// and would otherwise prefer one sequential scan of the table. For the same reason statements
/// using this run with JIT off (`privileges::as_role`).
pub fn touched_rows(source_table: &str) -> String {
    format!(
        "(SELECT min(event_id) AS lo, max(event_id) AS hi
     FROM (SELECT event_id, event_id::numeric - row_number() OVER (ORDER BY event_id) AS run
           FROM (SELECT DISTINCT event_id FROM ids) k) numbered
     GROUP BY run) runs
    CROSS JOIN LATERAL (SELECT * FROM {source_table} x
                        WHERE x.event_id >= runs.lo AND x.event_id <= runs.hi OFFSET 0) e"
    )
}
