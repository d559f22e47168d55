//! Logical fields: `define_field`.

use super::{at_boundary, required};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

#[pg_extern(name = "_define_field", volatile, parallel_unsafe)]
fn define_field(
    source: Option<&str>,
    field: Option<&str>,
    path: Option<&str>,
    event_type: Option<&str>,
    version: Option<i32>,
    field_type: &str,
) -> Result<(), ErrorReport> {
    at_boundary(|| {
        crate::fields::define_field(crate::fields::FieldDeclaration {
            source: required(source, "source")?,
            field: required(field, "field")?,
            path: required(path, "path")?,
            event_type,
            version,
            type_name: field_type,
        })
    })
}
