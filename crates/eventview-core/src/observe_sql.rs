//! SQL of the field observer: records every payload path and JSON type per event type and
//! version (`eventview.observed_fields`) and what changed (`eventview.drift`), as changes are
//! processed by a refresh, never on the insert path.
//!
//! Algorithm: the observer is one more consumer of the source's changelog (its cursor lives in
//! `eventview._sources.observed_*`, with the batch semantics of `batch`). For every event the
//! batch inserted (as it is now), the aggregate `eventview._shapes_agg` (Rust,
//! see `shapes.rs`) lists its distinct (path, JSON type) pairs (arrays as `[*]`; at most
//! MAX_DEPTH levels and MAX_MEMBERS members of each object or array). Compared with what was
//! observed before for the same event type and version, and in the order the batch's events
//! were walked (by event id), so that drift does not depend on how changes were split into
//! refreshes:
//! - a path never seen before: `added`, with the JSON type it first had;
//! - a path with a JSON type never seen before for it: `type_changed` (old type: its type in
//!   the last event before that had it, in the batch, else the one seen last);
//! - a path some view reads from events of that type and version (its `event_types`, and of a
//!   logical field, the most specific declaration for that type and version), present in every
//!   earlier event of that type and version, absent from some new one: `missing` (also within
//!   the batch that first brings the type and version). Members past MAX_MEMBERS of an object
//!   are not walked: with payloads that wide, a path past the cut counts as absent (see
//!   "Observed fields and drift" in docs/reference.md).
//!
//! Updates and deletes are not observed: observed fields and drift describe events as their
//! producers sent them, and a correction is not a new event (`seen` would count an event once
//! per update, and an update dropping a path would report it `missing` from new events). An
//! update that gives a row a new event_id (`SET event_id = DEFAULT`) logs that id as inserted,
//! so that row is observed as a new event.

use super::{batch, names};

/// Deepest level of a payload the observer walks.
pub const MAX_DEPTH: u32 = 32;
/// Members of one object (or elements of one array) the observer walks.
pub const MAX_MEMBERS: u32 = 1000;

/// Whether the observer of the source has anything to observe (see `batch::pending_check`).
pub fn pending_check(source_id: i32) -> String {
    batch::pending_check(
        source_id,
        &batch::observed_position(source_id),
        "NULL::bigint AS unused",
    )
}

/// The observer statement for one source. $1 to $5: the paths views read, normalized (text[];
/// NULL: a path that cannot be observed), each with the event type and version it is read for
/// (NULL: any), the field reference it is a declaration of and its rank among that reference's
/// declarations (most specific first), as arrays of one length. $6 to $9: the refresh pass of
/// the view being refreshed, for `shared_pass` (NULL: none). Returns (events observed, drift
/// rows recorded, the token of the pass's result or NULL, the event rows the batch's records
/// name, as an apply counts them consumed, whether the batch may hold drift).
///
/// ```sql
/// WITH snap ..., applied ..., chg ..., ids ...,     -- the batch (batch::ctes)
/// view_applied ..., shared ...,                     -- whether the view's batch is this one
/// walk ..., walked ..., vers ..., obs ...,          -- what the batch's new events hold
/// declared ..., read_paths ...,                     -- what views read
/// prev_vers ..., prev_paths ...,                    -- what was observed before
/// added ..., changed ..., missing ...,              -- drift
/// may_drift ..., drifted ...,
/// seen_paths ..., seen_versions ...,                -- writes
/// st ...                                            -- the observer's new position
/// SELECT <events observed> AS observed, <drift rows> AS drift_rows, ...
/// ```
pub fn observe(source_id: i32, source_scan: &str) -> String {
    observer_statement(source_id, source_scan, Drift::Record)
}

/// The observer statement without the drift joins (`prev_paths`, `added`, `changed`,
/// `missing`, `drifted`), which a batch without drift skips anyway (`may_drift`) but whose
/// executor nodes every run sets up: a seventh of a 10-event refresh's time. It does the
/// observer's work only for a batch that cannot hold drift; for one that may, it writes
/// nothing and says so (its last column), and the caller runs `observe`. Same parameters and
/// columns as `observe`.
pub fn observe_unless_drift(source_id: i32, source_scan: &str) -> String {
    observer_statement(source_id, source_scan, Drift::LeaveToWholeStatement)
}

