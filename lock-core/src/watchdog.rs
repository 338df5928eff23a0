//! One renewal task per `Locker`: renews every held lease in batches and
//! fires the lost signal when a lease cannot be kept.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{watch, Notify};

use crate::backend::{LockBackend, Renew, RenewRequest};
use crate::error::{Error, ErrorKind, Result};
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

/// A renewal-failure callback, as the watchdog keeps it.
pub(crate) type FailureHook = Arc<dyn Fn(&RenewalFailure) + Send + Sync>;

/// A renewal that failed while the lock was still held: the watchdog keeps
/// trying until the lease's deadline, and the lock is lost only then (or
/// when the store says so). Passed to
/// [`on_renewal_failure`](crate::LockGuard::on_renewal_failure) callbacks.
#[derive(Debug, Clone)]
pub struct RenewalFailure {
    key: LockKey,
    kind: ErrorKind,
    error: String,
    failures: u32,
    remaining: Duration,
}

impl RenewalFailure {
    /// The lock whose renewal failed.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// What kind of error the store gave (usually `Unavailable`).
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The error, with its causes.
    pub fn error(&self) -> &str {
        &self.error
    }

    /// Renewals failed in a row, this one included.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// How long the lock is still guaranteed without a renewal.
    pub fn remaining(&self) -> Duration {
        self.remaining
    }
}

/// One lease the watchdog keeps.
struct Entry {
    /// What a renewal of it sends.
    request: RenewRequest,
    /// How long a confirmed renewal is trusted for: the TTL, or less where
    /// the store caps it (`Capabilities::max_lease`).
    trusted: Duration,
    /// How often it is renewed; `None`: only its deadline is watched.
    renew_every: Option<Duration>,
    /// When it is next renewed.
    next_renew: Instant,
    /// How early this renewal may join a batch: a quarter of the interval
    /// up to it (a short first interval after a hand-off has a short one).
    window: Duration,
    /// Until when the lock is guaranteed, as of the last confirmation.
    deadline: Instant,
    /// When the store last vouched for the lease: the send time of its last
    /// confirmed renewal, or its registration.
    confirmed: Instant,
    /// Its renewal is in a batch that has not come back.
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
    /// The guard's view of the lease.
    tx: watch::Sender<LeaseState>,
    /// The hold's metrics.
    meter: Arc<HoldMeter>,
    /// Called (outside the lock) with each failed renewal.
    hooks: Vec<FailureHook>,
}

/// Hooks to call, once the state's lock is let go, with what failed.
type Calls = Option<(Vec<FailureHook>, RenewalFailure)>;

/// What the watchdog keeps, behind its lock.
#[derive(Default)]
struct State {
    /// The leases kept, by id.
    entries: HashMap<u64, Entry>,
    /// The id of the next lease registered.
    next_id: u64,
    /// The renewal task is running.
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

/// Renews the leases of one `Locker` (and its clones) on one task.
pub(crate) struct Watchdog {
    /// The store renewed.
    backend: Arc<dyn LockBackend>,
    /// The leases kept.
    state: Mutex<State>,
    /// Wakes the task to look at the entries again.
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

/// A batch of renewals come back: the leases' ids, when it was sent, and
/// the outcomes, in the ids' order.
type Batch = (Vec<u64>, Instant, Vec<Result<Renew>>);

impl Watchdog {
    /// A watchdog over `backend`; its task starts with the first lease.
    pub(crate) fn new(backend: Arc<dyn LockBackend>) -> Arc<Self> {
        Arc::new(Watchdog {
            backend,
            state: Mutex::new(State::default()),
            wake: Arc::new(Notify::new()),
            closing: Notify::new(),
            closed: AtomicBool::new(false),
        })
    }

    /// The state, even if a panic poisoned its lock.
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the map half-updated
        // in a way that matters more than losing the watchdog entirely.
        crate::sync::lock_unpoisoned(&self.state)
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

    /// Whether a hold this watchdog tracks, other than `id`, has `owner`
    /// on `key`: a re-entrant hold (`lock_as` with another guard's owner)
    /// that a second release would count down, or a shortened lease cut.
    pub(crate) fn shares_beside(&self, id: u64, key: &LockKey, owner: &OwnerToken) -> bool {
        self.lock()
            .entries
            .iter()
            .any(|(i, e)| *i != id && e.request.hold.key == *key && e.request.hold.owner == *owner)
    }

