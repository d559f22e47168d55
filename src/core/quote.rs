//! SQL quoting. Every identifier and literal that reaches generated SQL goes through here.
//!
//! Identifiers are always double-quoted (never case-folded again), so a name stored exactly as the
//! user spelled it round-trips. Literals follow `quote_literal`: an `E''` string when a backslash is
//! present, so the result is correct whatever `standard_conforming_strings` says.

/// `"name"` with embedded double quotes doubled.
pub fn ident(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for ch in name.chars() {
        if ch == '"' {
            out.push('"');
        }
        out.push(ch);
    }
    out.push('"');
    out
}

/// `'text'` (or `E'text'` when it holds a backslash) with quotes and backslashes doubled.
pub fn literal(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 3);
    if value.contains('\\') {
        out.push('E');
    }
    out.push('\'');
    for ch in value.chars() {
        if ch == '\'' || ch == '\\' {
            out.push(ch);
        }
        out.push(ch);
    }
    out.push('\'');
    out
}

/// A literal cast to `type_name` (which must be a fixed, trusted type name).
pub fn typed_literal(value: &str, type_name: &str) -> String {
    format!("{}::{}", literal(value), type_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_always_quoted() {
        assert_eq!(ident("sku"), "\"sku\"");
        assert_eq!(ident("My \"Col\""), "\"My \"\"Col\"\"\"");
        assert_eq!(ident("a;DROP TABLE x"), "\"a;DROP TABLE x\"");
    }

    #[test]
    fn literals_escape_quotes_and_backslashes() {
        assert_eq!(literal("it's"), "'it''s'");
        assert_eq!(literal("a\\b"), "E'a\\\\b'");
        assert_eq!(literal("$$"), "'$$'");
        assert_eq!(typed_literal("{}", "jsonb"), "'{}'::jsonb");
    }
}
