//! The wait queue, Curator's: joining a lock's queue (our node, and the
//! listing that says where it stands, in one round trip), and a queued
//! waiter's turn, which comes when the node just before its own goes.
//!
//! Like Curator, a waiter watches its predecessor with a data watch
//! (`getData`), not an existence watch: an existence watch on a node that
//! is already gone would stay on the server, waiting for a node of that
//! name to be made, while `getData` answers `NoNode`, leaves no watch, and
//! so says at once to list again. Only the predecessor is watched, so a
//! release wakes one waiter, not the whole queue. A reader, as Curator's,
//! waits only for writers (and mutex holders): it watches the first one
//! before it, and holds once none is left before it.

use std::sync::{Arc, Weak};

use lockwright_core::backend::{lock_unpoisoned, Acquire, AcquireRequest, HoldId};
use lockwright_core::{Error, LockKey, OwnerToken, Result};
use zookeeper_client::{CreateMode, Error as ZkError};

use crate::claims::{wait_lease, LeaseWait};
use crate::cleanup::{delete_surely, find_and_delete, undo_create, RETRY_PAUSE};
use crate::error::{is_transient, map_err};
use crate::layout::{self, Role, SEM_LEASES, SEM_LOCKS};
use crate::node::{Contender, Exchange, Session};
use crate::state::{Entered, Inner, Waiter};

impl Entered {
    /// Leaves the queue: our node goes now (or in the background once the
    /// store answers), a lease node with it.
    pub(crate) async fn leave(self) {
        Entered::leave_nodes(self.lease, self.node).await;
    }

    /// Deletes a contender's `lease` node, then its queue `node`, now (or
    /// in the background once the store answers).
    pub(crate) async fn leave_nodes(lease: Option<Contender>, node: Contender) {
        // The lease first, as Curator returns it: the gate's next holder
        // must not count it.
        if let Some(l) = lease {
            let _ = crate::cleanup::delete(l).await;
        }
        let _ = crate::cleanup::delete(node).await;
    }
}

/// Where a contender stands in its sorted queue.
#[derive(Debug, PartialEq)]
pub(crate) enum Turn {
    /// It holds: first, or a reader with no writer before it.
    Mine,
    /// It waits for this child to go.
    After(String),
    /// Its node is not listed.
    Gone,
}

/// The turn of our node `name` in the sorted `children`: a writer's or
/// mutex's when it is first (it watches the node just before it), a
/// reader's when no exclusive node is before it (it watches the first).
pub(crate) fn turn(children: &[String], name: &str, role: Role) -> Turn {
    let Some(i) = children.iter().position(|c| c == name) else {
        return Turn::Gone;
    };
    if role == Role::Reader {
        return match children[..i].iter().find(|c| layout::is_exclusive_node(c)) {
            Some(w) => Turn::After(w.clone()),
            None => Turn::Mine,
        };
    }
    match i {
        0 => Turn::Mine,
        _ => Turn::After(children[i - 1].clone()),
    }
}

