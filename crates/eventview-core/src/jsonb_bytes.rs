//! PostgreSQL's stored jsonb read in place: the on-disk format as bytes, walked token by token
//! without a function call per token and without converting to text. Used by the field observer
//! (paths and JSON types of payloads) and the ingest gate (envelope checks, payload sizes).
//! Pure Rust over a byte slice: every read is bounds checked, so a malformed document ends a walk
//! early and never reads outside its bytes.

/// JSON types as the observer records them, indexed by `Kind`.
pub const KINDS: [&str; 6] = ["object", "array", "string", "number", "boolean", "null"];

pub type Kind = u8;
pub const OBJECT: Kind = 0;
pub const ARRAY: Kind = 1;
pub const STRING: Kind = 2;
pub const NUMBER: Kind = 3;
pub const BOOLEAN: Kind = 4;
pub const NULL: Kind = 5;

/// One step of a walk over a JSON document.
pub enum Token<'a> {
    /// A container the walk descends into (its members follow, then `End`).
    Begin(Kind),
    /// An object member's key (its value comes with the next step).
    Key(&'a [u8]),
    /// A value the walk does not descend into: a scalar, or a container it was told to skip,
    /// with its stored bytes: a string's UTF-8, a number's numeric varlena (header included), a
    /// container as a container (header first, so `JsonbBytes::new` reads it), the JSON text of
    /// booleans and null.
    Value(Kind, &'a [u8]),
    /// The end of the innermost container walked into.
    End,
}

/// A document as a sequence of tokens. `descend` says whether a container coming next is to be
/// walked into (`Begin`) or passed over as one `Value`; it only matters for a step that yields a
/// value (after `Key`, or an array element). The first step yields the document's root.
pub trait Tokens {
    fn next(&mut self, descend: bool) -> Token<'_>;

    /// The stored jsonb bytes of the whole document, when the tokens come from them and none
    /// was read yet (see `structure`).
    fn stored(&self) -> Option<&[u8]> {
        None
    }
}

/// A stored jsonb document read in place, in PostgreSQL's on-disk jsonb format (`utils/jsonb.h`,
/// unchanged since 9.4): a container is a header word (member count and object/array/scalar
/// flags), one JEntry word per child (type bits, and either the child's length or, every
/// JB_OFFSET_STRIDE children, its end offset), then the children's data, nested containers
/// aligned to 4 bytes. An object's children are its keys in order, then their values in the
/// same order. Reading it here takes no function call per token (the JsonbIterator API costs a
/// call through pgrx's error guard and an allocation per container). Every read is bounds
/// checked: a malformed document ends the walk early, it never reads outside the document.
pub struct JsonbBytes<'a> {
    doc: &'a [u8],
    levels: Vec<Level>,
    started: bool,
}

/// A container being read.
struct Level {
    /// Byte index of the data area (after the JEntries).
    data: usize,
    /// Byte index where the container ends (its entry's range in the parent): children are
    /// read only inside it, so every byte is read at most once per level.
    limit: usize,
    /// Byte index of the JEntries.
    entries: usize,
    count: usize,
    object: bool,
    /// Index of the next member.
    next: usize,
    /// Start offsets (in the data area) of the next key and the next value.
    key_at: usize,
    value_at: usize,
    /// An object's key was read, its value is next.
    value_due: bool,
}

const JB_CMASK: u32 = 0x0FFF_FFFF;
const JB_FSCALAR: u32 = 0x1000_0000;
const JB_FOBJECT: u32 = 0x2000_0000;
const JENTRY_OFFLENMASK: u32 = 0x0FFF_FFFF;
const JENTRY_TYPEMASK: u32 = 0x7000_0000;
const JENTRY_HAS_OFF: u32 = 0x8000_0000;
const JENTRY_ISSTRING: u32 = 0x0000_0000;
const JENTRY_ISNUMERIC: u32 = 0x1000_0000;
const JENTRY_ISBOOL_FALSE: u32 = 0x2000_0000;
const JENTRY_ISBOOL_TRUE: u32 = 0x3000_0000;
const JENTRY_ISCONTAINER: u32 = 0x5000_0000;

