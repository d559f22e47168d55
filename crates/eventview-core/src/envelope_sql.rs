//! DDL of an event table (the envelope contract) and of its change capture.
//!
//! Algorithm (capture): one statement-level AFTER trigger per operation, using transition
//! tables, so a batch costs one extra INSERT, not one per row:
//! - INSERT/COPY: one changelog record holding the array of new `event_id`s (`op = 'I'`), written
//!   by a native trigger function (the producers' path). The rows themselves are read back from
//!   the event table at refresh time.
//! - UPDATE/DELETE: one record per old row (`op = 'U'`/`'D'`) with the old envelope and payload,
//!   because the refresh must retract exactly what the old row contributed.
//! - TRUNCATE: a BEFORE trigger logs every row as deleted, so views empty at their next refresh
//!   through the ordinary retraction path.
//!
//! Every record carries the writer's top-level `xid` (for snapshot batching at refresh) and a
//! per-table `seq` (ordering of the changes to one row within a batch).

use super::names;

/// The envelope's columns and rules (API.md section 1), apart from the keys.
const ENVELOPE_BODY: &str = "    event_type    text NOT NULL CHECK (event_type <> ''),
    event_version integer NOT NULL DEFAULT 1 CHECK (event_version >= 1),
    producer      text NOT NULL DEFAULT current_user,
    occurred_at   timestamptz NOT NULL DEFAULT now(),
    ingested_at   timestamptz NOT NULL DEFAULT now(),
    payload       jsonb NOT NULL CHECK (jsonb_typeof(payload) = 'object')";

/// `CREATE TABLE` for the envelope. `table` is an already quoted (qualified) name.
pub fn create_event_table(table: &str) -> String {
    format!(
        "CREATE TABLE {table} (
    event_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_key     text UNIQUE,
{ENVELOPE_BODY}
)"
    )
}

/// `CREATE TABLE` for an event table that Citus distributes by `column` (API.md section 10; a
/// column `distribution_column` accepts), with the keys Citus allows, each of which must hold the
/// distribution column: the primary key is `(event_id)` or `(event_id, column)`, and `event_key`
/// is unique in the table only when it is the distribution column (then NOT NULL, through the
/// primary key, as Citus refuses NULL there). Otherwise each shard keeps its keys unique with
/// an index of its own (`citus::attach_shard_capture`).
pub fn create_distributed_event_table(table: &str, column: &str) -> String {
    let (key, unique_key) = match column {
        "event_id" => ("event_id".to_string(), ""),
        "event_key" => ("event_id, event_key".to_string(), " UNIQUE"),
        other => (format!("event_id, {other}"), ""),
    };
    format!(
        "CREATE TABLE {table} (
    event_id      bigint GENERATED ALWAYS AS IDENTITY,
    event_key     text{unique_key},
{ENVELOPE_BODY},
    PRIMARY KEY ({key})
)"
    )
}

/// The type of distribution column `column`, and an expression turning the integer `i` into
/// a value of it: values to try until one falls in each shard's hash range.
pub fn distribution_value_of(column: &str) -> Option<(&'static str, &'static str)> {
    match distribution_column(column)? {
        "event_id" => Some(("bigint", "i::bigint")),
        "event_version" => Some(("integer", "i")),
        "occurred_at" | "ingested_at" => Some((
            "timestamptz",
            "pg_catalog.to_timestamp(i::double precision)",
        )),
        _ => Some(("text", "i::text")),
    }
}

/// A value `expr` of distribution column type `type_name` as text that is the same on every
/// node, whatever its session's TimeZone and DateStyle, and casts back to the type: a
/// timestamptz as ISO 8601 in UTC, anything else as its text.
pub fn canonical_text(expr: &str, type_name: &str) -> String {
    match type_name {
        "timestamptz" => format!(
            "pg_catalog.to_char(({expr}) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
        ),
        _ => format!("({expr})::text"),
    }
}

