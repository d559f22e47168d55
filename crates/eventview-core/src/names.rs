//! Names of the hidden objects behind sources and views.
//!
//! Derived from our own integer keys (never from user text or OIDs), so they are injection-free,
//! fit NAMEDATALEN, never collide, and survive dump/restore where OIDs change.

/// The schema of the extension's objects.
pub const SCHEMA: &str = "eventview";

/// The changelog of a source (its captured changes), qualified.
pub fn changelog(source_id: i32) -> String {
    format!("{SCHEMA}.{}", changelog_table(source_id))
}

/// `changelog` without the schema.
pub fn changelog_table(source_id: i32) -> String {
    format!("_changes_{source_id}")
}

/// The default partition of a changelog (records past every segment made so far), unqualified.
pub fn changelog_default_table(source_id: i32) -> String {
    format!("_changes_{source_id}_default")
}

/// The changelog segment whose records' `seq` start at `lo`, unqualified.
pub fn changelog_segment_table(source_id: i32, lo: i64) -> String {
    format!("_changes_{source_id}_from_{lo}")
}

/// The key table of a partitioned event table (its `event_key`s, unique), qualified.
pub fn key_table(source_id: i32) -> String {
    format!("{SCHEMA}.{}", key_table_name(source_id))
}

/// `key_table` without the schema.
pub fn key_table_name(source_id: i32) -> String {
    format!("_keys_{source_id}")
}

/// The capture trigger function of a source for `op` (insert, update, delete, truncate).
pub fn capture_function(source_id: i32, op: &str) -> String {
    format!("{SCHEMA}._capture_{source_id}_{op}")
}

/// The source whose capture function for `op` is named `name` (unqualified), if it is one.
pub fn capture_source(name: &str, op: &str) -> Option<i32> {
    let id = name
        .strip_prefix("_capture_")?
        .strip_suffix(op)?
        .strip_suffix('_')?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    id.parse().ok()
}

/// The group changes of a view that rollups read (`sqlgen`'s group changelog), qualified.
pub fn view_changes(view_id: i32) -> String {
    format!("{SCHEMA}.{}", view_changes_table(view_id))
}

/// `view_changes` without the schema.
pub fn view_changes_table(view_id: i32) -> String {
    format!("_v{view_id}_changes")
}

/// The storage table of a view (one row per group), qualified.
pub fn view_data(view_id: i32) -> String {
    format!("{SCHEMA}.{}", view_data_table(view_id))
}

/// `view_data` without the schema.
pub fn view_data_table(view_id: i32) -> String {
    format!("_v{view_id}_data")
}

/// The value multiset behind min, max or count_distinct measure number `measure` (1-based).
pub fn view_values(view_id: i32, measure: usize) -> String {
    format!("{SCHEMA}._v{view_id}_m{measure}")
}

/// The append-only log of min/max measure number `measure`'s values, merged into its multiset
/// lazily (see `sqlgen`).
pub fn view_values_log(view_id: i32, measure: usize) -> String {
    format!("{SCHEMA}._v{view_id}_m{measure}_log")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_source_reads_back_the_source_of_a_capture_function_name() {
        for id in [1, 7, 123_456, i32::MAX] {
            let qualified = capture_function(id, "insert");
            let name = qualified.strip_prefix("eventview.").unwrap();
            assert_eq!(capture_source(name, "insert"), Some(id));
            assert_eq!(capture_source(name, "delete"), None);
        }
        for name in [
            "_capture__insert",
            "_capture_x_insert",
            "_capture_-1_insert",
            "_capture_+1_insert",
            "_capture_1insert",
            "capture_1_insert",
            "_capture_99999999999_insert",
            "_capture_1_insert_",
        ] {
            assert_eq!(capture_source(name, "insert"), None, "{name}");
        }
    }
}
