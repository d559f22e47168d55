//! Event tables distributed by Citus, and their views (API.md section 10).
//!
//! Each shard of a distributed event table is an event table of its own node: registered there
//! (`register_event_table` of the shard), with that node's capture triggers, changelog and
//! snapshot batching under that node's transaction ids. A view over the distributed table is,
//! on every shard, a view over that shard whose storage is the co-located shard of
//! `eventview._v<id>_groups`, a distributed table of partial groups (its column `__shard` holds
//! one value of the shard's hash range, so the shard's rows stay on the shard). The coordinator
//! keeps the groups merged from every shard's in a storage table of its own, which the user
//! relation reads as a stored view of one node reads its own (`sqlgen::distributed`), or, for a
//! realtime view, with the groups the shards' pending changes touch merged anew
//! (`citus::realtime`).
//!
//! The coordinator runs the work of each shard on the shard's node, inside its own distributed
//! transaction, through the table's shard registry `eventview._shards_<oid>`: a distributed
//! table co-located with the event table holding one row per shard, its `k` a value of that
//! shard. `SELECT eventview._<work>(tableoid::regclass::text, <shards>, ...) FROM <registry>`
//! is a query Citus runs on every shard's node, so the work sees the shards made earlier in
//! the same transaction and commits or aborts with it (Citus's own `run_command_on_*` open
//! connections of their own, outside the transaction). `<shards>` maps each registry shard's
//! id to the names of its co-located shards, from the coordinator's metadata: a node may not
//! see the metadata of a table distributed in the same transaction.
//!
//! Refresh applies each shard's changes exactly once: it is that node's refresh of that
//! shard's view, under its row lock and with its snapshots; a distributed transaction's
//! parts on other nodes are applied by their own nodes' refreshes, as they become visible there.
//!
//! Citus moves and splits shards (a rebalance, a drained node): the shard's rows and its
//! co-located shards go to a node where pg_eventview has nothing of it. Every per-shard call
//! first registers an event table shard its node does not know (`capture_shard`), and a
//! view's refresh makes the shard's view there from the shard's events, after which the
//! coordinator merges every group anew (`refresh_shard_view`). The registry gets a row for
//! each shard a split made (`shard_args`).

use crate::catalog;
use crate::catalog::distributed::{self, SourceLock};
use crate::errors::{EvError, EvResult};
use crate::pg::guc;
use crate::pg::roles;
use crate::pg::spi;
use crate::privileges;
use crate::relation;
use crate::views::{self, CreateViewArgs};
use eventview_core::definition::{parse_definition, DefinitionInput, ViewDefinition};
use eventview_core::sqlgen::{self, ViewSql};
use eventview_core::{array_text, envelope_sql, json_text, names, quote};
use pgrx::datum::Interval;
use pgrx::prelude::*;

mod quarantine;
mod realtime;
pub use quarantine::shard_entries;
pub use realtime::{alter_view, realtime_groups, shard_pending_groups};

/// Whether the Citus extension is installed in this database.
fn installed() -> EvResult<bool> {
    crate::pg::node_local::citus_installed()
}

/// Whether Citus manages `relid`: a distributed, reference or Citus local table, whose rows
/// live in shards that capture on the table itself never sees.
fn manages(relid: pg_sys::Oid) -> EvResult<bool> {
    if !installed()? {
        return Ok(false);
    }
    Ok(spi::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1)",
        &[relid.into()],
    )?
    .unwrap_or(false))
}

pub fn not_supported(message: impl Into<String>, hint: &str) -> EvError {
    EvError::new(PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED, message).with_hint(hint)
}

/// `register_event_table` of a table Citus manages, if `relid` is one: the table, distributed
/// by hash on an envelope column with one placement per shard, becomes a distributed event
/// table as `create_event_table(..., distribute_by)` makes one (a shard registry, capture on
/// every shard). 0A000 for a table not distributed by hash, for more than one placement per
/// shard and with `retention`; 22023 for a table distributed by another column, without the
/// envelope, or without a unique index on `event_id` (with the distribution column).
pub fn register_managed(
    relid: pg_sys::Oid,
    retention: &Option<Interval>,
    delta_retention: Option<Interval>,
) -> EvResult<Option<pg_sys::Oid>> {
    if !manages(relid)? {
        return Ok(None);
    }
    let name = relation::regclass_text(relid)?;
    if distributed_source(relid)?.is_some() {
        return Err(EvError::new(
            PgSqlErrorCode::ERRCODE_DUPLICATE_OBJECT,
            format!("{name} is an event table already"),
        )
        .with_hint("Its capture runs; create views over it with eventview.create_view."));
    }
    let (method, column) = Spi::connect(|client| {
        let t = client
            .select(
                "SELECT partmethod::text, pg_catalog.column_to_column_name(logicalrelid, partkey)
                 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1",
                Some(1),
                &[relid.into()],
            )?
            .first();
        Ok::<_, pgrx::spi::SpiError>((t.get::<String>(1)?, t.get::<String>(2)?))
    })?;
    if method.as_deref() != Some("h") {
        let kind = match method.as_deref() {
            Some("n") => "a Citus reference or local table",
            Some("a") => "distributed by append",
            Some("r") => "distributed by range",
            _ => "not distributed by hash",
        };
        return Err(not_supported(
            format!("cannot register {name}: it is {kind}, which pg_eventview does not capture"),
            "Distribute it by an envelope column (create_distributed_table(..., 'event_id')), or create the event table with eventview.create_event_table(..., distribute_by => ...).",
        ));
    }
    let column = column.unwrap_or_default();
    let Some(column) = envelope_sql::distribution_column(&column) else {
        return Err(EvError::invalid(format!(
            "cannot register {name} as an event table: it is distributed by column \"{column}\", which is not an envelope column an event table can be distributed by"
        ))
        .with_hint("Distribute it by one of event_id, event_key, event_type, event_version, producer, occurred_at or ingested_at (alter_distributed_table(..., distribution_column => ...))."));
    };
    if retention.is_some() {
        return Err(not_supported(
            "retention of an event table distributed by Citus is not supported by this version of pg_eventview",
            "Leave retention out: the distributed table keeps its events.",
        ));
    }
    if spi::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_shard s
                        JOIN pg_catalog.pg_dist_placement p USING (shardid)
                        WHERE s.logicalrelid = $1 GROUP BY s.shardid HAVING count(*) > 1)",
        &[relid.into()],
    )? == Some(true)
    {
        return Err(not_supported(
            format!("cannot register {name}: its shards have more than one placement, which pg_eventview does not capture"),
            "Keep one placement per shard (citus.shard_replication_factor = 1).",
        ));
    }
    let table = relation::qualified(relid)?;
    if spi::one::<String>(
        "SELECT relkind::text FROM pg_catalog.pg_class WHERE oid = $1",
        &[relid.into()],
    )?
    .as_deref()
        != Some("r")
    {
        return Err(not_supported(
            format!("cannot register {name}: a partitioned table distributed by Citus is not supported by this version of pg_eventview"),
            "Register a distributed table that is not partitioned.",
        ));
    }
    let columns = catalog::table_columns(relid)?;
    if let Some(problem) = envelope_sql::envelope_problem(&columns) {
        return Err(EvError::invalid(format!("cannot register {name} as an event table: {problem}"))
            .with_hint("An event table has the envelope columns of create_event_table, with those names, types and NOT NULL constraints; other columns are allowed."));
    }
    if !catalog::has_unique_index_leading(relid, "event_id", &["event_id", column])? {
        return Err(EvError::invalid(format!(
            "cannot register {name} as an event table: no unique index on event_id (with its distribution column {column})"
        ))
        .with_hint(format!(
            "Refreshes read events by event_id: ALTER TABLE {table} ADD PRIMARY KEY (event_id{}).",
            if column == "event_id" { String::new() } else { format!(", {column}") }
        )));
    }
    let shards = make_shard_registry(relid, &table, column)?;
    distributed::insert_source(relid, column, &shards, delta_retention)?;
    let source = distributed_source(relid)?
        .ok_or_else(|| EvError::invalid("the distributed event table is not catalogued"))?;
    on_every_shard(&source, &[&table], Registry::Filled, |a| {
        format!(
            "eventview._attach_shard_capture({}, {}, {})",
            a.shard, a.shards, a.delta_retention
        )
    })?;
    Ok(Some(relid))
}

/// The distribution column `distribute_by` names (folded as PostgreSQL folds a column name), or
/// 22023.
fn distribution_column(distribute_by: &str) -> EvResult<&'static str> {
    let column = match quote::split_name(distribute_by).as_deref() {
        Some([column]) => column.clone(),
        _ => {
            return Err(EvError::invalid(format!(
                "invalid distribute_by \"{distribute_by}\": it is not one column name"
            ))
            .with_hint("Name one envelope column, such as event_id."))
        }
    };
    envelope_sql::distribution_column(&column).ok_or_else(|| {
        EvError::invalid(format!(
            "invalid distribute_by: column \"{column}\" is not an envelope column an event table can be distributed by"
        ))
        .with_hint("Name one of event_id, event_key, event_type, event_version, producer, occurred_at or ingested_at.")
    })
}

/// An event table distributed by Citus, as the coordinator catalogues it.
pub struct DistributedSource {
    pub relid: pg_sys::Oid,
    /// The shard registry, quoted and qualified.
    pub shards: String,
    /// The distribution column.
    pub distribute_by: String,
    /// The delta retention of every shard's changelog, as interval text (a literal in the
    /// per-shard calls, which register a shard that Citus moved or split onto a node).
    pub delta_retention: String,
}

impl DistributedSource {
    /// The table's name, quoted and qualified (an error once a DROP took it).
    fn table_sql(&self) -> EvResult<String> {
        relation::qualified(self.relid)
    }
}

/// The distributed event table `relid`, if it is one.
pub fn distributed_source(relid: pg_sys::Oid) -> EvResult<Option<DistributedSource>> {
    Ok(
        distributed::source_row(relid)?.map(|(shards, distribute_by, delta_retention)| {
            DistributedSource {
                relid,
                shards,
                distribute_by,
                delta_retention,
            }
        }),
    )
}

/// The distributed event table named `name`, if the name resolves to one.
pub fn distributed_source_named(name: &str) -> EvResult<Option<DistributedSource>> {
    match relation::resolve(name) {
        Ok(relid) => distributed_source(relid),
        Err(_) => Ok(None),
    }
}

/// A view over a distributed event table, as the coordinator catalogues it.
pub struct DistributedView {
    pub view_id: i32,
    pub relid: pg_sys::Oid,
    pub source: DistributedSource,
    /// The distributed table of partial groups, quoted and qualified.
    pub groups: String,
    pub owner: pg_sys::Oid,
}