/// `CREATE TABLE` for a partitioned event table (API.md section 7): the envelope, partitioned by
/// range on `occurred_at`, with the primary key `(event_id, occurred_at)` (a unique index of a
/// partitioned table includes its partition key). `event_key` is unique across partitions by
/// the table's key table (`create_key_table`), which no index of the table itself could keep.
pub fn create_partitioned_event_table(table: &str) -> String {
    format!(
        "CREATE TABLE {table} (
    event_id      bigint GENERATED ALWAYS AS IDENTITY,
    event_key     text,
{ENVELOPE_BODY},
    PRIMARY KEY (event_id, occurred_at)
) PARTITION BY RANGE (occurred_at)"
    )
}

/// The event table `table` (quoted, qualified) as a FROM item of the statements that read its
/// rows: a plain table `ONLY`, never a table a user made inherit from it; a partitioned one
/// whole, its partitions' rows.
pub fn source_scan(table: &str, partitioned: bool) -> String {
    if partitioned {
        table.to_string()
    } else {
        format!("ONLY {table}")
    }
}

/// The envelope columns of API.md section 1 as `format_type` spells their types, and whether
/// each is NOT NULL: what a table must have to be registered as an event table.
pub const ENVELOPE_COLUMNS: [(&str, &str, bool); 8] = [
    ("event_id", "bigint", true),
    ("event_key", "text", false),
    ("event_type", "text", true),
    ("event_version", "integer", true),
    ("producer", "text", true),
    ("occurred_at", "timestamp with time zone", true),
    ("ingested_at", "timestamp with time zone", true),
    ("payload", "jsonb", true),
];

/// The envelope column an event table may be distributed by with Citus (API.md section 10),
/// named as `parse_ident` folds it: any column of section 1 but `payload`, whose documents are
/// no distribution key. None for anything else.
pub fn distribution_column(column: &str) -> Option<&'static str> {
    ENVELOPE_COLUMNS
        .iter()
        .map(|&(name, _, _)| name)
        .find(|&name| name == column && name != "payload")
}

/// A column of a table offered for registration: name, type (`format_type`), NOT NULL.
pub struct OfferedColumn {
    pub name: String,
    pub type_name: String,
    pub not_null: bool,
}

/// Why a table with `columns` cannot be registered as an event table, naming the first envelope
/// column (in section 1's order) that is missing, of another type, or nullable where the
/// envelope is NOT NULL; None when every envelope column is as section 1 has it (other columns
/// are allowed and ignored).
pub fn envelope_problem(columns: &[OfferedColumn]) -> Option<String> {
    ENVELOPE_COLUMNS
        .iter()
        .find_map(
            |&(name, type_name, not_null)| match columns.iter().find(|c| c.name == name) {
                None => Some(format!("it has no column {name} ({type_name})")),
                Some(c) if c.type_name != type_name => Some(format!(
                    "its column {name} is {}, not {type_name}",
                    c.type_name
                )),
                Some(c) if not_null && !c.not_null => {
                    Some(format!("its column {name} is not NOT NULL"))
                }
                Some(_) => None,
            },
        )
}

/// The changelog of one source: a table partitioned by range on `seq` with its index, its
/// default partition and its first segment, `first_width` records wide (see
/// `changelog_segments`).
pub fn create_changelog(source_id: i32, first_width: i64) -> Vec<String> {
    let log = names::changelog(source_id);
    let mut ddl = create_changelog_root(source_id);
    ddl.push(format!(
        "CREATE TABLE {}.{} PARTITION OF {log} DEFAULT",
        names::SCHEMA,
        names::changelog_default_table(source_id)
    ));
    let first = crate::changelog_segments::FIRST_SEQ;
    ddl.push(format!(
        "CREATE TABLE {}.{} PARTITION OF {log} FOR VALUES FROM ({first}) TO ({})",
        names::SCHEMA,
        names::changelog_segment_table(source_id, first),
        first.saturating_add(first_width)
    ));
    ddl
}

