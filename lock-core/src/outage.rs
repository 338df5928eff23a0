//! A waiting acquire's ride through a store that cannot be reached
//! ([`Outage`]): the attempt made again after a growing, jittered pause
//! until the wait ends, an attempt that may have been granted unseen
//! retired under a fresh owner.

use std::time::{Duration, Instant};

use crate::attempts::{Attempts, Ride};
use crate::error::{Error, ErrorKind, Result};
use crate::key::LockKey;
use crate::watchdog::Watchdog;

/// The first and longest pause before a waiting acquire tries a store that
/// was unreachable again: long enough not to hammer a store that is coming
/// back (a ZooKeeper election, a PostgreSQL restart take seconds), short
/// enough to take the lock soon after it is back.
const OUTAGE_PAUSE: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));

/// A waiting acquire's ride through a store that cannot be reached: the
/// attempt is made again, after a growing pause, until the wait ends, and
/// only then is the last store error reported (not `Timeout`, which would
/// hide an outage). An acquire that does not wait fails at once.
pub(crate) struct Outage {
    /// The acquire waits, so an outage is worth riding out.
    rides: bool,
    /// When the store first failed to answer, while it still does not.
    since: Option<Instant>,
    /// The pause before the next try (before its jitter).
    pause: Duration,
}

impl Outage {
    /// No outage yet; `rides`: the acquire waits.
    pub(crate) fn new(rides: bool) -> Self {
        Outage {
            rides,
            since: None,
            pause: OUTAGE_PAUSE.0,
        }
    }

    /// Returns `error` unless it is worth waiting out and the wait has time
    /// left; else sleeps (no further than `give_up`) and says how to go on.
    /// An attempt that may have been granted unseen is retired: the acquire
    /// goes on under a fresh owner (and, if it was queued, a fresh ticket),
    /// so undoing the old one cannot take away the hold it goes on to get,
    /// and a hand-off to the old one cannot be mistaken for its own. An
    /// owner the caller chose cannot be swapped, so its acquire reports the
    /// error instead (a retry could add a hold it does not know of).
    pub(crate) async fn ride(
        &mut self,
        error: Error,
        key: &LockKey,
        give_up: Option<Instant>,
        attempts: &mut Attempts,
        closed: &Watchdog,
    ) -> Result<Ride> {
        let retryable = error.kind() == ErrorKind::Unavailable;
        let uncertain = std::mem::take(&mut attempts.uncertain);
        let swappable = attempts.fresh_owner || !uncertain;
        let now = Instant::now();
        let left = give_up.map(|g| g.saturating_duration_since(now));
        if !(self.rides && retryable && swappable) || left.is_some_and(|l| l.is_zero()) {
            // Dropping `attempts` undoes an unseen grant and leaves the
            // queue in the background, retrying while the store comes back.
            attempts.uncertain = uncertain;
            return Err(error);
        }
        let ride = if uncertain {
            attempts.redraw_owner()
        } else {
            Ride::Same
        };
        match self.since {
            None => {
                self.since = Some(now);
                tracing::info!(key = %key, error = %error.chain(),
                    "store unavailable while waiting for the lock; trying again until the wait ends");
            }
            Some(since) => tracing::debug!(key = %key, error = %error.chain(),
                down_for = ?since.elapsed(), "store still unavailable; trying again"),
        }
        let jitter = 0.5 + f64::from(rand_below(1000)) / 2000.0;
        let pause = self
            .pause
            .mul_f64(jitter)
            .min(left.unwrap_or(Duration::MAX));
        self.pause = (self.pause * 2).min(OUTAGE_PAUSE.1);
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = closed.closed() => {}
        }
        Ok(ride)
    }

    /// The store answered again.
    pub(crate) fn over(&mut self, key: &LockKey) {
        if let Some(since) = self.since.take() {
            tracing::info!(key = %key, down_for = ?since.elapsed(),
                "store reachable again; waiting for the lock goes on");
        }
        self.pause = OUTAGE_PAUSE.0;
    }
}

/// A number below `n` from the OS RNG (0 if it fails): jitter, not secrets.
fn rand_below(n: u32) -> u32 {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).map_or(0, |()| u32::from_le_bytes(b) % n.max(1))
}
