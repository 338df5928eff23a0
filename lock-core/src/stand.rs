//! Leaders that stand again: [`Election::stand`] campaigns, runs the
//! leader's work, and campaigns again after a loss or a resignation until
//! it is told to stop (Curator's `LeaderSelector` with `autoRequeue`);
//! [`Election::stand_by`] does it in the background and tells a
//! [`LeaderListener`] when this process starts and stops leading, for code
//! that is not async (Curator's `LeaderLatch` listener).

use std::future::Future;
use std::sync::{Arc, Mutex as SyncMutex};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};

use crate::guard::LostSignal;

use crate::election::{Election, Leadership};
use crate::error::{Error, ErrorKind, Result};
use crate::key::{FencingToken, LockKey};
use crate::lease::LostReason;
use crate::options::LockOptions;
use crate::scoped::{self, Hold};

/// The stop signal of a stand, which every part of it can wait on.
type Stop = Shared<BoxFuture<'static, ()>>;

/// The first pause before campaigning again after the store could not be
/// reached, and the longest.
const PAUSE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// A leadership held by a stand: lost, for the leader's work, when the
/// leadership is lost or the stand is told to stop.
struct Standing {
    leading: Leadership,
    stop: Stop,
}

impl Hold for Standing {
    type Target = Leadership;

    fn target(&mut self) -> &mut Leadership {
        &mut self.leading
    }

    fn when_lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let (lost, stop) = (self.leading.lost(), self.stop.clone());
        async move {
            tokio::select! {
                reason = lost => reason,
                // Stopping ends the reign as a close does.
                () = stop => LostReason::Closed,
            }
        }
    }

    fn name(&self) -> &LockKey {
        self.leading.guard().key()
    }

    fn give_back(self) -> impl Future<Output = Result<()>> + Send {
        self.leading.resign()
    }
}

impl Election {
    /// Stands for leadership until `stop` completes, with the `Locker`'s
    /// default options: campaigns, runs the future `lead` makes for each
    /// [`Reign`] while this caller leads,
    /// and when the reign ends campaigns again. A reign ends when `lead`
    /// returns (this caller resigns, awaited, and stands again once another
    /// candidate leads, or after a few of a waiting candidate's polls if
    /// none does) or when leadership is lost (a store restart, a
    /// broken lease, a paused process: `lead` is stopped at its next
    /// await). A store that cannot be reached is tried again with a
    /// growing pause, and so is one that answers what no rule explains
    /// (`Backend`). When `stop` completes, a campaign under way is given
    /// up and a reign is ended, its resignation awaited, before this
    /// returns `Ok(())`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockwright_core::Result<()> {
    /// use lockwright_core::{backend::MemoryBackend, Locker};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let election = locker.election("scheduler")?;
    /// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// let mut reigns = 0;
    /// let mut stop = Some(stop);
    /// election
    ///     .stand("node-a", async { let _ = stopped.await; }, |reign| {
    ///         reigns += 1;
    ///         if reigns == 2 {
    ///             let _ = stop.take().map(|s| s.send(()));
    ///         }
    ///         async move {
    ///             // ... lead, with reign.term() as the fence; returning resigns ...
    ///             let _ = reign.term();
    ///         }
    ///     })
    ///     .await?;
    /// assert_eq!(reigns, 2, "it stood again after its first reign");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// What a campaign answers that standing again cannot mend:
    /// `InvalidOptions` (a value too long, options the store cannot
    /// honour), `Closed` once the locker is closed, `Unsupported`.
    pub async fn stand<F>(
        &self,
        value: impl Into<Vec<u8>>,
        stop: impl Future<Output = ()> + Send + 'static,
        lead: impl FnMut(Reign) -> F,
    ) -> Result<()>
    where
        F: Future<Output = ()>,
    {
        let opts = self.locker().options().clone();
        self.stand_with(value, &opts, stop, lead).await
    }

