//! JSON texts joined without parsing what they hold: a shard's answer to a refresh carries its
//! group changes, hundreds of objects that the coordinator hands on as the text they came in;
//! parsing them into values and writing them out again costs more than the rest of the answer.

use serde_json::{Map, Value};

/// The JSON object `object` (its text) with `members` added after its own, or None when
/// `object` is not enclosed in braces (its inside is taken as it is, not checked). `members`
/// must not repeat a name of `object`'s (a reader would take one of the two).
pub fn with_members(object: &str, members: &Map<String, Value>) -> Option<String> {
    let inner = object.trim().strip_prefix('{')?.strip_suffix('}')?.trim();
    let added = Value::Object(members.clone()).to_string();
    let added = &added[1..added.len() - 1];
    let mut out = String::with_capacity(inner.len() + added.len() + 3);
    out.push('{');
    out.push_str(inner);
    if !inner.is_empty() && !added.is_empty() {
        out.push(',');
    }
    out.push_str(added);
    out.push('}');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn members(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn members_are_added_after_the_objects_own_which_stay_as_they_were_written() {
        let object = r#"{"changes" : [{"k": 1.50}], "values" : []}"#;
        let joined = with_members(object, &members(json!({"applied": 3, "shard": "7"}))).unwrap();
        assert!(joined.starts_with(r#"{"changes" : [{"k": 1.50}], "values" : []"#));
        let parsed: Value = serde_json::from_str(&joined).unwrap();
        let expected: Value = serde_json::from_str(
            r#"{"changes": [{"k": 1.50}], "values": [], "applied": 3, "shard": "7"}"#,
        )
        .unwrap();
        assert_eq!(parsed, expected);
    }

    #[test]
    fn an_empty_object_or_no_members_join_without_a_stray_comma() {
        let one = members(json!({"applied": 0}));
        assert_eq!(with_members("{}", &one).unwrap(), r#"{"applied":0}"#);
        assert_eq!(with_members(" { } ", &one).unwrap(), r#"{"applied":0}"#);
        assert_eq!(
            with_members(r#"{"a": 1}"#, &Map::new()).unwrap(),
            r#"{"a": 1}"#
        );
        assert_eq!(with_members("{}", &Map::new()).unwrap(), "{}");
    }

    #[test]
    fn text_that_is_not_an_object_is_refused() {
        let one = members(json!({"applied": 0}));
        assert_eq!(with_members("[1]", &one), None);
        assert_eq!(with_members("", &one), None);
        assert_eq!(with_members("null", &one), None);
    }
}
