//! Waiters in line, as Go's `Mutex.Lock` waits: a waiter keeps its key,
//! its place by create revision in the one line Go's and `etcdctl`'s
//! waiters stand in too, and watches only the delete of the key just
//! before its own (from the revision it read it at, so a delete in
//! between is not missed); each such delete wakes it to look again. A
//! waiter that gives up deletes its key. A waiter's record (`Waiter`, and
//! its key in line, `Queued`) is kept with the backend's shared state, in
//! `state.rs`.

use std::sync::{Arc, Weak};

use etcd_client::{
    Compare, CompareOp, Event, EventType, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp,
    WatchOptions,
};
use lockwright_core::backend::{lock_unpoisoned, Acquire, AcquireRequest, HoldId, Watch};
use lockwright_core::{Claim, LockKey, OwnerToken, Result};
use tokio::sync::watch;

use crate::claims;
use crate::node::Session;
use crate::state::{Inner, Queued, Waiter};

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
        let Some(waiter) = lock_unpoisoned(&inner.waiters).remove(&self.ticket) else {
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
        lock_unpoisoned(&self.waiters).insert(ticket.clone(), waiter);
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
        request: &AcquireRequest,
        ticket: &OwnerToken,
    ) -> Result<Acquire> {
        let key = request.key();
        if let Some(g) = self.reenter(&request.hold).await? {
            return Ok(Acquire::Acquired(g));
        }
        if let Some(writer) = request.hold.kind.beside() {
            return self.beside(&request.hold, writer).await;
        }
        let prefix = self.prefix(key);
        let Some((q, line)) = self.place_in_line(request, ticket, &prefix).await? else {
            return Ok(Acquire::Contended { retry_after: None });
        };
        let claim = request.claim();
        let held = match claims::holds(key, claim, q.rev, &line) {
            Ok(held) => held,
            Err(refused) => {
                // Another kind of claim holds: ours leaves the line before
                // the refusal is told (a caller that exits on it must not
                // leave a key behind), if it is still this waiter's to take
                // out (else a give-up or a dropped watch took it already).
                self.leave_refused(ticket, q).await;
                return Err(refused);
            }
        };
        if held {
            return self.take_turn(&request.hold, ticket, q).await;
        }
        self.wait_in_line(key, claim, &prefix, &q, ticket).await?;
        Ok(Acquire::Contended { retry_after: None })
    }

    /// Waiter `ticket`'s key in line and the line read with it: the key
    /// it stands there with (the line read again), or a new one put now;
    /// `None` when this attempt ends contended without one.
    async fn place_in_line(
        &self,
        request: &AcquireRequest,
        ticket: &OwnerToken,
        prefix: &str,
    ) -> Result<Option<(Queued, Vec<KeyValue>)>> {
        let queued = lock_unpoisoned(&self.waiters)
            .get(ticket)
            .and_then(|w| w.queued.clone());
        let queued = match queued {
            Some(q) if q.session.is_dead() => {
                // Its key went with its lease: a new place in line.
                self.unqueue(ticket, &q);
                None
            }
            other => other,
        };
        let claim = request.claim();
        match queued {
            Some(q) => {
                let got = self
                    .node
                    .get(prefix, Some(claims::line_read(claim)))
                    .await?;
                Ok(Some((q, got.kvs().to_vec())))
            }
            None => {
                let value = claims::value_of(request)?;
                let read = claims::line_read(claim);
                let (mut attempt, mine, line) = self.enter(prefix, &value, read).await?;
                if mine == 0 {
                    attempt.delete().await?;
                    self.wake(ticket);
                    return Ok(None);
                }
                let q = Queued {
                    key: attempt.key.clone(),
                    rev: mine,
                    session: attempt.session.clone(),
                };
                let mut waiters = lock_unpoisoned(&self.waiters);
                let Some(w) = waiters.get_mut(ticket) else {
                    // It gave up meanwhile: the attempt's key goes.
                    return Ok(None);
                };
                attempt.kept = true;
                w.queued = Some(q.clone());
                Ok(Some((q, line)))
            }
        }
    }

    /// Takes `q` out of line for a refused waiter `ticket`, now, if it
    /// still stands there with it.
    async fn leave_refused(&self, ticket: &OwnerToken, q: Queued) {
        let ours = match lock_unpoisoned(&self.waiters).get_mut(ticket) {
            Some(w) if w.queued.as_ref().is_some_and(|x| x.same(&q)) => {
                w.queued = None;
                true
            }
            _ => false,
        };
        if ours {
            let _ = leave_line_now(self.keys.clone(), q).await;
        }
    }

    /// Waiter `ticket`, first in line with `q`, holds: the grant, or
    /// contention if its lease is not confirmed alive or it left the line
    /// meanwhile.
    async fn take_turn(&self, hold: &HoldId, ticket: &OwnerToken, q: Queued) -> Result<Acquire> {
        // First in line. The grant is trusted from this attempt's start:
        // the lease is kept alive now, and the grant stands only if
        // that is confirmed, and only while this waiter still stands
        // in line with this key (one that gave up meanwhile left its
        // key to `leave_line`).
        if !q.session.keep_alive().await? {
            self.wake(ticket);
            return Ok(Acquire::Contended { retry_after: None });
        }
        {
            let mut waiters = lock_unpoisoned(&self.waiters);
            match waiters.get_mut(ticket) {
                Some(w) if w.queued.as_ref().is_some_and(|x| x.same(&q)) => {
                    w.queued = None;
                    if let Some(task) = w.watching.take() {
                        task.abort();
                    }
                }
                _ => return Ok(Acquire::Contended { retry_after: None }),
            }
        }
        Ok(Acquire::Acquired(self.hold(hold, q.key, q.rev, q.session)))
    }

    /// Waiter `ticket`, not first, watches for its turn; if there is
    /// nothing to watch it is woken to look again at once.
    async fn wait_in_line(
        &self,
        key: &LockKey,
        claim: Claim,
        prefix: &str,
        q: &Queued,
        ticket: &OwnerToken,
    ) -> Result<()> {
        let watching = if claim == Claim::MUTEX {
            self.watch_predecessor(prefix, q, ticket).await?
        } else {
            self.watch_line(key, claim, prefix, q, ticket).await?
        };
        if !watching {
            // Nobody before us now, though we were not first when we
            // looked: the one before us has just gone (we are first, as Go
            // checks with its own key), or our key was deleted from outside
            // (a new place in line). Either way, look again at once.
            let got = self.node.get(&q.key, None).await?;
            let ours = got
                .kvs()
                .first()
                .is_some_and(|kv| kv.create_revision() == q.rev && kv.lease() == q.session.id);
            if !ours {
                self.unqueue(ticket, q);
            }
            self.wake(ticket);
        }
        Ok(())
    }

    /// Wakes waiter `ticket` to ask again at once.
    fn wake(&self, ticket: &OwnerToken) {
        if let Some(w) = lock_unpoisoned(&self.waiters).get(ticket) {
            w.tx.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    /// Takes `q` out of line for waiter `ticket` if it still stands there
    /// with it (else its key is another path's to clean up).
    fn unqueue(&self, ticket: &OwnerToken, q: &Queued) {
        let mut waiters = lock_unpoisoned(&self.waiters);
        if let Some(w) = waiters.get_mut(ticket) {
            if w.queued.as_ref().is_some_and(|x| x.same(q)) {
                w.queued = None;
                lock_unpoisoned(&self.keys).remove(&q.key);
            }
        }
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
        let opts = WatchOptions::new().with_start_revision(from);
        self.wake_on(ticket, before.key().to_vec(), opts, |e| {
            e.event_type() == EventType::Delete
        })
        .await?;
        Ok(true)
    }

    /// Watches the line of a semaphore or read-write lock for a change
    /// that may let `q` hold: a delete, or a key before `q`'s rewritten
    /// (a downgraded writer's, now a reader's); `false` if `q` may hold
    /// now. Every such waiter of the name is woken by every release and
    /// reads the line again: the line is short, and N holders leave in
    /// any order, so there is no one predecessor to watch.
    async fn watch_line(
        &self,
        key: &LockKey,
        claim: Claim,
        prefix: &str,
        q: &Queued,
        ticket: &OwnerToken,
    ) -> Result<bool> {
        let got = self
            .node
            .get(prefix, Some(claims::line_read(claim)))
            .await?;
        // Our key gone (deleted from outside), or holding by now, or the
        // name taken by another kind: look again at once.
        let present = got.kvs().iter().any(|kv| kv.create_revision() == q.rev);
        if !present || claims::holds(key, claim, q.rev, got.kvs()).unwrap_or(true) {
            return Ok(false);
        }
        let from = got.header().map_or(0, |h| h.revision()) + 1;
        let opts = WatchOptions::new().with_prefix().with_start_revision(from);
        let mine = q.rev;
        // A delete's key-value has no create revision (0).
        self.wake_on(ticket, prefix.as_bytes().to_vec(), opts, move |e| {
            e.kv().is_some_and(|kv| kv.create_revision() < mine)
        })
        .await?;
        Ok(true)
    }

    /// Wakes waiter `ticket` at the first event of the watch on `watched`
    /// that `wakes`, or when the watch ends, from a task that replaces the
    /// waiter's last one.
    async fn wake_on(
        &self,
        ticket: &OwnerToken,
        watched: Vec<u8>,
        opts: WatchOptions,
        wakes: impl Fn(&Event) -> bool + Send + 'static,
    ) -> Result<()> {
        let mut client = self.node.client().await?;
        let Some(tx) = lock_unpoisoned(&self.waiters)
            .get(ticket)
            .map(|w| w.tx.clone())
        else {
            return Ok(());
        };
        let task = tokio::spawn(async move {
            if let Ok(mut stream) = client.watch(watched, Some(opts)).await {
                while let Ok(Some(resp)) = stream.message().await {
                    if resp.events().iter().any(&wakes) || resp.canceled() {
                        break;
                    }
                }
            }
            // Woken, or the watch ended: look again either way.
            tx.send_modify(|v| *v = v.wrapping_add(1));
        });
        if let Some(w) = lock_unpoisoned(&self.waiters).get_mut(ticket) {
            if let Some(old) = w.watching.replace(task.abort_handle()) {
                old.abort();
            }
        } else {
            task.abort();
        }
        Ok(())
    }

    /// Waiter `ticket` gives up: its key leaves the line, now, or in the
    /// background if the cluster does not answer (a key left in line would
    /// hold up everyone behind it while our lease lives).
    pub(crate) async fn give_up(&self, ticket: &OwnerToken) -> Result<()> {
        let waiter = lock_unpoisoned(&self.waiters).remove(ticket);
        let Some(q) = waiter.and_then(|w| w.queued.clone()) else {
            return Ok(());
        };
        leave_line_now(self.keys.clone(), q).await
    }
}

/// Takes a waiter's key out of line: deleted now if the cluster answers
/// in time, else in the background. The work runs in a task of its own,
/// so a caller dropped while it waits does not leave the key behind.
async fn leave_line_now(
    keys: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    q: Queued,
) -> Result<()> {
    let task = tokio::spawn(async move {
        match delete_made(&q.session, &q.key, q.rev).await {
            Ok(()) => {
                lock_unpoisoned(&keys).remove(&q.key);
                Ok(())
            }
            Err(e) => {
                tokio::spawn(leave_line(keys, q));
                Err(e)
            }
        }
    });
    task.await.unwrap_or(Ok(()))
}

/// Deletes a waiter's key for good, trying again while its lease lives
/// (once it is dead the key is gone with it).
async fn leave_line(keys: Arc<std::sync::Mutex<std::collections::HashSet<String>>>, q: Queued) {
    while !q.session.is_dead() {
        if delete_made(&q.session, &q.key, q.rev).await.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    lock_unpoisoned(&keys).remove(&q.key);
}

/// Deletes `key` if it is still the one made at `rev` on `session`'s
/// lease (a key of the same name made since by another attempt of ours
/// stays).
async fn delete_made(session: &Session, key: &str, rev: i64) -> Result<()> {
    let txn = Txn::new()
        .when([
            Compare::lease(key, CompareOp::Equal, session.id),
            Compare::create_revision(key, CompareOp::Equal, rev),
        ])
        .and_then([TxnOp::delete(key, None)]);
    session.txn(txn).await.map(drop)
}
