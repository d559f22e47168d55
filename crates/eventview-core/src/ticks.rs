//! When the background worker runs its tick: the policy, apart from the waiting itself (the
//! worker in the extension waits on its latch for `Ticks::wait`, then asks `Ticks::due`).

use std::time::{Duration, Instant};

/// When the worker runs: at least every naptime; and after a commit has woken it, as soon as
/// the first scheduled view is due (by the schedule as `run_maintenance` reads it, computed
/// after each run, so a commit costs the worker no query). Waking for each commit but
/// refreshing on the schedule keeps a busy producer from turning the worker into a loop of
/// tiny refreshes; the naptime bound keeps the field observer and pruning going whatever the
/// commits do.
pub struct Ticks {
    last_run: Instant,
    /// When the first scheduled view is due, from the last run; None when no view is scheduled,
    /// or the last run left a due view unrefreshed (locked, failing): the naptime retries it.
    view_due_at: Option<Instant>,
    /// The latch was set since the last run: a transaction that captured changes committed (or
    /// a signal came, which costs at most one early run).
    woken: bool,
}

impl Ticks {
    pub fn new(now: Instant) -> Self {
        Ticks {
            last_run: now,
            view_due_at: None,
            woken: false,
        }
    }

    fn deadline(&self, naptime: Duration) -> Instant {
        let by_naptime = self.last_run + naptime;
        match self.view_due_at {
            Some(at) if self.woken => at.min(by_naptime),
            _ => by_naptime,
        }
    }

    /// How long to wait on the latch, in whole milliseconds rounded up (the latch wait
    /// truncates to milliseconds: a wait that ran out is then never taken for a wake-up).
    pub fn wait(&self, now: Instant, naptime: Duration) -> Duration {
        let left = self.deadline(naptime).saturating_duration_since(now);
        Duration::from_millis(left.as_micros().div_ceil(1000).max(1) as u64)
    }

    /// After the wait: whether to run now. A return before the deadline is a wake-up.
    pub fn due(&mut self, now: Instant, naptime: Duration) -> bool {
        if now < self.deadline(naptime) {
            self.woken = true;
        }
        // Woken, the deadline may now be the first view's due time.
        now >= self.deadline(naptime)
    }

    /// A run ended at `now`; `next_view_due` is how long until the first scheduled view is due.
    pub fn ran(&mut self, now: Instant, next_view_due: Option<Duration>) {
        self.last_run = now;
        self.woken = false;
        self.view_due_at = next_view_due.map(|wait| now + wait.max(MIN_WAIT));
    }
}

/// The shortest time between two runs that a commit causes.
pub const MIN_WAIT: Duration = Duration::from_millis(10);

#[cfg(test)]
mod tests {
    use super::*;

    const NAPTIME: Duration = Duration::from_secs(1);

    #[test]
    fn ticks_run_every_naptime_whatever_the_commits() {
        let t0 = Instant::now();
        let mut ticks = Ticks::new(t0);
        // No view scheduled: commits every 10 ms never put the naptime off.
        for ms in (10..1000).step_by(10) {
            assert!(!ticks.due(t0 + Duration::from_millis(ms), NAPTIME));
        }
        assert!(ticks.due(t0 + NAPTIME, NAPTIME));
        assert_eq!(
            ticks.wait(t0 + Duration::from_millis(400), NAPTIME),
            Duration::from_millis(600)
        );
    }

    #[test]
    fn a_commit_runs_the_worker_when_the_first_view_is_due() {
        let t0 = Instant::now();
        let mut ticks = Ticks::new(t0);
        ticks.ran(t0, Some(Duration::from_millis(100)));
        // Not woken: the naptime.
        assert_eq!(ticks.wait(t0, NAPTIME), NAPTIME);
        // Woken at 30 ms: not due yet, wait until 100 ms.
        assert!(!ticks.due(t0 + Duration::from_millis(30), NAPTIME));
        assert_eq!(
            ticks.wait(t0 + Duration::from_millis(30), NAPTIME),
            Duration::from_millis(70)
        );
        assert!(ticks.due(t0 + Duration::from_millis(100), NAPTIME));
        // A run that left a due view (locked, failing) retries it at the naptime, not at each commit.
        ticks.ran(t0 + Duration::from_millis(100), None);
        assert!(!ticks.due(t0 + Duration::from_millis(150), NAPTIME));
        assert_eq!(
            ticks.wait(t0 + Duration::from_millis(150), NAPTIME),
            Duration::from_millis(950)
        );
    }

    #[test]
    fn a_wait_that_runs_out_is_not_a_wake_up() {
        let t0 = Instant::now();
        let mut ticks = Ticks::new(t0);
        ticks.ran(t0, Some(Duration::from_micros(100_400)));
        assert!(!ticks.due(t0 + Duration::from_millis(30), NAPTIME));
        // 70.4 ms left, rounded up: the latch wait (whole milliseconds) ends past the deadline.
        let wait = ticks.wait(t0 + Duration::from_millis(30), NAPTIME);
        assert_eq!(wait, Duration::from_millis(71));
        assert!(ticks.due(t0 + Duration::from_millis(30) + wait, NAPTIME));
        // Until a commit wakes it, a view's due time does not shorten the wait.
        ticks.ran(
            t0 + Duration::from_millis(101),
            Some(Duration::from_millis(100)),
        );
        assert_eq!(
            ticks.wait(t0 + Duration::from_millis(500), NAPTIME),
            Duration::from_millis(601)
        );
    }
}