/// The view over a distributed event table whose user relation is `relid`, if it is one.
pub fn distributed_view(relid: pg_sys::Oid) -> EvResult<Option<DistributedView>> {
    let Some((view_id, source_relid, groups, owner)) = distributed::view_row(relid)? else {
        return Ok(None);
    };
    let source = distributed_source(source_relid)?
        .ok_or_else(|| EvError::invalid("a distributed view's event table is not catalogued"))?;
    Ok(Some(DistributedView {
        view_id,
        relid,
        source,
        groups,
        owner,
    }))
}

/// The view over a distributed event table named `name`, if the name resolves to one (without
/// USAGE on its schema, as a view of this node: the owner of its event table may drop it).
pub fn distributed_view_named(name: &str) -> EvResult<Option<DistributedView>> {
    match relation::resolve_without_usage(name) {
        Ok(relid) => distributed_view(relid),
        Err(_) => Ok(None),
    }
}

/// The SQL expressions a per-shard call takes its shard from, in the query over the registry.
struct ShardArgs {
    /// The registry shard (`tableoid` as text).
    shard: &'static str,
    /// Its value (`k` as text the same on every node: `envelope_sql::canonical_text`).
    value: String,
    /// The JSON object mapping each registry shard's id to the names of the co-located shards
    /// of the tables named (`shard_map`), as a literal.
    shards: String,
    /// The delta retention of the table's changelogs, as an interval literal.
    delta_retention: String,
}

/// Whether a per-shard call first gives every shard of the registry its row (after a split).
#[derive(PartialEq, Clone, Copy)]
enum Registry {
    /// One row per shard, refilled when a split left a shard without one: the calls that make
    /// or refresh what lives on every shard.
    Filled,
    /// As it is: the drops, which reach every shard that has something of theirs (a shard
    /// without a row has had no call since it was made, hence nothing) and must go on where
    /// no row fits a shard's range.
    AsItIs,
    /// As it is, and not written: the monitoring and realtime reads, which take no catalog row lock and leave the
    /// transaction without a write on the workers.
    Read,
}

/// The result of `local`, a call on a view or event table of this node, unless it refused its
/// name as a view over a distributed event table or such a table (0A000, from
/// `catalog::view_by_name` and `catalog::source_by_name`): then that of `distributed` on what
/// `lookup` finds by that name. The common call pays nothing for the lookup.
pub fn or_distributed<T, D>(
    local: EvResult<T>,
    lookup: impl FnOnce() -> EvResult<Option<D>>,
    distributed: impl FnOnce(&D) -> EvResult<T>,
) -> EvResult<T> {
    match local {
        Err(e) if e.code == PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED => match lookup()? {
            Some(found) => distributed(&found),
            None => Err(e),
        },
        done => done,
    }
}

/// Runs the call `call` makes of `ShardArgs` once on the node of every shard of `source`, in
/// this transaction; returns the sum of its results. Everything in the call is a literal:
/// Citus plans no query over a distributed table with parameters.
fn on_every_shard(
    source: &DistributedSource,
    tables: &[&str],
    registry: Registry,
    call: impl FnOnce(&ShardArgs) -> String,
) -> EvResult<i64> {
    let args = shard_args(source, tables, registry)?;
    Ok(spi::one::<i64>(
        &format!(
            "SELECT coalesce(sum({}), 0)::bigint FROM {}",
            call(&args),
            source.shards
        ),
        &[],
    )?
    .unwrap_or(0))
}

/// Runs the call `call` makes of `ShardArgs` once on the node of every shard of `source`, in
/// this transaction; returns its results, one per shard (a call's NULL left out).
fn each_shard(
    source: &DistributedSource,
    tables: &[&str],
    registry: Registry,
    call: impl FnOnce(&ShardArgs) -> String,
) -> EvResult<Vec<String>> {
    each_shard_where(source, tables, registry, None, call)
}

/// `each_shard`, on the shards whose tags (`ShardArgs::value`) `shards` lists, or on every
/// shard.
fn each_shard_where(
    source: &DistributedSource,
    tables: &[&str],
    registry: Registry,
    shards: Option<&[String]>,
    call: impl FnOnce(&ShardArgs) -> String,
) -> EvResult<Vec<String>> {
    let args = shard_args(source, tables, registry)?;
    let filter = match shards {
        Some(tags) => format!(
            " WHERE {} = ANY(ARRAY[{}]::text[])",
            args.value,
            tags.iter()
                .map(|t| quote::literal(t))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => String::new(),
    };
    let query = format!(
        "SELECT ({})::text FROM {}{filter}",
        call(&args),
        source.shards
    );
    Ok(Spi::connect(|client| {
        client
            .select(&query, None, &[])?
            .map(|row| row.get::<String>(1))
            .collect::<Result<Vec<_>, _>>()
    })?
    .into_iter()
    .flatten()
    .collect())
}

/// The arguments of a per-shard call over the registry of `source`, after every registry shard
/// is written in this transaction: Citus commits the nodes a transaction wrote with two-phase
/// commit, and the per-shard work (which it sees as a read of the registry) then commits or
/// aborts with the coordinator's transaction on every node.
fn shard_args(
    source: &DistributedSource,
    tables: &[&str],
    registry: Registry,
) -> EvResult<ShardArgs> {
    if registry == Registry::Read {
        return shard_call_args(source, tables);
    }
    // One per-shard call on a table at a time: two would write the registry's shards in
    // orders of their own, and wait for each other across nodes.
    distributed::lock_source(source.relid, SourceLock::RunsOnShards)?;
    let written = Spi::connect_mut(|client| {
        Ok::<_, pgrx::spi::SpiError>(
            client
                .update(
                    &format!("UPDATE {} SET k = k RETURNING 1", source.shards),
                    None,
                    &[],
                )?
                .len(),
        )
    })?;
    if written as i64 != shard_count(&source.shards)? && registry == Registry::Filled {
        // Split since: a new shard has no row yet. One row per shard again (which writes
        // every registry shard too).
        spi::run_all(&[format!("DELETE FROM {}", source.shards)])?;
        fill_shard_registry(source.relid, &source.shards, &source.distribute_by)?;
    }
    shard_call_args(source, tables)
}

/// How many shards the registry `registry` (and so its event table) has, as the coordinator's
/// metadata lists them: a shard a split made has no registry row until a call fills it.
fn shard_count(registry: &str) -> EvResult<i64> {
    Ok(spi::one::<i64>(
        "SELECT count(*) FROM pg_catalog.pg_dist_shard WHERE logicalrelid = $1::regclass",
        &[registry.into()],
    )?
    .unwrap_or(0))
}

/// The arguments of a per-shard call over the registry of `source`, as they are.
fn shard_call_args(source: &DistributedSource, tables: &[&str]) -> EvResult<ShardArgs> {
    let (type_name, _) = envelope_sql::distribution_value_of(&source.distribute_by)
        .ok_or_else(|| EvError::invalid("no distribution column"))?;
    Ok(ShardArgs {
        shard: "tableoid::regclass::text",
        value: envelope_sql::canonical_text("k", type_name),
        shards: format!("{}::json", quote::literal(&shard_map(source, tables)?)),
        delta_retention: format!("{}::interval", quote::literal(&source.delta_retention)),
    })
}

/// `{"<registry shard id>": ["<shard of tables[0]>", ...], ...}`: for every shard of the
/// registry of `source`, the names of the co-located shards of `tables`, quoted and qualified
/// (`shard_name` leaves out `public`, which the nodes' connections do not search).
fn shard_map(source: &DistributedSource, tables: &[&str]) -> EvResult<String> {
    let tables: Vec<String> = tables.iter().map(|t| t.to_string()).collect();
    Ok(spi::one::<String>(
        "SELECT coalesce(json_object_agg(r.shardid,
                   ARRAY(SELECT CASE WHEN c.relnamespace = 'public'::regnamespace THEN 'public.' ELSE '' END
                                || pg_catalog.shard_name(t.relid, s.shardid)
                         FROM unnest($2::regclass[]) WITH ORDINALITY t(relid, o)
                         JOIN pg_catalog.pg_class c ON c.oid = t.relid
                         JOIN pg_catalog.pg_dist_shard s
                           ON s.logicalrelid = t.relid AND s.shardminvalue = r.shardminvalue
                         ORDER BY t.o)), '{}')::text
         FROM pg_catalog.pg_dist_shard r WHERE r.logicalrelid = $1::regclass",
        &[source.shards.as_str().into(), tables.into()],
    )?
    .unwrap_or_else(|| "{}".into()))
}

/// On a shard's node: the shards co-located with registry shard `registry_shard` (its name),
/// as `shard_map` listed them in `shards`, and the registry shard's id.
fn mapped_shards(registry_shard: &str, shards: &str) -> EvResult<(i64, Vec<String>)> {
    let id: i64 = registry_shard
        .rsplit('_')
        .next()
        .and_then(|digits| digits.trim_end_matches('"').parse().ok())
        .ok_or_else(|| shard_not_found(registry_shard))?;
    let names = spi::one::<Vec<String>>(
        "SELECT ARRAY(SELECT json_array_elements_text($1::json -> $2))",
        &[shards.into(), id.to_string().into()],
    )?
    .unwrap_or_default();
    if names.is_empty() {
        return Err(shard_not_found(registry_shard));
    }
    Ok((id, names))
}

/// A registry shard that the coordinator's metadata, as the call read it, does not list: a
/// shard split that committed after the call read the metadata.
fn shard_not_found(registry_shard: &str) -> EvError {
    EvError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "the shard {registry_shard} is not in the coordinator's metadata as this call read it"
        ),
    )
    .with_hint("A shard split ran at the same time: run the call again.")
}

