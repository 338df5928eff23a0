//! One client of the cluster, and the lease this backend keeps its keys
//! on (its session, as Go's `concurrency.Session`): granted on first use,
//! kept alive in the background every third of its TTL, and replaced by a
//! new one once the cluster says it is gone.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, LeaseKeepAliveStream, LeaseKeeper};
use locksmith_core::{Error, Result};
use tokio::sync::{Mutex, OnceCell};

use crate::config::EtcdConfig;
use crate::error::map_err;

/// The client, made on first use, and the current session.
pub(crate) struct Node {
    pub(crate) config: EtcdConfig,
    client: OnceCell<Client>,
    session: Mutex<Option<Arc<Session>>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A lease and its keep-alive stream. Dead once the cluster answered that
/// it has no such lease (expired or revoked): its keys are gone with it.
pub(crate) struct Session {
    /// The lease's id.
    pub(crate) id: i64,
    client: Client,
    stream: Mutex<Option<(LeaseKeeper, LeaseKeepAliveStream)>>,
    dead: AtomicBool,
    timeout: Duration,
    task: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

impl Node {
    pub(crate) fn new(config: EtcdConfig) -> Self {
        Node {
            config,
            client: OnceCell::new(),
            session: Mutex::new(None),
        }
    }

    /// `f` within the request timeout: a cluster slower than that (or out
    /// of reach) is `Unavailable`.
    pub(crate) async fn bounded<T>(
        &self,
        f: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        within(self.config.timeout, f).await
    }

    /// The client, connected on first use (a refused password shows here).
    pub(crate) async fn client(&self) -> Result<Client> {
        let c = &self.config;
        let limit = c.connect_timeout * 2 + c.timeout;
        let made = self.client.get_or_try_init(|| async {
            let mut opts = ConnectOptions::new()
                .with_timeout(c.timeout)
                .with_connect_timeout(c.connect_timeout)
                .with_keep_alive(
                    Duration::from_secs(2),
                    c.timeout.max(Duration::from_secs(1)),
                );
            if let Some((user, password)) = &c.auth {
                opts = opts.with_user(user.clone(), password.clone());
            }
            within(limit, Client::connect(&c.endpoints, Some(opts))).await
        });
        Ok(made.await?.clone())
    }

    /// The live session, or a new one: a lease of the configured TTL, kept
    /// alive in the background.
    pub(crate) async fn session(&self) -> Result<Arc<Session>> {
        let mut slot = self.session.lock().await;
        if let Some(s) = slot.as_ref().filter(|s| !s.is_dead()) {
            return Ok(s.clone());
        }
        let mut client = self.client().await?;
        let ttl = i64::try_from(self.config.lease_ttl.as_secs()).unwrap_or(i64::MAX);
        let granted = self.bounded(client.lease_grant(ttl, None)).await?;
        let session = Arc::new(Session {
            id: granted.id(),
            client,
            stream: Mutex::new(None),
            dead: AtomicBool::new(false),
            timeout: self.config.timeout,
            task: std::sync::Mutex::new(None),
        });
        let period = self.config.lease_ttl / 3;
        let task = tokio::spawn(keep_alive(Arc::downgrade(&session), period));
        *lock(&session.task) = Some(task.abort_handle());
        if let Some(old) = slot.replace(session.clone()) {
            old.mark_dead();
        }
        Ok(session)
    }

    /// The current session, live or not, without making one.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub(crate) async fn current(&self) -> Option<Arc<Session>> {
        self.session.lock().await.clone()
    }
}

/// Renews `session`'s lease every `period` while anyone holds the session,
/// sooner again after a failure; ends when it is dead or dropped.
async fn keep_alive(session: Weak<Session>, period: Duration) {
    let mut pause = period;
    loop {
        tokio::time::sleep(pause).await;
        let Some(s) = session.upgrade() else { return };
        pause = match s.keep_alive().await {
            Ok(true) => period,
            Ok(false) => return,
            Err(e) => {
                tracing::debug!(lease = s.id, error = %e.chain(), "etcd keep-alive failed; trying again");
                period.min(Duration::from_millis(500))
            }
        };
    }
}

impl Session {
    /// Whether the cluster said the lease is gone.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Marks the lease gone: every hold on it is lost, and the next
    /// acquire grants a new one.
    pub(crate) fn mark_dead(&self) {
        self.dead.store(true, Ordering::Release);
        if let Some(task) = lock(&self.task).take() {
            task.abort();
        }
    }

    /// One keep-alive round trip: `true` when the cluster renewed the
    /// lease to its full TTL (from some moment after this call began),
    /// `false` when it has no such lease any more.
    pub(crate) async fn keep_alive(&self) -> Result<bool> {
        if self.is_dead() {
            return Ok(false);
        }
        let mut slot = self.stream.lock().await;
        let answer = within(self.timeout, async {
            if slot.is_none() {
                let mut client = self.client.clone();
                *slot = Some(client.lease_keep_alive(self.id).await?);
            }
            let (keeper, stream) = slot.as_mut().expect("opened above");
            keeper.keep_alive().await?;
            stream.message().await
        })
        .await;
        match answer {
            Ok(Some(r)) if r.ttl() > 0 => Ok(true),
            Ok(Some(_)) => {
                self.mark_dead();
                Ok(false)
            }
            // Opening the stream asks once too, and takes a gone lease's
            // answer for an error.
            Err(e) if lease_gone(&e) => {
                *slot = None;
                self.mark_dead();
                Ok(false)
            }
            Ok(None) | Err(_) => {
                // A stream that ended or failed mid-request may still carry an
                // answer to an older request: never read one as this one's.
                *slot = None;
                match answer {
                    Err(e) => Err(e),
                    _ => Err(Error::unavailable(
                        "etcd: the lease keep-alive stream ended",
                    )),
                }
            }
        }
    }

    /// A key-value client of the session's connection.
    pub(crate) fn kv(&self) -> etcd_client::KvClient {
        self.client.kv_client()
    }

    /// How long one request may wait for its answer.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.timeout
    }

    /// Revokes the lease (its keys go at once), in the background.
    pub(crate) fn revoke_later(&self) {
        self.mark_dead();
        let (mut client, id, timeout) = (self.client.clone(), self.id, self.timeout);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = within(timeout, client.lease_revoke(id)).await;
            });
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // As Go's Session.Close: the keys of a backend nobody uses go now,
        // not a lease TTL later.
        if let Some(s) = self.session.get_mut().take() {
            s.revoke_later();
        }
    }
}

/// `f` within `limit`, its error mapped; a timeout is `Unavailable`.
pub(crate) async fn within<T>(
    limit: Duration,
    f: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
) -> Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(map_err),
        Err(_) => Err(Error::unavailable(format!(
            "etcd did not answer within {limit:?}"
        ))),
    }
}

/// The cluster's answer (or the client's word for it) to a request on a
/// lease it no longer has: expired or revoked.
pub(crate) fn lease_gone(e: &Error) -> bool {
    e.chain().contains("lease not found")
}

pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