/// The partitioned changelog table of one source and its index, without partitions.
pub fn create_changelog_root(source_id: i32) -> Vec<String> {
    let log = names::changelog(source_id);
    vec![
        format!(
            "CREATE TABLE {log} (
    seq               bigint GENERATED ALWAYS AS IDENTITY,
    xid               xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    logged_at         timestamptz NOT NULL DEFAULT pg_catalog.now(),
    op                \"char\" NOT NULL,
    event_ids         bigint[],
    event_id          bigint,
    old_event_type    text,
    old_event_version integer,
    old_producer      text,
    old_occurred_at   timestamptz,
    old_payload       jsonb
) PARTITION BY RANGE (seq)"
        ),
        // The ids of a large INSERT or COPY are one array (80 kB per 10,000 rows), stored out
        // of line once past about 2 kB: stored uncompressed, because compressing it (pglz) takes
        // about four times as long as writing it, on the producer's path, for a record that
        // lives only until every consumer has applied it. (Partitions take the storage along.)
        format!("ALTER TABLE {log} ALTER COLUMN event_ids SET STORAGE EXTERNAL"),
        // (xid, seq): refreshes read a range of xids; prune walks it in (xid, seq) order, and
        // finds a segment's newest transaction by it.
        format!("CREATE INDEX ON {log} (xid, seq)"),
        format!("REVOKE ALL ON {log} FROM PUBLIC"),
    ]
}

/// DDL turning the plain changelog of one source (made by a version before segments) into the
/// default partition of a partitioned one, under the same name, its records numbered on from
/// `next_seq`. The plain table is renamed and loses its identity; the partitioned changelog is
/// made, numbered on, and takes it as its default partition (no row is moved or checked: there
/// is no other partition yet).
pub fn partition_changelog(source_id: i32, next_seq: i64) -> Vec<String> {
    let log = names::changelog(source_id);
    let default = names::changelog_default_table(source_id);
    let mut ddl = vec![
        format!("ALTER TABLE {log} RENAME TO {default}"),
        format!(
            "ALTER TABLE {}.{default} ALTER COLUMN seq DROP IDENTITY",
            names::SCHEMA
        ),
    ];
    ddl.extend(create_changelog_root(source_id));
    ddl.push(format!(
        "ALTER TABLE {log} ALTER COLUMN seq RESTART WITH {next_seq}"
    ));
    ddl.push(format!(
        "ALTER TABLE {log} ATTACH PARTITION {}.{default} DEFAULT",
        names::SCHEMA
    ));
    ddl
}

const OLD_COLUMNS: &str =
    "event_id, old_event_type, old_event_version, old_producer, old_occurred_at, old_payload";
const ROW_COLUMNS: &str = "event_id, event_type, event_version, producer, occurred_at, payload";

/// A capture function implemented by the extension's library: the insert capture, the one on
/// every producer's path (see `capture_trigger` in the extension). SECURITY DEFINER like the
/// others; it needs no pinned search_path, as its one statement names only schema-qualified
/// objects and no function or operator.
fn native_capture_function(source_id: i32, op: &str, symbol: &str) -> String {
    let func = names::capture_function(source_id, op);
    format!(
        "CREATE FUNCTION {func}() RETURNS trigger LANGUAGE c SECURITY DEFINER AS '$libdir/pg_eventview', '{symbol}'"
    )
}

fn capture_function(source_id: i32, op: &str, body: &str) -> String {
    let func = names::capture_function(source_id, op);
    // SECURITY DEFINER: producers need no privilege on the changelog. search_path is pinned
    // (one configuration save and restore per statement, not per row: the triggers are
    // statement-level), and every function and operator in the bodies is schema-qualified as
    // well, relations qualified or transition tables, so nothing resolves through a name the
    // caller controls.
    format!(
        "CREATE FUNCTION {func}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $capture$
BEGIN
{body}
    RETURN NULL;
END
$capture$"
    )
}

