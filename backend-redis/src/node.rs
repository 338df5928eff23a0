//! One Redis server: the scripts run on a self-reconnecting connection, and
//! grants to this backend's waiters, and changes of the locks its election
//! observers watch, arrive on its [`Hub`].

use std::time::Duration;

use locksmith_core::backend::{Acquire, RedactedUrl, Release, RenewRequest, Watch};
use locksmith_core::{Claim, Error, FencingToken, LockKey, LockStatus, OwnerToken, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

use crate::error::{bad_url, map_err};
use crate::group;
use crate::hub::Hub;
use crate::layout::Keys;
use crate::scripts;
use locksmith_core::backend::TlsFiles;

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
        let bad = |e| bad_url(url, e);
        let client = if tls.is_empty() {
            redis::Client::open(url.expose()).map_err(bad)?
        } else {
            let pem = tls.read(url)?;
            let certs = redis::TlsCertificates {
                client_tls: pem
                    .identity
                    .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                        client_cert,
                        client_key,
                    }),
                root_cert: pem.ca,
            };
            redis::Client::build_with_tls(url.expose(), certs).map_err(bad)?
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
        self.within(self.timeout, f).await
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
            let mut conn = self.conn().await?;
            redis::cmd("PING")
                .query_async::<()>(&mut conn)
                .await
                .map_err(map_err)
        };
        self.within(self.connect_timeout * 2 + self.timeout, ping)
            .await
    }

    /// One attempt; a `waiter` is queued (or its place refreshed) if the
    /// key is held, and its grant published on this node's hub. An owner
    /// that carries a value has it written with its first grant.
    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        keys: &Keys,
        owner: &OwnerToken,
        ttl: Duration,
        waiter: Option<Waiter<'_>>,
    ) -> Result<Acquire> {
        let claim = owner.claim();
        self.bounded(async {
            let value = owner.value();
            let mut call = if claim != Claim::MUTEX {
                let mut call = keys.call(scripts::claim_acquire(self.fenced));
                call.arg(owner.as_str())
                    .arg(ms(ttl))
                    .arg(group::kind(claim))
                    .arg(owner.writer().unwrap_or(""));
                call
            } else {
                let script = match value {
                    Some(_) => scripts::acquire_valued(self.fenced),
                    None => scripts::acquire(self.fenced),
                };
                let mut call = keys.call(script);
                call.arg(owner.as_str()).arg(ms(ttl));
                call
            };
            if let Some(w) = waiter {
                // Listening before queueing, so the grant cannot be missed.
                let channel = self.hub.listening().await?;
                call.arg(w.ticket.as_str()).arg(ms(w.liveness)).arg(channel);
            }
            if let (Some(v), Claim::MUTEX) = (value, claim) {
                call.arg(v);
            }
            let mut c = self.conn().await?;
            let reply: AcquireReply = call.invoke_async(&mut c).await.map_err(map_err)?;
            match reply {
                AcquireReply::First(fence) => group::answer(key, claim, &[1, fence, 1]),
                AcquireReply::Full(v) => group::answer(key, claim, &v),
            }
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

    /// Sets the value `owner` advertises with its hold; `false` if it holds
    /// none.
    pub(crate) async fn proclaim(
        &self,
        keys: &Keys,
        owner: &OwnerToken,
        value: &[u8],
    ) -> Result<bool> {
        self.bounded(async {
            let mut c = self.conn().await?;
            let set: i64 = keys
                .call(scripts::proclaim())
                .arg(owner.as_str())
                .arg(value)
                .invoke_async(&mut c)
                .await
                .map_err(map_err)?;
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

    /// What the node holds for a lock, read without changing it: with the
    /// holder's owner token (Redlock's quorum counts per owner, an election
    /// tells reigns apart by it; `Locker::status` never shows it) and the
    /// value it advertises.
    pub(crate) async fn inspect(&self, keys: &Keys) -> Result<LockStatus> {
        self.bounded(async {
            let mut c = self.conn().await?;
            let (holds, fence, pttl, queued, owner, value, kind, members): InspectReply = keys
                .call(scripts::inspect())
                .invoke_async(&mut c)
                .await
                .map_err(map_err)?;
            let queued = Some(u32::try_from(queued).unwrap_or(u32::MAX));
            if kind != 0 {
                return Ok(group::status(kind, members).with_waiters(queued));
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
        let limit = self.connect_timeout * 2 + self.timeout;
        self.within(limit, self.hub.changes(keys.changes())).await
    }

    /// Where grants to `ticket` will arrive (see [`Hub`]).
    pub(crate) async fn watch(&self, ticket: &OwnerToken) -> Result<Watch> {
        self.hub.listening().await?;
        Ok(self.hub.register(ticket))
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
    Vec<group::Member>,
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
