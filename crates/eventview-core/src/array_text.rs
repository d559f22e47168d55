//! PostgreSQL arrays as text, joined without parsing their elements: the shards answer a
//! refresh's group changes as one array text per column (`ViewSql::take_change_columns`), and
//! the coordinator reads the columns of every shard as one array each.

/// The one-dimensional arrays `parts` (each the text of an array, `{...}`, as `array_out`
/// writes it, with the default lower bound 1) as one array holding their elements in order,
/// or None when a part is not enclosed in braces. Empty arrays add nothing.
pub fn concat(parts: &[&str]) -> Option<String> {
    let mut inner = Vec::with_capacity(parts.len());
    for part in parts {
        let elements = part.trim().strip_prefix('{')?.strip_suffix('}')?;
        if !elements.is_empty() {
            inner.push(elements);
        }
    }
    let mut out = String::with_capacity(inner.iter().map(|e| e.len() + 1).sum::<usize>() + 2);
    out.push('{');
    out.push_str(&inner.join(","));
    out.push('}');
    Some(out)
}

/// Lists of columns (each a JSON array of arrays' texts, one per column) joined column by
/// column: the arrays of each column `concat`enated, in the order of `lists`. None when a list
/// is no JSON array of strings, an array's text is no array, or the lists do not have the same
/// number of columns.
pub fn join_column_lists(lists: &[&str]) -> Option<Vec<String>> {
    let mut columns: Vec<Vec<String>> = Vec::new();
    for (i, list) in lists.iter().enumerate() {
        let arrays: Vec<String> = serde_json::from_str(list).ok()?;
        if i == 0 {
            columns = vec![Vec::new(); arrays.len()];
        } else if arrays.len() != columns.len() {
            return None;
        }
        for (column, array) in columns.iter_mut().zip(arrays) {
            column.push(array);
        }
    }
    columns
        .iter()
        .map(|arrays| concat(&arrays.iter().map(String::as_str).collect::<Vec<_>>()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_are_joined_in_order_as_they_were_written() {
        assert_eq!(
            concat(&[r#"{1,NULL,"a,b"}"#, r#"{"}{",x}"#]).unwrap(),
            r#"{1,NULL,"a,b","}{",x}"#
        );
        assert_eq!(
            concat(&[
                r#"{"2026-11-03 00:00:00+00"}"#,
                r#"{"2026-11-04 00:00:00+00"}"#
            ])
            .unwrap(),
            r#"{"2026-11-03 00:00:00+00","2026-11-04 00:00:00+00"}"#
        );
    }

    #[test]
    fn escaped_elements_and_parts_written_with_spaces_around_join_as_they_are() {
        assert_eq!(
            concat(&[r#" {"a\"b","c\\d"} "#, r#"{NULL,""}"#]).unwrap(),
            r#"{"a\"b","c\\d",NULL,""}"#
        );
    }

    #[test]
    fn empty_arrays_add_nothing_and_no_parts_make_an_empty_array() {
        assert_eq!(concat(&["{}", "{1}", "{}", "{2,3}"]).unwrap(), "{1,2,3}");
        assert_eq!(concat(&["{}", "{}"]).unwrap(), "{}");
        assert_eq!(concat(&[]).unwrap(), "{}");
    }

    #[test]
    fn column_lists_join_column_by_column() {
        let joined = join_column_lists(&[
            r#"["{t}", "{1}"]"#,
            r#"["{}", "{}"]"#,
            r#"["{f,t}", "{2,3}"]"#,
        ]);
        assert_eq!(
            joined.unwrap(),
            vec!["{t,f,t}".to_string(), "{1,2,3}".to_string()]
        );
        assert_eq!(join_column_lists(&[]).unwrap(), Vec::<String>::new());
        // Lists of different widths, no JSON array of strings, or no array texts.
        assert_eq!(
            join_column_lists(&[r#"["{t}", "{1}"]"#, r#"["{f}"]"#]),
            None
        );
        assert_eq!(join_column_lists(&[r#"[1, 2]"#]), None);
        assert_eq!(join_column_lists(&[r#"["t"]"#]), None);
    }

    #[test]
    fn a_part_that_is_no_array_text_is_refused() {
        assert_eq!(concat(&["{1}", "[2]"]), None);
        assert_eq!(concat(&["1,2"]), None);
    }
}
