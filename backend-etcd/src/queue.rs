//! Waiters in line, as Go's `Mutex.Lock` waits: a waiter keeps its key,
//! its place by create revision in the one line Go's and `etcdctl`'s
//! waiters stand in too, and watches only the delete of the key just
//! before its own (from the revision it read it at, so a delete in
//! between is not missed); each such delete wakes it to look again. A
//! waiter that gives up deletes its key.

use std::sync::{Arc, Weak};

use etcd_client::{EventType, GetOptions, KeyValue, SortOrder, SortTarget, WatchOptions};
use locksmith_core::backend::{Acquire, Watch};
use locksmith_core::{LockKey, OwnerToken, Result};
use tokio::sync::watch;

use crate::attempt::{delete_ours, first_created};
use crate::backend::Inner;
use crate::node::{lock, Session};

/// A subscribed waiter: its wake-ups, its key while it is in line, and
/// the task watching its predecessor.
pub(crate) struct Waiter {
    tx: Arc<watch::Sender<u64>>,
    queued: Option<Queued>,
    watching: Option<tokio::task::AbortHandle>,
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter")
            .field("queued", &self.queued.as_ref().map(|q| &q.key))
            .finish_non_exhaustive()
    }
}

/// A waiter's key in line, made at `rev` on `session`'s lease.
#[derive(Clone)]
struct Queued {
    key: String,
    rev: i64,
    session: Arc<Session>,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(task) = self.watching.take() {
            task.abort();
        }
    }
}

/// Ends a waiter whose watch was dropped without giving up (the caller
/// went away): its key goes, as if it gave up.
struct Subscribed {
    inner: Weak<Inner>,
    ticket: OwnerToken,
}

impl Drop for Subscribed {
    fn drop(&mut self) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let Some(waiter) = lock(&inner.waiters).remove(&self.ticket) else {
            return;
        };
        if let (Some(q), Ok(rt)) = (waiter.queued.clone(), tokio::runtime::Handle::try_current()) {
            rt.spawn(leave_line(inner.keys.clone(), q));
        }
    }
}

impl Inner {
    /// A new waiter `ticket`, woken by each delete of its predecessor.
    pub(crate) fn subscribe(self: &Arc<Self>, ticket: &OwnerToken) -> Watch {
        let (tx, rx) = watch::channel(0u64);
        let waiter = Waiter {
            tx: Arc::new(tx),
            queued: None,
            watching: None,
        };
        lock(&self.waiters).insert(ticket.clone(), waiter);
        let guard = Subscribed {
            inner: Arc::downgrade(self),
            ticket: ticket.clone(),
        };
        Watch::new(rx, Some(Box::new(guard)))
    }

