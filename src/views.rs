//! Incremental views: creating (storage, the user relation, first population), dropping and
//! altering them. Refreshing lives in `refresh`.

use crate::catalog;
use crate::citus;
use crate::errors::{EvError, EvResult};
use crate::pg::roles;
use crate::pg::spi;
use crate::privileges;
use crate::refresh;
use crate::relation;
use crate::view_objects;
use eventview_core::definition::{parse_definition, DefinitionInput, TypePolicy};
use eventview_core::sqlgen::{self, Mode, Reads, ValuesInRow, ViewSql};
use eventview_core::{names, quote};
use pgrx::datum::Interval;
use pgrx::prelude::*;

pub struct CreateViewArgs<'a> {
    pub name: &'a str,
    pub source: &'a str,
    pub group_by: &'a str,
    pub measures: &'a str,
    pub event_types: Option<Vec<Option<String>>>,
    pub time_bucket: Option<Interval>,
    pub filter: Option<&'a str>,
    pub realtime: bool,
    pub on_type_error: &'a str,
    pub time_zone: Option<&'a str>,
    pub unnest: Option<&'a str>,
    /// The storage table to keep the groups in, made by someone else: a shard of a distributed
    /// view's partial groups (`citus`). None makes the view's own.
    pub data_table: Option<&'a str>,
}

/// Creates the relation users read, named `name`, in the caller's name (read-only, over the
/// stored groups; a realtime view's is replaced once it is filled); returns its oid.
fn create_user_relation(sql: &ViewSql, name: &str) -> EvResult<pg_sys::Oid> {
    let user_view = relation::qualified_for_create(name)?;
    // Over this node's storage (see `replace_user_view`).
    crate::pg::node_local::on_this_node_only(|| {
        roles::as_caller(|| {
            spi::run_all(&[
                sql.create_user_view(&user_view, Reads::Stored),
                ViewSql::read_only_trigger(&user_view),
            ])
        })
    })?;
    relation::created(&user_view)
}

fn check_time_bucket(bucket: Interval) -> EvResult<()> {
    let ok = spi::one::<bool>(
        "SELECT $1 > interval '0' AND extract(year FROM $1) = 0 AND extract(month FROM $1) = 0",
        &[bucket.into()],
    )?;
    if ok != Some(true) {
        return Err(EvError::invalid("invalid time_bucket: it must be a positive interval without months or years")
            .with_hint("Buckets are fixed-width (date_bin): use days, hours, minutes or seconds, such as '1 day' or '15 minutes'."));
    }
    // Buckets are aligned to 2000-01-01 UTC: the bucket of an event before it starts up to one
    // width earlier, which past about 4,700 years leaves the range of timestamptz (and every
    // refresh would fail on such an event).
    let within = spi::one::<bool>("SELECT $1 <= interval '36525 days'", &[bucket.into()])?;
    if within != Some(true) {
        return Err(EvError::invalid("invalid time_bucket: it must be at most 36525 days (100 years) wide")
            .with_hint("Buckets start at multiples of their width from 2000-01-01 (UTC, or local time with time_zone), so the bucket of an event before 2000 may start up to one width earlier: for wider buckets, before the earliest timestamp PostgreSQL can hold."));
    }
    Ok(())
}

/// The name `pg_timezone_names` gives the time zone `zone` (matched without regard to case, as
/// PostgreSQL matches zone names); 22023 for a name it does not list (an abbreviation such as
/// EST is listed only where it is also a zone; a POSIX offset such as '+02' is not a zone).
fn time_zone_named(zone: &str) -> EvResult<String> {
    let found = spi::one::<String>(
        "SELECT name FROM pg_catalog.pg_timezone_names
         WHERE pg_catalog.lower(name) OPERATOR(pg_catalog.=) pg_catalog.lower($1)
         ORDER BY name OPERATOR(pg_catalog.=) $1 DESC, name LIMIT 1",
        &[zone.into()],
    )?;
    found.ok_or_else(|| {
        EvError::invalid(format!(
            "invalid time_zone: {} is not a time zone of pg_timezone_names",
            quote::literal(zone)
        ))
        .with_hint("Name a zone, such as 'Europe/Berlin' or 'America/New_York': SELECT name FROM pg_timezone_names lists them.")
    })
}