fn word(doc: &[u8], at: usize) -> Option<u32> {
    let bytes = doc.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

/// Opens the container starting at byte `at` and ending at `limit`: (level, is a scalar document).
fn open(doc: &[u8], at: usize, limit: usize) -> Option<(Level, bool)> {
    if at.checked_add(4)? > limit || limit > doc.len() {
        return None;
    }
    let header = word(doc, at)?;
    let count = (header & JB_CMASK) as usize;
    let object = header & JB_FOBJECT != 0;
    let children = if object { count.checked_mul(2)? } else { count };
    let entries = at + 4;
    let data = entries.checked_add(children.checked_mul(4)?)?;
    if data > limit {
        return None;
    }
    let mut level = Level {
        data,
        limit,
        entries,
        count,
        object,
        next: 0,
        key_at: 0,
        value_at: 0,
        value_due: false,
    };
    if object {
        // The first value starts where the last key ends.
        level.value_at = start_of(doc, &level, count)?;
    }
    Some((level, header & JB_FSCALAR != 0))
}

/// Start offset of child `index`: the end of the previous child, found by walking back to the
/// nearest child stored with its end offset (at most JB_OFFSET_STRIDE steps).
fn start_of(doc: &[u8], level: &Level, index: usize) -> Option<usize> {
    let mut offset: usize = 0;
    for i in (0..index).rev() {
        let entry = word(doc, level.entries + 4 * i)?;
        offset += (entry & JENTRY_OFFLENMASK) as usize;
        if entry & JENTRY_HAS_OFF != 0 {
            break;
        }
    }
    Some(offset)
}

/// Child `index`, which starts at offset `start`: (its JEntry, its end offset).
fn child(doc: &[u8], level: &Level, index: usize, start: usize) -> Option<(u32, usize)> {
    let entry = word(doc, level.entries + 4 * index)?;
    let field = (entry & JENTRY_OFFLENMASK) as usize;
    let end = if entry & JENTRY_HAS_OFF != 0 {
        field
    } else {
        start + field
    };
    if end < start || level.data.checked_add(end)? > level.limit {
        return None;
    }
    Some((entry, end))
}

/// The bytes of a child stored aligned to 4 bytes within the data area at `data` (a numeric
/// varlena, a nested container), which starts at offset `start` (before its padding) and ends
/// at `end`.
fn aligned(doc: &[u8], data: usize, start: usize, end: usize) -> Option<&[u8]> {
    doc.get(data + start.next_multiple_of(4)..data + end)
}

/// OBJECT or ARRAY: the kind of the container whose header is at `at`.
fn container_kind(doc: &[u8], at: usize) -> Option<Kind> {
    Some(if word(doc, at)? & JB_FOBJECT != 0 {
        OBJECT
    } else {
        ARRAY
    })
}

/// A child's kind and bytes, as `Token::Value` gives them (`entry`, starting at offset `start`
/// of the data area at `data` and ending at `end`).
fn child_value(
    doc: &[u8],
    data: usize,
    entry: u32,
    start: usize,
    end: usize,
) -> Option<(Kind, &[u8])> {
    Some(match entry & JENTRY_TYPEMASK {
        JENTRY_ISSTRING => (STRING, doc.get(data + start..data + end)?),
        JENTRY_ISNUMERIC => (NUMBER, aligned(doc, data, start, end)?),
        JENTRY_ISBOOL_FALSE => (BOOLEAN, b"false"),
        JENTRY_ISBOOL_TRUE => (BOOLEAN, b"true"),
        JENTRY_ISCONTAINER => {
            let bytes = aligned(doc, data, start, end)?;
            (
                container_kind(doc, data + start.next_multiple_of(4))?,
                bytes,
            )
        }
        _ => (NULL, b"null"),
    })
}

/// The value that `->` with each of `members` in turn selects from a stored document (the
/// root for no members), as `Token::Value` gives it: None when a member is missing, when a
/// step meets anything but an object, and for a malformed document. Keys are compared as
/// bytes, as jsonb compares them.
pub fn select<'a, M: AsRef<[u8]>>(doc: &'a [u8], members: &[M]) -> Option<(Kind, &'a [u8])> {
    let (mut level, scalar) = open(doc, 0, doc.len())?;
    if scalar {
        if !members.is_empty() {
            return None;
        }
        let (entry, end) = child(doc, &level, 0, 0)?;
        return child_value(doc, level.data, entry, 0, end);
    }
    if members.is_empty() {
        return Some((container_kind(doc, 0)?, doc));
    }
    for (step, name) in members.iter().enumerate() {
        if !level.object {
            return None;
        }
        let mut key_at = 0;
        let mut found = None;
        for k in 0..level.count {
            let (_, end) = child(doc, &level, k, key_at)?;
            if doc.get(level.data + key_at..level.data + end)? == name.as_ref() {
                found = Some(k);
                break;
            }
            key_at = end;
        }
        let index = level.count + found?;
        let start = start_of(doc, &level, index)?;
        let (entry, end) = child(doc, &level, index, start)?;
        if step + 1 == members.len() {
            return child_value(doc, level.data, entry, start, end);
        }
        if entry & JENTRY_TYPEMASK != JENTRY_ISCONTAINER {
            return None;
        }
        level = open(
            doc,
            level.data + start.next_multiple_of(4),
            level.data + end,
        )?
        .0;
    }
    None
}

impl<'a> JsonbBytes<'a> {
    /// `doc`: the root container (a jsonb value without its varlena header).
    pub fn new(doc: &'a [u8]) -> Self {
        JsonbBytes {
            doc,
            levels: Vec::new(),
            started: false,
        }
    }

    /// The value of a child (`entry`, starting at offset `start` of the data area at `data`),
    /// walked into when it is a container and `descend` says so.
    fn value(
        &mut self,
        data: usize,
        entry: u32,
        start: usize,
        end: usize,
        descend: bool,
    ) -> Option<Token<'a>> {
        let doc = self.doc;
        let (kind, bytes) = child_value(doc, data, entry, start, end)?;
        if descend && entry & JENTRY_TYPEMASK == JENTRY_ISCONTAINER {
            let (level, _) = open(doc, data + start.next_multiple_of(4), data + end)?;
            self.levels.push(level);
            return Some(Token::Begin(kind));
        }
        Some(Token::Value(kind, bytes))
    }

    /// The next token, its bytes borrowed from the document (not from the reader, as through
    /// `Tokens`); None at the end of the root or on a malformed document.
    pub fn next_token(&mut self, descend: bool) -> Option<Token<'a>> {
        self.step(descend)
    }

    fn step(&mut self, descend: bool) -> Option<Token<'a>> {
        let doc = self.doc;
        if !self.started {
            self.started = true;
            let (level, scalar) = open(doc, 0, doc.len())?;
            if scalar {
                // A scalar document is stored as a one-element array flagged scalar.
                let (entry, end) = child(doc, &level, 0, 0)?;
                return self.value(level.data, entry, 0, end, false);
            }
            let kind = if level.object { OBJECT } else { ARRAY };
            self.levels.push(level);
            return Some(Token::Begin(kind));
        }
        let top = self.levels.last_mut()?;
        if top.next >= top.count {
            self.levels.pop();
            return Some(Token::End);
        }
        if top.object && !top.value_due {
            let (_, end) = child(doc, top, top.next, top.key_at)?;
            let key = doc.get(top.data + top.key_at..top.data + end)?;
            top.key_at = end;
            top.value_due = true;
            return Some(Token::Key(key));
        }
        let index = if top.object {
            top.count + top.next
        } else {
            top.next
        };
        let start = top.value_at;
        let (entry, end) = child(doc, top, index, start)?;
        top.value_due = false;
        top.next += 1;
        top.value_at = end;
        let data = top.data;
        self.value(data, entry, start, end, descend)
    }
}

impl Tokens for JsonbBytes<'_> {
    fn stored(&self) -> Option<&[u8]> {
        (!self.started).then_some(self.doc)
    }

    fn next(&mut self, descend: bool) -> Token<'_> {
        match self.step(descend) {
            Some(token) => token,
            None => {
                // Malformed: stop the walk (every level ends).
                self.levels.clear();
                Token::End
            }
        }
    }
}

