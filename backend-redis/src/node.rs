//! One Redis server: the scripts run on a self-reconnecting connection, and
//! grants to this backend's waiters arrive on one shared pub/sub connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use locksmith_core::backend::{Acquire, Grant, RedactedUrl, Release, RenewRequest, Watch};
use locksmith_core::{Error, FencingToken, LockKey, LockStatus, OwnerToken, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, PubSubSink};
use redis::RedisError;
use tokio::sync::{mpsc, oneshot, OnceCell};

use crate::config::TlsFiles;
use crate::scripts;

/// The Redis keys of one lock, in the order the scripts take them. The lock
/// name sits inside `{…}`, so the lock and its wait queue share a hash tag
/// and stay in one cluster slot. The mapping is injective: fixed prefix and
/// suffixes around the name itself. Every one of them expires: the lock
/// with its lease, the queue when nobody waits.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    all: [String; 3],
}

impl Keys {
    pub(crate) fn new(prefix: &str, key: &LockKey) -> Self {
        let base = format!("{prefix}{{{}}}", key.as_str());
        Keys {
            all: [
                Self::lock(prefix, key),
                format!("{base}:queue"),
                format!("{base}:waiters"),
            ],
        }
    }

    /// Lock, queue and waiters, in the order the scripts take them.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub(crate) fn names(&self) -> &[String; 3] {
        &self.all
    }

    /// The lock's own key, all a renewal touches.
    fn lock(prefix: &str, key: &LockKey) -> String {
        format!("{prefix}{{{}}}:lock", key.as_str())
    }

    /// A call of `script` on all three keys.
    fn call(&self, script: &'static redis::Script) -> redis::ScriptInvocation<'static> {
        let mut call = script.prepare_invoke();
        for k in &self.all {
            call.key(k);
        }
        call
    }
}

/// A waiter's place in a key's queue: its ticket, how long the place is
/// kept without a refresh, and where its grant is to be published.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Waiter<'a> {
    pub(crate) ticket: &'a OwnerToken,
    pub(crate) liveness: Duration,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis().max(1)).unwrap_or(u64::MAX / 4)
}

