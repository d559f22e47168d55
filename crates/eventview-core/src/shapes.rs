//! The payload walk of the field observer: one call per chunk of new payloads returns the
//! distinct (event type, version, path, JSON type) with how many events had each.
//!
//! Paths are written `$.a.b`, `$['odd key']` (RFC 9535 quoting) and `[*]` for array elements.
//! Bounded: at most MAX_DEPTH levels and MAX_MEMBERS members of each object or array.
//!
//! The walk reads the stored jsonb directly (`jsonb_bytes`), never its text: turning a payload
//! into text and scanning that costs about five times as much as the walk itself. It is
//! written against a small token interface (`Tokens`) so its depth and member bounds are unit
//! tested without a server, against a recursive reference walk. Past MAX_DEPTH (and past
//! MAX_MEMBERS) the iterator is told not to descend, so a payload nested thousands of levels deep
//! costs no more stack or memory than one nested MAX_DEPTH levels.

use crate::jsonb_bytes::{Kind, Token, Tokens, KINDS, OBJECT};
use crate::observe_sql::{MAX_DEPTH, MAX_MEMBERS};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// A fast hash for the walk's short keys (paths, type names). The keys come from payloads, which
/// producers choose: the hash starts from a seed drawn once per process, so collisions cannot be
/// prepared in advance.
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
    }

    fn finish(&self) -> u64 {
        // A final mix, so that the low bits the table uses depend on every input bit.
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^ (x >> 33)
    }
}

#[derive(Clone, Copy)]
struct SeededFx(u64);

impl Default for SeededFx {
    fn default() -> Self {
        static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        SeededFx(
            *SEED.get_or_init(|| {
                std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64)
            }),
        )
    }
}

impl BuildHasher for SeededFx {
    type Hasher = FxHasher;
    fn build_hasher(&self) -> FxHasher {
        FxHasher(self.0)
    }
}

type FastMap<K, V> = HashMap<K, V, SeededFx>;

struct Frame {
    object: bool,
    members: u32,
    /// Where the container's members start: its path's length (paths), unused (fingerprints).
    base: usize,
}

/// What the walk reports, in document order: `walk` decides what is visited (the depth and
/// member bounds), a sink what it makes of it. The records of an event are a function of the
/// sequence of calls alone, which is what makes a fingerprint of the calls (`Fingerprint`) a
/// faithful key for them.
trait Sink {
    /// The document's root container was entered; returns the base of its members.
    fn root(&mut self) -> usize;
    /// A counted member of the current object (members start at `base`).
    fn member(&mut self, base: usize, key: &[u8]);
    /// A counted element of the current array.
    fn element(&mut self, base: usize);
    /// The current member or element has JSON type `kind`.
    fn record(&mut self, kind: Kind);
    /// The current member or element is a container, entered; returns the base of its members.
    fn open(&mut self) -> usize;
    /// The innermost container entered ends.
    fn close(&mut self);
}

/// The walk: every member (or element) of a container at depth < MAX_DEPTH, up to
/// MAX_MEMBERS of each, is recorded with its kind; containers among them are walked in turn.
fn walk<T: Tokens, S: Sink>(doc: &mut T, sink: &mut S) {
    let mut frames: Vec<Frame> = Vec::new();
    match doc.next(MAX_DEPTH > 0) {
        Token::Begin(kind) => frames.push(Frame {
            object: kind == OBJECT,
            members: 0,
            base: sink.root(),
        }),
        _ => return, // a scalar document has no paths
    }
    while let Some(top) = frames.last_mut() {
        let base = top.base;
        let counted = if top.object {
            match doc.next(false) {
                Token::Key(key) => {
                    top.members += 1;
                    let counted = top.members <= MAX_MEMBERS;
                    if counted {
                        sink.member(base, key);
                    }
                    counted
                }
                _ => {
                    // End
                    frames.pop();
                    sink.close();
                    continue;
                }
            }
        } else {
            top.members += 1;
            top.members <= MAX_MEMBERS
        };
        let object = frames.last().is_some_and(|f| f.object);
        let descend = counted && (frames.len() as u32) < MAX_DEPTH;
        let token = doc.next(descend);
        if !object {
            if matches!(token, Token::End) {
                frames.pop();
                sink.close();
                continue;
            }
            if counted {
                sink.element(base);
            }
        }
        match token {
            Token::Value(kind, _) => {
                if counted {
                    sink.record(kind);
                }
            }
            Token::Begin(kind) => {
                // Only given when descending, which only counted members do.
                sink.record(kind);
                frames.push(Frame {
                    object: kind == OBJECT,
                    members: 0,
                    base: sink.open(),
                });
            }
            // Not produced for a value step by a well-formed document.
            Token::Key(_) | Token::End => {}
        }
    }
}

/// The sink that names paths and records (path id, kind) for the event being walked.
struct Paths<'a> {
    path: &'a mut String,
    paths: &'a mut Vec<String>,
    path_ids: &'a mut FastMap<String, u32>,
    event: &'a mut Vec<(u32, Kind)>,
}

impl Sink for Paths<'_> {
    fn root(&mut self) -> usize {
        self.path.clear();
        self.path.push('$');
        self.path.len()
    }
    fn member(&mut self, base: usize, key: &[u8]) {
        self.path.truncate(base);
        push_member(self.path, key);
    }
    fn element(&mut self, base: usize) {
        self.path.truncate(base);
        self.path.push_str("[*]");
    }
    fn record(&mut self, kind: Kind) {
        let id = match self.path_ids.get(self.path.as_str()) {
            Some(&id) => id,
            None => {
                let id = self.paths.len() as u32;
                self.paths.push(self.path.clone());
                self.path_ids.insert(self.path.clone(), id);
                id
            }
        };
        self.event.push((id, kind));
    }
    fn open(&mut self) -> usize {
        self.path.len()
    }
    fn close(&mut self) {}
}

