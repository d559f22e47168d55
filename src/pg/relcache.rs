//! Facts about relations read from the relation and catalog caches, without a catalog query.
//! Those of a relation this backend holds locked are current (a catalog query would read them
//! with the transaction's snapshot, older under REPEATABLE READ); the others (names, whether a
//! column or relation exists) are as of the invalidations this backend last took in, as any
//! name lookup of the parser.

use pgrx::prelude::*;

/// The attribute of `desc` named `name` that is not dropped, with its position (0-based).
///
/// # Safety
/// `desc` is a valid tuple descriptor (of a relation held open, or one not rebuilt while the
/// attribute is used).
pub unsafe fn attribute_named<'a>(
    desc: &'a pg_sys::TupleDescData,
    name: &std::ffi::CStr,
) -> Option<(usize, &'a pg_sys::FormData_pg_attribute)> {
    // SAFETY: the descriptor has natts attributes; attname is a NUL-terminated NameData.
    unsafe {
        desc.attrs
            .as_slice(desc.natts as usize)
            .iter()
            .enumerate()
            .find(|(_, a)| {
                !a.attisdropped && std::ffi::CStr::from_ptr(a.attname.data.as_ptr()) == name
            })
    }
}

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

/// Whether the relation is a plain or partitioned table with each of `columns` (name, type): a
/// column of that name that is not dropped, of that type when `types`. None (unknown) for a
/// relation this backend holds no lock on, whose cache entry could change meanwhile; false for
/// one that does not exist.
pub fn has_columns(
    relid: pg_sys::Oid,
    columns: &[(&std::ffi::CStr, pg_sys::Oid)],
    types: bool,
) -> Option<bool> {
    if !super::locks::held(relid) {
        return None;
    }
    // SAFETY: a relcache entry is opened only for a relation this backend holds locked (so it
    // cannot change meanwhile), and closed before returning; a missing relation gives a null
    // pointer, checked before use; the descriptor has natts attributes.
    unsafe {
        let rel = pg_sys::RelationIdGetRelation(relid);
        if rel.is_null() {
            return Some(false);
        }
        let kind = (*(*rel).rd_rel).relkind as u8;
        let table = kind == pg_sys::RELKIND_RELATION || kind == pg_sys::RELKIND_PARTITIONED_TABLE;
        let desc = (*rel).rd_att;
        let found = table
            && columns.iter().all(|(name, type_oid)| {
                attribute_named(&*desc, name)
                    .is_some_and(|(_, a)| !types || a.atttypid == *type_oid)
            });
        pg_sys::RelationClose(rel);
        Some(found)
    }
}

/// The schema and name of a relation, from the catalog caches; None when it does not exist.
pub fn schema_and_name(relid: pg_sys::Oid) -> Option<(String, String)> {
    // SAFETY: catalog cache lookups by oid; each returns NULL (or InvalidOid) for a missing
    // object, checked before use; the names are copies in the current memory context.
    unsafe {
        let namespace = pg_sys::get_rel_namespace(relid);
        if namespace == pg_sys::InvalidOid {
            return None;
        }
        let schema = pg_sys::get_namespace_name(namespace);
        let name = pg_sys::get_rel_name(relid);
        if schema.is_null() || name.is_null() {
            return None;
        }
        Some((
            std::ffi::CStr::from_ptr(schema)
                .to_string_lossy()
                .into_owned(),
            std::ffi::CStr::from_ptr(name)
                .to_string_lossy()
                .into_owned(),
        ))
    }
}

/// Whether the relation has a column of that name that is not dropped, from the catalog caches.
pub fn has_column(relid: pg_sys::Oid, name: &str) -> bool {
    let Ok(name) = std::ffi::CString::new(name) else {
        return false;
    };
    // SAFETY: a catalog cache lookup with a valid C string; 0 (InvalidAttrNumber) for a missing
    // or dropped column.
    unsafe { pg_sys::get_attnum(relid, name.as_ptr()) != 0 }
}

/// Whether `role` holds SELECT on the relation, as `has_table_privilege(role, relid, 'SELECT')`
/// says it (false for a relation that does not exist).
pub fn role_may_select(role: pg_sys::Oid, relid: pg_sys::Oid) -> bool {
    let mut missing = false;
    // SAFETY: an ACL check through the catalog caches; a missing relation sets `missing`
    // instead of raising an error.
    let result = unsafe {
        pg_sys::pg_class_aclcheck_ext(
            relid,
            role,
            pg_sys::ACL_SELECT as pg_sys::AclMode,
            &mut missing,
        )
    };
    !missing && result == pg_sys::AclResult::ACLCHECK_OK
}

/// Whether row-level security policies of the relation apply to `role`, as PostgreSQL decides
/// when `role` reads it (`check_enable_rls`): the relation has row-level security enabled, and
/// `role` is no superuser, has no BYPASSRLS, and is not a member of the relation's owner role
/// unless row-level security is forced. False for a relation that does not exist.
pub fn row_security_applies_to(role: pg_sys::Oid, relid: pg_sys::Oid) -> bool {
    // SAFETY: a catalog cache lookup; `noError` makes it answer rather than raise when
    // row_security is off.
    let result = unsafe { pg_sys::check_enable_rls(relid, role, true) };
    result == pg_sys::CheckEnableRlsResult::RLS_ENABLED as std::ffi::c_int
}

/// The owner of a relation this backend holds locked (None when it does not exist).
pub fn owner_of_locked(relid: pg_sys::Oid) -> Option<pg_sys::Oid> {
    // SAFETY: opens and closes a relcache entry of a relation this backend holds locked; a
    // missing relation gives a null pointer, checked before use.
    unsafe {
        let rel = pg_sys::RelationIdGetRelation(relid);
        if rel.is_null() {
            return None;
        }
        let owner = (*(*rel).rd_rel).relowner;
        pg_sys::RelationClose(rel);
        Some(owner)
    }
}
