//! When the background worker runs its tick: the policy, apart from the waiting itself (the
//! worker in the extension waits on its latch for `Ticks::wait`, then asks `Ticks::due`).

use std::time::{Duration, Instant};

/// When the worker runs: at least every naptime; and after a commit has woken it, as soon as
/// the first scheduled view is due (by the schedule as `run_maintenance` reads it, computed
/// after each run, so a commit costs the worker no query). Waking for each commit but
/// refreshing on the schedule keeps a busy producer from turning the worker into a loop of
/// tiny refreshes; the naptime bound keeps the field observer and pruning going whatever the
/// commits do. Not knowing when a view is due (none was scheduled at the last run, or the run
/// left its due views unrefreshed: their table locked, their refresh failing), a woken worker
/// asks again, at most every `RECHECK` (and runs if a view is due then, left ones included).
/// Knowing, it runs at that time: a view scheduled since the last run, or given a shorter
/// schedule, is picked up by that run or the next naptime.
pub struct Ticks {
    last_run: Instant,
    /// When the first scheduled view is due, as last asked.
    view_due_at: Option<Instant>,
    /// When that was last asked.
    checked_at: Instant,
    /// The latch was set since the last run: a transaction that captured changes committed (or
    /// a signal came, which may bring the run forward to the first view's due time).
    woken: bool,
}

/// What the worker does after a wait.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    Wait,
    /// Ask when the first scheduled view is due (`Ticks::checked`).
    Check,
    Run,
}

/// The shortest time between two runs that a commit causes.
pub const MIN_WAIT: Duration = Duration::from_millis(10);

/// How often a woken worker asks when a view is due while it does not know.
pub const RECHECK: Duration = Duration::from_secs(1);

impl Ticks {
    /// A worker that starts at `now` and runs its first tick a naptime later.
    pub fn new(now: Instant) -> Self {
        Ticks {
            last_run: now,
            view_due_at: None,
            checked_at: now,
            woken: false,
        }
    }

    fn deadline(&self, naptime: Duration) -> Instant {
        let by_naptime = self.last_run + naptime;
        if !self.woken {
            return by_naptime;
        }
        by_naptime.min(self.view_due_at.unwrap_or(self.checked_at + RECHECK))
    }

    /// How long to wait on the latch, in whole milliseconds rounded up (the latch wait
    /// truncates to milliseconds: a wait that ran out is then never taken for a wake-up).
    pub fn wait(&self, now: Instant, naptime: Duration) -> Duration {
        let left = self.deadline(naptime).saturating_duration_since(now);
        Duration::from_millis(left.as_micros().div_ceil(1000).max(1) as u64)
    }

    /// After the wait: what to do now. A return before the deadline is a wake-up.
    pub fn due(&mut self, now: Instant, naptime: Duration) -> Next {
        if now < self.deadline(naptime) {
            self.woken = true;
        }
        if now >= self.last_run + naptime {
            return Next::Run;
        }
        if !self.woken {
            return Next::Wait;
        }
        match self.view_due_at {
            Some(at) if now >= at => Next::Run,
            None if now >= self.checked_at + RECHECK => Next::Check,
            _ => Next::Wait,
        }
    }

    /// Asked at `now`: the first scheduled view is due in `next_view_due` (zero: now; None: no
    /// view is scheduled, and the wake-up is spent: the next commit wakes the worker again).
    /// Whether to run now.
    pub fn checked(&mut self, now: Instant, next_view_due: Option<Duration>) -> bool {
        self.checked_at = now;
        self.view_due_at = next_view_due.map(|wait| now + wait);
        if next_view_due.is_none() {
            self.woken = false;
        }
        next_view_due == Some(Duration::ZERO)
    }

