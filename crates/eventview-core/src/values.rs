//! SQL for the value a field reference gives in one use, and its type check.
//!
//! The refresh statement evaluates each distinct reference once per event into a jsonb column
//! (see `sqlgen`); this module turns that raw jsonb into the typed value a use needs, and says
//! when the JSON kind does not fit (section 6 of the contract): numbers only from JSON numbers
//! (never from strings), booleans from JSON booleans, timestamptz from RFC 3339 strings, text
//! from strings, numbers and booleans, jsonb from anything. A check yields a reason text.

use super::definition::{Envelope, FieldRef, SqlType};
use super::quote;

/// Most bytes the variable-length parts of a group key (and of a multiset value with its key)
/// may take: a btree entry takes at most 2704 bytes (8 kB pages), and the rest of an entry
/// (flags, bucket, headers, alignment) fits in what this leaves. See
/// `ViewSql::oversize_check`.
pub const MAX_KEY_BYTES: u32 = 2000;

/// How a value is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// A group column.
    GroupKey,
    /// Input of sum/avg (numeric).
    Number,
    /// Input of min/max (the reference's own type; numeric for undeclared paths).
    Extreme,
    /// count(ref): a boolean, true when the value is not NULL.
    CountNonNull,
    /// count_distinct(ref): the jsonb value compared, NULL when absent.
    Distinct,
}

/// The value expression and, when the JSON kind can be wrong, (condition, reason expression).
pub struct ValueSql {
    pub expr: String,
    pub check: Option<(String, String)>,
}

/// `context` names the use in reasons, e.g. `measure "qty": sum($.qty)` or `group column "sku"`.
pub fn value_sql(field: &FieldRef, raw: &str, used: Use, context: &str) -> ValueSql {
    match field {
        FieldRef::Envelope(e) => envelope_value(*e, used),
        FieldRef::Path { text, .. } => path_value(raw, used, context, text),
        FieldRef::Logical(f) => {
            let (conv, bad, found) = convert(raw, f.sql_type);
            let reason = format!(
                "{} || {found}",
                quote::literal(&format!(
                    "{context}: field \"{}\" is declared {} and cannot take ",
                    f.name,
                    f.sql_type.name()
                ))
            );
            let check = bad.map(|b| (b, reason));
            let expr = match used {
                Use::GroupKey | Use::Extreme => conv,
                // A double's own numeric conversion keeps 15 significant digits: sums and
                // averages take the JSON number exactly, as for numeric fields.
                Use::Number if f.sql_type == SqlType::Double => {
                    format!("CASE WHEN ({conv}) IS NOT NULL THEN {raw}::numeric END")
                }
                Use::Number => format!("({conv})::numeric"),
                Use::CountNonNull => format!("(({conv}) IS NOT NULL)"),
                // One instant is one value however its offset was written: the UTC form, as
                // for occurred_at.
                Use::Distinct if f.sql_type == SqlType::Timestamptz => {
                    Envelope::OccurredAt.jsonb_sql(&format!("({conv})"))
                }
                Use::Distinct => format!("CASE WHEN ({conv}) IS NOT NULL THEN {raw} END"),
            };
            ValueSql { expr, check }
        }
    }
}

fn envelope_value(e: Envelope, used: Use) -> ValueSql {
    let col = e.column();
    let expr = match used {
        Use::GroupKey | Use::Extreme => col.to_string(),
        Use::Number => format!("{col}::numeric"),
        Use::CountNonNull => "true".to_string(),
        Use::Distinct => e.jsonb_sql(col),
    };
    ValueSql { expr, check: None }
}

fn path_value(raw: &str, used: Use, context: &str, path: &str) -> ValueSql {
    match used {
        Use::GroupKey => ValueSql {
            expr: format!(
                "CASE WHEN jsonb_typeof({raw}) IN ('string', 'number', 'boolean') THEN {raw} #>> '{{}}' END"
            ),
            check: Some((
                format!("jsonb_typeof({raw}) IN ('object', 'array')"),
                format!(
                    "{} || jsonb_typeof({raw}) || ', not a scalar'",
                    quote::literal(&format!("{context}: {path} is a JSON "))
                ),
            )),
        },
        Use::Number | Use::Extreme => ValueSql {
            expr: format!("CASE WHEN jsonb_typeof({raw}) = 'number' THEN {raw}::numeric END"),
            check: Some((
                format!("jsonb_typeof({raw}) NOT IN ('number', 'null')"),
                format!(
                    "{} || jsonb_typeof({raw})",
                    quote::literal(&format!("{context} needs a JSON number, found "))
                ),
            )),
        },
        Use::CountNonNull => ValueSql {
            expr: format!("coalesce(jsonb_typeof({raw}) <> 'null', false)"),
            check: None,
        },
        Use::Distinct => ValueSql {
            expr: format!("CASE WHEN jsonb_typeof({raw}) <> 'null' THEN {raw} END"),
            check: None,
        },
    }
}

