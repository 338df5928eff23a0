//! The cancel-safe attempts of one acquire ([`Attempts`]): each polled in
//! place, and whatever an abandoned, failed or cut-off one may have left in
//! the store (a grant, a place in the wait queue, a writer's mark) undone
//! in the background.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use crate::backend::{Acquire, AcquireRequest, HoldId, LockBackend, Watch};
use crate::background::Background;
use crate::error::{Error, Result};
use crate::key::OwnerToken;
use crate::request::LockRequest;

/// How long leaving a wait queue keeps trying a store that is unreachable
/// for now: a stall or reconnect of a second or two must not leave the place
/// behind (the store would hand the lock to a waiter that gave up), yet a
/// store that is down for good must not keep a task alive.
const CLEANUP_PATIENCE: Duration = Duration::from_secs(3);

/// The attempts of one acquire, each polled in place. If the caller drops
/// the acquire, or it ends in an error, whatever it may have left in the
/// store is undone by a task: a request still in flight is awaited first
/// and, for a fresh owner, whatever it was granted is released (so the
/// release can never overtake the request it undoes); a request that failed
/// (a timeout, a dropped connection) may have been granted before its reply
/// was lost, so it is released the same way; then a queued ticket leaves the
/// queue, dropping any hold it was handed. (A re-entrant hold cannot be told
/// apart from the holds it joined, so it is left to expire.)
pub(crate) struct Attempts {
    /// The store the attempts go to.
    backend: Arc<dyn LockBackend>,
    /// Where the undoing runs once the acquire is gone.
    background: Background,
    /// The hold attempted: its key, its kind, and the owner the attempts
    /// are made as (redrawn after an outage).
    pub(crate) hold: HoldId,
    /// The value written with the grant (a candidate's).
    pub(crate) value: Option<Arc<[u8]>>,
    /// The owner was just drawn and holds nothing yet: whatever it may have
    /// been granted unseen is released when the acquire is abandoned.
    pub(crate) fresh_owner: bool,
    /// The ticket this acquire subscribes and queues with.
    ticket: OwnerToken,
    /// The ticket may be in the store's wait queue.
    queued: bool,
    /// A writer's (or reader's) refused attempt may have left a mark that
    /// keeps its place: giving up removes it ([`LockBackend::abandon`]).
    pub(crate) marked: bool,
    /// This acquire is a writer's or reader's on a store with readers: any
    /// refusal, one still in flight when the acquire is dropped included,
    /// may leave a mark.
    pub(crate) may_mark: bool,
    /// The attempt in flight, if any.
    request: Option<BoxFuture<'static, Result<Acquire>>>,
    /// An attempt failed without an answer: it may have been granted.
    pub(crate) uncertain: bool,
    /// Owners given up after an outage, still to undo.
    retired: Vec<Retired>,
}

/// An owner a waiting acquire gave up after an attempt of it failed unseen.
#[derive(Debug)]
struct Retired {
    /// The hold of the owner given up.
    hold: HoldId,
    /// The ticket it subscribed and queued with.
    ticket: OwnerToken,
    /// It may be queued, or have left a writer's mark.
    queue: bool,
}

impl Retired {
    /// Releases whatever it may hold and leaves its place.
    async fn undo(&self, backend: &dyn LockBackend) -> Result<()> {
        backend.release(&self.hold).await?;
        if self.queue {
            backend.abandon(&self.hold, &self.ticket).await?;
        }
        Ok(())
    }
}

/// How a waiting acquire goes on after an outage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ride {
    /// As before.
    Same,
    /// Under a fresh owner, queued afresh: the old subscription and any
    /// grant it delivers were the retired owner's.
    Requeue,
}

impl Attempts {
    /// The attempts of one acquire, as `request` asks.
    pub(crate) fn new(
        backend: Arc<dyn LockBackend>,
        background: Background,
        request: LockRequest,
    ) -> Self {
        // Tagged as the owner is: a ZooKeeper semaphore's waiter makes its
        // lease node in the ticket's name.
        let ticket = request.hold.owner.redrawn();
        Attempts {
            backend,
            background,
            hold: request.hold,
            value: request.value,
            fresh_owner: request.fresh_owner,
            ticket,
            queued: false,
            marked: false,
            may_mark: false,
            request: None,
            uncertain: false,
            retired: Vec::new(),
        }
    }

    /// Subscribes to the key's notices as this acquire's ticket (on a fair
    /// store, that queues it).
    pub(crate) async fn subscribe(&mut self) -> Result<Option<Watch>> {
        let watch = self.backend.watch(&self.hold.key, &self.ticket).await?;
        self.queued = watch.is_some();
        Ok(watch)
    }

