//! View definitions: parsed and fully validated once, at `create_view`, so the refresh engine
//! works from a typed definition it can trust.
//!
//! Grammar (see "Definitions and restrictions" in docs/reference.md):
//! - field reference: a JSONPath starting with `$`, or an envelope column
//!   (`event_type`, `event_version`, `producer`, `occurred_at`);
//!   or a logical field declared with `define_field` (resolved per event type and version);
//! - aggregate: `count(*)`, `count(ref)`, `sum(ref)`, `avg(ref)`, `min(ref)`, `max(ref)`,
//!   `count_distinct(ref)`.

use super::jsonpath::{self, PathPlan};
use super::ordered_json::{json_kind, object_pairs, ObjectError};
use serde_json::Value;

/// Longest output column name Postgres keeps (NAMEDATALEN - 1); longer would be truncated.
pub const MAX_COLUMN_NAME: usize = 63;

/// A definition that cannot work. Always reported as SQLSTATE 22023.
#[derive(Debug, Clone, PartialEq)]
pub struct DefinitionError {
    pub message: String,
    pub hint: Option<String>,
}

fn refuse<T>(message: impl Into<String>) -> Result<T, DefinitionError> {
    Err(DefinitionError {
        message: message.into(),
        hint: None,
    })
}

fn refuse_with_hint<T>(message: impl Into<String>, hint: &str) -> Result<T, DefinitionError> {
    Err(DefinitionError {
        message: message.into(),
        hint: Some(hint.into()),
    })
}

/// SQL types a view column can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlType {
    Text,
    Integer,
    Bigint,
    Numeric,
    Double,
    Boolean,
    Timestamptz,
    Jsonb,
}

impl SqlType {
    pub fn name(self) -> &'static str {
        match self {
            SqlType::Text => "text",
            SqlType::Integer => "integer",
            SqlType::Bigint => "bigint",
            SqlType::Numeric => "numeric",
            SqlType::Double => "double precision",
            SqlType::Boolean => "boolean",
            SqlType::Timestamptz => "timestamptz",
            SqlType::Jsonb => "jsonb",
        }
    }

    /// The types `define_field` accepts.
    pub fn parse_declared(text: &str) -> Option<SqlType> {
        match text.trim().to_ascii_lowercase().as_str() {
            "text" => Some(SqlType::Text),
            "numeric" => Some(SqlType::Numeric),
            "bigint" => Some(SqlType::Bigint),
            "double precision" => Some(SqlType::Double),
            "boolean" => Some(SqlType::Boolean),
            "timestamptz" => Some(SqlType::Timestamptz),
            "jsonb" => Some(SqlType::Jsonb),
            _ => None,
        }
    }

    pub fn is_number(self) -> bool {
        matches!(
            self,
            SqlType::Integer | SqlType::Bigint | SqlType::Numeric | SqlType::Double
        )
    }

    /// A stand-in stored in place of NULL in key columns (a separate flag column says it was NULL),
    /// so group keys can use plain unique indexes and hashable joins.
    pub fn placeholder(self) -> &'static str {
        match self {
            SqlType::Text => "''::text",
            SqlType::Integer => "0",
            SqlType::Bigint => "0::bigint",
            SqlType::Numeric => "0::numeric",
            SqlType::Double => "0::double precision",
            SqlType::Boolean => "false",
            SqlType::Timestamptz => "'epoch'::timestamptz",
            SqlType::Jsonb => "'null'::jsonb",
        }
    }
}

/// The envelope columns a view may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Envelope {
    EventType,
    EventVersion,
    Producer,
    OccurredAt,
}

impl Envelope {
    pub fn from_name(name: &str) -> Option<Envelope> {
        match name {
            "event_type" => Some(Envelope::EventType),
            "event_version" => Some(Envelope::EventVersion),
            "producer" => Some(Envelope::Producer),
            "occurred_at" => Some(Envelope::OccurredAt),
            _ => None,
        }
    }

    pub fn column(self) -> &'static str {
        match self {
            Envelope::EventType => "event_type",
            Envelope::EventVersion => "event_version",
            Envelope::Producer => "producer",
            Envelope::OccurredAt => "occurred_at",
        }
    }

    /// The column as jsonb, for `count_distinct` and `filter` (which compare as jsonb), given
    /// the column's SQL (`occurred_at`, `r.occurred_at`). The same whatever the session's
    /// TimeZone: a timestamp is written in UTC, `"2026-11-30T10:00:00+00:00"` (what to_jsonb
    /// writes with TimeZone UTC; with another zone it writes the same instant differently, and
    /// a value stored by one session would not be found again by another).
    pub fn jsonb_sql(self, column_sql: &str) -> String {
        match self {
            Envelope::OccurredAt => {
                format!("pg_catalog.to_jsonb((pg_catalog.to_jsonb({column_sql} AT TIME ZONE 'UTC') #>> '{{}}') || '+00:00')")
            }
            _ => format!("pg_catalog.to_jsonb({column_sql})"),
        }
    }

    pub fn sql_type(self) -> SqlType {
        match self {
            Envelope::EventType | Envelope::Producer => SqlType::Text,
            Envelope::EventVersion => SqlType::Integer,
            Envelope::OccurredAt => SqlType::Timestamptz,
        }
    }
}

/// One declaration of a logical field: where it is for an event type and/or version.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldVariant {
    pub event_type: Option<String>,
    pub version: Option<i32>,
    pub path: String,
    pub plan: PathPlan,
}

/// A logical field declared with `define_field`, its variants most specific first.
#[derive(Debug, Clone, PartialEq)]
pub struct LogicalField {
    pub name: String,
    pub sql_type: SqlType,
    pub variants: Vec<FieldVariant>,
}