impl Inner {
    /// Creates our contender node in `key`'s directory and lists the queue
    /// in the same round trip: the client sends both at once, and the
    /// server answers a session's requests in order, so the listing holds
    /// the node. A create whose answer is lost is cleaned up in the
    /// background: the node is found by its UUID and our session, and
    /// deleted, so no orphan blocks the queue.
    pub(crate) async fn enter(
        &self,
        session: &Arc<Session>,
        request: &AcquireRequest,
        role: Role,
    ) -> Result<Entered> {
        let key_dir = self.dir(request.key());
        // A semaphore queues at its gate, `P/locks`, as a mutex.
        let (dir, queue_role) = match role {
            Role::Lease(_) => (format!("{key_dir}/{SEM_LOCKS}"), Role::Mutex),
            r => (key_dir.clone(), r),
        };
        let prefix = layout::contender_prefix(queue_role, request.owner().tag());
        let acls = self.sessions.acls();
        // The server may reap an empty directory between our mkdir and our
        // create: make it again, a few times.
        let mut dirs_made = 0;
        loop {
            let (client, list_dir) = (session.client.clone(), dir.clone());
            let (path, data) = (
                format!("{dir}/{prefix}"),
                layout::node_data(request).to_vec(),
            );
            // Polled here; owned, so that if its answer is late it can be
            // handed to a clean-up task and still be awaited there. Two
            // requests, not a multi: a multi's create reports a bad `Stat`
            // on servers before 3.8.2 (ZOOKEEPER-4026), and the fence is
            // read from it.
            let mut exchange: Exchange = Box::pin(async move {
                let options = CreateMode::EphemeralSequential.with_acls(acls);
                let create = client.create(&path, &data, &options);
                let list = client.list_children(&list_dir);
                futures::future::join(create, list).await
            });
            let answered = session
                .call(async { Ok::<_, ZkError>((&mut exchange).await) })
                .await;
            let (created, listed) = match answered {
                Ok(both) => both,
                Err(e) => {
                    tokio::spawn(undo_create(session.clone(), exchange, dir, prefix));
                    return Err(map_err(e));
                }
            };
            let (stat, sequence) = match created {
                Ok(c) => c,
                Err(ZkError::NoNode) if dirs_made < 3 => {
                    dirs_made += 1;
                    if queue_role == role {
                        self.make_dir(session, &dir).await?;
                    } else {
                        self.make_sub_dir(session, &key_dir, SEM_LOCKS, &[]).await?;
                    }
                    continue;
                }
                Err(e) => {
                    if is_transient(&e) {
                        tokio::spawn(find_and_delete(session.clone(), dir, prefix));
                    }
                    return Err(map_err(e));
                }
            };
            let name = format!("{prefix}{sequence}");
            let node = Contender {
                session: session.clone(),
                path: format!("{dir}/{name}"),
                czxid: stat.czxid,
            };
            let sem;
            let first = match listed {
                Ok(mut children) => {
                    layout::sort_queue(&mut children);
                    sem = children.iter().any(|c| c == SEM_LEASES);
                    match turn(&children, &name, queue_role) {
                        Turn::Mine => true,
                        Turn::After(_) => false,
                        Turn::Gone => {
                            tokio::spawn(delete_surely(node.session.clone(), node.path));
                            return Err(Error::backend(format!(
                                "ZooKeeper did not list the node {name} just created in {dir}"
                            )));
                        }
                    }
                }
                Err(e) => {
                    tokio::spawn(delete_surely(node.session.clone(), node.path));
                    return Err(map_err(e));
                }
            };
            return Ok(Entered {
                node,
                name,
                dir,
                first,
                role,
                key_dir,
                sem: sem && queue_role == role,
                lease: None,
            });
        }
    }

    /// Makes the lock directory `dir` with our ACL, and the root's missing
    /// levels with the shared one; all are containers, reaped once empty.
    pub(crate) async fn make_dir(&self, session: &Session, dir: &str) -> Result<()> {
        let lock_dir = CreateMode::Container.with_acls(self.sessions.acls());
        match session
            .call(session.client.create(dir, &[], &lock_dir))
            .await
        {
            Ok(_) | Err(ZkError::NodeExists) => return Ok(()),
            Err(ZkError::NoNode) => {}
            Err(e) => return Err(map_err(e)),
        }
        let root = &self.sessions.config().root;
        if !root.is_empty() {
            let parents = CreateMode::Container.with_acls(self.sessions.parent_acls());
            session
                .call(session.client.mkdir(root, &parents))
                .await
                .map_err(map_err)?;
        }
        match session
            .call(session.client.create(dir, &[], &lock_dir))
            .await
        {
            Ok(_) | Err(ZkError::NodeExists) => Ok(()),
            Err(e) => Err(map_err(e)),
        }
    }

    /// The answer for a waiter in the queue. Its node keeps its place and
    /// the grant comes by notice, so it needs no refreshing; it is looked
    /// at again every third of the session timeout, as a hold is confirmed.
    pub(crate) fn queued(&self) -> Acquire {
        Acquire::Contended {
            retry_after: Some(self.sessions.config().session_timeout / 3),
        }
    }

