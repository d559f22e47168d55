//! The payload walk of the field observer, in Rust: one call per batch takes every new payload
//! (as JSON text) and returns the distinct (event type, version, path, JSON type) with how many
//! events had each. About ten times cheaper than walking in SQL, where each visited node costs
//! a few function calls.
//!
//! Paths are written `$.a.b`, `$['odd key']` (RFC 9535 quoting) and `[*]` for array elements.
//! Bounded: at most MAX_DEPTH levels and MAX_MEMBERS members of each object or array.
//!
//! The walk reads the JSON text directly instead of building a document first: a payload may be
//! nested as deep as PostgreSQL accepts (thousands of levels), deeper than any recursive parser
//! should go. Recursion here stops at MAX_DEPTH; what lies below (and members past MAX_MEMBERS)
//! is skipped by an iterative scan, so memory and stack stay bounded by the limits, not by the
//! payload.

use crate::core::observe_sql::{MAX_DEPTH, MAX_MEMBERS};
use std::collections::{BTreeMap, BTreeSet};

type Key = (String, i32, String, &'static str);

/// The text was not JSON (never the case for the text of a jsonb value).
#[derive(Debug)]
struct Malformed;

type Seen = BTreeSet<(String, &'static str)>;

struct Scanner<'a> {
    text: &'a [u8],
    pos: usize,
}

impl<'a> Scanner<'a> {
    fn peek(&mut self) -> Result<u8, Malformed> {
        while let Some(&b) = self.text.get(self.pos) {
            if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                return Ok(b);
            }
            self.pos += 1;
        }
        Err(Malformed)
    }

    fn expect(&mut self, byte: u8) -> Result<(), Malformed> {
        if self.peek()? != byte {
            return Err(Malformed);
        }
        self.pos += 1;
        Ok(())
    }

    /// JSON type of the value starting at the next non-blank byte.
    fn kind(&mut self) -> Result<&'static str, Malformed> {
        Ok(match self.peek()? {
            b'{' => "object",
            b'[' => "array",
            b'"' => "string",
            b't' | b'f' => "boolean",
            b'n' => "null",
            b'-' | b'0'..=b'9' => "number",
            _ => return Err(Malformed),
        })
    }

    /// Reads a string (the opening quote is next), unescaping it.
    fn string(&mut self) -> Result<String, Malformed> {
        self.expect(b'"')?;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let b = *self.text.get(self.pos).ok_or(Malformed)?;
            self.pos += 1;
            match b {
                b'"' => return String::from_utf8(out).map_err(|_| Malformed),
                b'\\' => {
                    let e = *self.text.get(self.pos).ok_or(Malformed)?;
                    self.pos += 1;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => return Err(Malformed),
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                _ => out.push(b),
            }
        }
    }

    /// The character of a `\u` escape of four hex digits (after the `u`), joining a surrogate pair.
    fn unicode_escape(&mut self) -> Result<char, Malformed> {
        let high = self.hex4()?;
        if (0xD800..0xDC00).contains(&high) && self.text.get(self.pos..self.pos + 2) == Some(b"\\u") {
            self.pos += 2;
            let low = self.hex4()?;
            let code = 0x10000 + ((high - 0xD800) << 10) + (low.wrapping_sub(0xDC00) & 0x3FF);
            return Ok(char::from_u32(code).unwrap_or('\u{FFFD}'));
        }
        Ok(char::from_u32(high).unwrap_or('\u{FFFD}'))
    }

    fn hex4(&mut self) -> Result<u32, Malformed> {
        let digits = self.text.get(self.pos..self.pos + 4).ok_or(Malformed)?;
        let text = std::str::from_utf8(digits).map_err(|_| Malformed)?;
        self.pos += 4;
        u32::from_str_radix(text, 16).map_err(|_| Malformed)
    }

    /// Skips a string (the opening quote is next) without unescaping it.
    fn skip_string(&mut self) -> Result<(), Malformed> {
        self.expect(b'"')?;
        loop {
            match *self.text.get(self.pos).ok_or(Malformed)? {
                b'"' => {
                    self.pos += 1;
                    return Ok(());
                }
                b'\\' => self.pos += 2,
                _ => self.pos += 1,
            }
        }
    }

    /// Skips one value of any depth, iteratively: only a nesting counter grows with depth.
    fn skip_value(&mut self) -> Result<(), Malformed> {
        let mut open: usize = 0;
        loop {
            match self.peek()? {
                b'"' => self.skip_string()?,
                b'{' | b'[' => {
                    open += 1;
                    self.pos += 1;
                }
                b'}' | b']' => {
                    open = open.checked_sub(1).ok_or(Malformed)?;
                    self.pos += 1;
                }
                b',' | b':' if open > 0 => self.pos += 1,
                _ => {
                    // A scalar: runs to the next delimiter.
                    let start = self.pos;
                    while let Some(&b) = self.text.get(self.pos) {
                        if matches!(b, b',' | b'}' | b']' | b':' | b' ' | b'\t' | b'\n' | b'\r') {
                            break;
                        }
                        self.pos += 1;
                    }
                    if self.pos == start {
                        return Err(Malformed);
                    }
                }
            }
            if open == 0 {
                return Ok(());
            }
        }
    }

    /// Walks the value that comes next, at `depth` (the payload itself is depth 0), recording
    /// the (path, type) of each member or element it walks into `seen`.
    fn walk(&mut self, path: &mut String, depth: u32, seen: &mut Seen) -> Result<(), Malformed> {
        let container = self.peek()?;
        if !matches!(container, b'{' | b'[') || depth >= MAX_DEPTH {
            return self.skip_value();
        }
        self.pos += 1;
        let close = if container == b'{' { b'}' } else { b']' };
        let mut members: u32 = 0;
        loop {
            if self.peek()? == close {
                self.pos += 1;
                return Ok(());
            }
            if members > 0 {
                self.expect(b',')?;
            }
            members += 1;
            if members > MAX_MEMBERS {
                if container == b'{' {
                    self.skip_string()?;
                    self.expect(b':')?;
                }
                self.skip_value()?;
                continue;
            }
            let len = path.len();
            if container == b'{' {
                let key = self.string()?;
                self.expect(b':')?;
                push_member(path, &key);
            } else {
                path.push_str("[*]");
            }
            seen.insert((path.clone(), self.kind()?));
            self.walk(path, depth + 1, seen)?;
            path.truncate(len);
        }
    }
}

