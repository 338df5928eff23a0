//! [`RedlockBackend`]: one lock over N independent Redis masters, the
//! generic [`Quorum`] over Redis nodes.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockwright_core::backend::{
    AbortOnDrop, Acquire, AcquireRequest, Capabilities, Changes, HoldId, LockBackend, Quorum,
    Release, Renew, RenewRequest,
};
use lockwright_core::{Error, LockKey, LockStatus, OwnerToken, Result};

use crate::config::RedisConfig;
use crate::layout::{locks_matching, name_of_lock, Keys};
use crate::node::{Node, Role};

/// Redlock: the lock is held when a quorum (N/2+1) of independent masters
/// granted it within `ttl − elapsed − drift`. A minority of nodes down or
/// held by others changes nothing; a majority down is `Unavailable`, and a
/// failed acquire is undone on every node. No fencing tokens (see the crate
/// docs); waiters poll with backoff rather than subscribe on N nodes. An
/// election observer hears every node's announcements and reads the quorum
/// on each. The quorum rules are [`Quorum`]'s, shared with every quorum
/// backend.
#[derive(Debug, Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: RedisConfig,
    quorum: Quorum<QuorumNode>,
}

/// One Redlock master as a lease backend: the single-node scripts without
/// fences, queue or notification, each request within the per-node timeout.
#[derive(Debug)]
pub(crate) struct QuorumNode {
    node: Node,
    prefix: String,
}

// A node, not a wrapper: `watch` and `alarm` keep the trait's defaults (no
// notification, no alarm), and a waiter's ticket is ignored (no queue),
// which is all a node has to say; the quorum answers those itself and
// never asks its nodes. `abandon` takes a writer's mark away. `changes` is the node's own: Redlock merges them.
#[async_trait]
impl LockBackend for QuorumNode {
    fn capabilities(&self) -> Capabilities {
        // The quorum sets the limits; a node adds none of its own. It keeps
        // values, so the quorum does (it keeps them when all nodes do).
        Capabilities::default()
            .with_values(true)
            .with_permits(true)
            .with_shared(true)
            .with_listing(true)
    }

    async fn verify(&self) -> Result<()> {
        self.node.ping().await
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.node
            .acquire(
                &Keys::new(&self.prefix, request.key(), false),
                request,
                None,
            )
            .await
    }

    /// A writer giving up takes its mark away (see `claims.rs`).
    async fn abandon(&self, hold: &HoldId, ticket: &OwnerToken) -> Result<()> {
        self.node
            .abandon(
                &Keys::new(&self.prefix, &hold.key, false),
                &hold.owner,
                ticket,
            )
            .await
    }

    async fn release(&self, hold: &HoldId) -> Result<Release> {
        self.node
            .release(&Keys::new(&self.prefix, &hold.key, false), &hold.owner)
            .await
    }

    /// One script call for every lease on this node.
    async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        match self.node.renew_many(&self.prefix, requests).await {
            Ok(renewed) => renewed
                .into_iter()
                .map(|r| Ok(if r { Renew::Renewed } else { Renew::NotHeld }))
                .collect(),
            Err(e) => requests.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    /// With the holder's owner token, which the quorum groups nodes by, and
    /// its value, which the quorum reports where a quorum of them agree.
    async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        self.node
            .inspect(&Keys::new(&self.prefix, key, false))
            .await
    }

    /// This master's lock keys under the prefix, by `SCAN`.
    async fn list(&self, prefix: &str) -> Result<Vec<LockKey>> {
        let locks = self
            .node
            .scan(&locks_matching(&self.prefix, prefix, false))
            .await?;
        Ok(locks
            .iter()
            .filter_map(|l| name_of_lock(&self.prefix, l, false))
            .collect())
    }

    async fn proclaim(&self, hold: &HoldId, value: &[u8]) -> Result<Renew> {
        let set = self
            .node
            .proclaim(
                &Keys::new(&self.prefix, &hold.key, false),
                &hold.owner,
                value,
            )
            .await?;
        Ok(if set { Renew::Renewed } else { Renew::NotHeld })
    }