    /// A ticket already queued: its node is confirmed with the server (so
    /// the caller's send time is a moment the session was known alive,
    /// which a later grant's lease counts from), then the grant it was
    /// handed, or "still queued". `None` if the ticket has no live node and
    /// must queue afresh (anything of it left behind is cleared).
    pub(crate) async fn requeued(
        &self,
        key: &LockKey,
        ticket: &OwnerToken,
    ) -> Result<Option<Acquire>> {
        let (node, granted) = match lock_unpoisoned(&self.waiters).get(ticket) {
            Some(w) => match &w.node {
                Some(n) => (n.clone(), w.granted),
                None => return Ok(None),
            },
            None => return Ok(None),
        };
        let alive = node.confirm().await?;
        let mut waiters = lock_unpoisoned(&self.waiters);
        let Some(w) = waiters.get_mut(ticket) else {
            return Ok(None);
        };
        if w.node.as_ref().is_none_or(|n| n.path != node.path) {
            // Moved on meanwhile (a semaphore's waiter, from its gate to
            // its lease): its grant comes by notice, or is read next time.
            return Ok(w.node.is_some().then(|| self.queued()));
        }
        if alive {
            return Ok(Some(match granted {
                Some(g) => {
                    waiters.remove(ticket);
                    Acquire::Acquired(g)
                }
                None => self.queued(),
            }));
        }
        // The node is gone (its session ended): forget it, and any hold it
        // was handed, and queue again.
        if let Some(t) = w.task.take() {
            t.abort();
        }
        w.node = None;
        w.granted = None;
        if let Some((dir, prefix)) = w.lease.take() {
            tokio::spawn(find_and_delete(node.session.clone(), dir, prefix));
        }
        drop(waiters);
        self.forget(key, &node.path);
        Ok(None)
    }
}

/// Dropped with a waiter's [`Watch`](lockwright_core::backend::Watch): a waiter that never got the lock
/// leaves the queue, so a caller that drops its watch leaves no node behind.
pub(crate) struct WaiterGuard {
    pub(crate) inner: Weak<Inner>,
    pub(crate) ticket: OwnerToken,
}

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let Some(w) = lock_unpoisoned(&inner.waiters).remove(&self.ticket) else {
            return;
        };
        if w.granted.is_some() {
            return;
        }
        if let Some(t) = &w.task {
            t.abort();
        }
        if let (Some(node), Ok(rt)) = (w.node, tokio::runtime::Handle::try_current()) {
            if let Some((dir, prefix)) = w.lease {
                rt.spawn(find_and_delete(node.session.clone(), dir, prefix));
            }
            rt.spawn(delete_surely(node.session, node.path));
        }
    }
}

/// A queued waiter's turn: watch the node it waits for until its turn
/// comes (a semaphore's waiter then waits at its gate for the leases to
/// number N or fewer), then hand the lock to the waiter. If our node is
/// gone (the session ended), the waiter is marked unqueued and its next
/// attempt queues afresh.
pub(crate) async fn wait_turn(
    inner: Weak<Inner>,
    hold: HoldId,
    ticket: OwnerToken,
    entered: Entered,
) {
    let Entered {
        node,
        name,
        dir,
        role,
        key_dir,
        mut lease,
        ..
    } = entered;
    let session = node.session.clone();
    let queue_role = match role {
        Role::Lease(_) => Role::Mutex,
        r => r,
    };
    let mut first = wait_first(&inner, &ticket, &session, &dir, &name, queue_role).await;
    let mut refused = false;
    if let (true, Role::Lease(n)) = (first, role) {
        let wait = wait_lease(
            &inner, &session, &hold.key, n, &key_dir, &ticket, &mut lease,
        )
        .await;
        first = wait == LeaseWait::Held;
        refused = wait == LeaseWait::Refused;
    }
    let Some(inner) = inner.upgrade() else {
        return;
    };
    if let (true, Some(l)) = (first, &lease) {
        // A semaphore's waiter holds by its lease, recorded before its
        // gate goes (so a look at the waiter meanwhile finds the lease);
        // the gate goes before the grant is told, as Curator's does.
        if !hold_by_lease(&inner, &ticket, &node, l) {
            return;
        }
        delete_surely(session.clone(), node.path.clone()).await;
    }
    let holder = match &lease {
        Some(l) if first => l.clone(),
        _ => node.clone(),
    };
    // A listing that found us first says nothing of a session that has
    // ended since.
    let first = first && !session.is_over();
    if refused {
        // The nodes go before the waiter learns it is out of line: its
        // next attempt tells the refusal, and another client asking then
        // must not meet them. Meanwhile the waiter still counts as queued,
        // so an abandon still deletes them.
        let ours = |w: &Waiter| w.node.as_ref().is_some_and(|n| n.path == holder.path);
        if !lock_unpoisoned(&inner.waiters)
            .get(&ticket)
            .is_some_and(ours)
        {
            // Abandoned meanwhile: the abandon deleted (or deletes) the nodes.
            return;
        }
        Entered::leave_nodes(lease, node).await;
        if let Some(w) = lock_unpoisoned(&inner.waiters)
            .get_mut(&ticket)
            .filter(|w| ours(w))
        {
            w.task = None;
            w.lease = None;
            w.node = None;
        }
        return;
    }
    let mut waiters = lock_unpoisoned(&inner.waiters);
    let current = waiters
        .get_mut(&ticket)
        .filter(|w| w.node.as_ref().is_some_and(|n| n.path == holder.path));
    let Some(w) = current else {
        // Abandoned meanwhile: the abandon deleted (or deletes) the nodes.
        return;
    };
    w.task = None;
    w.lease = None;
    if !first {
        w.node = None;
        drop(waiters);
        if !session.is_over() {
            leave_queue(session, lease, node);
        }
        return;
    }
    let grant = holder.grant(1);
    inner.hold(&hold, holder, Some(ticket));
    w.granted = Some(grant);
    if let Some(tx) = &w.grants {
        let _ = tx.send(grant);
    }
}

