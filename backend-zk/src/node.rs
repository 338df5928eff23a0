//! Our connection to the ensemble: one ZooKeeper session at a time, made
//! when first needed, replaced (never in a loop) only once the server has
//! ended it, and never mistaken for the one before it; and our contender
//! nodes, each tied to the session that created it.
//!
//! What the `zookeeper-client` crate does that shapes this file:
//! - A session that ended (`Expired`, `AuthFailed`, `Closed`) is final for
//!   its `Client`, whose every later request fails: a new session is a new
//!   `Client`, made by the next request that needs one.
//! - While disconnected, requests in flight fail with `ConnectionLoss` and
//!   new ones wait for the client to reconnect, which it does on its own,
//!   with backoff. Such a wait could last until the session ends, so each
//!   request is bounded by the request timeout ([`Session::call`]).
//! - A create answers with the node's `Stat` (ZooKeeper's `Create2`), so
//!   its `czxid`, the fence, and its `ephemeralOwner` cost no extra round
//!   trip.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockwright_core::backend::Grant;
use lockwright_core::{Error, FencingToken, Result};
use zookeeper_client::{
    Acl, Acls, AuthId, Client, CreateSequence, Error as ZkError, Permission, SessionState, Stat,
};

use crate::config::ZkConfig;
use crate::error::{is_session_over, map_err};
use crate::layout;

/// A live session and the client that carries it. Every node a hold or a
/// waiter created remembers its session, so that a node of an ended
/// session is never taken for one of the current session (CURATOR-604).
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) client: Client,
    /// The server's id of this session: an ephemeral node's `ephemeralOwner`.
    pub(crate) id: i64,
    /// How long a request may wait for its answer.
    timeout: Duration,
}

impl Session {
    /// Ended for good on the server's side, or closed: nothing it created lives.
    pub(crate) fn is_over(&self) -> bool {
        is_terminal(self.client.state())
    }

    /// `fut`, a request of this session, within the request timeout (a
    /// request that outlasts it is the client's `Timeout`).
    pub(crate) async fn call<T>(
        &self,
        fut: impl Future<Output = std::result::Result<T, ZkError>>,
    ) -> std::result::Result<T, ZkError> {
        tokio::time::timeout(self.timeout, fut)
            .await
            .unwrap_or(Err(ZkError::Timeout))
    }

    /// Waits until the session is connected again (`true`) or over
    /// (`false`). The client reconnects with backoff on its own, and
    /// declares the session expired after a while out of touch, so this
    /// ends without polling.
    pub(crate) async fn connected(&self) -> bool {
        let mut states = self.client.state_watcher();
        loop {
            match states.state() {
                SessionState::SyncConnected | SessionState::ConnectedReadOnly => return true,
                s if is_terminal(s) => return false,
                _ => {}
            }
            states.changed().await;
        }
    }
}

pub(crate) fn is_terminal(state: SessionState) -> bool {
    matches!(
        state,
        SessionState::Expired | SessionState::AuthFailed | SessionState::Closed
    )
}

/// Makes and keeps the current session.
#[derive(Debug)]
pub(crate) struct Sessions {
    config: ZkConfig,
    current: tokio::sync::Mutex<Current>,
}

#[derive(Debug, Default)]
struct Current {
    session: Option<Arc<Session>>,
    /// When the last attempt to connect failed, and why: callers that
    /// queued behind that attempt get its answer instead of each making
    /// one more, so an ensemble that is down costs one connect timeout,
    /// not one per caller.
    failed: Option<(Instant, Error)>,
}

impl Sessions {
    pub(crate) fn new(config: ZkConfig) -> Self {
        Sessions {
            config,
            current: tokio::sync::Mutex::new(Current::default()),
        }
    }

    pub(crate) fn config(&self) -> &ZkConfig {
        &self.config
    }

