//! JSONPath references: RFC 9535 syntax parsed by jsonpath-rust, compiled to SQL.
//!
//! A path made only of member names and array indexes (`$.a.b`, `$.tags[0]`, `$['odd key'][-1]`)
//! compiles to a chain of native `->` operators. `->` has exactly the RFC semantics for such
//! segments: a name on a non-object and an index on a non-array select nothing (SQL NULL), and a
//! negative index counts from the end. Anything richer (wildcards, slices, filters, descendants,
//! unions) is evaluated by `eventview._jsonpath_match` (jsonpath-rust), which yields the first
//! match in document order as `jsonb_path_query_first` would; it cannot evaluate a payload nested
//! deeper than 128 levels, which a refresh reports per event (see `sqlgen`).

use super::quote;
use jsonpath_rust::parser::model::{JpQuery, Segment, Selector};
use jsonpath_rust::parser::parse_json_path;

/// One step of a simple path.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Member(String),
    Index(i64),
}

/// A validated JSONPath and how it will be evaluated.
#[derive(Debug, Clone, PartialEq)]
pub enum PathPlan {
    /// Native `->` chain.
    Simple(Vec<Step>),
    /// Evaluated by `eventview._jsonpath_match(payload, path)`.
    Rich(String),
}

/// Why a path was refused.
#[derive(Debug, PartialEq)]
pub struct PathError(pub String);

/// Deepest nesting of a payload a rich path can be evaluated on (the recursion limit of the
/// JSON parser the evaluation uses).
pub const RICH_MAX_NESTING: usize = 127;

/// Upper bound on the path text we accept: a reference is a column expression, not a program.
pub const MAX_PATH_LEN: usize = 4096;

/// Parses `text` once; used for validation and for the per-backend evaluation cache.
pub fn parse(text: &str) -> Result<JpQuery, PathError> {
    if text.len() > MAX_PATH_LEN {
        return Err(PathError(format!(
            "path is longer than {MAX_PATH_LEN} bytes"
        )));
    }
    if !text.starts_with('$') {
        return Err(PathError("a JSONPath must start with $".into()));
    }
    parse_json_path(text).map_err(|e| PathError(describe_parse_error(&e.to_string())))
}

/// Turns the parser's multi-line report ("--> 1:5 ... = expected selector") into one line:
/// "syntax error at character 5: expected selector".
fn describe_parse_error(report: &str) -> String {
    let column = report
        .split("-->")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|pos| pos.split(':').nth(1))
        .map(str::to_string);
    let expected = report
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("= "))
        .map(str::to_string);
    match (column, expected) {
        (Some(c), Some(e)) => format!("syntax error at character {c}: {e}"),
        (Some(c), None) => format!("syntax error at character {c}"),
        _ => report
            .lines()
            .next()
            .unwrap_or("syntax error")
            .trim()
            .to_string(),
    }
}

/// Validates `text` and decides how it is evaluated.
pub fn plan(text: &str) -> Result<PathPlan, PathError> {
    let query = parse(text)?;
    let mut steps = Vec::with_capacity(query.segments.len());
    for segment in &query.segments {
        match segment {
            // PostgreSQL text cannot hold U+0000, so no payload has such a key (and the name
            // could not be written into SQL).
            Segment::Selector(Selector::Name(name)) if name.contains('\0') => {
                return Err(PathError(
                    "a member name cannot contain U+0000, which no PostgreSQL text (and no payload key) can hold"
                        .into(),
                ));
            }
            Segment::Selector(Selector::Name(name)) => steps.push(Step::Member(name.clone())),
            // SQL/JSON path subscripts are int4; a larger index (RFC 9535 allows up to 2^53) goes
            // to the evaluator.
            Segment::Selector(Selector::Index(i)) if i32::try_from(*i).is_ok() => {
                steps.push(Step::Index(*i))
            }
            _ => return Ok(PathPlan::Rich(text.to_string())),
        }
    }
    Ok(PathPlan::Simple(steps))
}

impl PathPlan {
    /// The path as `eventview.observed_fields` writes it (`$.a.b`, `$['odd key']`, indexes as
    /// `[*]`), for simple paths; None for rich ones.
    pub fn observed_form(&self) -> Option<String> {
        let PathPlan::Simple(steps) = self else {
            return None;
        };
        let mut out = String::from("$");
        for step in steps {
            match step {
                Step::Member(name) if is_plain_name(name) => {
                    out.push('.');
                    out.push_str(name);
                }
                Step::Member(name) => {
                    out.push_str("['");
                    out.push_str(&name.replace('\\', "\\\\").replace('\'', "\\'"));
                    out.push_str("']");
                }
                Step::Index(_) => out.push_str("[*]"),
            }
        }
        Some(out)
    }

