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
