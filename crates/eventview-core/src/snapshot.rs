//! Positions in the changelog as `pg_snapshot` values: which transactions a snapshot shows, the
//! statement's snapshot without the caller's own transaction (`eventview._snapshot_without_own`)
//! and whether a position names only transactions the cluster has given out
//! (`eventview._position_given_out`). The functions run at every refresh, observation and
//! realtime read, so they are C functions over the value's bytes, which this module reads and
//! writes.
//!
//! A `pg_snapshot` (PostgreSQL's `xid8funcs.c`) is a varlena: a 4-byte header, the number of
//! in-progress transactions (u32), xmin and xmax (u64 each), then the in-progress transaction
//! ids (u64 each), ascending and distinct, each in `[xmin, xmax)`.

/// A `pg_snapshot`'s content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub xmin: u64,
    pub xmax: u64,
    /// The transactions in progress, ascending and distinct.
    pub xip: Vec<u64>,
}

/// Bytes before the first in-progress id: the varlena header, the count, xmin and xmax.
const HEADER_BYTES: usize = 24;

impl Snapshot {
    /// Reads a `pg_snapshot` from its bytes, varlena header included (4-byte header, in native
    /// byte order as PostgreSQL keeps it in memory); None when the bytes are not one.
    pub fn from_bytes(bytes: &[u8]) -> Option<Snapshot> {
        let word = |at: usize| -> Option<u64> {
            Some(u64::from_ne_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        let nxip = u32::from_ne_bytes(bytes.get(4..8)?.try_into().ok()?) as usize;
        if bytes.len() != HEADER_BYTES + 8 * nxip {
            return None;
        }
        let xip = (0..nxip)
            .map(|i| word(HEADER_BYTES + 8 * i))
            .collect::<Option<Vec<u64>>>()?;
        Some(Snapshot {
            xmin: word(8)?,
            xmax: word(16)?,
            xip,
        })
    }

    /// The bytes after the varlena header (whose length is `HEADER_BYTES - 4` plus 8 per
    /// in-progress transaction): the caller allocates the value and writes its header.
    pub fn body_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES - 4 + 8 * self.xip.len());
        out.extend_from_slice(&(self.xip.len() as u32).to_ne_bytes());
        out.extend_from_slice(&self.xmin.to_ne_bytes());
        out.extend_from_slice(&self.xmax.to_ne_bytes());
        for xid in &self.xip {
            out.extend_from_slice(&xid.to_ne_bytes());
        }
        out
    }

    /// Whether transaction `xid` is visible in the snapshot (`pg_visible_in_snapshot`): it
    /// ended before the snapshot was taken.
    pub fn shows(&self, xid: u64) -> bool {
        if xid < self.xmin {
            true
        } else if xid >= self.xmax {
            false
        } else {
            self.xip.binary_search(&xid).is_err()
        }
    }

    /// The snapshot with transaction `own` in progress, when it shows `own`; None when it does
    /// not (the snapshot is then the answer as it is). A statement's snapshot never lists the
    /// statement's own transaction among those in progress, so a consumer that records it as
    /// its position would count its own transaction's later changes as applied: its position
    /// leaves that transaction in progress instead, and its own changes are counted by
    /// changelog position (`own_seq`).
    pub fn without(&self, own: u64) -> Option<Snapshot> {
        if !self.shows(own) {
            return None;
        }
        let mut xip = self.xip.clone();
        let at = xip.binary_search(&own).unwrap_or_else(|at| at);
        xip.insert(at, own);
        Some(Snapshot {
            xmin: self.xmin.min(own),
            xmax: self.xmax,
            xip,
        })
    }
}

/// Whether a position (applied snapshot `xmax`, own xid `own`) names only transactions given
/// out before `next_xid`, the first the cluster has not: SQL's
/// `pg_snapshot_xmax(s) <= next_xid AND (own IS NULL OR own < next_xid)`, None for NULL (an
/// unknown snapshot, unless the own xid alone makes it false).
pub fn given_out(xmax: Option<u64>, own: Option<u64>, next_xid: u64) -> Option<bool> {
    let own_given = own.is_none_or(|own| own < next_xid);
    match xmax {
        Some(xmax) => Some(xmax <= next_xid && own_given),
        None if !own_given => Some(false),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(xmin: u64, xmax: u64, xip: &[u64]) -> Snapshot {
        Snapshot {
            xmin,
            xmax,
            xip: xip.to_vec(),
        }
    }

    fn with_header(s: &Snapshot) -> Vec<u8> {
        let body = s.body_bytes();
        let mut bytes = (((body.len() + 4) as u32) << 2).to_ne_bytes().to_vec();
        bytes.extend_from_slice(&body);
        bytes
    }

    #[test]
    fn a_snapshot_reads_back_from_its_bytes() {
        for s in [snap(5, 5, &[]), snap(10, 20, &[10, 12, 19])] {
            let bytes = with_header(&s);
            assert_eq!(bytes.len(), HEADER_BYTES + 8 * s.xip.len());
            assert_eq!(Snapshot::from_bytes(&bytes), Some(s));
        }
    }

    #[test]
    fn bytes_of_the_wrong_length_are_not_a_snapshot() {
        let bytes = with_header(&snap(10, 20, &[12]));
        assert_eq!(Snapshot::from_bytes(&bytes[..bytes.len() - 1]), None);
        assert_eq!(Snapshot::from_bytes(&bytes[..7]), None);
        let mut longer = bytes.clone();
        longer.extend_from_slice(&[0; 8]);
        assert_eq!(Snapshot::from_bytes(&longer), None);
    }

    #[test]
    fn a_snapshot_shows_what_ended_before_it() {
        let s = snap(10, 20, &[12, 15]);
        assert!(s.shows(9));
        assert!(s.shows(10));
        assert!(!s.shows(12));
        assert!(s.shows(13));
        assert!(!s.shows(15));
        assert!(s.shows(19));
        assert!(!s.shows(20));
        assert!(!s.shows(25));
    }

    #[test]
    fn the_own_transaction_is_left_in_progress_in_order() {
        let s = snap(10, 20, &[12, 15]);
        assert_eq!(s.without(13), Some(snap(10, 20, &[12, 13, 15])));
        assert_eq!(s.without(19), Some(snap(10, 20, &[12, 15, 19])));
        assert_eq!(s.without(10), Some(snap(10, 20, &[10, 12, 15])));
        // Below xmin: xmin moves down to it.
        assert_eq!(s.without(7), Some(snap(7, 20, &[7, 12, 15])));
        assert_eq!(snap(8, 8, &[]).without(3), Some(snap(3, 8, &[3])));
    }

    #[test]
    fn a_snapshot_that_does_not_show_the_own_transaction_stays_as_it_is() {
        let s = snap(10, 20, &[12, 15]);
        assert_eq!(s.without(12), None);
        assert_eq!(s.without(20), None);
        assert_eq!(s.without(31), None);
    }

    #[test]
    fn a_position_is_given_out_when_it_names_no_later_transaction() {
        assert_eq!(given_out(Some(20), None, 20), Some(true));
        assert_eq!(given_out(Some(21), None, 20), Some(false));
        assert_eq!(given_out(Some(20), Some(19), 20), Some(true));
        assert_eq!(given_out(Some(20), Some(20), 20), Some(false));
        assert_eq!(given_out(Some(21), Some(3), 20), Some(false));
        assert_eq!(given_out(None, None, 20), None);
        assert_eq!(given_out(None, Some(3), 20), None);
        assert_eq!(given_out(None, Some(25), 20), Some(false));
    }
}