    /// As [`stand`](Self::stand), campaigning with `opts`.
    ///
    /// # Errors
    /// As [`stand`](Self::stand).
    pub async fn stand_with<F>(
        &self,
        value: impl Into<Vec<u8>>,
        opts: &LockOptions,
        stop: impl Future<Output = ()> + Send + 'static,
        mut lead: impl FnMut(Reign) -> F,
    ) -> Result<()>
    where
        F: Future<Output = ()>,
    {
        let value = value.into();
        let stop: Stop = stop.boxed().shared();
        let mut pause = PAUSE.0;
        loop {
            let campaigned = tokio::time::Instant::now();
            let won = tokio::select! {
                biased;
                () = stop.clone() => return Ok(()),
                won = self.campaign_with(value.clone(), opts) => won,
            };
            let leading = match won {
                Ok(leading) => {
                    pause = PAUSE.0;
                    leading
                }
                Err(e) if matches!(e.kind(), ErrorKind::Busy | ErrorKind::Timeout) => {
                    // A campaign that waits little or not at all would
                    // otherwise spin: at least a poll's time between two.
                    let left = opts.max_poll.saturating_sub(campaigned.elapsed());
                    if !until(&stop, left).await {
                        return Ok(());
                    }
                    continue;
                }
                Err(e) if matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Backend) => {
                    tracing::warn!(name = %self.name(), error = %e.chain(), retry_in = ?pause,
                        "standing for leadership: the store cannot be reached");
                    if !until(&stop, pause).await {
                        return Ok(());
                    }
                    pause = (pause * 2).min(PAUSE.1);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let standing = Standing {
                leading,
                stop: stop.clone(),
            };
            let reign = scoped::run_under(standing, async |leading: &mut Leadership| {
                let reign = Reign {
                    term: leading.term(),
                    lost: leading.guard().lost_signal(),
                };
                lead(reign).await;
            })
            .await;
            if stop.peek().is_some() {
                return Ok(());
            }
            match reign {
                Ok(()) => {
                    tracing::debug!(name = %self.name(), "resigned; standing again");
                    if !self.successor_or(&stop, opts).await {
                        return Ok(());
                    }
                }
                Err(e) => {
                    tracing::info!(name = %self.name(), error = %e.chain(),
                        "leadership ended; standing again");
                    // A reign lost at once (a store that takes grants back)
                    // must not make a loop at round-trip speed.
                    let left = opts.max_poll.saturating_sub(campaigned.elapsed());
                    if !until(&stop, left).await {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Stands for leadership in the background, as [`stand_with`](Self::stand_with)
    /// does, and tells `listener` each time this process starts and stops
    /// leading: for code that is not async. The leader's work is the
    /// listener's to start in `is_leader` and to stop in `not_leader`
    /// (called at once when leadership is lost, before anyone else can
    /// lead). The stand lasts until [`Stand::stop`], or until the
    /// [`Stand`] is dropped (then the resignation is not awaited).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockwright_core::Result<()> {
    /// use lockwright_core::{backend::MemoryBackend, FencingToken, LeaderListener, LockOptions, Locker};
    /// use std::sync::{atomic::{AtomicBool, Ordering}, Arc};
    ///
    /// struct Flag(Arc<AtomicBool>);
    /// impl LeaderListener for Flag {
    ///     fn is_leader(&mut self, _term: Option<FencingToken>) { self.0.store(true, Ordering::SeqCst) }
    ///     fn not_leader(&mut self) { self.0.store(false, Ordering::SeqCst) }
    /// }
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let leading = Arc::new(AtomicBool::new(false));
    /// let stand = locker
    ///     .election("scheduler")?
    ///     .stand_by("node-a", &LockOptions::new(), Flag(leading.clone()))?;
    /// while !leading.load(Ordering::SeqCst) {
    ///     tokio::task::yield_now().await;
    /// }
    /// stand.stop().await?; // resigned, and told not_leader
    /// assert!(!leading.load(Ordering::SeqCst));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// `Unsupported` outside a Tokio runtime (the stand runs as a task).
    pub fn stand_by(
        &self,
        value: impl Into<Vec<u8>>,
        opts: &LockOptions,
        listener: impl LeaderListener,
    ) -> Result<Stand> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::new(
                ErrorKind::Unsupported,
                "stand_by runs the stand as a task: call it inside a Tokio runtime",
            )
        })?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (election, value, opts) = (self.clone(), value.into(), opts.clone());
        let listener = Arc::new(SyncMutex::new(listener));
        let task = runtime.spawn(async move {
            let stopped = async move {
                let _ = stopped.await;
            };
            let reign = move |reign: Reign| {
                tell(&listener, |l| l.is_leader(reign.term()));
                // Told not_leader when the reign ends and this is dropped.
                let told = NotLeader(listener.clone());
                async move {
                    let _told = told;
                    std::future::pending::<()>().await;
                }
            };
            election.stand_with(value, &opts, stopped, reign).await
        });
        Ok(Stand {
            stop: Some(stop),
            task: Some(task),
        })
    }
}

/// One reign of a stand, as the leader's work is given it: owned, so
/// that the work's future can be sent to another task.
#[derive(Debug, Clone)]
pub struct Reign {
    term: Option<FencingToken>,
    lost: LostSignal,
}

impl Reign {
    /// The term: the fence of this reign's grant, where the store has them.
    pub fn term(&self) -> Option<FencingToken> {
        self.term
    }

    /// The reign's loss, to check between steps that do not await (the
    /// work is stopped at its next await anyway).
    pub fn lost_signal(&self) -> &LostSignal {
        &self.lost
    }
}

impl Election {
    /// After a resignation: waits until someone else leads, at most a few
    /// polls of a waiting candidate (`opts.max_poll`, and at least 1 s),
    /// so that on a store whose waiters poll (SQL, memcached) the one who
    /// resigned does not take the lead straight back. `false` if stopped.
    async fn successor_or(&self, stop: &Stop, opts: &LockOptions) -> bool {
        let give_up = tokio::time::Instant::now() + (opts.max_poll * 4).max(Duration::from_secs(1));
        loop {
            if matches!(self.leader().await, Ok(Some(_))) {
                return true;
            }
            if tokio::time::Instant::now() >= give_up {
                return true;
            }
            if !until(stop, Duration::from_millis(20)).await {
                return false;
            }
        }
    }
}

/// Waits `pause`, or until `stop`: `false` if stopped.
async fn until(stop: &Stop, pause: Duration) -> bool {
    tokio::select! {
        () = stop.clone() => false,
        () = tokio::time::sleep(pause) => true,
    }
}

/// What a stand in the background ([`Election::stand_by`]) tells, from
/// its task: keep both short and non-blocking (start or stop the work
/// elsewhere). A panic in them is caught and logged.
pub trait LeaderListener: Send + 'static {
    /// This process leads now, in `term` (the fence, where the store has
    /// them).
    fn is_leader(&mut self, term: Option<FencingToken>);
    /// This process no longer leads: its leadership was lost, or the stand
    /// stopped. Stop acting as the leader.
    fn not_leader(&mut self);
}

/// Calls `f` on the listener, catching a panic.
fn tell<L: LeaderListener>(listener: &SyncMutex<L>, f: impl FnOnce(&mut L)) {
    let mut l = listener.lock().unwrap_or_else(|e| e.into_inner());
    let call = std::panic::AssertUnwindSafe(|| f(&mut l));
    if std::panic::catch_unwind(call).is_err() {
        tracing::error!("a leader listener panicked");
    }
}

/// Tells the listener `not_leader` when the reign's work is dropped.
struct NotLeader<L: LeaderListener>(Arc<SyncMutex<L>>);

impl<L: LeaderListener> Drop for NotLeader<L> {
    fn drop(&mut self) {
        tell(&self.0, |l| l.not_leader());
    }
}

/// A stand running in the background, from [`Election::stand_by`].
/// Dropping it stops the stand too, without waiting for the resignation.
#[derive(Debug)]
#[must_use = "dropping a Stand stops standing at once"]
pub struct Stand {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<()>>>,
}

impl Stand {
    /// Stops standing: a campaign under way is given up, a reign ends
    /// (the listener is told `not_leader`) and its resignation is awaited.
    ///
    /// # Errors
    /// What ended the stand before it was stopped (as
    /// [`Election::stand`]); `Backend` if its task panicked.
    pub async fn stop(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await.unwrap_or_else(|e| {
                Err(Error::new(
                    ErrorKind::Backend,
                    format!("the stand's task ended abnormally: {e}"),
                ))
            }),
            None => Ok(()),
        }
    }

    /// Whether the stand has ended (stopped, or ended by an error).
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(|t| t.is_finished())
    }
}

