//! What the locks do, as metrics through the [`metrics`] facade: nothing is
//! recorded (and next to nothing spent) until the application installs a
//! recorder. Each figure also goes out as a `debug` event under the
//! metric's own name (target `lockwright::metrics`), so `-v` shows the
//! names a dashboard would. The README's "Metrics" table is the contract.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use metrics::Label;

use crate::error::ErrorKind;
use crate::key::LockKey;
use crate::lease::LostReason;
use crate::request::HoldKind;

/// Time from an acquire's start to its outcome (histogram, seconds).
pub const ACQUIRE_WAIT: &str = "lockwright_acquire_wait_seconds";
/// Time from a grant to its release or loss (histogram, seconds).
pub const HELD_TIME: &str = "lockwright_held_seconds";
/// Locks this process holds now (gauge).
pub const HELD: &str = "lockwright_held";
/// Elections this process leads now (gauge).
pub const LEADER: &str = "lockwright_leader";
/// Attempts that found the lock held by someone else (counter).
pub const CONTENDED: &str = "lockwright_contended_total";
/// Acquires granted after waiting on a holder (counter).
pub const HANDOFFS: &str = "lockwright_handoffs_total";
/// Renewals by outcome (counter).
pub const RENEWALS: &str = "lockwright_renewals_total";
/// Held locks lost, by reason (counter).
pub const LOST: &str = "lockwright_lost_total";
/// Store errors met by acquires, releases and renewals, by kind (counter).
pub const STORE_ERRORS: &str = "lockwright_store_errors_total";

/// The labels every figure of one lock carries.
#[derive(Debug, Clone)]
pub(crate) struct Labels {
    store: &'static str,
    primitive: &'static str,
    name: Option<Arc<str>>,
}

impl Labels {
    /// `name_label`: the caller opted in to one series per lock name.
    pub(crate) fn new(
        store: &'static str,
        primitive: &'static str,
        key: &LockKey,
        name_label: bool,
    ) -> Self {
        Labels {
            store,
            primitive,
            name: name_label.then(|| Arc::from(key.as_str())),
        }
    }

    /// The store's label (the URL scheme).
    pub(crate) fn store(&self) -> &'static str {
        self.store
    }

    /// The primitive's label.
    pub(crate) fn primitive(&self) -> &'static str {
        self.primitive
    }

    fn with(&self, extra: Option<(&'static str, &'static str)>) -> Vec<Label> {
        let mut labels = Vec::with_capacity(4);
        labels.push(Label::from_static_parts("store", self.store));
        labels.push(Label::from_static_parts("primitive", self.primitive));
        if let Some((k, v)) = extra {
            labels.push(Label::from_static_parts(k, v));
        }
        if let Some(name) = &self.name {
            labels.push(Label::new("name", name.to_string()));
        }
        labels
    }

    /// The `-v` line of a metric that moved by `value`, its extra label
    /// under its own name.
    fn log(&self, metric: &'static str, extra: Option<(&'static str, &'static str)>, value: f64) {
        let (store, primitive) = (self.store, self.primitive);
        match extra {
            Some(("outcome", outcome)) => tracing::debug!(target: "lockwright::metrics",
                metric, store, primitive, outcome, value),
            Some(("reason", reason)) => tracing::debug!(target: "lockwright::metrics",
                metric, store, primitive, reason, value),
            Some((_, kind)) => tracing::debug!(target: "lockwright::metrics",
                metric, store, primitive, kind, value),
            None => tracing::debug!(target: "lockwright::metrics", metric, store, primitive, value),
        }
    }

    /// Counts one more of `metric`.
    fn count(&self, metric: &'static str, extra: Option<(&'static str, &'static str)>) {
        self.log(metric, extra, 1.0);
        metrics::counter!(metric, self.with(extra)).increment(1);
    }

    /// Records `seconds` in `metric`'s histogram.
    fn time(
        &self,
        metric: &'static str,
        extra: Option<(&'static str, &'static str)>,
        seconds: f64,
    ) {
        self.log(metric, extra, seconds);
        metrics::histogram!(metric, self.with(extra)).record(seconds);
    }

    fn gauge(&self, metric: &'static str, delta: f64) {
        self.log(metric, None, delta);
        let g = metrics::gauge!(metric, self.with(None));
        if delta >= 0.0 {
            g.increment(delta);
        } else {
            g.decrement(-delta);
        }
    }

    /// One attempt found the lock held.
    pub(crate) fn contended(&self) {
        self.count(CONTENDED, None);
    }

    /// The store failed a request with `kind`.
    pub(crate) fn store_error(&self, kind: ErrorKind) {
        self.count(STORE_ERRORS, Some(("kind", kind_label(kind))));
    }

    /// A renewal's outcome: `renewed`, `failed` or `not_held`.
    pub(crate) fn renewal(&self, outcome: &'static str) {
        self.count(RENEWALS, Some(("outcome", outcome)));
    }
}