/// What the truncate capture runs: every row, logged as deleted. TG_RELID rather than the name
/// at creation time, so a renamed table keeps working. Only under READ COMMITTED: TRUNCATE
/// removes every row, also those committed after a REPEATABLE READ or SERIALIZABLE
/// transaction's snapshot, which this SELECT could not see and the views would keep.
pub fn truncate_body(source_id: i32) -> String {
    let log = names::changelog(source_id);
    format!(
        "    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        RAISE EXCEPTION USING ERRCODE = 'feature_not_supported',
            MESSAGE = pg_catalog.format('TRUNCATE of event table %s needs a READ COMMITTED transaction, not %s',
                                        TG_RELID::pg_catalog.regclass, pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Its views retract every row it removes; in this transaction it cannot see the rows committed after its snapshot. Run it in a READ COMMITTED transaction.';
    END IF;
    PERFORM {WAKE_CALL};
    EXECUTE pg_catalog.format('INSERT INTO {log} (op, {OLD_COLUMNS}) SELECT ''D'', {ROW_COLUMNS} FROM %s',
                   TG_RELID::pg_catalog.regclass);"
    )
}

/// The call that wakes the database's background worker when the transaction commits (see
/// `pg::wakeup` in the extension); it returns true. Every current capture function makes it.
pub const WAKE_CALL: &str = "eventview._wake_worker_on_commit()";

/// The C symbol of the native insert capture (see `native_capture_function`).
pub const INSERT_CAPTURE_SYMBOL: &str = "capture_inserted_rows";

/// Text that only the current capture function of `op` has in its source (`prosrc`): the
/// native symbol for the insert capture, the wake call for the others. A function without it
/// is older than this library's (a PL/pgSQL insert capture; a capture that does not wake the
/// worker, or lacks the delete capture's limit of the pruning exemption to rows past the
/// retention, or the truncate capture's isolation check); it is replaced (`replace_capture`).
pub fn current_capture_mark(op: &str) -> &'static str {
    match op {
        "insert" => INSERT_CAPTURE_SYMBOL,
        _ => WAKE_CALL,
    }
}

/// The capture function of `op` as this library creates it, replacing the installed one.
pub fn replace_capture(source_id: i32, op: &str) -> Option<String> {
    let body = match op {
        "insert" => {
            return Some(
                native_capture_function(source_id, op, INSERT_CAPTURE_SYMBOL).replacen(
                    "CREATE FUNCTION",
                    "CREATE OR REPLACE FUNCTION",
                    1,
                ),
            )
        }
        "update" => update_body(source_id),
        "delete" => delete_body(source_id),
        "truncate" => truncate_body(source_id),
        _ => return None,
    };
    Some(capture_function(source_id, op, &body).replacen(
        "CREATE FUNCTION",
        "CREATE OR REPLACE FUNCTION",
        1,
    ))
}

/// What the update capture runs. An UPDATE may set event_id to DEFAULT, which gives the row a
/// new identity: the old id is retracted (its 'U' record finds no row any more) and the new id
/// is logged as inserted.
pub fn update_body(source_id: i32) -> String {
    let log = names::changelog(source_id);
    format!(
        "    PERFORM {WAKE_CALL};
    INSERT INTO {log} (op, {OLD_COLUMNS})
    SELECT 'U', {ROW_COLUMNS} FROM old_rows;
    INSERT INTO {log} (op, event_ids)
    SELECT 'I', pg_catalog.array_agg(event_id)
      FROM (SELECT event_id FROM new_rows EXCEPT SELECT event_id FROM old_rows) moved
    HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 0;"
    )
}

/// What the delete capture runs. eventview.prune() deletes raw events past the table's
/// retention with `eventview.pruning` on: not a retraction, those rows are not logged. The
/// setting is an ordinary one, so the exemption is limited to rows past the retention (which
/// prune may drop from history anyway): a producer who sets it still has every other delete
/// logged.
pub fn delete_body(source_id: i32) -> String {
    let log = names::changelog(source_id);
    format!(
        "    PERFORM {WAKE_CALL};
    INSERT INTO {log} (op, {OLD_COLUMNS})
    SELECT 'D', {ROW_COLUMNS} FROM old_rows
    WHERE NOT coalesce(pg_catalog.current_setting('eventview.pruning', true) OPERATOR(pg_catalog.=) 'on'
                       AND old_rows.occurred_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-)
                           (SELECT s.retention FROM eventview._sources s WHERE s.source_id OPERATOR(pg_catalog.=) {source_id})),
                       false);"
    )
}