/// The structure of a stored document, read straight from its bytes: for each container, its
/// header word (member count, object or array), for an object its keys (their JEntries and their
/// bytes, as stored), the kind of each member, then the members that are containers, in order.
/// Scalar values are not in it. Equal structures give equal encodings, and an encoding can be
/// read back into its structure: two documents with equal encodings have the same keys, kinds
/// and nesting. Appended to `out`; None, with `out` in any state, for a scalar document, a
/// container with more than `max_members` members, a container nested deeper than `max_depth`
/// levels (the root is level 1), and a malformed document.
///
/// A few copies per container where a token walk takes several steps per member: the field
/// observer fingerprints every payload it walks with it (see `shapes`).
pub fn structure(doc: &[u8], max_depth: u32, max_members: u32, out: &mut Vec<u8>) -> Option<()> {
    let (root, scalar) = open(doc, 0, doc.len())?;
    if scalar || max_depth == 0 {
        return None;
    }
    container_structure(doc, &root, 1, max_depth, max_members, out)
}

/// `structure` of one opened container at nesting level `depth` (see `structure`).
fn container_structure(
    doc: &[u8],
    level: &Level,
    depth: u32,
    max_depth: u32,
    max_members: u32,
    out: &mut Vec<u8>,
) -> Option<()> {
    if level.count > max_members as usize {
        return None;
    }
    out.extend_from_slice(doc.get(level.entries - 4..level.entries)?);
    // An object's values follow its keys among its children.
    let first_value = if level.object {
        // The keys: their JEntries, then their bytes (the data area up to the first value),
        // each key checked as a token walk reads it.
        let mut key_at = 0;
        for i in 0..level.count {
            (_, key_at) = child(doc, level, i, key_at)?;
        }
        out.extend_from_slice(doc.get(level.entries..level.entries + 4 * level.count)?);
        out.extend_from_slice(doc.get(level.data..level.data.checked_add(level.value_at)?)?);
        level.count
    } else {
        0
    };
    // The kind of each member.
    let mut containers = false;
    let mut start = level.value_at;
    for i in 0..level.count {
        let (entry, end) = child(doc, level, first_value + i, start)?;
        // The same bounds a token walk checks of each value (see `JsonbBytes::value`).
        let kind = match entry & JENTRY_TYPEMASK {
            JENTRY_ISSTRING => STRING,
            JENTRY_ISNUMERIC => {
                aligned(doc, level.data, start, end)?;
                NUMBER
            }
            JENTRY_ISBOOL_FALSE | JENTRY_ISBOOL_TRUE => BOOLEAN,
            JENTRY_ISCONTAINER => {
                containers = true;
                aligned(doc, level.data, start, end)?;
                container_kind(doc, level.data + start.next_multiple_of(4))?
            }
            _ => NULL,
        };
        out.push(kind);
        start = end;
    }
    if !containers {
        return Some(());
    }
    // Members at level depth + 1, which a walk descends into only up to max_depth.
    if depth >= max_depth {
        return None;
    }
    let mut start = level.value_at;
    for i in 0..level.count {
        let (entry, end) = child(doc, level, first_value + i, start)?;
        if entry & JENTRY_TYPEMASK == JENTRY_ISCONTAINER {
            let at = level.data + start.next_multiple_of(4);
            let (nested, _) = open(doc, at, level.data + end)?;
            container_structure(doc, &nested, depth + 1, max_depth, max_members, out)?;
        }
        start = end;
    }
    Some(())
}

/// A stored numeric (`utils/numeric.c`): sign, weight and display scale, and its base-10000
/// digits (most significant first, the first one multiplying 10000^weight).
pub struct Numeric<'a> {
    negative: bool,
    weight: i32,
    dscale: u32,
    digits: &'a [u8],
    /// NaN, Infinity or -Infinity (jsonb input never makes one; to_jsonb turns them into strings).
    special: Option<&'static str>,
}

const NUMERIC_SIGN_MASK: u16 = 0xC000;
const NUMERIC_NEG: u16 = 0x4000;
const NUMERIC_SHORT: u16 = 0x8000;
const NUMERIC_SPECIAL: u16 = 0xC000;
const NUMERIC_SHORT_SIGN_MASK: u16 = 0x2000;
const NUMERIC_SHORT_DSCALE_MASK: u16 = 0x1F80;
const NUMERIC_SHORT_DSCALE_SHIFT: u16 = 7;
const NUMERIC_SHORT_WEIGHT_SIGN_MASK: u16 = 0x0040;
const NUMERIC_SHORT_WEIGHT_MASK: u16 = 0x003F;
const NUMERIC_DSCALE_MASK: u16 = 0x3FFF;

/// The payload of a varlena (`bytes` starts at its header, 1 or 4 bytes), within `bytes`.
pub fn varlena_data(bytes: &[u8]) -> Option<&[u8]> {
    let b0 = *bytes.first()?;
    let (header, total) = if cfg!(target_endian = "little") {
        if b0 & 0x01 == 0x01 {
            (1, usize::from(b0 >> 1))
        } else if b0 & 0x03 == 0 {
            (4, (word(bytes, 0)? >> 2) as usize)
        } else {
            return None; // compressed: never inside a jsonb
        }
    } else if b0 & 0x80 == 0x80 {
        (1, usize::from(b0 & 0x7F))
    } else if b0 & 0xC0 == 0 {
        (4, (word(bytes, 0)? & 0x3FFF_FFFF) as usize)
    } else {
        return None;
    };
    bytes.get(header..total)
}

fn half(bytes: &[u8], at: usize) -> Option<u16> {
    let b = bytes.get(at..at.checked_add(2)?)?;
    Some(u16::from_ne_bytes([b[0], b[1]]))
}