pub fn create_view(args: CreateViewArgs) -> EvResult<pg_sys::Oid> {
    if spi::uses_transaction_snapshot() {
        // The view reads the existing events with the transaction's snapshot, taken before
        // anything here could keep prune off the table: a prune committed since may have
        // deleted changes the view needs (applied by the others, committed after the snapshot).
        return Err(EvError::new(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("create_view needs a READ COMMITTED transaction, not {}", isolation_level()?),
        )
        .with_hint("It reads the events already in the table from a snapshot taken after it holds off pruning. Run it in a READ COMMITTED transaction."));
    }
    relation::refuse_temporary(&relation::qualified_for_create(args.name)?, "a view")?;
    // A source that is an incremental view makes a rollup of it.
    if let Some(source_view) = catalog::view_id_named(args.source)? {
        return create_rollup(&args, source_view);
    }
    let source = catalog::source_by_name(args.source);
    if source
        .as_ref()
        .is_err_and(|e| e.code == PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED)
    {
        // Refused as a distributed event table: a view over it is made there.
        if let Some(distributed) = citus::distributed_source_named(args.source)? {
            return citus::create_view(&args, &distributed);
        }
    }
    let source = source?;
    privileges::require_select(source.relid)?;
    privileges::require_no_row_security(roles::caller(), source.relid)?;
    catalog::lock_source(&source, catalog::SourceLock::AddsRows)?;
    // Before the snapshot the view starts from: prune must not delete what it will still need.
    catalog::hold_off_prune(&source)?;
    let fields = catalog::fields_of_source(source.source_id)?;
    let time_zone = match args.time_zone {
        Some(zone) if args.time_bucket.is_some() => Some(time_zone_named(zone)?),
        other => other.map(str::to_string),
    };
    let definition = parse_definition(&DefinitionInput {
        fields: &fields,
        group_by: args.group_by,
        measures: args.measures,
        event_types: args.event_types.clone(),
        bucketed: args.time_bucket.is_some(),
        time_zone: time_zone.as_deref(),
        unnest: args.unnest,
        filter: args.filter,
        on_type_error: args.on_type_error,
    })?;
    if let Some(b) = args.time_bucket {
        check_time_bucket(b)?;
    }
    let view_id = catalog::next_view_id()?;
    let sql = ViewSql {
        def: &definition,
        view_id,
        source_id: source.source_id,
        source_scan: source.scan_sql.clone(),
        // (Its first apply is a full one, which writes the multisets in any case.)
        log_extremes: false,
        feeds_rollups: false,
        bucket_width: None,
        rollup_source: None,
        data_table: args.data_table.map(str::to_string),
        values_in_row: view_objects::values_in_row(args.data_table.is_some(), args.realtime),
    };
    // Storage lives in schema eventview (created by the extension owner) and belongs to the
    // view's owner, who refreshes it; the user relation is created in the caller's name. The
    // owner reads the source's changelog at refresh.
    let owner = roles::caller();
    let owner_ident = privileges::role_ident(owner)?;
    spi::run_all(&sql.create_storage())?;
    spi::run_all(
        &sql.storage_tables()
            .iter()
            .flat_map(|t| sqlgen::storage_grants(t, &owner_ident))
            .collect::<Vec<_>>(),
    )?;
    spi::run_all(&[format!(
        "GRANT SELECT ON {} TO {owner_ident}",
        names::changelog(source.source_id)
    )])?;
    let relid = create_user_relation(&sql, args.name)?;
    let types: Option<Vec<String>> = definition.event_types.clone();
    catalog::insert_view(catalog::NewView {
        view_id,
        relid,
        source_id: source.source_id,
        group_by: args.group_by,
        measures: args.measures,
        event_types: types,
        time_bucket: args.time_bucket,
        time_zone: definition.time_zone.as_deref(),
        unnest: definition.unnest.as_ref().map(|u| u.display()),
        filter: args.filter,
        on_type_error: definition.on_type_error.name(),
        realtime: args.realtime,
        owner,
        source_view: None,
        data_table: args.data_table,
    })?;
    populate(relid, args.realtime)
}