/// Distinct (path, JSON type) of one payload given as JSON text.
fn walk_text(text: &str) -> Result<Seen, Malformed> {
    let mut scanner = Scanner { text: text.as_bytes(), pos: 0 };
    let mut seen = Seen::new();
    scanner.walk(&mut String::from("$"), 0, &mut seen)?;
    if scanner.peek().is_ok() {
        return Err(Malformed);
    }
    Ok(seen)
}

fn push_member(path: &mut String, key: &str) {
    let plain = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        path.push('.');
        path.push_str(key);
    } else {
        path.push_str("['");
        for ch in key.chars() {
            if ch == '\\' || ch == '\'' {
                path.push('\\');
            }
            path.push(ch);
        }
        path.push_str("']");
    }
}

/// Aggregated shapes of a batch; also returns how many payloads could not be parsed.
pub fn shapes(types: &[Option<String>], versions: &[Option<i32>], payloads: &[Option<String>]) -> (Vec<(Key, i64)>, usize) {
    let mut counts: BTreeMap<Key, i64> = BTreeMap::new();
    let mut unparsable = 0;
    for ((t, v), p) in types.iter().zip(versions).zip(payloads) {
        let (Some(t), Some(v), Some(p)) = (t, v, p) else { continue };
        let Ok(seen) = walk_text(p) else {
            unparsable += 1;
            continue;
        };
        for (path, json_type) in seen {
            *counts.entry((t.clone(), *v, path, json_type)).or_insert(0) += 1;
        }
    }
    (counts.into_iter().collect(), unparsable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_types_and_counts_per_event() {
        let (rows, bad) = shapes(
            &[Some("a".into()), Some("a".into())],
            &[Some(1), Some(1)],
            &[
                Some(r#"{"x": {"y": 1}, "items": [{"id": 1}, {"id": "2"}], "it's": null}"#.into()),
                Some(r#"{"x": 5}"#.into()),
            ],
        );
        assert_eq!(bad, 0);
        let get = |p: &str, k: &str| rows.iter().find(|((_, _, path, kind), _)| path == p && *kind == k).map(|r| r.1);
        assert_eq!(get("$.x", "object"), Some(1));
        assert_eq!(get("$.x", "number"), Some(1));
        assert_eq!(get("$.x.y", "number"), Some(1));
        assert_eq!(get("$.items[*].id", "number"), Some(1));
        assert_eq!(get("$.items[*].id", "string"), Some(1));
        assert_eq!(get("$['it\\'s']", "null"), Some(1));
    }

    /// The walk as it would be over a parsed document (serde_json), for comparison.
    fn reference_walk(value: &serde_json::Value, path: &mut String, depth: u32, seen: &mut Seen) {
        use serde_json::Value;
        if depth >= MAX_DEPTH {
            return;
        }
        let kind = crate::core::ordered_json::json_kind;
        match value {
            Value::Object(map) => {
                for (key, child) in map.iter().take(MAX_MEMBERS as usize) {
                    let len = path.len();
                    push_member(path, key);
                    seen.insert((path.clone(), kind(child)));
                    reference_walk(child, path, depth + 1, seen);
                    path.truncate(len);
                }
            }
            Value::Array(items) => {
                let len = path.len();
                path.push_str("[*]");
                for child in items.iter().take(MAX_MEMBERS as usize) {
                    seen.insert((path.clone(), kind(child)));
                    reference_walk(child, path, depth + 1, seen);
                }
                path.truncate(len);
            }
            _ => {}
        }
    }

    #[test]
    fn text_walk_agrees_with_a_walk_over_the_parsed_document() {
        let docs = [
            r#"{"a": 1, "b": [1, "x", null, {"c": true}], "d": {"e": {"f": [[1], []]}}}"#,
            r#"{"k\"q": {"\u00e9t\u00e9": 1.5e3, "\ud83d\ude00": false}, "sp ace": "a\\b\"}", "n": -0.5}"#,
            r#" { "ws" : [ 1 , { "x" : null } ] , "t\tab" : "\n" } "#,
            r#"[{"a": 1}, {"a": "s"}, 3]"#,
            r#""scalar""#,
            "{}",
        ];
        for doc in docs {
            let parsed: serde_json::Value = serde_json::from_str(doc).unwrap();
            let mut expected = Seen::new();
            reference_walk(&parsed, &mut String::from("$"), 0, &mut expected);
            assert_eq!(walk_text(doc).unwrap(), expected, "{doc}");
        }
        for bad in ["{", r#"{"a" 1}"#, r#"{"a": 1,}"#, "[1 2]", r#"{"a": 1} x"#, r#""open"#] {
            assert!(walk_text(bad).is_err(), "{bad}");
        }
    }

    fn random_json(rng: &mut crate::core::fuzz::Rng, depth: u32) -> String {
        const KEYS: &[&str] = &["a", "sku", "it's", "k\\\"q", "\\u00e9", "x y", "_1", "\\ud83d\\ude00"];
        match if depth > 6 { rng.below(4) } else { rng.below(6) } {
            0 => "null".into(),
            1 => ["true", "false", "-1.5e3", "0", "\"s\\n\""][rng.below(5)].into(),
            2 => format!("{}", rng.below(1000)),
            3 => "\"text\"".into(),
            4 => {
                let items: Vec<String> = (0..rng.below(4)).map(|_| random_json(rng, depth + 1)).collect();
                format!("[{}]", items.join(", "))
            }
            _ => {
                // Distinct keys, as in the text of a jsonb value.
                let mut keys: Vec<&str> = (0..rng.below(5)).map(|_| rng.pick(KEYS)).collect();
                keys.sort();
                keys.dedup();
                let members: Vec<String> =
                    keys.iter().map(|k| format!("\"{k}\": {}", random_json(rng, depth + 1))).collect();
                format!("{{{}}}", members.join(", "))
            }
        }
    }

    #[test]
    fn text_walk_agrees_with_the_reference_on_random_documents() {
        let mut rng = crate::core::fuzz::Rng(0x5eed_0f_0b5e_71ed);
        for case in 0..2000 {
            let doc = format!("{{\"root\": {}}}", random_json(&mut rng, 0));
            let parsed: serde_json::Value = serde_json::from_str(&doc).unwrap_or_else(|e| panic!("case {case}: {doc}: {e}"));
            let mut expected = Seen::new();
            reference_walk(&parsed, &mut String::from("$"), 0, &mut expected);
            assert_eq!(walk_text(&doc).unwrap(), expected, "case {case}: {doc}");
        }
    }

    #[test]
    fn nesting_far_beyond_the_parser_limit_is_walked_to_the_depth_limit() {
        let deep = format!("{{\"top\": 1, \"d\": {}1{}}}", "[{\"a\":".repeat(10_000), "}]".repeat(10_000));
        let (rows, bad) = shapes(&[Some("d".into())], &[Some(1)], &[Some(deep)]);
        assert_eq!(bad, 0);
        assert!(rows.iter().any(|r| r.0 .2 == "$.top"));
        assert_eq!(rows.len(), 1 + MAX_DEPTH as usize, "$.top, $.d and one path per level below $.d");
    }

    #[test]
    fn deep_and_wide_payloads_are_bounded() {
        let deep = format!("{}1{}", "{\"a\":".repeat(100), "}".repeat(100));
        let wide = format!("{{{}}}", (0..5000).map(|i| format!("\"k{i}\": {i}")).collect::<Vec<_>>().join(","));
        let (rows, bad) = shapes(&[Some("d".into()), Some("w".into())], &[Some(1), Some(1)], &[Some(deep), Some(wide)]);
        assert_eq!(bad, 0);
        assert_eq!(rows.iter().filter(|r| r.0 .0 == "d").count(), MAX_DEPTH as usize);
        assert_eq!(rows.iter().filter(|r| r.0 .0 == "w").count(), MAX_MEMBERS as usize);
    }
}
