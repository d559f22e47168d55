//! Seeded property tests for the parsers users feed text to: view definitions and JSONPaths.
//! Thousands of random and mutated inputs per run; the properties are that parsing never panics
//! (a panic would surface as SQLSTATE XX000) and that whatever is accepted generates SQL whose
//! quoting is balanced. Deterministic: a failure names its seed and input.

/// xorshift64*: small, deterministic, good enough to explore inputs (shared by the seeded tests).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
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
    use crate::sqlgen::{Mode, Reads, ValuesInRow, ViewSql};

    const PATH_ATOMS: &[&str] = &[
        "$",
        ".",
        "..",
        "a",
        "sku",
        "[",
        "]",
        "0",
        "-1",
        "*",
        "?",
        "@",
        "==",
        "'",
        "\"",
        "\\",
        ",",
        ":",
        "(",
        ")",
        "length",
        "1e400",
        "99999999999999999999",
        "ü",
        "\u{0}",
        " ",
        "&&",
        "||",
        "!",
        "$$",
        ";",
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
            0 => rng
                .pick(&[
                    "event_type",
                    "event_version",
                    "producer",
                    "occurred_at",
                    "sku",
                    "Sku",
                    "",
                ])
                .to_string(),
            1..=3 => rng
                .pick(&[
                    "$.sku",
                    "$.a.b",
                    "$[\"it's\"]",
                    "$['a b']",
                    "$.tags[0]",
                    "$.tags[-1]",
                    "$..x",
                    "$.items[*].sku",
                    "$.ü",
                    "$['$$; --']",
                ])
                .to_string(),
            _ => random_path(rng),
        }
    }

    fn json_string(s: &str) -> String {
        serde_json::to_string(s).unwrap()
    }

    fn random_object(
        rng: &mut Rng,
        keys: &[&str],
        value: &mut dyn FnMut(&mut Rng) -> String,
    ) -> String {
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
                        state = State::Literal {
                            backslash: i > 0 && chars[i - 1] == 'E',
                        };
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
            assert!(
                result.is_ok(),
                "seed {seed}: jsonpath::plan panicked on {path:?}"
            );
            if let Ok(Ok(plan)) = result {
                let sql = plan.to_sql("payload");
                assert!(
                    quotes_balanced(&sql),
                    "seed {seed}: unbalanced quotes in {sql}"
                );
            }
        }
    }

    /// Aggregate names, known and unknown, in any case.
    const AGGREGATES: &[&str] = &[
        "count",
        "sum",
        "avg",
        "min",
        "max",
        "count_distinct",
        "median",
        "SUM",
        "Max",
    ];
    /// Filter values: scalars, lists (one empty), objects, user text.
    const FILTER_VALUES: &[&str] = &[
        "1",
        "\"DE\"",
        "[1, \"1\"]",
        "[]",
        "null",
        "{\"a\": 1}",
        "\"it's\"",
    ];
    /// Type policies, one invalid.
    const POLICIES: &[&str] = &[
        "quarantine",
        "skip",
        "fail",
        "quarantine",
        "skip",
        "fail",
        "ignore",
    ];

    /// A random `group_by` argument: hostile column names, random references.
    fn random_group_by(rng: &mut Rng) -> String {
        let names = ["a", "bucket", "Sku \"x\"", "it's", "", "n; --", "ü"];
        random_object(rng, &names, &mut |r| json_string(&random_reference(r)))
    }

    /// A random `measures` argument: hostile column names, aggregates of random references.
    fn random_measures(rng: &mut Rng) -> String {
        let names = ["m", "M \"2\"", "m's", "$$", "total; DROP"];
        random_object(rng, &names, &mut |r| {
            let f = r.pick(AGGREGATES);
            let arg = if r.below(5) == 0 {
                "*".to_string()
            } else {
                random_reference(r)
            };
            if r.below(6) == 0 {
                let p = r.pick(&["0.5", "0", "1", "2", "x'); DROP", "1e-3"]);
                return json_string(&format!("percentile({arg}, {p})"));
            }
            json_string(&format!("{f}({arg})"))
        })
    }

    /// A random `filter` argument.
    fn random_filter(rng: &mut Rng) -> String {
        let references = ["$.country", "event_type", "$['it''s']", "nope"];
        random_object(rng, &references, &mut |r| r.pick(FILTER_VALUES).to_string())
    }

    /// Every statement generated for a view that holds text from its definition.
    fn view_statements(view: &ViewSql) -> Vec<String> {
        let realtime = Reads::Realtime;
        let mut out = view.create_storage();
        out.push(view.create_user_view("\"v\"", Reads::Stored));
        out.push(view.create_user_view("\"v\"", realtime));
        out.push(view.apply(Mode::Delta));
        out.push(view.apply(Mode::Full));
        out.push(view.apply(Mode::Window));
        out.extend(view.fixup());
        out
    }

    #[test]
    fn definition_parsing_never_panics_and_accepted_definitions_generate_balanced_sql() {
        let mut accepted = 0;
        for seed in 1..=6000u64 {
            let mut rng = Rng(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
            let group_by = random_group_by(&mut rng);
            let measures = random_measures(&mut rng);
            let filter = random_filter(&mut rng);
            let bucketed = rng.below(2) == 0;
            let input = DefinitionInput {
                fields: &NoFields,
                group_by: &group_by,
                measures: &measures,
                event_types: (rng.below(3) == 0).then(|| vec![Some("it's".into())]),
                bucketed,
                time_zone: (bucketed && rng.below(2) == 0).then_some("Europe/Berlin'; --"),
                unnest: (rng.below(3) == 0).then_some("$.it's"),
                filter: (rng.below(2) == 0).then_some(filter.as_str()),
                on_type_error: rng.pick(POLICIES),
            };
            let parsed =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parse_definition(&input)));
            assert!(
                parsed.is_ok(),
                "seed {seed}: parse_definition panicked on {group_by} / {measures} / {filter}"
            );
            if let Ok(Ok(def)) = parsed {
                accepted += 1;
                let view = ViewSql {
                    def: &def,
                    view_id: 1,
                    source_id: 1,
                    source_scan: "ONLY \"s\".\"t\"".into(),
                    log_extremes: rng.below(2) == 0,
                    feeds_rollups: false,
                    bucket_width: None,
                    rollup_source: None,
                    data_table: None,
                    values_in_row: [ValuesInRow::No, ValuesInRow::Columns, ValuesInRow::Kept]
                        [rng.below(3)],
                };
                for sql in view_statements(&view) {
                    assert!(
                        quotes_balanced(&sql),
                        "seed {seed}: unbalanced quotes in generated SQL:\n{sql}"
                    );
                }
            }
        }
        // The generator must reach the accepting side too, or the SQL property tests nothing.
        assert!(
            accepted > 300,
            "only {accepted} random definitions were accepted"
        );
    }
}