    /// One cancel-safe attempt, queued once subscribed.
    pub(crate) fn attempt(&mut self, ttl: Duration) -> impl Future<Output = Result<Acquire>> + '_ {
        let backend = self.backend.clone();
        let request = AcquireRequest {
            hold: self.hold.clone(),
            ttl,
            value: self.value.clone(),
            ticket: self.queued.then(|| self.ticket.clone()),
        };
        self.request = Some(Box::pin(async move { backend.try_acquire(&request).await }));
        std::future::poll_fn(move |cx: &mut Context<'_>| {
            let Some(request) = self.request.as_mut() else {
                return Poll::Ready(Err(Error::backend("acquire polled after completion")));
            };
            let outcome = std::task::ready!(request.as_mut().poll(cx));
            self.request = None;
            // A refusal the store marked unapplied (another N, an upgrade)
            // changed nothing there: nothing to undo.
            self.uncertain |= outcome.as_ref().is_err_and(|e| !e.is_unapplied());
            Poll::Ready(outcome)
        })
    }

    /// Retires the owner whose last attempt may have been granted unseen
    /// (and its ticket, if it may be queued or have left a mark), and goes
    /// on under a fresh owner with the same claim. The retired ones are
    /// undone once the store answers again
    /// ([`undo_retired`](Self::undo_retired)), or in the background when
    /// the acquire ends.
    pub(crate) fn redraw_owner(&mut self) -> Ride {
        let queue = self.queued || self.marked || self.may_mark;
        let fresh = HoldId {
            owner: self.hold.owner.redrawn(),
            ..self.hold.clone()
        };
        let hold = std::mem::replace(&mut self.hold, fresh);
        let ticket = if queue {
            self.queued = false;
            self.marked = false;
            std::mem::replace(&mut self.ticket, self.hold.owner.redrawn())
        } else {
            self.ticket.clone()
        };
        self.retired.push(Retired {
            hold,
            ticket,
            queue,
        });
        if queue {
            Ride::Requeue
        } else {
            Ride::Same
        }
    }

    /// Hands the retired owners to a background task that undoes them
    /// (their holds released, their places left), trying again for a while
    /// if the store falters. Called once the store answers again, so the
    /// acquire goes on at once and a cancelled one cannot drop them, and
    /// when the acquire ends.
    pub(crate) fn undo_retired(&mut self) {
        let retired = std::mem::take(&mut self.retired);
        if retired.is_empty() {
            return;
        }
        let (backend, key) = (self.backend.clone(), self.hold.key.clone());
        self.background.spawn(async move {
            let undone = retired.iter().map(|r| retry_briefly(|| r.undo(&*backend)));
            for outcome in futures::future::join_all(undone).await {
                if let Err(e) = outcome {
                    tracing::warn!(key = %key, error = %e.chain(),
                        "could not undo an attempt cut off by an outage; if it was granted, the lock frees at its TTL");
                }
            }
        });
    }

    /// The lock is ours: nothing to undo.
    pub(crate) fn done(&mut self) {
        self.queued = false;
        self.marked = false;
        self.uncertain = false;
    }

    /// Leaves the queue now (the wait ran out).
    pub(crate) async fn abandon(&mut self) {
        let queued = std::mem::take(&mut self.queued);
        if std::mem::take(&mut self.marked) || queued {
            if let Err(e) = self.backend.abandon(&self.hold, &self.ticket).await {
                tracing::debug!(key = %self.hold.key, error = %e.chain(),
                    "could not leave the wait queue; the place lapses by itself");
            }
        }
    }
}

impl Drop for Attempts {
    fn drop(&mut self) {
        self.undo_retired();
        let request = self.request.take();
        let undo = self.fresh_owner && self.uncertain;
        if request.is_none() && !self.queued && !self.marked && !undo {
            return;
        }
        let (marked, may_mark) = (self.marked, self.may_mark);
        let (backend, hold, ticket) =
            (self.backend.clone(), self.hold.clone(), self.ticket.clone());
        let (fresh_owner, queued) = (self.fresh_owner, self.queued);
        self.background.spawn(async move {
            let (maybe_granted, refused) = match request {
                Some(request) => {
                    let refused = matches!(request.await, Ok(Acquire::Contended { .. }));
                    (!refused, refused)
                }
                None => (undo, false),
            };
            // One try: it follows the request it undoes on the same
            // connection, and a store that is simply down (the request never
            // left) must not hold up an exiting process.
            if fresh_owner && maybe_granted {
                if let Err(e) = backend.release(&hold).await {
                    tracing::warn!(key = %hold.key, error = %e.chain(),
                        "could not undo an abandoned acquire; the lock frees at its TTL");
                }
            }
            // A writer refused by readers, just now or before, left a mark.
            if queued || marked || (may_mark && refused) {
                let left = retry_briefly(|| backend.abandon(&hold, &ticket));
                if let Err(e) = left.await {
                    tracing::warn!(key = %hold.key, error = %e.chain(),
                        "could not leave the wait queue; the place lapses by itself");
                }
            }
        });
    }
}

/// Runs `op` until it succeeds, fails for a reason retrying will not fix,
/// or [`CLEANUP_PATIENCE`] has passed; 50 ms between tries, doubling.
async fn retry_briefly<F, Fut>(mut op: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let give_up = Instant::now() + CLEANUP_PATIENCE;
    let mut pause = Duration::from_millis(50);
    loop {
        match op().await {
            Err(e) if e.is_retryable() && Instant::now() + pause < give_up => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}