/// Trigger functions and triggers that capture every change of `table` into its changelog.
pub fn create_capture(source_id: i32, table: &str) -> Vec<String> {
    let mut out = capture_functions(source_id);
    out.extend(capture_triggers(source_id, table, &CAPTURE_OPS));
    out
}

/// The four capture functions of a source, one per op of `CAPTURE_OPS`.
fn capture_functions(source_id: i32) -> Vec<String> {
    vec![
        native_capture_function(source_id, "insert", INSERT_CAPTURE_SYMBOL),
        capture_function(source_id, "update", &update_body(source_id)),
        capture_function(source_id, "delete", &delete_body(source_id)),
        capture_function(source_id, "truncate", &truncate_body(source_id)),
    ]
}

/// A statement-level trigger `eventview_<kind>_<op>` on `table` calling `function`, with the
/// transition tables its op has (TRUNCATE fires BEFORE, to read the rows it removes).
fn statement_trigger(kind: &str, table: &str, op: &str, function: &str) -> String {
    let (when, referencing) = match op {
        "insert" => ("AFTER INSERT", "REFERENCING NEW TABLE AS new_rows"),
        "update" => (
            "AFTER UPDATE",
            "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows",
        ),
        "delete" => ("AFTER DELETE", "REFERENCING OLD TABLE AS old_rows"),
        _ => ("BEFORE TRUNCATE", ""),
    };
    format!(
        "CREATE TRIGGER eventview_{kind}_{op} {when} ON {table} {referencing} FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
    )
}

/// The capture triggers of `ops` on `table` (the event table, or a partition of one).
pub fn capture_triggers(source_id: i32, table: &str, ops: &[&str]) -> Vec<String> {
    ops.iter()
        .map(|op| {
            statement_trigger(
                "capture",
                table,
                op,
                &names::capture_function(source_id, op),
            )
        })
        .collect()
}

/// The key triggers of `ops` on `table` (a partitioned event table, or a partition of one), but
/// for INSERT, whose keys the insert capture takes (`key_insert`).
pub fn key_triggers(source_id: i32, table: &str, ops: &[&str]) -> Vec<String> {
    let function = names::capture_function(source_id, KEYS_OP);
    ops.iter()
        .filter(|op| **op != "insert")
        .map(|op| statement_trigger("keys", table, op, &function))
        .collect()
}

/// The ops captured on the root of a partitioned event table. TRUNCATE of the root fires the
/// truncate triggers of every partition too, so only partitions capture it (each its own rows).
pub const ROOT_OPS: [&str; 3] = ["insert", "update", "delete"];

/// Capture of a partitioned event table (`table`, its root): the capture functions, the key
/// table and its function, and the triggers of the root. Each partition gets its own triggers
/// (`partition_capture`): a statement writing a partition directly fires that partition's
/// statement triggers, not the root's.
pub fn create_partitioned_capture(source_id: i32, table: &str) -> Vec<String> {
    let mut out = capture_functions(source_id);
    out.extend(create_key_table(source_id));
    out.push(key_function(source_id));
    out.extend(capture_triggers(source_id, table, &ROOT_OPS));
    out.extend(key_triggers(source_id, table, &ROOT_OPS));
    out
}

/// The triggers of one partition of a partitioned event table (any member of its tree but the
/// root). A leaf (a partition with rows of its own) also captures TRUNCATE; a partitioned
/// partition does not, as its leaves do.
pub fn partition_capture(source_id: i32, partition: &str, leaf: bool) -> Vec<String> {
    let ops: &[&str] = if leaf { &CAPTURE_OPS } else { &ROOT_OPS };
    let mut out = capture_triggers(source_id, partition, ops);
    out.extend(key_triggers(source_id, partition, ops));
    out
}

/// The op name of the key function of a partitioned event table
/// (`eventview._capture_<source>_keys`).
pub const KEYS_OP: &str = "keys";