/// `create_event_table(..., distribute_by)`: the event table, distributed by Citus on
/// `distribute_by`, with capture on every shard. 22023 for what is no distribution column,
/// 0A000 without Citus, with `retention` or with `partition_interval`.
pub fn create_distributed_event_table(
    name: &str,
    retention: Option<Interval>,
    delta_retention: Interval,
    partition_interval: Option<Interval>,
    distribute_by: &str,
) -> EvResult<pg_sys::Oid> {
    // The other arguments first, as for any event table.
    crate::event_tables::require_retentions(&retention, &Some(delta_retention))?;
    if let Some(interval) = &partition_interval {
        crate::partitions::new_length_of(interval)?;
    }
    let column = distribution_column(distribute_by)?;
    if !installed()? {
        return Err(not_supported(
            "distribute_by needs the Citus extension, which is not installed in this database",
            "Leave distribute_by out for an event table on this node.",
        ));
    }
    if retention.is_some() {
        return Err(not_supported(
            "retention of an event table distributed by Citus is not supported by this version of pg_eventview",
            "Leave retention out: the distributed table keeps its events.",
        ));
    }
    if partition_interval.is_some() {
        return Err(not_supported(
            "an event table distributed by Citus cannot be partitioned by this version of pg_eventview",
            "Leave partition_interval out, or distribute_by for a partitioned table on this node.",
        ));
    }
    if spi::one::<String>(
        "SELECT current_setting('citus.shard_replication_factor')",
        &[],
    )?
    .as_deref()
        != Some("1")
    {
        return Err(not_supported(
            "an event table distributed by Citus with more than one placement per shard is not supported by this version of pg_eventview",
            "SET citus.shard_replication_factor = 1 for the call.",
        ));
    }
    let quoted = relation::qualified_for_create(name)?;
    crate::event_tables::refuse_schema(&quoted, "create")?;
    // The table is the caller's. Its distribution runs as the extension owner, as the rest of
    // this transaction's work on its shards: Citus's connections to the workers are the current
    // role's, and a worker sees the shards made in this transaction only on those connections.
    roles::as_caller(|| {
        spi::run_all(&[envelope_sql::create_distributed_event_table(
            &quoted, column,
        )])
    })?;
    spi::run(
        "SELECT pg_catalog.create_distributed_table($1::regclass, $2)",
        &[quoted.as_str().into(), column.into()],
    )?;
    let relid = relation::created(&quoted)?;
    let shards = make_shard_registry(relid, &quoted, column)?;
    distributed::insert_source(relid, column, &shards, Some(delta_retention))?;
    let source = distributed_source(relid)?
        .ok_or_else(|| EvError::invalid("the distributed event table is not catalogued"))?;
    on_every_shard(&source, &[&quoted], Registry::Filled, |a| {
        format!(
            "eventview._attach_shard_capture({}, {}, {})",
            a.shard, a.shards, a.delta_retention
        )
    })?;
    Ok(relid)
}

/// The shard registry of distributed event table `relid` (`table`, distributed by `column`):
/// co-located with it, one row per shard, `k` a value that Citus hashes into that shard. Its
/// primary key lets Citus move its shards by logical replication, as those of the table.
fn make_shard_registry(relid: pg_sys::Oid, table: &str, column: &str) -> EvResult<String> {
    let type_name = distribution_type(relid, column)?;
    let shards = format!(
        "eventview.{}",
        quote::ident(&format!("_shards_{}", relid.to_u32()))
    );
    spi::run_all(&[format!("CREATE TABLE {shards} (k {type_name} PRIMARY KEY)")])?;
    spi::run(
        "SELECT pg_catalog.create_distributed_table($1::regclass, 'k', colocate_with => $2)",
        &[shards.as_str().into(), table.into()],
    )?;
    fill_shard_registry(relid, &shards, column)?;
    let owner = privileges::role_ident(privileges::table_owner(relid)?)?;
    spi::run_all(&[format!("GRANT SELECT ON {shards} TO {owner}")])?;
    Ok(shards)
}

/// The SQL type of distribution column `column` of `relid`, with its collation when it is not
/// the type's own: Citus co-locates tables whose distribution columns have one type and
/// collation.
fn distribution_type(relid: pg_sys::Oid, column: &str) -> EvResult<String> {
    let (type_name, _) = envelope_sql::distribution_value_of(column)
        .ok_or_else(|| EvError::invalid("no distribution column"))?;
    let collation = spi::one::<String>(
        "SELECT pg_catalog.format(' COLLATE %I.%I', n.nspname, c.collname)
         FROM pg_catalog.pg_attribute a
         JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
         JOIN pg_catalog.pg_collation c ON c.oid = a.attcollation
         JOIN pg_catalog.pg_namespace n ON n.oid = c.collnamespace
         WHERE a.attrelid = $1 AND a.attname = $2 AND a.attcollation <> t.typcollation",
        &[relid.into(), column.into()],
    )?
    .unwrap_or_default();
    Ok(format!("{type_name}{collation}"))
}

/// One row in shard registry `shards` of distributed event table `relid` (distributed by
/// `column`) for each of the table's shards: the first of 0, 1, 2, ... (as a value of the
/// column) that Citus hashes into the shard's range (a few tries each: the ranges split the
/// hash space evenly, and a split halves one).
fn fill_shard_registry(relid: pg_sys::Oid, shards: &str, column: &str) -> EvResult<()> {
    let (_, from_i) = envelope_sql::distribution_value_of(column)
        .ok_or_else(|| EvError::invalid("no distribution column"))?;
    // Ten million tries find a value for a range of a thousandth of the hash space or more
    // almost surely; a shard that Citus narrowed to a few hash values (a tenant isolated) has
    // none, and is refused below rather than left without per-shard calls.
    let (found, narrow) = Spi::connect(|client| {
        let t = client
            .select(
                &format!(
                    "WITH found AS (
                         SELECT s.shardid,
                                (SELECT i FROM pg_catalog.generate_series(0, 10000000) i
                                 WHERE pg_catalog.worker_hash({from_i}) BETWEEN s.shardminvalue::integer AND s.shardmaxvalue::integer
                                 LIMIT 1) AS i
                         FROM pg_catalog.pg_dist_shard s WHERE s.logicalrelid = $1)
                     SELECT coalesce(array_agg(i) FILTER (WHERE i IS NOT NULL), '{{}}'),
                            min(shardid) FILTER (WHERE i IS NULL)
                     FROM found"
                ),
                Some(1),
                &[relid.into()],
            )?
            .first();
        Ok::<_, pgrx::spi::SpiError>((t.get::<Vec<i32>>(1)?, t.get::<i64>(2)?))
    })?;
    let found: Vec<String> = found
        .unwrap_or_default()
        .iter()
        .map(i32::to_string)
        .collect();
    // (A literal: Citus plans no insert into a distributed table from parameters.)
    spi::run_all(&[format!(
        "INSERT INTO {shards} (k) SELECT {from_i} FROM pg_catalog.unnest({}::integer[]) i",
        quote::literal(&format!("{{{}}}", found.join(",")))
    )])?;
    match narrow {
        None => Ok(()),
        Some(shard) => Err(EvError::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "shard {shard} of {} covers too narrow a hash range for pg_eventview to reach it",
                relation::regclass_text(relid)?
            ),
        )
        .with_hint("Tenant isolation (isolate_tenant_to_new_shard) and split points a few hash values apart are not supported by this version of pg_eventview; views and tables can still be dropped.")),
    }
}

/// Runs `f` on a Citus node with access to the shards there: shards shown to this session
/// (Citus hides them from catalog queries), changed by hand, and DDL kept to this node.
fn with_shard_access<T>(f: impl FnOnce() -> EvResult<T>) -> EvResult<T> {
    guc::with_setting(c"citus.show_shards_for_app_name_prefixes", c"*", || {
        guc::with_setting(c"citus.enable_manual_changes_to_shards", c"on", || {
            guc::with_setting(c"citus.enable_ddl_propagation", c"off", f)
        })
    })
}

/// On a shard's node: registers the event table shard co-located with registry shard
/// `registry_shard` (listed in `shards`) as an event table of this node (`capture_shard`).
/// Returns 1, or 0 when it is registered already.
pub fn attach_shard_capture(
    registry_shard: &str,
    shards: &str,
    delta_retention: Interval,
) -> EvResult<i32> {
    with_shard_access(|| {
        let (shard_id, names) = mapped_shards(registry_shard, shards)?;
        Ok(capture_shard(shard_id, &names[0], delta_retention)?
            .1
            .into())
    })
}

/// On a shard's node: event table shard `shard` (of shard id `shard_id`) registered as an event
/// table of this node (capture, changelog), with the unique indexes on `event_id` and
/// `event_key` the distributed table cannot have, unless it is registered already. Every
/// per-shard call starts here: a shard that Citus moved or split onto this node arrives
/// without them. Its relation, and whether it registered the shard.
fn capture_shard(
    shard_id: i64,
    shard: &str,
    delta_retention: Interval,
) -> EvResult<(pg_sys::Oid, bool)> {
    let relid = relation::resolve(shard)?;
    if catalog::source_by_relid(relid)?.is_some() {
        return Ok((relid, false));
    }
    for column in ["event_id", "event_key"] {
        if !catalog::has_unique_index_on(relid, column)? {
            // Written while the shard had no index of its own here: between Citus placing it
            // on this node and the first per-shard call there.
            if let Some(twice) = spi::one::<String>(
                &format!(
                    "SELECT {column}::text FROM {shard} WHERE {column} IS NOT NULL
                     GROUP BY {column} HAVING count(*) > 1 LIMIT 1"
                ),
                &[],
            )? {
                return Err(EvError::new(
                    PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
                    format!(
                        "cannot capture shard {shard}: its {column} {} is there twice",
                        quote::literal(&twice)
                    ),
                )
                .with_hint(format!(
                    "pg_eventview keeps event_id and event_key unique on each shard of a distributed event table, from the first call on the shard's node: a table registered with repeats, or a shard written between Citus placing it on this node and that call. Delete one of the two events (their {column} is {}) through the distributed table, then call again.",
                    quote::literal(&twice)
                )));
            }
            let index = quote::ident(&format!("_eventview_{column}_{shard_id}"));
            roles::as_role(privileges::table_owner(relid)?, || {
                spi::run_all(&[format!("CREATE UNIQUE INDEX {index} ON {shard} ({column})")])
            })?;
        }
    }
    crate::event_tables::register_event_table(shard, None, Some(delta_retention))?;
    Ok((relid, true))
}