    /// Stops tracking a lease; its state becomes `Released` unless it was lost.
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
                hold_event!(
                    e.request.hold.key,
                    "lock lost: renewed only after its deadline"
                );
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
                tracing::debug!(key = %e.request.hold.key, lease = ?e.trusted,
                    requested_ttl = ?e.request.ttl, "lock renewed");
                e.tx.send_replace(LeaseState::Held {
                    deadline: e.deadline,
                });
                None
            }
            Ok(Renew::NotHeld) => {
                hold_event!(
                    e.request.hold.key,
                    "lock lost: the store says it is no longer held"
                );
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
                hold_event!(e.request.hold.key, error = %err.chain(),
                    retry_in = ?retry, "lock renewal failed; retrying");
                e.next_renew = now + retry;
                (!e.hooks.is_empty()).then(|| {
                    let failure = RenewalFailure {
                        key: e.request.hold.key.clone(),
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

    /// The renewal task: looks at the entries, sends the renewals due in
    /// batches and applies them as they land, sweeps after the store's
    /// alarms, and sleeps until the next is due. Exits when the watchdog is
    /// gone, once it was closed and nothing is left, or after
    /// [`IDLE_EXIT`] with nothing to watch.
    async fn run(this: Weak<Self>, wake: Arc<Notify>) {
        let mut task = Task::new(&this);
        loop {
            let Some(strong) = this.upgrade() else { return };
            let sweep_at = task.sweep_if_alarmed(&strong);
            let now = Instant::now();
            let look = strong.look(now, sweep_at, task.in_flight.is_empty());
            if look.idle {
                if Self::stay_idle(strong, &this, &wake).await {
                    continue;
                }
                return;
            }
            if !look.due.is_empty() {
                task.send(&strong, look.due, look.limit);
                continue;
            }
            let sleep_until = sleep_time(look.next_wake, sweep_at, now);
            // Asleep on a weak handle only: a dropped Locker lets go of its
            // backend without waiting for this task to wake.
            drop(strong);
            tokio::select! {
                Some(batch) = task.in_flight.next(), if !task.in_flight.is_empty() => {
                    let Some(strong) = this.upgrade() else { return };
                    strong.landed(batch);
                }
                _ = tokio::time::sleep_until(sleep_until.into()) => {}
                _ = wake.notified() => {}
                Some(()) = alarmed(&mut task.alarm) => {
                    task.alarmed_at = Some(Instant::now());
                }
            }
        }
    }

    /// One look at the entries at `now`: those past their deadline are
    /// dropped (their lost signal fires), those due are marked in flight
    /// for one batch, and when to look next is decided. `nothing_in_flight`:
    /// no batch is out.
    fn look(&self, now: Instant, sweep_at: Option<Instant>, nothing_in_flight: bool) -> Look {
        let mut due = Vec::new();
        // How long the batch may stay in flight (see `renew_batch`).
        let mut limit = Duration::MAX;
        let mut next_wake: Option<Instant> = None;
        let mut st = self.lock();
        st.entries.retain(|_, e| {
            if e.deadline <= now {
                hold_event!(
                    e.request.hold.key,
                    "lock lost: not renewed before its deadline"
                );
                e.tx.send_replace(LeaseState::Lost(LostReason::Expired));
                e.meter.lost(LostReason::Expired);
                false
            } else {
                true
            }
        });
        let idle = st.entries.is_empty() && nothing_in_flight;
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
        Look {
            due,
            limit,
            next_wake,
            idle,
        }
    }

    /// Nothing to watch and nothing in flight: `false` (the task exits)
    /// once the watchdog was closed; else the task stays for the next lock,
    /// and exits if none comes within [`IDLE_EXIT`].
    async fn stay_idle(strong: Arc<Self>, this: &Weak<Self>, wake: &Notify) -> bool {
        {
            let mut st = strong.lock();
            if st.closed && st.entries.is_empty() {
                st.running = false;
                return false;
            }
        }
        // Stay for the next lock (a task per lock would cost a spawn
        // and a thread hop each time), holding only the weak handle,
        // so a dropped Locker still lets go of its backend.
        drop(strong);
        if tokio::time::timeout(IDLE_EXIT, wake.notified())
            .await
            .is_err()
        {
            let Some(strong) = this.upgrade() else {
                return false;
            };
            let mut st = strong.lock();
            if st.entries.is_empty() {
                st.running = false;
                return false;
            }
        }
        true
    }

    /// Applies the outcomes of a batch that came back, then calls the
    /// failure hooks, once the lock is let go.
    fn landed(&self, (ids, sent, results): Batch) {
        let mut st = self.lock();
        let mut results = results.into_iter();
        let mut calls = Vec::new();
        for id in ids {
            if let Some(e) = st.entries.get_mut(&id) {
                e.in_flight = false;
            }
            let outcome = results
                .next()
                .unwrap_or_else(|| Err(Error::backend("renew returned too few results")));
            calls.push(Self::apply(&mut st, id, sent, outcome));
        }
        drop(st);
        calls.into_iter().for_each(call);
    }
}

/// What one look at the entries decided.
struct Look {
    /// The leases to renew now, in one batch.
    due: Vec<(u64, RenewRequest)>,
    /// How long the batch may stay in flight: half the shortest lease in it.
    limit: Duration,
    /// The earliest deadline or renewal still to come.
    next_wake: Option<Instant>,
    /// Nothing to watch and nothing in flight.
    idle: bool,
}

/// The renewal task's own state, kept from one look to the next.
struct Task {
    /// The batches of renewals sent and not yet back.
    in_flight: FuturesUnordered<BoxFuture<'static, Batch>>,
    /// The store's alarm (see [`LockBackend::alarm`]), if it raises any.
    alarm: Option<watch::Receiver<u64>>,
    /// An alarm seen and not yet swept.
    alarmed_at: Option<Instant>,
    /// The last sweep.
    swept_at: Option<Instant>,
}

impl Task {
    /// Nothing in flight yet; alarms raised before now are not news.
    fn new(this: &Weak<Watchdog>) -> Self {
        let in_flight = FuturesUnordered::new();
        let mut alarm = this.upgrade().and_then(|w| w.backend.alarm());
        if let Some(a) = alarm.as_mut() {
            a.mark_unchanged();
        }
        Task {
            in_flight,
            alarm,
            alarmed_at: None,
            swept_at: None,
        }
    }

    /// Sweeps after an alarm seen and not yet swept (see
    /// [`Watchdog::sweep`]); returns when to sweep instead, if this is too
    /// soon after the last sweep.
    fn sweep_if_alarmed(&mut self, watchdog: &Watchdog) -> Option<Instant> {
        let seen = self.alarmed_at?;
        match watchdog.sweep(seen, self.swept_at) {
            Ok(()) => {
                self.alarmed_at = None;
                self.swept_at = Some(Instant::now());
                None
            }
            Err(at) => Some(at),
        }
    }

    /// Sends one batch of renewals, in flight for no longer than `limit`.
    fn send(&mut self, watchdog: &Watchdog, due: Vec<(u64, RenewRequest)>, limit: Duration) {
        let span = tracing::info_span!(
            "lockwright.renew",
            leases = due.len(),
            store = watchdog
                .lock()
                .entries
                .get(&due[0].0)
                .map(|e| e.meter.labels().store()),
            renewed = tracing::field::Empty
        );
        let batch = renew_batch(watchdog.backend.clone(), due, limit);
        self.in_flight
            .push(Box::pin(tracing::Instrument::instrument(batch, span)));
    }
}

/// Renews the leases `due` in one backend call, cut off after `limit`.
async fn renew_batch(
    backend: Arc<dyn LockBackend>,
    due: Vec<(u64, RenewRequest)>,
    limit: Duration,
) -> Batch {
    let (ids, requests): (Vec<u64>, Vec<RenewRequest>) = due.into_iter().unzip();
    // A call stuck on a dead connection must not stall later renewals
    // once the store is back: it ends within half the shortest
    // lease of the batch, so its retries still land inside it.
    let sent = Instant::now();
    let results = match tokio::time::timeout(limit, backend.renew(&requests)).await {
        Ok(results) => results,
        Err(_) => requests
            .iter()
            .map(|_| Err(Error::unavailable("renewal timed out")))
            .collect(),
    };
    let renewed = results
        .iter()
        .filter(|r| matches!(r, Ok(Renew::Renewed)))
        .count();
    tracing::Span::current().record("renewed", renewed);
    (ids, sent, results)
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
