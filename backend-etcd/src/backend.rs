//! [`EtcdBackend`]: the [`LockBackend`] over leases and create revisions,
//! in Go's `concurrency.Mutex` layout (see `layout.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use lockwright_core::backend::{
    lock_unpoisoned, refusal, Acquire, AcquireRequest, Binding, Capabilities, Changes, Found,
    Grant, HoldId, LockBackend, Release, Renew, RenewRequest, Watch,
};
use lockwright_core::{Claim, LockKey, LockStatus, OwnerToken, Result};

use crate::attempt::Attempt;
use crate::claims;
use crate::config::EtcdConfig;
use crate::node::Node;
use crate::state::{fence, Hold, Inner};

/// The shortest TTL accepted: the TTL only paces renewals here (the
/// lease, not the TTL, keeps a lock).
const MIN_TTL: Duration = Duration::from_millis(250);

/// Locks in etcd, as Go's `concurrency.Mutex` takes them (see the crate
/// docs). Cheap to clone; every clone shares one client and one lease.
#[derive(Debug, Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

impl EtcdBackend {
    /// Opens a backend for an `etcd://` URL (see [`EtcdConfig::from_url`]).
    /// No connection is made until the first request (or
    /// [`verify`](LockBackend::verify)).
    ///
    /// # Errors
    /// `Config`/`InvalidOptions` for a bad URL.
    pub fn connect(url: &str) -> Result<Self> {
        Ok(Self::with_config(EtcdConfig::from_url(url)?))
    }

    /// Opens a backend from a parsed configuration.
    pub fn with_config(config: EtcdConfig) -> Self {
        EtcdBackend {
            inner: Arc::new(Inner {
                node: Node::new(config),
                held: std::sync::Mutex::new(HashMap::new()),
                waiters: std::sync::Mutex::new(HashMap::new()),
                keys: Arc::new(std::sync::Mutex::new(HashSet::new())),
            }),
        }
    }

    /// The configuration in use (its URL prints without secrets).
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.node.config
    }

    /// The lease of the current session, if one was granted.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub(crate) async fn lease(&self) -> Option<i64> {
        self.inner.node.current().await.map(|s| s.id)
    }
}

impl Inner {
    /// A re-entry: one more hold on a key still ours.
    pub(crate) async fn reenter(&self, asked: &HoldId) -> Result<Option<Grant>> {
        let id = (asked.key.clone(), asked.owner.clone());
        let Some(hold) = lock_unpoisoned(&self.held).get(&id).cloned() else {
            return Ok(None);
        };
        if hold.claim != asked.claim() {
            // The hold is the name's, as far as this owner's claim goes.
            return Err(refusal(&asked.key, asked.claim(), Found::own(hold.claim)));
        }
        if !self.still_ours(&hold).await? {
            self.forget(&id, &hold);
            return Ok(None);
        }
        let mut held = lock_unpoisoned(&self.held);
        let Some(h) = held.get_mut(&id) else {
            return Ok(None);
        };
        h.holds += 1;
        Ok(Some(Grant {
            fence: fence(h.fence),
            holds: h.holds,
            lease: None,
        }))
    }

    /// Whether `hold`'s key still exists, made by this grant on its lease.
    pub(crate) async fn still_ours(&self, hold: &Hold) -> Result<bool> {
        if hold.session.is_dead() {
            return Ok(false);
        }
        // A new guard is trusted for a lease from now: the lease is kept
        // alive in the same round trip (a read or a put does not renew it).
        let (alive, got) =
            futures::join!(hold.session.keep_alive(), self.node.get(&hold.key, None));
        let (alive, got) = (alive?, got?);
        Ok(alive
            && got.kvs().first().is_some_and(|kv| {
                kv.create_revision() == hold.rev && kv.lease() == hold.session.id
            }))
    }

    /// Sets the value `owner`'s key advertises, if it is still the key of
    /// its grant (as Go's `Election.Proclaim`: a put compared on the key's
    /// create revision, on the same lease).
    async fn proclaim(&self, key: &LockKey, owner: &OwnerToken, value: &[u8]) -> Result<Renew> {
        let hold = lock_unpoisoned(&self.held)
            .get(&(key.clone(), owner.clone()))
            .cloned();
        let Some(h) = hold.filter(|h| !h.session.is_dead()) else {
            return Ok(Renew::NotHeld);
        };
        Ok(if h.rewrite(claims::check_value(value)?).await?.is_some() {
            Renew::Renewed
        } else {
            Renew::NotHeld
        })
    }