/// A TLS handshake the client or server refused (untrusted or missing
/// certificate), found through the layers the driver wraps it in.
fn is_tls_refusal(e: &(dyn std::error::Error + 'static)) -> bool {
    type Shared = Arc<dyn std::error::Error + Send + Sync>;
    let e = match e.downcast_ref::<Shared>() {
        Some(shared) => &**shared as &(dyn std::error::Error + 'static),
        None => e,
    };
    let inner = e
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::get_ref)
        .map_or(e, |i| i as &(dyn std::error::Error + 'static));
    inner.is::<rustls::Error>()
}

/// Maps driver errors onto the contract's kinds, in one place.
pub(crate) fn map_err(e: RedisError) -> Error {
    let transient_code = matches!(
        e.code(),
        Some("LOADING" | "MASTERDOWN" | "READONLY" | "BUSY" | "TRYAGAIN" | "CLUSTERDOWN")
    );
    let msg = e.to_string();
    // Refused credentials or certificates will not get better by retrying.
    let refused_tls = std::error::Error::source(&e).is_some_and(is_tls_refusal);
    // No password where one is required, or a database the server lacks.
    let refused_config = e.code() == Some("NOAUTH")
        || e.code() == Some("WRONGPASS")
        || msg.contains("DB index is out of range");
    if e.kind() == redis::ErrorKind::AuthenticationFailed || refused_tls || refused_config {
        Error::config("redis refused the connection").with_source(e)
    } else if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_connection_dropped()
        || transient_code
    {
        Error::unavailable("redis unavailable").with_source(e)
    } else {
        Error::backend("redis answered with an error").with_source(e)
    }
}

/// What a node is for, which decides how it answers and what it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The one server of a `RedisBackend`: fenced grants, the driver's
    /// timeouts.
    Single,
    /// One of Redlock's nodes: a hard per-request budget, and no fencing
    /// state at all, since the quorum reports no fence.
    Quorum,
}

#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) url: RedactedUrl,
    client: redis::Client,
    conn: OnceCell<ConnectionManager>,
    timeout: Duration,
    connect_timeout: Duration,
    /// Every request must answer within `timeout`, reconnects included.
    strict: bool,
    /// Grants carry fencing tokens (not under Redlock, which writes none).
    fenced: bool,
    hub: Hub,
}

impl Node {
    pub(crate) fn new(
        url: &RedactedUrl,
        timeout: Duration,
        connect_timeout: Duration,
        tls: &TlsFiles,
        role: Role,
    ) -> Result<Self> {
        let (strict, fenced) = match role {
            Role::Single => (false, true),
            Role::Quorum => (true, false),
        };
        let bad = |e: &dyn std::fmt::Display| Error::config(format!("{url}: {e}"));
        let client = if tls.is_empty() {
            redis::Client::open(url.expose()).map_err(|e| bad(&e))?
        } else {
            let read = |path: &std::path::Path| {
                std::fs::read(path)
                    .map_err(|e| bad(&format!("cannot read {}: {e}", path.display())))
            };
            let client_tls = match (&tls.cert, &tls.key) {
                (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                    client_cert: read(cert)?,
                    client_key: read(key)?,
                }),
                _ => None,
            };
            let root_cert = tls.ca.as_deref().map(read).transpose()?;
            let certs = redis::TlsCertificates {
                client_tls,
                root_cert,
            };
            redis::Client::build_with_tls(url.expose(), certs).map_err(|e| bad(&e))?
        };
        Ok(Node {
            url: url.clone(),
            hub: Hub::new(client.clone(), connect_timeout),
            client,
            conn: OnceCell::new(),
            timeout,
            connect_timeout,
            strict,
            fenced,
        })
    }

    /// The connection, made on first use; a server that is down now is
    /// `Unavailable` now and tried again on the next call.
    async fn conn(&self) -> Result<ConnectionManager> {
        let conn = self
            .conn
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(self.timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(200));
                match tokio::time::timeout(
                    self.connect_timeout * 2,
                    ConnectionManager::new_with_config(self.client.clone(), config),
                )
                .await
                {
                    Ok(r) => r.map_err(map_err),
                    Err(_) => Err(Error::unavailable(format!(
                        "{}: connect timed out",
                        self.url
                    ))),
                }
            })
            .await?;
        Ok(conn.clone())
    }

    /// Bounds a request by the per-node timeout where that is a hard budget
    /// (Redlock). Elsewhere the driver's response timeout bounds a request on
    /// a live connection, and its connect timeout and single retry bound a
    /// reconnect; a timer of our own per request cost about a tenth of the
    /// uncontended throughput, measured.
    async fn bounded<T>(&self, f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        if !self.strict {
            return f.await;
        }
        match tokio::time::timeout(self.timeout, f).await {
            Ok(r) => r,
            Err(_) => Err(Error::unavailable(format!(
                "{}: no answer within {:?}",
                self.url, self.timeout
            ))),
        }
    }

    /// Connects (authenticating) if not yet connected, and asks for a PONG.
    pub(crate) async fn ping(&self) -> Result<()> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            redis::cmd("PING")
                .query_async::<()>(&mut conn)
                .await
                .map_err(map_err)
        })
        .await
    }

    /// One attempt; a `waiter` is queued (or its place refreshed) if the
    /// key is held, and its grant published on this node's hub.
    pub(crate) async fn acquire(
        &self,
        keys: &Keys,
        owner: &OwnerToken,
        ttl: Duration,
        waiter: Option<Waiter<'_>>,
    ) -> Result<Acquire> {
        self.bounded(async {
            let mut call = keys.call(scripts::acquire(self.fenced));
            call.arg(owner.as_str()).arg(ms(ttl));
            if let Some(w) = waiter {
                // Listening before queueing, so the grant cannot be missed.
                let channel = self.hub.listening().await?;
                call.arg(w.ticket.as_str()).arg(ms(w.liveness)).arg(channel);
            }
            let mut c = self.conn().await?;
            let reply: AcquireReply = call.invoke_async(&mut c).await.map_err(map_err)?;
            let grant = |fence: i64, holds: i64| {
                Acquire::Acquired(Grant {
                    fence: Some(FencingToken(u64::try_from(fence).unwrap_or(0))),
                    holds: u32::try_from(holds).unwrap_or(u32::MAX),
                    lease: None,
                })
            };
            Ok(match reply {
                AcquireReply::First(fence) => grant(fence, 1),
                AcquireReply::Full(v) => match v.as_slice() {
                    [1, fence, holds] => grant(*fence, *holds),
                    [0, pttl] => Acquire::Contended {
                        retry_after: u64::try_from(*pttl).ok().map(Duration::from_millis),
                    },
                    other => {
                        return Err(Error::backend(format!(
                            "unexpected acquire reply {other:?}"
                        )))
                    }
                },
            })
        })
        .await
    }

    pub(crate) async fn release(&self, keys: &Keys, owner: &OwnerToken) -> Result<Release> {
        self.bounded(async {
            let mut c = self.conn().await?;
            let left: i64 = keys
                .call(scripts::release(self.fenced))
                .arg(owner.as_str())
                .invoke_async(&mut c)
                .await
                .map_err(map_err)?;
            Ok(match left {
                n if n < 0 => Release::NotHeld,
                0 => Release::Freed,
                n => Release::StillHeld(u32::try_from(n).unwrap_or(u32::MAX)),
            })
        })
        .await
    }

    /// Takes `ticket` out of the queue, dropping a hold it was handed.
    pub(crate) async fn abandon(
        &self,
        keys: &Keys,
        owner: &OwnerToken,
        ticket: &OwnerToken,
    ) -> Result<()> {
        self.bounded(async {
            let mut c = self.conn().await?;
            let _: i64 = keys
                .call(scripts::abandon(self.fenced))
                .arg(owner.as_str())
                .arg(ticket.as_str())
                .invoke_async(&mut c)
                .await
                .map_err(map_err)?;
            Ok(())
        })
        .await
    }

    /// Renews many leases in one script call; `true` where renewed.
    pub(crate) async fn renew_many(
        &self,
        prefix: &str,
        requests: &[RenewRequest],
    ) -> Result<Vec<bool>> {
        self.bounded(async {
            let mut c = self.conn().await?;
            let script = scripts::renew();
            let mut call = script.prepare_invoke();
            for r in requests {
                call.key(Keys::lock(prefix, &r.key))
                    .arg(r.owner.as_str())
                    .arg(ms(r.ttl));
            }
            let out: Vec<i64> = call.invoke_async(&mut c).await.map_err(map_err)?;
            if out.len() != requests.len() {
                return Err(Error::backend(
                    "renew script answered for the wrong number of keys",
                ));
            }
            Ok(out.into_iter().map(|r| r == 1).collect())
        })
        .await
    }

    /// What the node holds for a lock, read without changing it.
    pub(crate) async fn inspect(&self, keys: &Keys) -> Result<LockStatus> {
        self.bounded(async {
            let mut c = self.conn().await?;
            let out: Vec<i64> = keys
                .call(scripts::inspect())
                .invoke_async(&mut c)
                .await
                .map_err(map_err)?;
            let [holds, fence, pttl, queued] = out[..] else {
                return Err(Error::backend("inspect script answered in another shape"));
            };
            let queued = Some(u32::try_from(queued).unwrap_or(u32::MAX));
            if holds <= 0 {
                return Ok(LockStatus::free().with_waiters(queued));
            }
            Ok(LockStatus::held(u32::try_from(holds).unwrap_or(u32::MAX))
                .with_fence(u64::try_from(fence).ok().map(FencingToken))
                .with_remaining(u64::try_from(pttl).ok().map(Duration::from_millis))
                .with_waiters(queued))
        })
        .await
    }

    /// Where grants to `ticket` will arrive (see [`Hub`]).
    pub(crate) async fn watch(&self, ticket: &OwnerToken) -> Result<Watch> {
        self.hub.listening().await?;
        Ok(self.hub.register(ticket))
    }
}

