//! The acquire machinery under [`Locker`](crate::Locker): one entry point
//! ([`Acquirer::acquire`]) and its loop as named steps (subscribe, attempt,
//! what the outcome means, the pause, the wait for a notice, a handed
//! grant), over the cancel-safe [`Attempts`] and an [`Outage`] ridden out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::BackoffBuilder;
use tracing::Instrument;

use crate::attempts::{Attempts, Ride};
use crate::backend::{
    Acquire, Capabilities, Grant, LockBackend, Notice, Watch, IN_LINE_POLL, MARK_LIFE,
};
use crate::background::Background;
use crate::error::{Error, ErrorKind, Result};
use crate::guard::LockGuard;
use crate::identity::{draw_tag, is_record_name, record_name, HolderInfo};
use crate::key::{Claim, LockKey, OwnerToken};
use crate::lease::{local_deadline, Lease};
use crate::meter::{self, AcquireMeter, HoldMeter, Labels, Outcome};
use crate::options::{LockOptions, WaitPolicy};
use crate::outage::Outage;
use crate::request::LockRequest;
use crate::watchdog::Watchdog;

/// What a [`Locker`](crate::Locker) with identity keeps: its tag, what
/// its record says, and the record's guard while it holds it.
#[derive(Debug)]
pub(crate) struct Identity {
    /// The tag in its holds' owners.
    pub(crate) tag: String,
    /// What it says.
    pub(crate) info: HolderInfo,
    /// The record's state, its guard among it.
    pub(crate) record: tokio::sync::Mutex<Record>,
}

/// The state of a locker's identity record.
#[derive(Debug, Default)]
pub(crate) struct Record {
    /// The record's hold, kept renewed; `None` before the first hold.
    pub(crate) guard: Option<LockGuard>,
    /// The store cannot keep a record (no values, or it refused the
    /// record's options), or the locker is closed: not asked again.
    pub(crate) gave_up: bool,
    /// After a failed attempt: not before then.
    pub(crate) retry_at: Option<Instant>,
}

impl Identity {
    /// A new identity saying `info`, with a fresh tag.
    pub(crate) fn new(info: HolderInfo) -> Arc<Self> {
        Arc::new(Identity {
            tag: draw_tag(),
            info,
            record: tokio::sync::Mutex::new(Record::default()),
        })
    }
}

/// The lease of a locker's identity record: renewed every 20 s, it
/// outlives its locker by at most a minute.
const RECORD_TTL: Duration = Duration::from_secs(60);

/// How long after a failed attempt at the identity record the next
/// acquire tries again.
const RECORD_RETRY: Duration = Duration::from_secs(10);

/// The identity record's upkeep, boxed: it runs an acquire inside an acquire.
type BoxedRecord = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The shortest sleep between polling attempts.
const MIN_POLL: Duration = Duration::from_millis(1);

/// How long after a holder's lease is due a polling waiter looks: the
/// store's clock and ours tick apart by about this much.
const DUE_MARGIN: Duration = Duration::from_millis(2);

/// The jittered, growing pause between polling attempts.
type PollBackoff = <backon::ExponentialBuilder as BackoffBuilder>::Backoff;

/// The parts of a [`Locker`](crate::Locker) an acquire uses; the locker
/// holds one beside its default options, and its clones share them.
#[derive(Clone, Debug)]
pub(crate) struct Acquirer {
    /// The store.
    pub(crate) backend: Arc<dyn LockBackend>,
    /// What the store promises.
    pub(crate) caps: Capabilities,
    /// Renews every held lease; closed by `Locker::close`.
    pub(crate) watchdog: Arc<Watchdog>,
    /// The clean-ups that outlive their caller.
    pub(crate) background: Background,
    /// The `store` label of this locker's metrics.
    pub(crate) store: &'static str,
    /// Metrics carry each lock's name too.
    pub(crate) name_label: bool,
    /// Who this locker's holders are, when it records it.
    pub(crate) identity: Option<Arc<Identity>>,
}

impl Acquirer {
    /// The parts of a new locker over `backend`, with metrics labelled
    /// `unknown` and without lock names.
    pub(crate) fn new(backend: Arc<dyn LockBackend>) -> Self {
        Acquirer {
            caps: backend.capabilities(),
            watchdog: Watchdog::new(backend.clone()),
            backend,
            background: Background::default(),
            store: "unknown",
            name_label: false,
            identity: None,
        }
    }

