//! Hand-off timing for contended runs: from one client's release to the
//! next grant to a different client. `lockwright demo`, `lockwright bench`
//! and `lockwright-bench` all use this, so the figures they print mean the
//! same thing.
//!

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The last release and every hand-off seen since.
#[derive(Debug, Default)]
pub struct HandOffs {
    last: Mutex<Option<(usize, Instant)>>,
    gaps: Mutex<Vec<Duration>>,
}

impl HandOffs {
    /// Client `id` was just granted the lock: a hand-off if someone else
    /// released it last.
    pub fn granted(&self, id: usize) {
        let now = Instant::now();
        if let Some((who, at)) = *self.last.lock().unwrap_or_else(|e| e.into_inner()) {
            if who != id {
                self.gaps
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(now - at);
            }
        }
    }

    /// Client `id` is about to release the lock.
    pub fn releasing(&self, id: usize) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((id, Instant::now()));
    }

    /// The hand-offs so far, sorted.
    pub fn take(&self) -> Vec<Duration> {
        let mut gaps = std::mem::take(&mut *self.gaps.lock().unwrap_or_else(|e| e.into_inner()));
        gaps.sort();
        gaps
    }
}

/// The `p` quantile (0..=1) of sorted durations, in ms, or "n/a".
pub fn percentile(sorted: &[Duration], p: f64) -> String {
    percentile_ms(sorted, p).map_or_else(|| "n/a".to_owned(), |ms| format!("{ms:.2} ms"))
}

/// The `p` quantile (0..=1) of sorted durations, in ms as a number (what
/// [`percentile`] shows), or `None` if there are none.
pub fn percentile_ms(sorted: &[Duration], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[i].as_secs_f64() * 1000.0)
}