/// `create_view` over a distributed event table: the distributed table of partial groups,
/// the view over every shard (filled from the shard's events), the coordinator's merged groups
/// and values, and the user relation that reads them (realtime: `citus::realtime`).
pub fn create_view(args: &CreateViewArgs, source: &DistributedSource) -> EvResult<pg_sys::Oid> {
    privileges::require_select(source.relid)?;
    privileges::require_no_row_security(roles::caller(), source.relid)?;
    // A drop of the table waits, or makes this wait.
    if !distributed::lock_source(source.relid, SourceLock::MakesView)? {
        return Err(EvError::invalid(
            "the distributed event table is not catalogued",
        ));
    }
    let definition = parse_definition(&DefinitionInput {
        fields: &eventview_core::definition::NoFields,
        group_by: args.group_by,
        measures: args.measures,
        event_types: args.event_types.clone(),
        bucketed: args.time_bucket.is_some(),
        time_zone: args.time_zone,
        unnest: args.unnest,
        filter: args.filter,
        on_type_error: args.on_type_error,
    })?;
    let table_sql = source.table_sql()?;
    let view_id = catalog::next_view_id()?;
    let groups = format!("eventview.{}", quote::ident(&format!("_v{view_id}_groups")));
    let sql = sql_for(&definition, view_id, &table_sql, Some(groups.clone()));
    let type_name = distribution_type(source.relid, &source.distribute_by)?;
    spi::run_all(&sql.create_partial_groups(&groups, &type_name))?;
    spi::run(
        "SELECT pg_catalog.create_distributed_table($1::regclass, '__shard', colocate_with => $2)",
        &[groups.as_str().into(), table_sql.as_str().into()],
    )?;
    spi::run_all(&[format!("REVOKE ALL ON {groups} FROM PUBLIC")])?;
    // The merged groups, on the coordinator: the view's storage, which its relation reads as a
    // stored view of this node reads its own. Private to the owner, as any view's storage.
    let merged = ViewSql {
        data_table: None,
        ..sql_for(&definition, view_id, &table_sql, None)
    };
    let owner = roles::caller();
    let owner_ident = privileges::role_ident(owner)?;
    let data = names::view_data(view_id);
    spi::run_all(&merged.create_merged_storage())?;
    for table in std::iter::once(data.clone()).chain(merged.merged_values_tables()) {
        spi::run_all(&[format!("REVOKE ALL ON {table} FROM PUBLIC")])?;
        spi::run_all(&sqlgen::storage_grants(&table, &owner_ident))?;
    }
    // The relation is read on the coordinator only: Citus does not make it on the workers.
    let user_view = relation::qualified_for_create(args.name)?;
    realtime::install_user_view(&merged, &user_view, args.realtime, true)?;
    let relid = relation::created(&user_view)?;
    let arguments = distributed::insert_view(distributed::NewView {
        view_id,
        relid,
        source: source.relid,
        groups: &groups,
        group_by: args.group_by,
        measures: args.measures,
        event_types: definition.event_types.clone(),
        time_bucket: args.time_bucket,
        filter: args.filter,
        on_type_error: definition.on_type_error.name(),
        time_zone: definition.time_zone.as_deref(),
        unnest: definition.unnest.as_ref().map(|u| u.display()),
        owner,
        realtime: args.realtime,
    })?;
    let values = each_shard(source, &[&table_sql, &groups], Registry::Filled, |a| {
        format!(
            "eventview._attach_shard_view({}, {}, {}, {view_id}, {}, {})",
            a.shard,
            a.value,
            a.shards,
            quote::literal(&arguments),
            a.delta_retention
        )
    })?;
    spi::run_all(&merged.merge_all(&groups))?;
    if !merged.merged_values_tables().is_empty() {
        let mut listed = Vec::new();
        for shard_values in &values {
            listed.extend(parse_changes(shard_values)?);
        }
        let listed = serde_json::Value::Array(listed).to_string();
        for statement in merged.apply_value_changes() {
            spi::run(&statement, &[listed.as_str().into()])?;
        }
        spi::run_all(&merged.count_distinct_of(None))?;
    }
    let view = distributed_view(relid)?
        .ok_or_else(|| internal(format!("distributed view {view_id} is not catalogued")))?;
    quarantine::copy_entries(&view)?;
    // The merged groups are the sum of the shards' views as made: their positions are recorded
    // as a refresh records them, so that a realtime read before the first refresh adds the
    // pending changes onto the merged groups instead of merging every group they touch from
    // the shards' partial groups.
    let answers = realtime::pending_groups_of_shards(&view, &arguments, &table_sql)?;
    let mut positions = ShardPositions::default();
    for answer in &answers {
        positions.add(&ShardAnswer::parse(answer)?)?;
    }
    if let Some(positions) = positions.of_every_shard(answers.len()) {
        distributed::record_positions(view_id, &positions)?;
    }
    Ok(relid)
}

/// The SQL generator of distributed view `view_id` on the coordinator: `data_table` the
/// distributed partial groups, or None for the merged groups.
fn sql_for<'d>(
    definition: &'d ViewDefinition,
    view_id: i32,
    table_sql: &str,
    data_table: Option<String>,
) -> ViewSql<'d> {
    ViewSql {
        def: definition,
        view_id,
        source_id: 0,
        source_scan: table_sql.to_string(),
        log_extremes: false,
        feeds_rollups: false,
        bucket_width: None,
        rollup_source: None,
        data_table,
        values_in_row: sqlgen::ValuesInRow::No,
    }
}

/// The work of a per-shard call on a view: the coordinator's view, and what a shard's node
/// needs to make its view of a shard that arrived since (`ShardView::of`).
pub struct ShardViewCall<'a> {
    pub registry_shard: &'a str,
    /// The registry shard's value, which `__shard` of the groups shard defaults to.
    pub value: &'a str,
    pub shards: &'a str,
    pub view_id: i32,
    /// The view's arguments, as `_distributed_views` keeps them: parsed only to make the view.
    pub arguments: &'a str,
    pub delta_retention: Interval,
}

/// On a shard's node: the shards of a per-shard call on a view, with the event table shard
/// registered here (`capture_shard`).
struct ShardView {
    shard_id: i64,
    event_shard: String,
    event_relid: pg_sys::Oid,
    groups_shard: String,
}

impl ShardView {
    fn of(call: &ShardViewCall) -> EvResult<ShardView> {
        let (shard_id, names) = mapped_shards(call.registry_shard, call.shards)?;
        let (Some(event_shard), Some(groups_shard)) = (names.first(), names.get(1)) else {
            return Err(shard_not_found(call.registry_shard));
        };
        let (event_relid, _) = capture_shard(shard_id, event_shard, call.delta_retention)?;
        Ok(ShardView {
            shard_id,
            event_shard: event_shard.clone(),
            event_relid,
            groups_shard: groups_shard.clone(),
        })
    }

    /// This node's view keeping the groups shard: its user relation, if there is one.
    fn relid(&self) -> EvResult<Option<pg_sys::Oid>> {
        view_keeping(&self.groups_shard)
    }

    /// The type of `__shard` in the groups shard, as `canonical_text` names it (`typname`).
    fn tag_type(&self) -> EvResult<String> {
        Ok(spi::one::<String>(
            "SELECT t.typname::text FROM pg_catalog.pg_attribute a
             JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
             WHERE a.attrelid = $1::regclass AND a.attname = '__shard'",
            &[self.groups_shard.as_str().into()],
        )?
        .unwrap_or_default())
    }

    /// Makes this node's view over the event table shard, keeping its groups in the groups
    /// shard (whose `__shard` defaults to the registry shard's value), filled from the shard's
    /// events. Its applies hand the changes of the groups they change back to the coordinator's
    /// refresh (`refresh_and_take`) when it asks for them in columns and the view has no
    /// count_distinct or percentile measure; otherwise they write them to its group changelog,
    /// from which a refresh takes them.
    fn make(&self, call: &ShardViewCall) -> EvResult<pg_sys::Oid> {
        spi::run_all(&[format!(
            "ALTER TABLE {} ALTER COLUMN __shard SET DEFAULT {}",
            self.groups_shard,
            quote::literal(call.value)
        )])?;
        // The indexes a view of this node made before (`rebuild` drops it and makes it anew)
        // go: the new view makes its own.
        let left = spi::one::<Vec<String>>(
            "SELECT ARRAY(SELECT pg_catalog.format('DROP INDEX %s', i.indexrelid::regclass)
                          FROM pg_catalog.pg_index i
                          WHERE i.indrelid = $1::regclass AND NOT i.indisprimary)",
            &[self.groups_shard.as_str().into()],
        )?
        .unwrap_or_default();
        spi::run_all(&left)?;
        let schema = spi::one::<String>(
            "SELECT quote_ident(n.nspname) FROM pg_catalog.pg_class c
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1::regclass",
            &[self.event_shard.as_str().into()],
        )?
        .unwrap_or_else(|| "public".into());
        let name = format!(
            "{schema}.{}",
            quote::ident(&format!("_eventview_v{}_{}", call.view_id, self.shard_id))
        );
        let a = &view_arguments(call.arguments)?;
        views::create_view(CreateViewArgs {
            name: &name,
            source: &self.event_shard,
            group_by: &a.group_by,
            measures: &a.measures,
            event_types: a
                .event_types
                .clone()
                .map(|types| types.into_iter().map(Some).collect()),
            time_bucket: a.time_bucket,
            filter: a.filter.as_deref(),
            realtime: false,
            on_type_error: &a.on_type_error,
            time_zone: a.time_zone.as_deref(),
            unnest: a.unnest.as_deref(),
            data_table: Some(&self.groups_shard),
        })?;
        let relid = relation::resolve(&name)?;
        let view = catalog::view_by_relid(relid, true)?
            .ok_or_else(|| shard_view_gone(&self.groups_shard))?;
        spi::run_all(&crate::view_objects::sql_of(&view).create_changes())?;
        catalog::set_feeds_rollups(view.view_id, true)?;
        Ok(relid)
    }
}

/// On a shard's node: makes the view of distributed view `call.view_id` over the event table
/// shard co-located with the registry shard (`ShardView::make`). Returns the values of its
/// count_distinct and percentile measures (`values_of_shard`).
pub fn attach_shard_view(call: &ShardViewCall) -> EvResult<String> {
    with_shard_access(|| {
        let relid = ShardView::of(call)?.make(call)?;
        values_of_shard(relid, call)
    })
}

/// The values of the count_distinct and percentile measures of this node's view `relid`, tagged with the
/// registry shard's value, as a JSON array of value changes that add them.
fn values_of_shard(relid: pg_sys::Oid, call: &ShardViewCall) -> EvResult<String> {
    let view = catalog::view_by_relid(relid, false)?
        .ok_or_else(|| internal(format!("no view of this node for {}", call.registry_shard)))?;
    Ok(spi::one::<String>(
        &crate::view_objects::sql_of(&view).values_of_shard(&quote::literal(call.value)),
        &[],
    )?
    .unwrap_or_else(|| "[]".into()))
}

/// A distributed view's definition, as `_distributed_views.arguments` keeps it.
pub struct DistributedViewArguments {
    pub group_by: String,
    pub measures: String,
    pub event_types: Option<Vec<String>>,
    pub time_bucket: Option<Interval>,
    pub filter: Option<String>,
    pub on_type_error: String,
    pub time_zone: Option<String>,
    pub unnest: Option<String>,
}

impl DistributedViewArguments {
    /// The view's definition, as every node parses it (logical fields are not distributed).
    pub fn definition(&self) -> EvResult<ViewDefinition> {
        Ok(parse_definition(&DefinitionInput {
            fields: &eventview_core::definition::NoFields,
            group_by: &self.group_by,
            measures: &self.measures,
            event_types: self
                .event_types
                .clone()
                .map(|t| t.into_iter().map(Some).collect()),
            bucketed: self.time_bucket.is_some(),
            time_zone: self.time_zone.as_deref(),
            unnest: self.unnest.as_deref(),
            filter: self.filter.as_deref(),
            on_type_error: &self.on_type_error,
        })?)
    }
}