    /// A token for a new owner: tagged with this locker's identity
    /// record, when it keeps one.
    pub(crate) fn draw_owner(&self) -> OwnerToken {
        match &self.identity {
            Some(who) => OwnerToken::generate_tagged(&who.tag),
            None => OwnerToken::generate(),
        }
    }

    /// For [`Locker::close`](crate::Locker::close): the identity record's
    /// guard, taken out so that close gives it back itself (a lost one
    /// too, which dropped later would be released after close returned),
    /// and the record never taken again. `None` when there is none, or
    /// while an acquire takes it (closing makes that acquire fail).
    pub(crate) fn take_record(&self) -> Option<LockGuard> {
        let mut record = self.identity.as_ref()?.record.try_lock().ok()?;
        record.gave_up = true;
        record.guard.take()
    }

    /// For a locker that records identity: tags an owner drawn for this
    /// acquire alone (a caller's own owner, `lock_as`, is left as it is),
    /// and returns the upkeep of the identity record to await first.
    fn ready_identity(&self, request: &mut LockRequest) -> Option<BoxedRecord> {
        let who = self.identity.as_ref()?;
        if is_record_name(request.hold.key.as_str()) {
            return None;
        }
        if request.fresh_owner && request.hold.owner.tag().is_none() {
            request.hold.owner = OwnerToken::generate_tagged(&who.tag);
        }
        Some(self.keep_record(who.clone()))
    }

    /// Makes sure this locker's identity record is held, before a hold
    /// that names it is taken: taken at the first hold, and again after
    /// it was lost. Best effort, and never in an acquire's way for long:
    /// an acquire that finds another taking it goes on without waiting; a
    /// store that cannot keep it (no values) is not asked; after a failed
    /// attempt the next waits [`RECORD_RETRY`]. An error leaves the hold
    /// without an identity, never fails it.
    fn keep_record(&self, who: Arc<Identity>) -> BoxedRecord {
        let this = self.clone();
        Box::pin(async move {
            let Ok(mut record) = who.record.try_lock() else {
                return;
            };
            if !this.caps.values {
                // Nowhere to keep what it says (SQL's session locks): a
                // record without a value would only hold a connection.
                record.gave_up = true;
            }
            let held = record.guard.as_ref().is_some_and(|g| !g.is_lost());
            let resting = record.retry_at.is_some_and(|t| Instant::now() < t);
            if record.gave_up || held || resting {
                return;
            }
            record.guard = None;
            let Some(name) = record_name(&who.tag) else {
                record.gave_up = true;
                return;
            };
            let request = LockRequest::new(name, None).with_value(who.info.to_record());
            // Its own TTL, not the locker's: a record outlives no holder by
            // more than this, and costs a renewal a third of it.
            let opts = LockOptions::new().no_wait().ttl(RECORD_TTL);
            match this.acquire(request, &opts).await {
                Ok(Some(guard)) => {
                    record.guard = Some(guard);
                    record.retry_at = None;
                }
                // Still held by this locker's record lost here (a pause):
                // free again within its TTL.
                Ok(None) => record.retry_at = Some(Instant::now() + RECORD_RETRY),
                Err(e) => {
                    record.retry_at = Some(Instant::now() + RECORD_RETRY);
                    record.gave_up = matches!(
                        e.kind(),
                        ErrorKind::Unsupported | ErrorKind::InvalidOptions | ErrorKind::Closed
                    );
                    tracing::debug!(error = %e, "the holder identity record was not written");
                }
            }
        })
    }

    /// The one acquire, waiting as `opts` say: `Ok(None)` only when the
    /// policy is `NoWait` (or its wait ran out) and the lock stayed held by
    /// someone else. Runs in a `lockwright.acquire` span, with its metrics.
    pub(crate) async fn acquire(
        &self,
        mut request: LockRequest,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        if let Some(keep) = self.ready_identity(&mut request) {
            keep.await;
        }
        let labels = Labels::new(
            self.store,
            meter::primitive(&request.hold.kind, request.campaign),
            &request.hold.key,
            // An identity record's name is random: never a series of its own.
            self.name_label && !is_record_name(request.hold.key.as_str()),
        );
        let span = tracing::info_span!(
            "lockwright.acquire",
            name = %request.hold.key,
            store = self.store,
            primitive = labels.primitive(),
            owner = request.hold.owner.short(),
            wait = %opts.wait,
            outcome = tracing::field::Empty,
            fence = tracing::field::Empty,
            waited_seconds = tracing::field::Empty,
        );
        let meter = AcquireMeter::start(labels);
        let (result, handed) = self
            .acquire_loop(request, opts, meter.labels())
            .instrument(span.clone())
            .await;
        let outcome = match &result {
            Ok(Some(_)) => Outcome::Acquired,
            Ok(None) if opts.wait == WaitPolicy::NoWait => Outcome::Busy,
            Ok(None) => Outcome::TimedOut,
            Err(e) if e.kind() == ErrorKind::Unavailable => Outcome::Unavailable,
            Err(_) => Outcome::Failed,
        };
        let waited = span.in_scope(|| meter.finish(outcome, handed));
        span.record("outcome", outcome.as_str());
        span.record("waited_seconds", waited);
        if let Ok(Some(g)) = &result {
            if let Some(f) = g.fence() {
                span.record("fence", f.0);
            }
        }
        result
    }