/// What an observer statement does with a batch that may hold drift.
#[derive(Clone, Copy, PartialEq)]
enum Drift {
    /// Records it (`drifted`).
    Record,
    /// Writes nothing, for `observe` to record it (the writes are conditional on `NOT
    /// may_drift`).
    LeaveToWholeStatement,
}

fn observer_statement(source_id: i32, source_scan: &str, drift: Drift) -> String {
    let sid = source_id;
    let mut ctes = vec![
        batch::ctes(source_id, &batch::observed_position(source_id)),
        shared_pass(source_id),
        walked(source_scan),
        vers(),
        obs(),
        declared(),
        read_paths(),
        prev_vers(sid),
    ];
    let (drift_rows, unless) = match drift {
        Drift::Record => {
            ctes.extend([
                prev_paths(sid),
                added(),
                changed(sid),
                missing(),
                may_drift(sid),
                drifted(sid),
            ]);
            ("(SELECT count(*) FROM drifted)", "")
        }
        Drift::LeaveToWholeStatement => {
            ctes.push(may_drift(sid));
            ("0::bigint", "NOT (SELECT yes FROM may_drift)")
        }
    };
    ctes.extend([
        seen_paths(sid, unless),
        seen_versions(sid, unless),
        new_observed_position(sid, unless),
    ]);
    format!(
        "WITH {}
SELECT (SELECT coalesce(sum(n), 0)::bigint FROM vers) AS observed, {drift_rows} AS drift_rows,
       (SELECT pass FROM walk) AS pass,
       (SELECT coalesce(sum(CASE WHEN op = 'I' THEN pg_catalog.cardinality(event_ids) ELSE 1 END), 0)::bigint FROM chg) AS batch_rows,
       (SELECT yes FROM may_drift) AS may_drift",
        ctes.join(",\n")
    )
}

/// `condition` as a further condition of a WHERE clause (`AND ...`), or as the whole of one
/// (`WHERE ...`); nothing when empty.
fn and_also(condition: &str, keyword: &str) -> String {
    if condition.is_empty() {
        String::new()
    } else {
        format!("\n    {keyword} {condition}")
    }
}

/// `view_applied` and `shared`: whether the refresh pass of the view being refreshed runs over
/// this batch's rows too (`walk`), for the view's apply to take its result instead of reading
/// the same events again (`ViewSql::apply_from_shared_pass`). $6: the view's pass plan
/// (`Plan::to_text`; NULL: no pass wanted); $9: the view's id. Only when the view's batch is
/// exactly the observer's (the same records: the view's state read under this statement's
/// snapshot), all inserts (the observer reads the rows inserts name, the view also those
/// updates and deletes name) and within `ONE_PASS_MAX_ROWS`.
///
/// ```sql
/// view_applied AS MATERIALIZED (SELECT applied_snapshot AS s, ... FROM eventview._views WHERE view_id = $9),
/// shared AS MATERIALIZED (
///     SELECT CASE WHEN $6::text IS NULL THEN false
///                 ELSE <chg all inserts, within the limit> AND <chg's records> = <the view's batch's> END AS yes
/// )
/// ```
fn shared_pass(source_id: i32) -> String {
    let view_batch = batch::batch_seqs_of(&names::changelog(source_id), "view_applied");
    let chg = batch::SEQS_OF_CHG;
    let limit = crate::sqlgen::ONE_PASS_MAX_ROWS;
    format!(
        "view_applied AS MATERIALIZED (
    SELECT applied_snapshot AS s, applied_own_xid AS own, applied_own_seq AS own_seq
    FROM eventview._views WHERE view_id = $9::integer
),
shared AS MATERIALIZED (
    SELECT CASE WHEN $6::text IS NULL THEN false
                ELSE (SELECT coalesce(pg_catalog.bool_and(op = 'I'), true)
                             AND coalesce(pg_catalog.sum(pg_catalog.cardinality(event_ids)), 0) <= {limit}
                      FROM chg)
                     AND {chg} = {view_batch} END AS yes
)"
    )
}