impl LogicalField {
    /// Orders variants as resolution does: type and version, then type, then version, then any.
    pub fn new(name: String, sql_type: SqlType, mut variants: Vec<FieldVariant>) -> LogicalField {
        variants.sort_by_key(|v| match (&v.event_type, v.version) {
            (Some(_), Some(_)) => 0,
            (Some(_), None) => 1,
            (None, Some(_)) => 2,
            (None, None) => 3,
        });
        LogicalField {
            name,
            sql_type,
            variants,
        }
    }
}

/// Where the logical fields of a source are looked up while parsing a definition.
pub trait FieldCatalog {
    fn lookup(&self, name: &str) -> Option<LogicalField>;
}

/// No logical fields (tests, and sources without declarations).
pub struct NoFields;

impl FieldCatalog for NoFields {
    fn lookup(&self, _name: &str) -> Option<LogicalField> {
        None
    }
}

impl FieldCatalog for Vec<LogicalField> {
    fn lookup(&self, name: &str) -> Option<LogicalField> {
        self.iter().find(|f| f.name == name).cloned()
    }
}

/// A logical field name: `[a-z_][a-z0-9_]*`, at most 63 bytes.
pub fn is_valid_field_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= MAX_COLUMN_NAME
}

/// Where a value comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldRef {
    Envelope(Envelope),
    /// A JSONPath into the payload (`$...`), or, with `element`, into the array element a view
    /// with `unnest` reads (`@...`; `plan` is the path from the element as root).
    Path {
        text: String,
        plan: PathPlan,
        element: bool,
    },
    Logical(LogicalField),
}

impl FieldRef {
    pub fn parse(text: &str, fields: &dyn FieldCatalog) -> Result<FieldRef, DefinitionError> {
        let trimmed = text.trim();
        if trimmed.starts_with('$') {
            return match jsonpath::plan(trimmed) {
                Ok(plan) => Ok(FieldRef::Path {
                    text: trimmed.to_string(),
                    plan,
                    element: false,
                }),
                Err(e) => refuse(format!("invalid JSONPath \"{trimmed}\": {}", e.0)),
            };
        }
        if let Some(rest) = trimmed.strip_prefix('@') {
            let from_root = format!("${rest}");
            return match jsonpath::plan(&from_root) {
                Ok(plan) if plan.is_rich() => refuse_with_hint(
                    format!("invalid reference \"{trimmed}\": a reference to the element takes names and indexes only"),
                    "Write @.name, @.name.inner or @[0]; wildcards, filters and recursive descent read the whole payload ($).",
                ),
                Ok(plan) => Ok(FieldRef::Path {
                    text: trimmed.to_string(),
                    plan,
                    element: true,
                }),
                Err(e) => refuse(format!("invalid JSONPath \"{trimmed}\": {}", e.0)),
            };
        }
        if let Some(env) = Envelope::from_name(trimmed) {
            return Ok(FieldRef::Envelope(env));
        }
        if is_valid_field_name(trimmed) {
            if let Some(field) = fields.lookup(trimmed) {
                return Ok(FieldRef::Logical(field));
            }
            if matches!(
                trimmed,
                "event_id" | "event_key" | "payload" | "ingested_at"
            ) {
                return refuse_with_hint(
                    format!("\"{trimmed}\" is a column of the event table that views do not read"),
                    "A view reads the envelope columns event_type, event_version, producer and occurred_at, JSONPaths into the payload (such as $.sku) and logical fields declared with define_field.",
                );
            }
            return refuse_with_hint(
                format!("undeclared logical field \"{trimmed}\""),
                "Declare it for this event table with eventview.define_field(), or use a JSONPath such as $.sku.",
            );
        }
        refuse_with_hint(
            format!("unknown field reference \"{trimmed}\""),
            "A field reference is a JSONPath starting with $ (such as $.sku), an envelope column (event_type, event_version, producer, occurred_at) or a logical field declared with define_field ([a-z_][a-z0-9_]*).",
        )
    }

    pub fn display(&self) -> &str {
        match self {
            FieldRef::Envelope(e) => e.column(),
            FieldRef::Path { text, .. } => text,
            FieldRef::Logical(f) => &f.name,
        }
    }

    /// Whether this reference reads the unnested array element (`@...`).
    pub fn reads_element(&self) -> bool {
        matches!(self, FieldRef::Path { element: true, .. })
    }