    /// The loop, from its checks to its end; with it, whether an attempt
    /// found the lock held, so that a grant after it counts as a hand-off.
    async fn acquire_loop(
        &self,
        request: LockRequest,
        opts: &LockOptions,
        labels: &Labels,
    ) -> (Result<Option<LockGuard>>, bool) {
        let mut acquiring = match Acquiring::begin(self, request, opts, labels) {
            Ok(acquiring) => acquiring,
            Err(e) => return (Err(e), false),
        };
        let result = acquiring.run().await;
        (result, acquiring.handed)
    }

    /// Refuses an acquire on a closed locker.
    fn refuse_if_closed(&self) -> Result<()> {
        if self.watchdog.is_closed() {
            return Err(closed());
        }
        Ok(())
    }

    /// A guard made while [`close`](crate::Locker::close) ran is released at once.
    async fn unless_closed(&self, guard: LockGuard) -> Result<LockGuard> {
        if self.watchdog.is_closed() {
            let _ = guard.release().await;
            return Err(closed());
        }
        Ok(guard)
    }

    /// The lock was handed to us while we waited. The grant was made after
    /// `queued_at`, so the lease runs at least until `queued_at` plus the
    /// granted lease. A lease with at least half of it left goes to the
    /// caller as it is; a short hand-off lease is then extended by the
    /// watchdog halfway through it, so a holder done within that time never
    /// pays the extra round trip. Otherwise `None`: the caller attempts
    /// again rather than hand out a lease about to run out, or one that may
    /// have lapsed already (renewing it instead would keep this grant's
    /// fence even where the store has since handed us the lock again, under
    /// a higher one).
    fn handed(
        &self,
        attempts: &Attempts,
        grant: Grant,
        opts: &LockOptions,
        queued_at: Instant,
        labels: &Labels,
    ) -> Option<LockGuard> {
        // A store that trusts a hold for less than the TTL (a session that
        // may expire sooner) hands over no more than that.
        let trusted = self.caps.trusted_lease(opts.ttl);
        let granted = grant.lease.map_or(trusted, |l| l.min(trusted));
        let left = local_deadline(queued_at, granted).saturating_duration_since(Instant::now());
        if left >= granted / 2 && (granted == trusted || opts.auto_renew) {
            let short = (granted < trusted).then_some(granted);
            return Some(self.guard(attempts, grant, opts, queued_at, short, labels));
        }
        None
    }

    /// A guard for a lease granted after `sent`. `short`: the store granted
    /// only this lease, and the watchdog extends it to the TTL halfway
    /// through it (or at the usual period, if that comes first).
    fn guard(
        &self,
        attempts: &Attempts,
        grant: Grant,
        opts: &LockOptions,
        sent: Instant,
        short: Option<Duration>,
        labels: &Labels,
    ) -> LockGuard {
        // A store may trust a hold for less than the TTL (a session that
        // expires sooner): deadlines and renewals keep within that.
        let trusted = self.caps.trusted_lease(opts.ttl);
        let granted = short.unwrap_or(trusted).min(trusted);
        let key = &attempts.hold.key;
        let lease = Lease {
            key: key.clone(),
            owner: attempts.hold.owner.clone(),
            kind: attempts.hold.kind.clone(),
            value: attempts.value.clone(),
            fence: grant.fence,
            holds: grant.holds,
            ttl: opts.ttl,
            deadline: local_deadline(sent, granted),
        };
        tracing::debug!(key = %key, fence = grant.fence.map(|f| f.0), holds = grant.holds,
            lease = ?granted, since_sent = ?sent.elapsed(), short_lease = short.is_some(), "lock acquired");
        let renew_every = opts
            .auto_renew
            .then(|| opts.renew_period().min(trusted / 3));
        let period = renew_every.unwrap_or_default();
        let first_renew = sent + short.map_or(period, |lease| period.min(lease / 2));
        LockGuard::new(
            lease,
            trusted,
            self.backend.clone(),
            self.watchdog.clone(),
            self.background.clone(),
            renew_every,
            first_renew,
            HoldMeter::start(labels.clone()),
        )
        // From now, after the grant came back: lock at least for errs
        // towards holding longer, never shorter.
        .keep_until(opts.at_least.map(|least| Instant::now() + least))
    }
}

