//! Seeded property tests for the parsers users feed text to: view definitions and JSONPaths.
//! Thousands of random and mutated inputs per run; the properties are that parsing never panics
//! (a panic would surface as SQLSTATE XX000) and that whatever is accepted generates SQL whose
//! quoting is balanced. Deterministic: a failure names its seed and input.

/// xorshift64*: small, deterministic, good enough to explore inputs (shared by the seeded tests).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;
    use crate::definition::{parse_definition, DefinitionInput, NoFields};
    use crate::jsonpath;
    use crate::sqlgen::{Mode, Reads, ViewSql};

    const PATH_ATOMS: &[&str] = &[
        "$", ".", "..", "a", "sku", "[", "]", "0", "-1", "*", "?", "@", "==", "'", "\"", "\\", ",", ":",
        "(", ")", "length", "1e400", "99999999999999999999", "ü", "\u{0}", " ", "&&", "||", "!", "$$", ";",
    ];

    fn random_path(rng: &mut Rng) -> String {
        let mut s = String::from(if rng.below(10) == 0 { "" } else { "$" });
        for _ in 0..rng.below(12) {
            s.push_str(rng.pick(PATH_ATOMS));
        }
        s
    }

    fn random_reference(rng: &mut Rng) -> String {
        match rng.below(6) {
            0 => rng.pick(&["event_type", "event_version", "producer", "occurred_at", "sku", "Sku", ""]).to_string(),
            1 | 2 | 3 => rng
                .pick(&["$.sku", "$.a.b", "$[\"it's\"]", "$['a b']", "$.tags[0]", "$.tags[-1]", "$..x", "$.items[*].sku", "$.ü", "$['$$; --']"])
                .to_string(),
            _ => random_path(rng),
        }
    }

    fn json_string(s: &str) -> String {
        serde_json::to_string(s).unwrap()
    }

    fn random_object(rng: &mut Rng, keys: &[&str], value: &mut dyn FnMut(&mut Rng) -> String) -> String {
        let mut parts = Vec::new();
        for _ in 0..rng.below(4) {
            let key = rng.pick(keys);
            parts.push(format!("{}: {}", json_string(key), value(rng)));
        }
        let mut text = format!("{{{}}}", parts.join(", "));
        if rng.below(8) == 0 {
            // Mutate: cut, or splice junk.
            let mut cut = rng.below(text.len() + 1);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str(rng.pick(&["}", "]", "\"", "{", ",", "1"]));
        }
        text
    }

    /// Every quoted identifier ("..." with "" inside) and literal ('...' with '' inside, or
    /// E'...' with backslash escapes) in generated SQL is closed: user text cannot end a quote.
    fn quotes_balanced(sql: &str) -> bool {
        #[derive(PartialEq)]
        enum State {
            Normal,
            Ident,
            Literal { backslash: bool },
        }
        let chars: Vec<char> = sql.chars().collect();
        let mut state = State::Normal;
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            match state {
                State::Normal => {
                    if c == '"' {
                        state = State::Ident;
                    } else if c == '\'' {
                        state = State::Literal { backslash: i > 0 && chars[i - 1] == 'E' };
                    }
                }
                State::Ident => {
                    if c == '"' {
                        if chars.get(i + 1) == Some(&'"') {
                            i += 1;
                        } else {
                            state = State::Normal;
                        }
                    }
                }
                State::Literal { backslash } => {
                    if backslash && c == '\\' {
                        i += 1;
                    } else if c == '\'' {
                        if chars.get(i + 1) == Some(&'\'') {
                            i += 1;
                        } else {
                            state = State::Normal;
                        }
                    }
                }
            }
            i += 1;
        }
        state == State::Normal
    }

    #[test]
    fn jsonpath_parsing_never_panics() {
        for seed in 1..=4000u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let path = random_path(&mut rng);
            let result = std::panic::catch_unwind(|| jsonpath::plan(&path));
            assert!(result.is_ok(), "seed {seed}: jsonpath::plan panicked on {path:?}");
            if let Ok(Ok(plan)) = result {
                let sql = plan.to_sql("payload");
                assert!(quotes_balanced(&sql), "seed {seed}: unbalanced quotes in {sql}");
            }
        }
    }

    #[test]
    fn definition_parsing_never_panics_and_accepted_definitions_generate_balanced_sql() {
        let mut accepted = 0;
        for seed in 1..=6000u64 {
            let mut rng = Rng(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
            let group_by = random_object(&mut rng, &["a", "bucket", "Sku \"x\"", "it's", "", "n; --", "ü"], &mut |r| {
                json_string(&random_reference(r))
            });
            let measures = random_object(&mut rng, &["m", "M \"2\"", "m's", "$$", "total; DROP"], &mut |r| {
                let f = r.pick(&["count", "sum", "avg", "min", "max", "count_distinct", "median", "SUM", "Max"]);
                let arg = if r.below(5) == 0 { "*".to_string() } else { random_reference(r) };
                json_string(&format!("{f}({arg})"))
            });
            let filter = random_object(&mut rng, &["$.country", "event_type", "$['it''s']", "nope"], &mut |r| {
                r.pick(&["1", "\"DE\"", "[1, \"1\"]", "[]", "null", "{\"a\": 1}", "\"it's\""]).to_string()
            });
            let input = DefinitionInput {
                fields: &NoFields,
                group_by: &group_by,
                measures: &measures,
                event_types: if rng.below(3) == 0 { Some(vec![Some("it's".into())]) } else { None },
                bucketed: rng.below(2) == 0,
                filter: if rng.below(2) == 0 { Some(&filter) } else { None },
                on_type_error: rng.pick(&["quarantine", "skip", "fail", "quarantine", "skip", "fail", "ignore"]),
            };
            let parsed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parse_definition(&input)));
            assert!(parsed.is_ok(), "seed {seed}: parse_definition panicked on {group_by} / {measures} / {filter}");
            if let Ok(Ok(def)) = parsed {
                accepted += 1;
                let view = ViewSql { def: &def, view_id: 1, source_id: 1, source_table: "\"s\".\"t\"".into(), log_extremes: rng.below(2) == 0 };
                for sql in view
                    .create_storage()
                    .into_iter()
                    .chain([view.create_user_view("\"v\"", Reads::Stored), view.create_user_view("\"v\"", Reads::Realtime { bucket_width: Some("1 hour") }), view.apply(Mode::Delta), view.apply(Mode::Full), view.apply(Mode::Window)])
                    .chain(view.fixup())
                {
                    assert!(quotes_balanced(&sql), "seed {seed}: unbalanced quotes in generated SQL:\n{sql}");
                }
            }
        }
        // The generator must reach the accepting side too, or the SQL property tests nothing.
        assert!(accepted > 300, "only {accepted} random definitions were accepted");
    }
}