    /// A run ended at `now`; the first scheduled view is due in `next_view_due`, leaving out
    /// those the run could not refresh (locked, failing: the naptime, or a commit's check at
    /// most every `RECHECK`, retries them). Zero: a view is due again already; the next run
    /// comes `MIN_WAIT` later at the earliest.
    pub fn ran(&mut self, now: Instant, next_view_due: Option<Duration>) {
        self.last_run = now;
        self.checked_at = now;
        self.woken = false;
        self.view_due_at = next_view_due.map(|wait| now + wait.max(MIN_WAIT));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAPTIME: Duration = Duration::from_secs(1);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn ticks_run_every_naptime_whatever_the_commits() {
        let t0 = Instant::now();
        let mut ticks = Ticks::new(t0);
        ticks.ran(t0, Some(ms(2000)));
        // A view due in 2 s: commits every 10 ms never put the naptime off.
        for n in (10..1000).step_by(10) {
            assert_eq!(ticks.due(t0 + ms(n), NAPTIME), Next::Wait);
        }
        assert_eq!(ticks.due(t0 + NAPTIME, NAPTIME), Next::Run);
        ticks.ran(t0 + NAPTIME, None);
        assert_eq!(ticks.wait(t0 + ms(1400), NAPTIME), ms(600));
    }

    #[test]
    fn a_commit_runs_the_worker_when_the_first_view_is_due() {
        let t0 = Instant::now();
        let mut ticks = Ticks::new(t0);
        ticks.ran(t0, Some(ms(100)));
        // Not woken: the naptime.
        assert_eq!(ticks.wait(t0, NAPTIME), NAPTIME);
        // Woken at 30 ms: not due yet, wait until 100 ms.
        assert_eq!(ticks.due(t0 + ms(30), NAPTIME), Next::Wait);
        assert_eq!(ticks.wait(t0 + ms(30), NAPTIME), ms(70));
        assert_eq!(ticks.due(t0 + ms(100), NAPTIME), Next::Run);
    }

    #[test]
    fn a_woken_worker_that_knows_no_due_view_asks_at_most_every_recheck() {
        let t0 = Instant::now();
        let mut ticks = Ticks::new(t0);
        // No view scheduled at the last run; one is scheduled, then a commit wakes the worker.
        ticks.ran(t0, None);
        assert_eq!(
            ticks.due(t0 + RECHECK + ms(5), NAPTIME + RECHECK),
            Next::Check
        );
        assert!(ticks.checked(t0 + RECHECK + ms(5), Some(Duration::ZERO)));
        // A run that left its only due view (locked, failing; left out of what it reports):
        // commits ask again after RECHECK, not at once.
        ticks.ran(t0 + RECHECK + ms(10), None);
        assert_eq!(
            ticks.due(t0 + RECHECK + ms(20), NAPTIME + RECHECK),
            Next::Wait
        );
        assert_eq!(
            ticks.wait(t0 + RECHECK + ms(20), NAPTIME + RECHECK),
            RECHECK - ms(10)
        );
        assert_eq!(
            ticks.due(t0 + 2 * RECHECK + ms(10), NAPTIME + RECHECK),
            Next::Check
        );
        // Asked: not due for 50 ms; then it runs.
        assert!(!ticks.checked(t0 + 2 * RECHECK + ms(10), Some(ms(50))));
        assert_eq!(
            ticks.wait(t0 + 2 * RECHECK + ms(10), NAPTIME + RECHECK),
            ms(50)
        );
        assert_eq!(
            ticks.due(t0 + 2 * RECHECK + ms(60), NAPTIME + RECHECK),
            Next::Run
        );
        // Asked with no view scheduled: back to the naptime until the next commit.
        let t1 = t0 + 3 * RECHECK;
        ticks.ran(t1, None);
        assert_eq!(ticks.due(t1 + RECHECK, 3 * RECHECK), Next::Check);
        assert!(!ticks.checked(t1 + RECHECK, None));
        assert_eq!(ticks.wait(t1 + RECHECK, 3 * RECHECK), 2 * RECHECK);
    }

    #[test]
    fn a_run_longer_than_the_schedule_runs_again_at_the_next_commit() {
        let t0 = Instant::now();
        let mut ticks = Ticks::new(t0);
        // The view the run refreshed first is due again when the run ends.
        ticks.ran(t0, Some(Duration::ZERO));
        assert_eq!(ticks.due(t0 + ms(2), NAPTIME), Next::Wait);
        assert_eq!(ticks.wait(t0 + ms(2), NAPTIME), MIN_WAIT - ms(2));
        assert_eq!(ticks.due(t0 + MIN_WAIT, NAPTIME), Next::Run);
    }

    #[test]
    fn a_wait_that_runs_out_is_not_a_wake_up() {
        let t0 = Instant::now();
        let mut ticks = Ticks::new(t0);
        ticks.ran(t0, Some(ms(100)));
        // Not woken, a view's due time does not shorten the wait; 999.6 ms left is rounded up,
        // so the latch wait (whole milliseconds) ends at the deadline, not 0.6 ms before it.
        let now = t0 + Duration::from_micros(400);
        let wait = ticks.wait(now, NAPTIME);
        assert_eq!(wait, NAPTIME);
        assert_eq!(ticks.due(now + wait, NAPTIME), Next::Run);
        assert!(!ticks.woken);
        // Woken, the wait until the view's due time is rounded up too.
        ticks.ran(t0, Some(Duration::from_micros(100_400)));
        assert_eq!(ticks.due(t0 + ms(30), NAPTIME), Next::Wait);
        let wait = ticks.wait(t0 + ms(30), NAPTIME);
        assert_eq!(wait, ms(71));
        assert_eq!(ticks.due(t0 + ms(30) + wait, NAPTIME), Next::Run);
    }
}