/// Fills a view just catalogued from scratch (its first apply, a full one) and installs the
/// relation it is read through; returns that relation.
fn populate(relid: pg_sys::Oid, realtime: bool) -> EvResult<pg_sys::Oid> {
    let view = catalog::view_by_relid(relid, true)?
        .ok_or_else(|| EvError::invalid("view vanished during creation"))?;
    // Storage is private to the owner; readers are granted on the user relation.
    spi::run_all(&[format!(
        "REVOKE ALL ON {} FROM PUBLIC",
        view_objects::storage_of(&view)
    )])?;
    refresh::apply(&view, Mode::Full, None, None)?;
    if realtime {
        view_objects::install_user_view(&view)?;
    }
    Ok(relid)
}

/// Creates a rollup of the view with id `source_view_id` (API.md section 9): group columns and
/// measures name the source's, each measure re-aggregated by its kind, buckets made of the
/// source's buckets (a whole multiple of its width, in its time zone). The source's row is locked
/// (a refresh of it waits: from here on its applies write the group changes the rollup reads)
/// and the source refreshed first when the caller owns it; the rollup starts from the source's
/// stored groups, under one snapshot with its position in the source's group changelog.
fn create_rollup(args: &CreateViewArgs, source_view_id: i32) -> EvResult<pg_sys::Oid> {
    let refuse = |what: &str| {
        Err(EvError::invalid(format!("a rollup takes no {what}"))
            .with_hint("A rollup reads the groups of its source view: event types, unnest and JSONPaths belong to the source's definition."))
    };
    if args.event_types.is_some() {
        return refuse("event_types");
    }
    if args.unnest.is_some() {
        return refuse("unnest");
    }
    let source_relid = catalog::view_relid(source_view_id)?;
    let source_ref = catalog::view_ref(source_relid, args.source)?;
    privileges::require_select(source_relid)?;
    privileges::require_select(source_ref.source_relid)?;
    privileges::require_no_row_security(roles::caller(), source_ref.source_relid)?;
    privileges::require_rollup_owner_within(source_relid, source_ref.owner)?;
    // As any view being created: a field declaration or a drop of the event table waits.
    let event_table = catalog::source_by_relid(source_ref.source_relid)?
        .ok_or_else(|| catalog::event_table_gone(source_relid))?;
    catalog::lock_source(&event_table, catalog::SourceLock::AddsRows)?;
    // Lock order: the source's row, then the rollup's (as refreshes take them).
    if privileges::caller_acts_as(source_ref.owner) {
        refresh::refresh_with_sources(source_relid, args.source)?;
    }
    let source = catalog::lock_view_by_relid(source_relid, args.source)?;
    if let Some(zone) = args.time_zone {
        let zone = time_zone_named(zone)?;
        if args.time_bucket.is_none()
            || source.definition.time_zone.as_deref() != Some(zone.as_str())
        {
            return Err(EvError::invalid(format!(
                "invalid time_zone for a rollup: {} is not the time zone of its source",
                quote::literal(&zone)
            ))
            .with_hint(
                "A rollup buckets in the time zone of its source view; leave time_zone out.",
            ));
        }
    }
    if let Some(width) = args.time_bucket {
        check_time_bucket(width)?;
        require_whole_multiple(width, source.time_bucket)?;
    }
    let definition =
        eventview_core::definition::parse_rollup(&eventview_core::definition::RollupInput {
            source: &source.definition,
            group_by: args.group_by,
            measures: args.measures,
            filter: args.filter,
            bucketed: args.time_bucket.is_some(),
        })?;
    let view_id = catalog::next_view_id()?;
    let owner = roles::caller();
    let owner_ident = privileges::role_ident(owner)?;
    let source_sql = view_objects::sql_of(&source);
    let sql = ViewSql {
        def: &definition,
        view_id,
        source_id: source.source.source_id,
        source_scan: source.source.scan_sql.clone(),
        log_extremes: false,
        feeds_rollups: false,
        bucket_width: None,
        rollup_source: None,
        data_table: None,
        values_in_row: ValuesInRow::No,
    };
    spi::run_all(&sql.create_storage())?;
    let mut grants: Vec<String> = sql
        .storage_tables()
        .iter()
        .flat_map(|t| sqlgen::storage_grants(t, &owner_ident))
        .collect();
    if !source.feeds_rollups {
        spi::run_all(&source_sql.create_changes())?;
        let source_owner = privileges::role_ident(source.owner)?;
        grants.extend(sqlgen::storage_grants(
            &source_sql.changes_table(),
            &source_owner,
        ));
    }
    // An update of the source's row, even when already set: a refresh of the source waiting for
    // the row sees it, and one under REPEATABLE READ fails to serialize instead of going on
    // without writing group changes.
    catalog::set_feeds_rollups(source.view_id, true)?;
    // The rollup's owner reads its source's group changes and stored groups, and (realtime
    // reads) the group changes of every level below and the event changelog.
    let mut read = source_sql.storage_tables();
    read.push(source_sql.changes_table());
    read.extend(
        catalog::view_ids_below(source.view_id)?
            .into_iter()
            .map(names::view_changes),
    );
    read.push(names::changelog(source.source.source_id));
    grants.extend(
        read.iter()
            .map(|t| format!("GRANT SELECT ON {t} TO {owner_ident}")),
    );
    spi::run_all(&grants)?;
    let relid = create_user_relation(&sql, args.name)?;
    catalog::insert_view(catalog::NewView {
        view_id,
        relid,
        source_id: source.source.source_id,
        group_by: args.group_by,
        measures: args.measures,
        event_types: None,
        time_bucket: args.time_bucket,
        time_zone: definition.time_zone.as_deref(),
        unnest: None,
        filter: args.filter,
        on_type_error: definition.on_type_error.name(),
        realtime: args.realtime,
        owner,
        source_view: Some(source.view_id),
        data_table: None,
    })?;
    // The source's multisets hold every value once its logs are merged (and its sketches are
    // storage columns, for a view made by an earlier release).
    view_objects::create_missing_objects(&source, &source_sql)?;
    view_objects::spill_values_in_row(&source)?;
    view_objects::merge_logs(&source)?;
    populate(relid, args.realtime)
}

