//! The per-event work of a refresh in one pass over the batch, in Rust: each event's group key,
//! measure inputs and type checks read from its stored jsonb, and the signed delta of each group
//! gathered, for the apply statement to upsert (see `ViewSql::apply_in_one_pass`). It stands for
//! the stages `f`, `ft`, `c` and the grouping of `good` of that statement, which cost about three
//! times a hand-written aggregate over the same events; everything after them (the upsert, value
//! logs and multisets, quarantine, position) stays SQL.
//!
//! A view is planned here (`Plan::of`) when every reference it reads is a JSONPath of member
//! steps or a logical field whose declarations are such paths, declared text for group columns
//! and numeric for measures (text, numeric or integer for `count`); its measures are
//! `count(*)`, `count`, `sum`, `avg`, `min` and `max`; it has no filter, `unnest` or time zone.
//! Every other view keeps the SQL stages.
//!
//! What each reading gives is what the SQL of `values` gives for the same use (the contract's
//! section 6): a group key is the text of a string, number (as `numeric_out` writes it) or
//! boolean, NULL for a JSON null or a missing value, a type error for an object or array; a
//! measure input is a JSON number, NULL for null or missing, a type error for anything else;
//! `count` of a JSONPath counts every value but null. Sizes are checked as `oversize_check`
//! does. An event with a type error counts nowhere: the caller keeps it (`keep_type_error`), and
//! the statement's SQL stages find its reason, so quarantine entries and errors read as theirs.
//!
//! The statement reads the result in parts (`Deltas::rows`): part 0 the group deltas
//! (`Plan::group_columns`), part n the (group, value, signed count) rows of min/max measure n
//! (`Plan::value_columns`), part -1 the events with a type error (`TYPE_ERROR_COLUMNS`).

use hashbrown::HashTable;

use serde::{Deserialize, Serialize};

use crate::definition::{AggKind, FieldRef, SqlType, ViewDefinition};
use crate::jsonb_bytes::{self, Kind, Numeric};
use crate::jsonpath::{PathPlan, Step};
use crate::values::MAX_KEY_BYTES;

/// How one use reads its reference's JSON value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reading {
    /// A group key, or `count` of a text field: the text of a string, number or boolean; NULL
    /// for null or nothing; a type error for an object or array.
    Text,
    /// Input of sum, avg, min, max, or `count` of a numeric field: a JSON number; NULL for null
    /// or nothing; a type error for anything else.
    Number,
    /// `count` of a JSONPath: present and not null; never a type error.
    Present,
}

/// Where a reference is for events of a type and version: the first declaration that applies
/// (in `LogicalField::variants` order); a JSONPath is one declaration applying to every event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Declaration {
    event_type: Option<String>,
    version: Option<i32>,
    members: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Input {
    CountStar,
    /// count(reference): counted when the reading is not NULL.
    Count(usize, Reading),
    /// sum or avg of a reference (avg keeps the same counter and sum).
    Sum(usize),
    Min(usize),
    Max(usize),
}

/// What the pass computes for one view. Made by the SQL generator, passed to the aggregate as
/// text (`to_text`), read back once per refresh (`from_text`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    bucketed: bool,
    references: Vec<Vec<Declaration>>,
    /// The reference of each group column.
    keys: Vec<usize>,
    measures: Vec<Input>,
    /// The min/max measures (numbers from 1) whose added values the group delta gathers into
    /// an array (`m<n>_vals`, values kept in the storage row).
    in_row: Vec<usize>,
}

/// The columns of part -1: an event with a type error, as the statement's `delta_rows` has it.
pub const TYPE_ERROR_COLUMNS: &str = "sign integer, from_delta boolean, event_id bigint, event_type text, event_version integer, producer text, occurred_at timestamptz, payload jsonb";

impl Plan {
    /// The plan of `def`, when the pass covers it (see the module's doc); `in_row`: the
    /// measures whose values the apply keeps in the row.
    pub fn of(def: &ViewDefinition, in_row: &[usize]) -> Option<Plan> {
        if def.rollup.is_some()
            || def.unnest.is_some()
            || def.time_zone.is_some()
            || !def.filter.is_empty()
        {
            return None;
        }
        let mut plan = Plan {
            bucketed: def.bucketed,
            references: Vec::new(),
            keys: Vec::new(),
            measures: Vec::new(),
            in_row: in_row.to_vec(),
        };
        let mut seen: Vec<String> = Vec::new();
        let mut reference = |field: &FieldRef, wanted: SqlType| -> Option<(usize, bool)> {
            let (declarations, logical) = declarations(field, wanted)?;
            let at = match seen.iter().position(|s| s == field.display()) {
                Some(at) => at,
                None => {
                    seen.push(field.display().to_string());
                    plan.references.push(declarations);
                    seen.len() - 1
                }
            };
            Some((at, logical))
        };
        for g in &def.group_by {
            plan.keys.push(reference(&g.field, SqlType::Text)?.0);
        }
        for m in &def.measures {
            let field = m.field.as_ref();
            let input = match m.kind {
                AggKind::CountStar => Input::CountStar,
                AggKind::Count => {
                    let field = field?;
                    let wanted = field.declared_type().unwrap_or(SqlType::Numeric);
                    let (at, logical) = reference(field, wanted)?;
                    // A logical field converts as declared (`values::convert`): text and
                    // numbers (numeric, integer) only; other types keep the SQL stages.
                    let reading = match (logical, wanted) {
                        (false, _) => Reading::Present,
                        (true, SqlType::Text) => Reading::Text,
                        (true, SqlType::Numeric | SqlType::Integer) => Reading::Number,
                        (true, _) => return None,
                    };
                    Input::Count(at, reading)
                }
                AggKind::Sum | AggKind::Avg => Input::Sum(reference(field?, SqlType::Numeric)?.0),
                AggKind::Min => Input::Min(reference(field?, SqlType::Numeric)?.0),
                AggKind::Max => Input::Max(reference(field?, SqlType::Numeric)?.0),
                AggKind::CountDistinct | AggKind::Percentile | AggKind::ApproxPercentile => {
                    return None
                }
            };
            plan.measures.push(input);
        }
        (plan.references.len() <= MAX_ITEMS && plan.measures.len() <= MAX_ITEMS).then_some(plan)
    }