/// `walk` and `walked`: the walk of the payloads of the events the batch inserted, one row per
/// (event type, version, path, JSON type) with its counts and first and last events (see
/// `shapes::ShapeRow`); over the same rows, when `shared`, the view's refresh pass (`pass`, the
/// token of its result: `eventview._group_deltas` with plan $6, bucket width $7, each row
/// added (+1) and of the view's event types $8, NULL: any).
///
/// ```sql
/// walk AS MATERIALIZED (
///     SELECT eventview._shapes_agg(e.event_type, e.event_version, e.payload) AS shapes,
///            eventview._group_deltas($6, $7, 1, e.event_id, ...) FILTER (WHERE ...) AS pass
///     FROM <inserted rows>
/// ),
/// walked AS MATERIALIZED (
///     SELECT r.value ->> 0 AS event_type, ..., r.value ->> 2 AS path, ...
///     FROM walk f CROSS JOIN LATERAL pg_catalog.jsonb_array_elements(f.shapes::jsonb) r
/// )
/// ```
fn walked(source_scan: &str) -> String {
    let inserted = batch::inserted_rows(source_scan);
    format!(
        "-- The walk is an aggregate over the rows, read once: one call per event, walking its payload
-- in place, and at the end the counts as JSON (besides the paths, per type and version, how
-- many events it walked: path ''), with, in the order walked, the first and the last event
-- with each path and type and the first event without each path.
walk AS MATERIALIZED (
    SELECT eventview._shapes_agg(e.event_type, e.event_version, e.payload) AS shapes,
           eventview._group_deltas($6::text, $7::interval, 1, e.event_id, e.event_type, e.event_version,
                                   e.producer, e.occurred_at, e.payload)
               FILTER (WHERE (SELECT yes FROM shared)
                         AND ($8::text[] IS NULL OR e.event_type = ANY ($8::text[]))) AS pass
    FROM {inserted}
),
walked AS MATERIALIZED (
    SELECT r.value ->> 0 AS event_type, (r.value ->> 1)::integer AS event_version,
           r.value ->> 2 AS path, r.value ->> 3 AS json_type, (r.value ->> 4)::bigint AS events,
           (r.value ->> 5)::bigint AS first, (r.value ->> 6)::bigint AS first_without,
           (r.value ->> 7)::bigint AS last, nullif(r.value ->> 8, '') AS before, nullif(r.value ->> 9, '') AS before_without
    FROM walk f
    CROSS JOIN LATERAL pg_catalog.jsonb_array_elements(f.shapes::jsonb) r
)"
    )
}

/// `vers`: per event type and version, the events the batch inserted.
///
/// ```sql
/// vers AS (SELECT event_type, event_version, sum(events)::bigint AS n
///          FROM walked WHERE path = '' GROUP BY 1, 2)
/// ```
fn vers() -> String {
    "vers AS (
    SELECT event_type, event_version, sum(events)::bigint AS n FROM walked WHERE path = '' GROUP BY 1, 2
)"
    .to_string()
}

/// `obs`: per event type, version, path and JSON type, what the batch's events hold.
///
/// ```sql
/// obs AS (SELECT event_type, event_version, path, json_type, sum(events)::bigint AS n, ...
///         FROM walked WHERE path <> '' GROUP BY 1, 2, 3, 4)
/// ```
fn obs() -> String {
    "obs AS (
    SELECT event_type, event_version, path, json_type, sum(events)::bigint AS n,
           min(first) AS first, max(first_without) AS first_without, max(last) AS last,
           max(before) AS before, max(before_without) AS before_without
    FROM walked WHERE path <> ''
    GROUP BY 1, 2, 3, 4
)"
    .to_string()
}

/// `declared`: the statement's parameters $1 to $5 as rows.
///
/// ```sql
/// declared AS (SELECT r.path, r.event_type, r.event_version, r.field, r.rank
///              FROM ROWS FROM (unnest($1), ..., unnest($5)) AS r(...))
/// ```
fn declared() -> String {
    "-- The declarations of the paths views read, with the event type and version each is for (NULL:
-- any), numbered per field reference, most specific first.
declared AS (
    SELECT r.path, r.event_type, r.event_version, r.field, r.rank
    FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::integer[]),
                    pg_catalog.unnest($4::integer[]), pg_catalog.unnest($5::integer[]))
         AS r(path, event_type, event_version, field, rank)
)"
    .to_string()
}