    /// One attempt, as Go's `Mutex.TryLock`: our key is the first
    /// contender, or goes again at once.
    async fn attempt(&self, request: &AcquireRequest) -> Result<Acquire> {
        let key = request.key();
        if let Some(g) = self.reenter(&request.hold).await? {
            return Ok(Acquire::Acquired(g));
        }
        if let Some(writer) = request.hold.kind.beside() {
            return self.beside(&request.hold, writer).await;
        }
        let prefix = self.prefix(key);
        let (claim, value) = (request.claim(), claims::value_of(request)?);
        // A grant is trusted only while the lease it is on is sure to live,
        // and a put does not renew a lease. A lease confirmed within the
        // last half of its TTL (the background keep-alive confirms it every
        // third) lends the grant what it has left: one request. Otherwise
        // the lease is kept alive beside the attempt (one round trip still),
        // and the grant stands, for a whole lease from the attempt's start,
        // only if that is confirmed on the lease the key went onto.
        let session = self.node.session().await?;
        let left = session.left();
        let lent = (left >= session.ttl / 2).then_some(left);
        let read = claims::line_read(claim);
        let keep_alive = async {
            match lent {
                Some(_) => Ok(true),
                None => session.keep_alive().await,
            }
        };
        let (alive, entered) = futures::join!(keep_alive, self.enter(&prefix, &value, read));
        let (mut attempt, mine, line) = entered?;
        let held = match (mine > 0).then(|| claims::holds(key, claim, mine, &line)) {
            Some(Err(refused)) => {
                attempt.delete().await?;
                return Err(refused);
            }
            held => held.is_some_and(|h| h.unwrap_or(false)),
        };
        if held {
            let same = attempt.session.id == session.id;
            let confirmed = if same {
                alive?
            } else {
                // `enter` took a new lease (the old one was gone).
                attempt.session.keep_alive().await?
            };
            if !confirmed {
                // The lease ended meanwhile, and the key with it.
                return Err(lockwright_core::Error::unavailable(
                    "etcd: the lease ended during the attempt; the next takes a new one",
                ));
            }
            attempt.kept = true;
            let (name, held_on) = (attempt.key.clone(), attempt.session.clone());
            let mut grant = self.hold(&request.hold, name, mine, held_on);
            grant.lease = if same { lent } else { None };
            return Ok(Acquire::Acquired(grant));
        }
        attempt.delete().await?;
        Ok(Acquire::Contended { retry_after: None })
    }

    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        let id = (key.clone(), owner.clone());
        let hold = {
            let mut held = lock_unpoisoned(&self.held);
            let Some(h) = held.get_mut(&id) else {
                return Ok(Release::NotHeld);
            };
            if h.holds > 1 && !h.session.is_dead() {
                h.holds -= 1;
                return Ok(Release::StillHeld(h.holds));
            }
            held.remove(&id).expect("found above")
        };
        // A downgrade's two holds share one key: the reader's goes alone,
        // and the writer's leaves the key to the reader, rewritten as a
        // reader's in its place in line.
        let beside = lock_unpoisoned(&self.held)
            .values()
            .find(|h| h.key == hold.key && h.rev == hold.rev)
            .map(|h| h.claim);
        match beside {
            Some(Claim::Shared) if !hold.claim.is_shared() => {
                return self.leave_to_reader(&hold).await
            }
            Some(_) => return Ok(Release::Freed),
            None => {}
        }
        // From here the hold is gone from this backend whatever the answer:
        // an attempt that fails deletes the key in the background.
        let mut attempt = Attempt {
            keys: self.keys.clone(),
            key: hold.key.clone(),
            session: hold.session.clone(),
            sent: true,
            kept: false,
        };
        let txn = Txn::new()
            .when([Compare::create_revision(
                hold.key.as_str(),
                CompareOp::Equal,
                hold.rev,
            )])
            .and_then([TxnOp::delete(hold.key.as_str(), None)]);
        let resp = hold.session.txn(txn).await?;
        attempt.sent = false;
        Ok(if resp.succeeded() {
            Release::Freed
        } else {
            Release::NotHeld
        })
    }
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_fencing(true)
            .with_binding(Binding::Session)
            .with_min_ttl(MIN_TTL)
            .with_max_lease(Some(self.inner.node.config.lease_ttl))
            .with_notify(true)
            .with_fair(true)
            .with_values(true)
            .with_permits(true)
            .with_shared(true)
            .with_listing(true)
    }

    /// Connects, and reads one key: the cluster answers and takes the
    /// credentials.
    async fn verify(&self) -> Result<()> {
        // A count of the keys under the root (where a role scoped to our
        // prefix may read), or of all keys for the top of the keyspace.
        let node = &self.inner.node;
        let root = &node.config.root;
        let opts = GetOptions::new().with_count_only().with_limit(1);
        if root.is_empty() {
            node.get("\0", Some(opts.with_from_key())).await.map(drop)
        } else {
            node.get(&format!("{root}/"), Some(opts.with_prefix()))
                .await
                .map(drop)
        }
    }

    /// A single attempt; or, for a waiter (`request.ticket`), an attempt
    /// that keeps its place in line when refused (see `queue.rs`).
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        match &request.ticket {
            None => self.inner.attempt(request).await,
            Some(ticket) => self.inner.attempt_in_line(request, ticket).await,
        }
    }

    async fn release(&self, hold: &HoldId) -> Result<Release> {
        self.inner.release(&hold.key, &hold.owner).await
    }

    /// A waiter's wake-ups: each delete of the key just before its own.
    async fn watch(&self, key: &LockKey, ticket: &OwnerToken) -> Result<Option<Watch>> {
        let _ = key;
        Ok(Some(self.inner.subscribe(ticket)))
    }

    /// The waiter's key leaves the line.
    async fn abandon(&self, hold: &HoldId, ticket: &OwnerToken) -> Result<()> {
        let _ = hold;
        self.inner.give_up(ticket).await
    }

    async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        self.inner.renew_many(requests).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        self.inner.inspect(key).await
    }

    async fn proclaim(&self, hold: &HoldId, value: &[u8]) -> Result<Renew> {
        self.inner.proclaim(&hold.key, &hold.owner, value).await
    }

    /// Every change of the name's contenders (see `observe.rs`).
    async fn changes(&self, key: &LockKey) -> Result<Option<Changes>> {
        Ok(Some(Changes::from(self.inner.changes(key).await?)))
    }

    /// The contenders' names, from one range read (see `status.rs`).
    async fn list(&self, prefix: &str) -> Result<Vec<LockKey>> {
        self.inner.list(prefix).await
    }

    /// Deletes the holder's key (see `status.rs`).
    async fn force_release(&self, key: &LockKey, holder: &str) -> Result<bool> {
        self.inner.force_release(key, holder).await
    }
}