    pub fn bucketed(&self) -> bool {
        self.bucketed
    }

    pub fn to_text(&self) -> String {
        serde_json::to_string(self).expect("a plan serializes")
    }

    /// The plan `to_text` wrote; Err for text no plan gives (references out of range, values
    /// kept in the row of a measure that is no min or max, more than MAX_ITEMS of either).
    pub fn from_text(text: &str) -> Result<Plan, String> {
        let plan: Plan = serde_json::from_str(text)
            .map_err(|e| format!("invalid plan of the refresh pass: {e}"))?;
        let references = plan.references.len();
        let in_range = |r: usize| r < references;
        let valid = references <= MAX_ITEMS
            && plan.measures.len() <= MAX_ITEMS
            && plan.keys.iter().all(|&r| in_range(r))
            && plan.measures.iter().all(|m| match *m {
                Input::CountStar => true,
                Input::Count(r, _) | Input::Sum(r) | Input::Min(r) | Input::Max(r) => in_range(r),
            })
            && plan.in_row.iter().all(|&n| {
                matches!(
                    plan.measures.get(n.wrapping_sub(1)),
                    Some(Input::Min(_) | Input::Max(_))
                )
            });
        if !valid {
            return Err("invalid plan of the refresh pass: it names references or measures it does not have".into());
        }
        Ok(plan)
    }

    /// The column definition list of part 0, the group deltas: the columns of the statement's
    /// `d0` (`ViewSql::group_delta_columns`, then the arrays of values kept in the row, then
    /// `__dirty`).
    pub fn group_columns(&self) -> String {
        let mut cols = self.key_columns();
        cols.push("__count bigint".into());
        for (i, m) in self.measures.iter().enumerate() {
            let n = i + 1;
            match m {
                Input::CountStar => {}
                Input::Count(..) => cols.push(format!("m{n}_n bigint")),
                Input::Sum(_) => {
                    cols.push(format!("m{n}_n bigint"));
                    cols.push(format!("m{n}_sum numeric"));
                }
                Input::Min(_) | Input::Max(_) => cols.push(format!("m{n}_val numeric")),
            }
        }
        for n in &self.in_row {
            cols.push(format!("m{n}_vals numeric[]"));
        }
        cols.push("__dirty boolean".into());
        cols.join(", ")
    }

    /// The column definition list of part `n`, the (group, value, signed count) rows of min/max
    /// measure `n`, as the statement's `a<n>` selects them.
    pub fn value_columns(&self) -> String {
        let mut cols = self.key_columns();
        cols.push("v numeric".into());
        cols.push("n bigint".into());
        cols.join(", ")
    }

    fn key_columns(&self) -> Vec<String> {
        let mut cols = vec!["__k boolean".to_string()];
        if self.bucketed {
            cols.push("bucket timestamptz".into());
        }
        for i in 1..=self.keys.len() {
            cols.push(format!("g{i} text"));
            cols.push(format!("g{i}_null boolean"));
        }
        cols
    }

    /// Whether events are checked for sizes (`ViewSql::oversize_check`): a view with group
    /// columns or min/max measures.
    fn sized(&self) -> bool {
        !self.keys.is_empty()
            || self
                .measures
                .iter()
                .any(|m| matches!(m, Input::Min(_) | Input::Max(_)))
    }
}

/// The declarations of a reference the pass reads, and whether it is a logical field; None
/// when it does not read it: an envelope column, a rich or indexed path, the element of
/// `unnest`, a logical field of another type than `wanted`.
fn declarations(field: &FieldRef, wanted: SqlType) -> Option<(Vec<Declaration>, bool)> {
    let members = |plan: &PathPlan| -> Option<Vec<String>> {
        let PathPlan::Simple(steps) = plan else {
            return None;
        };
        steps
            .iter()
            .map(|s| match s {
                Step::Member(name) => Some(name.clone()),
                Step::Index(_) => None,
            })
            .collect()
    };
    match field {
        FieldRef::Path {
            plan,
            element: false,
            ..
        } => Some((
            vec![Declaration {
                event_type: None,
                version: None,
                members: members(plan)?,
            }],
            false,
        )),
        FieldRef::Logical(f) if f.sql_type == wanted => {
            let declarations = f
                .variants
                .iter()
                .map(|v| {
                    Some(Declaration {
                        event_type: v.event_type.clone(),
                        version: v.version,
                        members: members(&v.plan)?,
                    })
                })
                .collect::<Option<Vec<_>>>()?;
            Some((declarations, true))
        }
        _ => None,
    }
}

/// FxHash's multiply-and-rotate over 8 bytes at a time: several times faster than SipHash on
/// keys of a few dozen bytes. Its keys are payload values, so a producer could make them collide;
/// so could they with PostgreSQL's own hash aggregate, whose hash function has a fixed seed too.
fn hash_bytes(bytes: &[u8]) -> u64 {
    const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;
    let add = |hash: u64, word: u64| (hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    let mut hash = add(0, bytes.len() as u64);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        hash = add(hash, u64::from_ne_bytes(chunk.try_into().expect("8 bytes")));
    }
    let mut last = [0u8; 8];
    let rest = chunks.remainder();
    last[..rest.len()].copy_from_slice(rest);
    add(hash, u64::from_ne_bytes(last))
}

/// The exact sum of two decimals (m / 10^d), at the larger scale; None past an i128.
fn add_decimal((m1, d1): (i128, u32), (m2, d2): (i128, u32)) -> Option<(i128, u32)> {
    let d = d1.max(d2);
    let scaled = |m: i128, from: u32| m.checked_mul(10i128.checked_pow(d - from)?);
    Some((scaled(m1, d1)?.checked_add(scaled(m2, d2)?)?, d))
}