/// `read_paths`: per event type and version of the batch, the paths views read.
///
/// ```sql
/// read_paths AS (SELECT DISTINCT ON (v.event_type, v.event_version, d.field) d.path, ...
///                FROM vers v JOIN declared d ON <d applies to v> ORDER BY ..., d.rank)
/// ```
fn read_paths() -> String {
    "-- Per type and version with events in the batch, the paths read: of each field reference, the
-- most specific declaration that applies (as resolution picks it).
read_paths AS (
    SELECT DISTINCT ON (v.event_type, v.event_version, d.field) d.path, v.event_type, v.event_version
    FROM vers v JOIN declared d
      ON (d.event_type IS NULL OR d.event_type = v.event_type)
     AND (d.event_version IS NULL OR d.event_version = v.event_version)
    ORDER BY v.event_type, v.event_version, d.field, d.rank
)"
    .to_string()
}

/// `prev_vers`: per event type and version of the batch, the events observed before (0 for
/// none).
///
/// ```sql
/// prev_vers AS (SELECT v.event_type, v.event_version, coalesce(o.events, 0) AS events
///               FROM vers v LEFT JOIN eventview._observed_versions o ON ...)
/// ```
fn prev_vers(sid: i32) -> String {
    format!(
        "prev_vers AS (
    SELECT v.event_type, v.event_version, coalesce(o.events, 0) AS events
    FROM vers v LEFT JOIN eventview._observed_versions o
      ON o.source_id = {sid} AND o.event_type = v.event_type AND o.event_version = v.event_version
)"
    )
}

/// `prev_paths`: per event type and version of the batch, each path observed before, in how
/// many events, and its last JSON type.
///
/// ```sql
/// prev_paths AS (SELECT o.event_type, o.event_version, o.path, sum(o.seen) AS seen, <last type>
///                FROM eventview._observed o JOIN vers v USING (...) ... GROUP BY 1, 2, 3)
/// ```
fn prev_paths(sid: i32) -> String {
    format!(
        "-- The type each path had last: by the number of its last event among those of its type and
-- version ever observed (rows observed before 0.12.0 have none; last_seen is the same for every
-- observation in one transaction); of two types in that event, the first by name, as the walk
-- names them (shapes::kind_named).
prev_paths AS (
    SELECT o.event_type, o.event_version, o.path, sum(o.seen) AS seen,
           (array_agg(o.json_type ORDER BY o.last_event DESC NULLS LAST, o.last_seen DESC, o.json_type))[1] AS last_type
    FROM eventview._observed o JOIN vers v USING (event_type, event_version)
    WHERE o.source_id = {sid}
    GROUP BY 1, 2, 3
)"
    )
}

/// `added`: paths never observed before for their event type and version (drift `added`).
///
/// ```sql
/// added AS (SELECT o.event_type, o.event_version, o.path, o.json_type
///           FROM obs o LEFT JOIN prev_paths p USING (...) WHERE p.path IS NULL AND ...)
/// ```
fn added() -> String {
    "-- (`before`: the path's type in the batch's last event before this type's first that had it.)
added AS (
    SELECT o.event_type, o.event_version, o.path, o.json_type
    FROM obs o LEFT JOIN prev_paths p USING (event_type, event_version, path)
    WHERE p.path IS NULL AND o.before IS NULL
)"
    .to_string()
}

/// `changed`: paths with a JSON type never observed for them before (drift `type_changed`).
///
/// ```sql
/// changed AS (SELECT ..., coalesce(o.before, p.last_type) AS old_type, o.json_type AS new_type
///             FROM obs o LEFT JOIN prev_paths p USING (...) WHERE ... AND NOT EXISTS (...))
/// ```
fn changed(sid: i32) -> String {
    format!(
        "-- A type new for its path: after the one before it in this batch, or the last one seen before.
changed AS (
    SELECT o.event_type, o.event_version, o.path, coalesce(o.before, p.last_type) AS old_type, o.json_type AS new_type
    FROM obs o LEFT JOIN prev_paths p USING (event_type, event_version, path)
    WHERE (p.path IS NOT NULL OR o.before IS NOT NULL)
      AND NOT EXISTS (
        SELECT 1 FROM eventview._observed x
        WHERE x.source_id = {sid} AND x.event_type = o.event_type AND x.event_version = o.event_version
          AND x.path = o.path AND x.json_type = o.json_type)
)"
    )
}

