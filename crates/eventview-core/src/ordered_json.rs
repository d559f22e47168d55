//! Reads a JSON object as an ordered list of (key, value) pairs, keeping duplicates.
//!
//! `group_by`, `measures` and `filter` are `json` (not `jsonb`) precisely so that the order the
//! user wrote is the column order; serde_json's map would silently merge a duplicated key, and a
//! duplicated output column must be refused instead.

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::Value;
use std::fmt;

/// Why a JSON argument could not be read as an object.
#[derive(Debug, PartialEq)]
pub enum ObjectError {
    Syntax(String),
    NotAnObject(&'static str),
}

pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

struct Pairs(Vec<(String, Value)>);

struct PairsVisitor;

impl<'de> Visitor<'de> for PairsVisitor {
    type Value = Pairs;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pairs, A::Error> {
        let mut pairs = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Value>()? {
            pairs.push((k, v));
        }
        Ok(Pairs(pairs))
    }
}

impl<'de> serde::Deserialize<'de> for Pairs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(PairsVisitor)
    }
}

/// Parses `text` as a JSON object into its pairs, in document order, duplicates kept.
pub fn object_pairs(text: &str) -> Result<Vec<(String, Value)>, ObjectError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| ObjectError::Syntax(e.to_string()))?;
    if !value.is_object() {
        return Err(ObjectError::NotAnObject(json_kind(&value)));
    }
    let pairs: Pairs =
        serde_json::from_str(text).map_err(|e| ObjectError::Syntax(e.to_string()))?;
    Ok(pairs.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_duplicates() {
        let p = object_pairs(r#"{"b": 1, "a": "x", "b": 2}"#).unwrap();
        let keys: Vec<_> = p.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a", "b"]);
    }

    #[test]
    fn rejects_non_objects_and_bad_syntax() {
        assert_eq!(object_pairs("[1]"), Err(ObjectError::NotAnObject("array")));
        assert!(matches!(object_pairs("{"), Err(ObjectError::Syntax(_))));
    }
}
