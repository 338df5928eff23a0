//! [`RedlockBackend`]: one lock over N independent Redis masters.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::join_all;
use locksmith_core::backend::{
    clock_drift, Acquire, Capabilities, Grant, LockBackend, Release, Renew, RenewRequest,
};
use locksmith_core::{Error, ErrorKind, LockKey, LockStatus, OwnerToken, Result};

use crate::config::RedisConfig;
use crate::node::{Node, Role};
use crate::scripts::Keys;

/// Redlock: the lock is held when a quorum (N/2+1) of independent masters
/// granted it within `ttl − elapsed − drift`. A minority of nodes down or
/// held by others changes nothing; a majority down is `Unavailable`, and a
/// failed acquire is undone on every node. No fencing tokens (see the crate
/// docs); waiters poll with backoff rather than subscribe on N nodes.
#[derive(Debug, Clone)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: RedisConfig,
    nodes: Vec<Node>,
    quorum: usize,
}

/// How the nodes answered one request.
struct Tally<T> {
    ok: Vec<T>,
    errors: usize,
    /// The first node that refused our credentials or database.
    refused: Option<Error>,
}

impl RedlockBackend {
    /// Opens a backend for `redis+redlock://h1:p1,h2:p2,h3:p3[?timeout=100ms]`
    /// (the per-node timeout defaults to 100 ms). Connects lazily.
    ///
    /// # Errors
    /// `Config` for a bad URL or fewer than 3 nodes.
    pub fn connect(url: &str) -> Result<Self> {
        let config = RedisConfig::from_url(url)?;
        if !config.redlock {
            return Err(Error::config("RedlockBackend needs a redis+redlock:// URL"));
        }
        let nodes = config
            .nodes
            .iter()
            .map(|u| {
                Node::new(
                    u,
                    config.timeout,
                    config.connect_timeout,
                    &config.tls,
                    Role::Quorum,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let quorum = nodes.len() / 2 + 1;
        Ok(RedlockBackend {
            inner: Arc::new(Inner {
                config,
                nodes,
                quorum,
            }),
        })
    }

    /// The configuration in use (its URLs print without secrets).
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// How many nodes must agree.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    fn keys(&self, key: &LockKey) -> Keys {
        Keys::new(&self.inner.config.prefix, key)
    }

    /// More nodes failed than the quorum can spare: the answer is
    /// unknowable. A node that `refused` our credentials or database will
    /// not do better on a retry, so then it is `Config` with that cause,
    /// not `Unavailable`.
    fn unreachable(&self, errors: usize, refused: Option<&Error>) -> Option<Error> {
        let n = self.inner.nodes.len();
        (errors > n - self.inner.quorum).then(|| {
            let e = Error::unavailable(format!(
                "only {} of {n} Redlock nodes answered; a quorum of {} is needed",
                n - errors,
                self.inner.quorum
            ));
            match refused {
                Some(r) => Error::new(ErrorKind::Config, e.message()).with_source(r.clone()),
                None => e,
            }
        })
    }

    fn tally<T>(results: Vec<Result<T>>) -> Tally<T> {
        let mut t = Tally {
            ok: Vec::new(),
            errors: 0,
            refused: None,
        };
        for r in results {
            match r {
                Ok(v) => t.ok.push(v),
                Err(e) => {
                    if e.kind() != ErrorKind::Unavailable {
                        tracing::warn!(error = %e.chain(), "Redlock node failed");
                    }
                    if e.kind() == ErrorKind::Config && t.refused.is_none() {
                        t.refused = Some(e);
                    }
                    t.errors += 1;
                }
            }
        }
        t
    }
}

#[async_trait]
impl LockBackend for RedlockBackend {
    fn capabilities(&self) -> Capabilities {
        // No fences, no notification, no queue, nothing kept.
        Capabilities::default()
            // A TTL must leave room for a slow round of requests and the drift.
            .with_min_ttl((self.inner.config.timeout * 4).max(Duration::from_millis(100)))
    }

    /// A quorum of nodes must answer; a node that refuses our credentials
    /// is named as the reason when the quorum fails.
    async fn verify(&self) -> Result<()> {
        let answers = join_all(self.inner.nodes.iter().map(|n| n.ping())).await;
        let t = Self::tally(answers);
        match self.unreachable(t.errors, t.refused.as_ref()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire> {
        let keys = self.keys(key);
        let start = Instant::now();
        let answers = join_all(
            self.inner
                .nodes
                .iter()
                .map(|n| n.acquire(&keys, owner, ttl, None)),
        )
        .await;
        let elapsed = start.elapsed();
        let mut grants = Vec::new();
        let mut retry_after: Option<Duration> = None;
        // Nodes that may now hold our key: those that granted, and those that
        // did not answer (their request may still be applied).
        let mut undo = Vec::new();
        let mut errors = 0;
        // A node that refused our credentials or database will not do better
        // on a retry: if the quorum fails for it, say so (Config), not
        // "did not answer" (Unavailable).
        let mut refused: Option<&Error> = None;
        for (node, answer) in self.inner.nodes.iter().zip(&answers) {
            match answer {
                Ok(Acquire::Acquired(g)) => {
                    grants.push(*g);
                    undo.push(node);
                }
                Ok(Acquire::Contended { retry_after: r }) => {
                    retry_after = match (retry_after, *r) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    }
                }
                Err(e) => {
                    if e.kind() == ErrorKind::Config {
                        refused.get_or_insert(e);
                    }
                    errors += 1;
                    undo.push(node);
                }
            }
        }
        let valid = ttl > elapsed + clock_drift(ttl);
        if grants.len() >= self.inner.quorum && valid {
            let holds = grants.iter().map(|g| g.holds).max().unwrap_or(1);
            return Ok(Acquire::Acquired(Grant {
                fence: None,
                holds,
                lease: None,
            }));
        }
        // A node that answered "contended" holds someone else's lock, not
        // ours, so a waiter polling a busy key costs one round, not two. The
        // undo shares each node's connection with the request it undoes, so
        // it cannot overtake it.
        if !undo.is_empty() {
            let _ = join_all(undo.into_iter().map(|n| n.release(&keys, owner))).await;
        }
        if let Some(e) = self.unreachable(errors, refused) {
            return Err(e);
        }
        Ok(Acquire::Contended { retry_after })
    }

    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        let keys = self.keys(key);
        let t =
            Self::tally(join_all(self.inner.nodes.iter().map(|n| n.release(&keys, owner))).await);
        let still: Vec<u32> =
            t.ok.iter()
                .filter_map(|r| match r {
                    Release::StillHeld(n) => Some(*n),
                    _ => None,
                })
                .collect();
        let held = t.ok.iter().filter(|r| **r != Release::NotHeld).count();
        if held >= self.inner.quorum {
            return Ok(if still.len() >= self.inner.quorum {
                Release::StillHeld(still.into_iter().min().unwrap_or(1))
            } else {
                Release::Freed
            });
        }
        if held + t.errors >= self.inner.quorum {
            if let Some(e) = self.unreachable(t.errors, t.refused.as_ref()) {
                return Err(e);
            }
        }
        Ok(Release::NotHeld)
    }

    /// Held when a quorum of nodes holds the key for one owner; the lease
    /// left is what the quorum-th longest of that owner's leases has left
    /// (the lock holds while a quorum does). `Unavailable` when the nodes
    /// that did not answer could make or break that quorum.
    async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        let keys = self.keys(key);
        let answers = join_all(self.inner.nodes.iter().map(|n| n.inspect(&keys))).await;
        let t = Self::tally(answers);
        if let Some(e) = self.unreachable(t.errors, t.refused.as_ref()) {
            return Err(e);
        }
        let quorum = self.inner.quorum;
        let mut by_owner: HashMap<&str, Vec<&LockStatus>> = HashMap::new();
        for (status, owner) in &t.ok {
            if let Some(owner) = owner {
                by_owner.entry(owner.as_str()).or_default().push(status);
            }
        }
        let best = by_owner
            .into_values()
            .max_by_key(Vec::len)
            .unwrap_or_default();
        if best.len() < quorum {
            if best.len() + t.errors >= quorum {
                return Err(Error::unavailable(format!(
                    "{} of {} Redlock nodes did not answer, and with them the lock may \
                     or may not be held",
                    t.errors,
                    self.inner.nodes.len()
                )));
            }
            return Ok(LockStatus::free());
        }
        let mut left: Vec<Duration> = best.iter().filter_map(|s| s.remaining).collect();
        left.sort_unstable_by(|a, b| b.cmp(a));
        let holds = best.iter().map(|s| s.holds).max().unwrap_or(1);
        Ok(LockStatus::held(holds).with_remaining(left.get(quorum - 1).copied()))
    }

    async fn renew(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Renew> {
        let request = RenewRequest {
            key: key.clone(),
            owner: owner.clone(),
            ttl,
        };
        self.renew_many(std::slice::from_ref(&request))
            .await
            .pop()
            .unwrap_or_else(|| Err(Error::backend("no renewal result")))
    }

    async fn renew_many(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        let prefix = &self.inner.config.prefix;
        let start = Instant::now();
        let per_node = join_all(
            self.inner
                .nodes
                .iter()
                .map(|n| n.renew_many(prefix, requests)),
        )
        .await;
        let elapsed = start.elapsed();
        (0..requests.len())
            .map(|i| {
                let mut renewed = 0;
                let mut errors = 0;
                for r in &per_node {
                    match r {
                        Ok(v) if v.get(i) == Some(&true) => renewed += 1,
                        Ok(_) => {}
                        Err(_) => errors += 1,
                    }
                }
                let ttl = requests[i].ttl;
                if renewed >= self.inner.quorum && ttl > elapsed + clock_drift(ttl) {
                    Ok(Renew::Renewed)
                } else if renewed + errors >= self.inner.quorum {
                    // Could still be ours; let the watchdog try again before its deadline.
                    Err(self
                        .unreachable(errors, None)
                        .unwrap_or_else(|| Error::unavailable("Redlock renewal was too slow")))
                } else {
                    Ok(Renew::NotHeld)
                }
            })
            .collect()
    }
}
