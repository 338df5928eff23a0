//! [`RedisBackend`]: locks on one Redis server.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockwright_core::backend::{
    Acquire, AcquireRequest, Capabilities, Changes, HoldId, LockBackend, Release, Renew,
    RenewRequest, Watch,
};
use lockwright_core::{Error, LockKey, LockStatus, OwnerToken, Result};

use crate::config::RedisConfig;
use crate::layout::{locks_matching, name_of_lock, Keys};
use crate::node::{Node, Role, Waiter};

/// A waiter's place is kept this many refresh periods without a refresh, so
/// one late or lost refresh does not cost it.
const WAITER_LIVENESS_REFRESHES: u32 = 4;

/// Locks on a single Redis server (or a primary with replicas: note that a
/// failover can lose a lock the old primary had not replicated; Redlock over
/// independent nodes is the answer to that). Cheap to clone; clones share
/// the connection and the pub/sub subscription.
#[derive(Debug, Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: RedisConfig,
    node: Node,
}

impl RedisBackend {
    /// Opens a backend for `redis://…`, `rediss://…`, `redis+unix://…`,
    /// `redis+sentinel://…`, `rediss+sentinel://…`, `redis+cluster://…` or
    /// `rediss+cluster://…`.
    /// Connects lazily: a server that is down shows up as `Unavailable` on
    /// first use.
    ///
    /// # Errors
    /// `Config` for a bad URL, a TLS file that cannot be read or holds no
    /// usable PEM, or a Redlock URL (use [`RedlockBackend`](crate::RedlockBackend)).
    pub fn connect(url: &str) -> Result<Self> {
        let config = RedisConfig::from_url(url)?;
        if config.redlock {
            return Err(Error::config(
                "a redis+redlock:// URL needs RedlockBackend (or lockwright::connect)",
            ));
        }
        // The data nodes' replies may wait for the replicas too.
        let answer_within = config.timeout + config.replicas_timeout;
        // Under Sentinel and on a Cluster, one set of files for every
        // connection the backend makes, read once here (the one server of
        // `rediss://` reads its own).
        let topology = config.sentinel.is_some() || !config.cluster.is_empty();
        let certs = if config.secure && topology {
            Some(crate::tls::certificates(&config.tls, &config.nodes[0])?)
        } else {
            None
        };
        let node = match &config.sentinel {
            Some(s) => Node::sentinel(
                &config.nodes[0],
                s.clone(),
                certs,
                answer_within,
                config.connect_timeout,
            ),
            None if !config.cluster.is_empty() => Node::cluster(
                &config.nodes[0],
                &config.cluster,
                certs.as_ref(),
                answer_within,
                config.connect_timeout,
                config.waiter_refresh,
            )?,
            None => Node::new(
                &config.nodes[0],
                config.timeout,
                config.connect_timeout,
                &config.tls,
                Role::Single,
            )?,
        }
        .with_replicas(config.replicas, config.replicas_timeout);
        Ok(RedisBackend {
            inner: Arc::new(Inner { config, node }),
        })
    }

    /// The configuration in use (its URL prints without secrets).
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub(crate) fn node(&self) -> &Node {
        &self.inner.node
    }

    fn keys(&self, key: &LockKey) -> Keys {
        Keys::new(&self.inner.config.prefix, key, self.inner.node.is_cluster())
    }
}

#[async_trait]
impl LockBackend for RedisBackend {
    fn capabilities(&self) -> Capabilities {
        // Lease-bound, 1 ms resolution, and nothing kept once a lock is free.
        Capabilities::default()
            .with_fencing(true)
            // Renewed every third of it, a lease must outlast a round trip
            // and a scheduling delay on a loaded host, not just Redis's 1 ms
            // clock: a floor of a few hundred milliseconds, as on SQL, leaves
            // a late renewal room for both.
            .with_min_ttl(Duration::from_millis(250))
            .with_notify(true)
            .with_fair(true)
            .with_values(true)
            .with_permits(true)
            .with_shared(true)
            .with_listing(true)
    }

    async fn verify(&self) -> Result<()> {
        self.inner.node.ping().await
    }

    async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        self.inner.node.inspect(&self.keys(key)).await
    }

    /// The lock keys under the prefix, by `SCAN` (each primary of a
    /// Cluster), turned back into names.
    async fn list(&self, prefix: &str) -> Result<Vec<LockKey>> {
        let (ns, cluster) = (&self.inner.config.prefix, self.inner.node.is_cluster());
        let locks = self
            .inner
            .node
            .scan(&locks_matching(ns, prefix, cluster))
            .await?;
        Ok(locks
            .iter()
            .filter_map(|l| name_of_lock(ns, l, cluster))
            .collect())
    }

    async fn proclaim(&self, hold: &HoldId, value: &[u8]) -> Result<Renew> {
        let set = self
            .inner
            .node
            .proclaim(&self.keys(&hold.key), &hold.owner, value)
            .await?;
        Ok(if set { Renew::Renewed } else { Renew::NotHeld })
    }

    /// A request with a ticket queues it when the key is held.
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let keys = self.keys(request.key());
        let Some(ticket) = &request.ticket else {
            return self.inner.node.acquire(&keys, request, None).await;
        };
        let refresh = self.inner.config.waiter_refresh;
        let waiter = Waiter {
            ticket,
            liveness: refresh.saturating_mul(WAITER_LIVENESS_REFRESHES),
        };
        let outcome = self
            .inner
            .node
            .acquire(&keys, request, Some(waiter))
            .await?;
        // Wake to refresh the place in the queue before it lapses.
        Ok(match outcome {
            Acquire::Contended { retry_after } => Acquire::Contended {
                retry_after: Some(retry_after.map_or(refresh, |r| r.min(refresh))),
            },
            granted => granted,
        })
    }

    async fn abandon(&self, hold: &HoldId, ticket: &OwnerToken) -> Result<()> {
        self.inner
            .node
            .abandon(&self.keys(&hold.key), &hold.owner, ticket)
            .await
    }

    async fn release(&self, hold: &HoldId) -> Result<Release> {
        self.inner
            .node
            .release(&self.keys(&hold.key), &hold.owner)
            .await
    }

    async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        match self
            .inner
            .node
            .renew_many(&self.inner.config.prefix, requests)
            .await
        {
            Ok(out) => out
                .into_iter()
                .map(|ok| Ok(if ok { Renew::Renewed } else { Renew::NotHeld }))
                .collect(),
            Err(e) => requests.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    /// The lock's channel, on which the scripts announce each change of a
    /// lock that carries a value (a plain lock's go unannounced, and cost
    /// nothing).
    async fn changes(&self, key: &LockKey) -> Result<Option<Changes>> {
        Ok(Some(Changes::from(
            self.inner.node.changes(&self.keys(key)).await?,
        )))
    }

    async fn watch(&self, key: &LockKey, ticket: &OwnerToken) -> Result<Option<Watch>> {
        Ok(Some(self.inner.node.watch(&self.keys(key), ticket).await?))
    }

    /// Raised when the pub/sub connection, kept up from the first grant or
    /// wait on, ends or is made again: a Redis without persistence comes back from
    /// a restart empty, and every lease is re-verified at once rather than
    /// at its next renewal.
    fn alarm(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner.node.alarm()
    }
}
