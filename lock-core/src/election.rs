//! Leader election on any store that keeps a value with a lock: campaign,
//! proclaim, resign, and read or observe who leads.
//!
//! An election is a lock whose holder advertises a value. The leader is
//! whoever holds the election's key; its **term** is the grant's fencing
//! token, which a resource can check like any fence. So an election has
//! exactly the lock's guarantees (one holder with a valid lease, renewal,
//! the lost signal, release on drop) and a store needs only to keep the
//! value with the lock ([`Capabilities::values`](crate::backend::Capabilities::values))
//! to offer it.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use futures::Stream;
use tracing::Instrument;

use crate::backend::{Changes, Renew};
use crate::error::{Error, ErrorKind, Result};
use crate::guard::LockGuard;
use crate::key::{check_value, FencingToken, LockKey, OwnerToken};
use crate::lease::{LeaseState, LockStatus, LostReason};
use crate::locker::Locker;
use crate::options::{LockOptions, WaitPolicy};
use crate::request::LockRequest;
use crate::scoped;

/// How often [`Election::observe`] reads the leader when nothing sooner is
/// due. A reign whose lease runs out is read again when it does, so an
/// ended lease is reported within a round trip of its end, not a poll late.
///
/// Where the store announces changes ([`LockBackend::changes`](crate::backend::LockBackend::changes)),
/// the observer also reads on each notice, so a change shows within a
/// round trip of it, and this poll is only the bound on a notice that was
/// lost (a dropped connection). The in-memory store, Redis (single server
/// and Redlock: the scripts publish on a channel of the lock's) and
/// ZooKeeper (watches on the lock's directory and its leader's node)
/// announce them. Elsewhere (SQL, memcached, a generic
/// [`Quorum`](crate::backend::Quorum)) this poll is how changes are seen:
/// a change shows at most this late.
pub const OBSERVE_EVERY: Duration = Duration::from_millis(100);

/// How often, at the least, an observer of a store that announces changes
/// reads it and tries to subscribe again while it has no live subscription
/// (before the first one, and after one failed or ended, or a read
/// failed): its poll may be long only because notices come.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);

/// How many ended reigns an observer remembers, to refuse a late read of
/// one of them as a new reign.
const REMEMBERED_REIGNS: usize = 64;

/// One election: the leader is whoever holds the lock named `name`.
/// Made by [`Locker::election`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockwright_core::Result<()> {
/// use lockwright_core::{backend::MemoryBackend, Locker};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let election = locker.election("nightly-job")?;
/// let leadership = election.campaign("node-a").await?;
/// let leader = election.leader().await?.expect("someone leads");
/// assert_eq!(leader.value, b"node-a");
/// assert_eq!(leader.term, leadership.term());
/// leadership.resign().await?;
/// assert!(election.leader().await?.is_none());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Election {
    locker: Locker,
    key: LockKey,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election").field("name", &self.key).finish()
    }
}

/// Who leads an election, as the store says.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The value the leader advertises; empty when it advertises none (a
    /// plain lock holder on the same name).
    pub value: Vec<u8>,
    /// The leader's term: the fencing token of its grant, where the store
    /// gives them.
    pub term: Option<FencingToken>,
    /// How long its lease has left on the store's clock, where the store has
    /// leases (ZooKeeper's leader lasts as long as its session).
    pub lease_left: Option<Duration>,
}

impl Leader {
    /// The value as text, if it is UTF-8.
    pub fn value_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.value).ok()
    }
}