/// `missing`: paths some view reads, in every earlier event of their type and version, absent
/// from some new one (drift `missing`); for a type and version new in the batch, paths its
/// first events all had.
///
/// ```sql
/// missing AS (SELECT ... FROM prev_paths p ... WHERE <read> AND <in fewer new events than vers>
///             UNION ALL
///             SELECT ... FROM obs o ... WHERE pv.events = 0 AND o.first_without > 1 AND <read>)
/// ```
fn missing() -> String {
    "-- (The old type: the path's type in the last event before the first without it, in this batch
-- if one had it, else the last seen before.)
missing AS (
    SELECT p.event_type, p.event_version, p.path,
           coalesce((SELECT max(o.before_without) FROM obs o
                     WHERE o.event_type = p.event_type AND o.event_version = p.event_version AND o.path = p.path),
                    p.last_type) AS old_type
    FROM prev_paths p
    JOIN prev_vers pv USING (event_type, event_version)
    JOIN vers nv USING (event_type, event_version)
    WHERE pv.events > 0 AND p.seen >= pv.events
      AND EXISTS (SELECT 1 FROM read_paths r WHERE r.path = p.path
                    AND r.event_type = p.event_type AND r.event_version = p.event_version)
      AND coalesce((SELECT sum(o.n) FROM obs o
                    WHERE o.event_type = p.event_type AND o.event_version = p.event_version
                      AND o.path = p.path), 0) < nv.n
    UNION ALL
    -- A type and version first seen in this batch: a path its first events all had, absent
    -- from a later one.
    SELECT DISTINCT o.event_type, o.event_version, o.path, o.before_without
    FROM obs o JOIN prev_vers pv USING (event_type, event_version)
    WHERE pv.events = 0 AND o.first_without > 1
      AND EXISTS (SELECT 1 FROM read_paths r WHERE r.path = o.path
                    AND r.event_type = o.event_type AND r.event_version = o.event_version)
)"
    .to_string()
}

/// `may_drift`: whether the batch can hold drift at all. Each kind needs something this finds
/// with a few index probes: `added` and `changed` a path and JSON type never observed for their
/// event type and version, `missing` a path some view reads that every event of a type and
/// version observed before had and fewer of the batch's events of that type and version have
/// than there are such events, or a type and version with no events observed before
/// (`prev_vers`; its paths are new too, unless `_observed_versions` lost rows `_observed`
/// kept). When none is true, which in a stream of events of known shapes is nearly always
/// (also when some events lack a path views read that never was in all of them), `drifted`
/// skips the joins of `added`, `changed` and `missing` (and `prev_paths`, which only they
/// read): about half of the observer's time on a batch of a few events.
/// `observe_unless_drift` leaves those joins out of the statement altogether, and with them
/// the setting up of their executor nodes.
///
/// ```sql
/// may_drift AS (SELECT EXISTS (<obs row without its _observed row>)
///                   OR EXISTS (<read path in fewer events than vers, in all events before>)
///                   OR EXISTS (<prev_vers row with no events>) AS yes)
/// ```
fn may_drift(sid: i32) -> String {
    format!(
        "may_drift AS (
    SELECT EXISTS (SELECT 1 FROM obs o
                   WHERE NOT EXISTS (SELECT 1 FROM eventview._observed x
                                     WHERE x.source_id = {sid} AND x.event_type = o.event_type
                                       AND x.event_version = o.event_version AND x.path = o.path
                                       AND x.json_type = o.json_type))
        OR EXISTS (SELECT 1 FROM read_paths r JOIN vers v USING (event_type, event_version)
                                            JOIN prev_vers pv USING (event_type, event_version)
                   WHERE r.path IS NOT NULL AND pv.events > 0
                     AND coalesce((SELECT sum(o.n) FROM obs o
                                   WHERE o.event_type = r.event_type AND o.event_version = r.event_version
                                     AND o.path = r.path), 0) < v.n
                     AND (SELECT coalesce(sum(x.seen), 0) FROM eventview._observed x
                          WHERE x.source_id = {sid} AND x.event_type = r.event_type
                            AND x.event_version = r.event_version AND x.path = r.path) >= pv.events)
        OR EXISTS (SELECT 1 FROM prev_vers WHERE events = 0) AS yes
)"
    )
}

