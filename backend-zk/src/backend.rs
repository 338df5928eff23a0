//! [`ZkBackend`]: the [`LockBackend`] over ephemeral sequential nodes.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockwright_core::backend::{
    lock_unpoisoned, Acquire, AcquireRequest, Binding, Capabilities, Changes, Grant, HoldId,
    LockBackend, Release, Renew, RenewRequest, Watch,
};
use lockwright_core::{LockKey, LockStatus, OwnerToken, Result};
use tokio::sync::mpsc;
use zookeeper_client::Error as ZkError;

use crate::claims::changed_claim;
use crate::cleanup::{self, find_and_delete};
use crate::config::ZkConfig;
use crate::error::map_err;
use crate::layout::{self, Role};
use crate::node::fence_of;
use crate::observe;
use crate::queue::{wait_turn, WaiterGuard};
use crate::state::{Entered, Inner};

/// The shortest TTL accepted: the TTL only paces renewals here (the
/// session, not the TTL, keeps a lock), and checks faster than this
/// would load the ensemble for nothing.
pub(crate) const MIN_TTL: Duration = Duration::from_millis(250);

/// Locks in ZooKeeper, as Curator's `InterProcessMutex` takes them (see the
/// crate docs). Cheap to clone; every clone shares one session.
#[derive(Debug, Clone)]
pub struct ZkBackend {
    inner: Arc<Inner>,
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
            inner: Arc::new(Inner::new(config)),
        }
    }

    /// The configuration in use (its URL prints without secrets).
    pub fn config(&self) -> &ZkConfig {
        self.inner.sessions.config()
    }

    /// The nodes this backend's queued waiters watch, for tests.
    #[cfg(feature = "internals")]
    pub(crate) fn watched(&self) -> Vec<String> {
        lock_unpoisoned(&self.inner.waiters)
            .values()
            .filter_map(|w| w.watching.clone())
            .collect()
    }

    /// The current session's credentials, for tests that end it from outside.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub(crate) async fn session_info(&self) -> Option<zookeeper_client::SessionInfo> {
        self.inner
            .sessions
            .peek()
            .await
            .map(|s| s.client.session().clone())
    }

    /// An attempt by a caller prepared to wait as `ticket`: the grant it
    /// was handed, or a new attempt whose node, if not first, stays in the
    /// queue and is handed the lock by a notice.
    async fn try_waiting(&self, request: &AcquireRequest, ticket: &OwnerToken) -> Result<Acquire> {
        let inner = &self.inner;
        if let Some(answer) = inner.requeued(request.key(), ticket).await? {
            return Ok(answer);
        }
        let entered = match inner.attempt(request).await? {
            Ok(granted) => {
                lock_unpoisoned(&inner.waiters).remove(ticket);
                return Ok(Acquire::Acquired(granted));
            }
            Err(queued) => queued,
        };
        // Queue: keep the node, and watch only the one just before it.
        let mut waiters = lock_unpoisoned(&inner.waiters);
        let w = waiters.entry(ticket.clone()).or_default();
        if let Some(t) = w.task.take() {
            t.abort();
        }
        w.node = Some(entered.node.clone());
        w.lease = entered
            .lease
            .as_ref()
            .and_then(|l| l.path.rsplit_once('/'))
            .map(|(dir, name)| (dir.to_owned(), name.to_owned()));
        let task = tokio::spawn(wait_turn(
            Arc::downgrade(inner),
            request.hold.clone(),
            ticket.clone(),
            entered,
        ));
        w.task = Some(task.abort_handle());
        Ok(inner.queued())
    }

    /// Confirms one hold's node: still there, and its live session's.
    async fn renew_hold(&self, request: &RenewRequest) -> Result<Renew> {
        let key = request.key();
        let Some(node) = self.inner.held_node(key, request.owner()) else {
            return Ok(Renew::NotHeld);
        };
        if node.confirm().await? {
            return Ok(Renew::Renewed);
        }
        self.inner.forget(key, &node.path);
        Ok(Renew::NotHeld)
    }
}

