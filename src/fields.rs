//! Logical fields: one name across event types and versions (`define_field`).

use crate::catalog;
use crate::errors::{EvError, EvResult};
use eventview_core::definition::{is_valid_field_name, FieldRef, SqlType};
use eventview_core::jsonpath;

pub struct FieldDeclaration<'a> {
    pub source: &'a str,
    pub field: &'a str,
    pub path: &'a str,
    pub event_type: Option<&'a str>,
    pub version: Option<i32>,
    pub type_name: &'a str,
}

pub fn define_field(d: FieldDeclaration) -> EvResult<()> {
    let source = catalog::source_by_name(d.source)?;
    crate::privileges::require_table_owner(source.relid, "declare fields of")?;
    catalog::lock_source(&source, catalog::SourceLock::Redeclares)?;
    if !is_valid_field_name(d.field) {
        return Err(
            EvError::invalid(format!("invalid field name \"{}\"", d.field)).with_hint(
                "A logical field name matches [a-z_][a-z0-9_]* and has at most 63 bytes.",
            ),
        );
    }
    if eventview_core::definition::Envelope::from_name(d.field).is_some() {
        return Err(EvError::invalid(format!(
            "invalid field name \"{}\": it is an envelope column",
            d.field
        )));
    }
    jsonpath::plan(d.path).map_err(|e| {
        EvError::invalid(format!(
            "invalid JSONPath \"{}\" for field \"{}\": {}",
            d.path, d.field, e.0
        ))
    })?;
    let sql_type = SqlType::parse_declared(d.type_name).ok_or_else(|| {
        EvError::invalid(format!(
            "invalid type \"{}\" for field \"{}\"",
            d.type_name, d.field
        ))
        .with_hint("Use text, numeric, bigint, double precision, boolean, timestamptz or jsonb.")
    })?;
    if matches!(d.event_type, Some("")) {
        return Err(EvError::invalid("invalid event_type: it must not be empty")
            .with_hint("Pass NULL for any type."));
    }
    if matches!(d.version, Some(v) if v < 1) {
        return Err(EvError::invalid("invalid version: it must be 1 or more")
            .with_hint("Pass NULL for any version."));
    }
    let existing = catalog::fields_of_source(source.source_id)?;
    let current = existing.iter().find(|f| f.name == d.field);
    // Every declaration of a field has one type. A new declaration must take it; declaring an
    // existing one again with another type changes the field's type, every declaration's, while
    // no view reads the field (there is no call that removes a declaration, so this is how a
    // field of several declarations is retyped).
    let retyped = current.filter(|f| f.sql_type != sql_type);
    if let Some(f) = retyped {
        let redeclares = f
            .variants
            .iter()
            .any(|v| v.event_type.as_deref() == d.event_type && v.version == d.version);
        if !redeclares {
            return Err(EvError::invalid(format!(
                "field \"{}\" is declared {}, not {}",
                d.field,
                f.sql_type.name(),
                sql_type.name()
            ))
            .with_hint("Every declaration of one logical field has the same type. To change it, declare one of the field's declarations again with the new type."));
        }
    }
    let readers = views_reading(source.source_id, d.field)?;
    if retyped.is_some() && !readers.is_empty() {
        return Err(EvError::invalid(format!(
            "cannot change the type of field \"{}\" while views read it: {}",
            d.field,
            readers.join(", ")
        ))
        .with_hint("Drop those views first, or declare a new field name."));
    }
    if let Some(f) = retyped.filter(|f| f.variants.len() > 1) {
        catalog::retype_field(source.source_id, d.field, sql_type.name())?;
        pgrx::notice!(
            "field \"{}\" is now {} in all its {} declarations",
            d.field,
            sql_type.name(),
            f.variants.len()
        );
    }
    let canonical_type = sql_type.name();
    catalog::upsert_field(
        source.source_id,
        d.field,
        d.path,
        d.event_type,
        d.version,
        canonical_type,
    )?;
    if !readers.is_empty() {
        pgrx::notice!(
            "field \"{}\" is read by {}: changes from now on use the new declaration; call eventview.rebuild() to recompute what they already hold",
            d.field,
            readers.join(", ")
        );
        let note = format!(
            "field \"{}\" was redeclared; rebuild to apply it to past events",
            d.field
        );
        for name in &readers {
            let view = catalog::view_by_name(name, false)?;
            // A rollup follows its source's rebuild (which writes the recomputed groups' changes);
            // its own realtime reads compute the source's pending changes, with the new paths.
            if view.source_view.is_none() {
                catalog::set_rebuild_note(view.view_id, Some(&note))?;
            }
            crate::view_objects::install_user_view(&view)?;
        }
    }
    Ok(())
}

/// Names of the views of a source that reference the logical field `name`.
fn views_reading(source_id: i32, name: &str) -> EvResult<Vec<String>> {
    let mut out = Vec::new();
    let mut reading = Vec::new();
    // Oldest first: a rollup comes after the view it reads, and reads the field when that view
    // does (its realtime reads compute that view's pending changes).
    for (view_id, relid) in catalog::views_of_source(source_id)? {
        let Some(view) = catalog::view_by_relid(relid, false)? else {
            continue;
        };
        let reads = view
            .definition
            .references()
            .any(|r| matches!(r, FieldRef::Logical(f) if f.name == name))
            || view
                .source_view
                .as_ref()
                .is_some_and(|s| reading.contains(&s.view_id));
        if reads {
            reading.push(view_id);
            out.push(crate::relation::regclass_text(relid)?);
        }
    }
    Ok(out)
}