/// The sink that encodes the calls as bytes, one tag per call (a member with its key's length
/// and bytes): equal encodings mean equal calls, hence equal records. Building it costs no path
/// and no hash lookup per member, which is what naming a payload's paths mostly costs.
struct Fingerprint<'a>(&'a mut Vec<u8>);

impl Sink for Fingerprint<'_> {
    fn root(&mut self) -> usize {
        self.0.push(1);
        0
    }
    fn member(&mut self, _: usize, key: &[u8]) {
        self.0.push(2);
        self.0.extend_from_slice(&(key.len() as u32).to_le_bytes());
        self.0.extend_from_slice(key);
    }
    fn element(&mut self, _: usize) {
        self.0.push(3);
    }
    fn record(&mut self, kind: Kind) {
        self.0.push(16 + kind);
    }
    fn open(&mut self) -> usize {
        self.0.push(4);
        0
    }
    fn close(&mut self) {
        self.0.push(5);
    }
}

/// The fingerprint of a payload read from stored jsonb: its structure (`jsonb_bytes::structure`:
/// keys, kinds and nesting, which are all its walk records), tagged so that it never equals a
/// `Fingerprint` (whose first call is `root`, 1). Taken when the walk would visit every member
/// of every container (no more than MAX_MEMBERS members, no deeper than MAX_DEPTH); false
/// otherwise, and for tokens that do not come from stored bytes.
fn stored_fingerprint<T: Tokens>(tokens: &T, out: &mut Vec<u8>) -> bool {
    let Some(doc) = tokens.stored() else {
        return false;
    };
    out.push(0);
    crate::jsonb_bytes::structure(doc, MAX_DEPTH, MAX_MEMBERS, out).is_some()
}

/// One row of `ShapeCounter::rows` (fields in sort order).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ShapeRow {
    pub event_type: String,
    pub event_version: i32,
    /// '' for the row counting the events of the type and version walked.
    pub path: String,
    pub kind: &'static str,
    /// Events with the path and JSON type (or walked, for path '').
    pub events: i64,
    /// Events are numbered from 1 per type and version, in the order walked: the first and the
    /// last with the path and JSON type, and the first without the path (0: none).
    pub first: i64,
    pub first_without: i64,
    pub last: i64,
    /// The JSON type of the path in the last event before `first` that had the path ('' if
    /// none did): the old type of a type change.
    pub before: &'static str,
    /// The same before `first_without` (the old type of the path gone missing; '' if none).
    pub before_without: &'static str,
}

/// Shapes (distinct fingerprints) kept per counter; events of further shapes are walked and
/// counted one by one.
const MAX_SHAPES: usize = 1024;

/// What the walk knows of one path in one group (event type and version). Events are numbered
/// from 1 per group, in the order walked; arrays are by kind.
#[derive(Clone)]
struct PathState {
    group: u32,
    path: u32,
    /// Events with the path and kind.
    counts: [i64; KINDS.len()],
    /// The first and the last event with the path and kind (0: none).
    firsts: [i64; KINDS.len()],
    lasts: [i64; KINDS.len()],
    /// The kinds (a bit per kind) the path had in the latest event walked that had it; by kind,
    /// those of the event before the first with that kind (`ShapeRow::before`).
    latest: u16,
    befores: [u16; KINDS.len()],
    /// How many of the group's first events all had the path (the first event without it is
    /// the next one), and the kinds it had in the last of them (`ShapeRow::before_without`).
    prefix: i64,
    prefix_kinds: u16,
}

/// Consecutive events of one group with one shape, not yet applied to the paths' states: as
/// the shape, the ordinal of its first event, its events, and the shape's path states in the
/// group (an index into `ShapeCounter::slot_lists`).
#[derive(Clone, Copy)]
struct Run {
    shape: u32,
    start: i64,
    events: i64,
    slots: u32,
}

/// Counts, over many events, how many events had each (type, version, path, JSON type).
///
/// Events of one type and version mostly share their shape (the same members with the same
/// JSON types; jsonb even stores an object's keys in one canonical order): each event's
/// payload is first fingerprinted (a stored payload by its structure read from its bytes,
/// `stored_fingerprint`; else by a walk into `Fingerprint`), and only an event of a shape not
/// seen yet is walked to name its paths; the others extend their group's run of one
/// shape, applied to the paths' states when the shape changes, through the states of the
/// shape's paths found once per group and shape (`slot_lists`): no hash lookup per path. When
/// most events have shapes of their own (arrays of varying lengths, keys that are data),
/// fingerprints stop being taken.
#[derive(Default)]
pub struct ShapeCounter {
    groups: Vec<(String, i32)>,
    group_ids: FastMap<(String, i32), u32>,
    paths: Vec<String>,
    path_ids: FastMap<String, u32>,
    /// Events walked per group.
    events: Vec<i64>,
    /// Per (group, path) that some event had: its state, found by `state_ids`. Sparse, since
    /// event types rarely share their paths.
    states: Vec<PathState>,
    state_ids: FastMap<(u32, u32), u32>,
    /// (path id, kind) of the event being walked; deduplicated when it ends.
    event: Vec<(u32, Kind)>,
    path: String,
    /// Fingerprint of the event being walked; shapes by fingerprint; each shape's records
    /// (sorted by path, then kind).
    fingerprint: Vec<u8>,
    shape_ids: FastMap<Vec<u8>, u32>,
    shapes: Vec<Vec<(u32, Kind)>>,
    /// Per (group, shape): the states of the shape's distinct paths in the group, in record
    /// order (an index into `slot_lists`), and events counted through the shape.
    shape_slots: FastMap<(u32, u32), u32>,
    slot_lists: Vec<Vec<u32>>,
    shape_events: FastMap<(u32, u32), i64>,
    /// Events whose fingerprint was known, and not.
    hits: u64,
    misses: u64,
    /// Per group: its current run, if any.
    runs: Vec<Option<Run>>,
}