impl Drop for Stand {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use super::LeaderListener;
    use crate::backend::{LockBackend, MemoryBackend};
    use crate::{FencingToken, LockKey, LockOptions, Locker};

    struct Heard(Arc<Mutex<Vec<&'static str>>>);

    impl LeaderListener for Heard {
        fn is_leader(&mut self, _: Option<FencingToken>) {
            self.0.lock().unwrap().push("leads");
        }
        fn not_leader(&mut self) {
            self.0.lock().unwrap().push("not");
        }
    }

    /// A listener hears each reign begin and end: a broken lease ends
    /// one, the stand leads again, and stopping ends the last.
    #[tokio::test]
    async fn a_listener_hears_each_reign_begin_and_end() {
        let store = Arc::new(MemoryBackend::new());
        let backend: Arc<dyn LockBackend> = store.clone();
        let locker = Locker::from_arc(backend);
        let heard = Arc::new(Mutex::new(Vec::new()));
        let opts = LockOptions::new().ttl(Duration::from_millis(600));
        let stand = locker
            .election("e")
            .unwrap()
            .stand_by("a", &opts, Heard(heard.clone()))
            .unwrap();
        let until = async |n: usize| {
            let start = Instant::now();
            while heard.lock().unwrap().len() < n {
                assert!(start.elapsed() < Duration::from_secs(10), "{heard:?}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        until(1).await;
        let status = locker.status("e").await.unwrap();
        let id = status.each_holder()[0].id.clone().unwrap();
        let key = LockKey::new("e").unwrap();
        assert!(store.force_release(&key, &id).await.unwrap());
        until(3).await;
        stand.stop().await.unwrap();
        assert_eq!(*heard.lock().unwrap(), ["leads", "not", "leads", "not"]);
    }
}