    /// The ACL of lock directories and contender nodes: the authenticated
    /// identity's alone (nobody else can create in, or delete from, our
    /// locks), or open to all without credentials. ZooKeeper checks the
    /// rights to create and to delete a node on its parent, so the
    /// directory needs this ACL as much as the nodes do.
    pub(crate) fn acls(&self) -> Acls<'static> {
        if self.config.auth.is_some() {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        }
    }

    /// The ACL of the root path's levels we create: ours, and anyone may
    /// list them and create in them, so that a root shared with other
    /// identities (or none) does not lock them out of their own keys.
    pub(crate) fn parent_acls(&self) -> Acls<'static> {
        static SHARED: std::sync::OnceLock<[Acl; 2]> = std::sync::OnceLock::new();
        if self.config.auth.is_none() {
            return Acls::anyone_all();
        }
        Acls::new(SHARED.get_or_init(|| {
            [
                Acl::new(Permission::ALL, AuthId::authed()),
                Acl::new(Permission::READ | Permission::CREATE, AuthId::anyone()),
            ]
        }))
    }

    /// The session now, if there is one that has not ended. It waits for
    /// the slot (a `try_lock` said "none" whenever a caller held it).
    pub(crate) async fn peek(&self) -> Option<Arc<Session>> {
        let current = self.current.lock().await;
        current.session.as_ref().filter(|s| !s.is_over()).cloned()
    }

    /// The live session, connecting first if there is none (or the last
    /// one ended). One caller connects; the others wait for it.
    pub(crate) async fn get(&self) -> Result<Arc<Session>> {
        let arrived = Instant::now();
        let mut current = self.current.lock().await;
        if let Some(s) = current.session.as_ref().filter(|s| !s.is_over()) {
            return Ok(s.clone());
        }
        if let Some((at, e)) = &current.failed {
            if *at >= arrived {
                return Err(e.clone());
            }
        }
        match self.connect().await {
            Ok(s) => {
                let session = Arc::new(s);
                current.session = Some(session.clone());
                current.failed = None;
                Ok(session)
            }
            Err(e) => {
                current.failed = Some((Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    async fn connect(&self) -> Result<Session> {
        let c = &self.config;
        // Eagerly: `NoHosts` once every host was tried, where the client
        // would otherwise keep trying for up to a session timeout.
        let mut connector = Client::connector()
            .with_session_timeout(c.session_timeout)
            .with_connection_timeout(c.connect_timeout)
            .with_fail_eagerly();
        if let Some((user, password)) = &c.auth {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        // Each host gets the connection timeout, tried in turn.
        let hosts = u32::try_from(c.hosts.split(',').count()).unwrap_or(u32::MAX);
        let budget = c.connect_timeout.saturating_mul(hosts) + Duration::from_millis(100);
        let client = match tokio::time::timeout(budget, connector.connect(&c.hosts)).await {
            Ok(r) => r.map_err(|e| {
                let e = map_err(e);
                Error::new(e.kind(), format!("cannot reach ZooKeeper at {}", c.url)).with_source(e)
            })?,
            Err(_) => {
                return Err(Error::unavailable(format!(
                    "no ZooKeeper server of {} answered within {budget:?}",
                    c.url
                )))
            }
        };
        // The lost signal is timed on the session timeout asked for; a
        // server that grants a shorter one could end the session first.
        if client.session_timeout() < c.session_timeout {
            return Err(Error::config(format!(
                "{}: the server grants sessions of at most {:?}, below the session_timeout \
                 of {:?} asked for; ask for at most that (or raise the server's \
                 maxSessionTimeout)",
                c.url,
                client.session_timeout(),
                c.session_timeout
            )));
        }
        tracing::debug!(session = %client.session_id(), timeout = ?client.session_timeout(),
            "ZooKeeper session established");
        Ok(Session {
            id: client.session_id().0,
            client,
            timeout: c.timeout,
        })
    }
}

/// One contender node of ours, and the session that created it.
#[derive(Debug, Clone)]
pub(crate) struct Contender {
    pub(crate) session: Arc<Session>,
    pub(crate) path: String,
    pub(crate) czxid: i64,
}

impl Contender {
    pub(crate) fn grant(&self, holds: u32) -> Grant {
        Grant {
            fence: Some(fence_of(self.czxid)),
            holds,
            lease: None,
        }
    }

    /// Still ours: the node exists and belongs to the session that made it,
    /// which is live. Never taken from a listing: a node left by an ended
    /// session is not ours, whatever its name (CURATOR-604).
    pub(crate) async fn confirm(&self) -> Result<bool> {
        if self.session.is_over() {
            return Ok(false);
        }
        // A server cut off from the leader may still answer reads from its
        // stale copy while the leader expires the session: `sync` first, so
        // the answer is at least as new as the leader's state when it was
        // sent (the server answers a session's requests in order).
        let client = &self.session.client;
        let (synced, stat) = self
            .session
            .call(async {
                let pair =
                    futures::future::join(client.sync(&self.path), client.check_stat(&self.path));
                Ok(pair.await)
            })
            .await
            .unwrap_or_else(|e| (Err(e.clone()), Err(e)));
        match synced.and(stat) {
            Ok(Some(stat)) => Ok(stat.ephemeral_owner == self.session.id),
            Ok(None) | Err(ZkError::NoNode) => Ok(false),
            Err(e) if is_session_over(&e) => Ok(false),
            Err(e) => Err(map_err(e)),
        }
    }

    /// Writes `value` as this node's data if the node is still ours (our
    /// live session's, created by this hold) and first in the queue:
    /// `false`, with nothing written, otherwise. The queue only grows at
    /// its tail, so a node granted the lock stays first until it goes; the
    /// listing checks it anyway, in the same round trip as the node's
    /// `Stat`. The write is conditioned on the version read with that
    /// `Stat`, so it lands on the node just checked or not at all: a
    /// holder can only ever write its own node, which is gone once its
    /// lock is (released, or its session ended), never a later holder's.
    pub(crate) async fn set_value(&self, value: &[u8]) -> Result<bool> {
        let client = &self.session.client;
        let (dir, name) = self.path.rsplit_once('/').unwrap_or(("", &self.path));
        let dir = if dir.is_empty() { "/" } else { dir };
        // A version moved by a concurrent proclaim of the same owner is
        // read again; only a node written without end by others runs out.
        for _ in 0..5 {
            if self.session.is_over() {
                return Ok(false);
            }
            let (stat, listed) = self
                .session
                .call(async {
                    let pair = futures::future::join(
                        client.check_stat(&self.path),
                        client.list_children(dir),
                    );
                    Ok(pair.await)
                })
                .await
                .unwrap_or_else(|e| (Err(e.clone()), Err(e)));
            let version = match stat {
                Ok(Some(s)) if s.ephemeral_owner == self.session.id && s.czxid == self.czxid => {
                    s.version
                }
                Ok(_) | Err(ZkError::NoNode) => return Ok(false),
                Err(e) if is_session_over(&e) => return Ok(false),
                Err(e) => return Err(map_err(e)),
            };
            let mut children = match listed {
                Ok(c) => c,
                Err(ZkError::NoNode) => return Ok(false),
                Err(e) if is_session_over(&e) => return Ok(false),
                Err(e) => return Err(map_err(e)),
            };
            layout::sort_queue(&mut children);
            if children.first().map(String::as_str) != Some(name) {
                return Ok(false);
            }
            let written = client.set_data(&self.path, value, Some(version));
            match self.session.call(written).await {
                Ok(_) => return Ok(true),
                Err(ZkError::BadVersion) => continue,
                Err(ZkError::NoNode) => return Ok(false),
                Err(e) if is_session_over(&e) => return Ok(false),
                Err(e) => return Err(map_err(e)),
            }
        }
        Err(Error::backend(format!(
            "the data of {} kept changing under this holder's writes",
            self.path
        )))
    }
}

/// A node's creation zxid as a fencing token (a zxid is positive: epoch
/// << 32 | counter).
pub(crate) fn fence_of(czxid: i64) -> FencingToken {
    FencingToken(u64::try_from(czxid).unwrap_or(0))
}

/// The answers to a create and the listing sent with it.
pub(crate) type CreateAndList = (
    std::result::Result<(Stat, CreateSequence), ZkError>,
    std::result::Result<Vec<String>, ZkError>,
);

/// A create and the listing sent with it, as one owned future.
pub(crate) type Exchange = Pin<Box<dyn Future<Output = CreateAndList> + Send>>;