impl ShapeCounter {
    /// Walks one event's payload and counts each (path, JSON type) it has once.
    pub fn add<T: Tokens>(&mut self, event_type: &str, event_version: i32, payload: &mut T) {
        let group = self.group_id(event_type, event_version);
        self.events[group as usize] += 1;
        self.walk_paths(payload);
        self.count_event(group);
    }

    /// The same as `add`, through the shapes: `payload` gives the payload's tokens afresh,
    /// since an event of a new shape is walked twice.
    pub fn add_shaped<T: Tokens>(
        &mut self,
        event_type: &str,
        event_version: i32,
        mut payload: impl FnMut() -> T,
    ) {
        // Past 256 events of which more than half had new shapes, fingerprints do not pay.
        if self.misses > 256 && self.misses > self.hits {
            return self.add(event_type, event_version, &mut payload());
        }
        let group = self.group_id(event_type, event_version);
        self.events[group as usize] += 1;
        self.fingerprint.clear();
        let mut tokens = payload();
        if !stored_fingerprint(&tokens, &mut self.fingerprint) {
            self.fingerprint.clear();
            walk(&mut tokens, &mut Fingerprint(&mut self.fingerprint));
        }
        let shape = match self.shape_ids.get(self.fingerprint.as_slice()) {
            Some(&shape) => {
                self.hits += 1;
                shape
            }
            None => {
                self.misses += 1;
                self.walk_paths(&mut payload());
                if self.shapes.len() >= MAX_SHAPES {
                    return self.count_event(group);
                }
                let shape = self.shapes.len() as u32;
                self.event.sort_unstable();
                self.event.dedup();
                self.shapes.push(self.event.clone());
                self.shape_ids.insert(self.fingerprint.clone(), shape);
                shape
            }
        };
        let ordinal = self.events[group as usize];
        match &mut self.runs[group as usize] {
            Some(run) if run.shape == shape => run.events += 1,
            _ => {
                let slots = self.slots_of(group, shape);
                let run = Run {
                    shape,
                    start: ordinal,
                    events: 1,
                    slots,
                };
                if let Some(ended) = self.runs[group as usize].replace(run) {
                    self.apply_run(group, ended);
                }
            }
        }
    }

    /// The states of the paths of `records` (sorted by path) in `group`, one per distinct
    /// path, in order; created for paths the group has not had.
    fn states_of(&mut self, group: u32, records: &[(u32, Kind)]) -> Vec<u32> {
        records
            .chunk_by(|a, b| a.0 == b.0)
            .map(|same_path| {
                let path = same_path[0].0;
                *self.state_ids.entry((group, path)).or_insert_with(|| {
                    self.states.push(PathState {
                        group,
                        path,
                        counts: [0; KINDS.len()],
                        firsts: [0; KINDS.len()],
                        lasts: [0; KINDS.len()],
                        latest: 0,
                        befores: [0; KINDS.len()],
                        prefix: 0,
                        prefix_kinds: 0,
                    });
                    (self.states.len() - 1) as u32
                })
            })
            .collect()
    }

    /// `states_of` a shape's records, kept per (group, shape): an index into `slot_lists`.
    fn slots_of(&mut self, group: u32, shape: u32) -> u32 {
        if let Some(&slots) = self.shape_slots.get(&(group, shape)) {
            return slots;
        }
        let records = std::mem::take(&mut self.shapes[shape as usize]);
        let states = self.states_of(group, &records);
        self.shapes[shape as usize] = records;
        self.slot_lists.push(states);
        let slots = (self.slot_lists.len() - 1) as u32;
        self.shape_slots.insert((group, shape), slots);
        slots
    }

    /// Applies a run of events of one shape to its paths' states, and counts its events. Runs
    /// of a group are applied in the order of their events.
    fn apply_run(&mut self, group: u32, run: Run) {
        apply_records(
            &mut self.states,
            &self.shapes[run.shape as usize],
            &self.slot_lists[run.slots as usize],
            run.start,
            run.events,
        );
        *self.shape_events.entry((group, run.shape)).or_insert(0) += run.events;
    }

    /// Walks a payload into `event`: the (path id, kind) it has.
    fn walk_paths<T: Tokens>(&mut self, payload: &mut T) {
        self.event.clear();
        let mut sink = Paths {
            path: &mut self.path,
            paths: &mut self.paths,
            path_ids: &mut self.path_ids,
            event: &mut self.event,
        };
        walk(payload, &mut sink);
    }

    /// Counts the event just walked (`event`) in `group`, each (path, kind) once.
    fn count_event(&mut self, group: u32) {
        self.event.sort_unstable();
        self.event.dedup();
        let records = std::mem::take(&mut self.event);
        let slots = self.states_of(group, &records);
        add_counts(&mut self.states, &records, &slots, 1);
        if let Some(run) = self.runs[group as usize].take() {
            self.apply_run(group, run);
        }
        let ordinal = self.events[group as usize];
        apply_records(&mut self.states, &records, &slots, ordinal, 1);
        self.event = records;
    }

    fn group_id(&mut self, event_type: &str, event_version: i32) -> u32 {
        if let Some((last_type, last_version)) = self.groups.last() {
            // Chunks come mostly in runs of one type and version.
            if last_type == event_type && *last_version == event_version {
                return (self.groups.len() - 1) as u32;
            }
        }
        let key = (event_type.to_string(), event_version);
        if let Some(&id) = self.group_ids.get(&key) {
            return id;
        }
        let id = self.groups.len() as u32;
        self.groups.push(key.clone());
        self.events.push(0);
        self.runs.push(None);
        self.group_ids.insert(key, id);
        id
    }