/// A distributed view's definition from the text of its `arguments` (as
/// `_distributed_views` keeps them, and the coordinator passes them to every shard's node).
pub fn view_arguments(arguments: &str) -> EvResult<DistributedViewArguments> {
    let row = Spi::connect(|client| {
        let t = client
            .select(
                "SELECT a -> 'group_by', a -> 'measures',
                        CASE WHEN json_typeof(a -> 'event_types') = 'array'
                             THEN ARRAY(SELECT json_array_elements_text(a -> 'event_types')) END,
                        (a ->> 'time_bucket')::interval,
                        CASE WHEN json_typeof(a -> 'filter') = 'object' THEN (a -> 'filter')::text END,
                        a ->> 'on_type_error', a ->> 'time_zone', a ->> 'unnest'
                 FROM (SELECT $1::json AS a) x",
                Some(1),
                &[arguments.into()],
            )?
            .first();
        Ok::<_, pgrx::spi::SpiError>((
            t.get::<pgrx::Json>(1)?,
            t.get::<pgrx::Json>(2)?,
            t.get::<Vec<String>>(3)?,
            t.get::<Interval>(4)?,
            t.get::<String>(5)?,
            t.get::<String>(6)?,
            t.get::<String>(7)?,
            t.get::<String>(8)?,
        ))
    })?;
    let (group_by, measures, event_types, time_bucket, filter, on_type_error, time_zone, unnest) =
        row;
    Ok(DistributedViewArguments {
        group_by: group_by
            .map(|j| j.0.to_string())
            .unwrap_or_else(|| "{}".into()),
        measures: measures
            .map(|j| j.0.to_string())
            .unwrap_or_else(|| "{}".into()),
        event_types,
        time_bucket,
        filter,
        on_type_error: on_type_error.unwrap_or_else(|| "quarantine".into()),
        time_zone,
        unnest,
    })
}

/// On a shard's node: refreshes the view keeping the groups shard co-located with the registry
/// shard; returns `{"applied": <changed events applied>, "columns": [<the group changes its
/// group changelog held, taken, in columns>], "values": [<the value changes of its
/// count_distinct and percentile measures>]}` (`ViewSql::take_change_columns`; `"changes":
/// [<one object per group change>]` instead, `ViewSql::take_changes`, when the coordinator's
/// `arguments` do not ask for columns, as those of an older library do not).
///
/// A shard that Citus moved or split onto this node since the last refresh has no view here
/// yet: its groups shard came with it, filled by the view of the node it left, whose changes
/// not yet taken are gone with that node's changelog. The shard's view is made then, filled
/// from the shard's events, and the answer is `{"applied": 0, "rebuilt": true, "values": [<all
/// of the view's values>], "replaces": [<the shards whose values the coordinator holds for
/// these groups>]}`: the coordinator merges every group anew (`ShardChanges::merge_into`).
pub fn refresh_shard_view(call: &ShardViewCall) -> EvResult<String> {
    with_shard_access(|| {
        let shard = ShardView::of(call)?;
        let Some(relid) = shard.relid()? else {
            // This shard's values, or, after a split, those of the shard it was split from.
            let replaces = spi::one::<Vec<String>>(
                &format!(
                    "SELECT ARRAY(SELECT DISTINCT {} FROM {})",
                    envelope_sql::canonical_text("__shard", &shard.tag_type()?),
                    shard.groups_shard
                ),
                &[],
            )?
            .unwrap_or_default();
            spi::run_all(&[format!("DELETE FROM {}", shard.groups_shard)])?;
            let relid = shard.make(call)?;
            let view = catalog::view_by_relid(relid, false)?
                .ok_or_else(|| shard_view_gone(&shard.groups_shard))?;
            return Ok(serde_json::json!({
                "applied": 0,
                "rebuilt": true,
                "values": parse_changes(&values_of_shard(relid, call)?)?,
                "replaces": replaces,
                "drift": drift_of_shard(shard.event_relid)?,
                "shard": call.value,
                "position": shard_view_position(view.view_id)?,
                "quarantine": quarantine::mark_of(relid)?,
            })
            .to_string());
        };
        let in_columns = asks_for_columns(call.arguments)?;
        let (applied, view, taken) =
            refresh_and_take(relid, &quote::literal(call.value), in_columns)?;
        let mut added = serde_json::Map::new();
        added.insert("applied".into(), applied.into());
        added.insert("drift".into(), drift_of_shard(shard.event_relid)?.into());
        added.insert("shard".into(), call.value.into());
        added.insert("position".into(), shard_view_position(view.view_id)?.into());
        added.insert("quarantine".into(), quarantine::mark_of(relid)?.into());
        // The changes stay the text they were taken as (see `json_text`).
        json_text::with_members(&taken, &added).ok_or_else(|| {
            let start: String = taken.chars().take(300).collect();
            internal(format!(
                "a shard's changes are not a JSON object: {start}..."
            ))
        })
    })
}

/// On a shard's node: refreshes this node's view `relid` of a shard, and takes its group
/// changes (`take_changes_of`, tagged with `shard`, a literal); returns the changed events
/// applied, the view, and the answer of the take. Asked `in_columns`, the apply hands its
/// group changes back instead of writing them to the view's group changelog
/// (`refresh::refresh_keeping_view`), in the text that `take_changes_of` writes (the whole
/// refresh runs under `in_text_settings`), and they join what the take finds there.
pub(crate) fn refresh_and_take(
    relid: pg_sys::Oid,
    shard: &str,
    in_columns: bool,
) -> EvResult<(i64, catalog::ViewRecord, String)> {
    let name = relation::regclass_text(relid)?;
    let (applied, view, handed_back) = if in_columns {
        in_text_settings(|| crate::refresh::refresh_keeping_view(relid, &name, true))?
    } else {
        crate::refresh::refresh_keeping_view(relid, &name, false)?
    };
    let taken = take_changes_of(&view, shard, in_columns)?;
    if handed_back.is_empty() {
        return Ok((applied, view, taken));
    }
    let mut answer: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&taken)
        .map_err(|e| {
            internal(format!(
                "a shard's taken changes are not a JSON object: {e}"
            ))
        })?;
    let mut lists: Vec<String> = answer
        .get("columns")
        .map(|c| c.to_string())
        .into_iter()
        .collect();
    lists.extend(handed_back);
    let lists: Vec<&str> = lists.iter().map(String::as_str).collect();
    let joined = array_text::join_column_lists(&lists).ok_or_else(|| {
        let start: String = lists.iter().flat_map(|l| l.chars()).take(300).collect();
        internal(format!(
            "a shard's group changes are not columns of the same arrays: {start}..."
        ))
    })?;
    answer.insert("columns".into(), joined.into());
    Ok((applied, view, serde_json::Value::Object(answer).to_string()))
}

/// On a shard's node: the group changes of its view `view`, taken (`ViewSql::take_changes`, or
/// `in_columns`, `ViewSql::take_change_columns`), the value changes tagged with `shard` (a
/// literal). Their values are written as text the same way whatever the session's settings.
pub(crate) fn take_changes_of(
    view: &catalog::ViewRecord,
    shard: &str,
    in_columns: bool,
) -> EvResult<String> {
    let sql = crate::view_objects::sql_of(view);
    let take = if in_columns {
        sql.take_change_columns(shard)
    } else {
        sql.take_changes(shard)
    };
    let taken = in_text_settings(|| spi::one::<String>(&take, &[]))?;
    Ok(taken.unwrap_or_else(|| "{}".into()))
}

/// Runs `f` with the settings under which a shard writes its group changes as text for the
/// coordinator: `DateStyle` ISO (its output part only: how dates are read stays as set) and
/// `extra_float_digits` 3, so that the coordinator reads back the very values whatever either
/// session's settings. (The rest of a refresh keeps dates and floats as values, or writes them
/// as JSON, whose dates take no DateStyle and whose floats read back the same whatever the
/// digits.)
fn in_text_settings<T>(f: impl FnOnce() -> EvResult<T>) -> EvResult<T> {
    guc::with_setting(c"DateStyle", c"ISO", || {
        guc::with_setting(c"extra_float_digits", c"3", f)
    })
}

/// Merges the group changes of shards' answers `answers` (as `refresh_shard_view` answers)
/// into the storage of view `view` of this node, as a distributed view's refresh merges them
/// into the coordinator's, merging anew from the partial groups of table `groups` each group
/// that took a retraction (for tests: the view's storage stands in for the merged groups).
#[cfg(any(test, feature = "pg_test"))]
pub(crate) fn merge_answers_into(
    view: &catalog::ViewRecord,
    answers: &[&str],
    groups: &str,
) -> EvResult<()> {
    let mut taken = ShardChanges::default();
    let parsed = answers
        .iter()
        .map(|a| ShardAnswer::parse(a))
        .collect::<EvResult<Vec<_>>>()?;
    for answer in &parsed {
        taken.add(answer)?;
    }
    let sql = crate::view_objects::sql_of(view);
    taken.merge_into(&sql, groups)
}

/// On a shard's node: the position of its view `view_id` after this transaction's changes
/// (`ViewSql::shard_view_position`). One kept statement for every shard's view: a statement per
/// view would crowd the kept statements of the node's refreshes out of `plan_cache`.
fn shard_view_position(view_id: i32) -> EvResult<Option<String>> {
    spi::one::<String>(
        &format!("SELECT {}", ViewSql::shard_view_position("$1")),
        &[view_id.into()],
    )
}

/// An error of the protocol between the coordinator and the shards' nodes (XX000): a bug.
fn internal(message: String) -> EvError {
    EvError::new(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, message)
}

/// The view of this node keeping `groups_shard`, gone while a call used it (a DROP by hand on
/// this node): 55000.
fn shard_view_gone(groups_shard: &str) -> EvError {
    EvError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("the view of this node keeping {groups_shard} was dropped during the call"),
    )
    .with_hint("Run the call again: it makes the view anew.")
}

/// The group changes of a JSON array's text.
fn parse_changes(listed: &str) -> EvResult<Vec<serde_json::Value>> {
    match serde_json::from_str(listed) {
        Ok(serde_json::Value::Array(changes)) => Ok(changes),
        _ => Err(internal(format!(
            "a shard's changes are not a JSON array: {listed}"
        ))),
    }
}

/// On a shard's node: drops the view keeping the groups shard co-located with registry shard
/// `registry_shard` (not that shard, which goes with its distributed table). Returns 1, or 0
/// when there is none.
pub fn detach_shard_view(registry_shard: &str, shards: &str) -> EvResult<i32> {
    with_shard_access(|| {
        let (_, names) = mapped_shards(registry_shard, shards)?;
        let Some(groups_shard) = names.first() else {
            return Ok(0);
        };
        let Some(relid) = view_keeping(groups_shard)? else {
            return Ok(0);
        };
        views::drop_view_by_relid(relid)?;
        Ok(1)
    })
}