/// The text of a decimal (m / 10^d) with d digits after the point, as numeric_out writes it.
fn decimal_text((m, d): (i128, u32)) -> String {
    let digits = m.unsigned_abs().to_string();
    let d = d as usize;
    let padded = if digits.len() <= d {
        format!("{}{digits}", "0".repeat(d + 1 - digits.len()))
    } else {
        digits
    };
    let (integer, fraction) = padded.split_at(padded.len() - d);
    let sign = if m < 0 { "-" } else { "" };
    if d == 0 {
        format!("{sign}{integer}")
    } else {
        format!("{sign}{integer}.{fraction}")
    }
}

/// Bytes in one of the arenas of `Deltas` (`keys`, `values`).
#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    len: usize,
}

impl Span {
    /// Its bytes in `arena`.
    fn of(self, arena: &[u8]) -> &[u8] {
        &arena[self.start..self.start + self.len]
    }
}

/// Appends `data` to `arena`.
fn keep(arena: &mut Vec<u8>, data: &[u8]) -> Span {
    let span = Span {
        start: arena.len(),
        len: data.len(),
    };
    arena.extend_from_slice(data);
    span
}

/// One measure's delta in one group.
#[derive(Debug, Default)]
struct MeasureDelta {
    /// Inputs counted (signed).
    n: i64,
    /// sum/avg: the sum of the inputs while it fits an exact decimal (m / 10^d, d the largest
    /// display scale of its terms, as numeric addition keeps it; see `add_decimal`), and each
    /// input after it did not, with its sign (true: added).
    exact: (i128, u32),
    signed: Vec<(bool, Span)>,
    overflowed: bool,
    /// min/max: the extreme of the added values.
    extreme: Option<Span>,
    /// min/max kept in the row: the added values, in order.
    added: Vec<Span>,
}

#[derive(Debug)]
struct Group {
    key: Span,
    count: i64,
    dirty: bool,
}

/// A distinct value of a min/max measure in a group (the first of its equals), and its signed
/// count.
#[derive(Debug)]
struct ValueCount {
    group: u32,
    measure: u32,
    value: Span,
    /// `Numeric::value_key` of the value, in `value_keys`.
    key: Span,
    n: i64,
}

/// An event whose reading the pass refuses: what the statement needs to find its reason.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeErrorEvent {
    pub event_id: i64,
    pub event_type: String,
    pub event_version: i32,
    pub producer: String,
    pub occurred_at: i64,
    /// The jsonb's root container (the varlena's payload).
    pub payload: Vec<u8>,
}

/// What `Deltas::add` did with an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    Counted,
    /// A type error: counted nowhere (see `keep_type_error`).
    TypeError,
    /// The stored jsonb is malformed (PostgreSQL never stores one): counted nowhere.
    Unreadable,
}

/// Most references and measures a plan has (`Plan::of` refuses more): what an event's readings
/// take on the stack.
const MAX_ITEMS: usize = 32;

/// The group deltas of one batch. Groups, their keys and values live in a few flat vectors
/// (no allocation per group but for sums and values kept in the row), found through hash
/// tables of indexes (with each entry's hash, for growing them).
#[derive(Debug)]
pub struct Deltas {
    plan: Plan,
    groups: Vec<Group>,
    /// Group `g`'s delta of measure `i` at `g * measures + i`.
    measures: Vec<MeasureDelta>,
    by_key: HashTable<(u64, u32)>,
    /// The group keys (see `add`).
    keys: Vec<u8>,
    value_counts: Vec<ValueCount>,
    by_value: HashTable<(u64, u32)>,
    value_keys: Vec<u8>,
    /// The numeric values read, as varlena payloads.
    values: Vec<u8>,
    /// The group key and value key being built, kept between events.
    key: Vec<u8>,
    value_key: Vec<u8>,
    type_errors: Vec<TypeErrorEvent>,
}

/// A reference's value in one event: its kind and bytes as `jsonb_bytes::select` gives them;
/// None when nothing is selected.
type Found<'a> = Option<(Kind, &'a [u8])>;

/// A reading of `found`: Ok(None) for NULL, Err(()) for a type error.
fn read<'a>(found: Found<'a>, reading: Reading) -> Result<Option<(Kind, &'a [u8])>, ()> {
    let Some((kind, bytes)) = found else {
        return Ok(None);
    };
    match (reading, kind) {
        (_, jsonb_bytes::NULL) => Ok(None),
        (Reading::Present, _) => Ok(Some((kind, bytes))),
        (Reading::Text, jsonb_bytes::OBJECT | jsonb_bytes::ARRAY) => Err(()),
        (Reading::Text, _) => Ok(Some((kind, bytes))),
        (Reading::Number, jsonb_bytes::NUMBER) => Ok(Some((kind, bytes))),
        (Reading::Number, _) => Err(()),
    }
}

