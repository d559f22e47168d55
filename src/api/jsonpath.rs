//! JSONPaths that PostgreSQL's jsonb operators cannot evaluate, evaluated in Rust.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

/// First match of a JSONPath that native operators cannot evaluate (see `eventview_core::jsonpath`), as
/// a refresh evaluates it: NULL for a payload nested too deep to evaluate, which the refresh then
/// tells apart from a missing value with `_jsonpath_too_deep` and handles per its type policy.
#[pg_extern(name = "_jsonpath_match", immutable, strict, parallel_safe)]
fn jsonpath_match(doc: &str, path: &str) -> Result<Option<pgrx::JsonB>, ErrorReport> {
    crate::errors::at_boundary(|| {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(doc) else {
            return Ok(None);
        };
        eventview_core::jsonpath_eval::first_match(&value, path)
            .map(|v| v.map(pgrx::JsonB))
            .map_err(|e| {
                crate::errors::EvError::invalid(format!("invalid JSONPath \"{path}\": {e}"))
            })
    })
}

/// Whether a payload nests deeper than rich JSONPaths can evaluate (`eventview_core::jsonpath::RICH_MAX_NESTING`).
#[pg_extern(name = "_jsonpath_too_deep", immutable, strict, parallel_safe)]
fn jsonpath_too_deep(doc: &str) -> bool {
    eventview_core::jsonpath_eval::too_deep(doc)
}

/// First match of a JSONPath that native operators cannot evaluate (see `eventview_core::jsonpath`),
/// taking the document as JSON text: a document too deep to evaluate gets a clear 22023 error
/// naming the path, not an internal one. `eventview.jsonpath_first(jsonb, text)` wraps it.
#[pg_extern(name = "_jsonpath_first", immutable, strict, parallel_safe)]
fn jsonpath_first(doc: &str, path: &str) -> Result<Option<pgrx::JsonB>, ErrorReport> {
    crate::errors::at_boundary(|| {
        let value: serde_json::Value = serde_json::from_str(doc).map_err(|e| {
            crate::errors::EvError::invalid(format!("cannot evaluate JSONPath \"{path}\" on this payload: {e}"))
                .with_hint("Paths with wildcards, filters or descendants (..) are evaluated on payloads nested at most 127 levels deep; use a path of names and indexes.")
        })?;
        eventview_core::jsonpath_eval::first_match(&value, path)
            .map(|v| v.map(pgrx::JsonB))
            .map_err(|e| {
                crate::errors::EvError::invalid(format!("invalid JSONPath \"{path}\": {e}"))
            })
    })
}