/// On a shard's node: the user relation of this node's view keeping `groups_shard` (a shard of
/// a distributed view's partial groups), if there is one.
fn view_keeping(groups_shard: &str) -> EvResult<Option<pg_sys::Oid>> {
    distributed::view_keeping(groups_shard)
}

/// `refresh` of a view over a distributed event table: every shard's view, each on its node
/// and exactly once there; returns the changed events applied.
pub fn refresh(view: &DistributedView) -> EvResult<i64> {
    require_owner(view, "refresh")?;
    require_read_committed("refresh")?;
    // Every shard's view is refreshed as the extension owner: the rights are the view owner's,
    // checked here at each refresh as a view of this node has them checked.
    privileges::require_owner_reads(view.relid, view.owner, view.source.relid)?;
    lock_view(view)?;
    let (arguments, definition) = definition_of(view)?;
    let mut asked = serde_json::Map::new();
    asked.insert(CHANGES_AS.into(), COLUMNS.into());
    let arguments = json_text::with_members(&arguments, &asked).ok_or_else(|| {
        internal(format!(
            "a view's arguments are not a JSON object: {arguments}"
        ))
    })?;
    let table_sql = view.source.table_sql()?;
    let results = each_shard(
        &view.source,
        &[&table_sql, &view.groups],
        Registry::Filled,
        |a| {
            format!(
                "eventview._refresh_shard_view({}, {}, {}, {}, {}, {})",
                a.shard,
                a.value,
                a.shards,
                view.view_id,
                quote::literal(&arguments),
                a.delta_retention
            )
        },
    )?;
    let mut applied = 0;
    let mut taken = ShardChanges::default();
    let mut marks = quarantine::ShardMarks::default();
    let mut drift = Vec::new();
    let mut positions = ShardPositions::default();
    for result in &results {
        let answer = ShardAnswer::parse(result)?;
        applied += answer.number("applied")?;
        taken.add(&answer)?;
        marks.add(&answer)?;
        drift.extend(answer.list("drift")?);
        positions.add(&answer)?;
    }
    merge_drift(view.source.relid, drift)?;
    let merged = sql_for(&definition, view.view_id, &table_sql, None);
    taken.merge_into(&merged, &view.groups)?;
    quarantine::follow(view, &marks)?;
    distributed::record_refresh(
        view.view_id,
        positions.of_every_shard(results.len()).as_deref(),
    )?;
    Ok(applied)
}

/// The positions of the shards' views (`ViewSql::shard_view_position`) that shards answered,
/// by shard.
#[derive(Default)]
pub(crate) struct ShardPositions(serde_json::Map<String, serde_json::Value>);

impl ShardPositions {
    /// Adds the shard and position of a shard's answer, when it has them (a node with an older
    /// library answers none).
    fn add(&mut self, answer: &ShardAnswer) -> EvResult<()> {
        if let Some((shard, position)) = answer.position()? {
            self.0.insert(shard, position.into());
        }
        Ok(())
    }

    fn answered(&self) -> usize {
        self.0.len()
    }

    /// `{"<shard>": "<position>", ...}`.
    fn to_json(&self) -> String {
        serde_json::Value::Object(self.0.clone()).to_string()
    }

    /// The positions to record, when all `answers` answered one: a realtime read compares
    /// every shard's, and a shard missing from the record would never match.
    fn of_every_shard(&self, answers: usize) -> Option<String> {
        (self.answered() == answers).then(|| self.to_json())
    }
}

/// The member of the `arguments` of a shard's refresh by which the coordinator asks for the
/// group changes in columns (`ViewSql::take_change_columns`), and its value. A shard's node
/// with an older library does not know it, and answers one JSON object per group change.
const CHANGES_AS: &str = "changes_as";
const COLUMNS: &str = "columns";

/// Shards' group changes in columns (`lists`, each shard's) that are not the `expected`
/// columns of this library's: a node with another library answered them (55000).
fn columns_not_of_this_library(lists: &[&str], expected: usize) -> EvError {
    let counts: Vec<String> = lists
        .iter()
        .map(|list| match array_text::join_column_lists(&[list]) {
            Some(columns) => columns.len().to_string(),
            None => "unreadable".into(),
        })
        .collect();
    EvError::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "shards answered their group changes in columns this library does not read: {} columns, where it reads {expected}",
            counts.join(", ")
        ),
    )
    .with_hint("Install the same pg_eventview library on every node, and run the refresh again.")
}

/// Whether the `arguments` of a shard's refresh ask for the group changes in columns.
fn asks_for_columns(arguments: &str) -> EvResult<bool> {
    let arguments: serde_json::Map<String, serde_json::Value> = serde_json::from_str(arguments)
        .map_err(|e| {
            internal(format!(
                "a shard's refresh got arguments that are not a JSON object: {e}"
            ))
        })?;
    Ok(arguments.get(CHANGES_AS).and_then(|v| v.as_str()) == Some(COLUMNS))
}

/// A shard's answer to a per-shard call (a JSON object), its members left unparsed: the group
/// changes of a refresh, thousands of objects, go on to the coordinator's statements as the
/// text they came in.
pub(crate) struct ShardAnswer<'a>(
    std::collections::HashMap<String, &'a serde_json::value::RawValue>,
);

impl<'a> ShardAnswer<'a> {
    fn parse(text: &'a str) -> EvResult<ShardAnswer<'a>> {
        Self::parse_from(text, "a shard")
    }

    /// A JSON object's text `who` answered, its members left unparsed.
    pub(crate) fn parse_from(text: &'a str, who: &str) -> EvResult<ShardAnswer<'a>> {
        serde_json::from_str(text).map(ShardAnswer).map_err(|e| {
            let start: String = text.chars().take(300).collect();
            internal(format!("{who} answered {start}...: {e}"))
        })
    }

    /// Member `name` parsed (Null when absent).
    fn value(&self, name: &str) -> EvResult<serde_json::Value> {
        match self.0.get(name) {
            Some(raw) => serde_json::from_str(raw.get())
                .map_err(|e| internal(format!("a shard's {name} is not JSON: {e}"))),
            None => Ok(serde_json::Value::Null),
        }
    }

    fn number(&self, name: &str) -> EvResult<i64> {
        Ok(self.value(name)?.as_i64().unwrap_or(0))
    }

    fn flag(&self, name: &str) -> EvResult<bool> {
        Ok(self.value(name)?.as_bool().unwrap_or(false))
    }

    fn text(&self, name: &str) -> EvResult<Option<String>> {
        Ok(self.value(name)?.as_str().map(str::to_string))
    }

    /// The elements of array member `name`, parsed (none when absent or null).
    fn list(&self, name: &str) -> EvResult<Vec<serde_json::Value>> {
        match self.value(name)? {
            serde_json::Value::Array(items) => Ok(items),
            serde_json::Value::Null => Ok(Vec::new()),
            other => Err(internal(format!(
                "a shard's {name} is not a JSON array: {other}"
            ))),
        }
    }

    /// The shard that answered and the position of its view (`ViewSql::shard_view_position`),
    /// if it answered them (a node with an older library does not).
    fn position(&self) -> EvResult<Option<(String, String)>> {
        Ok(self.text("shard")?.zip(self.text("position")?))
    }

    /// Member `name` as the text it came in, if present.
    fn raw(&self, name: &str) -> Option<&'a str> {
        self.0.get(name).map(|raw| raw.get())
    }

    /// The elements of array member `name` as the text between its brackets; None when it is
    /// absent, null or empty.
    fn elements(&self, name: &str) -> EvResult<Option<&'a str>> {
        match self.0.get(name) {
            Some(raw) => array_elements(raw.get(), &format!("a shard's {name}")),
            None => Ok(None),
        }
    }
}

/// The elements of the JSON array `raw` (`what` it is, for the error) as the text between its
/// brackets; None when it is null or empty.
fn array_elements<'t>(raw: &'t str, what: &str) -> EvResult<Option<&'t str>> {
    let raw = raw.trim();
    if raw == "null" {
        return Ok(None);
    }
    let inner = raw
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .ok_or_else(|| internal(format!("{what} is not a JSON array")))?
        .trim();
    Ok((!inner.is_empty()).then_some(inner))
}

/// A JSON array of the elements `parts` hold (each the text between an array's brackets).
fn json_array(parts: &[&str]) -> String {
    let mut out = String::with_capacity(parts.iter().map(|p| p.len() + 1).sum::<usize>() + 2);
    out.push('[');
    out.push_str(&parts.join(","));
    out.push(']');
    out
}

/// What the shards' refreshes of a view took: their group changes, the value changes of its
/// count_distinct and percentile measures (each shard's as the text of its array's elements),
/// and the shards whose values are replaced (made anew on a node they arrived on).
#[derive(Default)]
struct ShardChanges<'a> {
    changes: Vec<&'a str>,
    /// The group changes of the shards that answered them in columns, each such shard's list
    /// of columns (`ViewSql::take_change_columns`).
    columns: Vec<&'a str>,
    values: Vec<&'a str>,
    replaces: Vec<String>,
    /// A shard's view was made anew (`refresh_shard_view`).
    rebuilt: bool,
}

impl<'a> ShardChanges<'a> {
    /// A shard's answer (`refresh_shard_view`) added.
    fn add(&mut self, answer: &ShardAnswer<'a>) -> EvResult<()> {
        self.rebuilt |= answer.flag("rebuilt")?;
        self.changes.extend(answer.elements("changes")?);
        self.columns
            .extend(answer.raw("columns").filter(|c| c.trim() != "null"));
        self.values.extend(answer.elements("values")?);
        self.replaces.extend(
            answer
                .list("replaces")?
                .iter()
                .filter_map(|s| s.as_str().map(str::to_string)),
        );
        Ok(())
    }