/// The acquire script's answer: the bare fence of a first hold taken in the
/// common case (one integer is the cheapest reply for the server to make),
/// or `{1, fence, holds}` / `{0, pttl}`.
enum AcquireReply {
    First(i64),
    Full(Vec<i64>),
}

impl redis::FromRedisValue for AcquireReply {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        match v {
            redis::Value::Int(fence) => Ok(AcquireReply::First(fence)),
            v => Ok(AcquireReply::Full(Vec::from_redis_value(v)?)),
        }
    }
}

type Tickets = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Grant>>>>;

/// The shared pub/sub connection of one backend. It listens on a channel of
/// its own, on which the scripts publish `<ticket> <fence>` when they hand a
/// lock to one of this backend's waiters; each message wakes that waiter
/// only. A message sent while the connection was down is lost; the waiter
/// finds its grant on its next refresh.
#[derive(Debug)]
struct Hub {
    client: redis::Client,
    connect_timeout: Duration,
    channel: String,
    conn: tokio::sync::Mutex<Option<HubConn>>,
    tickets: Tickets,
}

struct HubConn {
    _sink: PubSubSink,
    alive: Arc<AtomicBool>,
    /// Dropped with the hub: stops the reader, which closes the connection.
    _stop: oneshot::Sender<()>,
}