/// The key table of a partitioned event table: each `event_key` present in the table, once, with
/// its event's `occurred_at`. `claimed_by` marks a key `eventview.ingest` has taken for an event
/// it is inserting in that transaction (see `key_insert`). Keys arrive in about the order of
/// their events' times, so a BRIN index on `occurred_at` finds the keys of a partition's time
/// range as a few runs of pages: a partition dropped takes its keys along by that range.
pub fn create_key_table(source_id: i32) -> Vec<String> {
    let keys = names::key_table(source_id);
    vec![
        format!(
            "CREATE TABLE {keys} (event_key text PRIMARY KEY, claimed_by xid8, occurred_at timestamptz)"
        ),
        format!("CREATE INDEX ON {keys} USING brin (occurred_at)"),
        format!("REVOKE ALL ON {keys} FROM PUBLIC"),
    ]
}

/// What the insert capture runs, for a partitioned event table, with the new rows' keys (`$1`, a
/// `text[]` without NULLs) and their events' times (`$2`, a `timestamptz[]` in the same order):
/// adds them to the key table, so that a key present twice fails with 23505 (unique_violation)
/// on its primary key, as on a plain event table. Keys `eventview.ingest`
/// claimed in this transaction (`claimed`: `eventview.keys_claimed` is on) are taken over: the
/// first row of each is its event, a second one a duplicate. The insert capture has no pinned
/// search_path, so every operator and function here is schema-qualified (a row_number window
/// and EXISTS compare with the type's default operator class, found without it).
pub fn key_insert(source_id: i32, claimed: bool) -> String {
    let keys = names::key_table(source_id);
    let new_keys = "ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.timestamptz[])) AS u(k, at)";
    if !claimed {
        return format!(
            "INSERT INTO {keys} (event_key, occurred_at) SELECT u.k, u.at FROM {new_keys}"
        );
    }
    format!(
        "WITH taken AS (
    UPDATE {keys} t SET claimed_by = NULL, occurred_at = f.at
    FROM (SELECT DISTINCT ON (u.k) u.k, u.at FROM {new_keys}) f
    WHERE t.event_key OPERATOR(pg_catalog.=) f.k
      AND t.claimed_by OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id()
    RETURNING t.event_key
)
INSERT INTO {keys} (event_key, occurred_at)
SELECT n.k, n.at
FROM (SELECT u.k, u.at, pg_catalog.row_number() OVER (PARTITION BY u.k) AS nth FROM {new_keys}) n
WHERE NOT (n.nth OPERATOR(pg_catalog.=) 1
           AND EXISTS (SELECT 1 FROM taken WHERE taken.event_key OPERATOR(pg_catalog.=) n.k))"
    )
}

/// Keeps the key table of a partitioned event table equal to the keys of its rows as they
/// change (the insert capture adds new rows' keys: `key_insert`). Runs as the table's owner
/// (SECURITY DEFINER, like the capture functions):
/// - UPDATE that changes a key or an event's time replaces the statement's old keys with its new
///   ones (a key present twice fails with 23505);
/// - DELETE and TRUNCATE remove the keys of the rows they remove.
pub fn key_function(source_id: i32) -> String {
    let keys = names::key_table(source_id);
    let body = format!(
        "    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
        IF EXISTS (SELECT FROM old_rows o FULL JOIN new_rows n ON n.event_id OPERATOR(pg_catalog.=) o.event_id
                   WHERE o.event_key IS DISTINCT FROM n.event_key
                      OR (n.event_key IS NOT NULL AND o.occurred_at IS DISTINCT FROM n.occurred_at)) THEN
            DELETE FROM {keys} WHERE event_key IN (SELECT event_key FROM old_rows);
            INSERT INTO {keys} (event_key, occurred_at)
            SELECT event_key, occurred_at FROM new_rows WHERE event_key IS NOT NULL;
        END IF;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        DELETE FROM {keys} WHERE event_key IN (SELECT event_key FROM old_rows);
    ELSE
        EXECUTE pg_catalog.format('DELETE FROM {keys} WHERE event_key IN (SELECT event_key FROM %s)',
                                  TG_RELID::pg_catalog.regclass);
    END IF;"
    );
    capture_function(source_id, KEYS_OP, &body)
}

pub const CAPTURE_OPS: [&str; 4] = ["insert", "update", "delete", "truncate"];