    /// Merged into the coordinator's storage of view `merged` (its partial groups `groups`):
    /// the group changes added, the groups that took a retraction merged anew from every
    /// shard's partial groups (gone when left without events), the value changes added, and
    /// the distinct counts of every group changed counted anew. When a shard's view was made
    /// anew, every group is merged anew instead, and every distinct count counted: what the
    /// coordinator held of that shard's groups may include changes that its old node's view
    /// applied and nobody took. Every value is a parameter of a local statement, or a literal
    /// where the statement reads the distributed groups.
    fn merge_into(self, merged: &ViewSql, groups: &str) -> EvResult<()> {
        // The keys (JSON objects' texts, as array elements) of the groups to merge anew, and of
        // the groups changed in columns whose distinct counts need counting.
        let mut dirty_keys = Vec::new();
        let mut changed_keys = Vec::new();
        let from_objects;
        let from_columns;
        if self.rebuilt {
            spi::run_all(&merged.merge_all(groups))?;
        } else {
            if !self.changes.is_empty() {
                let listed = json_array(&self.changes);
                from_objects = spi::one::<String>(
                    &merged.apply_changes("$1::json"),
                    &[listed.as_str().into()],
                )?
                .unwrap_or_else(|| "[]".into());
                dirty_keys.extend(array_elements(&from_objects, "the dirty groups")?);
            }
            if !self.columns.is_empty() {
                let expected = merged.change_column_count();
                let joined = array_text::join_column_lists(&self.columns)
                    .filter(|joined| joined.len() == expected)
                    .ok_or_else(|| columns_not_of_this_library(&self.columns, expected))?;
                // (None changed: every column empty.)
                from_columns = if joined.iter().all(|column| column == "{}") {
                    "{}".into()
                } else {
                    spi::one::<String>(&merged.apply_change_columns(), &[joined.into()])?
                        .unwrap_or_else(|| "{}".into())
                };
                let written = ShardAnswer::parse_from(&from_columns, "the merge of group changes")?;
                dirty_keys.extend(written.elements("dirty")?);
                changed_keys.extend(written.elements("changed")?);
            }
            if !dirty_keys.is_empty() {
                let dirty = json_array(&dirty_keys);
                spi::run_all(&merged.merge_keys(groups, &quote::literal(&dirty)))?;
            }
        }
        if merged.merged_values_tables().is_empty() {
            return Ok(());
        }
        if !self.replaces.is_empty() {
            for statement in merged.replace_shards_values() {
                spi::run(&statement, &[self.replaces.clone().into()])?;
            }
        }
        if !self.values.is_empty() {
            let listed = json_array(&self.values);
            for statement in merged.apply_value_changes() {
                spi::run(&statement, &[listed.as_str().into()])?;
            }
        }
        if self.rebuilt {
            spi::run_all(&merged.count_distinct_of(None))?;
        } else if !self.changes.is_empty() || !changed_keys.is_empty() || !self.values.is_empty() {
            let keys = json_array(&[self.changes, changed_keys, self.values].concat());
            for statement in merged.count_distinct_of(Some("$1::json")) {
                spi::run(&statement, &[keys.as_str().into()])?;
            }
        }
        Ok(())
    }
}

/// `rebuild` of a view over a distributed event table: every shard's view made anew from the
/// shard's events on its node (dropped, then made by `refresh` as for a shard that arrived
/// there), and every group merged anew. The window (validated by the caller) does not narrow
/// it: a distributed event table keeps every event, so the groups outside it come out as they
/// were (`windowed`: a window was given, which a view without buckets refuses with 22023).
/// Returns the groups the view holds.
pub fn rebuild(view: &DistributedView, windowed: bool) -> EvResult<i64> {
    require_owner(view, "rebuild")?;
    if windowed && !definition_of(view)?.1.bucketed {
        return Err(EvError::invalid(format!(
            "view {} has no time_bucket, so rebuild takes no time window",
            relation::regclass_text(view.relid)?
        ))
        .with_hint(
            "Call rebuild(name) without from_time and to_time to recompute the whole view.",
        ));
    }
    require_read_committed("rebuild")?;
    lock_view(view)?;
    on_every_shard(&view.source, &[&view.groups], Registry::AsItIs, |a| {
        format!("eventview._detach_shard_view({}, {})", a.shard, a.shards)
    })?;
    refresh(view)?;
    // A whole rebuild makes a realtime view's read anew too, as for a view of this node (a
    // release whose realtime read changes asks for it).
    if distributed::view_realtime(view.view_id)? {
        let (_, definition) = definition_of(view)?;
        realtime::install_user_view(
            &sql_for(&definition, view.view_id, "", None),
            &relation::regclass_text(view.relid)?,
            true,
            false,
        )?;
    }
    Ok(spi::one::<i64>(
        &format!("SELECT count(*) FROM {}", names::view_data(view.view_id)),
        &[],
    )?
    .unwrap_or(0))
}

/// Before a refresh or rebuild of `view`: its table's catalog row, as the drops take it first
/// (`shard_args` takes it again), then its own row: one refresh or rebuild of the view at a
/// time, each adding the changes its shards' refreshes took.
fn lock_view(view: &DistributedView) -> EvResult<()> {
    distributed::lock_source(view.source.relid, SourceLock::RunsOnShards)?;
    distributed::lock_view(view.view_id)
}

/// A refresh or rebuild of a distributed view runs in a READ COMMITTED transaction (0A000
/// otherwise): Citus runs the shards' parts at the coordinator's isolation level, and a shard's
/// view made anew reads the shard's events from a snapshot of its own, as `create_view` does.
fn require_read_committed(action: &str) -> EvResult<()> {
    if !spi::uses_transaction_snapshot() {
        return Ok(());
    }
    Err(not_supported(
        format!("{action} of a view over an event table distributed by Citus needs a READ COMMITTED transaction"),
        "Run it in a READ COMMITTED transaction (PostgreSQL's default).",
    ))
}

/// The arguments distributed view `view` was made with (as `_distributed_views` keeps them),
/// and its definition.
fn definition_of(view: &DistributedView) -> EvResult<(String, ViewDefinition)> {
    let arguments = distributed::view_arguments(view.view_id)?
        .ok_or_else(|| EvError::invalid("a distributed view is not catalogued"))?;
    let definition = view_arguments(&arguments)?.definition()?;
    Ok((arguments, definition))
}

/// `eventview.views`' figures of distributed view `view_id`, as a JSON object: `pending_changes`
/// and `lag` over every shard's view (NULL while a shard has no view on its node yet, or no
/// registry row, until the next refresh), `groups` merged on the coordinator, `quarantined`
/// and `skipped` added up over the shards. Read on every shard's node without the table's row
/// lock and without writing.
pub fn view_stats(view_id: i32) -> EvResult<String> {
    let relid = distributed::view_relid(view_id)?;
    let Some(view) = relid.map(distributed_view).transpose()?.flatten() else {
        return Ok("{}".into());
    };
    // A node that cannot be reached leaves the shards' figures unknown, not the monitoring view
    // failing: the figures a monitor needs most are those of a cluster with a node down.
    let answers = each_shard_for_monitoring(&view.source, &[&view.groups], |a| {
        format!("eventview._shard_view_stats({}, {})", a.shard, a.shards)
    })?;
    let answers = match answers {
        Ok(answers) => answers,
        Err(message) => {
            pgrx::warning!(
                "the pending changes, lag, quarantined and skipped events of view {} are unknown: {message}",
                relation::regclass_text(view.relid)?
            );
            vec![r#"{"pending_changes": null, "quarantined": null, "skipped": null}"#.to_string()]
        }
    };
    let mut answers = answers
        .iter()
        .map(|a| serde_json::from_str(a))
        .collect::<Result<Vec<serde_json::Value>, _>>()
        .map_err(|e| internal(format!("a shard's figures are not JSON: {e}")))?;
    // A shard that a split made has no registry row until the next refresh or maintenance:
    // unknown, as a shard without a view.
    if answers.len() as i64 != shard_count(&view.source.shards)? {
        answers.push(serde_json::json!({"pending_changes": null}));
    }
    let answers = serde_json::Value::Array(answers).to_string();
    Ok(spi::one::<String>(
        &format!(
            "SELECT pg_catalog.json_build_object(
                 'pending_changes', CASE WHEN bool_or(a ->> 'pending_changes' IS NULL) THEN NULL
                                         ELSE sum((a ->> 'pending_changes')::bigint) END,
                 'lag', CASE WHEN bool_or(a ->> 'lag' IS NULL) THEN NULL
                             ELSE coalesce(max((a ->> 'lag')::interval), interval '0') END,
                 'groups', (SELECT count(*) FROM {}),
                 'quarantined', CASE WHEN bool_or(pg_catalog.json_typeof(a -> 'quarantined') = 'null') THEN NULL
                                     ELSE coalesce(sum((a ->> 'quarantined')::bigint), 0) END,
                 'skipped', CASE WHEN bool_or(pg_catalog.json_typeof(a -> 'skipped') = 'null') THEN NULL
                                 ELSE coalesce(sum((a ->> 'skipped')::bigint), 0) END)::text
             FROM pg_catalog.json_array_elements($1::json) a",
            names::view_data(view.view_id)
        ),
        &[answers.as_str().into()],
    )?
    .unwrap_or_else(|| "{}".into()))
}

/// A node that could not be reached in a statement: its host and port, and the error's message.
struct UnreachableNode {
    host: String,
    port: i32,
    message: String,
}

thread_local! {
    /// The nodes that could not be reached in the statement of key `pg::statement_key`.
    static UNREACHABLE: std::cell::RefCell<((i64, u32), Vec<UnreachableNode>)> =
        const { std::cell::RefCell::new(((0, 0), Vec::new())) };
}

/// `each_shard` of a monitoring view (reading the registry only): while a node cannot be
/// reached, `Err` with the error's message instead of the query failing. A node that could not
/// be reached in a statement is not tried again by the statement's other calls (one per
/// distributed view or table): a table with a shard there gets the same error at once. Where a
/// host drops packets rather than refusing them, each try waits up to
/// `citus.node_connection_timeout`.
fn each_shard_for_monitoring(
    source: &DistributedSource,
    tables: &[&str],
    call: impl FnOnce(&ShardArgs) -> String,
) -> EvResult<Result<Vec<String>, String>> {
    let statement = crate::pg::statement_key();
    let known: Vec<(String, i32, String)> = UNREACHABLE.with_borrow(|(key, nodes)| {
        if *key != statement {
            return Vec::new();
        }
        nodes
            .iter()
            .map(|n| (n.host.clone(), n.port, n.message.clone()))
            .collect()
    });
    for (host, port, message) in known {
        if distributed::placed_on(source.relid, &host, port)? {
            pgrx::debug1!(
                "node {host}:{port} could not be reached earlier in this statement: not tried again"
            );
            return Ok(Err(message));
        }
    }
    let answers = crate::pg::subtransaction::unless_failed(unreachable_node, || {
        each_shard(source, tables, Registry::Read, call)
    })?;
    if let Err(message) = &answers {
        // Remembered when the error names its node (a node shutting down is not named).
        if let Some((host, port)) = eventview_core::citus_errors::remote_node_named(message) {
            UNREACHABLE.with_borrow_mut(|(key, nodes)| {
                if *key != statement {
                    *key = statement;
                    nodes.clear();
                }
                nodes.push(UnreachableNode {
                    host,
                    port,
                    message: message.clone(),
                });
            });
        }
    }
    Ok(answers)
}