impl Election {
    pub(crate) fn new(locker: Locker, key: LockKey) -> Result<Self> {
        if !locker.capabilities().values {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "this store keeps no value with a lock, so it cannot hold an election",
            ));
        }
        Ok(Election { locker, key })
    }

    /// The election's name (the key of its lock).
    pub fn name(&self) -> &LockKey {
        &self.key
    }

    /// The locker it campaigns with.
    pub(crate) fn locker(&self) -> &Locker {
        &self.locker
    }

    /// Waits, as the `Locker`'s default options say, until this caller
    /// leads, advertising `value`. The returned [`Leadership`] renews
    /// itself and signals its loss like a lock guard; dropping it resigns
    /// in the background.
    ///
    /// A campaign whose future is dropped leaves nothing held, as with a lock.
    ///
    /// # Errors
    /// `InvalidOptions` for a value over
    /// [`MAX_VALUE_LEN`](crate::MAX_VALUE_LEN) bytes; `Busy` when someone
    /// else leads and the options say not to wait, `Timeout` when the wait
    /// runs out; otherwise as [`Locker::lock_with`].
    pub async fn campaign(&self, value: impl Into<Vec<u8>>) -> Result<Leadership> {
        let opts = self.locker.options().clone();
        self.campaign_with(value, &opts).await
    }

    /// One attempt to lead, with the default options' lease: `Ok(None)`
    /// if someone else leads.
    ///
    /// # Errors
    /// As [`campaign`](Self::campaign), without `Busy` and `Timeout`.
    pub async fn try_campaign(&self, value: impl Into<Vec<u8>>) -> Result<Option<Leadership>> {
        let opts = self.locker.options().clone().no_wait();
        self.try_campaign_with(value, &opts).await
    }

    /// As [`campaign`](Self::campaign), waiting as `opts` say.
    ///
    /// # Errors
    /// As [`campaign`](Self::campaign), for `opts`.
    pub async fn campaign_with(
        &self,
        value: impl Into<Vec<u8>>,
        opts: &LockOptions,
    ) -> Result<Leadership> {
        let value = value.into();
        self.try_campaign_with(value, opts).await?.ok_or_else(|| {
            let kind = match opts.wait {
                WaitPolicy::NoWait => ErrorKind::Busy,
                _ => ErrorKind::Timeout,
            };
            Error::new(kind, format!("{:?}: someone else still leads", self.key))
        })
    }

    /// As [`campaign_with`](Self::campaign_with), but `Ok(None)` if
    /// someone else still leads when the wait ends.
    ///
    /// # Errors
    /// As [`campaign`](Self::campaign), without `Busy` and `Timeout`.
    pub async fn try_campaign_with(
        &self,
        value: impl Into<Vec<u8>>,
        opts: &LockOptions,
    ) -> Result<Option<Leadership>> {
        let value = check_value(value.into())?;
        let owner = self.locker.draw_owner();
        let span = tracing::info_span!("lockwright.campaign", name = %self.key,
            store = self.locker.store_label(), owner = owner.short(),
            outcome = tracing::field::Empty, term = tracing::field::Empty);
        // A token just drawn that holds nothing: an attempt abandoned
        // mid-flight is undone, as for `Locker::lock_with`.
        let campaign = LockRequest::new(self.key.clone(), Some(owner.clone()))
            .fresh()
            .campaigning(value.clone());
        let won = self
            .locker
            .acquire(campaign, opts)
            .instrument(span.clone())
            .await;
        span.record(
            "outcome",
            match &won {
                Ok(Some(_)) => "leading",
                Ok(None) => "not_leading",
                Err(_) => "error",
            },
        );
        let Some(guard) = won? else {
            return Ok(None);
        };
        if let Some(term) = guard.fence() {
            span.record("term", term.0);
        }
        // No second write of the value: a store with values writes it with
        // every first grant, a hand-off from a fair queue included (the
        // contract; the conformance cases read it back after a hand-off).
        Ok(Some(Leadership { guard, value }))
    }

    /// Campaigns as [`campaign`](Self::campaign) does, runs `work` as the
    /// leader and resigns, awaited, before returning `work`'s output: the
    /// next candidate may lead the moment this returns. Leadership lost
    /// while the work runs stops the work (at its next await) and answers
    /// `Err(Lost)`; a panic resigns first, then goes on. The work gets the
    /// [`Leadership`] to read its term or [`proclaim`](Leadership::proclaim)
    /// a new value.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockwright_core::Result<()> {
    /// use lockwright_core::{backend::MemoryBackend, Locker};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let election = locker.election("scheduler")?;
    /// let term = election
    ///     .while_leading("node-a", async |leading| {
    ///         // ... schedule the jobs, with leading.term() as the fence ...
    ///         leading.term()
    ///     })
    ///     .await?;
    /// assert!(term.is_some());
    /// assert!(election.leader().await?.is_none(), "resigned on return");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`campaign`](Self::campaign) while campaigning; then as
    /// [`Locker::with_lock`](crate::Locker::with_lock).
    pub async fn while_leading<T>(
        &self,
        value: impl Into<Vec<u8>>,
        work: impl AsyncFnOnce(&mut Leadership) -> T,
    ) -> Result<T> {
        let opts = self.locker.options().clone();
        self.while_leading_with(value, &opts, work).await
    }

    /// As [`while_leading`](Self::while_leading), campaigning with `opts`.
    ///
    /// # Errors
    /// As [`campaign_with`](Self::campaign_with) while campaigning; then as
    /// [`Locker::with_lock`](crate::Locker::with_lock).
    pub async fn while_leading_with<T>(
        &self,
        value: impl Into<Vec<u8>>,
        opts: &LockOptions,
        work: impl AsyncFnOnce(&mut Leadership) -> T,
    ) -> Result<T> {
        let leading = self.campaign_with(value, opts).await?;
        scoped::run_under(leading, work).await
    }

    /// Who leads now, read from the store without changing anything; `None`
    /// when nobody holds a valid lease. A snapshot: act on a resource only
    /// as the leader, with its term as the fence.
    ///
    /// # Errors
    /// `Unavailable` when the store cannot be read: never reported as "nobody leads".
    pub async fn leader(&self) -> Result<Option<Leader>> {
        Ok(self.read().await?.1)
    }

    async fn read(&self) -> Result<(LockStatus, Option<Leader>)> {
        let status = self.locker.backend().inspect(&self.key).await?;
        let leader = status.held.then(|| Leader {
            value: status.value.clone().unwrap_or_default(),
            term: status.fence,
            lease_left: status.remaining,
        });
        Ok((status, leader))
    }

    /// A stream of leader changes, starting with who leads now: `Some` for
    /// each new leader or value, `None` when nobody leads. It reads the
    /// store every [`OBSERVE_EVERY`], when the store announces a change
    /// (where it does: see [`OBSERVE_EVERY`]), and when the current
    /// leader's lease runs out, so a reign ends in the stream at the end of
    /// its lease. It subscribes to the store's notices when it starts, and
    /// again after an error or a subscription that ended, reading at least
    /// every second meanwhile; the poll bounds how late a lost notice's
    /// change shows. Like any stream, it does all this only while polled. It never shows an older reign
    /// after a newer one. A store that cannot be read yields one `Err` per
    /// outage, then keeps trying; it never yields "nobody leads" for a
    /// store it could not read.
    pub fn observe(&self) -> impl Stream<Item = Result<Option<Leader>>> + Send + 'static {
        self.observe_every(OBSERVE_EVERY)
    }

    /// As [`observe`](Self::observe), polling every `every` (at least 1 ms).
    /// Where the store announces changes, a long poll costs nothing but the
    /// bound on a lost notice.
    pub fn observe_every(
        &self,
        every: Duration,
    ) -> impl Stream<Item = Result<Option<Leader>>> + Send + 'static {
        let observer = Observer {
            election: self.clone(),
            every: every.max(Duration::from_millis(1)),
            shown: None,
            ended: VecDeque::new(),
            last_term: None,
            failing: false,
            next_read: None,
            notices: Notices::Wanted,
        };
        futures::stream::unfold(observer, |mut o| async move {
            let item = o.next_change().await;
            Some((item, o))
        })
    }
}