/// A rollup's time_bucket is a whole multiple of its source's (each of its buckets is made of
/// whole buckets of the source); 22023 otherwise, or when the source has none.
fn require_whole_multiple(width: Interval, source_width: Option<Interval>) -> EvResult<()> {
    let Some(source_width) = source_width else {
        return Err(EvError::invalid(
            "a rollup of a view without time_bucket cannot have a time_bucket",
        )
        .with_hint("A rollup's buckets are made of its source's buckets: give the source a time_bucket, or leave time_bucket out of the rollup."));
    };
    let whole = spi::one::<bool>(
        "SELECT pg_catalog.date_part('epoch', $1) OPERATOR(pg_catalog.>=) pg_catalog.date_part('epoch', $2)
            AND pg_catalog.mod(pg_catalog.date_part('epoch', $1)::numeric, pg_catalog.date_part('epoch', $2)::numeric) OPERATOR(pg_catalog.=) 0",
        &[width.into(), source_width.into()],
    )?;
    if whole == Some(true) {
        return Ok(());
    }
    Err(EvError::invalid(format!(
        "invalid time_bucket for a rollup: {width} is not a whole multiple of its source's {source_width}"
    ))
    .with_hint("Each bucket of a rollup is made of whole buckets of its source: use a multiple of the source's width, such as '1 day' over '1 hour'."))
}

/// Refused (2BP01), naming them, while rollups read the view with id `view_id` (whose
/// relation is `relid`, or is gone: a plain DROP VIEW in progress).
fn require_no_rollups(view_id: i32, relid: pg_sys::Oid) -> EvResult<()> {
    let rollups = catalog::rollups_of(view_id)?;
    if rollups.is_empty() {
        return Ok(());
    }
    let exists = spi::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) $1)",
        &[relid.into()],
    )?;
    let name = match exists {
        Some(true) => relation::regclass_text(relid)?,
        _ => catalog::known_name(view_id)?.unwrap_or_else(|| format!("with id {view_id}")),
    };
    let names = rollups
        .iter()
        .map(|(_, r)| relation::regclass_text(*r))
        .collect::<EvResult<Vec<_>>>()?
        .join(", ");
    Err(EvError::new(
        PgSqlErrorCode::ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
        format!("cannot drop view {name} because rollups read it"),
    )
    .with_detail(format!("Rollups reading it: {names}."))
    .with_hint("Drop the rollups first (eventview.drop_view), then this view."))
}