/// One acquire under way: what its loop keeps from one attempt to the next.
/// (Fields drop in this order: the subscription before the attempts, whose
/// drop hands their undoing to the background.)
struct Acquiring<'a> {
    /// The locker's parts.
    acquirer: &'a Acquirer,
    /// The key acquired.
    key: LockKey,
    /// Where the store keeps places in line, this claim's (a writer's or
    /// a reader's) is kept there while it waits: it looks again often.
    in_line: bool,
    /// The acquire's options.
    opts: &'a LockOptions,
    /// The acquire's metrics labels.
    labels: &'a Labels,
    /// When the wait runs out; `None`: never.
    give_up: Option<Instant>,
    /// The subscription to the key's notices, where the store has one.
    watch: Option<Watch>,
    /// A subscription was asked for by the current ticket.
    subscribed: bool,
    /// The store's unreachability, while the acquire rides it out.
    outage: Outage,
    /// When the first attempt that found the key held was sent (see
    /// [`contended`](Self::contended)).
    queued_at: Option<Instant>,
    /// The wait was logged (once per wait).
    said_waiting: bool,
    /// An attempt found the lock held: a grant after it is a hand-off.
    handed: bool,
    /// A refused attempt may leave a mark (see [`begin`](Self::begin)).
    may_mark: bool,
    /// The attempts, undone in the background if the acquire is dropped.
    attempts: Attempts,
    /// The pause between polling attempts.
    backoff: PollBackoff,
}

impl<'a> Acquiring<'a> {
    /// Checks that the acquire can be made (the locker open, the options
    /// and the claim fit the store) and sets up its wait.
    fn begin(
        acquirer: &'a Acquirer,
        request: LockRequest,
        opts: &'a LockOptions,
        labels: &'a Labels,
    ) -> Result<Self> {
        let key = request.hold.key.clone();
        let claim = request.hold.claim();
        let writer = request.hold.kind.is_writer();
        acquirer.refuse_if_closed()?;
        opts.validate(&acquirer.caps)?;
        supports(&acquirer.caps, claim)?;
        let start = Instant::now();
        let give_up = match opts.wait {
            WaitPolicy::NoWait => Some(start),
            WaitPolicy::For(d) => start.checked_add(d),
            WaitPolicy::Forever => None,
        };
        let max_poll = acquirer
            .caps
            .max_poll
            .map_or(opts.max_poll, |m| m.min(opts.max_poll));
        let backoff = backon::ExponentialBuilder::default()
            .with_min_delay(MIN_POLL)
            .with_max_delay(max_poll.max(MIN_POLL))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build();
        let mut attempts = Attempts::new(
            acquirer.backend.clone(),
            acquirer.background.clone(),
            request,
        );
        // A writer refused while readers hold leaves a mark that keeps new
        // readers out (no writer starvation), and where the store keeps
        // places in line a refused reader's keeps it ahead of later
        // writers; giving up takes it away.
        let caps = &acquirer.caps;
        let may_mark =
            caps.shared && (claim == Claim::MUTEX || (claim.is_shared() && caps.in_line));
        attempts.may_mark = may_mark;
        Ok(Acquiring {
            acquirer,
            key,
            in_line: caps.in_line && (writer || claim.is_shared()),
            opts,
            labels,
            give_up,
            watch: None,
            subscribed: false,
            outage: Outage::new(opts.wait != WaitPolicy::NoWait),
            queued_at: None,
            said_waiting: false,
            handed: false,
            may_mark,
            attempts,
            backoff,
        })
    }

