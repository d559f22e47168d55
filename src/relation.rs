//! Relation names as users pass them ('events', 'shop.events', '"My Events"'): split and
//! case-folded by Postgres' own `parse_ident`, resolved through the caller's search_path.

use crate::errors::{EvError, EvResult};
use crate::pg::spi;
use eventview_core::quote;
use pgrx::prelude::*;

/// A new relation's quoted name, qualified with the schema Postgres would create it in (the
/// caller's current schema, for an unqualified name), so that the relation found after creating
/// it is the one created, not a temporary relation of the same name that search_path finds first.
pub fn qualified_for_create(name: &str) -> EvResult<String> {
    let parts = name_parts(name)?;
    let quoted = quoted(&parts);
    if parts.len() == 2 {
        return Ok(quoted);
    }
    let schema = crate::pg::roles::as_caller(|| {
        spi::one::<String>("SELECT pg_catalog.current_schema()::text", &[])
    })?;
    // No schema to create in: left unqualified, for CREATE to say so.
    Ok(match schema {
        Some(schema) => format!("{}.{quoted}", quote::ident(&schema)),
        None => quoted,
    })
}

/// 0A000 for a relation to be created as `qualified` (see `qualified_for_create`) in a temporary
/// schema: `what` (an event table, a view) has catalog entries and storage that outlive the
/// session.
pub fn refuse_temporary(qualified: &str, what: &str) -> EvResult<()> {
    let parts = quote::split_name(qualified).unwrap_or_default();
    match parts.first().filter(|_| parts.len() == 2) {
        Some(schema) if schema == "pg_temp" || schema.starts_with("pg_temp_") => Err(EvError::new(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("{what} cannot be temporary"),
        )
        .with_hint(
            "Its catalog entry and storage outlive the session: create it in a permanent schema.",
        )),
        _ => Ok(()),
    }
}

/// The relation a DDL statement just created under `qualified` (see `qualified_for_create`).
pub fn created(qualified: &str) -> EvResult<pg_sys::Oid> {
    crate::pg::roles::as_caller(|| {
        spi::one::<pg_sys::Oid>(
            "SELECT pg_catalog.to_regclass($1)::oid",
            &[qualified.into()],
        )
    })?
    .ok_or_else(|| EvError::undefined_table(qualified))
}

fn quoted(parts: &[String]) -> String {
    parts
        .iter()
        .map(|p| quote::ident(p))
        .collect::<Vec<_>>()
        .join(".")
}

/// A user-supplied name split into its parts (one or two), case-folded as Postgres does.
fn name_parts(name: &str) -> EvResult<Vec<String>> {
    if quote::malformed_name(name) {
        // As a cast to regclass says it (parse_ident would say 22023).
        return Err(EvError::new(PgSqlErrorCode::ERRCODE_INVALID_NAME, format!("invalid relation name \"{name}\""))
            .with_hint("Use name or schema.name, double-quoting a part that is not a plain lower-case identifier."));
    }
    let parts: Vec<String> =
        spi::one::<Vec<String>>("SELECT pg_catalog.parse_ident($1)", &[name.into()])?
            .unwrap_or_default();
    if parts.is_empty() || parts.len() > 2 {
        return Err(EvError::new(
            PgSqlErrorCode::ERRCODE_INVALID_NAME,
            format!("invalid relation name \"{name}\""),
        )
        .with_hint("Use name or schema.name."));
    }
    Ok(parts)
}

/// An existing relation, or 42P01. Resolved as the caller of the API call in progress, so a
/// `$user` entry in search_path means the caller.
pub fn resolve(name: &str) -> EvResult<pg_sys::Oid> {
    let quoted = quoted(&name_parts(name)?);
    crate::pg::roles::as_caller(|| {
        spi::one::<pg_sys::Oid>(
            "SELECT pg_catalog.to_regclass($1)::oid",
            &[quoted.as_str().into()],
        )
    })?
    .ok_or_else(|| EvError::undefined_table(name))
}

/// `resolve` for a call whose right to the relation does not come from its schema (drop_view by
/// the owner of the view's event table, who may have no USAGE on the schema of another role's
/// view): a qualified name is looked up in the catalog, which everyone may read, without the
/// caller's USAGE on its schema. An unqualified one goes through the caller's search_path.
pub fn resolve_without_usage(name: &str) -> EvResult<pg_sys::Oid> {
    let parts = name_parts(name)?;
    if parts.len() == 2 {
        let found = spi::one::<pg_sys::Oid>(
            "SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = $2",
            &[parts[0].as_str().into(), parts[1].as_str().into()],
        )?;
        if let Some(relid) = found {
            return Ok(relid);
        }
    }
    resolve(name)
}

/// `"schema"."name"` of a relation, for generated SQL that must not depend on search_path.
/// From the catalog caches: every refresh asks it for its event table.
pub fn qualified(relid: pg_sys::Oid) -> EvResult<String> {
    let (schema, name) = crate::pg::relcache::schema_and_name(relid)
        .ok_or_else(|| EvError::undefined_table(&relid.to_u32().to_string()))?;
    Ok(format!("{}.{}", quote::ident(&schema), quote::ident(&name)))
}

/// A relation's name as `regclass` prints it (qualified unless visible on search_path; inside
/// the extension's own statements search_path is pinned, so in practice qualified).
pub fn regclass_text(relid: pg_sys::Oid) -> EvResult<String> {
    Ok(spi::one::<String>("SELECT $1::regclass::text", &[relid.into()])?.unwrap_or_default())
}

/// A relation of the extension's schema (`_changes_1`), or InvalidOid when there is none.
pub fn extension_relid(name: &str) -> pg_sys::Oid {
    crate::pg::relcache::relid_in_schema(eventview_core::names::SCHEMA, name)
}

/// Before a view applies changes from an event table under REPEATABLE READ or SERIALIZABLE:
/// the table must not have been truncated (or rewritten by ALTER TABLE) since the transaction's
/// snapshot. Neither is MVCC-safe: the table would read as empty, the changes before it as
/// applied with nothing to add, and the TRUNCATE's own records, applied later, would take back
/// rows the views never had. (The relcache has the table's current file; `pg_class` read with
/// the snapshot has the file of its time.) Under READ COMMITTED each statement has a new
/// snapshot, taken once the table is locked.
///
/// Takes ACCESS SHARE on the table first (held to the end of the transaction, as the read that
/// follows would): a TRUNCATE not yet committed at this check would otherwise pass it, commit
/// while the reading statement waits for its lock, and leave that statement the new, empty file
/// under the old snapshot. Once the lock is granted, the relcache holds what the TRUNCATE left.
pub fn require_same_storage_as_snapshot(relid: pg_sys::Oid) -> EvResult<()> {
    if !spi::uses_transaction_snapshot() {
        return Ok(());
    }
    // Waiting for the lock takes in the invalidations of whatever held a conflicting one.
    crate::pg::locks::lock_for_reading(relid);
    let replaced = spi::one::<bool>(
        "SELECT pg_catalog.pg_relation_filenode($1::pg_catalog.regclass)
                IS DISTINCT FROM (SELECT relfilenode FROM pg_catalog.pg_class WHERE oid = $1)",
        &[relid.into()],
    )?;
    if replaced == Some(true) {
        return Err(EvError::new(
            PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
            format!(
                "event table {} was truncated or rewritten after this transaction's snapshot was taken",
                regclass_text(relid)?
            ),
        )
        .with_hint("Retry in a new transaction."));
    }
    Ok(())
}