/// Tells one reign from another: by the holder's owner token where the
/// store reports it, else by term, else by value.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reign {
    Owner(OwnerToken),
    Term(FencingToken),
    Value(Vec<u8>),
}

struct Observer {
    election: Election,
    every: Duration,
    /// The reign and value last yielded (`None` inside: nobody led).
    shown: Option<Option<(Reign, Vec<u8>)>>,
    ended: VecDeque<Reign>,
    last_term: Option<FencingToken>,
    failing: bool,
    next_read: Option<Instant>,
    notices: Notices,
}

/// Where an observer stands with the store's change notices.
enum Notices {
    /// To subscribe before the next read: at the start, and after a failed
    /// subscription, a failed read, or a subscription that ended.
    Wanted,
    /// Subscribing, in a task of its own: a slow store then holds up no
    /// read, and no lock a backend takes while subscribing stays held
    /// while this observer reads.
    Coming(Subscribing),
    /// Subscribed: a notice means "read now".
    Live(Changes),
    /// The store announces nothing: the poll alone.
    Unannounced,
}

/// A subscription on its way; dropped with the observer, it is abandoned.
struct Subscribing(tokio::task::JoinHandle<Result<Option<Changes>>>);

impl Drop for Subscribing {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Observer {
    async fn next_change(&mut self) -> Result<Option<Leader>> {
        loop {
            if let Some(at) = self.next_read.take() {
                self.wait(at).await;
            }
            if matches!(self.notices, Notices::Wanted) {
                let backend = self.election.locker.backend().clone();
                let key = self.election.key.clone();
                let task = tokio::spawn(async move { backend.changes(&key).await });
                self.notices = Notices::Coming(Subscribing(task));
            }
            let read_at = Instant::now();
            let read = self.election.read().await;
            let (status, leader) = match read {
                Ok(r) => r,
                Err(e) => {
                    // Its connection may be what failed: subscribe afresh.
                    if matches!(self.notices, Notices::Live(_)) {
                        self.notices = Notices::Wanted;
                    }
                    self.next_read = Some(read_at + self.poll());
                    if self.failing {
                        continue;
                    }
                    self.failing = true;
                    // What was shown stays shown: a reign that lasted
                    // through the outage is not a change, and is not
                    // shown twice (one line per change, `leader --watch`).
                    return Err(e);
                }
            };
            self.failing = false;
            let mut next = read_at + self.poll();
            if let Some(left) = leader.as_ref().and_then(|l| l.lease_left) {
                // Read again just after the lease would end unrenewed; not
                // sooner than 50 ms, so that a store counting a lease in
                // whole seconds (etcd), which says 0 for its last second,
                // is not read in a loop meanwhile.
                let left = left.max(Duration::from_millis(50));
                next = next.min(read_at + left + Duration::from_millis(1));
            }
            self.next_read = Some(next);
            let now = leader.as_ref().map(|l| {
                let reign = match (&status.owner, l.term) {
                    (Some(o), _) => Reign::Owner(o.clone()),
                    (None, Some(t)) => Reign::Term(t),
                    (None, None) => Reign::Value(l.value.clone()),
                };
                (reign, l.value.clone())
            });
            if let Some((reign, _)) = &now {
                let older =
                    matches!((l_term(&leader), self.last_term), (Some(t), Some(last)) if t < last);
                if older || self.ended.contains(reign) {
                    // A late read of a reign already superseded.
                    continue;
                }
            }
            if self.shown.as_ref() == Some(&now) {
                continue;
            }
            if let Some(Some((before, _))) = &self.shown {
                if now.as_ref().map(|(r, _)| r) != Some(before) {
                    self.ended.push_back(before.clone());
                    if self.ended.len() > REMEMBERED_REIGNS {
                        self.ended.pop_front();
                    }
                }
            }
            if let Some(t) = l_term(&leader) {
                self.last_term = Some(t);
            }
            self.shown = Some(now);
            return Ok(leader);
        }
    }

