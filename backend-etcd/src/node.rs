//! One client of the cluster, and the lease this backend keeps its keys
//! on (its session, as Go's `concurrency.Session`): granted on first use,
//! kept alive in the background every third of its TTL, and replaced by a
//! new one once the cluster says it is gone.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use etcd_client::{
    Certificate, Client, ConnectOptions, GetOptions, GetResponse, Identity, KeyValue,
    LeaseKeepAliveStream, LeaseKeeper, TlsOptions, Txn, TxnOpResponse, TxnResponse,
};
use lockwright_core::backend::{lock_unpoisoned, RedactedUrl, TlsFiles};
use lockwright_core::{Error, Result};
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
    /// How many members the client knows (see [`retrying`]).
    members: usize,
    task: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
    /// The lease's TTL, as asked (the cluster may keep it longer).
    pub(crate) ttl: Duration,
    /// When the last keep-alive (or the grant) the cluster confirmed was
    /// sent: the lease lives at least one `ttl` from then.
    confirmed: std::sync::Mutex<Instant>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("lease", &self.id).finish()
    }
}

impl Node {
    pub(crate) fn new(config: EtcdConfig) -> Self {
        Node {
            config,
            client: OnceCell::new(),
            session: Mutex::new(None),
        }
    }

    /// A read of `key` with `opts`, within the request timeout (see
    /// [`asking`]).
    pub(crate) async fn get(&self, key: &str, opts: Option<GetOptions>) -> Result<GetResponse> {
        let client = self.client().await?;
        asking(self.config.timeout, self.config.endpoints.len(), || {
            let (mut c, k, o) = (client.clone(), key.to_owned(), opts.clone());
            async move { c.get(k, o).await }
        })
        .await
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
                // Tokens expire (after 5 idle minutes by default): a new one
                // is fetched when the server says so.
                opts = opts
                    .with_user(user.clone(), password.clone())
                    .with_auto_token_refresh(true);
            }
            if let Some(files) = &c.tls {
                opts = opts.with_tls(tls_options(&c.url, files)?);
            }
            within(limit, Client::connect(&c.endpoints, Some(opts))).await
        });
        Ok(made.await?.clone())
    }

    /// A transaction that needs no lease, within the request timeout.
    pub(crate) async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        let client = self.client().await?;
        retrying(self.config.timeout, self.config.endpoints.len(), || {
            let (mut c, t) = (client.clone(), txn.clone());
            async move { c.txn(t).await }
        })
        .await
    }

    /// The live session, or a new one: a lease of the configured TTL, kept
    /// alive in the background.
    pub(crate) async fn session(&self) -> Result<Arc<Session>> {
        let mut slot = self.session.lock().await;
        if let Some(s) = slot.as_ref().filter(|s| !s.is_dead()) {
            return Ok(s.clone());
        }
        let client = self.client().await?;
        // Whole seconds, rounded up: the lease may outlive `lease_ttl`, which
        // the lost signal is timed on, never the other way round.
        let ms = self.config.lease_ttl.as_millis();
        let ttl = i64::try_from(ms.div_ceil(1000)).unwrap_or(i64::MAX);
        let asked = Instant::now();
        let granted = retrying(self.config.timeout, self.config.endpoints.len(), || {
            let mut c = client.clone();
            async move { c.lease_grant(ttl, None).await }
        })
        .await?;
        let session = Arc::new(Session {
            id: granted.id(),
            client,
            stream: Mutex::new(None),
            dead: AtomicBool::new(false),
            timeout: self.config.timeout,
            members: self.config.endpoints.len(),
            task: std::sync::Mutex::new(None),
            ttl: self.config.lease_ttl,
            confirmed: std::sync::Mutex::new(asked),
        });
        let period = self.config.lease_ttl / 3;
        let task = tokio::spawn(keep_alive(Arc::downgrade(&session), period));
        *lock_unpoisoned(&session.task) = Some(task.abort_handle());
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
        if let Some(task) = lock_unpoisoned(&self.task).take() {
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
        let sent = Instant::now();
        // One timeout for the whole call, the wait for the stream included:
        // a renewal queued behind the background keep-alive, or whose
        // stream's member died, must not stay in flight past it.
        let deadline = tokio::time::Instant::now() + self.timeout;
        let alive =
            match tokio::time::timeout_at(deadline, self.ask_keep_alive(sent, deadline)).await {
                Ok(alive) => alive,
                Err(_) => Err(Error::unavailable(format!(
                    "etcd did not answer within {:?}",
                    self.timeout
                ))),
            };
        if let Ok(true) = alive {
            let mut confirmed = lock_unpoisoned(&self.confirmed);
            *confirmed = (*confirmed).max(sent);
        }
        alive
    }

    /// How long the lease is sure to live from now: one TTL from the
    /// sending of the last keep-alive the cluster confirmed (zero once it
    /// is dead).
    pub(crate) fn left(&self) -> Duration {
        if self.is_dead() {
            return Duration::ZERO;
        }
        (*lock_unpoisoned(&self.confirmed) + self.ttl).saturating_duration_since(Instant::now())
    }

    async fn ask_keep_alive(&self, sent: Instant, deadline: tokio::time::Instant) -> Result<bool> {
        let mut slot = self.stream.lock().await;
        // A keep-alive sent after this call began was confirmed while it
        // waited for the stream: that answer is this call's too.
        if *lock_unpoisoned(&self.confirmed) >= sent {
            return Ok(true);
        }
        // Out of the slot while it asks, back only once it has its answer:
        // a stream left with an answer in flight (this call timed out or
        // was dropped) would hand that older answer to the next call.
        if let Some((mut keeper, mut stream)) = slot.take() {
            // Half of what is left: a stream whose member died without a
            // word, or waits there for a leader, leaves the other half to
            // a new stream, on whichever member answers first.
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let answer = within(left / 2, async {
                keeper.keep_alive().await?;
                stream.message().await
            })
            .await;
            match answer {
                Ok(Some(r)) if r.ttl() > 0 => {
                    *slot = Some((keeper, stream));
                    return Ok(true);
                }
                Ok(Some(_)) => {
                    self.mark_dead();
                    return Ok(false);
                }
                // The stream broke (its member went away): a new one.
                Ok(None) | Err(_) => {}
            }
        }
        // Opening a stream asks once too: its answer is this call's.
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let opened = asking(left, self.members, || {
            let (mut c, id) = (self.client.clone(), self.id);
            async move { c.lease_keep_alive(id).await }
        })
        .await;
        match opened {
            Ok(pair) => {
                *slot = Some(pair);
                Ok(true)
            }
            Err(e) if lease_gone(&e) => {
                self.mark_dead();
                Ok(false)
            }
            Err(e) => Err(e),
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

    /// How many members the client knows.
    pub(crate) fn members(&self) -> usize {
        self.members
    }

    /// `txn` within the request timeout.
    pub(crate) async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        let kv = self.kv();
        retrying(self.request_timeout(), self.members(), || {
            let (mut kv, txn) = (kv.clone(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// `txn`, which only reads, within the request timeout: asked again
    /// of another member while the first cannot answer (see `asking`).
    pub(crate) async fn read(&self, txn: Txn) -> Result<TxnResponse> {
        let kv = self.kv();
        asking(self.request_timeout(), self.members(), || {
            let (mut kv, txn) = (kv.clone(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
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

/// `f()` within `limit`, sent again while it is refused before it reaches
/// any member and there is another to try (a member that is down, which
/// the client's balancer may go on picking for a while): every request
/// this backend sends may be repeated (an attempt finds its own key, a
/// release compares the key's create revision, the rest read or renew).
/// Another error, a lone member that refuses, or the end of `limit` ends
/// it.
pub(crate) async fn retrying<T, F, Fut>(limit: Duration, members: usize, f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    sending(limit, members, false, f).await
}

/// As [`retrying`], for a request whose answer does not depend on an
/// earlier try of it (a read, a keep-alive), so more tries are worth
/// it: sent again, too, while the member could not serve it now (its
/// connection broke, it has no leader, its leader changed: an election),
/// and, with more than one member, joined by a second try when the first
/// is still unanswered after half of `limit`, on whichever member the
/// balancer picks; the first answer counts. So a member that died
/// without a word, or waits for a leader that is gone, cannot take the
/// whole limit, and a slow answer still counts.
pub(crate) async fn asking<T, F, Fut>(limit: Duration, members: usize, f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    sending(limit, members, true, f).await
}

/// [`retrying`], or [`asking`] when `again`.
async fn sending<T, F, Fut>(limit: Duration, members: usize, again: bool, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    use futures::stream::{FuturesUnordered, StreamExt};
    let start = tokio::time::Instant::now();
    let deadline = start + limit;
    let mut second = (again && members > 1).then_some(start + limit / 2);
    let mut tries = FuturesUnordered::new();
    tries.push(f());
    loop {
        let answer = tokio::select! {
            Some(answer) = tries.next() => answer,
            () = tokio::time::sleep_until(second.unwrap_or(deadline)), if second.is_some() => {
                second = None;
                tries.push(f());
                continue;
            }
            () = tokio::time::sleep_until(deadline) => {
                return Err(Error::unavailable(format!(
                    "etcd did not answer within {limit:?}"
                )))
            }
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match answer {
            Ok(v) => return Ok(v),
            Err(e) if refused(&e) => {
                if members < 2 || left <= Duration::from_millis(50) {
                    let word = if members < 2 {
                        "the member"
                    } else {
                        "every member tried"
                    };
                    return Err(Error::unavailable(format!(
                        "etcd: {word} refused the connection (not running, or not on that port)"
                    ))
                    .with_source(e));
                }
            }
            Err(e) => {
                let e = map_err(e);
                if !again || left <= Duration::from_millis(50) || !passing(&e) {
                    return Err(e);
                }
            }
        }
        // The other try, if any, may still be answered; else a new one.
        if tries.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            tries.push(f());
        }
    }
}

/// An error another try may not meet: the member could not serve the
/// request now (no leader yet, its leader changed, its connection broke),
/// not a lease the cluster no longer has.
fn passing(e: &Error) -> bool {
    e.kind() == lockwright_core::ErrorKind::Unavailable && !lease_gone(e)
}

/// A request that never left: its connection was refused.
fn refused(e: &etcd_client::Error) -> bool {
    let text = format!("{e:?}");
    text.contains("ConnectionRefused") || text.contains("tcp connect error")
}

/// The TLS settings `files` name: their roots instead of the system's,
/// and a client certificate.
fn tls_options(url: &RedactedUrl, files: &TlsFiles) -> Result<TlsOptions> {
    let pem = files.read(url)?;
    let mut tls = TlsOptions::new();
    tls = match pem.ca {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
        None => tls.with_native_roots(),
    };
    if let Some((cert, key)) = pem.identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(tls)
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

/// The key-values of the `i`th answer of a transaction.
pub(crate) fn got(resp: &TxnResponse, i: usize) -> Vec<KeyValue> {
    match resp.op_responses().into_iter().nth(i) {
        Some(TxnOpResponse::Get(g)) => g.kvs().to_vec(),
        _ => Vec::new(),
    }
}
