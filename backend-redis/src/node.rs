//! One Redis server, or the primary its sentinels name: the scripts run on
//! a self-reconnecting connection (with `WAIT` for the replicas where the
//! URL asks for it), and grants to this backend's waiters, and changes of
//! the locks its election observers watch, arrive on its [`Hub`].

use std::time::Duration;

use lockwright_core::backend::{
    Acquire, AcquireRequest, RedactedUrl, Release, RenewRequest, Watch,
};
use lockwright_core::{Claim, Error, FencingToken, LockStatus, OwnerToken, Result};
use redis::cluster::ClusterClient;
use redis::cluster_routing::Slot;
use tokio::sync::OnceCell;

use crate::claims;
use crate::config::SentinelConfig;
use crate::conn::{Connector, Link, Target};
use crate::error::bad_url;
use crate::hub::{Hub, Source};
use crate::layout::Keys;
use crate::scripts;
use crate::sentinel::Sentinel;
use crate::shards::{Notify, Shards};
use lockwright_core::backend::TlsFiles;
use redis::TlsCertificates;

/// A waiter's place in a key's queue: its ticket, and how long the place is
/// kept without a refresh. Its grant is published on the node's hub.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Waiter<'a> {
    pub(crate) ticket: &'a OwnerToken,
    pub(crate) liveness: Duration,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis().max(1)).unwrap_or(u64::MAX / 4)
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
    conn: Connector,
    /// Every request must answer within `timeout`, reconnects included.
    strict: bool,
    /// Grants carry fencing tokens (not under Redlock, which writes none).
    fenced: bool,
    hub: Notify,
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
        let bad = |e| bad_url(url, e);
        let client = if tls.is_empty() {
            redis::Client::open(url.expose()).map_err(bad)?
        } else {
            let certs = crate::tls::certificates(tls, url)?;
            redis::Client::build_with_tls(url.expose(), certs).map_err(bad)?
        };
        let target = Target::Fixed {
            client: client.clone(),
            conn: OnceCell::new(),
        };
        Ok(Node {
            url: url.clone(),
            hub: Notify::Hub(Hub::new(Source::Seeds(vec![client]), connect_timeout)),
            conn: Connector::new(url, target, timeout, connect_timeout),
            strict,
            fenced,
        })
    }

    /// The primary of the master `config` names, as its sentinels say;
    /// every connection over TLS with `tls` when given.
    pub(crate) fn sentinel(
        url: &RedactedUrl,
        config: SentinelConfig,
        tls: Option<TlsCertificates>,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Self {
        let sentinel = Sentinel::new(config, tls, timeout, connect_timeout);
        let target = Target::Sentinel(sentinel.clone());
        Node {
            url: url.clone(),
            hub: Notify::Hub(Hub::new(Source::Sentinel(sentinel), connect_timeout)),
            conn: Connector::new(url, target, timeout, connect_timeout),
            strict: false,
            fenced: true,
        }
    }

    /// A Cluster reached through `seeds` (each a `redis://` URL with the
    /// user and password), every node over TLS with `tls` when given, its
    /// requests answered within `timeout`; its waiters refresh their
    /// places every `waiter_refresh`.
    pub(crate) fn cluster(
        url: &RedactedUrl,
        seeds: &[RedactedUrl],
        tls: Option<&TlsCertificates>,
        timeout: Duration,
        connect_timeout: Duration,
        waiter_refresh: Duration,
    ) -> Result<Self> {
        let bad = |e| bad_url(url, e);
        let urls: Vec<&str> = seeds.iter().map(RedactedUrl::expose).collect();
        // The driver's retries (redirects, a node that went away) are kept
        // few and short: a lock's request must fail well inside a lease,
        // not after the driver's default of 16 retries from 1.28 s each.
        let builder = ClusterClient::builder(urls.clone())
            .retries(3)
            .min_retry_wait(20)
            .max_retry_wait(200)
            .connection_timeout(connect_timeout)
            .response_timeout(timeout);
        let client = crate::tls::cluster(builder, tls).build().map_err(bad)?;
        let shards = Shards::new(&urls, tls, connect_timeout, waiter_refresh).map_err(bad)?;
        let target = Target::Cluster {
            client,
            conn: OnceCell::new(),
        };
        Ok(Node {
            url: url.clone(),
            hub: Notify::Shards(shards),
            conn: Connector::new(url, target, timeout, connect_timeout),
            strict: false,
            fenced: true,
        })
    }

    /// Waits for `replicas` to acknowledge grants, renewals and hand-offs.
    pub(crate) fn with_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.conn.replicas = replicas;
        self.conn.replicas_timeout = timeout;
        self
    }

    /// Shifts the tokens' clock by `secs` more (tests: a primary whose
    /// clock is behind).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub(crate) fn skew_clock(&self, secs: i64) {
        self.conn.skew_clock(secs);
    }

    /// Whether this node is a Cluster (its keys take a tag of their own:
    /// see [`layout`](crate::layout)).
    pub(crate) fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
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
        self.within(self.conn.timeout, f).await
    }

    /// Runs `attempt` on a link, and once more on a fresh one when the
    /// store refused it outright (see [`Connector::failed`]), or, for an
    /// `idempotent` request, when the store could not be reached: after a
    /// failover, or a restart, the first request on a connection the
    /// server closed fails so. A request that may have run (its reply lost
    /// with the connection) is not sent again unless running it twice is
    /// running it once: an acquire would count a second hold. Bounded as
    /// [`bounded`](Self::bounded).
    async fn attempts<T, F, Fut>(&self, idempotent: bool, mut attempt: F) -> Result<T>
    where
        F: FnMut(Link) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        self.bounded(async {
            match attempt(self.conn.link().await?).await {
                Err(e)
                    if e.is_unapplied()
                        || (idempotent && e.kind() == lockwright_core::ErrorKind::Unavailable) =>
                {
                    attempt(self.conn.link().await?).await
                }
                r => r,
            }
        })
        .await
    }

    /// `f`, or `Unavailable` once `limit` has passed.
    async fn within<T>(
        &self,
        limit: Duration,
        f: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(limit, f).await {
            Ok(r) => r,
            Err(_) => Err(Error::unavailable(format!(
                "{}: no answer within {limit:?}",
                self.url
            ))),
        }
    }

    /// Connects (authenticating) if not yet connected, and asks for a PONG.
    /// Bounded by the connect timeout, not Redlock's per-node budget: a
    /// check at start-up must see the server's real answer (a refused
    /// password), not a timeout that hides it.
    pub(crate) async fn ping(&self) -> Result<()> {
        let ping = async {
            let mut link = self.conn.link().await?;
            let r = redis::cmd("PING").query_async::<()>(&mut link.conn).await;
            r.map_err(|e| self.conn.failed(&link, e))?;
            if self.conn.is_cluster() {
                return Ok(());
            }
            // A sentinel answers PING too, but runs none of our scripts:
            // said now, not at the first lock. (A role that may not run
            // ROLE is let through: its answer is no proof either way.)
            let role = redis::cmd("ROLE")
                .query_async::<redis::Value>(&mut link.conn)
                .await;
            if matches!(&role, Ok(v) if crate::sentinel::role_name(v).as_deref() == Some("sentinel"))
            {
                return Err(Error::config(format!(
                    "{} answered as a Redis Sentinel, not a Redis server (use \
                     redis+sentinel://<sentinels>/<master name>)",
                    self.url
                )));
            }
            Ok(())
        };
        self.within(self.conn.connect_timeout * 2 + self.conn.timeout, ping)
            .await
    }

    /// One attempt; a `waiter` is queued (or its place refreshed) if the
    /// key is held, and its grant published on this node's hub. A request
    /// that carries a value has it written with its first grant.
    pub(crate) async fn acquire(
        &self,
        keys: &Keys,
        request: &AcquireRequest,
        waiter: Option<Waiter<'_>>,
    ) -> Result<Acquire> {
        let (key, owner, ttl) = (request.key(), request.owner(), request.ttl);
        let claim = request.claim();
        let waits = waiter.is_some();
        let outcome = self.attempts(false, |mut link| async move {
            let value = request.value();
            let script = if claim != Claim::MUTEX {
                scripts::claim_acquire_at(self.fenced, link.shift)
            } else if value.is_some() {
                scripts::acquire_valued_at(self.fenced, link.shift)
            } else {
                scripts::acquire_at(self.fenced, link.shift)
            };
            let mut call = keys.call(&script);
            call.arg(owner.as_str()).arg(ms(ttl));
            if claim != Claim::MUTEX {
                call.arg(claims::kind(claim))
                    .arg(request.hold.kind.beside().map_or("", OwnerToken::as_str));
            }
            if let Some(w) = waiter {
                // Listening before queueing, so the grant cannot be missed.
                // Boxed (as the undo below): a waiter's subscription and
                // the undo are rare, and their state would make every
                // attempt's future kilobytes larger.
                let channel = Box::pin(self.hub.listening(keys)).await?;
                call.arg(w.ticket.as_str()).arg(ms(w.liveness)).arg(channel);
            }
            if let (Some(v), Claim::MUTEX) = (value, claim) {
                call.arg(v);
            }
            let (reply, acked): (AcquireReply, _) = self.conn.run(&mut link, &call, true).await?;
            let answer = match reply {
                AcquireReply::First(fence) => claims::answer(key, claim, &[1, fence, 1]),
                AcquireReply::Full(v) => claims::answer(key, claim, &v),
            }?;
            if let (Acquire::Acquired { .. }, Err(short)) =
                (&answer, self.conn.replicated("the grant", acked))
            {
                // Never left granted while reported refused: undone (one
                // hold: a re-entry keeps the ones before it).
                let script = scripts::release_at(self.fenced, link.shift);
                let mut undo = keys.call(&script);
                undo.arg(owner.as_str());
                let undo = Box::pin(undo.invoke_async::<i64>(&mut link.conn)).await;
                if let Err(e) = undo {
                    tracing::warn!(url = %self.url, "undoing an unreplicated grant failed: {e}");
                }
                return Err(short);
            }
            Ok(answer)
        })
        .await;
        if !self.strict && (waits || matches!(outcome, Ok(Acquire::Acquired(_)))) {
            // A holder hears at once when the server goes away (and may
            // come back without the lock), and so does a waiter, which may
            // be handed the lock on the hub. Not on Redlock's nodes: the
            // quorum rides out one node's restart by design.
            self.hub.keep();
        }
        outcome
    }

    /// The hub's alarm, on a node whose hub is kept up (see
    /// [`Notify::alarm`]); none on Redlock's nodes.
    pub(crate) fn alarm(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        if self.strict {
            None
        } else {
            self.hub.alarm()
        }
    }

    pub(crate) async fn release(&self, keys: &Keys, owner: &OwnerToken) -> Result<Release> {
        self.attempts(false, |mut link| async move {
            let script = scripts::release_at(self.fenced, link.shift);
            let mut call = keys.call(&script);
            call.arg(owner.as_str());
            let (left, acked): (i64, _) = self.conn.run(&mut link, &call, true).await?;
            if let Err(short) = self.conn.replicated("a release (and any hand-off)", acked) {
                // The release stands: a waiter it was handed to holds it
                // now, and its own first renewal waits for the replicas.
                tracing::warn!("{short}");
            }
            Ok(match left {
                n if n < 0 => Release::NotHeld,
                0 => Release::Freed,
                n => Release::StillHeld(u32::try_from(n).unwrap_or(u32::MAX)),
            })
        })
        .await
    }

    /// Sets the value `owner` advertises with its hold; `false` if it holds
    /// none.
    pub(crate) async fn proclaim(
        &self,
        keys: &Keys,
        owner: &OwnerToken,
        value: &[u8],
    ) -> Result<bool> {
        self.attempts(true, |mut link| async move {
            let script = scripts::proclaim_at(link.shift);
            let mut call = keys.call(&script);
            call.arg(owner.as_str()).arg(value);
            let (set, _): (i64, _) = self.conn.run(&mut link, &call, false).await?;
            Ok(set == 1)
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
        self.attempts(true, |mut link| async move {
            let script = scripts::abandon_at(self.fenced, link.shift);
            let mut call = keys.call(&script);
            call.arg(owner.as_str()).arg(ticket.as_str());
            let _: (i64, _) = self.conn.run(&mut link, &call, false).await?;
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
        let cluster = self.is_cluster();
        let keys: Vec<String> = requests
            .iter()
            .map(|r| Keys::lock(prefix, r.key(), cluster))
            .collect();
        if !cluster {
            return self.renew_batch(&keys, requests).await;
        }
        // One script may only touch one slot of a Cluster: a batch per
        // slot, all at once.
        let mut slots: Vec<(Slot, Vec<usize>)> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let slot = Slot::for_key(k);
            match slots.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, at)) => at.push(i),
                None => slots.push((slot, vec![i])),
            }
        }
        let batches = slots.iter().map(|(_, at)| {
            let keys: Vec<String> = at.iter().map(|&i| keys[i].clone()).collect();
            let requests: Vec<RenewRequest> = at.iter().map(|&i| requests[i].clone()).collect();
            async move { self.renew_batch(&keys, &requests).await }
        });
        let answers = futures::future::join_all(batches).await;
        let mut out = vec![false; requests.len()];
        for ((_, at), answer) in slots.iter().zip(answers) {
            for (&i, renewed) in at.iter().zip(answer?) {
                out[i] = renewed;
            }
        }
        Ok(out)
    }

    /// Renews the leases of `requests`, whose lock keys are `keys`, in one
    /// script call.
    async fn renew_batch(&self, keys: &[String], requests: &[RenewRequest]) -> Result<Vec<bool>> {
        self.attempts(true, |mut link| async move {
            let script = scripts::renew();
            let mut call = script.prepare_invoke();
            for (k, r) in keys.iter().zip(requests) {
                call.key(k).arg(r.owner().as_str()).arg(ms(r.ttl));
            }
            let (out, acked): (Vec<i64>, _) = self.conn.run(&mut link, &call, true).await?;
            // Renewed on the primary only: failed, so the watchdog tries
            // again, and the hold is lost at its deadline if the replicas
            // never catch up.
            self.conn.replicated("a renewal", acked)?;
            if out.len() != requests.len() {
                return Err(Error::backend(
                    "renew script answered for the wrong number of keys",
                ));
            }
            Ok(out.into_iter().map(|r| r == 1).collect())
        })
        .await
    }

    /// Every key matching the glob `pattern` (see `conn.rs`).
    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>> {
        self.conn.scan(pattern).await
    }

    /// What the node holds for a lock, read without changing it: with the
    /// holder's owner token (Redlock's quorum counts per owner, an election
    /// tells reigns apart by it; `Locker::status` never shows it) and the
    /// value it advertises.
    pub(crate) async fn inspect(&self, keys: &Keys) -> Result<LockStatus> {
        self.attempts(true, |mut link| async move {
            let call = keys.call(scripts::inspect());
            let (reply, _): (InspectReply, _) = self.conn.run(&mut link, &call, false).await?;
            let (holds, fence, pttl, queued, owner, value, kind, members) = reply;
            let queued = Some(u32::try_from(queued).unwrap_or(u32::MAX));
            if kind != 0 {
                return Ok(claims::status(kind, members).with_waiters(queued));
            }
            if holds <= 0 {
                return Ok(LockStatus::free().with_waiters(queued));
            }
            Ok(LockStatus::held(u32::try_from(holds).unwrap_or(u32::MAX))
                .with_fence(u64::try_from(fence).ok().map(FencingToken))
                .with_remaining(u64::try_from(pttl).ok().map(Duration::from_millis))
                .with_waiters(queued)
                .with_owner(OwnerToken::from_string(owner).ok())
                .with_value(value))
        })
        .await
    }

    /// A watch on the changes of the lock of `keys` that carries a value,
    /// subscribed on the hub (see [`Hub`]). Bounded as [`ping`](Self::ping):
    /// it may have to connect.
    pub(crate) async fn changes(&self, keys: &Keys) -> Result<Watch> {
        let limit = self.conn.connect_timeout * 2 + self.conn.timeout;
        self.within(limit, self.hub.changes(keys)).await
    }

    /// Where grants to `ticket` will arrive (see [`Hub`]).
    pub(crate) async fn watch(&self, keys: &Keys, ticket: &OwnerToken) -> Result<Watch> {
        self.hub.watch(keys, ticket).await
    }
}

/// The inspect script's answer: holds, fence, pttl, queued, owner, value,
/// the group's kind and its members.
type InspectReply = (
    i64,
    i64,
    i64,
    i64,
    String,
    Option<Vec<u8>>,
    i64,
    Vec<claims::Member>,
);

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
