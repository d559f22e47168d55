//! The ingest gate's envelope check: one pass over a stored envelope (jsonb, read in place by
//! `jsonb_bytes`) finds the first problem, in the order the gate reports them. The gate runs
//! it once per envelope, so the checks cost one function call instead of a dozen jsonb
//! operators, and the payload's size in bytes of JSON text is counted without printing it.
//! The reason texts are written by the gate's SQL (`eventview.ingest`), for problem rows only.

use super::jsonb_bytes::{JsonbBytes, Kind, Numeric, Token, NULL, NUMBER, OBJECT, STRING};
use super::rfc3339;

/// What is wrong with an envelope; the number is what `eventview._envelope_problem` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    NotObject = 1,
    NoType = 2,
    BadVersion = 3,
    BadProducer = 4,
    BadOccurredAt = 5,
    BadKey = 6,
    BadPayload = 7,
    Oversized = 8,
}

/// Longest idempotency key, in bytes: `event_key` has a unique btree index, whose entries hold
/// at most 2704 bytes (a longer key would fail the whole gate's INSERT, not just its envelope).
pub const MAX_KEY_BYTES: usize = 2000;

/// An envelope member as stored: its JSON type and bytes (see `Token::Value`).
type Member<'a> = Option<(Kind, &'a [u8])>;

fn absent_or_null(member: Member<'_>) -> bool {
    member.is_none_or(|(kind, _)| kind == NULL)
}

fn is_string(member: Member<'_>) -> bool {
    matches!(member, Some((STRING, _)))
}

/// `version`: an integer from 1 to 2147483647 (2.0 counts as 2).
fn good_version(member: Member<'_>) -> bool {
    match member {
        Some((NUMBER, bytes)) => Numeric::read(bytes)
            .and_then(|n| n.as_integer())
            .is_some_and(|v| (1..=i64::from(i32::MAX)).contains(&v)),
        _ => false,
    }
}

/// The first problem of the envelope whose root container is `envelope`, or None when it is
/// good. `max_payload_bytes`: the largest payload allowed, in bytes of its JSON text.
pub fn check(envelope: &[u8], max_payload_bytes: u64) -> Option<Problem> {
    let mut reader = JsonbBytes::new(envelope);
    if !matches!(reader.next_token(false), Some(Token::Begin(OBJECT))) {
        return Some(Problem::NotObject);
    }
    let (mut event_type, mut version, mut producer, mut occurred_at, mut key, mut payload): (
        Member,
        Member,
        Member,
        Member,
        Member,
        Member,
    ) = (None, None, None, None, None, None);
    while let Some(Token::Key(name)) = reader.next_token(false) {
        let Some(Token::Value(kind, bytes)) = reader.next_token(false) else {
            break; // malformed (a key without its value): what was read is checked
        };
        let slot = match name {
            b"type" => &mut event_type,
            b"version" => &mut version,
            b"producer" => &mut producer,
            b"occurred_at" => &mut occurred_at,
            b"key" => &mut key,
            b"payload" => &mut payload,
            _ => continue,
        };
        *slot = Some((kind, bytes));
    }
    if !matches!(event_type, Some((STRING, bytes)) if !bytes.is_empty()) {
        return Some(Problem::NoType);
    }
    if !absent_or_null(version) && !good_version(version) {
        return Some(Problem::BadVersion);
    }
    if !absent_or_null(producer) && !is_string(producer) {
        return Some(Problem::BadProducer);
    }
    if !absent_or_null(occurred_at) {
        let valid = match occurred_at {
            Some((STRING, bytes)) => std::str::from_utf8(bytes).is_ok_and(rfc3339::is_valid),
            _ => false,
        };
        if !valid {
            return Some(Problem::BadOccurredAt);
        }
    }
    // A key that is not a string, or longer than MAX_KEY_BYTES (the gate's SQL tells which).
    if !absent_or_null(key) && !matches!(key, Some((STRING, bytes)) if bytes.len() <= MAX_KEY_BYTES)
    {
        return Some(Problem::BadKey);
    }
    let Some((OBJECT, payload)) = payload else {
        return Some(Problem::BadPayload);
    };
    match super::jsonb_bytes::text_len(payload, max_payload_bytes) {
        Some(len) if len <= max_payload_bytes => None,
        // (None: a payload the reader cannot read, which PostgreSQL never stores; refused
        // rather than let through unmeasured.)
        _ => Some(Problem::Oversized),
    }
}