/// (conversion of `raw` to `t`, condition that `raw` has a kind `t` cannot take, what was found).
fn convert(raw: &str, t: SqlType) -> (String, Option<String>, String) {
    let kind = format!("jsonb_typeof({raw})");
    let found_kind = format!("'a JSON ' || {kind}");
    const INT8_RANGE: &str = "BETWEEN -9223372036854775808 AND 9223372036854775807";
    // The check of a type that takes only some numbers: a JSON kind that is neither a number
    // nor null, or a number outside `fits`.
    let not_a_fitting_number = |fits: &str| {
        format!("({kind} NOT IN ('number', 'null') OR ({kind} = 'number' AND NOT {fits}))")
    };
    match t {
        SqlType::Text => (
            format!(
                "CASE WHEN {kind} IN ('string', 'number', 'boolean') THEN {raw} #>> '{{}}' END"
            ),
            Some(format!("{kind} IN ('object', 'array')")),
            found_kind,
        ),
        SqlType::Numeric | SqlType::Integer => (
            format!("CASE WHEN {kind} = 'number' THEN {raw}::numeric END"),
            Some(format!("{kind} NOT IN ('number', 'null')")),
            found_kind,
        ),
        SqlType::Bigint => {
            let fits = format!(
                "({raw}::numeric = trunc({raw}::numeric) AND {raw}::numeric {INT8_RANGE})"
            );
            (
                format!("CASE WHEN {kind} = 'number' AND {fits} THEN {raw}::numeric::bigint END"),
                Some(not_a_fitting_number(&fits)),
                format!(
                    "CASE WHEN {kind} = 'number' THEN 'the number ' || {raw}::text ELSE 'a JSON ' || {kind} END"
                ),
            )
        }
        SqlType::Double => {
            // Within double precision's range both ways: too large overflows, and a nonzero
            // number that rounds to zero underflows (the cast raises an error for both).
            // Subnormal numbers convert: the lower bound is just above half the smallest one
            // (2^-1075, which rounds to zero), not DBL_MIN.
            let fits = format!(
                "(abs({raw}::numeric) <= 1.7976931348623157e308 AND ({raw}::numeric = 0 OR abs({raw}::numeric) >= 2.4703282292062328e-324))"
            );
            (
                format!(
                    "CASE WHEN {kind} = 'number' AND {fits} THEN {raw}::numeric::double precision END"
                ),
                Some(not_a_fitting_number(&fits)),
                format!(
                    "CASE WHEN {kind} = 'number' THEN 'an out-of-range number' ELSE 'a JSON ' || {kind} END"
                ),
            )
        }
        SqlType::Boolean => (
            format!("CASE WHEN {kind} = 'boolean' THEN {raw}::boolean END"),
            Some(format!("{kind} NOT IN ('boolean', 'null')")),
            found_kind,
        ),
        SqlType::Timestamptz => (
            format!("eventview._rfc3339({raw})"),
            Some(format!("({kind} <> 'null' AND eventview._rfc3339({raw}) IS NULL)")),
            format!(
                "CASE WHEN {kind} = 'string' THEN 'a string that is not an RFC 3339 timestamp' ELSE 'a JSON ' || {kind} END"
            ),
        ),
        SqlType::Jsonb => (
            format!("CASE WHEN {kind} <> 'null' THEN {raw} END"),
            None,
            found_kind,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::{FieldVariant, LogicalField};
    use crate::jsonpath;

    fn logical(t: SqlType) -> FieldRef {
        FieldRef::Logical(LogicalField::new(
            "qty".into(),
            t,
            vec![FieldVariant {
                event_type: None,
                version: None,
                path: "$.q".into(),
                plan: jsonpath::plan("$.q").unwrap(),
            }],
        ))
    }

    #[test]
    fn strings_are_never_numbers() {
        let v = value_sql(
            &logical(SqlType::Numeric),
            "j1",
            Use::Number,
            "measure \"s\"",
        );
        assert!(v.expr.contains("jsonb_typeof(j1) = 'number'"));
        let (cond, reason) = v.check.unwrap();
        assert_eq!(cond, "jsonb_typeof(j1) NOT IN ('number', 'null')");
        assert!(reason.contains("field \"qty\" is declared numeric and cannot take "));
    }

    #[test]
    fn bigint_takes_only_integral_numbers_in_range() {
        let v = value_sql(
            &logical(SqlType::Bigint),
            "j1",
            Use::GroupKey,
            "group column \"k\"",
        );
        assert!(v.expr.contains("trunc(j1::numeric)"));
        assert!(v.check.unwrap().0.contains("NOT (j1::numeric = trunc"));
    }

    #[test]
    fn jsonb_takes_anything_and_count_distinct_compares_jsonb() {
        assert!(
            value_sql(&logical(SqlType::Jsonb), "j1", Use::GroupKey, "g")
                .check
                .is_none()
        );
        let p = FieldRef::Path {
            text: "$.a".into(),
            plan: jsonpath::plan("$.a").unwrap(),
            element: false,
        };
        assert_eq!(
            value_sql(&p, "j2", Use::Distinct, "m").expr,
            "CASE WHEN jsonb_typeof(j2) <> 'null' THEN j2 END"
        );
    }
}
