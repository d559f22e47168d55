//! SQL quoting. Every identifier and literal that reaches generated SQL goes through here.
//!
//! Identifiers are always double-quoted (never case-folded again), so a name stored exactly as
//! the user spelled it round-trips. Literals follow `quote_literal`: an `E''` string when a
//! backslash is present, so the result is correct whatever `standard_conforming_strings` says.

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

/// Whether `name` cannot be a (possibly qualified) identifier in any case: empty, a part left
/// empty (`a..b`, `.a`, `""`), an unterminated quote, or something other than a dot or the end
/// after a part (`two words`, `"a"b`). Postgres refuses such a name as relation input with
/// SQLSTATE 42602; its `parse_ident`, which splits the names the API takes, refuses them too,
/// but with 22023. Only sure refusals: a name that passes may still be refused by `parse_ident`
/// (for a character an unquoted identifier cannot hold).
pub fn malformed_name(name: &str) -> bool {
    split_name(name).is_none()
}

/// The parts of a (possibly qualified) name as Postgres reads them: a quoted part as written
/// (quotes doubled inside it undone), an unquoted one with ASCII letters lower-cased; None when
/// `malformed_name` says so.
pub fn split_name(name: &str) -> Option<Vec<String>> {
    // Postgres' scanner_isspace: other characters (a no-break space among them) are identifier
    // characters to it.
    let space = |c: &char| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c');
    let mut parts = Vec::new();
    let mut chars = name.chars().peekable();
    loop {
        while chars.next_if(space).is_some() {}
        let mut part = String::new();
        match chars.peek() {
            None | Some('.') => return None, // a part left empty
            Some('"') => {
                chars.next();
                loop {
                    match chars.next() {
                        None => return None, // unterminated
                        Some('"') if chars.next_if_eq(&'"').is_some() => part.push('"'),
                        Some('"') => break,
                        Some(c) => part.push(c),
                    }
                }
                if part.is_empty() {
                    return None; // a zero-length quoted identifier
                }
            }
            Some(_) => {
                while let Some(c) = chars.next_if(|c| !space(c) && *c != '.' && *c != '"') {
                    part.push(c.to_ascii_lowercase());
                }
            }
        }
        parts.push(part);
        while chars.next_if(space).is_some() {}
        match chars.next() {
            None => return Some(parts),
            Some('.') => continue,
            Some(_) => return None, // more after a part
        }
    }
}

/// A name the user passed, for an error message: as Postgres prints the relation it would name
/// (`'"My Events"'` as `My Events`, `'Shop.Events'` as `shop.events`), so that the message's own
/// quotes are not doubled; a malformed name as it was passed.
pub fn shown_name(name: &str) -> String {
    split_name(name)
        .map(|parts| parts.join("."))
        .unwrap_or_else(|| name.to_string())
}

/// `sql` with every `from` that lies outside its quoted parts replaced by `to`: outside string
/// literals (as `literal` writes them: quotes and, in `E''` strings, backslashes doubled),
/// quoted identifiers and `--` comments. For rewriting generated SQL, whose literals and
/// identifiers hold user text that must stay as it is.
pub fn replace_outside_quotes(sql: &str, from: &str, to: &str) -> String {
    if from.is_empty() {
        return sql.to_string();
    }
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &sql[i..];
        let skip = match bytes[i] {
            b'\'' => {
                // To the closing quote: '' is a quote inside, and so is \' after a backslash
                // (E'' strings; plain ones written by `literal` hold no backslash).
                let mut j = i + 1;
                while j < bytes.len() {
                    match bytes[j] {
                        b'\\' => j += 2,
                        b'\'' if bytes.get(j + 1) == Some(&b'\'') => j += 2,
                        b'\'' => break,
                        _ => j += 1,
                    }
                }
                (j + 1).min(bytes.len()) - i
            }
            b'"' => {
                let mut j = i + 1;
                while j < bytes.len() {
                    match bytes[j] {
                        b'"' if bytes.get(j + 1) == Some(&b'"') => j += 2,
                        b'"' => break,
                        _ => j += 1,
                    }
                }
                (j + 1).min(bytes.len()) - i
            }
            b'-' if rest.starts_with("--") => rest.find('\n').unwrap_or(rest.len()),
            _ if rest.starts_with(from) => {
                out.push_str(to);
                i += from.len();
                continue;
            }
            _ => rest.chars().next().map_or(1, char::len_utf8),
        };
        out.push_str(&sql[i..i + skip]);
        i += skip;
    }
    out
}

#[cfg(test)]
mod tests {

    #[test]
    fn replaces_only_outside_literals_identifiers_and_comments() {
        let sql = format!(
            "f(x) AND {} = f(x) AND \"f(x)\" = {} -- f(x)'s\nOR f(x)",
            literal("it's f(x)"),
            literal("a\\' f(x)")
        );
        assert_eq!(
            replace_outside_quotes(&sql, "f(x)", "t"),
            "t AND 'it''s f(x)' = t AND \"f(x)\" = E'a\\\\'' f(x)' -- f(x)'s\nOR t"
        );
        assert_eq!(replace_outside_quotes("é f(x) 'ü'", "f(x)", "t"), "é t 'ü'");
        assert_eq!(
            replace_outside_quotes("'open f(x)", "f(x)", "t"),
            "'open f(x)"
        );
    }
    use super::*;

    #[test]
    fn names_are_shown_as_postgres_reads_them() {
        assert_eq!(shown_name(r#""My Events""#), "My Events");
        assert_eq!(shown_name("Shop.Events"), "shop.events");
        assert_eq!(shown_name(r#" shop . "a""b" "#), r#"shop.a"b"#);
        assert_eq!(shown_name("\u{c9}v"), "\u{c9}v");
        assert_eq!(shown_name("a..b"), "a..b");
        assert_eq!(split_name(r#""".x"#), None);
        assert_eq!(
            split_name(r#""x".y"#),
            Some(vec!["x".to_string(), "y".to_string()])
        );
    }

    #[test]
    fn names_sure_to_be_refused() {
        for bad in [
            "",
            "  ",
            "My Events",
            "\"bad\"name",
            "a..b",
            ".a",
            "a.",
            "\"open",
            "ab\"c\"",
            "a . b c",
        ] {
            assert!(malformed_name(bad), "{bad:?}");
        }
        for fine in [
            "events",
            "shop.events",
            "\"My Events\"",
            "\"we\"\"ird; x\".\"Vi\"\"ew\"",
            " a . b ",
            "my-table",
            "a.b.c",
            "é",
            "a\u{a0}b",
        ] {
            assert!(!malformed_name(fine), "{fine:?}");
        }
    }

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