impl Inner {
    /// One attempt: re-entry, or a new node that is first in the queue
    /// (the hold recorded under the request's `ticket`, so that an abandon,
    /// when the caller cancelled while this answer was on its way,
    /// releases it); or the node that queued behind someone else.
    async fn attempt(
        &self,
        request: &AcquireRequest,
    ) -> Result<std::result::Result<Grant, Entered>> {
        let (key, hold, ticket) = (request.key(), &request.hold, request.ticket.as_ref());
        if let Some(granted) = self.reenter(hold).await? {
            return Ok(Ok(granted));
        }
        let session = self.sessions.get().await?;
        let role = Role::of(&hold.kind);
        if let Role::Lease(n) = role {
            if let Some(grant) = self.permit_at_once(&session, hold, n, ticket).await? {
                return Ok(Ok(grant));
            }
        }
        let entered = self.enter(&session, request, role).await?;
        if entered.sem {
            let held = self
                .semaphore_held(&session, &entered.key_dir, key, role)
                .await;
            let refused = match held {
                Ok(None) => None,
                Ok(Some(e)) | Err(e) => Some(e),
            };
            if let Some(e) = refused {
                entered.leave().await;
                return Err(e);
            }
        }
        if !entered.first {
            return Ok(Err(entered));
        }
        if let Role::Lease(n) = role {
            return self.first_lease(hold, n, entered, ticket).await;
        }
        let grant = entered.node.grant(1);
        self.hold(hold, entered.node, ticket.cloned());
        Ok(Ok(grant))
    }

    /// Re-entry: `hold.owner` already holds `hold.key` here, on a node that
    /// is still its own. `None` to acquire afresh.
    async fn reenter(&self, hold: &HoldId) -> Result<Option<Grant>> {
        let id = (hold.key.clone(), hold.owner.clone());
        let node = match lock_unpoisoned(&self.held).get(&id) {
            Some(h) => {
                if let Some(e) = changed_claim(&hold.key, h.role, Role::of(&hold.kind)) {
                    return Err(e);
                }
                h.node.clone()
            }
            None => return Ok(None),
        };
        let ours = node.confirm().await?;
        let mut held = lock_unpoisoned(&self.held);
        match held.get_mut(&id) {
            Some(h) if h.node.path == node.path => {
                if ours {
                    h.holds += 1;
                    return Ok(Some(h.node.grant(h.holds)));
                }
                held.remove(&id);
                Ok(None)
            }
            _ => Ok(None),
        }
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
            .with_values(true)
            .with_permits(true)
            .with_shared(true)
            .with_listing(true)
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

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let inner = &self.inner;
        if let Some(writer) = request.hold.kind.beside() {
            return inner.beside(&request.hold, writer).await;
        }
        if let Some(ticket) = &request.ticket {
            return self.try_waiting(request, ticket).await;
        }
        let entered = match inner.attempt(request).await? {
            Ok(granted) => return Ok(Acquire::Acquired(granted)),
            Err(queued) => queued,
        };
        // Not first: leave the queue. A delete the store did not confirm is
        // finished in the background; the answer is still "contended".
        entered.leave().await;
        Ok(Acquire::Contended { retry_after: None })
    }

    async fn release(&self, hold: &HoldId) -> Result<Release> {
        let node = {
            let id = (hold.key.clone(), hold.owner.clone());
            let mut held = lock_unpoisoned(&self.inner.held);
            match held.get_mut(&id) {
                Some(h) => {
                    if h.holds > 1 {
                        h.holds -= 1;
                        return Ok(Release::StillHeld(h.holds));
                    }
                    held.remove(&id).map(|h| h.node)
                }
                None => None,
            }
        };
        let Some(node) = node else {
            return Ok(Release::NotHeld);
        };
        Ok(if cleanup::delete(node).await? {
            Release::Freed
        } else {
            Release::NotHeld
        })
    }