    /// The SQL type of the value this reference yields where a type is fixed: envelope columns
    /// and declared fields. Undeclared JSONPaths have none (text as keys, numeric as numbers).
    pub fn declared_type(&self) -> Option<SqlType> {
        match self {
            FieldRef::Envelope(e) => Some(e.sql_type()),
            FieldRef::Path { .. } => None,
            FieldRef::Logical(f) => Some(f.sql_type),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggKind {
    CountStar,
    Count,
    Sum,
    Avg,
    Min,
    Max,
    CountDistinct,
    /// `percentile(ref, p)`: percentile_disc(p) over the group's values (`Measure::fraction`).
    Percentile,
    /// `approx_percentile(ref, p)`: the same within 1% relative error, from a log-bucketed
    /// sketch of the group's values (`sketch`).
    ApproxPercentile,
}

impl AggKind {
    pub fn name(self) -> &'static str {
        match self {
            AggKind::CountStar | AggKind::Count => "count",
            AggKind::Sum => "sum",
            AggKind::Avg => "avg",
            AggKind::Min => "min",
            AggKind::Max => "max",
            AggKind::CountDistinct => "count_distinct",
            AggKind::Percentile => "percentile",
            AggKind::ApproxPercentile => "approx_percentile",
        }
    }

    /// percentile and approx_percentile: a fraction besides the reference.
    pub fn takes_fraction(self) -> bool {
        matches!(self, AggKind::Percentile | AggKind::ApproxPercentile)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct GroupColumn {
    pub name: String,
    pub field: FieldRef,
}

impl GroupColumn {
    /// Undeclared JSONPath keys are text (what `payload #>> path` gives); envelope keys keep
    /// their type.
    pub fn sql_type(&self) -> SqlType {
        self.field.declared_type().unwrap_or(SqlType::Text)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Measure {
    pub name: String,
    pub kind: AggKind,
    pub field: Option<FieldRef>,
    /// The fraction `p` of `percentile(ref, p)`, in [0, 1]; None for the other aggregates.
    pub fraction: Option<f64>,
    /// As the user wrote it, for messages.
    pub text: String,
}

impl Measure {
    /// Type of the value fed to min/max and stored for it.
    pub fn value_type(&self) -> SqlType {
        match self.kind {
            AggKind::Sum | AggKind::Avg => SqlType::Numeric,
            AggKind::CountDistinct => SqlType::Jsonb,
            // The sketch's bucket number (`sketch::bucket_sql`).
            AggKind::ApproxPercentile => SqlType::Bigint,
            _ => self
                .field
                .as_ref()
                .and_then(|f| f.declared_type())
                .unwrap_or(SqlType::Numeric),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct FilterTerm {
    pub field: FieldRef,
    /// Accepted values, compared as jsonb equality.
    pub values: Vec<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypePolicy {
    Quarantine,
    Skip,
    Fail,
}

impl TypePolicy {
    pub fn parse(text: &str) -> Result<TypePolicy, DefinitionError> {
        match text {
            "quarantine" => Ok(TypePolicy::Quarantine),
            "skip" => Ok(TypePolicy::Skip),
            "fail" => Ok(TypePolicy::Fail),
            other => refuse_with_hint(
                format!("invalid on_type_error \"{other}\""),
                "Use quarantine, skip or fail.",
            ),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TypePolicy::Quarantine => "quarantine",
            TypePolicy::Skip => "skip",
            TypePolicy::Fail => "fail",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ViewDefinition {
    pub group_by: Vec<GroupColumn>,
    pub measures: Vec<Measure>,
    pub event_types: Option<Vec<String>>,
    pub bucketed: bool,
    /// The time zone whose wall clock buckets follow (a name of `pg_timezone_names`, checked by
    /// the caller); None: buckets in UTC.
    pub time_zone: Option<String>,
    /// `unnest`: the JSONPath to the array whose elements are the view's input rows.
    pub unnest: Option<FieldRef>,
    pub filter: Vec<FilterTerm>,
    pub on_type_error: TypePolicy,
    /// A rollup: the view reads the group changes of another incremental view, not events.
    pub rollup: Option<RollupOf>,
}

/// What a rollup takes from its source view. Its group columns and measures carry the source's
/// references and kinds (so their SQL types are the source's); these say which source column
/// each one reads.
#[derive(Debug, Clone, PartialEq)]
pub struct RollupOf {
    /// For each group column, the number (from 1) of the source's group column it keeps.
    pub group_columns: Vec<usize>,
    /// For each measure, the number (from 1) of the source's measure it re-aggregates; None for
    /// `count(*)` (the source's event count).
    pub measures: Vec<Option<usize>>,
    /// The source's group columns the rollup keeps rows of: (number, accepted values), a JSON
    /// null accepting the NULL key.
    pub filter: Vec<(usize, Vec<Value>)>,
}

impl ViewDefinition {
    /// Every field reference the view reads: group keys, measure inputs, filter terms.
    pub fn references(&self) -> impl Iterator<Item = &FieldRef> {
        self.group_by
            .iter()
            .map(|g| &g.field)
            .chain(self.measures.iter().filter_map(|m| m.field.as_ref()))
            .chain(self.filter.iter().map(|f| &f.field))
    }
}

/// The raw arguments of `create_view`, as text where they are JSON.
pub struct DefinitionInput<'a> {
    pub fields: &'a dyn FieldCatalog,
    pub group_by: &'a str,
    pub measures: &'a str,
    pub event_types: Option<Vec<Option<String>>>,
    pub bucketed: bool,
    pub time_zone: Option<&'a str>,
    pub unnest: Option<&'a str>,
    pub filter: Option<&'a str>,
    pub on_type_error: &'a str,
}

fn pairs_of(argument: &str, text: &str) -> Result<Vec<(String, Value)>, DefinitionError> {
    match object_pairs(text) {
        Ok(p) => Ok(p),
        Err(ObjectError::Syntax(e)) => refuse(format!("invalid {argument}: {e}")),
        Err(ObjectError::NotAnObject(kind)) => refuse(format!(
            "invalid {argument}: expected a JSON object, found {kind}"
        )),
    }
}

/// Why a JSON value (valid `json`) cannot become `jsonb`, which a filter value is compared as:
/// PostgreSQL text cannot hold U+0000, and a jsonb number is a `numeric`. Refused here, naming
/// the filter, instead of failing later in a generated statement with another SQLSTATE.
fn jsonb_problem(value: &Value) -> Option<String> {
    match value {
        Value::String(s) if s.contains('\0') => {
            Some("a string contains \\u0000, which jsonb cannot hold".into())
        }
        Value::Number(n) => numeric_problem(&n.to_string()).map(|why| {
            let text = n.to_string();
            let shown = if text.len() > 40 {
                format!("{}...", &text[..40])
            } else {
                text
            };
            format!("the number {shown} is out of the range of a jsonb number ({why})")
        }),
        Value::Array(items) => items.iter().find_map(jsonb_problem),
        Value::Object(map) => map.iter().find_map(|(k, v)| {
            if k.contains('\0') {
                Some("an object key contains \\u0000, which jsonb cannot hold".into())
            } else {
                jsonb_problem(v)
            }
        }),
        _ => None,
    }
}

/// What PostgreSQL's numeric input refuses in a JSON number (`-?digits[.digits][e[+-]digits]`):
/// an exponent of 2^30 or more either way, more than 16383 digits after the decimal point, or a
/// nonzero value with more than 131072 digits before it.
fn numeric_problem(text: &str) -> Option<&'static str> {
    const MAX_EXPONENT: i64 = 1_073_741_823; // INT_MAX / 2
    const MAX_SCALE: i64 = 16_383;
    const MAX_LEADING_EXPONENT: i64 = 131_071; // a weight of 32767 base-10000 digits
    let unsigned = text.trim_start_matches('-');
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], &unsigned[at + 1..]),
        None => (unsigned, "0"),
    };
    let exponent = match exponent.trim_start_matches('+').parse::<i64>() {
        Ok(e) if e.abs() < MAX_EXPONENT => e,
        _ => return Some("exponent out of range"),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if frac.len() as i64 - exponent > MAX_SCALE {
        return Some("more than 16383 digits after the decimal point");
    }
    let leading = match (int.find(|c| c != '0'), frac.find(|c| c != '0')) {
        (Some(i), _) => (int.len() - 1 - i) as i64,
        (None, Some(j)) => -(j as i64) - 1,
        (None, None) => return None, // zero, whatever its exponent
    };
    if leading + exponent > MAX_LEADING_EXPONENT {
        return Some("more than 131072 digits before the decimal point");
    }
    None
}

fn check_column_name(argument: &str, name: &str) -> Result<(), DefinitionError> {
    if name.is_empty() {
        return refuse(format!(
            "invalid {argument}: a column name must not be empty"
        ));
    }
    if name.len() > MAX_COLUMN_NAME {
        return refuse(format!(
            "invalid {argument}: column name \"{name}\" is longer than {MAX_COLUMN_NAME} bytes"
        ));
    }
    if name.contains('\0') {
        return refuse(format!(
            "invalid {argument}: column name contains a NUL character"
        ));
    }
    Ok(())
}

fn reference_text<'v>(
    argument: &str,
    column: &str,
    v: &'v Value,
) -> Result<&'v str, DefinitionError> {
    match v {
        Value::String(s) => Ok(s),
        other => refuse(format!(
            "invalid {argument} column \"{column}\": expected a string, found {}",
            json_kind(other)
        )),
    }
}

/// Parses `count(*)`, `sum($.x)`, ... (function names are case-insensitive).
pub fn parse_aggregate(
    column: &str,
    text: &str,
    fields: &dyn FieldCatalog,
) -> Result<Measure, DefinitionError> {
    let trimmed = text.trim();
    let bad = |why: &str| {
        refuse_with_hint(
            format!("invalid measure \"{column}\": {why}"),
            "Supported aggregates: count(*), count(ref), sum(ref), avg(ref), min(ref), max(ref), count_distinct(ref), percentile(ref, p), approx_percentile(ref, p).",
        )
    };
    let Some(open) = trimmed.find('(') else {
        return bad(&format!("\"{trimmed}\" is not an aggregate call"));
    };
    if !trimmed.ends_with(')') {
        return bad(&format!("\"{trimmed}\" is not an aggregate call"));
    }
    let func = trimmed[..open].trim().to_ascii_lowercase();
    let mut arg = trimmed[open + 1..trimmed.len() - 1].trim();
    let mut fraction = None;
    if func == "percentile" || func == "approx_percentile" {
        // The fraction is the last argument: a JSONPath may hold commas itself.
        let Some(comma) = arg.rfind(',') else {
            return bad(&format!(
                "{func}() takes a field reference and a fraction, such as {func}($.ms, 0.99)"
            ));
        };
        let p = arg[comma + 1..].trim();
        match p.parse::<f64>() {
            Ok(v) if (0.0..=1.0).contains(&v) && !p.is_empty() => fraction = Some(v),
            _ => {
                return bad(&format!(
                    "the fraction of {func}() must be a number from 0 to 1, not \"{p}\""
                ))
            }
        }
        arg = arg[..comma].trim();
    }
    let kind = match (func.as_str(), arg) {
        ("count", "*") => AggKind::CountStar,
        ("count", _) => AggKind::Count,
        ("sum", _) => AggKind::Sum,
        ("avg", _) => AggKind::Avg,
        ("min", _) => AggKind::Min,
        ("max", _) => AggKind::Max,
        ("count_distinct", _) => AggKind::CountDistinct,
        ("percentile", _) => AggKind::Percentile,
        ("approx_percentile", _) => AggKind::ApproxPercentile,
        _ => {
            return bad(&format!(
                "unknown aggregate \"{}\"",
                &trimmed[..open].trim()
            ))
        }
    };
    let field = if kind == AggKind::CountStar {
        None
    } else {
        if arg.is_empty() || arg == "*" {
            return bad(&format!("{}() needs a field reference", kind.name()));
        }
        let field = FieldRef::parse(arg, fields).map_err(|e| DefinitionError {
            message: format!("invalid measure \"{column}\": {}", e.message),
            hint: e.hint,
        })?;
        if let Some(t) = field.declared_type() {
            if (matches!(kind, AggKind::Sum | AggKind::Avg) || kind.takes_fraction())
                && !t.is_number()
            {
                return refuse_with_hint(
                    format!(
                        "invalid measure \"{column}\": {}() needs a number, and {} is {}",
                        kind.name(),
                        field.display(),
                        t.name()
                    ),
                    "Aggregate a numeric field or path (a logical field declared bigint, numeric or double precision), or count the values with count() or count_distinct().",
                );
            }
            if matches!(kind, AggKind::Min | AggKind::Max)
                && matches!(t, SqlType::Boolean | SqlType::Jsonb)
            {
                return bad(&format!(
                    "{}() of {} is not supported",
                    kind.name(),
                    t.name()
                ));
            }
        }
        Some(field)
    };
    Ok(Measure {
        name: column.to_string(),
        kind,
        field,
        fraction,
        text: trimmed.to_string(),
    })
}

/// Parses and validates the arguments of `create_view` into a definition the refresh engine
/// can trust; the first problem found is the error.
pub fn parse_definition(input: &DefinitionInput) -> Result<ViewDefinition, DefinitionError> {
    let on_type_error = TypePolicy::parse(input.on_type_error)?;
    let mut columns = OutputColumns::new(input.bucketed);
    let group_by = parse_group_by(input, &mut columns)?;
    let measures = parse_measures(input, &mut columns)?;
    let event_types = parse_event_types(input.event_types.as_deref())?;
    if input.time_zone.is_some() && !input.bucketed {
        return refuse_with_hint(
            "time_zone needs time_bucket",
            "time_zone says in which wall-clock time the buckets start (a 1 day bucket at local midnight); pass time_bucket too, or leave time_zone out.",
        );
    }
    let filter = match input.filter {
        Some(text) => parse_filter(text, input.fields)?,
        None => Vec::new(),
    };
    let unnest = match input.unnest {
        Some(text) => Some(parse_unnest(text)?),
        None => None,
    };
    let view = ViewDefinition {
        group_by,
        measures,
        event_types,
        bucketed: input.bucketed,
        time_zone: input.time_zone.map(str::to_string),
        unnest,
        filter,
        on_type_error,
        rollup: None,
    };
    if view.unnest.is_none() {
        if let Some(r) = view.references().find(|r| r.reads_element()) {
            return refuse_with_hint(
                format!("reference \"{}\" reads an array element, and the view has no unnest", r.display()),
                "Pass unnest => '$.items' (the JSONPath of the array) to make each element an input row, or read the payload with $.",
            );
        }
    }
    Ok(view)
}

/// `unnest`: a JSONPath to an array in the payload (names and indexes: one value per event).
fn parse_unnest(text: &str) -> Result<FieldRef, DefinitionError> {
    let trimmed = text.trim();
    let hint = "unnest names the array of each event whose elements the view reads, such as '$.items' or '$.order.lines'.";
    if !trimmed.starts_with('$') {
        return refuse_with_hint(
            format!("invalid unnest \"{trimmed}\": it must be a JSONPath starting with $"),
            hint,
        );
    }
    match jsonpath::plan(trimmed) {
        Ok(plan) if plan.is_rich() => refuse_with_hint(
            format!("invalid unnest \"{trimmed}\": it takes names and indexes only"),
            hint,
        ),
        Ok(plan) => Ok(FieldRef::Path {
            text: trimmed.to_string(),
            plan,
            element: false,
        }),
        Err(e) => refuse(format!("invalid unnest \"{trimmed}\": {}", e.0)),
    }
}

/// The output column names of a view taken so far: each must be valid and unique (`bucket`
/// comes first in a view with time_bucket).
struct OutputColumns {
    bucketed: bool,
    seen: Vec<String>,
}

impl OutputColumns {
    fn new(bucketed: bool) -> OutputColumns {
        let seen = if bucketed {
            vec!["bucket".to_string()]
        } else {
            Vec::new()
        };
        OutputColumns { bucketed, seen }
    }

    /// Takes `name`, a key of the JSON object `argument`.
    fn claim(&mut self, argument: &str, name: &str) -> Result<(), DefinitionError> {
        check_column_name(argument, name)?;
        if self.seen.iter().any(|s| s == name) {
            let hint = if name == "bucket" && self.bucketed {
                "A view with time_bucket has a first column named bucket."
            } else {
                "Every group_by and measures key names one output column."
            };
            return refuse_with_hint(format!("duplicate column \"{name}\""), hint);
        }
        self.seen.push(name.to_string());
        Ok(())
    }
}

/// The group columns, `{"name": "reference", ...}` in order.
fn parse_group_by(
    input: &DefinitionInput,
    columns: &mut OutputColumns,
) -> Result<Vec<GroupColumn>, DefinitionError> {
    let mut group_by = Vec::new();
    for (name, value) in pairs_of("group_by", input.group_by)? {
        columns.claim("group_by", &name)?;
        let reference = reference_text("group_by", &name, &value)?;
        let field = FieldRef::parse(reference, input.fields).map_err(|e| DefinitionError {
            message: format!("invalid group_by column \"{name}\": {}", e.message),
            hint: e.hint,
        })?;
        group_by.push(GroupColumn { name, field });
    }
    Ok(group_by)
}

/// The measures, `{"name": "aggregate(reference)", ...}` in order.
fn parse_measures(
    input: &DefinitionInput,
    columns: &mut OutputColumns,
) -> Result<Vec<Measure>, DefinitionError> {
    let mut measures = Vec::new();
    for (name, value) in pairs_of("measures", input.measures)? {
        columns.claim("measures", &name)?;
        let text = reference_text("measures", &name, &value)?;
        measures.push(parse_aggregate(&name, text, input.fields)?);
    }
    Ok(measures)
}

/// The event types a view reads: None for all of them; a list must hold at least one type, and
/// no NULL or empty one.
fn parse_event_types(
    event_types: Option<&[Option<String>]>,
) -> Result<Option<Vec<String>>, DefinitionError> {
    let Some(list) = event_types else {
        return Ok(None);
    };
    if list.is_empty() {
        return refuse_with_hint(
            "invalid event_types: the array is empty",
            "Pass NULL to read every event type.",
        );
    }
    let mut types = Vec::with_capacity(list.len());
    for t in list {
        match t {
            Some(t) if !t.is_empty() => types.push(t.clone()),
            _ => return refuse("invalid event_types: an element is NULL or empty"),
        }
    }
    Ok(Some(types))
}

/// The arguments of `create_view` for a rollup (`source` names an incremental view).
pub struct RollupInput<'a> {
    /// The source view's definition.
    pub source: &'a ViewDefinition,
    pub group_by: &'a str,
    pub measures: &'a str,
    pub filter: Option<&'a str>,
    /// The rollup has a time_bucket (the caller checks it is a whole multiple of the source's).
    pub bucketed: bool,
}

/// Parses a rollup's definition over `input.source`: group columns name source group columns,
/// measures name source measures (each re-aggregated by its own kind) or are `count(*)` (the
/// source's events), the filter names source group columns. The rollup buckets in its source's
/// time zone; it reads no JSONPath, event type or array of its own.
pub fn parse_rollup(input: &RollupInput) -> Result<ViewDefinition, DefinitionError> {
    let source = input.source;
    if input.bucketed && !source.bucketed {
        return refuse_with_hint(
            "a rollup of a view without time_bucket cannot have a time_bucket",
            "A rollup's buckets are made of its source's buckets: give the source a time_bucket, or leave time_bucket out of the rollup.",
        );
    }
    let column_hint = |what: &str| {
        let names: Vec<&str> = match what {
            "group" => source.group_by.iter().map(|g| g.name.as_str()).collect(),
            _ => source.measures.iter().map(|m| m.name.as_str()).collect(),
        };
        let list = if names.is_empty() {
            "it has none".to_string()
        } else {
            names.join(", ")
        };
        format!("A rollup reads the {what} columns of its source view ({list}), not JSONPaths or fields of the events; count(*) counts the source's events.")
    };
    let mut columns = OutputColumns::new(input.bucketed);
    let mut group_by = Vec::new();
    let mut group_columns = Vec::new();
    for (name, value) in pairs_of("group_by", input.group_by)? {
        columns.claim("group_by", &name)?;
        let reference = reference_text("group_by", &name, &value)?.trim();
        let Some(i) = source.group_by.iter().position(|g| g.name == reference) else {
            return refuse_with_hint(
                format!("invalid group_by column \"{name}\": the source view has no group column \"{reference}\""),
                &column_hint("group"),
            );
        };
        group_by.push(GroupColumn {
            name,
            field: source.group_by[i].field.clone(),
        });
        group_columns.push(i + 1);
    }
    let mut measures = Vec::new();
    let mut measure_sources = Vec::new();
    for (name, value) in pairs_of("measures", input.measures)? {
        columns.claim("measures", &name)?;
        let reference = reference_text("measures", &name, &value)?.trim();
        if reference.replace(' ', "").eq_ignore_ascii_case("count(*)") {
            measures.push(Measure {
                name,
                kind: AggKind::CountStar,
                field: None,
                fraction: None,
                text: reference.to_string(),
            });
            measure_sources.push(None);
            continue;
        }
        let Some(i) = source.measures.iter().position(|m| m.name == reference) else {
            return refuse_with_hint(
                format!(
                    "invalid measure \"{name}\": the source view has no measure \"{reference}\""
                ),
                &column_hint("measure"),
            );
        };
        let mut measure = source.measures[i].clone();
        measure.name = name;
        measures.push(measure);
        measure_sources.push(Some(i + 1));
    }
    let mut filter = Vec::new();
    if let Some(text) = input.filter {
        for (reference, value) in pairs_of("filter", text)? {
            let Some(i) = source.group_by.iter().position(|g| g.name == reference) else {
                return refuse_with_hint(
                    format!("invalid filter: the source view has no group column \"{reference}\""),
                    &column_hint("group"),
                );
            };
            filter.push((i + 1, filter_values(&reference, value)?));
        }
    }
    Ok(ViewDefinition {
        group_by,
        measures,
        event_types: None,
        bucketed: input.bucketed,
        time_zone: if input.bucketed {
            source.time_zone.clone()
        } else {
            None
        },
        unnest: None,
        filter: Vec::new(),
        // A rollup reads no event, so it meets no type error (its source left those out).
        on_type_error: TypePolicy::Quarantine,
        rollup: Some(RollupOf {
            group_columns,
            measures: measure_sources,
            filter,
        }),
    })
}

/// The filter, `{"reference": value or [values], ...}`: each value a JSON value jsonb can hold.
fn parse_filter(text: &str, fields: &dyn FieldCatalog) -> Result<Vec<FilterTerm>, DefinitionError> {
    let mut filter = Vec::new();
    for (reference, value) in pairs_of("filter", text)? {
        let field = FieldRef::parse(&reference, fields).map_err(|e| DefinitionError {
            message: format!("invalid filter: {}", e.message),
            hint: e.hint,
        })?;
        let values = filter_values(&reference, value)?;
        filter.push(FilterTerm { field, values });
    }
    Ok(filter)
}

/// The accepted values of the filter term on `reference`: a value or a non-empty list, each one
/// jsonb can hold.
fn filter_values(reference: &str, value: Value) -> Result<Vec<Value>, DefinitionError> {
    let values = match value {
        Value::Array(items) if items.is_empty() => {
            return refuse(format!(
                "invalid filter \"{reference}\": the list of values is empty"
            ))
        }
        Value::Array(items) => items,
        single => vec![single],
    };
    for v in &values {
        if let Some(problem) = jsonb_problem(v) {
            return refuse_with_hint(
                format!("invalid filter \"{reference}\": {problem}"),
                "A filter value is compared as jsonb: leave out the \\u0000 character, and keep numbers within the range of numeric.",
            );
        }
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(group_by: &'a str, measures: &'a str) -> DefinitionInput<'a> {
        DefinitionInput {
            fields: &NoFields,
            group_by,
            measures,
            event_types: None,
            bucketed: false,
            time_zone: None,
            unnest: None,
            filter: None,
            on_type_error: "quarantine",
        }
    }

    #[test]
    fn parses_a_bucketed_definition_with_aggregates_in_any_case() {
        let mut i = input(
            r#"{"sku": "$.sku"}"#,
            r#"{"adds": "count(*)", "qty": "sum($.qty)", "avg_price": "AVG( $.price )", "top": "max($.price)"}"#,
        );
        i.bucketed = true;
        let d = parse_definition(&i).unwrap();
        assert_eq!(d.group_by[0].name, "sku");
        let kinds: Vec<_> = d.measures.iter().map(|m| m.kind).collect();
        assert_eq!(
            kinds,
            [AggKind::CountStar, AggKind::Sum, AggKind::Avg, AggKind::Max]
        );
    }

    #[test]
    fn refuses_what_cannot_work() {
        let cases = [
            (
                r#"{"a": "$.a"}"#,
                r#"{"a": "count(*)"}"#,
                "duplicate column \"a\"",
            ),
            (
                "{}",
                r#"{"x": "median($.a)"}"#,
                "unknown aggregate \"median\"",
            ),
            ("{}", r#"{"x": "sum"}"#, "not an aggregate call"),
            ("{}", r#"{"x": "sum()"}"#, "needs a field reference"),
            ("{}", r#"{"x": "sum(producer)"}"#, "needs a number"),
            (r#"{"k": "$.["}"#, "{}", "invalid JSONPath"),
            (r#"{"k": "Nope"}"#, "{}", "unknown field reference \"Nope\""),
            (
                r#"{"k": "nope"}"#,
                "{}",
                "undeclared logical field \"nope\"",
            ),
            (
                r#"{"k": "event_id"}"#,
                "{}",
                "\"event_id\" is a column of the event table that views do not read",
            ),
            (
                "{}",
                r#"{"x": "max(ingested_at)"}"#,
                "\"ingested_at\" is a column of the event table",
            ),
            (r#"{"k": 1}"#, "{}", "expected a string, found number"),
            ("[]", "{}", "expected a JSON object, found array"),
            (r#"{"": "$.a"}"#, "{}", "must not be empty"),
        ];
        for (g, m, want) in cases {
            let err = parse_definition(&input(g, m)).unwrap_err();
            assert!(err.message.contains(want), "{g} {m}: {}", err.message);
        }
    }

    #[test]
    fn logical_fields_resolve_most_specific_first_and_are_typed() {
        let v = |t: Option<&str>, ver: Option<i32>, p: &str| FieldVariant {
            event_type: t.map(str::to_string),
            version: ver,
            path: p.to_string(),
            plan: crate::jsonpath::plan(p).unwrap(),
        };
        let qty = LogicalField::new(
            "qty".into(),
            SqlType::Bigint,
            vec![
                v(None, None, "$.q"),
                v(Some("cart"), Some(2), "$.item.quantity"),
                v(Some("cart"), None, "$.qty"),
            ],
        );
        assert_eq!(qty.variants[0].path, "$.item.quantity");
        assert_eq!(qty.variants[2].path, "$.q");
        let label = LogicalField::new("label".into(), SqlType::Text, vec![v(None, None, "$.l")]);
        let fields = vec![qty, label];
        let mut i = input(
            r#"{"k": "label"}"#,
            r#"{"s": "sum(qty)", "d": "count_distinct(label)"}"#,
        );
        i.fields = &fields;
        let d = parse_definition(&i).unwrap();
        assert!(matches!(d.group_by[0].field, FieldRef::Logical(_)));
        assert_eq!(d.measures[1].kind, AggKind::CountDistinct);
        let mut bad = input("{}", r#"{"s": "sum(label)"}"#);
        bad.fields = &fields;
        assert!(parse_definition(&bad)
            .unwrap_err()
            .message
            .contains("needs a number, and label is text"));
        let hint = parse_definition(&bad).unwrap_err().hint.unwrap_or_default();
        assert!(hint.contains("count_distinct()"), "{hint}");
        let mut undeclared = input(r#"{"k": "nope"}"#, "{}");
        undeclared.fields = &fields;
        assert!(parse_definition(&undeclared)
            .unwrap_err()
            .message
            .contains("undeclared logical field \"nope\""));
        assert!(!is_valid_field_name("Sku"));
        assert!(is_valid_field_name("_sku_2"));
    }

    #[test]
    fn a_filter_value_jsonb_cannot_hold_is_refused_with_a_hint() {
        let mut i = input("{}", "{}");
        i.filter = Some(r#"{"$.a": "x\u0000y"}"#);
        let e = parse_definition(&i).unwrap_err();
        assert!(
            e.message.contains("which jsonb cannot hold"),
            "{}",
            e.message
        );
        assert!(e.hint.unwrap_or_default().contains("compared as jsonb"));
    }

    #[test]
    fn percentile_takes_a_numeric_reference_and_a_fraction_from_0_to_1() {
        let d = parse_definition(&input(
            r#"{}"#,
            r#"{"p50": "percentile($.ms, 0.5)", "p0": "PERCENTILE($.a[1,2], 0)", "top": "percentile(event_version, 1)"}"#,
        ))
        .unwrap();
        assert_eq!(d.measures[0].kind, AggKind::Percentile);
        assert_eq!(d.measures[0].fraction, Some(0.5));
        assert_eq!(d.measures[1].fraction, Some(0.0));
        assert_eq!(d.measures[1].field.as_ref().unwrap().display(), "$.a[1,2]");
        assert_eq!(d.measures[2].value_type(), SqlType::Integer);
        let d = parse_definition(&input(
            r#"{}"#,
            r#"{"p99": "approx_percentile($.ms, 0.99)"}"#,
        ))
        .unwrap();
        assert_eq!(d.measures[0].kind, AggKind::ApproxPercentile);
        assert_eq!(d.measures[0].fraction, Some(0.99));
        assert_eq!(d.measures[0].value_type(), SqlType::Bigint);
        for (measure, message) in [
            (
                "percentile($.ms)",
                "percentile() takes a field reference and a fraction",
            ),
            (
                "percentile($.ms, 1.5)",
                "must be a number from 0 to 1, not \"1.5\"",
            ),
            ("percentile($.ms, -0.1)", "must be a number from 0 to 1"),
            ("percentile($.ms, NaN)", "must be a number from 0 to 1"),
            (
                "percentile($.ms, half)",
                "must be a number from 0 to 1, not \"half\"",
            ),
            ("percentile(, 0.5)", "percentile() needs a field reference"),
            (
                "percentile(occurred_at, 0.5)",
                "percentile() needs a number, and occurred_at is timestamptz",
            ),
            (
                "approx_percentile($.ms, 2)",
                "the fraction of approx_percentile() must be a number from 0 to 1",
            ),
            (
                "approx_percentile(producer, 0.5)",
                "approx_percentile() needs a number, and producer is text",
            ),
        ] {
            let text = format!(r#"{{"p": "{measure}"}}"#);
            let e = parse_definition(&input("{}", &text)).unwrap_err();
            assert!(e.message.contains(message), "{measure}: {}", e.message);
        }
    }

    #[test]
    fn element_references_need_unnest_and_take_names_and_indexes_only() {
        let mut i = input(
            r#"{"sku": "@.sku"}"#,
            r#"{"units": "sum(@.qty)", "orders": "count_distinct($.order_id)"}"#,
        );
        let e = parse_definition(&i).unwrap_err();
        assert!(
            e.message
                .contains("reads an array element, and the view has no unnest"),
            "{}",
            e.message
        );
        i.unnest = Some("$.items");
        let d = parse_definition(&i).unwrap();
        assert!(d.group_by[0].field.reads_element());
        assert!(!d.measures[1].field.as_ref().unwrap().reads_element());
        assert_eq!(d.unnest.as_ref().unwrap().display(), "$.items");
        for (unnest, message) in [
            ("items", "must be a JSONPath starting with $"),
            ("$.items[*]", "takes names and indexes only"),
        ] {
            i.unnest = Some(unnest);
            let e = parse_definition(&i).unwrap_err();
            assert!(e.message.contains(message), "{unnest}: {}", e.message);
        }
        i.unnest = Some("$.items");
        i.group_by = r#"{"sku": "@.tags[*]"}"#;
        let e = parse_definition(&i).unwrap_err();
        assert!(
            e.message
                .contains("a reference to the element takes names and indexes only"),
            "{}",
            e.message
        );
    }

    #[test]
    fn a_time_zone_needs_buckets() {
        let mut i = input(r#"{}"#, r#"{"n": "count(*)"}"#);
        i.time_zone = Some("Europe/Berlin");
        let e = parse_definition(&i).unwrap_err();
        assert_eq!(e.message, "time_zone needs time_bucket");
        i.bucketed = true;
        let d = parse_definition(&i).unwrap();
        assert_eq!(d.time_zone.as_deref(), Some("Europe/Berlin"));
    }

    #[test]
    fn bucket_is_a_reserved_column_only_with_time_bucket() {
        let mut i = input(r#"{"bucket": "$.b"}"#, "{}");
        assert!(parse_definition(&i).is_ok());
        i.bucketed = true;
        assert!(parse_definition(&i)
            .unwrap_err()
            .message
            .contains("duplicate column \"bucket\""));
    }

    #[test]
    fn event_types_and_policy_are_checked() {
        let mut i = input("{}", "{}");
        i.event_types = Some(vec![]);
        assert!(parse_definition(&i).unwrap_err().message.contains("empty"));
        i.event_types = Some(vec![None]);
        assert!(parse_definition(&i).is_err());
        i.event_types = None;
        i.on_type_error = "ignore";
        assert!(parse_definition(&i)
            .unwrap_err()
            .message
            .contains("on_type_error"));
    }

    #[test]
    fn long_names_are_refused_not_truncated() {
        let g = format!(r#"{{"{}": "$.a"}}"#, "x".repeat(64));
        assert!(parse_definition(&input(&g, "{}"))
            .unwrap_err()
            .message
            .contains("longer than 63"));
    }

    #[test]
    fn filter_accepts_scalars_and_lists() {
        let mut i = input("{}", "{}");
        i.filter = Some(r#"{"$.country": "DE", "event_version": [1, 2]}"#);
        let d = parse_definition(&i).unwrap();
        assert_eq!(d.filter.len(), 2);
        assert_eq!(d.filter[1].values.len(), 2);
        i.filter = Some(r#"{"$.a": []}"#);
        assert!(parse_definition(&i).is_err());
    }

    #[test]
    fn filter_values_jsonb_cannot_hold_are_refused() {
        let mut i = input("{}", "{}");
        for bad in [
            r#"{"$.a": "x\u0000"}"#,
            r#"{"$.a": [1, {"k\u0000": 1}]}"#,
            r#"{"$.a": 1e131072}"#,
            r#"{"$.a": 0.1e131073}"#,
            r#"{"$.a": -1e-16384}"#,
            r#"{"$.a": 0.001e-16381}"#,
            r#"{"$.a": 0e1073741823}"#,
            r#"{"$.a": 1e99999999999999999999}"#,
        ] {
            i.filter = Some(bad);
            let err = parse_definition(&i).unwrap_err().message;
            assert!(err.starts_with("invalid filter \"$.a\": "), "{bad}: {err}");
        }
        // The edges PostgreSQL still accepts (checked against numeric input).
        for good in [
            r#"{"$.a": 1e131071}"#,
            r#"{"$.a": 15e131070}"#,
            r#"{"$.a": -1e-16383}"#,
            r#"{"$.a": 0.000e-16380}"#,
            r#"{"$.a": 0e200000}"#,
            r#"{"$.a": [0.5, "\u00fc", {"k": null}]}"#,
        ] {
            i.filter = Some(good);
            assert!(parse_definition(&i).is_ok(), "{good}");
        }
    }
}