/// `drifted`: the drift rows recorded, in a deterministic order.
///
/// ```sql
/// drifted AS (INSERT INTO eventview.drift (...) SELECT ... FROM (<added> UNION ALL <changed>
///             UNION ALL <missing>) d WHERE (SELECT yes FROM may_drift) ORDER BY ... RETURNING 1)
/// ```
fn drifted(sid: i32) -> String {
    format!(
        "drifted AS (
    INSERT INTO eventview.drift (source, event_type, event_version, path, change, old_type, new_type)
    SELECT (SELECT relid FROM eventview._sources WHERE source_id = {sid}), event_type, event_version, path, change, old_type, new_type
    FROM (
        SELECT event_type, event_version, path, 'added' AS change, NULL::text AS old_type, json_type AS new_type FROM added
        UNION ALL
        SELECT event_type, event_version, path, 'type_changed', old_type, new_type FROM changed
        UNION ALL
        SELECT event_type, event_version, path, 'missing', old_type, NULL FROM missing
    ) d
    WHERE (SELECT yes FROM may_drift)
    ORDER BY event_type, event_version, path, change, new_type
    RETURNING 1
)"
    )
}

/// `seen_paths`: the batch's paths and JSON types added into `eventview._observed`.
///
/// ```sql
/// seen_paths AS (INSERT INTO eventview._observed AS t (...) SELECT ... FROM obs o ...
///                ON CONFLICT (...) DO UPDATE SET last_seen = ..., seen = t.seen + ... RETURNING 1)
/// ```
fn seen_paths(sid: i32, unless: &str) -> String {
    format!(
        "seen_paths AS (
    INSERT INTO eventview._observed AS t (source_id, event_type, event_version, path, json_type, first_seen, last_seen, seen, last_event)
    SELECT {sid}, o.event_type, o.event_version, o.path, o.json_type, now(), now(), o.n, pv.events + o.last
    FROM obs o JOIN prev_vers pv USING (event_type, event_version){}
    ON CONFLICT (source_id, event_type, event_version, path, json_type)
    DO UPDATE SET last_seen = EXCLUDED.last_seen, seen = t.seen + EXCLUDED.seen, last_event = EXCLUDED.last_event
    RETURNING 1
)",
        and_also(unless, "WHERE")
    )
}

/// `seen_versions`: the batch's events per type and version added into
/// `eventview._observed_versions`.
///
/// ```sql
/// seen_versions AS (INSERT INTO eventview._observed_versions AS t (...) SELECT ... FROM vers
///                   ON CONFLICT (...) DO UPDATE SET events = t.events + EXCLUDED.events
///                   RETURNING 1)
/// ```
fn seen_versions(sid: i32, unless: &str) -> String {
    format!(
        "seen_versions AS (
    INSERT INTO eventview._observed_versions AS t (source_id, event_type, event_version, events)
    SELECT {sid}, event_type, event_version, n FROM vers{}
    ON CONFLICT (source_id, event_type, event_version) DO UPDATE SET events = t.events + EXCLUDED.events
    RETURNING 1
)",
        and_also(unless, "WHERE")
    )
}

/// `st`: the observer's new position in the changelog (see `batch`), as
/// `batch::observed_position` reads it.
///
/// ```sql
/// st AS (UPDATE eventview._sources SET observed_snapshot = (SELECT s FROM snap), ...
///        WHERE source_id = <id> RETURNING 1)
/// ```
fn new_observed_position(sid: i32, unless: &str) -> String {
    format!(
        "st AS (
    UPDATE eventview._sources
    SET observed_snapshot = (SELECT s FROM snap),
        observed_own_xid = (SELECT own FROM snap),
        observed_own_seq = CASE WHEN (SELECT own FROM snap) IS NOT NULL THEN {own_seq} END
    WHERE source_id = {sid}{also}
    RETURNING 1
)",
        own_seq = batch::OWN_SEQ_AFTER_DELTA,
        also = and_also(unless, "AND"),
    )
}