    /// Attempts until the lock is had (`Some`), the wait runs out while
    /// someone else holds it (`None`), or the acquire fails.
    async fn run(&mut self) -> Result<Option<LockGuard>> {
        loop {
            if self.acquirer.watchdog.is_closed() {
                self.attempts.abandon().await;
                return Err(closed());
            }
            if !self.subscribed && self.acquirer.caps.fair && self.opts.wait != WaitPolicy::NoWait {
                // A fair store queues waiters, so a caller prepared to wait
                // listens first and queues with its very first attempt (and
                // again after an outage made a subscription fail).
                if !self.subscribe_or_ride().await? {
                    continue;
                }
            }
            let sent = Instant::now();
            let Some(attempt) = self.attempt_or_ride().await? else {
                continue;
            };
            let retry_after = match attempt {
                Acquire::Acquired(grant) => return self.granted(grant, sent).await.map(Some),
                Acquire::Contended { retry_after } => {
                    self.contended(sent);
                    retry_after
                }
            };

            let now = Instant::now();
            if self.give_up.is_some_and(|g| now >= g) {
                self.attempts.abandon().await;
                return Ok(None);
            }
            if !self.said_waiting {
                // Once per wait, fair stores (queued from the first attempt) included.
                tracing::debug!(key = %self.key, wait = %self.opts.wait, "lock held by another owner; waiting");
                self.said_waiting = true;
            }
            if !self.subscribed {
                if !self.subscribe_or_ride().await? {
                    continue;
                }
                if self.watch.is_some() {
                    // The holder may have released between our attempt and the
                    // subscription; look again before sleeping.
                    continue;
                }
            }
            let pause = self.next_pause(retry_after, now);
            let notice = self.sleep_or_notice(pause).await;
            if let (Some(Notice::Granted(grant)), Some(queued_at)) = (notice, self.queued_at) {
                if let Some(guard) = self.take_handed(grant, queued_at) {
                    return self.acquirer.unless_closed(guard).await.map(Some);
                }
                // Too little of it can be vouched for: attempt at once. A
                // grant still ours comes back with its live fence and a full
                // lease; a stale one, as contention.
                continue;
            }
        }
    }

    /// Subscribes to the key's notices (on a fair store, queueing). A
    /// failure is ridden out as an outage; `Ok(false)` then: the loop
    /// starts over.
    async fn subscribe_or_ride(&mut self) -> Result<bool> {
        self.subscribed = true;
        match self.attempts.subscribe().await {
            Ok(w) => {
                self.watch = w;
                Ok(true)
            }
            Err(e) => {
                self.ride(e).await?;
                self.subscribed = false;
                Ok(false)
            }
        }
    }

    /// A store error, counted, then ridden out as an outage (see
    /// [`Outage::ride`]) or returned when the wait cannot ride it.
    async fn ride(&mut self, e: Error) -> Result<Ride> {
        self.labels.store_error(e.kind());
        self.outage
            .ride(
                e,
                &self.key,
                self.give_up,
                &mut self.attempts,
                &self.acquirer.watchdog,
            )
            .await
    }

    /// One attempt, polled in place: the store's answer, or `None` after a
    /// failure ridden out as an outage (the loop starts over, under a fresh
    /// owner if the attempt may have been granted unseen).
    async fn attempt_or_ride(&mut self) -> Result<Option<Acquire>> {
        match self.attempts.attempt(self.opts.ttl).await {
            Ok(a) => {
                self.outage.over(&self.key);
                // The store answers again: undo the owners an outage retired.
                self.attempts.undo_retired();
                Ok(Some(a))
            }
            Err(e) => {
                let ride = self.ride(e).await?;
                if ride == Ride::Requeue {
                    // The old subscription and its grants were the
                    // retired owner's.
                    self.watch = None;
                    self.subscribed = false;
                    self.queued_at = None;
                }
                Ok(None)
            }
        }
    }

    /// The store granted the lock to an attempt sent at `sent`: its guard.
    async fn granted(&mut self, grant: Grant, sent: Instant) -> Result<LockGuard> {
        self.attempts.done();
        // A store may grant less than the lease it trusts (a
        // session store whose lease has that much left).
        let trusted = self.acquirer.caps.trusted_lease(self.opts.ttl);
        let short = grant.lease.filter(|l| *l < trusted);
        let sole = self.attempts.fresh_owner && grant.holds == 1;
        let guard = self
            .acquirer
            .guard(&self.attempts, grant, self.opts, sent, short, self.labels)
            .sole_owner(sole);
        if short.is_some() && !self.opts.auto_renew {
            // No watchdog will extend it: one renewal now gives
            // the caller the whole lease it asked for.
            guard.renew().await?;
        }
        self.acquirer.unless_closed(guard).await
    }