    async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        futures::future::join_all(requests.iter().map(|r| self.renew_hold(r))).await
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
        if let Some(group) = self.inner.group_status(&session, &dir, &children).await? {
            return Ok(group);
        }
        for (i, first) in children.iter().enumerate() {
            if !layout::is_contender(first) {
                continue;
            }
            let path = format!("{dir}/{first}");
            let (data, stat) = match session.call(session.client.get_data(&path)).await {
                Ok(read) => read,
                // Released while we looked: the next one holds it.
                Err(ZkError::NoNode) => continue,
                Err(e) => return Err(map_err(e)),
            };
            let holds = lock_unpoisoned(&self.inner.held)
                .iter()
                .find(|((k, _), h)| k == key && h.node.path == path)
                .map_or(1, |(_, h)| h.holds);
            let behind = children[i + 1..].iter().filter(|c| layout::is_contender(c));
            let waiters = u32::try_from(behind.count()).unwrap_or(u32::MAX);
            // No owner token: only this process's holds have one to give,
            // and the fence (the node's czxid) tells reigns apart as well.
            return Ok(LockStatus::held(holds)
                .with_tag(layout::tag_of(first))
                .with_id(Some(first.clone()))
                .with_fence(Some(fence_of(stat.czxid)))
                .with_waiters(Some(waiters))
                .with_value(layout::value_of(first, data)));
        }
        Ok(LockStatus::free())
    }

    /// Sets the data of the owner's node, which holds the lock: only while
    /// that node is still its live session's and first in the queue.
    async fn proclaim(&self, hold: &HoldId, value: &[u8]) -> Result<Renew> {
        let Some(node) = self.inner.held_node(&hold.key, &hold.owner) else {
            return Ok(Renew::NotHeld);
        };
        if node.set_value(value).await? {
            return Ok(Renew::Renewed);
        }
        Ok(Renew::NotHeld)
    }

    /// Watches on the lock's directory and its first node (see `observe.rs`).
    async fn changes(&self, key: &LockKey) -> Result<Option<Changes>> {
        Ok(Some(observe::changes(&self.inner, key).await?))
    }

    async fn watch(&self, key: &LockKey, ticket: &OwnerToken) -> Result<Option<Watch>> {
        let _ = key;
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut waiters = lock_unpoisoned(&self.inner.waiters);
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

    /// The key directories under the root, by name. A key whose escape is
    /// over 255 bytes has a hashed directory, which cannot be turned back
    /// into its name: it is left out.
    async fn list(&self, prefix: &str) -> Result<Vec<LockKey>> {
        let session = self.inner.sessions.get().await?;
        let root = self.inner.sessions.config().root.clone();
        let path = if root.is_empty() { "/" } else { root.as_str() };
        let children = match session.call(session.client.list_children(path)).await {
            Ok(c) => c,
            Err(ZkError::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(map_err(e)),
        };
        Ok(children
            .iter()
            .filter_map(|c| layout::key_of(c))
            .filter(|k| k.starts_with(prefix))
            .filter_map(|k| LockKey::new(k).ok())
            .collect())
    }

    /// Deletes the holder's node, named by the id `inspect` lists it with
    /// (only a listed holder's, so no other node can be named): a lock's
    /// node in the key's directory, or a semaphore's lease in `leases/`.
    /// Its session's next check finds it gone; a node queued behind it is
    /// newer, so its fence (czxid) is higher. (A downgrade's read node is
    /// made at the downgrade, above a writer queued before it: see the
    /// crate docs.) A Curator holder never checks again, as with zkCli's
    /// `delete`.
    async fn force_release(&self, key: &LockKey, holder: &str) -> Result<bool> {
        if self.inspect(key).await?.holder(holder).is_none() {
            return Ok(false);
        }
        let dir = self.inner.dir(key);
        let session = self.inner.sessions.get().await?;
        // The name says nothing sure of where it is (a foreign node may be
        // named anything): the lock's directory, then the leases'.
        for path in [
            format!("{dir}/{holder}"),
            format!("{dir}/{}/{holder}", layout::SEM_LEASES),
        ] {
            match session.call(session.client.delete(&path, None)).await {
                Ok(()) => {
                    self.inner.forget(key, &path);
                    return Ok(true);
                }
                Err(ZkError::NoNode) => continue,
                Err(e) => return Err(map_err(e)),
            }
        }
        Ok(false)
    }

    async fn abandon(&self, hold: &HoldId, ticket: &OwnerToken) -> Result<()> {
        let waiter = lock_unpoisoned(&self.inner.waiters).remove(ticket);
        if let Some(w) = waiter {
            if let Some(t) = &w.task {
                t.abort();
            }
            if w.granted.is_none() {
                if let Some(node) = w.node {
                    if let Some((dir, prefix)) = w.lease {
                        tokio::spawn(find_and_delete(node.session.clone(), dir, prefix));
                    }
                    cleanup::delete(node).await?;
                }
                return Ok(());
            }
        }
        // Handed to the ticket already: release that hold (only that one,
        // if the owner has re-entered meanwhile).
        let node = {
            let id = (hold.key.clone(), hold.owner.clone());
            let mut held = lock_unpoisoned(&self.inner.held);
            match held.get_mut(&id) {
                Some(h) if h.ticket.as_ref() == Some(ticket) => {
                    if h.holds > 1 {
                        h.holds -= 1;
                        h.ticket = None;
                        None
                    } else {
                        held.remove(&id).map(|h| h.node)
                    }
                }
                _ => None,
            }
        };
        if let Some(node) = node {
            cleanup::delete(node).await?;
        }
        Ok(())
    }
}