    /// Whether the path is evaluated by `eventview._jsonpath_match` (and so cannot be evaluated
    /// on a payload nested deeper than RICH_MAX_NESTING).
    pub fn is_rich(&self) -> bool {
        matches!(self, PathPlan::Rich(_))
    }

    /// SQL for the selected jsonb value of `doc` (a trusted column expression), NULL when nothing
    /// is selected. A member step is `->`, which selects nothing from anything but an object. An
    /// index step is a strict, silent SQL/JSON path: `->` with an integer takes a scalar for an
    /// array of one (`'"a"'::jsonb -> 0` is `"a"`), where RFC 9535 selects nothing.
    pub fn to_sql(&self, doc: &str) -> String {
        match self {
            PathPlan::Simple(steps) => {
                let mut sql = doc.to_string();
                for step in steps {
                    match step {
                        Step::Member(name) => {
                            sql.push_str(" -> ");
                            sql.push_str(&quote::literal(name));
                        }
                        Step::Index(i) => {
                            sql = format!(
                                "pg_catalog.jsonb_path_query_first({sql}, {}::pg_catalog.jsonpath, '{{}}'::pg_catalog.jsonb, true)",
                                quote::literal(&strict_index(*i))
                            )
                        }
                    }
                }
                format!("({sql})")
            }
            PathPlan::Rich(text) => {
                format!(
                    "eventview._jsonpath_match({doc}::text, {})",
                    quote::literal(text)
                )
            }
        }
    }
}

/// The SQL/JSON path that selects element `i` of an array (from its end when negative: -1 is
/// the last) and, in strict mode, raises an error (which the caller silences) for anything else.
fn strict_index(i: i64) -> String {
    match i {
        0.. => format!("strict $[{i}]"),
        -1 => "strict $[last]".to_string(),
        _ => format!("strict $[last - {}]", -(i + 1)),
    }
}

fn is_plain_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observed_form_matches_payload_paths() {
        assert_eq!(
            plan("$.item.sku").unwrap().observed_form().unwrap(),
            "$.item.sku"
        );
        assert_eq!(
            plan("$.tags[3]").unwrap().observed_form().unwrap(),
            "$.tags[*]"
        );
        assert_eq!(
            plan("$[\"a b\"][\"it's\"]")
                .unwrap()
                .observed_form()
                .unwrap(),
            "$['a b']['it\\'s']"
        );
        assert_eq!(plan("$..x").unwrap().observed_form(), None);
    }

    #[test]
    fn members_compile_to_arrows_and_indexes_to_strict_paths() {
        assert_eq!(
            plan("$.item.sku").unwrap().to_sql("payload"),
            "(payload -> 'item' -> 'sku')"
        );
        assert_eq!(
            plan("$.tags[0].sku").unwrap().to_sql("p"),
            "(pg_catalog.jsonb_path_query_first(p -> 'tags', 'strict $[0]'::pg_catalog.jsonpath, '{}'::pg_catalog.jsonb, true) -> 'sku')"
        );
        assert_eq!(
            plan("$[-1][-3]").unwrap().to_sql("p"),
            "(pg_catalog.jsonb_path_query_first(pg_catalog.jsonb_path_query_first(p, 'strict $[last]'::pg_catalog.jsonpath, '{}'::pg_catalog.jsonb, true), 'strict $[last - 2]'::pg_catalog.jsonpath, '{}'::pg_catalog.jsonb, true))"
        );
        assert_eq!(
            plan("$[\"it's\"]").unwrap(),
            PathPlan::Simple(vec![Step::Member("it's".into())])
        );
        assert_eq!(
            plan("$.a[-1]").unwrap(),
            PathPlan::Simple(vec![Step::Member("a".into()), Step::Index(-1)])
        );
    }

    #[test]
    fn root_alone_is_the_whole_document() {
        assert_eq!(plan("$").unwrap().to_sql("payload"), "(payload)");
    }

    #[test]
    fn rich_paths_go_through_the_evaluator() {
        for p in [
            "$.items[*].sku",
            "$..sku",
            "$.a[?@.b == 1]",
            "$.a[1:3]",
            "$['a','b']",
            "$.a[99999999999]",
        ] {
            assert!(matches!(plan(p).unwrap(), PathPlan::Rich(_)), "{p}");
        }
        assert_eq!(
            plan("$..x").unwrap().to_sql("payload"),
            "eventview._jsonpath_match(payload::text, '$..x')"
        );
    }

    #[test]
    fn parse_errors_are_one_readable_line() {
        assert_eq!(
            plan("$.a[").unwrap_err().0,
            "syntax error at character 5: expected selector"
        );
        assert_eq!(plan("sku").unwrap_err().0, "a JSONPath must start with $");
    }

    #[test]
    fn bad_paths_are_refused() {
        assert!(plan("sku").is_err());
        assert!(plan("$.").is_err());
        assert!(plan("$[").is_err());
        assert!(plan(&format!("${}", ".a".repeat(3000))).is_err());
    }
}