/// Gives the capture functions (with the key function of a `partitioned` event table) to the
/// table's owner (`owner` quoted), and takes EXECUTE on them from PUBLIC.
pub fn capture_owner(source_id: i32, owner: &str, partitioned: bool) -> Vec<String> {
    let keys = partitioned.then_some(KEYS_OP);
    CAPTURE_OPS
        .iter()
        .copied()
        .chain(keys)
        .flat_map(|op| {
            [
                format!(
                    "ALTER FUNCTION {}() OWNER TO {owner}",
                    names::capture_function(source_id, op)
                ),
                revoke_capture(source_id, op),
            ]
        })
        .collect()
}

/// Takes EXECUTE on a capture function from PUBLIC. A capture function writes the changelog of
/// its source with its owner's rights, from whatever transition table the firing trigger
/// hands it: attached by a trigger on another table, it would log that table's rows as changes
/// of the event table (views counting or retracting events that never were). PostgreSQL checks
/// EXECUTE on a trigger function when a trigger is created, not when it fires, so producers
/// need none.
pub fn revoke_capture(source_id: i32, op: &str) -> String {
    format!(
        "REVOKE EXECUTE ON FUNCTION {}() FROM PUBLIC",
        names::capture_function(source_id, op)
    )
}

/// Drops the capture functions (with their triggers) and the changelog, and the key function and
/// key table of a `partitioned` event table.
pub fn drop_capture(source_id: i32, partitioned: bool) -> Vec<String> {
    let keys = partitioned.then_some(&KEYS_OP);
    let mut out: Vec<String> = CAPTURE_OPS
        .iter()
        .chain(keys)
        .map(|op| {
            format!(
                "DROP FUNCTION IF EXISTS {}() CASCADE",
                names::capture_function(source_id, op)
            )
        })
        .collect();
    // CASCADE: what a view's owner built on the changelog (a view of their own, while they could
    // read it) must not keep the event table's owner from dropping the table.
    out.push(format!(
        "DROP TABLE IF EXISTS {} CASCADE",
        names::changelog(source_id)
    ));
    if partitioned {
        out.push(format!(
            "DROP TABLE IF EXISTS {} CASCADE",
            names::key_table(source_id)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_value_reads_the_same_on_every_node() {
        assert_eq!(
            canonical_text("k", "timestamptz"),
            "pg_catalog.to_char((k) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
        );
        assert_eq!(canonical_text("k", "bigint"), "(k)::text");
    }

    #[test]
    fn a_distributed_table_keys_hold_the_distribution_column() {
        let by_id = create_distributed_event_table("\"ev\"", "event_id");
        assert!(by_id.contains("PRIMARY KEY (event_id)\n)"));
        assert!(by_id.contains("event_key     text,"));
        let by_key = create_distributed_event_table("\"ev\"", "event_key");
        assert!(by_key.contains("PRIMARY KEY (event_id, event_key)"));
        assert!(by_key.contains("event_key     text UNIQUE,"));
        let by_type = create_distributed_event_table("\"ev\"", "event_type");
        assert!(by_type.contains("PRIMARY KEY (event_id, event_type)"));
        assert_eq!(
            distribution_value_of("event_id"),
            Some(("bigint", "i::bigint"))
        );
        assert_eq!(distribution_value_of("producer"), Some(("text", "i::text")));
        assert_eq!(distribution_value_of("payload"), None);
    }

    #[test]
    fn distribution_columns_are_the_envelope_but_payload() {
        assert_eq!(distribution_column("event_id"), Some("event_id"));
        assert_eq!(distribution_column("event_key"), Some("event_key"));
        assert_eq!(distribution_column("occurred_at"), Some("occurred_at"));
        assert_eq!(distribution_column("payload"), None);
        assert_eq!(distribution_column("Event_Id"), None);
        assert_eq!(distribution_column("sku"), None);
    }

    fn offered(columns: &[(&str, &str, bool)]) -> Vec<OfferedColumn> {
        columns
            .iter()
            .map(|&(name, type_name, not_null)| OfferedColumn {
                name: name.into(),
                type_name: type_name.into(),
                not_null,
            })
            .collect()
    }

    #[test]
    fn envelope_problem_names_the_first_column_out_of_the_envelope() {
        let mut envelope: Vec<(&str, &str, bool)> = ENVELOPE_COLUMNS.to_vec();
        assert_eq!(envelope_problem(&offered(&envelope)), None);
        // Other columns, another order, a NOT NULL event_key: still the envelope.
        envelope.reverse();
        envelope.push(("tenant", "uuid", true));
        envelope.iter_mut().find(|c| c.0 == "event_key").unwrap().2 = true;
        assert_eq!(envelope_problem(&offered(&envelope)), None);

        let without = |name: &str| -> Vec<(&str, &str, bool)> {
            ENVELOPE_COLUMNS
                .iter()
                .copied()
                .filter(|c| c.0 != name)
                .collect()
        };
        assert_eq!(
            envelope_problem(&offered(&without("occurred_at"))).as_deref(),
            Some("it has no column occurred_at (timestamp with time zone)")
        );
        let mut retyped = ENVELOPE_COLUMNS.to_vec();
        retyped[3] = ("event_version", "bigint", true);
        retyped[7] = ("payload", "json", true);
        assert_eq!(
            envelope_problem(&offered(&retyped)).as_deref(),
            Some("its column event_version is bigint, not integer")
        );
        let mut nullable = ENVELOPE_COLUMNS.to_vec();
        nullable[2] = ("event_type", "text", false);
        assert_eq!(
            envelope_problem(&offered(&nullable)).as_deref(),
            Some("its column event_type is not NOT NULL")
        );
        assert_eq!(
            envelope_problem(&[]).as_deref(),
            Some("it has no column event_id (bigint)")
        );
    }

    #[test]
    fn capture_uses_transition_tables_and_the_source_changelog() {
        let ddl = create_capture(7, "\"shop\".\"events\"").join("\n");
        assert!(ddl.contains("INSERT INTO eventview._changes_7 (op, event_ids)"));
        assert!(ddl.contains(
            "CREATE FUNCTION eventview._capture_7_insert() RETURNS trigger LANGUAGE c SECURITY DEFINER AS '$libdir/pg_eventview', 'capture_inserted_rows'"
        ));
        assert!(ddl.contains("AFTER INSERT ON \"shop\".\"events\" REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT"));
        assert!(ddl.contains("BEFORE TRUNCATE ON \"shop\".\"events\"  FOR EACH STATEMENT"));
        assert!(ddl.contains("SECURITY DEFINER\nSET search_path = pg_catalog, pg_temp"));
        let rights = capture_owner(7, "\"o\"", false).join("\n");
        for op in CAPTURE_OPS {
            assert!(rights.contains(&format!(
                "REVOKE EXECUTE ON FUNCTION eventview._capture_7_{op}() FROM PUBLIC"
            )));
        }
        let log = create_changelog(7, 10_000).join("\n");
        assert!(log.contains(
            "ALTER TABLE eventview._changes_7 ALTER COLUMN event_ids SET STORAGE EXTERNAL"
        ));
        // Each function an older library made differently is replaced by the current one, which
        // carries its mark.
        for op in CAPTURE_OPS {
            let mark = current_capture_mark(op);
            let f = replace_capture(7, op).expect("every op has a current function");
            assert!(f.starts_with("CREATE OR REPLACE FUNCTION") && f.contains(mark));
            assert_eq!(
                f.replacen("CREATE OR REPLACE FUNCTION", "CREATE FUNCTION", 1),
                create_capture(7, "t")[CAPTURE_OPS.iter().position(|o| *o == op).unwrap()]
            );
        }
        // Every capture function wakes the worker (the insert capture natively); the delete capture keeps its exemption for
        // pruning past the retention, the truncate capture its isolation check.
        assert_eq!(ddl.matches(WAKE_CALL).count(), 3);
        assert!(ddl.contains("old_rows.occurred_at") && ddl.contains("transaction_isolation"));
        // Nothing in a SECURITY DEFINER body may be resolved through search_path.
        assert!(!ddl.contains(" array_agg(") && !ddl.contains("HAVING count("));
    }
}