impl std::fmt::Debug for HubConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubConn")
            .field("alive", &self.alive.load(Ordering::Relaxed))
            .finish()
    }
}

/// Unregisters a ticket when its watch is dropped.
struct Registration {
    ticket: String,
    tickets: Weak<Mutex<HashMap<String, mpsc::UnboundedSender<Grant>>>>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(t) = self.tickets.upgrade() {
            t.lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&self.ticket);
        }
    }
}

impl Hub {
    fn new(client: redis::Client, connect_timeout: Duration) -> Self {
        Hub {
            client,
            connect_timeout,
            channel: format!("locksmith:hub:{}", OwnerToken::generate().as_str()),
            conn: tokio::sync::Mutex::new(None),
            tickets: Arc::default(),
        }
    }

    /// Subscribes (again, after a dropped connection) if need be; returns
    /// the channel once the server confirmed it.
    async fn listening(&self) -> Result<&str> {
        let mut conn = self.conn.lock().await;
        if !conn
            .as_ref()
            .is_some_and(|c| c.alive.load(Ordering::SeqCst))
        {
            *conn = Some(self.connect().await?);
        }
        Ok(&self.channel)
    }

    fn register(&self, ticket: &OwnerToken) -> Watch {
        let (tx, rx) = mpsc::unbounded_channel();
        self.tickets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ticket.as_str().to_owned(), tx);
        let registration = Registration {
            ticket: ticket.as_str().to_owned(),
            tickets: Arc::downgrade(&self.tickets),
        };
        Watch::grants(rx, Some(Box::new(registration)))
    }

    async fn connect(&self) -> Result<HubConn> {
        let connecting = async {
            let pubsub = self.client.get_async_pubsub().await.map_err(map_err)?;
            let (mut sink, stream) = pubsub.split();
            sink.subscribe(&self.channel).await.map_err(map_err)?;
            Ok::<_, Error>((sink, stream))
        };
        let (sink, mut stream) = match tokio::time::timeout(self.connect_timeout, connecting).await
        {
            Ok(r) => r?,
            Err(_) => return Err(Error::unavailable("pub/sub connect timed out")),
        };
        let alive = Arc::new(AtomicBool::new(true));
        let (tickets, flag) = (Arc::downgrade(&self.tickets), alive.clone());
        let (stop, mut stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    msg = stream.next() => msg,
                    _ = &mut stopped => None,
                };
                let Some(msg) = msg else {
                    break;
                };
                let Some(tickets) = tickets.upgrade() else {
                    break;
                };
                let payload: String = msg.get_payload().unwrap_or_default();
                let mut fields = payload.split(' ');
                let (Some(ticket), Some(Ok(fence)), lease) = (
                    fields.next(),
                    fields.next().map(str::parse::<u64>),
                    fields.next().and_then(|l| l.parse::<u64>().ok()),
                ) else {
                    continue;
                };
                let sender = tickets
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(ticket)
                    .cloned();
                if let Some(s) = sender {
                    let _ = s.send(Grant {
                        fence: Some(FencingToken(fence)),
                        holds: 1,
                        lease: lease.map(Duration::from_millis),
                    });
                }
            }
            // Waiters fall back to their refresh; the next attempt reconnects.
            flag.store(false, Ordering::SeqCst);
        });
        Ok(HubConn {
            _sink: sink,
            alive,
            _stop: stop,
        })
    }
}
