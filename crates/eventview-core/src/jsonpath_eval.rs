//! Evaluation of JSONPaths that do not compile to native operators (wildcards, filters,
//! descendants, slices). Compiled paths are cached per backend: a refresh calls this once per
//! event with the same few paths.
//!
//! serde_json is built with `preserve_order` (object members iterate in the order of the jsonb
//! text, which is jsonb's own order, so "first match" agrees with `jsonb_path_query_first`) and
//! `arbitrary_precision` (numbers keep their exact text: `12.50` stays `12.50`, `1e400` parses).

use crate::jsonpath;
use jsonpath_rust::parser::model::JpQuery;
use jsonpath_rust::query::js_path_process;
use std::cell::RefCell;
use std::collections::HashMap;

/// Deepest nesting serde_json parses (its recursion limit): a payload nested deeper cannot be
/// evaluated by a rich path, and the refresh reports it per event under the view's type policy.
const MAX_NESTING: usize = jsonpath::RICH_MAX_NESTING;

/// Whether `json` (valid JSON text) nests objects and arrays deeper than MAX_NESTING. A byte scan,
/// iterative: it must work on exactly the payloads the parser cannot take.
pub fn too_deep(json: &str) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in json.as_bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Enough for every rich path of every view a backend refreshes; cleared when full.
const CACHE_CAPACITY: usize = 256;

thread_local! {
    static CACHE: RefCell<HashMap<String, JpQuery>> = RefCell::new(HashMap::new());
}

/// The first value `path` selects in `doc`, in document order; None when it selects nothing.
pub fn first_match(
    doc: &serde_json::Value,
    path: &str,
) -> Result<Option<serde_json::Value>, String> {
    CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        if !cache.contains_key(path) {
            let query = jsonpath::parse(path).map_err(|e| e.0)?;
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
            cache.insert(path.to_string(), query);
        }
        let query = &cache[path];
        let found = js_path_process(query, doc).map_err(|e| e.to_string())?;
        Ok(found.into_iter().next().map(|r| r.val().clone()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn first_match_follows_member_order_and_keeps_numbers_exact() {
        let doc: serde_json::Value = serde_json::from_str(
            r#"{"item": {"sku": "i"}, "details": {"sku": "d"}, "n": [12.50, 1e400]}"#,
        )
        .unwrap();
        assert_eq!(first_match(&doc, "$..sku").unwrap(), Some(json!("i")));
        assert_eq!(
            first_match(&doc, "$.n[*]").unwrap().unwrap().to_string(),
            "12.50"
        );
        assert!(
            first_match(&doc, "$.n[1]").unwrap().unwrap().is_number(),
            "1e400 beyond f64 still parses"
        );
    }

    #[test]
    fn too_deep_is_exactly_what_the_parser_refuses() {
        for levels in [1, 127, 128, 129, 130, 10_000] {
            for (open, close) in [("[", "]"), ("{\"a\": ", "}"), ("{\"[{\\\"\": [", "]}")] {
                let doc = format!("{}1{}", open.repeat(levels), close.repeat(levels));
                let parsed = serde_json::from_str::<serde_json::Value>(&doc).is_ok();
                assert_eq!(too_deep(&doc), !parsed, "{levels} levels of {open}");
            }
        }
    }

    #[test]
    fn first_match_in_document_order() {
        let doc = json!({"items": [{"sku": "a"}, {"sku": "b"}], "x": {"y": {"sku": "c"}}});
        assert_eq!(
            first_match(&doc, "$.items[*].sku").unwrap(),
            Some(json!("a"))
        );
        assert_eq!(
            first_match(&doc, "$.items[?@.sku == 'b'].sku").unwrap(),
            Some(json!("b"))
        );
        assert_eq!(first_match(&doc, "$.nope[*]").unwrap(), None);
        assert!(first_match(&doc, "$[").is_err());
    }
}