/// Waits until our node `name` in `dir` comes first (as `queue_role`
/// sees its queue): `true` then, `false` if the node is gone or the store
/// fails for good.
async fn wait_first(
    inner: &Weak<Inner>,
    ticket: &OwnerToken,
    session: &Session,
    dir: &str,
    name: &str,
    queue_role: Role,
) -> bool {
    // Which node the waiter watches is kept only for tests (`internals`).
    #[cfg(not(feature = "internals"))]
    let _ = (inner, ticket);
    loop {
        let Some(mut children) = list_queue(session, dir).await else {
            return false;
        };
        layout::sort_queue(&mut children);
        let before = match turn(&children, name, queue_role) {
            Turn::Mine => return true,
            Turn::Gone => return false,
            Turn::After(b) => format!("{dir}/{b}"),
        };
        #[cfg(feature = "internals")]
        if let Some(inner) = inner.upgrade() {
            if let Some(w) = lock_unpoisoned(&inner.waiters).get_mut(ticket) {
                w.watching = Some(before.clone());
            }
        }
        if !watch_until_changed(session, &before).await {
            return false;
        }
    }
}

/// The queue's children in `dir`, listed again after a pause while the
/// failure is transient and the session still connected; `None` once
/// listing fails otherwise.
async fn list_queue(session: &Session, dir: &str) -> Option<Vec<String>> {
    loop {
        match session.client.list_children(dir).await {
            Ok(c) => return Some(c),
            Err(e) if is_transient(&e) && session.connected().await => {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Err(_) => return None,
        }
    }
}

/// Waits for the node `before` to change or go (a data watch; `NoNode`:
/// gone already), or pauses after a transient failure while the session
/// is connected; `false` if the watch failed otherwise.
async fn watch_until_changed(session: &Session, before: &str) -> bool {
    match session.client.get_and_watch_data(before).await {
        Ok((_, _, watcher)) => {
            watcher.changed().await;
        }
        Err(ZkError::NoNode) => {}
        Err(e) if is_transient(&e) && session.connected().await => {
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        Err(_) => return false,
    }
    true
}

/// Records waiter `ticket`'s lease `l` as its node in place of its gate
/// `node`; `false` if the waiter no longer stands there with `node`.
fn hold_by_lease(inner: &Inner, ticket: &OwnerToken, node: &Contender, l: &Contender) -> bool {
    let mut waiters = lock_unpoisoned(&inner.waiters);
    let Some(w) = waiters
        .get_mut(ticket)
        .filter(|w| w.node.as_ref().is_some_and(|n| n.path == node.path))
    else {
        return false;
    };
    w.node = Some(l.clone());
    w.lease = None;
    true
}

/// Deletes, in the background, the nodes of a waiter whose turn did not
/// come.
fn leave_queue(session: Arc<Session>, lease: Option<Contender>, node: Contender) {
    tokio::spawn(async move {
        // The lease first, as Curator returns it.
        if let Some(l) = lease {
            delete_surely(session.clone(), l.path).await;
        }
        delete_surely(session, node.path).await;
    });
}
