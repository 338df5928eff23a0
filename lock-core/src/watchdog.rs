//! One renewal task per `Locker`: renews every held lease in batches and
//! fires the lost signal when a lease cannot be kept.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{watch, Notify};

use crate::backend::{LockBackend, Renew, RenewRequest};
use crate::error::Result;
use crate::guard::{FailureHook, RenewalFailure};
use crate::key::{LockKey, OwnerToken};
use crate::lease::{local_deadline, LeaseState, LostReason};
use crate::meter::HoldMeter;

/// Renewals due within this fraction of their period are sent together, so a
/// locker holding many locks makes few round trips.
const COALESCE_DIVISOR: u32 = 4;
/// Most leases renewed in one backend call.
const MAX_BATCH: usize = 100;
/// The shortest pause between two renewals of a lease whose renewal failed:
/// a store that fails at once must not be called in a tight loop.
const MIN_RETRY: Duration = Duration::from_millis(10);
/// How long the task waits with nothing to watch before it exits. It keeps
/// only a weak handle meanwhile, so a dropped Locker still frees the backend.
const IDLE_EXIT: Duration = Duration::from_secs(30);
/// The shortest time between two alarm sweeps (see
/// [`LockBackend::alarm`]); also never less than a quarter of the shortest
/// renewal period, so that a store raising alarms without end costs at most
/// a few times the usual renewals.
const ALARM_GAP: Duration = Duration::from_millis(250);

struct Entry {
    request: RenewRequest,
    /// How long a confirmed renewal is trusted for: the TTL, or less where
    /// the store caps it (`Capabilities::max_lease`).
    trusted: Duration,
    renew_every: Option<Duration>,
    next_renew: Instant,
    /// How early this renewal may join a batch: a quarter of the interval
    /// up to it (a short first interval after a hand-off has a short one).
    window: Duration,
    deadline: Instant,
    /// When the store last vouched for the lease: the send time of its last
    /// confirmed renewal, or its registration.
    confirmed: Instant,
    in_flight: bool,
    /// Renewals failed in a row; while non-zero the entry waits out its
    /// backoff instead of joining an early batch.
    failures: u32,
    /// When the last renewal failed (while `failures` is not 0). An alarm
    /// seen since then brings the next one forward: a store that went away
    /// and came back (its reconnect raises the alarm) is asked at once,
    /// while an alarm raised by the failure itself (a full server) cannot
    /// undo the backoff.
    failed_at: Option<Instant>,
    /// An alarm came while this entry's renewal was in flight: if that
    /// renewal fails, the next is sent at once rather than after a backoff
    /// (it was sent before the alarm, and says nothing of the store since).
    alarmed_in_flight: bool,
    tx: watch::Sender<LeaseState>,
    meter: Arc<HoldMeter>,
    /// Called (outside the lock) with each failed renewal.
    hooks: Vec<FailureHook>,
}

/// Hooks to call, once the state's lock is let go, with what failed.
type Calls = Option<(Vec<FailureHook>, RenewalFailure)>;

#[derive(Default)]
struct State {
    entries: HashMap<u64, Entry>,
    next_id: u64,
    running: bool,
    /// [`Watchdog::close`] ran: nothing new is tracked, and the task exits
    /// as soon as its last renewal in flight is back.
    closed: bool,
    /// When the task will look at the entries next, as it decided with
    /// them in view; `None` when it waits to be woken (idle, or not
    /// started). A new lease due no sooner needs no wake-up: taking and
    /// releasing locks one after another then costs the task nothing.
    sleeping_until: Option<Instant>,
}

pub(crate) struct Watchdog {
    backend: Arc<dyn LockBackend>,
    state: Mutex<State>,
    wake: Arc<Notify>,
    /// Wakes acquires still waiting when the locker is closed.
    closing: Notify,
    /// `State::closed`, readable without the lock: every acquire asks.
    closed: AtomicBool,
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watchdog")
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // An idle task waiting on this learns at once that it can exit.
        self.wake.notify_one();
    }
}

type Batch = (Vec<u64>, Instant, Vec<Result<Renew>>);