/// Drops the view whose relation is `relid`; refused, naming them, while other objects depend on
/// that relation (never dropped with it: they may be anyone's).
pub fn drop_view_by_relid(relid: pg_sys::Oid) -> EvResult<()> {
    // Its row locked (a refresh in progress finishes first), its definition not loaded: a view
    // whose event table is gone is dropped all the same.
    // A rollup's sources first, as refreshes lock them.
    catalog::lock_sources_of_relid(relid)?;
    let view_id =
        catalog::lock_view_id(relid)?.ok_or_else(|| EvError::invalid("not an incremental view"))?;
    require_no_rollups(view_id, relid)?;
    // The relation first (storage cannot go while it reads it); eventview._follow_drop then
    // forgets the view, as after a plain DROP VIEW. Forgotten here again in case event triggers
    // did not fire (session_replication_role = replica), for this DROP or for the plain DROP
    // that already took the relation: a no-op otherwise.
    let names_it = spi::one::<bool>(
        "SELECT eventview._names_its_relation($1)",
        &[view_id.into()],
    )?;
    if names_it == Some(true) {
        require_no_dependents(relid, "view")?;
        spi::run_all(&[format!("DROP VIEW {}", relation::qualified(relid)?)])?;
    }
    forget_view(view_id)
}

/// Drops view `view_id` (relation `relid`) with every object that depends on its relation
/// (`DROP ... CASCADE`), then forgets it: `DROP EXTENSION pg_eventview CASCADE`.
pub fn drop_view_and_dependents(view_id: i32, relid: pg_sys::Oid) -> EvResult<()> {
    let names_it = spi::one::<bool>(
        "SELECT eventview._names_its_relation($1)",
        &[view_id.into()],
    )?;
    if names_it == Some(true) {
        spi::run_all(&[format!("DROP VIEW {} CASCADE", relation::qualified(relid)?)])?;
    }
    forget_view(view_id)
}

/// Forgets an incremental view whose relation is gone: its quarantine entries, its catalog
/// row, its storage, its owner's right to read the changelog when no other view of theirs
/// reads it, and its event table when that was dropped and no other view reads it. Run by
/// `eventview._follow_drop` after a DROP took the view's relation (drop_view's DROP VIEW too,
/// which runs it again: a no-op unless event triggers did not fire). As the extension owner.
pub fn forget_view(view_id: i32) -> EvResult<()> {
    // A rollup's sources first, as refreshes lock them: the rollups of its source are then
    // counted with no other one being made or dropped meanwhile.
    catalog::lock_sources_of(view_id)?;
    let below = catalog::view_ids_below(view_id)?;
    // A plain DROP VIEW of a view that rollups read is refused as drop_view refuses it (a DROP
    // that takes the rollups along forgets them first: eventview._follow_drop goes newest first).
    if let Some(relid) = catalog::view_relid_if_any(view_id)? {
        require_no_rollups(view_id, relid)?;
    }
    let Some(view) = catalog::delete_view(view_id)? else {
        return Ok(());
    };
    if let Some(source_view) = view.source_view {
        if catalog::rollups_of(source_view)?.is_empty() {
            // Its source writes no group changes any more.
            catalog::set_feeds_rollups(source_view, false)?;
            spi::run_all(&[format!(
                "DROP TABLE IF EXISTS {}",
                names::view_changes(source_view)
            )])?;
        }
        revoke_rollup_reads(&view, &below)?;
    }
    // CASCADE: storage is internal; what a role built on it (a view of its own) goes too,
    // rather than keep the view from being dropped (by the event table's owner among others).
    let drops: Vec<String> = catalog::storage_tables(view.view_id)?
        .iter()
        .map(|table| format!("DROP TABLE IF EXISTS {table} CASCADE"))
        .collect();
    spi::run_all(&drops)?;
    revoke_changelog_read_unless_needed(&view)?;
    // Its event table was dropped while the view read it (see eventview._follow_drop): the
    // table is forgotten with the last of its views.
    if catalog::dropped_source_unread(view.source_id, view.source_relid)? {
        crate::event_tables::forget_source(view.source_id)?;
    }
    Ok(())
}