/// The primitive a claim belongs to, as its metrics name it.
pub(crate) fn primitive(kind: &HoldKind, election: bool) -> &'static str {
    match kind {
        _ if election => ELECTION,
        HoldKind::Reader { .. } => "read",
        HoldKind::Writer => "write",
        HoldKind::Mutex | HoldKind::Permit { permits: 1 } => "lock",
        HoldKind::Permit { .. } => "semaphore",
    }
}

/// An [`ErrorKind`] as a label value.
pub(crate) fn kind_label(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Timeout => "timeout",
        ErrorKind::NotHeld => "not_held",
        ErrorKind::Lost => "lost",
        ErrorKind::Unavailable => "unavailable",
        ErrorKind::InvalidKey => "invalid_key",
        ErrorKind::InvalidOptions => "invalid_options",
        ErrorKind::Config => "config",
        ErrorKind::Backend => "backend",
        ErrorKind::Closed => "closed",
        ErrorKind::Unsupported => "unsupported",
        ErrorKind::Busy => "busy",
    }
}

/// How an acquire ended, as `lockwright_acquire_wait_seconds` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Granted.
    Acquired,
    /// A no-wait attempt found the lock held.
    Busy,
    /// The wait ran out while someone else held it.
    TimedOut,
    /// The store could not be reached within the wait.
    Unavailable,
    /// The caller dropped the acquire.
    Cancelled,
    /// Any other error (bad options, a closed locker, the store's refusal).
    Failed,
}

impl Outcome {
    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Acquired => "acquired",
            Outcome::Busy => "busy",
            Outcome::TimedOut => "timed_out",
            Outcome::Unavailable => "unavailable",
            Outcome::Cancelled => "cancelled",
            Outcome::Failed => "failed",
        }
    }
}

/// One acquire, timed from its start; dropped unfinished, it records
/// `cancelled`.
pub(crate) struct AcquireMeter {
    labels: Labels,
    start: Instant,
    done: bool,
}

impl AcquireMeter {
    pub(crate) fn start(labels: Labels) -> Self {
        AcquireMeter {
            labels,
            start: Instant::now(),
            done: false,
        }
    }

    pub(crate) fn labels(&self) -> &Labels {
        &self.labels
    }

    /// The acquire ended with `outcome`; `handed`: it was granted after it
    /// had found the lock held (a hand-off from a holder).
    pub(crate) fn finish(mut self, outcome: Outcome, handed: bool) -> f64 {
        self.done = true;
        let waited = self.start.elapsed().as_secs_f64();
        self.labels
            .time(ACQUIRE_WAIT, Some(("outcome", outcome.as_str())), waited);
        if handed && outcome == Outcome::Acquired {
            self.labels.count(HANDOFFS, None);
        }
        waited
    }
}

impl Drop for AcquireMeter {
    fn drop(&mut self) {
        if !self.done {
            let waited = self.start.elapsed().as_secs_f64();
            self.labels.time(
                ACQUIRE_WAIT,
                Some(("outcome", Outcome::Cancelled.as_str())),
                waited,
            );
        }
    }
}

/// One hold, from its grant until it ends once: by release, by a drop, or
/// by its loss (whichever comes first).
pub(crate) struct HoldMeter {
    labels: Labels,
    start: Instant,
    ended: AtomicBool,
    /// `lockwright_held`'s handle, registered once for both of its moves.
    held: metrics::Gauge,
}

impl std::fmt::Debug for HoldMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldMeter")
            .field("labels", &self.labels)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl HoldMeter {
    pub(crate) fn start(labels: Labels) -> Arc<Self> {
        labels.log(HELD, None, 1.0);
        let held = metrics::gauge!(HELD, labels.with(None));
        held.increment(1.0);
        if labels.primitive == ELECTION {
            labels.gauge(LEADER, 1.0);
        }
        Arc::new(HoldMeter {
            labels,
            start: Instant::now(),
            ended: AtomicBool::new(false),
            held,
        })
    }

    pub(crate) fn labels(&self) -> &Labels {
        &self.labels
    }

    /// The hold ended (released, leaked, or the guard dropped); only the
    /// first end (or loss) counts.
    pub(crate) fn end(&self) {
        if !self.ended.swap(true, Ordering::AcqRel) {
            self.close();
        }
    }

    /// The hold was lost for `reason`, unless it had ended already.
    pub(crate) fn lost(&self, reason: LostReason) {
        if self.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        let reason = match reason {
            LostReason::Expired => "expired",
            LostReason::NotHeld => "not_held",
            LostReason::Closed => "closed",
        };
        self.labels.count(LOST, Some(("reason", reason)));
        self.close();
    }

    fn close(&self) {
        self.labels.log(HELD, None, -1.0);
        self.held.decrement(1.0);
        if self.labels.primitive == ELECTION {
            self.labels.gauge(LEADER, -1.0);
        }
        self.labels
            .time(HELD_TIME, None, self.start.elapsed().as_secs_f64());
    }
}

impl Drop for HoldMeter {
    /// A hold whose guard was never finished (a panic while it was made)
    /// ends here, so the gauges come back down.
    fn drop(&mut self) {
        self.end();
    }
}

/// The primitive label of a campaign's hold.
const ELECTION: &str = "election";