    /// One attempt of waiter `ticket`: its key first in line holds; else
    /// it stays in line, watching the key just before its own.
    pub(crate) async fn attempt_in_line(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ticket: &OwnerToken,
    ) -> Result<Acquire> {
        if let Some(g) = self.reenter(key, owner).await? {
            return Ok(Acquire::Acquired(g));
        }
        let prefix = self.prefix(key);
        let queued = lock(&self.waiters)
            .get(ticket)
            .and_then(|w| w.queued.clone())
            .filter(|q| !q.session.is_dead());
        let (q, first) = match queued {
            Some(q) => {
                // As `enter`: the lease kept alive in the same round trip.
                let (alive, got) = futures::join!(
                    q.session.keep_alive(),
                    self.node.get(&prefix, Some(first_created()))
                );
                let (alive, got) = (alive?, got?);
                let first = got.kvs().first().map(KeyValue::create_revision);
                // A dead lease took our key with it: not first, whatever is.
                (q, first.filter(|_| alive))
            }
            None => {
                let value = owner.value().unwrap_or_default();
                let (mut attempt, mine, first) = self.enter(&prefix, value).await?;
                if mine == 0 {
                    attempt.delete().await?;
                    return Ok(Acquire::Contended { retry_after: None });
                }
                let q = Queued {
                    key: attempt.key.clone(),
                    rev: mine,
                    session: attempt.session.clone(),
                };
                let mut waiters = lock(&self.waiters);
                let Some(w) = waiters.get_mut(ticket) else {
                    // It gave up meanwhile: the attempt's key goes.
                    return Ok(Acquire::Contended { retry_after: None });
                };
                attempt.kept = true;
                w.queued = Some(q.clone());
                (q, first)
            }
        };
        if q.rev > 0 && first == Some(q.rev) {
            if let Some(w) = lock(&self.waiters).get_mut(ticket) {
                w.queued = None;
                if let Some(task) = w.watching.take() {
                    task.abort();
                }
            }
            return Ok(Acquire::Acquired(
                self.hold(key, owner, q.key, q.rev, q.session),
            ));
        }
        if !self.watch_predecessor(&prefix, &q, ticket).await? {
            // Nobody before us, yet not first: our key is gone (deleted
            // from outside). The next attempt takes a new place in line.
            if let Some(w) = lock(&self.waiters).get_mut(ticket) {
                w.queued = None;
                w.tx.send_modify(|v| *v = v.wrapping_add(1));
            }
            lock(&self.keys).remove(&q.key);
        }
        Ok(Acquire::Contended { retry_after: None })
    }

    /// Watches the delete of the key just before `q`'s, as Go's
    /// `waitDeletes`; `false` if there is none.
    async fn watch_predecessor(
        &self,
        prefix: &str,
        q: &Queued,
        ticket: &OwnerToken,
    ) -> Result<bool> {
        let opts = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_max_create_revision(q.rev - 1);
        let got = self.node.get(prefix, Some(opts)).await?;
        let Some(before) = got.kvs().first() else {
            return Ok(false);
        };
        let from = got.header().map_or(0, |h| h.revision()) + 1;
        let watched = before.key().to_vec();
        let mut client = self.node.client().await?;
        let Some(tx) = lock(&self.waiters).get(ticket).map(|w| w.tx.clone()) else {
            return Ok(true);
        };
        let task = tokio::spawn(async move {
            let opts = WatchOptions::new().with_start_revision(from);
            if let Ok(mut stream) = client.watch(watched, Some(opts)).await {
                while let Ok(Some(resp)) = stream.message().await {
                    let deleted = resp
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete);
                    if deleted || resp.canceled() {
                        break;
                    }
                }
            }
            // Deleted, or the watch ended: look again either way.
            tx.send_modify(|v| *v = v.wrapping_add(1));
        });
        if let Some(w) = lock(&self.waiters).get_mut(ticket) {
            if let Some(old) = w.watching.replace(task.abort_handle()) {
                old.abort();
            }
        } else {
            task.abort();
        }
        Ok(true)
    }

    /// Waiter `ticket` gives up: its key leaves the line, now, or in the
    /// background if the cluster does not answer (a key left in line would
    /// hold up everyone behind it while our lease lives).
    pub(crate) async fn give_up(&self, ticket: &OwnerToken) -> Result<()> {
        let waiter = lock(&self.waiters).remove(ticket);
        let Some(q) = waiter.and_then(|w| w.queued.clone()) else {
            return Ok(());
        };
        match delete_ours(&q.session, &q.key).await {
            Ok(()) => {
                lock(&self.keys).remove(&q.key);
                Ok(())
            }
            Err(e) => {
                tokio::spawn(leave_line(self.keys.clone(), q));
                Err(e)
            }
        }
    }
}

/// Deletes a waiter's key for good, trying again while its lease lives
/// (once it is dead the key is gone with it).
async fn leave_line(keys: Arc<std::sync::Mutex<std::collections::HashSet<String>>>, q: Queued) {
    while !q.session.is_dead() {
        if delete_ours(&q.session, &q.key).await.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    lock(&keys).remove(&q.key);
}