    /// The counts, a `ShapeRow` per (event type, version, path, JSON type), and per event type
    /// and version one row with path and JSON type '' counting the events walked. Within a type
    /// and version, events are numbered from 1 in the order walked (see `ShapeRow`); drift
    /// follows that order, so it does not depend on how changes were split into refreshes.
    pub fn rows(mut self) -> Vec<ShapeRow> {
        for group in 0..self.groups.len() {
            if let Some(run) = self.runs[group].take() {
                self.apply_run(group as u32, run);
            }
        }
        for (&(group, shape), &n) in &self.shape_events {
            let records = &self.shapes[shape as usize];
            let slots = &self.slot_lists[self.shape_slots[&(group, shape)] as usize];
            add_counts(&mut self.states, records, slots, n);
        }
        let mut out = Vec::new();
        for ((t, v), &n) in self.groups.iter().zip(&self.events) {
            out.push(ShapeRow {
                event_type: t.clone(),
                event_version: *v,
                path: String::new(),
                kind: "",
                events: n,
                first: 0,
                first_without: 0,
                last: 0,
                before: "",
                before_without: "",
            });
        }
        for st in &self.states {
            let (t, v) = &self.groups[st.group as usize];
            let events = self.events[st.group as usize];
            let first_without = if st.prefix < events { st.prefix + 1 } else { 0 };
            let before_without = if first_without > 1 {
                st.prefix_kinds
            } else {
                0
            };
            for (kind, &n) in st.counts.iter().enumerate() {
                if n > 0 {
                    out.push(ShapeRow {
                        event_type: t.clone(),
                        event_version: *v,
                        path: self.paths[st.path as usize].clone(),
                        kind: KINDS[kind],
                        events: n,
                        first: st.firsts[kind],
                        first_without,
                        last: st.lasts[kind],
                        before: kind_named(st.befores[kind]),
                        before_without: kind_named(before_without),
                    });
                }
            }
        }
        out.sort();
        out
    }
}

/// Adds `events` to the count of each (path, kind) of `records` (sorted by path, then kind), in
/// the states of their paths (`slots`: one per distinct path, in order).
fn add_counts(states: &mut [PathState], records: &[(u32, Kind)], slots: &[u32], events: i64) {
    for (same_path, &slot) in records.chunk_by(|a, b| a.0 == b.0).zip(slots) {
        for &(_, kind) in same_path {
            states[slot as usize].counts[kind as usize] += events;
        }
    }
}

/// Applies `records` (sorted by path, then kind), those of the group's events `start` to
/// `start + events - 1`, to the states of their paths (`slots`: one per distinct path, in
/// order): firsts, lasts, the kinds before and the prefix.
fn apply_records(
    states: &mut [PathState],
    records: &[(u32, Kind)],
    slots: &[u32],
    start: i64,
    events: i64,
) {
    let end = start + events - 1;
    for (same_path, &slot) in records.chunk_by(|a, b| a.0 == b.0).zip(slots) {
        let kinds = same_path
            .iter()
            .fold(0u16, |mask, &(_, kind)| mask | (1 << kind));
        let st = &mut states[slot as usize];
        let latest = std::mem::replace(&mut st.latest, kinds);
        for &(_, kind) in same_path {
            if st.firsts[kind as usize] == 0 {
                st.firsts[kind as usize] = start;
                st.befores[kind as usize] = latest;
            }
            // Runs of a group come in the order of their events: the latest is the last.
            st.lasts[kind as usize] = end;
        }
        if st.prefix == start - 1 {
            st.prefix = end;
            st.prefix_kinds = kinds;
        }
    }
}

/// One JSON type of a set (a bit per kind), '' for none. An event with a path of two types
/// (array elements of both) names the first by name, as the observer's SQL picks the type a
/// path had last among those of one event (`prev_paths`).
fn kind_named(kinds: u16) -> &'static str {
    (0..KINDS.len())
        .filter(|&k| kinds & (1 << k) != 0)
        .map(|k| KINDS[k])
        .min()
        .unwrap_or("")
}