impl Watchdog {
    pub(crate) fn new(backend: Arc<dyn LockBackend>) -> Arc<Self> {
        Arc::new(Watchdog {
            backend,
            state: Mutex::new(State::default()),
            wake: Arc::new(Notify::new()),
            closing: Notify::new(),
            closed: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the map half-updated
        // in a way that matters more than losing the watchdog entirely.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts tracking a lease, first renewed at `first_renew` and then
    /// every `renew_every`. `renew_every = None` only watches the deadline.
    pub(crate) fn register(
        self: &Arc<Self>,
        request: RenewRequest,
        trusted: Duration,
        renew_every: Option<Duration>,
        first_renew: Instant,
        deadline: Instant,
        meter: Arc<HoldMeter>,
    ) -> (u64, watch::Receiver<LeaseState>) {
        let (tx, rx) = watch::channel(LeaseState::Held { deadline });
        let mut st = self.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.entries.insert(
            id,
            Entry {
                request,
                trusted,
                next_renew: first_renew,
                window: first_renew
                    .saturating_duration_since(Instant::now())
                    .min(renew_every.unwrap_or_default())
                    / COALESCE_DIVISOR,
                renew_every,
                deadline,
                confirmed: Instant::now(),
                in_flight: false,
                failures: 0,
                failed_at: None,
                alarmed_in_flight: false,
                tx,
                meter,
                hooks: Vec::new(),
            },
        );
        let due = renew_every.map_or(deadline, |_| first_renew.min(deadline));
        let wake = !st.running || st.sleeping_until.is_none_or(|t| due < t);
        if !st.running {
            st.running = true;
            tokio::spawn(Self::run(Arc::downgrade(self), self.wake.clone()));
        }
        drop(st);
        if wake {
            self.wake.notify_one();
        }
        (id, rx)
    }

    /// Calls `hook` with each failed renewal of lease `id` from now on.
    pub(crate) fn on_failure(&self, id: u64, hook: FailureHook) {
        if let Some(e) = self.lock().entries.get_mut(&id) {
            e.hooks.push(hook);
        }
    }

    /// Stops tracking a lease; its state becomes `Released` unless it was lost.
    /// Whether another hold this watchdog tracks has `owner` on `key`: a
    /// re-entrant hold (`lock_as` with another guard's owner) that a
    /// second release would count down.
    pub(crate) fn shares(&self, key: &LockKey, owner: &OwnerToken) -> bool {
        self.lock()
            .entries
            .values()
            .any(|e| e.request.key == *key && e.request.owner == *owner)
    }

    pub(crate) fn unregister(&self, id: u64) {
        let removed = self.lock().entries.remove(&id);
        if let Some(e) = removed {
            e.tx.send_if_modified(|s| {
                let held = matches!(s, LeaseState::Held { .. });
                if held {
                    // Past its deadline it was lost, not released, even if
                    // nobody looked in time (a stalled process): the lost
                    // signal still fires.
                    *s = match s.at(Instant::now()) {
                        LeaseState::Held { .. } => LeaseState::Released,
                        lost => lost,
                    };
                }
                held
            });
            // No wake-up: an entry gone never makes the task's next look
            // sooner, and the task sleeps holding only a weak handle.
        }
    }

    /// Stops tracking every lease at once, firing each guard's lost signal
    /// (`Closed`) before the caller releases the locks in the store, wakes
    /// the acquires still waiting, and lets the task exit; returns what was
    /// tracked, for the caller to release. Leases registered later are
    /// watched as before: the caller refuses new acquires first.
    pub(crate) fn close(&self) -> Vec<RenewRequest> {
        let mut st = self.lock();
        st.closed = true;
        self.closed.store(true, Ordering::Release);
        let held: Vec<RenewRequest> = st
            .entries
            .drain()
            .map(|(_, e)| {
                e.tx.send_if_modified(|s| {
                    let held = matches!(s, LeaseState::Held { .. });
                    if held {
                        *s = LeaseState::Lost(LostReason::Closed);
                        e.meter.lost(LostReason::Closed);
                    }
                    held
                });
                e.request
            })
            .collect();
        drop(st);
        self.closing.notify_waiters();
        self.wake.notify_one();
        held
    }

    /// Completes once [`close`](Self::close) ran (at once if it has).
    pub(crate) async fn closed(&self) {
        let notified = self.closing.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.is_closed() {
            return;
        }
        notified.await;
    }

    /// True once [`close`](Self::close) ran.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Records the outcome of a renewal made outside the watchdog.
    pub(crate) fn renewed(&self, id: u64, sent: Instant, outcome: Renew) {
        let mut st = self.lock();
        let calls = Self::apply(&mut st, id, sent, Ok(outcome));
        drop(st);
        call(calls);
        self.wake.notify_one();
    }

    /// Applies a renewal's outcome; returns the failure hooks to call
    /// once the lock is let go (user code must not run under it).
    fn apply(st: &mut State, id: u64, sent: Instant, outcome: Result<Renew>) -> Calls {
        let e = st.entries.get_mut(&id)?;
        let labels = e.meter.labels();
        match &outcome {
            Ok(Renew::Renewed) => labels.renewal("renewed"),
            Ok(Renew::NotHeld) => labels.renewal("not_held"),
            Err(err) => {
                labels.renewal("failed");
                labels.store_error(err.kind());
            }
        }
        match outcome {
            Ok(Renew::Renewed) if e.deadline <= Instant::now() => {
                // Too late: the guard has read as lost since its deadline
                // (`LeaseState::at`), and a lost lock stays lost.
                tracing::warn!(key = %e.request.key, "lock lost: renewed only after its deadline");
                e.tx.send_replace(LeaseState::Lost(LostReason::Expired));
                e.meter.lost(LostReason::Expired);
                st.entries.remove(&id);
                None
            }
            Ok(Renew::Renewed) => {
                e.failures = 0;
                e.failed_at = None;
                e.alarmed_in_flight = false;
                e.deadline = local_deadline(sent, e.trusted);
                e.confirmed = sent;
                e.window = e.renew_every.unwrap_or_default() / COALESCE_DIVISOR;
                if let Some(every) = e.renew_every {
                    e.next_renew = sent + every;
                }
                // The lease trusted, not the TTL asked for: on a session store the
                // session timeout bounds it, and may be far shorter.
                tracing::debug!(key = %e.request.key, lease = ?e.trusted,
                    requested_ttl = ?e.request.ttl, "lock renewed");
                e.tx.send_replace(LeaseState::Held {
                    deadline: e.deadline,
                });
                None
            }
            Ok(Renew::NotHeld) => {
                tracing::warn!(key = %e.request.key, "lock lost: the store says it is no longer held");
                e.tx.send_replace(LeaseState::Lost(LostReason::NotHeld));
                e.meter.lost(LostReason::NotHeld);
                st.entries.remove(&id);
                None
            }
            Err(err) => {
                // Keep trying until the deadline decides, but back off: an
                // eighth of the period, doubling, never more than half of
                // what is left (so a late recovery still lands in time) and
                // never less than MIN_RETRY, with jitter so that many
                // lockers do not retry in step.
                let now = Instant::now();
                let left = e.deadline.saturating_duration_since(now);
                let every = e.renew_every.unwrap_or(e.trusted / 3);
                let backoff = (every / 8).saturating_mul(1 << e.failures.min(16));
                let retry = if std::mem::take(&mut e.alarmed_in_flight) {
                    MIN_RETRY
                } else {
                    jitter(backoff.min(every).min(left / 2)).max(MIN_RETRY)
                };
                e.failures = e.failures.saturating_add(1);
                e.failed_at = Some(now);
                tracing::warn!(key = %e.request.key, error = %err.chain(),
                    retry_in = ?retry, "lock renewal failed; retrying");
                e.next_renew = now + retry;
                (!e.hooks.is_empty()).then(|| {
                    let failure = RenewalFailure {
                        key: e.request.key.clone(),
                        kind: err.kind(),
                        error: err.chain().to_string(),
                        failures: e.failures,
                        remaining: left,
                    };
                    (e.hooks.clone(), failure)
                })
            }
        }
    }

    /// After an alarm seen at `seen`: every lease the store last vouched
    /// for before then is renewed now, at most once per gap (returned as
    /// `Err(when)` while too soon after the `last` sweep). A lease whose
    /// renewals are failing is brought forward if its last failure came
    /// before the alarm (a store back after a restart raises the alarm as
    /// it reconnects, and may have forgotten the lease), and keeps its
    /// backoff otherwise; one in flight is being checked already.
    fn sweep(&self, seen: Instant, last: Option<Instant>) -> std::result::Result<(), Instant> {
        let now = Instant::now();
        let mut st = self.lock();
        let shortest = st
            .entries
            .values()
            .filter_map(|e| e.renew_every)
            .min()
            .unwrap_or_default();
        let gap = ALARM_GAP.max(shortest / 4);
        if let Some(at) = last.map(|l| l + gap).filter(|&at| at > now) {
            return Err(at);
        }
        let mut due = 0;
        for e in st.entries.values_mut() {
            if e.renew_every.is_none() || e.confirmed >= seen {
                continue;
            }
            if e.in_flight {
                e.alarmed_in_flight = true;
                continue;
            }
            if e.failed_at.is_some_and(|failed| failed >= seen) {
                // Failed after the alarm: its backoff stands.
                continue;
            }
            e.next_renew = now;
            due += 1;
        }
        if due > 0 {
            // Quiet: a full server can raise alarms for as long as it stays
            // full; a lock it did drop says so loudly, through its guard.
            tracing::debug!(
                leases = due,
                "the store may have dropped locks; renewing every lease now"
            );
        }
        Ok(())
    }

    async fn run(this: Weak<Self>, wake: Arc<Notify>) {
        let mut in_flight: FuturesUnordered<futures::future::BoxFuture<'static, Batch>> =
            FuturesUnordered::new();
        let mut alarm = this.upgrade().and_then(|w| w.backend.alarm());
        if let Some(a) = alarm.as_mut() {
            a.mark_unchanged();
        }
        // An alarm seen and not yet swept, and the last sweep.
        let mut alarmed_at: Option<Instant> = None;
        let mut swept_at: Option<Instant> = None;
        loop {
            let Some(strong) = this.upgrade() else { return };
            let mut sweep_at = None;
            if let Some(seen) = alarmed_at {
                match strong.sweep(seen, swept_at) {
                    Ok(()) => {
                        alarmed_at = None;
                        swept_at = Some(Instant::now());
                    }
                    Err(at) => sweep_at = Some(at),
                }
            }
            let now = Instant::now();
            let mut due = Vec::new();
            // How long the batch may stay in flight (see below).
            let mut limit = Duration::MAX;
            let mut next_wake: Option<Instant> = None;
            let idle;
            {
                let mut st = strong.lock();
                st.entries.retain(|_, e| {
                    if e.deadline <= now {
                        tracing::warn!(key = %e.request.key, "lock lost: not renewed before its deadline");
                        e.tx.send_replace(LeaseState::Lost(LostReason::Expired));
                        e.meter.lost(LostReason::Expired);
                        false
                    } else {
                        true
                    }
                });
                idle = st.entries.is_empty() && in_flight.is_empty();
                for (id, e) in st.entries.iter_mut() {
                    let mut wake_at = e.deadline;
                    if let (Some(_), false) = (e.renew_every, e.in_flight) {
                        // A failing lease is due only at its retry time:
                        // joining an early batch would undo the backoff.
                        let window = if e.failures == 0 {
                            e.window
                        } else {
                            Duration::ZERO
                        };
                        if e.next_renew <= now + window && due.len() < MAX_BATCH {
                            e.in_flight = true;
                            // Half the lease the hold lives on, not the TTL
                            // asked for: on a session store (etcd's lease,
                            // ZooKeeper's session) that may be far shorter.
                            limit = limit.min(e.trusted / 2);
                            due.push((*id, e.request.clone()));
                        } else {
                            wake_at = wake_at.min(e.next_renew);
                        }
                    }
                    next_wake = Some(next_wake.map_or(wake_at, |w| w.min(wake_at)));
                }
                // Decided with the entries in view: a register from now on
                // compares its lease with this.
                st.sleeping_until = if idle {
                    None
                } else if due.is_empty() {
                    Some(sleep_time(next_wake, sweep_at, now))
                } else {
                    Some(now)
                };
            }
            if idle {
                let mut st = strong.lock();
                if st.closed && st.entries.is_empty() {
                    st.running = false;
                    return;
                }
            }
            if idle {
                // Stay for the next lock (a task per lock would cost a spawn
                // and a thread hop each time), holding only the weak handle,
                // so a dropped Locker still lets go of its backend.
                drop(strong);
                if tokio::time::timeout(IDLE_EXIT, wake.notified())
                    .await
                    .is_err()
                {
                    let Some(strong) = this.upgrade() else { return };
                    let mut st = strong.lock();
                    if st.entries.is_empty() {
                        st.running = false;
                        return;
                    }
                }
                continue;
            }
            if !due.is_empty() {
                let backend = strong.backend.clone();
                let span = tracing::info_span!(
                    "lockwright.renew",
                    leases = due.len(),
                    store = strong
                        .lock()
                        .entries
                        .get(&due[0].0)
                        .map(|e| e.meter.labels().store()),
                    renewed = tracing::field::Empty
                );
                in_flight.push(Box::pin(tracing::Instrument::instrument(
                    async move {
                        let (ids, requests): (Vec<u64>, Vec<RenewRequest>) =
                            due.into_iter().unzip();
                        // A call stuck on a dead connection must not stall later renewals
                        // once the store is back: it ends within half the shortest
                        // lease of the batch, so its retries still land inside it.
                        let sent = Instant::now();
                        let results = match tokio::time::timeout(
                            limit,
                            backend.renew_many(&requests),
                        )
                        .await
                        {
                            Ok(results) => results,
                            Err(_) => requests
                                .iter()
                                .map(|_| Err(crate::Error::unavailable("renewal timed out")))
                                .collect(),
                        };
                        let renewed = results
                            .iter()
                            .filter(|r| matches!(r, Ok(Renew::Renewed)))
                            .count();
                        tracing::Span::current().record("renewed", renewed);
                        (ids, sent, results)
                    },
                    span,
                )));
                continue;
            }
            let sleep_until = sleep_time(next_wake, sweep_at, now);
            // Asleep on a weak handle only: a dropped Locker lets go of its
            // backend without waiting for this task to wake.
            drop(strong);
            tokio::select! {
                Some((ids, sent, results)) = in_flight.next(), if !in_flight.is_empty() => {
                    let Some(strong) = this.upgrade() else { return };
                    let mut st = strong.lock();
                    let mut results = results.into_iter();
                    let mut calls = Vec::new();
                    for id in ids {
                        if let Some(e) = st.entries.get_mut(&id) {
                            e.in_flight = false;
                        }
                        let outcome = results.next().unwrap_or_else(|| {
                            Err(crate::Error::backend("renew_many returned too few results"))
                        });
                        calls.push(Self::apply(&mut st, id, sent, outcome));
                    }
                    drop(st);
                    calls.into_iter().for_each(call);
                }
                _ = tokio::time::sleep_until(sleep_until.into()) => {}
                _ = wake.notified() => {}
                Some(()) = alarmed(&mut alarm) => {
                    alarmed_at = Some(Instant::now());
                }
            }
        }
    }
}

/// Calls each failure hook; a hook that panics is caught and logged, so
/// that it cannot stop the renewals of every other lock.
fn call(calls: Calls) {
    let Some((hooks, failure)) = calls else {
        return;
    };
    for hook in hooks {
        let run = std::panic::AssertUnwindSafe(|| hook(&failure));
        if std::panic::catch_unwind(run).is_err() {
            tracing::error!(key = %failure.key, "a renewal-failure callback panicked");
        }
    }
}

/// When the task looks next: the earliest lease or sweep due, or in an hour.
fn sleep_time(next_wake: Option<Instant>, sweep_at: Option<Instant>, now: Instant) -> Instant {
    next_wake
        .into_iter()
        .chain(sweep_at)
        .min()
        .unwrap_or(now + Duration::from_secs(3600))
}

/// A random duration between half of `d` and `d`.
fn jitter(d: Duration) -> Duration {
    let mut b = [0u8; 2];
    let r = getrandom::fill(&mut b).map_or(u16::MAX, |()| u16::from_le_bytes(b));
    d / 2 + (d / 2).mul_f64(f64::from(r) / f64::from(u16::MAX))
}

/// The next alarm from the backend; never, if it raises none (or is gone).
async fn alarmed(alarm: &mut Option<watch::Receiver<u64>>) -> Option<()> {
    if let Some(a) = alarm {
        if a.changed().await.is_ok() {
            return Some(());
        }
    }
    std::future::pending().await
}