impl Deltas {
    pub fn new(plan: Plan) -> Deltas {
        Deltas {
            plan,
            groups: Vec::new(),
            measures: Vec::new(),
            by_key: HashTable::with_capacity(1024),
            keys: Vec::new(),
            value_counts: Vec::new(),
            by_value: HashTable::new(),
            value_keys: Vec::new(),
            values: Vec::new(),
            key: Vec::new(),
            value_key: Vec::new(),
            type_errors: Vec::new(),
        }
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Adds one signed event row (`sign` +1 or -1) of the batch: `bucket` its bucket (when the
    /// view is bucketed), `doc` its payload's root container.
    pub fn add(
        &mut self,
        sign: i32,
        event_type: &str,
        event_version: i32,
        bucket: Option<i64>,
        doc: &[u8],
    ) -> Added {
        let mut found: [Found; MAX_ITEMS] = [None; MAX_ITEMS];
        for (slot, declarations) in found.iter_mut().zip(&self.plan.references) {
            *slot = declarations
                .iter()
                .find(|d| {
                    d.event_type.as_deref().is_none_or(|t| t == event_type)
                        && d.version.is_none_or(|v| v == event_version)
                })
                .and_then(|d| jsonb_bytes::select(doc, &d.members));
        }
        // The group key: bucket, then per column a flag and the text.
        let mut key = std::mem::take(&mut self.key);
        let outcome = self.group_key(&found, bucket, &mut key);
        let outcome = outcome.and_then(|key_bytes| self.count(sign, &found, &key, key_bytes));
        self.key = key;
        outcome.unwrap_or_else(|added| added)
    }

    /// Writes the group key of an event into `key` (see `add`); Ok: the bytes its texts take
    /// as `pg_column_size` counts them.
    fn group_key(
        &self,
        found: &[Found],
        bucket: Option<i64>,
        key: &mut Vec<u8>,
    ) -> Result<usize, Added> {
        key.clear();
        if self.plan.bucketed {
            key.extend_from_slice(&bucket.unwrap_or_default().to_ne_bytes());
        }
        let mut key_bytes = 0usize;
        for &r in &self.plan.keys {
            let text_start = key.len() + 5;
            match read(found[r], Reading::Text) {
                Err(()) => return Err(Added::TypeError),
                Ok(None) => key.push(0),
                Ok(Some((kind, bytes))) => {
                    key.push(1);
                    key.extend_from_slice(&[0; 4]);
                    if kind == jsonb_bytes::NUMBER {
                        Numeric::read(bytes)
                            .ok_or(Added::Unreadable)?
                            .write_text(key);
                    } else {
                        key.extend_from_slice(bytes);
                    }
                    let len = key.len() - text_start;
                    key[text_start - 4..text_start].copy_from_slice(&(len as u32).to_ne_bytes());
                    // pg_column_size of the text: its payload and a 4-byte header.
                    key_bytes += len + 4;
                }
            }
        }
        Ok(key_bytes)
    }

    /// Counts an event with group key `key` (see `add`), unless a measure's reading or the
    /// sizes refuse it.
    fn count(
        &mut self,
        sign: i32,
        found: &[Found],
        key: &[u8],
        key_bytes: usize,
    ) -> Result<Added, Added> {
        // Each measure's input: counted or not, and its numeric payload.
        let mut inputs: [(bool, Option<&[u8]>); MAX_ITEMS] = [(false, None); MAX_ITEMS];
        for (input, m) in inputs.iter_mut().zip(&self.plan.measures) {
            *input = match *m {
                Input::CountStar => (true, None),
                Input::Count(r, reading) => match read(found[r], reading) {
                    Err(()) => return Err(Added::TypeError),
                    Ok(value) => (value.is_some(), None),
                },
                Input::Sum(r) | Input::Min(r) | Input::Max(r) => {
                    match read(found[r], Reading::Number) {
                        Err(()) => return Err(Added::TypeError),
                        Ok(None) => (false, None),
                        Ok(Some((_, bytes))) => match jsonb_bytes::varlena_data(bytes) {
                            Some(data) if Numeric::from_data(data).is_some() => (true, Some(data)),
                            _ => return Err(Added::Unreadable),
                        },
                    }
                }
            };
        }
        let measures = self.plan.measures.len();
        let inputs = &inputs[..measures];
        if self.plan.sized() {
            // As `oversize_check`: the key's texts, then with each min/max value's numeric.
            let limit = MAX_KEY_BYTES as usize;
            if !self.plan.keys.is_empty() && key_bytes > limit {
                return Err(Added::TypeError);
            }
            for (m, (_, value)) in self.plan.measures.iter().zip(inputs) {
                if matches!(m, Input::Min(_) | Input::Max(_))
                    && key_bytes + value.map_or(0, |v| v.len() + 4) > limit
                {
                    return Err(Added::TypeError);
                }
            }
        }
        let g = self.group_of(key);
        let added = sign > 0;
        let group = &mut self.groups[g];
        group.count += i64::from(sign);
        group.dirty |= !added;
        for (i, (m, &(counted, value))) in self.plan.measures.iter().zip(inputs).enumerate() {
            let delta = &mut self.measures[g * measures + i];
            match (*m, value) {
                (Input::CountStar, _) => {}
                (Input::Count(..), _) => {
                    if counted {
                        delta.n += i64::from(sign);
                    }
                }
                (_, None) => {}
                (Input::Sum(_), Some(data)) => {
                    delta.n += i64::from(sign);
                    if !delta.overflowed {
                        let term = Numeric::from_data(data).and_then(|n| n.as_decimal());
                        let signed_term = term.map(|(m, d)| (if added { m } else { -m }, d));
                        match signed_term.and_then(|t| add_decimal(delta.exact, t)) {
                            Some(sum) => {
                                delta.exact = sum;
                                continue;
                            }
                            None => delta.overflowed = true,
                        }
                    }
                    let span = keep(&mut self.values, data);
                    delta.signed.push((added, span));
                }
                (Input::Min(_) | Input::Max(_), Some(data)) => {
                    // The value's bytes, kept when something keeps the value (so that memory
                    // grows with the distinct values, extremes and values kept in the row).
                    let mut span = None;
                    let mut kept =
                        |values: &mut Vec<u8>| *span.get_or_insert_with(|| keep(values, data));
                    let number = Numeric::from_data(data).expect("checked above");
                    let value_key = &mut self.value_key;
                    value_key.clear();
                    value_key.extend_from_slice(&(g as u32).to_ne_bytes());
                    value_key.extend_from_slice(&(i as u32).to_ne_bytes());
                    number.value_key(value_key);
                    let hash = hash_bytes(value_key);
                    let counts = &self.value_counts;
                    let value_keys = &self.value_keys;
                    let same = |&(h, v): &(u64, u32)| {
                        h == hash && counts[v as usize].key.of(value_keys) == value_key.as_slice()
                    };
                    match self.by_value.find(hash, same) {
                        Some(&(_, v)) => self.value_counts[v as usize].n += i64::from(sign),
                        None => {
                            let key = keep(&mut self.value_keys, value_key);
                            let value = kept(&mut self.values);
                            self.by_value.insert_unique(
                                hash,
                                (hash, self.value_counts.len() as u32),
                                |&(h, _)| h,
                            );
                            self.value_counts.push(ValueCount {
                                group: g as u32,
                                measure: i as u32,
                                value,
                                key,
                                n: i64::from(sign),
                            });
                        }
                    }
                    if !added {
                        continue;
                    }
                    if self.plan.in_row.contains(&(i + 1)) {
                        delta.added.push(kept(&mut self.values));
                    }
                    // As min and max aggregates keep the later of equal values.
                    let replaces = match delta.extreme {
                        None => true,
                        Some(current) => {
                            let current = Numeric::from_data(current.of(&self.values))
                                .expect("checked when kept");
                            let order = number.cmp_value(&current);
                            if matches!(m, Input::Min(_)) {
                                order.is_le()
                            } else {
                                order.is_ge()
                            }
                        }
                    };
                    if replaces {
                        delta.extreme = Some(kept(&mut self.values));
                    }
                }
            }
        }
        Ok(Added::Counted)
    }

    /// The group of key `key`, made when new.
    fn group_of(&mut self, key: &[u8]) -> usize {
        let hash = hash_bytes(key);
        let (keys, groups) = (&self.keys, &self.groups);
        let same = |&(h, g): &(u64, u32)| h == hash && groups[g as usize].key.of(keys) == key;
        if let Some(&(_, g)) = self.by_key.find(hash, same) {
            return g as usize;
        }
        let g = self.groups.len();
        let key = keep(&mut self.keys, key);
        self.groups.push(Group {
            key,
            count: 0,
            dirty: false,
        });
        self.measures
            .extend((0..self.plan.measures.len()).map(|_| MeasureDelta::default()));
        self.by_key
            .insert_unique(hash, (hash, g as u32), |&(h, _)| h);
        g
    }

    /// Keeps an event `add` found a type error in, added (sign +1), for part -1. (A retracted
    /// event with a type error was never counted, so it is left out alone.)
    pub fn keep_type_error(&mut self, event: TypeErrorEvent) {
        self.type_errors.push(event);
    }

    /// Each row of part `part` (see the module's doc; none for another number), given to
    /// `emit`. `sum` gives the payload of the numeric sum of a decimal (its text) and of the
    /// signed values (true: added) after it, as `coalesce(sum(sign * value), 0)` gives it.
    pub fn rows(
        &self,
        part: i32,
        mut sum: impl FnMut(&str, &[(bool, &[u8])]) -> Vec<u8>,
        mut emit: impl FnMut(&[Cell]),
    ) {
        let values = |s: Span| s.of(&self.values);
        let measures = self.plan.measures.len();
        let mut row: Vec<Cell> = Vec::new();
        match part {
            0 => {
                let row_len = self.plan.keys.len() * 2 + measures * 2 + 4;
                let mut signed: Vec<(bool, &[u8])> = Vec::new();
                for (g, group) in self.groups.iter().enumerate() {
                    let deltas = &self.measures[g * measures..(g + 1) * measures];
                    // The sums first: the row borrows them.
                    let sums: Vec<Vec<u8>> = self
                        .plan
                        .measures
                        .iter()
                        .zip(deltas)
                        .filter(|(m, _)| matches!(m, Input::Sum(_)))
                        .map(|(_, delta)| {
                            signed.clear();
                            signed.extend(delta.signed.iter().map(|&(a, s)| (a, values(s))));
                            sum(&decimal_text(delta.exact), &signed)
                        })
                        .collect();
                    let mut sums = sums.iter();
                    let mut row = Vec::with_capacity(row_len);
                    self.key_cells(group.key, &mut row);
                    row.push(Cell::Int8(group.count));
                    for (m, delta) in self.plan.measures.iter().zip(deltas) {
                        match m {
                            Input::CountStar => {}
                            Input::Count(..) => row.push(Cell::Int8(delta.n)),
                            Input::Sum(_) => {
                                row.push(Cell::Int8(delta.n));
                                row.push(Cell::Numeric(sums.next().expect("a sum per sum")));
                            }
                            Input::Min(_) | Input::Max(_) => row.push(match delta.extreme {
                                Some(span) => Cell::Numeric(values(span)),
                                None => Cell::Null,
                            }),
                        }
                    }
                    for n in &self.plan.in_row {
                        let added = &deltas[n - 1].added;
                        row.push(Cell::NumericArray(
                            added.iter().map(|&s| values(s)).collect(),
                        ));
                    }
                    row.push(Cell::Bool(group.dirty));
                    emit(&row);
                }
            }
            -1 => {
                for e in &self.type_errors {
                    row.clear();
                    row.extend([
                        Cell::Int4(1),
                        Cell::Bool(true),
                        Cell::Int8(e.event_id),
                        Cell::Text(e.event_type.as_bytes()),
                        Cell::Int4(e.event_version),
                        Cell::Text(e.producer.as_bytes()),
                        Cell::Timestamptz(e.occurred_at),
                        Cell::Jsonb(&e.payload),
                    ]);
                    emit(&row);
                }
            }
            n => {
                let i = usize::try_from(n - 1).unwrap_or(usize::MAX);
                if !matches!(
                    self.plan.measures.get(i),
                    Some(Input::Min(_) | Input::Max(_))
                ) {
                    return;
                }
                for count in self.value_counts.iter().filter(|c| c.measure as usize == i) {
                    row.clear();
                    self.key_cells(self.groups[count.group as usize].key, &mut row);
                    row.push(Cell::Numeric(values(count.value)));
                    row.push(Cell::Int8(count.n));
                    emit(&row);
                }
            }
        }
    }

    /// `__k`, the bucket, and per group column its text ('' for NULL) and NULL flag.
    fn key_cells<'a>(&'a self, key: Span, row: &mut Vec<Cell<'a>>) {
        let key = key.of(&self.keys);
        row.push(Cell::Bool(true));
        let mut at = 0;
        if self.plan.bucketed {
            row.push(Cell::Timestamptz(i64::from_ne_bytes(
                key[..8].try_into().expect("8 bytes"),
            )));
            at = 8;
        }
        for _ in &self.plan.keys {
            if key[at] == 0 {
                row.push(Cell::Text(b""));
                row.push(Cell::Bool(true));
                at += 1;
            } else {
                let len = u32::from_ne_bytes(key[at + 1..at + 5].try_into().expect("4 bytes"));
                let end = at + 5 + len as usize;
                row.push(Cell::Text(&key[at + 5..end]));
                row.push(Cell::Bool(false));
                at = end;
            }
        }
    }
}

/// One cell of a row of `Deltas::rows`.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell<'a> {
    Null,
    Bool(bool),
    Int4(i32),
    Int8(i64),
    /// Microseconds since 2000-01-01 00:00 UTC.
    Timestamptz(i64),
    /// A text's bytes (valid in the database's encoding: from a jsonb string or a text datum).
    Text(&'a [u8]),
    /// A numeric's varlena payload (from stored jsonb or PostgreSQL's numeric arithmetic).
    Numeric(&'a [u8]),
    /// A jsonb's varlena payload (a stored payload).
    Jsonb(&'a [u8]),
    /// A one-dimensional array of numerics' varlena payloads.
    NumericArray(Vec<&'a [u8]>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::{parse_definition, DefinitionInput, FieldVariant, LogicalField};
    use crate::jsonb_bytes::tests::{encode, numeric_of};

    fn def_with(
        fields: &dyn crate::definition::FieldCatalog,
        group_by: &str,
        measures: &str,
        filter: Option<&str>,
        time_zone: Option<&str>,
    ) -> ViewDefinition {
        parse_definition(&DefinitionInput {
            fields,
            group_by,
            measures,
            event_types: None,
            bucketed: true,
            time_zone,
            unnest: None,
            filter,
            on_type_error: "quarantine",
        })
        .unwrap()
    }

    fn def(group_by: &str, measures: &str) -> ViewDefinition {
        def_with(&crate::definition::NoFields, group_by, measures, None, None)
    }

    fn text(numeric_payload: &[u8]) -> String {
        let mut out = Vec::new();
        Numeric::from_data(numeric_payload)
            .unwrap()
            .write_text(&mut out);
        String::from_utf8(out).unwrap()
    }

    /// The rows of a part as text: NULL, t/f, numbers, texts (numerics as numeric_out writes
    /// them in the columns named so).
    fn show(deltas: &Deltas, part: i32, numeric_columns: &[usize]) -> Vec<String> {
        let mut rows = Vec::new();
        deltas.rows(part, terms, |row| {
            rows.push(
                row.iter()
                    .enumerate()
                    .map(|(i, cell)| match cell {
                        Cell::Null => "NULL".to_string(),
                        Cell::Bool(b) => if *b { "t" } else { "f" }.to_string(),
                        Cell::Int4(v) => v.to_string(),
                        Cell::Int8(v) | Cell::Timestamptz(v) => v.to_string(),
                        Cell::Numeric(b) if !numeric_columns.contains(&i) => {
                            format!("'{}'", String::from_utf8_lossy(b))
                        }
                        Cell::Numeric(b) => text(b),
                        Cell::Text(b) | Cell::Jsonb(b) => {
                            format!("'{}'", String::from_utf8_lossy(b))
                        }
                        Cell::NumericArray(items) => format!(
                            "{{{}}}",
                            items.iter().map(|b| text(b)).collect::<Vec<_>>().join(",")
                        ),
                    })
                    .collect::<Vec<_>>()
                    .join(" "),
            )
        });
        rows
    }

    /// A sum written as its decimal and the signed terms after it, for the tests to read.
    fn terms(decimal: &str, signed: &[(bool, &[u8])]) -> Vec<u8> {
        let terms: Vec<String> = signed
            .iter()
            .map(|(added, v)| format!("{}{}", if *added { "+" } else { "-" }, text(v)))
            .collect();
        format!("{decimal}{}", terms.join("")).into_bytes()
    }

    fn add(d: &mut Deltas, sign: i32, bucket: i64, doc: &str) -> Added {
        let doc = encode(&serde_json::from_str(doc).unwrap());
        d.add(sign, "t", 1, Some(bucket), &doc)
    }

    #[test]
    fn plans_cover_paths_of_members_and_simple_measures_only() {
        let peers = def(
            r#"{"sku": "$.sku"}"#,
            r#"{"n": "count(*)", "q": "sum($.qty)", "p": "max($.price)", "a": "avg($.x.y)", "c": "count($.z)", "l": "min($.price)"}"#,
        );
        assert!(Plan::of(&peers, &[3]).is_some());
        let refused = [
            def(r#"{"sku": "$.sku[0]"}"#, r#"{"n": "count(*)"}"#),
            def(r#"{"sku": "$..sku"}"#, r#"{"n": "count(*)"}"#),
            def(r#"{"p": "producer"}"#, r#"{"n": "count(*)"}"#),
            def(r#"{"sku": "$.sku"}"#, r#"{"n": "count_distinct($.u)"}"#),
            def(
                r#"{"sku": "$.sku"}"#,
                r#"{"n": "approx_percentile($.u, 0.5)"}"#,
            ),
            def(r#"{"sku": "$.sku"}"#, r#"{"n": "sum(event_version)"}"#),
            def_with(
                &crate::definition::NoFields,
                r#"{"sku": "$.sku"}"#,
                r#"{"n": "count(*)"}"#,
                Some(r#"{"$.c": ["web"]}"#),
                None,
            ),
            def_with(
                &crate::definition::NoFields,
                r#"{"sku": "$.sku"}"#,
                r#"{"n": "count(*)"}"#,
                None,
                Some("Europe/Berlin"),
            ),
        ];
        for d in &refused {
            assert!(Plan::of(d, &[]).is_none(), "{d:?}");
        }
        let field = |t: SqlType| {
            vec![LogicalField::new(
                "f".into(),
                t,
                vec![FieldVariant {
                    event_type: None,
                    version: Some(2),
                    path: "$.a.b".into(),
                    plan: crate::jsonpath::plan("$.a.b").unwrap(),
                }],
            )]
        };
        let text_field = field(SqlType::Text);
        let numeric_field = field(SqlType::Numeric);
        let key = |fields: &Vec<LogicalField>| {
            def_with(fields, r#"{"k": "f"}"#, r#"{"n": "count(*)"}"#, None, None)
        };
        let count = |fields: &Vec<LogicalField>| {
            def_with(
                fields,
                r#"{"k": "$.k"}"#,
                r#"{"c": "count(f)", "s": "max(f)"}"#,
                None,
                None,
            )
        };
        assert!(Plan::of(&key(&text_field), &[]).is_some());
        assert!(Plan::of(&key(&numeric_field), &[]).is_none());
        assert!(Plan::of(&count(&numeric_field), &[]).is_some());
        for t in [
            SqlType::Bigint,
            SqlType::Boolean,
            SqlType::Jsonb,
            SqlType::Timestamptz,
            SqlType::Double,
        ] {
            let fields = field(t);
            let counted = def_with(
                &fields,
                r#"{"k": "$.k"}"#,
                r#"{"c": "count(f)"}"#,
                None,
                None,
            );
            assert!(Plan::of(&counted, &[]).is_none(), "{t:?}");
        }
        let integer_field = field(SqlType::Integer);
        let counted = def_with(
            &integer_field,
            r#"{"k": "$.k"}"#,
            r#"{"c": "count(f)"}"#,
            None,
            None,
        );
        assert!(Plan::of(&counted, &[]).is_some());
        let plan = Plan::of(&peers, &[3]).unwrap();
        assert_eq!(Plan::from_text(&plan.to_text()).unwrap(), plan);
        // Text no plan gives is refused, not read past its references.
        let text = plan.to_text();
        for bad in [
            text.replace(r#""keys":[0]"#, r#""keys":[9]"#),
            text.replace(r#"{"Sum":1}"#, r#"{"Sum":7}"#),
            text.replace(r#""in_row":[3]"#, r#""in_row":[2]"#),
            text.replace(r#""in_row":[3]"#, r#""in_row":[0]"#),
            "{}".to_string(),
        ] {
            assert_ne!(bad, text);
            assert!(Plan::from_text(&bad).is_err(), "{bad}");
        }
        assert_eq!(
            plan.group_columns(),
            "__k boolean, bucket timestamptz, g1 text, g1_null boolean, __count bigint, m2_n bigint, m2_sum numeric, m3_val numeric, m4_n bigint, m4_sum numeric, m5_n bigint, m6_val numeric, m3_vals numeric[], __dirty boolean"
        );
        assert_eq!(
            plan.value_columns(),
            "__k boolean, bucket timestamptz, g1 text, g1_null boolean, v numeric, n bigint"
        );
    }

    #[test]
    fn keys_read_as_the_text_of_scalars() {
        let d = def(r#"{"sku": "$.item.sku"}"#, r#"{"n": "count(*)"}"#);
        let mut deltas = Deltas::new(Plan::of(&d, &[]).unwrap());
        for doc in [
            r#"{"item": {"sku": "A"}}"#,
            r#"{"item": {"sku": 1.50}}"#,
            r#"{"item": {"sku": true}}"#,
            r#"{"item": {"sku": null}}"#,
            r#"{"item": {}}"#,
            r#"{"item": "A"}"#,
            r#"{"item": {"sku": "A"}}"#,
            r#"{"item": {"sku": "1.50"}}"#,
            r#"{"item": {"sku": ""}}"#,
        ] {
            assert_eq!(add(&mut deltas, 1, 7, doc), Added::Counted, "{doc}");
        }
        for doc in [r#"{"item": {"sku": {"a": 1}}}"#, r#"{"item": {"sku": []}}"#] {
            assert_eq!(add(&mut deltas, 1, 7, doc), Added::TypeError, "{doc}");
        }
        assert_eq!(
            show(&deltas, 0, &[]),
            [
                "t 7 'A' f 2 f",
                "t 7 '1.50' f 2 f",
                "t 7 'true' f 1 f",
                "t 7 '' t 3 f",
                "t 7 '' f 1 f",
            ]
        );
        assert!(show(&deltas, -1, &[]).is_empty());
    }

    #[test]
    fn measures_add_signed_values_and_keep_the_extremes_of_additions() {
        let d = def(
            r#"{"sku": "$.sku"}"#,
            r#"{"n": "count(*)", "q": "sum($.qty)", "p": "max($.p)", "c": "count($.c)", "l": "min($.p)"}"#,
        );
        let mut deltas = Deltas::new(Plan::of(&d, &[3]).unwrap());
        for (sign, doc) in [
            (1, r#"{"sku": "a", "qty": 2, "p": 1.0, "c": 0}"#),
            (1, r#"{"sku": "a", "qty": 1.25, "p": 3, "c": null}"#),
            (-1, r#"{"sku": "a", "qty": 4, "p": 9}"#),
            (1, r#"{"sku": "a", "p": 1.00, "c": "x"}"#),
            (1, r#"{"sku": "b", "qty": null, "p": null}"#),
        ] {
            assert_eq!(add(&mut deltas, sign, 0, doc), Added::Counted, "{doc}");
        }
        // Keys, count, sum's counter and terms, max, count, min, max's values in the row, dirty.
        assert_eq!(
            show(&deltas, 0, &[7, 9]),
            [
                "t 0 'a' f 2 1 '-0.75' 3 2 1.00 {1.0,3,1.00} t",
                "t 0 'b' f 1 0 '0' NULL 0 NULL {} f",
            ]
        );
        // The values of max and of min: 1.0 and 1.00 are one value (the first written kept).
        let values = ["t 0 'a' f 1.0 2", "t 0 'a' f 3 1", "t 0 'a' f 9 -1"];
        assert_eq!(show(&deltas, 3, &[4]), values);
        assert_eq!(show(&deltas, 5, &[4]), values);
        assert!(show(&deltas, 2, &[]).is_empty());
    }

    #[test]
    fn sums_are_exact_decimals_and_terms_past_them() {
        assert_eq!(decimal_text((0, 0)), "0");
        assert_eq!(decimal_text((0, 3)), "0.000");
        assert_eq!(decimal_text((-5, 3)), "-0.005");
        assert_eq!(decimal_text((12345, 2)), "123.45");
        assert_eq!(decimal_text((-12345, 0)), "-12345");
        assert_eq!(add_decimal((150, 2), (-2, 0)), Some((-50, 2)));
        assert_eq!(add_decimal((i128::MAX, 0), (1, 0)), None);
        assert_eq!(add_decimal((1, 0), (1, 39)), None);
        let d = def(r#"{"k": "$.k"}"#, r#"{"s": "sum($.v)"}"#);
        let mut deltas = Deltas::new(Plan::of(&d, &[]).unwrap());
        let big = "9".repeat(37);
        for (sign, v) in [
            (1, "1.5"),
            (-1, "0.25"),
            (1, big.as_str()),
            (1, big.as_str()),
            (-1, "2"),
        ] {
            let doc = format!(r#"{{"k": "a", "v": {v}}}"#);
            assert_eq!(add(&mut deltas, sign, 0, &doc), Added::Counted);
        }
        // 1.5 - 0.25 fits; 99...9 at two decimals does not (39 digits): it and what follows
        // are terms.
        assert_eq!(
            show(&deltas, 0, &[]),
            [format!("t 0 'a' f 1 1 '1.25+{big}+{big}-2' t")]
        );
    }

    #[test]
    fn type_errors_count_nowhere() {
        let d = def(
            r#"{"sku": "$.sku"}"#,
            r#"{"q": "sum($.qty)", "c": "count($.c)"}"#,
        );
        let mut deltas = Deltas::new(Plan::of(&d, &[]).unwrap());
        assert_eq!(
            add(&mut deltas, 1, 0, r#"{"sku": "a", "qty": "2"}"#),
            Added::TypeError
        );
        assert_eq!(
            add(&mut deltas, 1, 0, r#"{"sku": "a", "qty": true}"#),
            Added::TypeError
        );
        assert_eq!(
            add(&mut deltas, 1, 0, r#"{"sku": "a", "qty": [1]}"#),
            Added::TypeError
        );
        // count of a JSONPath takes any value.
        assert_eq!(
            add(&mut deltas, 1, 0, r#"{"sku": "a", "c": {"x": 1}}"#),
            Added::Counted
        );
        deltas.keep_type_error(TypeErrorEvent {
            event_id: 42,
            event_type: "t".into(),
            event_version: 3,
            producer: "p".into(),
            occurred_at: 99,
            payload: b"doc".to_vec(),
        });
        assert_eq!(show(&deltas, 0, &[]), ["t 0 'a' f 1 0 '0' 1 f"]);
        assert_eq!(show(&deltas, -1, &[]), ["1 t 42 't' 3 'p' 99 'doc'"]);
    }

    #[test]
    fn logical_fields_follow_their_declarations() {
        let fields = vec![LogicalField::new(
            "region".into(),
            SqlType::Text,
            vec![
                FieldVariant {
                    event_type: None,
                    version: Some(2),
                    path: "$.ship.region".into(),
                    plan: crate::jsonpath::plan("$.ship.region").unwrap(),
                },
                FieldVariant {
                    event_type: Some("t".into()),
                    version: None,
                    path: "$.region".into(),
                    plan: crate::jsonpath::plan("$.region").unwrap(),
                },
            ],
        )];
        let d = def_with(
            &fields,
            r#"{"r": "region"}"#,
            r#"{"n": "count(region)"}"#,
            None,
            None,
        );
        let mut deltas = Deltas::new(Plan::of(&d, &[]).unwrap());
        let doc = encode(&serde_json::json!({"region": "EU", "ship": {"region": "US"}}));
        for (t, v) in [("t", 1), ("t", 2), ("u", 2), ("u", 1)] {
            assert_eq!(deltas.add(1, t, v, Some(0), &doc), Added::Counted);
        }
        let bad = encode(&serde_json::json!({"region": ["EU"]}));
        assert_eq!(deltas.add(1, "t", 1, Some(0), &bad), Added::TypeError);
        // The declaration of the type comes before the one of the version.
        assert_eq!(
            show(&deltas, 0, &[]),
            ["t 0 'EU' f 2 2 f", "t 0 'US' f 1 1 f", "t 0 '' t 1 0 f"]
        );
    }

    #[test]
    fn keys_and_values_past_the_size_limit_are_type_errors() {
        let d = def(r#"{"k": "$.k"}"#, r#"{"m": "max($.v)"}"#);
        let mut deltas = Deltas::new(Plan::of(&d, &[]).unwrap());
        // 1996 bytes and a 4-byte header: the limit; one more byte is past it.
        let at_limit = format!(r#"{{"k": "{}"}}"#, "x".repeat(1996));
        let past = format!(r#"{{"k": "{}"}}"#, "x".repeat(1997));
        assert_eq!(add(&mut deltas, 1, 0, &at_limit), Added::Counted);
        assert_eq!(add(&mut deltas, 1, 0, &past), Added::TypeError);
        // With a value: the key's 1986 + 4 bytes, and 10 for the numeric 7 as stored here
        // (a 4-byte header, two header words and a digit).
        let with_value = |len: usize| format!(r#"{{"k": "{}", "v": 7}}"#, "x".repeat(len));
        assert_eq!(numeric_of("7").len(), 10);
        assert_eq!(add(&mut deltas, 1, 0, &with_value(1986)), Added::Counted);
        assert_eq!(add(&mut deltas, 1, 0, &with_value(1987)), Added::TypeError);
    }
}