/// An error of a node that cannot be reached: a connection that failed or was refused (Citus
/// reports those as 08006), or a node shutting down (57P01 to 57P03, which reach a session
/// only from another node: its own shutdown ends it).
fn unreachable_node(code: PgSqlErrorCode) -> bool {
    matches!(
        code,
        PgSqlErrorCode::ERRCODE_CONNECTION_EXCEPTION
            | PgSqlErrorCode::ERRCODE_CONNECTION_DOES_NOT_EXIST
            | PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE
            | PgSqlErrorCode::ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION
            | PgSqlErrorCode::ERRCODE_SQLSERVER_REJECTED_ESTABLISHMENT_OF_SQLCONNECTION
            | PgSqlErrorCode::ERRCODE_ADMIN_SHUTDOWN
            | PgSqlErrorCode::ERRCODE_CRASH_SHUTDOWN
            | PgSqlErrorCode::ERRCODE_CANNOT_CONNECT_NOW
    )
}

/// On a shard's node: `eventview.views`' figures of the view keeping the groups shard
/// co-located with registry shard `registry_shard` (`{"pending_changes": null}` when there is
/// none on this node yet).
pub fn shard_view_stats(registry_shard: &str, shards: &str) -> EvResult<String> {
    with_shard_access(|| {
        let (_, names) = mapped_shards(registry_shard, shards)?;
        distributed::shard_view_figures(&names[0])
    })
}

/// `eventview.observed_fields` of distributed event table `relid`: every shard's observed
/// paths, as a JSON array of rows (the caller adds them up per path and JSON type). Read on
/// every shard's node without the table's row lock and without writing. While a node cannot
/// be reached, the table has no rows (and a WARNING says why): the reachable shards' counts
/// alone would be wrong ones, and the other tables' rows are still shown.
pub fn observed(relid: pg_sys::Oid) -> EvResult<String> {
    let Some(source) = distributed_source(relid)? else {
        return Ok("[]".into());
    };
    let table_sql = source.table_sql()?;
    let answers = each_shard_for_monitoring(&source, &[&table_sql], |a| {
        format!("eventview._shard_observed({}, {})", a.shard, a.shards)
    })?;
    let answers = match answers {
        Ok(answers) => answers,
        Err(message) => {
            pgrx::warning!(
                "the observed fields of event table {} are not shown: {message}",
                relation::regclass_text(relid)?
            );
            return Ok("[]".into());
        }
    };
    let mut rows = Vec::new();
    for answer in answers {
        rows.extend(parse_changes(&answer)?);
    }
    Ok(serde_json::Value::Array(rows).to_string())
}

/// On a shard's node: the observed paths of the event table shard co-located with registry
/// shard `registry_shard`, as a JSON array of rows of `eventview._observed`.
pub fn shard_observed(registry_shard: &str, shards: &str) -> EvResult<String> {
    with_shard_access(|| {
        let (_, names) = mapped_shards(registry_shard, shards)?;
        let relid = relation::resolve(&names[0])?;
        let Some(source) = catalog::source_by_relid(relid)? else {
            return Ok("[]".into());
        };
        distributed::shard_observed(source.source_id)
    })
}

/// `run_maintenance`'s work on the shards of distributed event table `relid` (one whose owner
/// the caller acts as; `run_maintenance` calls it for each such table): on every shard's node,
/// the shard's field observer moves on and its changelog is pruned of what every view of the
/// shard has applied. Returns the records pruned.
pub fn maintain_shards(relid: pg_sys::Oid) -> EvResult<i64> {
    let Some(source) = distributed_source(relid)? else {
        return Ok(0);
    };
    if !privileges::caller_acts_as(privileges::table_owner(relid)?) {
        return Ok(0);
    }
    let table_sql = source.table_sql()?;
    let answers = each_shard(&source, &[&table_sql], Registry::Filled, |a| {
        format!(
            "eventview._maintain_shard({}, {}, {})",
            a.shard, a.shards, a.delta_retention
        )
    })?;
    let mut pruned = 0;
    let mut drift = Vec::new();
    for answer in answers {
        let answer: serde_json::Value = serde_json::from_str(&answer)
            .map_err(|e| internal(format!("a shard's maintenance answered {answer}: {e}")))?;
        pruned += answer["pruned"].as_i64().unwrap_or(0);
        if let Some(rows) = answer["drift"].as_array() {
            drift.extend(rows.iter().cloned());
        }
    }
    merge_drift(relid, drift)?;
    Ok(pruned)
}

/// On a shard's node: the drift that observers of the event table shard `relid` recorded and
/// no coordinator has taken yet, taken (`distributed::take_shard_drift`).
fn drift_of_shard(relid: pg_sys::Oid) -> EvResult<Vec<serde_json::Value>> {
    parse_changes(&distributed::take_shard_drift(relid)?)
}

/// On the coordinator: the drift the shards of distributed event table `relid` recorded, each
/// change once in `eventview.drift` (a change every shard's observer saw, as a path appearing,
/// once, at the first detection; one already there is not added again).
fn merge_drift(relid: pg_sys::Oid, rows: Vec<serde_json::Value>) -> EvResult<()> {
    if rows.is_empty() {
        return Ok(());
    }
    distributed::merge_drift(relid, &serde_json::Value::Array(rows).to_string())
}

/// On a shard's node: the field observer of the event table shard co-located with registry
/// shard `registry_shard` moves on, and its changelog is pruned; returns `{"pruned": <records
/// pruned>, "drift": [<the drift rows no coordinator has taken yet>]}` (`drift_of_shard`).
pub fn maintain_shard(
    registry_shard: &str,
    shards: &str,
    delta_retention: Interval,
) -> EvResult<String> {
    with_shard_access(|| {
        let (shard_id, names) = mapped_shards(registry_shard, shards)?;
        let (relid, _) = capture_shard(shard_id, &names[0], delta_retention)?;
        let Some(source) = catalog::source_by_relid(relid)? else {
            return Ok("{}".into());
        };
        crate::observer::observe(&source)?;
        let pruned = spi::one::<i64>("SELECT eventview.prune($1)", &[names[0].as_str().into()])?
            .unwrap_or(0);
        Ok(serde_json::json!({"pruned": pruned, "drift": drift_of_shard(relid)?}).to_string())
    })
}

/// `action` (refresh, rebuild, drop) of `view` by its owner (a member of the owner's role); a drop also
/// by the owner of its event table, as for a view of this node.
fn require_owner(view: &DistributedView, action: &str) -> EvResult<()> {
    if privileges::caller_acts_as(view.owner)
        || (action == "drop"
            && privileges::caller_acts_as(privileges::table_owner(view.source.relid)?))
    {
        return Ok(());
    }
    Err(EvError::new(
        PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
        format!(
            "must be the owner of view {} to {action} it",
            relation::regclass_text(view.relid)?
        ),
    )
    .with_hint("Ask its owner, or a member of the owner's role."))
}

/// `drop_view` of a view over a distributed event table: every shard's view, the partial
/// groups, the user relation and the catalog row.
pub fn drop_view(view: &DistributedView) -> EvResult<()> {
    require_owner(view, "drop")?;
    views::require_no_dependents(view.relid, "view")?;
    // The DROP fires eventview._follow_drop, which forgets the view; forgotten here again in
    // case event triggers did not fire (session_replication_role = replica).
    // As the extension owner: the owner of the event table may drop the view of another role.
    // (Citus made the relation on the coordinator only, and drops it there.)
    let user_view = relation::qualified(view.relid)?;
    spi::run_all(&[format!("DROP VIEW {user_view}")])?;
    if distributed::view_exists(view.view_id)? {
        forget_view(view)?;
    }
    Ok(())
}

/// What a view over a distributed event table has besides its user relation: every shard's view
/// on its node, its catalog row, its partial groups and merged groups (with the user relation,
/// when that is still there: its event table was dropped).
fn forget_view(view: &DistributedView) -> EvResult<()> {
    on_every_shard(&view.source, &[&view.groups], Registry::AsItIs, |a| {
        format!("eventview._detach_shard_view({}, {})", a.shard, a.shards)
    })?;
    let (_, definition) = definition_of(view)?;
    let values = sql_for(&definition, view.view_id, "", None).merged_values_tables();
    distributed::delete_view(view.view_id)?;
    spi::run_all(&[
        format!("DROP TABLE IF EXISTS {} CASCADE", view.groups),
        format!(
            "DROP TABLE IF EXISTS {} CASCADE",
            names::view_data(view.view_id)
        ),
    ])?;
    spi::run_all(
        &values
            .into_iter()
            .map(|table| format!("DROP TABLE IF EXISTS {table}"))
            .collect::<Vec<_>>(),
    )
}

/// After a DROP took relation `relid` (called by `eventview._follow_drop`): a view over a
/// distributed event table is forgotten (`forget_view`), and so is a distributed event table,
/// with its views and its shard registry (Citus drops its shards, whose nodes forget them).
pub fn forget_dropped(relid: pg_sys::Oid) -> EvResult<()> {
    if let Some(view) = distributed_view(relid)? {
        return forget_view(&view);
    }
    let Some(source) = distributed_source(relid)? else {
        return Ok(());
    };
    for view in views_of(relid)? {
        forget_view(&view)?;
    }
    forget_source(&source)
}

/// The views over distributed event table `relid`, oldest first.
fn views_of(relid: pg_sys::Oid) -> EvResult<Vec<DistributedView>> {
    let mut views = Vec::new();
    for relid in distributed::views_of(relid)? {
        views.extend(distributed_view(relid)?);
    }
    Ok(views)
}

/// A distributed event table's shard registry and catalog row.
fn forget_source(source: &DistributedSource) -> EvResult<()> {
    distributed::delete_source(source.relid)?;
    spi::run_all(&[format!("DROP TABLE IF EXISTS {}", source.shards)])
}

/// `drop_event_table` of a distributed event table: its views when `cascade` (2BP01
/// otherwise), then the table (Citus drops its shards, whose nodes forget them as event
/// tables), the registry and the catalog row.
pub fn drop_event_table(source: &DistributedSource, cascade: bool) -> EvResult<()> {
    privileges::require_table_owner(source.relid, "drop")?;
    distributed::lock_source(source.relid, SourceLock::Drops)?;
    let views = views_of(source.relid)?;
    if !views.is_empty() && !cascade {
        let names = views
            .iter()
            .map(|v| relation::regclass_text(v.relid))
            .collect::<EvResult<Vec<_>>>()?
            .join(", ");
        return Err(EvError::new(
            PgSqlErrorCode::ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
            format!(
                "cannot drop event table {} because views read it",
                relation::regclass_text(source.relid)?
            ),
        )
        .with_detail(format!("Views reading it: {names}."))
        .with_hint("Drop the views first, or call drop_event_table with cascade => true."));
    }
    for view in &views {
        drop_view(view)?;
    }
    views::require_no_dependents(source.relid, "event table")?;
    forget_source(source)?;
    // As the extension owner, as the rest of this transaction's work on the shards (Citus
    // refuses a placement one role changed to another role in the same transaction); the
    // caller's right to drop it was checked above.
    let table_sql = source.table_sql()?;
    spi::run_all(&[format!("DROP TABLE {table_sql}")])
}
