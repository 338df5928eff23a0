//! [`ZkBackend`]: the [`LockBackend`] over ephemeral sequential nodes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use locksmith_core::backend::{
    Acquire, Binding, Capabilities, Grant, LockBackend, Release, Renew, Watch,
};
use locksmith_core::{Error, FencingToken, LockKey, LockStatus, OwnerToken, Result};
use tokio::sync::mpsc;
use zookeeper_client::{CreateMode, Error as ZkError};

use crate::config::ZkConfig;
use crate::error::{is_session_over, is_transient, map_err};
use crate::layout;
use crate::node::{Session, Sessions};

/// The shortest TTL accepted: the TTL only paces renewals here (the
/// session, not the TTL, keeps a lock), and checks faster than this
/// would load the ensemble for nothing.
pub(crate) const MIN_TTL: Duration = Duration::from_millis(250);

/// How long to let a transient failure pass before trying again, in the
/// background tasks that must finish their work (never a busy loop).
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between such tries: an error that persists while the
/// session lives (a throttling server) costs a request every few seconds.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(5);

/// Locks in ZooKeeper, as Curator's `InterProcessMutex` takes them (see the
/// crate docs). Cheap to clone; every clone shares one session.
#[derive(Debug, Clone)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    sessions: Sessions,
    /// This process's holds, by key: the node that holds it and for whom.
    held: Mutex<HashMap<LockKey, Held>>,
    /// Queued waiters, by ticket.
    waiters: Mutex<HashMap<OwnerToken, Waiter>>,
}

/// One contender node of ours.
#[derive(Debug, Clone)]
struct Node {
    session: Arc<Session>,
    path: String,
    czxid: i64,
}

impl Node {
    fn grant(&self, holds: u32) -> Grant {
        Grant {
            fence: Some(fence_of(self.czxid)),
            holds,
            lease: None,
        }
    }
}

/// A node's creation zxid as a fencing token (a zxid is positive: epoch
/// << 32 | counter).
fn fence_of(czxid: i64) -> FencingToken {
    FencingToken(u64::try_from(czxid).unwrap_or(0))
}

#[derive(Debug)]
struct Held {
    owner: OwnerToken,
    holds: u32,
    node: Node,
    /// The waiter ticket the lock was handed to, if it came that way.
    ticket: Option<OwnerToken>,
}

#[derive(Debug, Default)]
struct Waiter {
    /// Where grants are delivered, once the waiter watches.
    grants: Option<mpsc::UnboundedSender<Grant>>,
    /// The waiter's node in the queue, once it queued.
    node: Option<Node>,
    /// The lock was handed to this waiter.
    granted: Option<Grant>,
    task: Option<tokio::task::AbortHandle>,
    /// The node whose change the waiter waits for, for tests that check it
    /// is the predecessor.
    #[cfg(feature = "internals")]
    watching: Option<String>,
}

/// The answers to a create and the listing sent with it.
type CreateAndList = (
    std::result::Result<(zookeeper_client::Stat, zookeeper_client::CreateSequence), ZkError>,
    std::result::Result<Vec<String>, ZkError>,
);

/// A create and the listing sent with it, as one owned future.
type Exchange = std::pin::Pin<Box<dyn std::future::Future<Output = CreateAndList> + Send>>;

/// What one attempt found: our new node, and the queue it joined.
struct Entered {
    node: Node,
    name: String,
    dir: String,
    first: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for Inner {
    fn drop(&mut self) {
        for w in lock(&self.waiters).values() {
            if let Some(t) = &w.task {
                t.abort();
            }
        }
    }
}

impl ZkBackend {
    /// Opens a backend for a `zk://` URL (see [`ZkConfig::from_url`]). No
    /// connection is made until the first request (or
    /// [`verify`](LockBackend::verify)).
    ///
    /// # Errors
    /// `Config`/`InvalidOptions` for a bad URL.
    pub fn connect(url: &str) -> Result<Self> {
        Ok(Self::with_config(ZkConfig::from_url(url)?))
    }