impl<'a> Numeric<'a> {
    /// Reads the numeric varlena of a `Token::Value(NUMBER, bytes)`.
    pub fn read(bytes: &'a [u8]) -> Option<Numeric<'a>> {
        Numeric::from_data(varlena_data(bytes)?)
    }

    /// Reads a numeric from its varlena's payload (the bytes after the header).
    pub fn from_data(data: &'a [u8]) -> Option<Numeric<'a>> {
        let header = half(data, 0)?;
        let flags = header & NUMERIC_SIGN_MASK;
        if flags == NUMERIC_SPECIAL {
            let special = match header {
                0xC000 => "NaN",
                0xD000 => "Infinity",
                0xF000 => "-Infinity",
                _ => return None,
            };
            return Some(Numeric {
                negative: false,
                weight: 0,
                dscale: 0,
                digits: &[],
                special: Some(special),
            });
        }
        let (negative, weight, dscale, digits) = if flags == NUMERIC_SHORT {
            let magnitude = i32::from(header & NUMERIC_SHORT_WEIGHT_MASK);
            let weight = if header & NUMERIC_SHORT_WEIGHT_SIGN_MASK != 0 {
                magnitude | !i32::from(NUMERIC_SHORT_WEIGHT_MASK)
            } else {
                magnitude
            };
            (
                header & NUMERIC_SHORT_SIGN_MASK != 0,
                weight,
                u32::from((header & NUMERIC_SHORT_DSCALE_MASK) >> NUMERIC_SHORT_DSCALE_SHIFT),
                data.get(2..)?,
            )
        } else {
            let weight = i32::from(half(data, 2)? as i16);
            (
                flags == NUMERIC_NEG,
                weight,
                u32::from(header & NUMERIC_DSCALE_MASK),
                data.get(4..)?,
            )
        };
        if digits.len() % 2 != 0 {
            return None;
        }
        Some(Numeric {
            negative,
            weight,
            dscale,
            digits,
            special: None,
        })
    }

    /// Base-10000 digit `i` (zero past the stored ones).
    fn digit(&self, i: usize) -> u16 {
        half(self.digits, 2 * i).unwrap_or(0)
    }

    fn ndigits(&self) -> usize {
        self.digits.len() / 2
    }

    /// Length of its text as `numeric_out` writes it (which is how jsonb prints numbers): sign,
    /// the integer part (at least "0"), then the point and `dscale` decimals.
    pub fn text_len(&self) -> u64 {
        if let Some(special) = self.special {
            return special.len() as u64;
        }
        let integer = if self.weight < 0 {
            1
        } else {
            let first = self.digit(0);
            let first_len = match first {
                0..=9 => 1,
                10..=99 => 2,
                100..=999 => 3,
                _ => 4,
            };
            first_len + 4 * self.weight as u64
        };
        u64::from(self.negative)
            + integer
            + if self.dscale > 0 {
                1 + u64::from(self.dscale)
            } else {
                0
            }
    }

    /// Appends its text as `numeric_out` writes it (see `text_len`).
    pub fn write_text(&self, out: &mut Vec<u8>) {
        if let Some(special) = self.special {
            out.extend_from_slice(special.as_bytes());
            return;
        }
        if self.negative {
            out.push(b'-');
        }
        // Digit positions from the first of the integer part (or the first after the point).
        let mut d: i64 = if self.weight < 0 {
            out.push(b'0');
            i64::from(self.weight) + 1
        } else {
            for i in 0..=self.weight as usize {
                let digit = self.digit(i);
                if i == 0 {
                    out.extend_from_slice(digit.to_string().as_bytes());
                } else {
                    out.extend_from_slice(format!("{digit:04}").as_bytes());
                }
            }
            i64::from(self.weight) + 1
        };
        if self.dscale == 0 {
            return;
        }
        out.push(b'.');
        let end = out.len() + self.dscale as usize;
        while out.len() < end {
            let digit = usize::try_from(d).map_or(0, |i| self.digit(i));
            out.extend_from_slice(format!("{digit:04}").as_bytes());
            d += 1;
        }
        out.truncate(end);
    }

    /// Its digits (stored bytes, two a digit) without leading and trailing zero digits, and the
    /// weight of the first: the same for equal values whatever their display scale (zero has no
    /// digits).
    fn significant(&self) -> (i32, &[u8]) {
        let mut digits = self.digits;
        let mut weight = self.weight;
        while digits.len() >= 2 && digits[..2] == [0, 0] {
            digits = &digits[2..];
            weight -= 1;
        }
        while digits.len() >= 2 && digits[digits.len() - 2..] == [0, 0] {
            digits = &digits[..digits.len() - 2];
        }
        if digits.is_empty() {
            weight = 0;
        }
        (weight, digits)
    }

    /// Numeric order (`cmp_numerics`): display scale aside, so 1.0 equals 1.00. NaN sorts
    /// above every number, as in PostgreSQL, and the infinities at the ends.
    pub fn cmp_value(&self, other: &Numeric) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        let rank = |n: &Numeric| match n.special {
            Some("-Infinity") => 0,
            None => 1,
            Some("Infinity") => 2,
            Some(_) => 3,
        };
        let order = rank(self).cmp(&rank(other));
        if order != Ordering::Equal || self.special.is_some() {
            return order;
        }
        let (wa, da) = self.significant();
        let (wb, db) = other.significant();
        let sign = |negative: bool, digits: &[u8]| match (digits.is_empty(), negative) {
            (true, _) => 0,
            (false, true) => -1,
            (false, false) => 1,
        };
        let (sa, sb) = (sign(self.negative, da), sign(other.negative, db));
        if sa != sb || sa == 0 {
            return sa.cmp(&sb);
        }
        // Digit by digit (the stored bytes are native-endian), a shorter prefix first.
        let magnitude = wa.cmp(&wb).then_with(|| {
            let digit = |c: &[u8]| u16::from_ne_bytes([c[0], c[1]]);
            da.chunks_exact(2)
                .map(digit)
                .cmp(db.chunks_exact(2).map(digit))
        });
        if sa < 0 {
            magnitude.reverse()
        } else {
            magnitude
        }
    }

    /// Bytes equal for equal values (as `cmp_value` says), whatever the display scale.
    pub fn value_key(&self, out: &mut Vec<u8>) {
        if let Some(special) = self.special {
            out.push(2);
            out.extend_from_slice(special.as_bytes());
            return;
        }
        let (weight, digits) = self.significant();
        out.push(u8::from(self.negative && !digits.is_empty()));
        out.extend_from_slice(&weight.to_ne_bytes());
        out.extend_from_slice(digits);
    }

    /// The value as (m, d): m / 10^d, d its display scale; None when m does not fit in an
    /// i128 (about 38 digits) or for NaN and the infinities.
    pub fn as_decimal(&self) -> Option<(i128, u32)> {
        if self.special.is_some() {
            return None;
        }
        let scale = self.dscale;
        let mut m: i128 = 0;
        for k in 0..self.ndigits() {
            // Digit k counts 10000^(weight - k), so 10^(4 * (weight - k) + scale) in m.
            let exponent = 4 * (i64::from(self.weight) - k as i64) + i64::from(scale);
            let digit = i128::from(self.digit(k));
            let term = if exponent >= 0 {
                digit.checked_mul(10i128.checked_pow(u32::try_from(exponent).ok()?)?)?
            } else {
                // Past the display scale: zero in a value PostgreSQL made (it rounds to it).
                let divisor = 10i128.checked_pow(u32::try_from(-exponent).ok()?)?;
                if digit % divisor != 0 {
                    return None;
                }
                digit / divisor
            };
            m = m.checked_add(term)?;
        }
        Some((if self.negative { -m } else { m }, scale))
    }

    /// The value when it is an integer within i64 (so 2.0 is 2), else None.
    pub fn as_integer(&self) -> Option<i64> {
        if self.special.is_some() {
            return None;
        }
        // Digits after the point (base-10000 positions past the weight) must all be zero.
        let first_fraction = usize::try_from(self.weight + 1).unwrap_or(0);
        if (first_fraction..self.ndigits()).any(|i| self.digit(i) != 0) {
            return None;
        }
        if self.weight > 3 {
            return None;
        }
        let mut value: i64 = 0;
        for i in 0..first_fraction {
            value = value * 10_000 + i64::from(self.digit(i));
        }
        Some(if self.negative { -value } else { value })
    }
}

/// Length of a string's JSON text as jsonb prints it (`escape_json`): quotes, two-character
/// escapes for `\b \f \n \r \t " \\`, `\u00XX` for other control characters.
pub fn string_text_len(bytes: &[u8]) -> u64 {
    2 + bytes
        .iter()
        .map(|&b| match b {
            0x08 | 0x0C | b'\n' | b'\r' | b'\t' | b'"' | b'\\' => 2,
            0..=0x1F => 6,
            _ => 1,
        })
        .sum::<u64>()
}

/// Length in bytes of the document's text as `jsonb::text` prints it (`{"a": 1, "b": [2, 3]}`:
/// ", " between members, ": " after keys), counted without building the text. Stops counting
/// once past `stop` (the result is then some length > `stop`). None for a malformed document.
pub fn text_len(doc: &[u8], stop: u64) -> Option<u64> {
    let mut reader = JsonbBytes::new(doc);
    let mut len: u64 = 0;
    // Per open container: (is an object, members so far).
    let mut open: Vec<(bool, u32)> = Vec::new();
    let mut after_key = false;
    loop {
        if len > stop {
            return Some(len);
        }
        let token = reader.step(true)?;
        // ", " before every member but the first: at its key in an object, at the element
        // itself in an array.
        let starts_member = match token {
            Token::Key(_) => true,
            Token::Begin(_) | Token::Value(..) => {
                !after_key && open.last().is_some_and(|&(object, _)| !object)
            }
            Token::End => false,
        };
        if starts_member {
            if let Some((_, members)) = open.last_mut() {
                if *members > 0 {
                    len += 2;
                }
                *members += 1;
            }
        }
        after_key = matches!(token, Token::Key(_));
        match token {
            Token::Begin(kind) => {
                open.push((kind == OBJECT, 0));
                len += 1;
            }
            Token::End => {
                open.pop();
                len += 1;
                if open.is_empty() {
                    return Some(len);
                }
            }
            Token::Key(key) => len += string_text_len(key) + 2,
            Token::Value(kind, bytes) => {
                len += match kind {
                    STRING => string_text_len(bytes),
                    NUMBER => Numeric::read(bytes)?.text_len(),
                    _ => bytes.len() as u64, // booleans and null come as their text
                };
                if open.is_empty() {
                    return Some(len); // a scalar document
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A numeric varlena with a 4-byte header, in the long format (sign/dscale word, weight).
    fn long_numeric(negative: bool, weight: i16, dscale: u16, digits: &[u16]) -> Vec<u8> {
        let total = 4 + 4 + 2 * digits.len();
        let mut out = Vec::new();
        let header = if cfg!(target_endian = "little") {
            (total as u32) << 2
        } else {
            total as u32
        };
        out.extend_from_slice(&header.to_ne_bytes());
        out.extend_from_slice(&((if negative { NUMERIC_NEG } else { 0 }) | dscale).to_ne_bytes());
        out.extend_from_slice(&weight.to_ne_bytes());
        for d in digits {
            out.extend_from_slice(&d.to_ne_bytes());
        }
        out
    }

    /// The numeric varlena of a decimal text (`-12.50`, `1.5e3`), normalized as `numeric_in`
    /// makes it: no leading or trailing zero digits, the display scale as written (of the
    /// mantissa, less the exponent).
    pub(crate) fn numeric_of(text: &str) -> Vec<u8> {
        let (negative, unsigned) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        if let Some((mantissa, exponent)) = unsigned.split_once(['e', 'E']) {
            // The point moved by the exponent, as numeric_in reads it.
            let exponent: i64 = exponent.parse().unwrap();
            let (integer, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
            let digits = format!("{integer}{fraction}");
            let point = integer.len() as i64 + exponent;
            let padded = if point <= 0 {
                format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
            } else if point as usize >= digits.len() {
                format!("{digits}{}", "0".repeat(point as usize - digits.len()))
            } else {
                format!(
                    "{}.{}",
                    &digits[..point as usize],
                    &digits[point as usize..]
                )
            };
            let sign = if negative { "-" } else { "" };
            return numeric_of(&format!("{sign}{padded}"));
        }
        let (integer, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
        let integer = integer.trim_start_matches('0');
        let mut decimals = "0".repeat((4 - integer.len() % 4) % 4) + integer;
        let integer_digits = decimals.len() / 4;
        decimals.push_str(fraction);
        decimals.push_str(&"0".repeat((4 - fraction.len() % 4) % 4));
        let mut digits: Vec<u16> = decimals
            .as_bytes()
            .chunks(4)
            .map(|c| std::str::from_utf8(c).unwrap().parse().unwrap())
            .collect();
        let mut weight = integer_digits as i16 - 1;
        while digits.first() == Some(&0) {
            digits.remove(0);
            weight -= 1;
        }
        while digits.last() == Some(&0) {
            digits.pop();
        }
        if digits.is_empty() {
            weight = 0;
        }
        let negative = negative && !digits.is_empty();
        long_numeric(negative, weight, fraction.len() as u16, &digits)
    }

    fn text_of(bytes: &[u8]) -> String {
        let mut out = Vec::new();
        Numeric::read(bytes).unwrap().write_text(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn numbers_are_written_as_numeric_out_writes_them() {
        for text in [
            "0",
            "7",
            "-7",
            "10000",
            "123456789",
            "-123456.78",
            "0.0001",
            "0.00001",
            "1.50",
            "0.000",
            "12345678.000000001",
            "-0.5",
            "99990000",
            "1.0000000000000000000001",
        ] {
            let numeric = numeric_of(text);
            assert_eq!(text_of(&numeric), text);
            assert_eq!(
                Numeric::read(&numeric).unwrap().text_len(),
                text.len() as u64
            );
        }
        assert_eq!(text_of(&long_numeric(false, 250, 0, &[1])).len(), 1001);
        assert_eq!(text_of(&numeric_of("-0.00")), "0.00");
        assert_eq!(text_of(&numeric_of("-1.5e+3")), "-1500");
        assert_eq!(text_of(&numeric_of("25E-3")), "0.025");
    }

    #[test]
    fn numbers_read_as_exact_decimals() {
        let decimal = |t: &str| Numeric::read(&numeric_of(t)).unwrap().as_decimal();
        assert_eq!(decimal("12.50"), Some((1250, 2)));
        assert_eq!(decimal("-0.001"), Some((-1, 3)));
        assert_eq!(decimal("100000000"), Some((100_000_000, 0)));
        assert_eq!(decimal("0.000"), Some((0, 3)));
        assert_eq!(
            decimal("123456789.123456789"),
            Some((123_456_789_123_456_789, 9))
        );
        assert_eq!(
            decimal(&"9".repeat(38)),
            Some(("9".repeat(38).parse().unwrap(), 0))
        );
        assert_eq!(decimal(&"9".repeat(40)), None);
        assert_eq!(decimal(&format!("0.{}1", "0".repeat(40))), Some((1, 41)));
    }

    #[test]
    fn numbers_compare_by_value_whatever_their_scale() {
        use std::cmp::Ordering;
        let sorted = [
            "-1000", "-2.5", "-2.25", "-0.0001", "0", "0.00001", "0.5", "1", "1.0001", "2", "9999",
            "10000", "12345678",
        ];
        for (i, a) in sorted.iter().enumerate() {
            for (j, b) in sorted.iter().enumerate() {
                let (na, nb) = (numeric_of(a), numeric_of(b));
                let (x, y) = (Numeric::read(&na).unwrap(), Numeric::read(&nb).unwrap());
                assert_eq!(x.cmp_value(&y), i.cmp(&j), "{a} against {b}");
                let (mut ka, mut kb) = (Vec::new(), Vec::new());
                x.value_key(&mut ka);
                y.value_key(&mut kb);
                assert_eq!(ka == kb, i == j, "{a} against {b}");
            }
        }
        let (one, one_00) = (numeric_of("1"), numeric_of("1.00"));
        let (x, y) = (
            Numeric::read(&one).unwrap(),
            Numeric::read(&one_00).unwrap(),
        );
        assert_eq!(x.cmp_value(&y), Ordering::Equal);
        let (mut ka, mut kb) = (Vec::new(), Vec::new());
        x.value_key(&mut ka);
        y.value_key(&mut kb);
        assert_eq!(ka, kb);
    }

    #[test]
    fn select_follows_members_as_the_arrow_operator_does() {
        let doc = encode(
            &serde_json::from_str(
                r#"{"item": {"sku": "A-1", "qty": 2.50, "tags": [1]}, "n": null, "t": true}"#,
            )
            .unwrap(),
        );
        let at = |path: &[&str]| select(&doc, path).map(|(k, b)| (KINDS[k as usize], b.to_vec()));
        assert_eq!(at(&["item", "sku"]), Some(("string", b"A-1".to_vec())));
        assert_eq!(
            at(&["item", "qty"]).map(|(k, b)| (k, text_of(&b))),
            Some(("number", "2.50".into()))
        );
        assert_eq!(at(&["n"]).map(|(k, _)| k), Some("null"));
        assert_eq!(at(&["t"]), Some(("boolean", b"true".to_vec())));
        assert_eq!(at(&["item", "tags"]).map(|(k, _)| k), Some("array"));
        assert_eq!(at(&["item"]).map(|(k, _)| k), Some("object"));
        assert_eq!(at(&[]).map(|(k, _)| k), Some("object"));
        assert_eq!(at(&["item", "tags", "0"]), None);
        assert_eq!(at(&["item", "sku", "x"]), None);
        assert_eq!(at(&["missing"]), None);
        assert_eq!(at(&["ite"]), None);
        let scalar = encode(&serde_json::json!("x"));
        assert_eq!(select(&scalar, &[] as &[&str]), Some((STRING, &b"x"[..])));
        assert_eq!(select(&scalar, &["x"]), None);
        // Past JB_OFFSET_STRIDE members, where children are found from stored end offsets.
        let wide: serde_json::Map<String, serde_json::Value> = (0..100)
            .map(|i| (format!("k{i}"), serde_json::json!(format!("v{i}"))))
            .collect();
        let wide = encode(&serde_json::Value::Object(wide));
        for i in 0..100 {
            let key = format!("k{i}");
            assert_eq!(
                select(&wide, &[key.as_str()]),
                Some((STRING, format!("v{i}").as_bytes())),
                "{key}"
            );
        }
    }

    #[test]
    fn numbers_print_as_numeric_out_does() {
        let len = |n: Vec<u8>| Numeric::read(&n).unwrap().text_len();
        assert_eq!(len(long_numeric(false, 0, 0, &[7])), 1); // 7
        assert_eq!(len(long_numeric(true, 1, 2, &[12, 3456, 7800])), 10); // -123456.78
        assert_eq!(len(long_numeric(false, -1, 4, &[1])), 6); // 0.0001
        assert_eq!(len(long_numeric(false, 250, 0, &[1])), 1001); // 1e1000
        assert_eq!(len(long_numeric(false, 0, 0, &[])), 1); // 0
        let integer = |n: Vec<u8>| Numeric::read(&n).unwrap().as_integer();
        assert_eq!(
            integer(long_numeric(false, 1, 1, &[21, 4748])),
            Some(214_748)
        ); // 214748.0
        assert_eq!(integer(long_numeric(false, 0, 1, &[1, 5000])), None); // 1.5
        assert_eq!(integer(long_numeric(true, 0, 0, &[3])), Some(-3));
        assert_eq!(integer(long_numeric(false, 9, 0, &[1])), None); // 1e36

        // Truncated or odd-sized digits: not a number.
        assert!(Numeric::read(&long_numeric(false, 0, 0, &[1])[..6]).is_none());
    }

    #[test]
    fn strings_print_with_json_escapes() {
        assert_eq!(string_text_len(b""), 2);
        assert_eq!(string_text_len("é".as_bytes()), 4);
        assert_eq!(string_text_len(b"a\"b\\\n\t"), 2 + 1 + 2 + 1 + 2 + 2 + 2);
        assert_eq!(string_text_len(b"\x01\x1f"), 2 + 12);
    }

    /// Malformed stored bytes: random words, container headers and JEntries claiming more
    /// members or longer children than there are bytes, truncations.
    pub(crate) fn malformed_document(rng: &mut crate::fuzz::Rng) -> Vec<u8> {
        let flags = [
            0x2000_0000u32,
            0x4000_0000,
            0x5000_0000,
            0x8000_0000,
            0x1000_0000,
            0x3000_0000,
            0,
        ];
        let mut doc = Vec::new();
        for _ in 0..rng.below(24) {
            let w = match rng.below(3) {
                0 => rng.next_u64() as u32,
                1 => flags[rng.below(flags.len())] | rng.below(40) as u32,
                _ => rng.below(64) as u32,
            };
            doc.extend_from_slice(&w.to_ne_bytes());
        }
        doc.truncate(doc.len().saturating_sub(rng.below(4)));
        doc
    }

    /// Every function over stored bytes returns (None or a value) without panicking or reading
    /// outside them.
    #[test]
    fn malformed_bytes_never_panic() {
        let mut rng = crate::fuzz::Rng(0x07e4_71e4_5eed);
        for _ in 0..20_000 {
            let doc = malformed_document(&mut rng);
            let _ = text_len(&doc, 1 << 20);
            let _ = Numeric::read(&doc).map(|n| (n.text_len(), n.as_integer()));
            let _ = crate::envelope_check::check(&doc, 1 << 20);
            let _ = structure(&doc, 32, 1000, &mut Vec::new());
        }
    }

    /// Whether a token walk that descends into every container reads `doc` to the end of its
    /// root (None, a malformed document, before that: false).
    fn walks_to_the_end(doc: &[u8]) -> bool {
        let mut tokens = JsonbBytes::new(doc);
        let mut open = 0;
        loop {
            match tokens.next_token(true) {
                None => return false,
                Some(Token::Begin(_)) => open += 1,
                Some(Token::End) => {
                    open -= 1;
                    if open == 0 {
                        return true;
                    }
                }
                Some(Token::Key(_)) => {}
                Some(Token::Value(..)) if open == 0 => return true, // a scalar document
                Some(Token::Value(..)) => {}
            }
        }
    }

    /// A structure is taken only of a document a token walk reads to the end: a malformed
    /// document whose walk stops early never shares a well-formed one's structure. Checked over
    /// malformed documents, and over well-formed ones with one word of their JEntries changed.
    #[test]
    fn structures_are_taken_of_whole_documents_only() {
        let mut rng = crate::fuzz::Rng(0x5eed_0f57_0c7e);
        let whole: Vec<Vec<u8>> = [
            r#"{"a": 5, "bb": [1, "x", {"c": null}], "d": {"e": [true, 2.5]}}"#,
            r#"[1, [2, [3, {"k": "v"}]], "s", false]"#,
        ]
        .iter()
        .map(|t| encode(&serde_json::from_str(t).unwrap()))
        .collect();
        let mut taken = 0;
        for case in 0..40_000 {
            let doc = if case % 2 == 0 {
                malformed_document(&mut rng)
            } else {
                let mut doc = whole[rng.below(whole.len())].clone();
                let at = 4 * rng.below(doc.len() / 4);
                let w = u32::from_ne_bytes(doc[at..at + 4].try_into().unwrap());
                let changed = match rng.below(3) {
                    0 => w ^ (1 << rng.below(32)),
                    1 => (w & !JENTRY_OFFLENMASK) | rng.below(64) as u32,
                    _ => rng.next_u64() as u32,
                };
                doc[at..at + 4].copy_from_slice(&changed.to_ne_bytes());
                doc
            };
            if structure(&doc, 32, 1000, &mut Vec::new()).is_some() {
                taken += 1;
                assert!(walks_to_the_end(&doc), "case {case}: {doc:?}");
            }
        }
        assert!(taken > 1000, "{taken}");
    }

    /// A document in PostgreSQL's stored jsonb format (`convertToJsonb` in `utils/adt/jsonb_util.c`),
    /// as the root container without its varlena header: object keys sorted by length, then
    /// bytes; every JB_OFFSET_STRIDE-th child (from the first) with its end offset, the others
    /// with their length; numbers and containers aligned to 4 bytes, the padding counted in their
    /// length. Numbers are stored as `numeric_in` reads their text (see `numeric_of`).
    pub(crate) fn encode(v: &serde_json::Value) -> Vec<u8> {
        let mut out = Vec::new();
        match v {
            serde_json::Value::Object(_) | serde_json::Value::Array(_) => {
                encode_container(v, false, &mut out)
            }
            scalar => encode_container(
                &serde_json::Value::Array(vec![scalar.clone()]),
                true,
                &mut out,
            ),
        }
        out
    }

    fn encode_container(v: &serde_json::Value, scalar: bool, out: &mut Vec<u8>) {
        use serde_json::Value;
        const JB_FARRAY: u32 = 0x4000_0000;
        const JENTRY_ISNULL: u32 = 0x4000_0000;
        const JB_OFFSET_STRIDE: usize = 32;
        enum Child<'a> {
            Key(&'a str),
            Value(&'a Value),
        }
        let (header, children) = match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort_by(|a, b| a.len().cmp(&b.len()).then(a.as_bytes().cmp(b.as_bytes())));
                let mut children: Vec<Child> = keys.iter().map(|k| Child::Key(k)).collect();
                children.extend(keys.iter().map(|k| Child::Value(&map[k.as_str()])));
                (JB_FOBJECT | keys.len() as u32, children)
            }
            Value::Array(items) => (
                JB_FARRAY | if scalar { JB_FSCALAR } else { 0 } | items.len() as u32,
                items.iter().map(Child::Value).collect(),
            ),
            _ => unreachable!("containers only"),
        };
        let base = out.len();
        out.extend_from_slice(&header.to_ne_bytes());
        out.resize(base + 4 + 4 * children.len(), 0);
        let mut total = 0usize;
        for (i, child) in children.iter().enumerate() {
            let before = out.len();
            let pad = |out: &mut Vec<u8>| out.resize(out.len().next_multiple_of(4), 0);
            let type_bits = match child {
                Child::Key(k) => {
                    out.extend_from_slice(k.as_bytes());
                    JENTRY_ISSTRING
                }
                Child::Value(Value::String(t)) => {
                    out.extend_from_slice(t.as_bytes());
                    JENTRY_ISSTRING
                }
                Child::Value(Value::Number(n)) => {
                    pad(out);
                    out.extend_from_slice(&numeric_of(&n.to_string()));
                    JENTRY_ISNUMERIC
                }
                Child::Value(Value::Bool(true)) => JENTRY_ISBOOL_TRUE,
                Child::Value(Value::Bool(false)) => JENTRY_ISBOOL_FALSE,
                Child::Value(Value::Null) => JENTRY_ISNULL,
                Child::Value(container) => {
                    pad(out);
                    encode_container(container, false, out);
                    JENTRY_ISCONTAINER
                }
            };
            let len = out.len() - before;
            total += len;
            let entry = if i % JB_OFFSET_STRIDE == 0 {
                type_bits | total as u32 | JENTRY_HAS_OFF
            } else {
                type_bits | len as u32
            };
            out[base + 4 + 4 * i..base + 8 + 4 * i].copy_from_slice(&entry.to_ne_bytes());
        }
    }

    /// Documents encoded as PostgreSQL stores them read back token by token as they were.
    #[test]
    fn encoded_documents_read_back() {
        let doc: serde_json::Value = serde_json::from_str(
            r#"{"bb": [1, "x", null, true, {"c": false}], "a": {"d": []}, "e": 2.5}"#,
        )
        .unwrap();
        let bytes = encode(&doc);
        let mut tokens = JsonbBytes::new(&bytes);
        let mut seen = Vec::new();
        while let Some(token) = tokens.next_token(true) {
            seen.push(match token {
                Token::Begin(k) => format!("begin {}", KINDS[k as usize]),
                Token::Key(k) => format!("key {}", String::from_utf8_lossy(k)),
                Token::Value(k, _) => KINDS[k as usize].to_string(),
                Token::End => "end".into(),
            });
        }
        // Keys by length, then bytes.
        assert_eq!(
            seen.join(", "),
            "begin object, key a, begin object, key d, begin array, end, end, key e, number, \
             key bb, begin array, number, string, null, boolean, begin object, key c, boolean, \
             end, end, end"
        );
    }

    /// A document's structure against its walk: equal for equal structures, none past the
    /// bounds or for a scalar document; keys past the JB_OFFSET_STRIDE-th member count too.
    #[test]
    fn structure_follows_keys_kinds_and_nesting() {
        let of = |text: &str, depth: u32, members: u32| {
            let mut out = Vec::new();
            structure(
                &encode(&serde_json::from_str(text).unwrap()),
                depth,
                members,
                &mut out,
            )
            .map(|()| out)
        };
        // Values other than kinds do not count; keys, kinds and nesting do.
        assert_eq!(
            of(r#"{"a": 1, "b": "x"}"#, 32, 1000),
            of(r#"{"b": "yy", "a": 200}"#, 32, 1000)
        );
        assert_ne!(of(r#"{"a": 1}"#, 32, 1000), of(r#"{"a": "1"}"#, 32, 1000));
        assert_ne!(of(r#"{"a": 1}"#, 32, 1000), of(r#"{"b": 1}"#, 32, 1000));
        assert_ne!(
            of(r#"{"a": [1]}"#, 32, 1000),
            of(r#"{"a": [[1]]}"#, 32, 1000)
        );
        assert_ne!(
            of(r#"{"a": {"b": 1}, "c": 2}"#, 32, 1000),
            of(r#"{"a": {"b": 1, "c": 2}}"#, 32, 1000)
        );
        assert_eq!(
            of(r#"{"a": true}"#, 32, 1000),
            of(r#"{"a": false}"#, 32, 1000)
        );
        // Bounds: nesting (the root is level 1) and members; scalar documents.
        assert!(of(r#"{"a": {"b": 1}}"#, 2, 1000).is_some());
        assert!(of(r#"{"a": {"b": {}}}"#, 2, 1000).is_none());
        assert!(of(r#"[1, 2, 3]"#, 32, 3).is_some());
        assert!(of(r#"[1, 2, 3]"#, 32, 2).is_none());
        assert!(of(r#""scalar""#, 32, 1000).is_none());
        let wide: serde_json::Map<String, serde_json::Value> = (0..70)
            .map(|i| (format!("k{i}"), serde_json::json!(i)))
            .collect();
        let wide = serde_json::Value::Object(wide);
        let mut out = Vec::new();
        assert!(structure(&encode(&wide), 32, 1000, &mut out).is_some());
        // Another key of the same length, past the 32nd member.
        let mut renamed = wide.clone();
        let value = renamed.as_object_mut().unwrap().remove("k50").unwrap();
        renamed["x50"] = value;
        let mut other = Vec::new();
        assert!(structure(&encode(&renamed), 32, 1000, &mut other).is_some());
        assert_ne!(out, other);
        let mut same = Vec::new();
        let mut revalued = wide.clone();
        revalued["k50"] = serde_json::json!(-1);
        assert!(structure(&encode(&revalued), 32, 1000, &mut same).is_some());
        assert_eq!(out, same);
    }
}