/// A view given to another role (`ALTER VIEW ... OWNER TO`, followed by `eventview._follow_ddl`,
/// as the extension owner): the catalog's owner, as whom it refreshes, and its storage go to the
/// relation's new owner, as `create_view` gives them to its creator; its changelog rights follow
/// (`eventview._sync_changelog_readers`, which the trigger runs next, and the former owner's
/// read taken back here when no other view of theirs needs it). Refused, so that the ALTER
/// fails and nothing changes: with 42501 when the new owner may not read the event table as a
/// view's owner must (`create_view`'s checks: its quarantine shows them the table's events);
/// with 0A000 for a rollup or a view rollups read (the rights between them are their owners').
/// The trigger sees the owners differ on any ALTER of the view, so the messages say how to put
/// the recorded owner back.
pub fn follow_owner(view_id: i32) -> EvResult<()> {
    let Some((recorded, owner)) = catalog::lock_view_owners(view_id)? else {
        return Ok(());
    };
    let Some(view) = catalog::view_relations(view_id)?.filter(|_| recorded != owner) else {
        return Ok(());
    };
    let relid = catalog::view_relid_if_any(view_id)?.unwrap_or(pg_sys::InvalidOid);
    let name = relation::regclass_text(relid)?;
    let recorded_name = privileges::role_name(recorded)?;
    let give_back = format!(
        "Give it back (ALTER VIEW {name} OWNER TO {}), or create the view again as the new owner (eventview.create_view) and drop this one.",
        quote::ident(&recorded_name)
    );
    if view.in_rollup_chain {
        return Err(EvError::new(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "view {name} cannot be given to another role: it is a rollup or rollups read it"
            ),
        )
        .with_hint(format!(
            "The rights between a rollup and the view it reads are their owners'. {give_back}"
        )));
    }
    if view.source_relid != pg_sys::InvalidOid {
        let may_read = spi::one::<bool>(
            "SELECT pg_catalog.has_table_privilege($1, $2, 'SELECT')",
            &[owner.into(), view.source_relid.into()],
        )?;
        if may_read != Some(true) {
            return Err(EvError::new(
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                format!(
                    "view {name} cannot be given to role {}: it may not read event table {}",
                    privileges::role_name(owner)?,
                    relation::regclass_text(view.source_relid)?
                ),
            )
            .with_hint(format!(
                "A view's owner needs SELECT on its event table. {give_back}"
            )));
        }
        privileges::require_no_row_security(owner, view.source_relid)?;
    }
    let owner_ident = privileges::role_ident(owner)?;
    let grants: Vec<String> = catalog::storage_tables(view_id)?
        .iter()
        .flat_map(|t| sqlgen::storage_grants(t, &owner_ident))
        .collect();
    crate::pg::guc::with_setting(c"eventview.following_ddl", c"on", || spi::run_all(&grants))?;
    catalog::set_view_owner(view_id, owner)?;
    let former = catalog::ForgottenView {
        view_id,
        source_id: view.source_id,
        owner: recorded,
        owner_name: Some(recorded_name).filter(|n| !n.is_empty()),
        source_relid: view.source_relid,
        source_view: None,
    };
    revoke_changelog_read_unless_needed(&former)
}

/// The read of the changelog that `view`'s (former) owner was granted for it goes, unless they
/// still need it (`catalog::owner_still_reads_changelog`). The REVOKE fires
/// eventview._follow_ddl, which has nothing to add.
fn revoke_changelog_read_unless_needed(view: &catalog::ForgottenView) -> EvResult<()> {
    let Some(owner_name) = &view.owner_name else {
        return Ok(());
    };
    if catalog::owner_still_reads_changelog(view)? {
        return Ok(());
    }
    let revoke = format!(
        "REVOKE SELECT ON {} FROM {}",
        names::changelog(view.source_id),
        quote::ident(owner_name)
    );
    crate::pg::guc::with_setting(c"eventview.following_ddl", c"on", || {
        spi::run_all(&[revoke])
    })
}