    /// Opens a backend from a parsed configuration.
    pub fn with_config(config: ZkConfig) -> Self {
        ZkBackend {
            inner: Arc::new(Inner {
                sessions: Sessions::new(config),
                held: Mutex::new(HashMap::new()),
                waiters: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The configuration in use (its URL prints without secrets).
    pub fn config(&self) -> &ZkConfig {
        self.inner.sessions.config()
    }

    /// The nodes this backend's queued waiters watch, for tests.
    #[cfg(feature = "internals")]
    pub(crate) fn watched(&self) -> Vec<String> {
        lock(&self.inner.waiters)
            .values()
            .filter_map(|w| w.watching.clone())
            .collect()
    }

    /// The current session's credentials, for tests that end it from outside.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub(crate) fn session_info(&self) -> Option<zookeeper_client::SessionInfo> {
        self.inner
            .sessions
            .peek()
            .map(|s| s.client.session().clone())
    }
}

impl Inner {
    fn dir(&self, key: &LockKey) -> String {
        let root = &self.sessions.config().root;
        format!("{root}/{}", layout::dir_name(key.as_str(), root.is_empty()))
    }

    /// Creates our contender node in `key`'s directory and lists the queue
    /// in the same round trip: the client sends both at once, and the
    /// server answers a session's requests in order, so the listing holds
    /// the node. A create whose answer is lost is cleaned up in the
    /// background: the node is found by its UUID and our session, and
    /// deleted, so no orphan blocks the queue.
    async fn enter(
        &self,
        session: &Arc<Session>,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> Result<Entered> {
        let dir = self.dir(key);
        let prefix = layout::contender_prefix(&uuid::Uuid::new_v4());
        let acls = self.sessions.acls();
        // The server may reap an empty directory between our mkdir and our
        // create: make it again, a few times.
        let mut dirs_made = 0;
        loop {
            let (client, list_dir) = (session.client.clone(), dir.clone());
            let (path, data) = (
                format!("{dir}/{prefix}"),
                owner.as_str().as_bytes().to_vec(),
            );
            // Polled here; owned, so that if its answer is late it can be
            // handed to a clean-up task and still be awaited there.
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
                    self.make_dir(session, &dir).await?;
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
            let node = Node {
                session: session.clone(),
                path: format!("{dir}/{name}"),
                czxid: stat.czxid,
            };
            let first = match listed {
                Ok(mut children) => {
                    layout::sort_queue(&mut children);
                    match children.iter().position(|c| *c == name) {
                        Some(i) => i == 0,
                        None => {
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
            });
        }
    }

    /// Makes the lock directory `dir` with our ACL, and the root's missing
    /// levels with the shared one; all are containers, reaped once empty.
    async fn make_dir(&self, session: &Session, dir: &str) -> Result<()> {
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

    /// Still ours: the node exists and belongs to the session that made it,
    /// which is live. Never taken from a listing: a node left by an ended
    /// session is not ours, whatever its name (CURATOR-604).
    async fn confirm(&self, node: &Node) -> Result<bool> {
        if node.session.is_over() {
            return Ok(false);
        }
        // A server cut off from the leader may still answer reads from its
        // stale copy while the leader expires the session: `sync` first, so
        // the answer is at least as new as the leader's state when it was
        // sent (the server answers a session's requests in order).
        let client = &node.session.client;
        let (synced, stat) = node
            .session
            .call(async {
                let pair =
                    futures::future::join(client.sync(&node.path), client.check_stat(&node.path));
                Ok(pair.await)
            })
            .await
            .unwrap_or_else(|e| (Err(e.clone()), Err(e)));
        match synced.and(stat) {
            Ok(Some(stat)) => Ok(stat.ephemeral_owner == node.session.id),
            Ok(None) | Err(ZkError::NoNode) => Ok(false),
            Err(e) if is_session_over(&e) => Ok(false),
            Err(e) => Err(map_err(e)),
        }
    }

    /// The answer for a waiter in the queue. Its node keeps its place and
    /// the grant comes by notice, so it needs no refreshing; it is looked
    /// at again every third of the session timeout, as a hold is confirmed.
    fn queued(&self) -> Acquire {
        Acquire::Contended {
            retry_after: Some(self.sessions.config().session_timeout / 3),
        }
    }

    /// A ticket already queued: its node is confirmed with the server (so
    /// the caller's send time is a moment the session was known alive,
    /// which a later grant's lease counts from), then the grant it was
    /// handed, or "still queued". `None` if the ticket has no live node and
    /// must queue afresh (anything of it left behind is cleared).
    async fn requeued(&self, key: &LockKey, ticket: &OwnerToken) -> Result<Option<Acquire>> {
        let (node, granted) = match lock(&self.waiters).get(ticket) {
            Some(w) => match &w.node {
                Some(n) => (n.clone(), w.granted),
                None => return Ok(None),
            },
            None => return Ok(None),
        };
        let alive = self.confirm(&node).await?;
        let mut waiters = lock(&self.waiters);
        let Some(w) = waiters
            .get_mut(ticket)
            .filter(|w| w.node.as_ref().is_some_and(|n| n.path == node.path))
        else {
            return Ok(None);
        };
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
        let mut held = lock(&self.held);
        if held.get(key).is_some_and(|h| h.node.path == node.path) {
            held.remove(key);
        }
        Ok(None)
    }

    /// One attempt: re-entry, or a new node that is first in the queue
    /// (the hold recorded under `ticket`, so that an abandon, when the
    /// caller cancelled while this answer was on its way, releases it); or
    /// the node that queued behind someone else.
    async fn attempt(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ticket: Option<&OwnerToken>,
    ) -> Result<std::result::Result<Grant, Entered>> {
        if let Some(granted) = self.reenter(key, owner).await? {
            return Ok(Ok(granted));
        }
        let session = self.sessions.get().await?;
        let entered = self.enter(&session, key, owner).await?;
        if !entered.first {
            return Ok(Err(entered));
        }
        let grant = entered.node.grant(1);
        self.hold(key, owner, entered.node, ticket.cloned());
        Ok(Ok(grant))
    }

    /// Re-entry: `owner` already holds `key` here, on a node that is still
    /// its own. `None` to acquire afresh.
    async fn reenter(&self, key: &LockKey, owner: &OwnerToken) -> Result<Option<Grant>> {
        let node = match lock(&self.held).get(key) {
            Some(h) if h.owner == *owner => h.node.clone(),
            _ => return Ok(None),
        };
        let ours = self.confirm(&node).await?;
        let mut held = lock(&self.held);
        match held.get_mut(key) {
            Some(h) if h.owner == *owner && h.node.path == node.path => {
                if ours {
                    h.holds += 1;
                    return Ok(Some(h.node.grant(h.holds)));
                }
                held.remove(key);
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    /// Deletes our node now, or, if the store does not answer, in the
    /// background once it does (or never, if the session ends first: the
    /// node goes with it).
    async fn delete(&self, node: Node) -> Result<bool> {
        if node.session.is_over() {
            return Ok(false);
        }
        match node
            .session
            .call(node.session.client.delete(&node.path, None))
            .await
        {
            Ok(()) => Ok(true),
            Err(ZkError::NoNode) => Ok(false),
            Err(e) if is_session_over(&e) => Ok(false),
            Err(e) if is_transient(&e) => {
                tokio::spawn(delete_surely(node.session.clone(), node.path));
                Err(Error::unavailable(
                    "ZooKeeper did not confirm the delete; it is retried once the connection \
                     returns, and the node goes with the session otherwise",
                )
                .with_source(e))
            }
            Err(e) => Err(map_err(e)),
        }
    }

    fn hold(&self, key: &LockKey, owner: &OwnerToken, node: Node, ticket: Option<OwnerToken>) {
        lock(&self.held).insert(
            key.clone(),
            Held {
                owner: owner.clone(),
                holds: 1,
                node,
                ticket,
            },
        );
    }
}

#[async_trait]
impl LockBackend for ZkBackend {
    fn capabilities(&self) -> Capabilities {
        let config = self.inner.sessions.config();
        // The session, not the TTL, keeps a lock: a hold can be trusted for
        // one session timeout after the server last confirmed the session.
        Capabilities::default()
            .with_fencing(true)
            .with_min_ttl(MIN_TTL)
            .with_binding(Binding::Session)
            .with_notify(true)
            .with_fair(true)
            .with_retention(config.retention)
            .with_max_lease(Some(config.session_timeout))
    }

    /// A session is made and the root's parent can be read.
    async fn verify(&self) -> Result<()> {
        let session = self.inner.sessions.get().await?;
        let root = &self.inner.sessions.config().root;
        let probe = match root.rfind('/') {
            Some(0) | None => "/",
            Some(i) => &root[..i],
        };
        session
            .call(session.client.check_stat(probe))
            .await
            .map(drop)
            .map_err(map_err)
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        _ttl: Duration,
    ) -> Result<Acquire> {
        let inner = &self.inner;
        let entered = match inner.attempt(key, owner, None).await? {
            Ok(granted) => return Ok(Acquire::Acquired(granted)),
            Err(queued) => queued,
        };
        // Not first: leave the queue. A delete the store did not confirm is
        // finished in the background; the answer is still "contended".
        let _ = inner.delete(entered.node).await;
        Ok(Acquire::Contended { retry_after: None })
    }

    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        let node = {
            let mut held = lock(&self.inner.held);
            match held.get_mut(key) {
                Some(h) if h.owner == *owner => {
                    if h.holds > 1 {
                        h.holds -= 1;
                        return Ok(Release::StillHeld(h.holds));
                    }
                    held.remove(key).map(|h| h.node)
                }
                _ => None,
            }
        };
        let Some(node) = node else {
            return Ok(Release::NotHeld);
        };
        Ok(if self.inner.delete(node).await? {
            Release::Freed
        } else {
            Release::NotHeld
        })
    }

    async fn renew(&self, key: &LockKey, owner: &OwnerToken, _ttl: Duration) -> Result<Renew> {
        let node = match lock(&self.inner.held).get(key) {
            Some(h) if h.owner == *owner => h.node.clone(),
            _ => return Ok(Renew::NotHeld),
        };
        if self.inner.confirm(&node).await? {
            return Ok(Renew::Renewed);
        }
        let mut held = lock(&self.inner.held);
        if held.get(key).is_some_and(|h| h.node.path == node.path) {
            held.remove(key);
        }
        Ok(Renew::NotHeld)
    }

    async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        let session = self.inner.sessions.get().await?;
        let dir = self.inner.dir(key);
        let mut children = match session.call(session.client.list_children(&dir)).await {
            Ok(c) => c,
            Err(ZkError::NoNode) => return Ok(LockStatus::free()),
            Err(e) => return Err(map_err(e)),
        };
        layout::sort_queue(&mut children);
        for (i, first) in children.iter().enumerate() {
            let path = format!("{dir}/{first}");
            let stat = match session.call(session.client.check_stat(&path)).await {
                Ok(Some(stat)) => stat,
                // Released while we looked: the next one holds it.
                Ok(None) => continue,
                Err(e) => return Err(map_err(e)),
            };
            let holds = match lock(&self.inner.held).get(key) {
                Some(h) if h.node.path == path => h.holds,
                _ => 1,
            };
            let waiters = u32::try_from(children.len() - i - 1).unwrap_or(u32::MAX);
            return Ok(LockStatus::held(holds)
                .with_fence(Some(fence_of(stat.czxid)))
                .with_waiters(Some(waiters)));
        }
        Ok(LockStatus::free())
    }

    async fn watch(&self, key: &LockKey, ticket: &OwnerToken) -> Result<Option<Watch>> {
        let _ = key;
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut waiters = lock(&self.inner.waiters);
            let w = waiters.entry(ticket.clone()).or_default();
            if let Some(g) = w.granted {
                let _ = tx.send(g);
            }
            w.grants = Some(tx);
        }
        let keepalive = Box::new(WaiterGuard {
            inner: Arc::downgrade(&self.inner),
            ticket: ticket.clone(),
        });
        Ok(Some(Watch::grants(rx, Some(keepalive))))
    }

    async fn try_acquire_waiting(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        _ttl: Duration,
        ticket: &OwnerToken,
    ) -> Result<Acquire> {
        let inner = &self.inner;
        if let Some(answer) = inner.requeued(key, ticket).await? {
            return Ok(answer);
        }
        let entered = match inner.attempt(key, owner, Some(ticket)).await? {
            Ok(granted) => {
                lock(&inner.waiters).remove(ticket);
                return Ok(Acquire::Acquired(granted));
            }
            Err(queued) => queued,
        };
        // Queue: keep the node, and watch only the one just before it.
        let mut waiters = lock(&inner.waiters);
        let w = waiters.entry(ticket.clone()).or_default();
        if let Some(t) = w.task.take() {
            t.abort();
        }
        w.node = Some(entered.node.clone());
        let task = tokio::spawn(wait_turn(
            Arc::downgrade(inner),
            key.clone(),
            owner.clone(),
            ticket.clone(),
            entered,
        ));
        w.task = Some(task.abort_handle());
        Ok(inner.queued())
    }

    async fn abandon(&self, key: &LockKey, owner: &OwnerToken, ticket: &OwnerToken) -> Result<()> {
        let waiter = lock(&self.inner.waiters).remove(ticket);
        if let Some(w) = waiter {
            if let Some(t) = &w.task {
                t.abort();
            }
            if w.granted.is_none() {
                if let Some(node) = w.node {
                    self.inner.delete(node).await?;
                }
                return Ok(());
            }
        }
        // Handed to the ticket already: release that hold (only that one,
        // if the owner has re-entered meanwhile).
        let node = {
            let mut held = lock(&self.inner.held);
            match held.get_mut(key) {
                Some(h) if h.owner == *owner && h.ticket.as_ref() == Some(ticket) => {
                    if h.holds > 1 {
                        h.holds -= 1;
                        h.ticket = None;
                        None
                    } else {
                        held.remove(key).map(|h| h.node)
                    }
                }
                _ => None,
            }
        };
        if let Some(node) = node {
            self.inner.delete(node).await?;
        }
        Ok(())
    }
}

/// Dropped with a waiter's [`Watch`]: a waiter that never got the lock
/// leaves the queue, so a caller that drops its watch leaves no node behind.
struct WaiterGuard {
    inner: Weak<Inner>,
    ticket: OwnerToken,
}

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let Some(w) = lock(&inner.waiters).remove(&self.ticket) else {
            return;
        };
        if w.granted.is_some() {
            return;
        }
        if let Some(t) = &w.task {
            t.abort();
        }
        if let (Some(node), Ok(rt)) = (w.node, tokio::runtime::Handle::try_current()) {
            rt.spawn(delete_surely(node.session, node.path));
        }
    }
}

/// A queued waiter's turn: watch the node just before ours until ours is
/// first, then hand the lock to the waiter. If our node is gone (the
/// session ended), the waiter is marked unqueued and its next attempt
/// queues afresh.
async fn wait_turn(
    inner: Weak<Inner>,
    key: LockKey,
    owner: OwnerToken,
    ticket: OwnerToken,
    entered: Entered,
) {
    let Entered {
        node, name, dir, ..
    } = entered;
    let session = node.session.clone();
    let first = loop {
        let mut children = match session.client.list_children(&dir).await {
            Ok(c) => c,
            Err(e) if is_transient(&e) && session.connected().await => {
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
            Err(_) => break false,
        };
        layout::sort_queue(&mut children);
        let Some(i) = children.iter().position(|c| *c == name) else {
            break false;
        };
        if i == 0 {
            break true;
        }
        let before = format!("{dir}/{}", children[i - 1]);
        #[cfg(feature = "internals")]
        if let Some(inner) = inner.upgrade() {
            if let Some(w) = lock(&inner.waiters).get_mut(&ticket) {
                w.watching = Some(before.clone());
            }
        }
        match session.client.get_and_watch_data(&before).await {
            Ok((_, _, watcher)) => {
                watcher.changed().await;
            }
            Err(ZkError::NoNode) => {}
            Err(e) if is_transient(&e) && session.connected().await => {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Err(_) => break false,
        }
    };
    let Some(inner) = inner.upgrade() else {
        return;
    };
    let mut waiters = lock(&inner.waiters);
    let current = waiters
        .get_mut(&ticket)
        .filter(|w| w.node.as_ref().is_some_and(|n| n.path == node.path));
    let Some(w) = current else {
        // Abandoned meanwhile: the abandon deleted (or deletes) the node.
        return;
    };
    w.task = None;
    // A listing that found us first says nothing of a session that has
    // ended since.
    let first = first && !session.is_over();
    if !first {
        w.node = None;
        drop(waiters);
        if !session.is_over() {
            tokio::spawn(delete_surely(session, node.path));
        }
        return;
    }
    let grant = node.grant(1);
    inner.hold(&key, &owner, node, Some(ticket));
    w.granted = Some(grant);
    if let Some(tx) = &w.grants {
        let _ = tx.send(grant);
    }
}

/// Finishes a create whose answer did not come in time: once it is
/// answered, its node is deleted; if the connection dropped under it, the
/// node (if the server made it) is found by its UUID and deleted.
async fn undo_create(session: Arc<Session>, exchange: Exchange, dir: String, prefix: String) {
    match exchange.await {
        (Ok((_, sequence)), _) => delete_surely(session, format!("{dir}/{prefix}{sequence}")).await,
        (Err(e), _) if is_transient(&e) => find_and_delete(session, dir, prefix).await,
        _ => {}
    }
}

/// After a create that may or may not have happened: finds the node by our
/// UUID prefix *and* our session (never another session's node), and
/// deletes it.
async fn find_and_delete(session: Arc<Session>, dir: String, prefix: String) {
    let mut pause = RETRY_PAUSE;
    loop {
        if !session.connected().await {
            return;
        }
        // The server we reconnected to may lag the one that took the create.
        let found = match session.client.sync(&dir).await {
            Ok(()) => session.client.list_children(&dir).await,
            Err(e) => Err(e),
        };
        match found {
            Ok(children) => {
                for child in children.iter().filter(|c| c.starts_with(&prefix)) {
                    let path = format!("{dir}/{child}");
                    if let Ok(Some(stat)) = session.client.check_stat(&path).await {
                        if stat.ephemeral_owner == session.id {
                            delete_surely(session.clone(), path).await;
                        }
                    }
                }
                return;
            }
            Err(e) if is_transient(&e) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_RETRY_PAUSE);
            }
            Err(_) => return,
        }
    }
}

/// Deletes our node, waiting out disconnections, until it is gone or the
/// session ends (which takes the node with it).
async fn delete_surely(session: Arc<Session>, path: String) {
    let mut pause = RETRY_PAUSE;
    loop {
        if !session.connected().await {
            return;
        }
        match session.client.delete(&path, None).await {
            Ok(()) | Err(ZkError::NoNode) => return,
            Err(e) if is_transient(&e) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_RETRY_PAUSE);
            }
            Err(e) => {
                tracing::warn!(path = %path, error = %e, "could not delete a lock node");
                return;
            }
        }
    }
}
