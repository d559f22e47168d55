//! RFC 3339 timestamps (`2026-11-30T08:15:00Z`, `2026-11-30 08:15:00.5+05:30`): the form the
//! ingest gate and timestamptz logical fields accept. Checked here, byte by byte, so that the
//! SQL cast that follows cannot fail: a failing cast would abort a whole ingest or refresh
//! instead of quarantining one event, and catching it costs a subtransaction per value.
//!
//! Accepted: `YYYY-MM-DD`, `T`/`t`/space, `hh:mm:ss` (hour 00-23, second 00-60), optional
//! fraction (only zeros on a leap second), `Z`/`z` or `+hh:mm`/`-hh:mm`; a real calendar date
//! from year 0001; offsets up to 15:59 (the largest PostgreSQL stores); at most 64 bytes in all
//! (PostgreSQL's input refuses very long fractions).

fn digits(b: &[u8]) -> Option<u32> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(b.iter().fold(0, |n, d| n * 10 + u32::from(d - b'0')))
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400) => {
            29
        }
        _ => 28,
    }
}

/// Whether `s` is an RFC 3339 timestamp PostgreSQL's timestamptz input takes as such.
pub fn is_valid(s: &str) -> bool {
    let b = s.as_bytes();
    // PostgreSQL's timestamp input takes at most 128 bytes of fraction and zone together.
    if b.len() < 20
        || b.len() > 64
        || b[4] != b'-'
        || b[7] != b'-'
        || b[13] != b':'
        || b[16] != b':'
    {
        return false;
    }
    if !matches!(b[10], b'T' | b't' | b' ') {
        return false;
    }
    let (Some(year), Some(month), Some(day)) =
        (digits(&b[0..4]), digits(&b[5..7]), digits(&b[8..10]))
    else {
        return false;
    };
    let (Some(hour), Some(minute), Some(second)) =
        (digits(&b[11..13]), digits(&b[14..16]), digits(&b[17..19]))
    else {
        return false;
    };
    if year == 0 || !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return false;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return false;
    }
    let mut rest = &b[19..];
    if rest.first() == Some(&b'.') {
        let n = rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
        // A leap second takes no fraction: PostgreSQL refuses 23:59:60.5 (past the minute).
        if n == 0 || (second == 60 && rest[1..=n].iter().any(|&d| d != b'0')) {
            return false;
        }
        rest = &rest[1 + n..];
    }
    match rest {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => {
            let (hours, minutes) = (digits(&[*h1, *h2]), digits(&[*m1, *m2]));
            matches!((hours, minutes), (Some(h), Some(m)) if h <= 15 && m <= 59)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::is_valid;

    #[test]
    fn accepts_rfc_3339_forms() {
        for s in [
            "2026-11-30T08:15:00Z",
            "2026-11-30t08:15:00z",
            "2026-11-30 08:15:00.123456+05:30",
            "2024-02-29T23:59:60-15:59",
            "2026-12-31T23:59:60.000Z",
            "0001-01-01T00:00:00.5Z",
            "9999-12-31T23:59:59+00:00",
        ] {
            assert!(is_valid(s), "{s}");
        }
    }

    #[test]
    fn refuses_the_rest() {
        for s in [
            "",
            "2026-11-30",
            "2026-11-30T08:15:00",
            "2026-11-30T24:00:00Z",
            "2026-11-30T08:60:00Z",
            "2026-11-30T08:15:61Z",
            "2026-12-31T23:59:60.5Z",
            "2026-12-31T23:59:60.000001+01:00",
            "2026-02-29T08:15:00Z",
            "2100-02-29T08:15:00Z",
            "2026-13-01T08:15:00Z",
            "2026-04-31T08:15:00Z",
            "0000-01-01T00:00:00Z",
            "2026-11-30T08:15:00.Z",
            "2026-11-30T08:15:00+16:00",
            "2026-11-30T08:15:00+05:60",
            "2026-11-30T08:15:00+0530",
            "2026-11-30T08:15:00 Z",
            "+2026-11-30T08:15:00Z",
            "2026-1l-30T08:15:00Z",
            "２０２６-11-30T08:15:00Z",
            "2026-11-30T08:15:00Zjunk",
            "2026-01-01T00:00:00.0000000000000000000000000000000000000000000000000000000000000000000000000Z",
        ] {
            assert!(!is_valid(s), "{s}");
        }
    }
}