/// What a forgotten rollup's owner was granted on the views below it (`below`) goes, except
/// where another rollup of theirs still reads (and on views they own).
fn revoke_rollup_reads(view: &catalog::ForgottenView, below: &[i32]) -> EvResult<()> {
    let Some(owner_name) = &view.owner_name else {
        return Ok(());
    };
    let still_read = catalog::views_read_by_rollups_of(view.owner)?;
    let mut revokes = Vec::new();
    for &id in below.iter().filter(|id| !still_read.contains(id)) {
        if catalog::view_owner(id)? == Some(view.owner) {
            continue;
        }
        for table in catalog::storage_tables(id)? {
            revokes.push(format!(
                "REVOKE SELECT ON {table} FROM {}",
                quote::ident(owner_name)
            ));
        }
    }
    crate::pg::guc::with_setting(c"eventview.following_ddl", c"on", || spi::run_all(&revokes))
}

/// No other object depends on the relation, a view or an event table (another view reads it, a
/// function's body, a materialized view): its DROP would fail with PostgreSQL's hint to use
/// DROP ... CASCADE, which drop_view and drop_event_table do not take (the objects may be
/// anyone's). Named here, with what to do. (The relation's own triggers and rules, and what is
/// dropped with it automatically, are not dependents.)
pub fn require_no_dependents(relid: pg_sys::Oid, kind: &str) -> EvResult<()> {
    let dependents = spi::one::<String>(
        "SELECT pg_catalog.string_agg(DISTINCT CASE WHEN d.classid = 'pg_catalog.pg_rewrite'::regclass
                                                   THEN pg_catalog.format('%s %s', CASE c.relkind WHEN 'm' THEN 'materialized view' ELSE 'view' END, r.ev_class::regclass)
                                                   ELSE pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid) END, ', ')
         FROM pg_catalog.pg_depend d
         LEFT JOIN pg_catalog.pg_rewrite r ON d.classid = 'pg_catalog.pg_rewrite'::regclass AND r.oid = d.objid
         LEFT JOIN pg_catalog.pg_class c ON c.oid = r.ev_class
         WHERE ((d.refclassid = 'pg_catalog.pg_class'::regclass AND d.refobjid = $1)
                -- A function taking its row type, a column or type of that type.
                OR (d.refclassid = 'pg_catalog.pg_type'::regclass
                    AND d.refobjid IN (SELECT t.oid FROM pg_catalog.pg_type t
                                       WHERE t.typrelid = $1 OR t.typelem IN (SELECT t2.oid FROM pg_catalog.pg_type t2 WHERE t2.typrelid = $1))))
           AND d.deptype = 'n'
           AND NOT (d.classid = 'pg_catalog.pg_rewrite'::regclass AND r.ev_class = $1)
           AND NOT (d.classid = 'pg_catalog.pg_trigger'::regclass
                    AND (SELECT t.tgrelid FROM pg_catalog.pg_trigger t WHERE t.oid = d.objid) = $1)
           AND NOT (d.classid = 'pg_catalog.pg_constraint'::regclass
                    AND (SELECT co.conrelid FROM pg_catalog.pg_constraint co WHERE co.oid = d.objid) = $1)
           AND NOT (d.classid = 'pg_catalog.pg_policy'::regclass
                    AND (SELECT po.polrelid FROM pg_catalog.pg_policy po WHERE po.oid = d.objid) = $1)
           AND NOT (d.classid = 'pg_catalog.pg_attrdef'::regclass
                    AND (SELECT ad.adrelid FROM pg_catalog.pg_attrdef ad WHERE ad.oid = d.objid) = $1)",
        &[relid.into()],
    )?;
    match dependents {
        None => Ok(()),
        Some(names) => Err(EvError::new(
            PgSqlErrorCode::ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
            format!(
                "cannot drop {kind} {} because other objects depend on it",
                relation::regclass_text(relid)?
            ),
        )
        .with_detail(format!("Depending on it: {names}."))
        .with_hint(format!("Drop those objects first, then drop this {kind}."))),
    }
}

/// Drops a view: by its owner, or by the owner of its event table (a view another role made
/// while it could read the table holds back the pruning of the table's changelog, and must not
/// outlive that role's access for good). Objects that depend on the view's relation are never
/// dropped with it (`require_no_dependents`).
pub fn drop_view(name: &str) -> EvResult<()> {
    // (The table's owner may have no USAGE on the schema of another role's view over it.)
    let view = catalog::view_ref(relation::resolve_without_usage(name)?, name)?;
    let by_table_owner =
        privileges::table_owner(view.source_relid).is_ok_and(privileges::caller_acts_as);
    if !by_table_owner {
        privileges::require_view_owner(view.relid, view.owner, "drop")?;
    }
    drop_view_by_relid(view.relid)
}