    /// How long until the next read when nothing sooner is due: the poll,
    /// long where the store's notices are relied on; without a live
    /// subscription, at most [`RESUBSCRIBE_AFTER`], so the store is read
    /// (and subscribed to again) sooner.
    fn poll(&self) -> Duration {
        match self.notices {
            Notices::Live(_) | Notices::Unannounced => self.every,
            Notices::Wanted | Notices::Coming(_) => self.every.min(RESUBSCRIBE_AFTER),
        }
    }

    /// Waits until `until`, or a notice, or a subscription that arrives:
    /// the store may have changed since the read before it was made.
    async fn wait(&mut self, until: Instant) {
        let sleep = tokio::time::sleep_until(until.into());
        tokio::pin!(sleep);
        loop {
            match &mut self.notices {
                Notices::Live(watch) => tokio::select! {
                    () = &mut sleep => return,
                    notice = watch.notice() => {
                        if notice.is_some() {
                            return;
                        }
                        // Ended (a lost connection), so notices may have
                        // been lost: read and subscribe again soon. Not at
                        // once: a store whose subscriptions keep ending
                        // must not make this a busy loop.
                        self.notices = Notices::Wanted;
                        let soon = Instant::now() + self.every.min(RESUBSCRIBE_AFTER);
                        if soon < until {
                            sleep.as_mut().reset(soon.into());
                        }
                    }
                },
                Notices::Coming(task) => tokio::select! {
                    () = &mut sleep => return,
                    done = &mut task.0 => match done {
                        Ok(Ok(Some(watch))) => {
                            self.notices = Notices::Live(watch);
                            return;
                        }
                        Ok(Ok(None)) => self.notices = Notices::Unannounced,
                        // Tried again before the next read; the poll
                        // meanwhile.
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e.chain(), "an election observer could not subscribe to changes");
                            self.notices = Notices::Wanted;
                        }
                        Err(_) => self.notices = Notices::Wanted,
                    },
                },
                Notices::Wanted | Notices::Unannounced => {
                    sleep.await;
                    return;
                }
            }
        }
    }
}