    /// An attempt sent at `sent` found the lock held by someone else.
    fn contended(&mut self, sent: Instant) {
        self.labels.contended();
        self.handed = true;
        // When the first attempt that found the key held was sent: any grant
        // delivered later was made after that. Not the latest such attempt: a
        // grant made before it can be delivered after it (a paused process,
        // a slow notification), and had it been live then, that attempt
        // would have been granted; it is stale, and must not be trusted from
        // a later start. `check`'s fault run found this on Redis.
        self.queued_at.get_or_insert(sent);
        self.attempts.marked |= self.may_mark;
    }

    /// How long to wait, from `now`, before the next attempt.
    fn next_pause(&mut self, retry_after: Option<Duration>, now: Instant) -> Duration {
        let caps = &self.acquirer.caps;
        // With store-wide notification the fallback wake is when the
        // holder's lease could run out (or a queued waiter must refresh
        // its place); a watch that only hears this process's releases is
        // a hint beside the backoff, not instead of it.
        // A polling waiter looks again no later than the holder's
        // lease is due to end, where the store says when that is to the
        // millisecond: a holder that died is taken over at its lease's
        // end, not up to a whole poll later. (A store that counts whole
        // seconds would have it poll through the last one.)
        let mut pause = if caps.notify && self.watch.is_some() {
            retry_after.unwrap_or(self.opts.max_poll).max(MIN_POLL)
        } else {
            let next = self.backoff.next().unwrap_or(self.opts.max_poll);
            match retry_after {
                Some(r) if caps.ttl_resolution <= DUE_MARGIN => {
                    next.min((r + DUE_MARGIN).max(MIN_POLL))
                }
                _ => next,
            }
        };
        if self.attempts.marked {
            // Renew the mark before it lapses and readers barge in; in
            // line, the name waits for this waiter's next look.
            pause = pause.min(if self.in_line {
                IN_LINE_POLL
            } else {
                MARK_LIFE / 4
            });
        }
        if let Some(g) = self.give_up {
            pause = pause.min(g.saturating_duration_since(now));
        }
        pause
    }

    /// Sleeps for `pause`, cut short by a notice of the key (returned) or
    /// by the locker's close.
    async fn sleep_or_notice(&mut self, pause: Duration) -> Option<Notice> {
        match &mut self.watch {
            Some(w) => {
                tokio::select! {
                    n = w.changed() => Some(n),
                    _ = tokio::time::sleep(pause) => None,
                    () = self.acquirer.watchdog.closed() => None,
                }
            }
            None => {
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    () = self.acquirer.watchdog.closed() => {}
                }
                None
            }
        }
    }

    /// The guard of a grant the store handed us while we waited, queued
    /// since `queued_at`; `None` if too little of its lease can be vouched
    /// for (see [`Acquirer::handed`]).
    fn take_handed(&mut self, grant: Grant, queued_at: Instant) -> Option<LockGuard> {
        let sole = self.attempts.fresh_owner && grant.holds == 1;
        let guard =
            self.acquirer
                .handed(&self.attempts, grant, self.opts, queued_at, self.labels)?;
        let guard = guard.sole_owner(sole);
        self.attempts.done();
        Some(guard)
    }
}

/// Refuses a claim the store cannot grant, before any request is sent.
pub(crate) fn supports(caps: &Capabilities, claim: Claim) -> Result<()> {
    if let Claim::Exclusive { permits } = claim {
        // The variant's field is public: its range is checked here too.
        Claim::permits(permits)?;
    }
    match claim {
        Claim::Exclusive { permits } if permits > 1 && !caps.permits => Err(Error::new(
            ErrorKind::Unsupported,
            "this store cannot grant a semaphore's permits (see the README's store table)",
        )),
        Claim::Shared if !caps.shared => Err(Error::new(
            ErrorKind::Unsupported,
            "this store cannot grant shared (read) holds (see the README's store table)",
        )),
        _ => Ok(()),
    }
}

/// The error of an acquire on a closed locker.
fn closed() -> Error {
    Error::new(
        ErrorKind::Closed,
        "this Locker was closed; it takes no new locks",
    )
}

/// The error for a lock still held by another owner when the attempt
/// ends: `Busy` for an attempt that was not to wait, `Timeout` for a wait
/// that ran out.
pub(crate) fn timeout_error(key: &LockKey, wait: WaitPolicy) -> Error {
    if wait == WaitPolicy::NoWait {
        return Error::new(
            ErrorKind::Busy,
            format!(
                "lock {:?} is held by another owner; not acquired (no wait)",
                key.as_str()
            ),
        );
    }
    Error::timeout(format!(
        "lock {:?} is held by another owner; not acquired (wait: {wait})",
        key.as_str()
    ))
}