pub fn alter_view(name: &str, realtime: Option<bool>, on_type_error: Option<&str>) -> EvResult<()> {
    let unlocked = catalog::view_by_name(name, false)?;
    privileges::require_view_owner(unlocked.relid, unlocked.owner, "alter")?;
    let view = catalog::lock_view(&unlocked, name)?;
    if let Some(policy) = on_type_error {
        let policy: TypePolicy = TypePolicy::parse(policy)?;
        catalog::set_on_type_error(view.view_id, policy.name())?;
    }
    if let Some(realtime) = realtime {
        // Realtime reads use the min/max multisets: whatever the rows and the logs hold goes
        // in first (a realtime view's refreshes write the multisets directly).
        if realtime && !view.realtime {
            view_objects::spill_values_in_row(&view)?;
        }
        if realtime && catalog::extremes_logged(view.view_id)? > 0 {
            view_objects::merge_logs(&view)?;
        }
        catalog::set_realtime(view.view_id, realtime)?;
        view_objects::install_user_view(&view)?;
    }
    Ok(())
}

fn isolation_level() -> EvResult<String> {
    Ok(spi::one::<String>(
        "SELECT pg_catalog.current_setting('transaction_isolation')",
        &[],
    )?
    .unwrap_or_default())
}

/// Groups the view with id `view_id` holds now (`eventview.views.groups`, which everyone may
/// read): 0 without storage, NULL when its owner may not read it or made it something else than
/// a plain table. Counted as the view's owner, security-restricted: the storage is the owner's
/// table, and what a table's owner can attach to it (a rule that turns it into a view of their
/// functions, in PostgreSQL 15) must never run with the rights of whoever reads the catalog (a
/// superuser, the worker).
pub fn group_count(view_id: i32) -> EvResult<Option<i64>> {
    let storage = relation::extension_relid(&names::view_data_table(view_id));
    let owner = catalog::view_owner(view_id)?;
    let (Some(owner), true) = (owner, storage != pg_sys::InvalidOid) else {
        return Ok(Some(0));
    };
    // Counted only while the storage is a plain table without row-level security, checked under
    // the lock the count takes: a rule or a policy of its owner's could otherwise make every
    // read of eventview.views fail (their functions run as the owner, but may raise).
    crate::pg::locks::lock_for_reading(storage);
    // (From the relation cache, current once the lock is taken: a catalog query would read it
    // with the transaction's snapshot under REPEATABLE READ, older than what the count plans with.)
    let plain = crate::pg::relcache::is_plain_table_without_row_security(storage);
    if !plain {
        return Ok(None);
    }
    roles::as_role(owner, || {
        if spi::one::<bool>(
            "SELECT pg_catalog.has_table_privilege($1, 'SELECT')",
            &[storage.into()],
        )? != Some(true)
        {
            return Ok(None);
        }
        // ONLY: never a table the owner made inherit from the storage.
        spi::one_replanned::<i64>(
            &format!(
                "SELECT pg_catalog.count(*) FROM ONLY {}",
                names::view_data(view_id)
            ),
            &[],
        )
    })
}

/// What keeps the view with id `view_id` from being refreshed now, as its refresh would say:
/// its event table was dropped or altered (an envelope column dropped or retyped), or its owner
/// may no longer read it (`eventview.views.last_error`,
/// which everyone may read; only catalogs are read). None for an unknown view.
pub fn refresh_problem(view_id: i32) -> EvResult<Option<String>> {
    let row = catalog::view_table(view_id)?;
    let Some(catalog::ViewTable {
        relid: Some(relid),
        owner: Some(owner),
        source_relid: Some(source_relid),
        table_exists: Some(table_exists),
    }) = row
    else {
        return Ok(None);
    };
    if !table_exists {
        return Ok(Some(catalog::event_table_gone(relid).message));
    }
    if let Err(e) = privileges::require_owner_reads(relid, owner, source_relid) {
        return Ok(Some(e.message));
    }
    // As the refresh checks it (see refresh::apply).
    let table_owner = privileges::table_owner(source_relid)?;
    Ok(
        crate::envelope::require_intact_for(source_relid, table_owner, owner)
            .err()
            .map(|e| e.message),
    )
}