fn l_term(leader: &Option<Leader>) -> Option<FencingToken> {
    leader.as_ref().and_then(|l| l.term)
}

/// This caller leads: a lock guard on the election's key that advertises a
/// value. Renewed in the background while it lives; select on
/// [`lost`](Self::lost) to stop acting as leader the moment that is no
/// longer safe. Dropping it resigns in the background.
#[must_use = "dropping a Leadership resigns at once"]
pub struct Leadership {
    guard: LockGuard,
    value: Vec<u8>,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("name", self.guard.key())
            .field("term", &self.guard.fence())
            .field("value", &String::from_utf8_lossy(&self.value))
            .finish_non_exhaustive()
    }
}

impl Leadership {
    /// The term: the fencing token of this grant, where the store gives
    /// them. Pass it to the resources the leader acts on.
    pub fn term(&self) -> Option<FencingToken> {
        self.guard.fence()
    }

    /// The value this leader advertises.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// The lock guard underneath (key, lease, deadline).
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The lease's live state.
    pub fn state(&self) -> LeaseState {
        self.guard.state()
    }

    /// Whether leadership is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Resolves when leadership is lost (see [`LockGuard::lost`]).
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.guard.lost()
    }

    /// Changes the advertised value without giving up leadership. The store
    /// checks that this caller still leads in the same step as the write.
    ///
    /// # Errors
    /// `InvalidOptions` for a value over [`MAX_VALUE_LEN`](crate::MAX_VALUE_LEN)
    /// bytes; `Lost` when this caller no longer leads (nothing is
    /// written); `Unavailable` when the store cannot be reached.
    pub async fn proclaim(&mut self, value: impl Into<Vec<u8>>) -> Result<()> {
        let value = check_value(value.into())?;
        self.set(&value).await?;
        self.value = value;
        Ok(())
    }

    async fn set(&self, value: &[u8]) -> Result<()> {
        if self.guard.is_lost() {
            return Err(Error::lost(format!(
                "{:?}: leadership was lost; the value was not changed",
                self.guard.key()
            )));
        }
        let backend = self.guard.backend();
        match backend.proclaim(&self.guard.lease().hold(), value).await? {
            Renew::Renewed => Ok(()),
            Renew::NotHeld => Err(Error::lost(format!(
                "{:?}: this caller no longer leads; the value was not changed",
                self.guard.key()
            ))),
        }
    }

    /// Gives up leadership now; the next candidate is woken as by a lock's release.
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }
}

impl scoped::Hold for Leadership {
    type Target = Leadership;

    fn target(&mut self) -> &mut Leadership {
        self
    }

    fn when_lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.lost()
    }

    fn name(&self) -> &LockKey {
        self.guard.key()
    }

    fn give_back(self) -> impl Future<Output = Result<()>> + Send {
        self.resign()
    }
}