    async fn changes(&self, key: &LockKey) -> Result<Option<Changes>> {
        let keys = Keys::new(&self.prefix, key, false);
        Ok(Some(Changes::from(self.node.changes(&keys).await?)))
    }
}

/// One watch that wakes on any node's notice: an observer reads the quorum
/// again on each, so a node that announced a change the quorum does not
/// have yet costs one read. A change is made on at least a quorum of
/// nodes, so it is heard while the watch has `n − quorum + 1` nodes
/// subscribed; it ends (and the observer subscribes again) when fewer are
/// left, and fewer at the start is the first node's error.
async fn merged<B: LockBackend>(quorum: &Quorum<B>, key: &LockKey) -> Result<Option<Changes>> {
    let nodes = quorum.nodes();
    let needed = nodes.len() - quorum.quorum() + 1;
    let answers = futures::future::join_all(nodes.iter().map(|n| n.changes(key))).await;
    let mut parts = Vec::new();
    let mut error = None;
    for answer in answers {
        match answer {
            Ok(Some(w)) => parts.push(w),
            Ok(None) => {}
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }
    if parts.len() < needed {
        return match error {
            Some(e) => Err(e),
            None => Ok(None),
        };
    }
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    let task = tokio::spawn(async move {
        while parts.len() >= needed {
            let (notice, i) = {
                let waits = parts.iter_mut().map(|w| Box::pin(w.notice()));
                let (notice, i, _) = futures::future::select_all(waits).await;
                (notice, i)
            };
            match notice {
                Some(_) => tx.send_modify(|v| *v = v.wrapping_add(1)),
                None => drop(parts.swap_remove(i)),
            }
        }
    });
    // The task that merges the nodes' notices ends when its watch is dropped.
    Ok(Some(Changes::new(
        rx,
        Some(Box::new(AbortOnDrop::new(task.abort_handle()))),
    )))
}

impl RedlockBackend {
    /// Opens a backend for `redis+redlock://h1:p1,h2:p2,h3:p3[?timeout=100ms]`
    /// (the per-node timeout defaults to 100 ms). Connects lazily.
    ///
    /// # Errors
    /// `Config` for a bad URL or fewer than 3 nodes.
    pub fn connect(url: &str) -> Result<Self> {
        let config = RedisConfig::from_url(url)?;
        let quorum = Self::quorum_over(&config, Self::nodes(&config)?)?;
        Ok(RedlockBackend {
            inner: Arc::new(Inner { config, quorum }),
        })
    }

    /// One node per master of a `redis+redlock://` configuration.
    pub(crate) fn nodes(config: &RedisConfig) -> Result<Vec<QuorumNode>> {
        if !config.redlock {
            return Err(Error::config("RedlockBackend needs a redis+redlock:// URL"));
        }
        config
            .nodes
            .iter()
            .map(|u| {
                Ok(QuorumNode {
                    node: Node::new(
                        u,
                        config.timeout,
                        config.connect_timeout,
                        &config.tls,
                        Role::Quorum,
                    )?,
                    prefix: config.prefix.clone(),
                })
            })
            .collect()
    }

    /// Redlock's quorum over `nodes`, with the TTL floor `config` sets.
    pub(crate) fn quorum_over<B: LockBackend>(
        config: &RedisConfig,
        nodes: Vec<B>,
    ) -> Result<Quorum<B>> {
        // A TTL must leave room for a slow round of requests and the drift.
        let min_ttl = (config.timeout * 4).max(Duration::from_millis(100));
        Quorum::new("Redlock", nodes, min_ttl)
    }

    /// The configuration in use (its URLs print without secrets).
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// How many nodes must agree.
    pub fn quorum(&self) -> usize {
        self.inner.quorum.quorum()
    }
}

// Every method is the quorum's, the waiting hooks and the alarm too:
// `Quorum` answers those itself (no notification, queue or alarm across
// independent masters) and says why. But `changes`, which `Quorum` leaves
// unannounced: Redlock knows its nodes announce, and merges them.
lockwright_core::forward_backend! {
    (self) => self.inner.quorum;
    impl LockBackend for RedlockBackend {
        async fn changes(&self, key: &LockKey) -> Result<Option<Changes>> {
            merged(&self.inner.quorum, key).await
        }
    }
}
