//! Facts about a relation read from the relation cache: current once the relation is locked,
//! where a catalog query would read them with the transaction's snapshot (older under
//! REPEATABLE READ).

use pgrx::prelude::*;

/// Whether the relation is a plain table without row-level security. The caller holds a lock on
/// it; false for a relation that does not exist.
pub fn is_plain_table_without_row_security(relid: pg_sys::Oid) -> bool {
    // SAFETY: opens and closes a relcache entry of a relation this backend holds locked; a
    // missing relation gives a null pointer, checked before use.
    unsafe {
        let rel = pg_sys::RelationIdGetRelation(relid);
        if rel.is_null() {
            return false;
        }
        let form = (*rel).rd_rel;
        let plain = (*form).relkind == pg_sys::RELKIND_RELATION as std::ffi::c_char
            && !(*form).relrowsecurity;
        pg_sys::RelationClose(rel);
        plain
    }
}

/// Whether the relation is a partitioned table (false for one that does not exist).
pub fn is_partitioned(relid: pg_sys::Oid) -> bool {
    // SAFETY: a syscache lookup of the relation's kind; InvalidOid-safe ('\0' when missing).
    unsafe {
        pg_sys::get_rel_relkind(relid) == pg_sys::RELKIND_PARTITIONED_TABLE as std::ffi::c_char
    }
}

/// The relation `name` in schema `schema`, from the catalog caches; InvalidOid when either is
/// missing.
pub fn relid_in_schema(schema: &str, name: &str) -> pg_sys::Oid {
    let (Ok(schema), Ok(name)) = (std::ffi::CString::new(schema), std::ffi::CString::new(name))
    else {
        return pg_sys::InvalidOid;
    };
    // SAFETY: catalog cache lookups with valid C strings; missing_ok for the schema.
    unsafe {
        let namespace = pg_sys::get_namespace_oid(schema.as_ptr(), true);
        if namespace == pg_sys::InvalidOid {
            return pg_sys::InvalidOid;
        }
        pg_sys::get_relname_relid(name.as_ptr(), namespace)
    }
}