fn push_member(path: &mut String, key: &[u8]) {
    let plain = key
        .first()
        .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
        && key.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_');
    if plain {
        path.push('.');
        path.extend(key.iter().map(|&b| b as char)); // ASCII, checked above
        return;
    }
    path.push_str("['");
    for ch in String::from_utf8_lossy(key).chars() {
        if ch == '\\' || ch == '\'' {
            path.push('\\');
        }
        path.push(ch);
    }
    path.push_str("']");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jsonb_bytes::*;
    use serde_json::Value;

    /// A parsed document as tokens, for testing the walk without a server.
    struct ValueTokens<'a> {
        /// Pending steps; containers walked into expand in place.
        stack: Vec<Step<'a>>,
    }

    enum Step<'a> {
        Val(&'a Value),
        Key(&'a str),
        End,
    }

    fn kind(v: &Value) -> Kind {
        match v {
            Value::Object(_) => OBJECT,
            Value::Array(_) => ARRAY,
            Value::String(_) => STRING,
            Value::Number(_) => NUMBER,
            Value::Bool(_) => BOOLEAN,
            Value::Null => NULL,
        }
    }

    impl<'a> ValueTokens<'a> {
        fn new(doc: &'a Value) -> Self {
            ValueTokens {
                stack: vec![Step::Val(doc)],
            }
        }
    }

    impl Tokens for ValueTokens<'_> {
        fn next(&mut self, descend: bool) -> Token<'_> {
            match self.stack.pop() {
                None | Some(Step::End) => Token::End,
                Some(Step::Key(k)) => Token::Key(k.as_bytes()),
                Some(Step::Val(v)) => match v {
                    Value::Object(map) if descend => {
                        self.stack.push(Step::End);
                        for (k, child) in map.iter().rev() {
                            self.stack.push(Step::Val(child));
                            self.stack.push(Step::Key(k));
                        }
                        Token::Begin(OBJECT)
                    }
                    Value::Array(items) if descend => {
                        self.stack.push(Step::End);
                        for child in items.iter().rev() {
                            self.stack.push(Step::Val(child));
                        }
                        Token::Begin(ARRAY)
                    }
                    other => Token::Value(kind(other), &[]),
                },
            }
        }
    }

    type Seen = std::collections::BTreeSet<(String, &'static str)>;

    /// The walk as recursion over a parsed document: the specification the iterative walk meets.
    fn reference_walk(value: &Value, path: &mut String, depth: u32, seen: &mut Seen) {
        if depth >= MAX_DEPTH {
            return;
        }
        match value {
            Value::Object(map) => {
                for (key, child) in map.iter().take(MAX_MEMBERS as usize) {
                    let len = path.len();
                    push_member(path, key.as_bytes());
                    seen.insert((path.clone(), KINDS[kind(child) as usize]));
                    reference_walk(child, path, depth + 1, seen);
                    path.truncate(len);
                }
            }
            Value::Array(items) => {
                let len = path.len();
                path.push_str("[*]");
                for child in items.iter().take(MAX_MEMBERS as usize) {
                    seen.insert((path.clone(), KINDS[kind(child) as usize]));
                    reference_walk(child, path, depth + 1, seen);
                }
                path.truncate(len);
            }
            _ => {}
        }
    }

    fn walked(doc: &Value) -> Seen {
        let mut counter = ShapeCounter::default();
        counter.add("t", 1, &mut ValueTokens::new(doc));
        counter
            .rows()
            .into_iter()
            .filter(|row| !row.path.is_empty())
            .map(|row| {
                assert_eq!(row.events, 1);
                (row.path, row.kind)
            })
            .collect()
    }

    fn expected(doc: &Value) -> Seen {
        let mut seen = Seen::new();
        reference_walk(doc, &mut String::from("$"), 0, &mut seen);
        seen
    }

    #[test]
    fn paths_types_and_counts_per_event() {
        let mut counter = ShapeCounter::default();
        let a: Value = serde_json::from_str(
            r#"{"x": {"y": 1}, "items": [{"id": 1}, {"id": "2"}, {"id": 3}], "it's": null}"#,
        )
        .unwrap();
        let b: Value = serde_json::from_str(r#"{"x": 5}"#).unwrap();
        let c: Value = serde_json::from_str(r#"{"x": 5}"#).unwrap();
        counter.add("a", 1, &mut ValueTokens::new(&a));
        counter.add("a", 1, &mut ValueTokens::new(&b));
        counter.add("a", 2, &mut ValueTokens::new(&c));
        let rows = counter.rows();
        let get = |v: i32, p: &str, k: &str| {
            rows.iter()
                .find(|r| r.event_version == v && r.path == p && r.kind == k)
                .map(|r| r.events)
        };
        assert_eq!(get(1, "$.x", "object"), Some(1));
        assert_eq!(get(1, "$.x", "number"), Some(1));
        assert_eq!(get(2, "$.x", "number"), Some(1));
        assert_eq!(get(1, "$.x.y", "number"), Some(1));
        // Counted once per event, however many elements have it.
        assert_eq!(get(1, "$.items[*].id", "number"), Some(1));
        assert_eq!(get(1, "$.items[*].id", "string"), Some(1));
        assert_eq!(get(1, "$['it\\'s']", "null"), Some(1));
        // Events walked per type and version.
        assert_eq!(get(1, "", ""), Some(2));
        assert_eq!(get(2, "", ""), Some(1));
        assert_eq!(rows.len(), 9 + 2);
    }

    /// Events are numbered in the order walked, per type and version: for each path and JSON
    /// type the first and the last event with it, for each path the first event without it; the
    /// same whether events are counted one by one or through shapes (runs of one shape
    /// included).
    #[test]
    fn first_events_follow_the_order_walked() {
        let docs: Vec<Value> = [
            r#"{"x": 1}"#,
            r#"{"x": 1}"#,
            r#"{"x": 1}"#,
            r#"{"x": "s", "y": 1}"#,
            r#"{"x": 1}"#,
            r#"{"y": true}"#,
            r#"{"x": 2}"#,
        ]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
        for shaped in [false, true] {
            let mut counter = ShapeCounter::default();
            for (i, doc) in docs.iter().enumerate() {
                if shaped {
                    counter.add_shaped("t", 1, || ValueTokens::new(doc));
                    counter.add_shaped("u", 1, || ValueTokens::new(&docs[docs.len() - 1 - i]));
                } else {
                    counter.add("t", 1, &mut ValueTokens::new(doc));
                    counter.add("u", 1, &mut ValueTokens::new(&docs[docs.len() - 1 - i]));
                }
            }
            let rows = counter.rows();
            let get = |t: &str, p: &str, k: &str| {
                rows.iter()
                    .find(|r| r.event_type == t && r.path == p && r.kind == k)
                    .map(|r| (r.events, r.first, r.first_without, r.last))
            };
            // (events, first event with it, first event without the path, last event with it)
            assert_eq!(
                get("t", "$.x", "number"),
                Some((5, 1, 6, 7)),
                "shaped {shaped}"
            );
            assert_eq!(
                get("t", "$.x", "string"),
                Some((1, 4, 6, 4)),
                "shaped {shaped}"
            );
            assert_eq!(
                get("t", "$.y", "number"),
                Some((1, 4, 1, 4)),
                "shaped {shaped}"
            );
            assert_eq!(
                get("t", "$.y", "boolean"),
                Some((1, 6, 1, 6)),
                "shaped {shaped}"
            );
            assert_eq!(
                get("u", "$.x", "number"),
                Some((5, 1, 2, 7)),
                "shaped {shaped}"
            );
            assert_eq!(
                get("u", "$.x", "string"),
                Some((1, 4, 2, 4)),
                "shaped {shaped}"
            );
            assert_eq!(
                get("u", "$.y", "boolean"),
                Some((1, 2, 1, 2)),
                "shaped {shaped}"
            );
        }
        // Every event has the path: no first event without it.
        let mut counter = ShapeCounter::default();
        for doc in &docs[..3] {
            counter.add_shaped("t", 1, || ValueTokens::new(doc));
        }
        assert_eq!(
            counter.rows().iter().find(|r| r.path == "$.x").map(|r| (
                r.events,
                r.first,
                r.first_without,
                r.last
            )),
            Some((3, 1, 0, 3))
        );
    }

    #[test]
    fn walk_agrees_with_the_reference() {
        let docs = [
            r#"{"a": 1, "b": [1, "x", null, {"c": true}], "d": {"e": {"f": [[1], []]}}}"#,
            r#"{"k\"q": {"été": 1.5e3, "😀": false}, "sp ace": "a\\b\"}", "n": -0.5}"#,
            r#"[{"a": 1}, {"a": "s"}, 3]"#,
            r#""scalar""#,
            "{}",
            "[]",
        ];
        for doc in docs {
            let parsed: Value = serde_json::from_str(doc).unwrap();
            assert_eq!(walked(&parsed), expected(&parsed), "{doc}");
        }
    }

    fn random_json(rng: &mut crate::fuzz::Rng, depth: u32) -> String {
        const KEYS: &[&str] = &[
            "a",
            "sku",
            "it's",
            "k\\\"q",
            "\\u00e9",
            "x y",
            "_1",
            "\\ud83d\\ude00",
        ];
        match if depth > 6 {
            rng.below(4)
        } else {
            rng.below(6)
        } {
            0 => "null".into(),
            1 => ["true", "false", "-1.5e3", "0", "\"s\\n\""][rng.below(5)].into(),
            2 => format!("{}", rng.below(1000)),
            3 => "\"text\"".into(),
            4 => {
                let items: Vec<String> = (0..rng.below(4))
                    .map(|_| random_json(rng, depth + 1))
                    .collect();
                format!("[{}]", items.join(", "))
            }
            _ => {
                let mut keys: Vec<&str> = (0..rng.below(5)).map(|_| rng.pick(KEYS)).collect();
                keys.sort();
                keys.dedup();
                let members: Vec<String> = keys
                    .iter()
                    .map(|k| format!("\"{k}\": {}", random_json(rng, depth + 1)))
                    .collect();
                format!("{{{}}}", members.join(", "))
            }
        }
    }

    /// Counting through shapes (fingerprints, each new shape walked again) gives exactly the
    /// counts of walking every event: documents repeated (known shapes), documents that differ
    /// only in values, in array lengths, in keys, past MAX_SHAPES, and past the point where
    /// fingerprints stop paying.
    #[test]
    fn counting_by_shape_equals_counting_every_event() {
        let mut rng = crate::fuzz::Rng(0x005b_a9e5_eed5);
        // Pairs that differ only in where a container ends, or in an element against a member.
        let mut docs: Vec<Value> = [
            r#"{"a": {"b": 1}, "c": 2}"#,
            r#"{"a": {"b": 1, "c": 2}}"#,
            r#"{"a": [[1], 2]}"#,
            r#"{"a": [[1, 2]]}"#,
            r#"{"a": [{"b": 1}]}"#,
            r#"{"a": {"b": [1]}}"#,
        ]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
        for _ in 0..300 {
            let doc = format!("{{\"root\": {}}}", random_json(&mut rng, 0));
            docs.push(serde_json::from_str(&doc).unwrap());
        }
        // Same shape, other values; other array lengths; keys that are data.
        for i in 0..50 {
            docs.push(
                serde_json::json!({"sku": format!("s{i}"), "qty": i, "tags": vec!["t"; i % 4]}),
            );
            docs.push(serde_json::json!({format!("k{i}"): {"x": i}}));
        }
        let run = |order: &[usize], shaped: bool| {
            let mut counter = ShapeCounter::default();
            for &i in order {
                let doc = &docs[i];
                let (t, v) = (["a", "b"][i % 2], (i % 3) as i32);
                if shaped {
                    counter.add_shaped(t, v, || ValueTokens::new(doc));
                } else {
                    counter.add(t, v, &mut ValueTokens::new(doc));
                }
            }
            counter.rows()
        };
        // Few shapes, many repeats: mostly fingerprint hits.
        let repeated: Vec<usize> = (0..3000).map(|_| rng.below(20)).collect();
        assert!((0..6).all(|i| repeated.contains(&i)));
        assert_eq!(run(&repeated, true), run(&repeated, false));
        // Everything, in random order, repeated: hits, misses, and shapes past MAX_SHAPES.
        let all: Vec<usize> = (0..4 * docs.len()).map(|_| rng.below(docs.len())).collect();
        assert_eq!(run(&all, true), run(&all, false));
        // Mostly new shapes: fingerprints are given up, the counts stay the same.
        let mut wide = ShapeCounter::default();
        let mut plain = ShapeCounter::default();
        for i in 0..2 * MAX_SHAPES {
            let doc = serde_json::json!({format!("key{i}"): i, "n": {"m": [i]}});
            wide.add_shaped("t", 1, || ValueTokens::new(&doc));
            plain.add("t", 1, &mut ValueTokens::new(&doc));
        }
        assert!(wide.misses > wide.hits && wide.shapes.len() <= MAX_SHAPES);
        assert_eq!(wide.rows(), plain.rows());
        // More shapes than are kept, amid enough repeats to keep taking fingerprints.
        let (mut many, mut plain) = (ShapeCounter::default(), ShapeCounter::default());
        let known = serde_json::json!({"a": 1});
        for i in 0..MAX_SHAPES + 500 {
            let doc = serde_json::json!({format!("key{i}"): i});
            for d in [&doc, &known, &known] {
                many.add_shaped("t", 1, || ValueTokens::new(d));
                plain.add("t", 1, &mut ValueTokens::new(d));
            }
        }
        assert_eq!(many.shapes.len(), MAX_SHAPES);
        assert!(many.hits > many.misses);
        assert_eq!(many.rows(), plain.rows());
    }

    /// The walk's numbering against its definitions, computed event by event from the
    /// reference walk: per group, for each path and JSON type its events, first and last
    /// event, the first event without the path, the type before the first event with the type,
    /// and the type before the first event without the path; counted through shapes and one by
    /// one, with groups interleaved and shapes alternating within a group.
    #[test]
    fn numbering_meets_its_definitions() {
        let mut rng = crate::fuzz::Rng(0x0d3f_1e55_a11e);
        // Objects of a few common members, each present in most documents, with values of
        // varying JSON types: paths come and go, and change types, within a group.
        let docs: Vec<Value> = (0..12)
            .map(|_| {
                let mut members = Vec::new();
                for k in ["a", "b", "c", "d"] {
                    if rng.below(4) > 0 {
                        members.push(format!("\"{k}\": {}", random_json(&mut rng, 5)));
                    }
                }
                serde_json::from_str(&format!("{{{}}}", members.join(", "))).unwrap()
            })
            .collect();
        let order: Vec<(usize, usize)> = (0..2000)
            .map(|_| (rng.below(3), rng.below(docs.len())))
            .collect();
        let bit = |name: &str| 1u16 << KINDS.iter().position(|k| *k == name).unwrap();
        let mut expected_rows = Vec::new();
        for group in 0..3 {
            // Per event of the group, in order: each path's kinds.
            let events: Vec<std::collections::BTreeMap<String, u16>> = order
                .iter()
                .filter(|(g, _)| *g == group)
                .map(|&(_, d)| {
                    let mut kinds = std::collections::BTreeMap::new();
                    for (path, kind) in expected(&docs[d]) {
                        *kinds.entry(path).or_insert(0) |= bit(kind);
                    }
                    kinds
                })
                .collect();
            let t = ["a", "b", "c"][group];
            expected_rows.push(ShapeRow {
                event_type: t.into(),
                event_version: 1,
                path: String::new(),
                kind: "",
                events: events.len() as i64,
                first: 0,
                first_without: 0,
                last: 0,
                before: "",
                before_without: "",
            });
            let paths: std::collections::BTreeSet<&String> =
                events.iter().flat_map(|e| e.keys()).collect();
            for path in paths {
                let has = |i: usize| events[i].get(path).copied().unwrap_or(0);
                let first_without = (0..events.len()).find(|&i| has(i) == 0);
                let before_without = match first_without {
                    Some(i) if i > 0 => has(i - 1),
                    _ => 0,
                };
                for (k, kind) in KINDS.iter().enumerate() {
                    let with: Vec<usize> = (0..events.len())
                        .filter(|&i| has(i) & (1 << k) != 0)
                        .collect();
                    let Some(&first) = with.first() else { continue };
                    let before = (0..first).rev().map(has).find(|&m| m != 0).unwrap_or(0);
                    expected_rows.push(ShapeRow {
                        event_type: t.into(),
                        event_version: 1,
                        path: path.clone(),
                        kind,
                        events: with.len() as i64,
                        first: first as i64 + 1,
                        first_without: first_without.map_or(0, |i| i as i64 + 1),
                        last: *with.last().unwrap() as i64 + 1,
                        before: kind_named(before),
                        before_without: kind_named(before_without),
                    });
                }
            }
        }
        expected_rows.sort();
        for shaped in [true, false] {
            let mut counter = ShapeCounter::default();
            for &(g, d) in &order {
                let t = ["a", "b", "c"][g];
                if shaped {
                    counter.add_shaped(t, 1, || ValueTokens::new(&docs[d]));
                } else {
                    counter.add(t, 1, &mut ValueTokens::new(&docs[d]));
                }
            }
            assert_eq!(counter.rows(), expected_rows, "shaped {shaped}");
        }
    }

    /// Stored payloads fingerprinted by their structure (`jsonb_bytes::structure`): documents
    /// of one structure have the same walk records, and counting through those fingerprints
    /// gives the counts of walking every event, for documents past the walk's bounds too (which
    /// are fingerprinted by their walk).
    #[test]
    fn stored_structures_count_as_walking_every_event() {
        use crate::jsonb_bytes::tests::encode;
        let mut rng = crate::fuzz::Rng(0x0057_00ed_5eed);
        let mut docs: Vec<Value> = (0..300)
            .map(|_| {
                serde_json::from_str(&format!("{{\"root\": {}}}", random_json(&mut rng, 0)))
                    .unwrap()
            })
            .collect();
        for i in 0..50 {
            docs.push(
                serde_json::json!({"sku": format!("s{i}"), "qty": i, "tags": vec!["t"; i % 3]}),
            );
        }
        let mut deep = serde_json::json!(1);
        for _ in 0..MAX_DEPTH + 3 {
            deep = serde_json::json!({ "d": deep });
        }
        docs.push(deep);
        let wide: serde_json::Map<String, Value> = (0..MAX_MEMBERS + 1)
            .map(|i| (format!("k{i}"), serde_json::json!(i)))
            .collect();
        docs.push(Value::Object(wide));
        docs.push(serde_json::json!("scalar"));
        let stored: Vec<Vec<u8>> = docs.iter().map(encode).collect();
        let mut by_structure: HashMap<Vec<u8>, Seen> = HashMap::new();
        let mut structured = 0;
        for (doc, bytes) in docs.iter().zip(&stored) {
            let seen = expected(doc);
            let mut walked = ShapeCounter::default();
            walked.add("t", 1, &mut JsonbBytes::new(bytes));
            let from_bytes: Seen = walked
                .rows()
                .into_iter()
                .filter(|r| !r.path.is_empty())
                .map(|r| (r.path, r.kind))
                .collect();
            assert_eq!(from_bytes, seen, "{doc}");
            let mut s = Vec::new();
            if crate::jsonb_bytes::structure(bytes, MAX_DEPTH, MAX_MEMBERS, &mut s).is_some() {
                structured += 1;
                assert_eq!(
                    by_structure.entry(s).or_insert_with(|| seen.clone()),
                    &seen,
                    "{doc}"
                );
            }
        }
        assert!(structured >= docs.len() - 3 && by_structure.len() < structured);
        let order: Vec<usize> = (0..4 * docs.len()).map(|_| rng.below(docs.len())).collect();
        let (mut shaped, mut plain) = (ShapeCounter::default(), ShapeCounter::default());
        for &i in &order {
            let (t, v) = (["a", "b"][i % 2], (i % 3) as i32);
            shaped.add_shaped(t, v, || JsonbBytes::new(&stored[i]));
            plain.add(t, v, &mut JsonbBytes::new(&stored[i]));
        }
        assert!(shaped.hits > shaped.misses);
        assert_eq!(shaped.rows(), plain.rows());
    }

    #[test]
    fn walk_agrees_with_the_reference_on_random_documents() {
        let mut rng = crate::fuzz::Rng(0x005e_ed0f_0b5e_71ed);
        for case in 0..2000 {
            let doc = format!("{{\"root\": {}}}", random_json(&mut rng, 0));
            let parsed: Value =
                serde_json::from_str(&doc).unwrap_or_else(|e| panic!("case {case}: {doc}: {e}"));
            assert_eq!(walked(&parsed), expected(&parsed), "case {case}: {doc}");
        }
    }

    /// The old type of a type change is the type of the last event before it with the path,
    /// and that of a path gone missing the type of the last event before it (not the type that
    /// first appeared last): the same one by one and through shapes.
    #[test]
    fn old_types_are_those_of_the_event_before() {
        let docs: Vec<Value> = [
            r#"{"x": 1}"#,
            r#"{"x": "s"}"#,
            r#"{"x": 1}"#,
            r#"{"x": 1}"#,
            r#"{"x": true}"#,
            r#"{}"#,
            r#"{"x": 1}"#,
        ]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
        for shaped in [false, true] {
            let mut counter = ShapeCounter::default();
            for doc in &docs {
                if shaped {
                    counter.add_shaped("t", 1, || ValueTokens::new(doc));
                } else {
                    counter.add("t", 1, &mut ValueTokens::new(doc));
                }
            }
            let rows = counter.rows();
            let get = |k: &str| {
                rows.iter()
                    .find(|r| r.path == "$.x" && r.kind == k)
                    .map(|r| (r.first, r.before, r.before_without))
            };
            assert_eq!(get("number"), Some((1, "", "boolean")), "shaped {shaped}");
            assert_eq!(
                get("string"),
                Some((2, "number", "boolean")),
                "shaped {shaped}"
            );
            assert_eq!(
                get("boolean"),
                Some((5, "number", "boolean")),
                "shaped {shaped}"
            );
        }
    }

    /// Of two types in one event, the first by name, as the observer's SQL orders them.
    #[test]
    fn two_types_in_one_event_name_the_first_by_name() {
        let bit = |name: &str| 1u16 << KINDS.iter().position(|k| *k == name).unwrap();
        assert_eq!(kind_named(bit("string") | bit("number")), "number");
        assert_eq!(kind_named(bit("boolean") | bit("object")), "boolean");
        assert_eq!(kind_named(bit("null")), "null");
        assert_eq!(kind_named(0), "");
    }

    /// Malformed stored documents (random words, headers claiming more members than there are
    /// bytes, truncations) end the walk early: no panic, no read outside the bytes, no loop.
    #[test]
    fn malformed_jsonb_bytes_end_the_walk() {
        let mut rng = crate::fuzz::Rng(0x0bad_b17e_5eed);
        for _ in 0..20_000 {
            let doc = crate::jsonb_bytes::tests::malformed_document(&mut rng);
            let mut counter = ShapeCounter::default();
            counter.add("t", 1, &mut JsonbBytes::new(&doc));
            assert!(counter.rows().len() <= 2 * MAX_MEMBERS as usize * MAX_DEPTH as usize);
        }
    }

    #[test]
    fn deep_and_wide_payloads_are_bounded() {
        // Deeper than MAX_DEPTH: one path per level down to the limit, nothing below.
        let deep: Value =
            serde_json::from_str(&format!("{}1{}", "{\"a\":".repeat(100), "}".repeat(100)))
                .unwrap();
        let seen = walked(&deep);
        assert_eq!(seen.len(), MAX_DEPTH as usize);
        assert_eq!(seen, expected(&deep));
        let wide: Value = serde_json::from_str(&format!(
            "{{{}}}",
            (0..5000)
                .map(|i| format!("\"k{i}\": {i}"))
                .collect::<Vec<_>>()
                .join(",")
        ))
        .unwrap();
        assert_eq!(walked(&wide).len(), MAX_MEMBERS as usize);
        let xs: Vec<Value> = (0..5000)
            .map(|i| {
                if i < 1000 {
                    Value::from(i)
                } else {
                    Value::from("s")
                }
            })
            .collect();
        let long_array: Value = serde_json::json!({ "xs": xs });
        // Elements past MAX_MEMBERS are not walked: no string element is seen.
        assert_eq!(walked(&long_array), expected(&long_array));
        assert!(!walked(&long_array).contains(&("$.xs[*]".to_string(), "string")));
    }
}
