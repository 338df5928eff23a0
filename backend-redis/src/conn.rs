//! The connection a request runs on: one server's, the primary's its
//! sentinels name now, or a Cluster's (routed by slot); with `WAIT` for the
//! replicas where the URL asks for it, and the errors that say the primary
//! moved or the request never ran.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockwright_core::backend::RedactedUrl;
use lockwright_core::{Error, Result};
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, FromRedisValue, Pipeline, RedisError, RedisFuture, ScriptInvocation, Value};
use tokio::sync::OnceCell;

use crate::error::{map_err, TRANSIENT_CODES};
use crate::scripts::Shift;
use crate::sentinel::{self, Sentinel, EPOCH_SHIFT_SECS};

/// The servers a node talks to.
// One per node, made once and never moved about: its size is no cost.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Target {
    /// One server, at one address for the node's life.
    Fixed {
        client: redis::Client,
        conn: OnceCell<ConnectionManager>,
    },
    /// The primary the sentinels name, resolved again after a failover.
    Sentinel(Arc<Sentinel>),
    /// A Cluster: each script goes to the primary of its keys' slot.
    Cluster {
        client: ClusterClient,
        conn: OnceCell<ClusterConnection>,
    },
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Fixed { client, .. } => f.debug_tuple("Fixed").field(client).finish(),
            Target::Sentinel(s) => f.debug_tuple("Sentinel").field(s).finish(),
            Target::Cluster { .. } => f.write_str("Cluster"),
        }
    }
}

/// A connection of either kind; the driver's calls take both.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Plain(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Plain(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Plain(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Plain(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The connection one request runs on: which primary it reached (to drop
/// that one, and only that one, when it fails), and the shift of the
/// tokens' clock that primary's epoch gives.
pub(crate) struct Link {
    pub(crate) conn: Conn,
    generation: u64,
    pub(crate) shift: Shift,
}

/// Makes and keeps a node's connections.
#[derive(Debug)]
pub(crate) struct Connector {
    pub(crate) url: RedactedUrl,
    pub(crate) target: Target,
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    /// Replicas that must acknowledge a grant, a renewal and a hand-off,
    /// and how long to wait for them.
    pub(crate) replicas: u32,
    pub(crate) replicas_timeout: Duration,
    /// Seconds added to the tokens' clock beyond the epoch's shift: a
    /// test's stand-in for a primary whose clock is behind.
    skew: AtomicI64,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis().max(1)).unwrap_or(u64::MAX / 4)
}

impl Connector {
    pub(crate) fn new(
        url: &RedactedUrl,
        target: Target,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Self {
        Connector {
            url: url.clone(),
            target,
            timeout,
            connect_timeout,
            replicas: 0,
            replicas_timeout: Duration::ZERO,
            skew: AtomicI64::new(0),
        }
    }

    /// Shifts the tokens' clock by `secs` more (tests: a primary whose
    /// clock is behind).
    pub(crate) fn skew_clock(&self, secs: i64) {
        self.skew.store(secs, Ordering::Relaxed);
    }

    /// Whether this is a Cluster (whose keys take a tag of their own).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster { .. })
    }

    /// The connection for one request, made (or the primary found) on
    /// first use; a server that is down now is `Unavailable` now and tried
    /// again on the next call.
    pub(crate) async fn link(&self) -> Result<Link> {
        let skew = self.skew.load(Ordering::Relaxed);
        match &self.target {
            // Connecting, and asking sentinels, are boxed: their futures
            // are large, and unboxed they would make every request's as
            // large (kilobytes moved on each call).
            Target::Fixed { client, conn } => Ok(Link {
                conn: Conn::Single(match conn.get() {
                    Some(c) => c.clone(),
                    None => Box::pin(self.fixed(client, conn)).await?,
                }),
                generation: 0,
                shift: Shift::Const(skew),
            }),
            Target::Sentinel(s) => {
                let p = Box::pin(s.primary()).await?;
                let epoch = i64::try_from(p.epoch).unwrap_or(i64::MAX / EPOCH_SHIFT_SECS);
                Ok(Link {
                    conn: Conn::Plain(p.conn.clone()),
                    generation: p.generation,
                    shift: Shift::Const(
                        epoch.saturating_mul(EPOCH_SHIFT_SECS).saturating_add(skew),
                    ),
                })
            }
            Target::Cluster { client, conn } => Ok(Link {
                conn: Conn::Cluster(Box::pin(self.cluster(client, conn)).await?),
                generation: 0,
                shift: Shift::Cluster(skew),
            }),
        }
    }

    /// Maps a driver error, and drops the primary `link` reached if the
    /// error says it may have moved. An error that shows the request was
    /// never carried out is marked so (`unapplied`): a replica refusing a
    /// write (`READONLY`: it runs none of a script's writes), or a
    /// connection refused. A connection that broke is not proof: the
    /// driver fails every request still waiting for its reply so, and the
    /// server may have run them.
    pub(crate) fn failed(&self, link: &Link, e: RedisError) -> Error {
        if let Target::Sentinel(s) = &self.target {
            if sentinel::moved(&e) {
                s.forget(link.generation);
            }
        }
        let refused = e.code() == Some("READONLY") || e.is_connection_refusal();
        let mapped = map_err(e);
        if refused {
            mapped.unapplied()
        } else {
            mapped
        }
    }

    /// Runs `call` on `link`; where replicas must acknowledge it (`wait`),
    /// pipelined with `WAIT` on the same connection, since `WAIT` counts
    /// only the writes of its own connection (on a Cluster the pipeline
    /// goes whole to the script's slot): then also how many did.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        link: &mut Link,
        call: &ScriptInvocation<'_>,
        wait: bool,
    ) -> Result<(T, Option<u32>)> {
        if !wait || self.replicas == 0 {
            let r = call.invoke_async(&mut link.conn).await;
            return Ok((r.map_err(|e| self.failed(link, e))?, None));
        }
        Box::pin(self.run_acked(link, call)).await
    }

    /// [`run`](Self::run) with `WAIT` for the replicas (boxed there: the
    /// common request does not carry this path's state).
    async fn run_acked<T: FromRedisValue>(
        &self,
        link: &mut Link,
        call: &ScriptInvocation<'_>,
    ) -> Result<(T, Option<u32>)> {
        let mut pipe = redis::pipe();
        // Each reply on its own: a script that ran must be seen as run
        // even when the `WAIT` after it failed.
        pipe.invoke_script(call)
            .cmd("WAIT")
            .arg(self.replicas)
            .arg(ms(self.replicas_timeout))
            .ignore_errors();
        let mut replies = self.replies(link, &pipe).await?;
        if matches!(&replies.0, Value::ServerError(e) if e.code() == "NOSCRIPT") {
            // A promoted replica starts with no scripts: load, then again.
            let loaded = call.load_async(&mut link.conn).await;
            loaded.map_err(|e| self.failed(link, e))?;
            replies = self.replies(link, &pipe).await?;
        }
        let (script, wait) = replies;
        let script = script.extract_error().map_err(|e| self.failed(link, e))?;
        let v = T::from_redis_value(script).map_err(|e| self.failed(link, e.into()))?;
        let acked = match wait {
            Value::Int(n) => u32::try_from(n).unwrap_or(0),
            Value::ServerError(e) if TRANSIENT_CODES.contains(&e.code()) => {
                // The script ran; its `WAIT` was cut short by a failover
                // (`UNBLOCKED`: its node became a replica). No replica is
                // known to have it: counted as none, so a grant is undone
                // and reported `Unavailable`, as a short count is.
                tracing::debug!(url = %self.url, "WAIT failed after the script ran: {e}");
                0
            }
            // Another refusal (`NOPERM` for a user without `WAIT`) is said
            // as it is, not read as a replica that keeps missing.
            Value::ServerError(e) => return Err(self.failed(link, e.into())),
            other => {
                let e = RedisError::from(redis::ParsingError::from(format!(
                    "WAIT answered {other:?}"
                )));
                return Err(self.failed(link, e));
            }
        };
        if acked < self.replicas {
            // A primary that lost its replicas may have been failed over:
            // if it says it is one no more, the next request asks the
            // sentinels again (a replica merely slow to answer does not
            // cost a lookup per request).
            if let Target::Sentinel(s) = &self.target {
                let role: redis::RedisResult<Vec<Value>> =
                    redis::cmd("ROLE").query_async(&mut link.conn).await;
                let primary = matches!(&role, Ok(r) if matches!(r.first(), Some(Value::BulkString(b)) if b == b"master"));
                if !primary {
                    s.forget(link.generation);
                }
            }
        }
        Ok((v, Some(acked)))
    }

    /// The two replies of a script pipelined with `WAIT`, each as the
    /// server gave it (errors included).
    async fn replies(&self, link: &mut Link, pipe: &Pipeline) -> Result<(Value, Value)> {
        let r = pipe.query_async::<Vec<Value>>(&mut link.conn).await;
        let mut replies = r.map_err(|e| self.failed(link, e))?.into_iter();
        match (replies.next(), replies.next()) {
            (Some(script), Some(wait)) => Ok((script, wait)),
            _ => Err(Error::backend(format!(
                "{}: a script with WAIT gave fewer than two replies",
                self.url
            ))),
        }
    }

    /// `Unavailable` unless `acked` (from [`run`](Self::run)) reaches the
    /// replicas asked for.
    pub(crate) fn replicated(&self, what: &str, acked: Option<u32>) -> Result<()> {
        match acked {
            Some(n) if n < self.replicas => Err(Error::unavailable(format!(
                "{}: {what} reached {n} of the {} replicas asked for within {:?}",
                self.url, self.replicas, self.replicas_timeout
            ))),
            _ => Ok(()),
        }
    }

    /// Every key matching the glob `pattern`, by `SCAN` (never `KEYS`,
    /// which would hold the server up): on a Cluster, on each primary.
    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>> {
        let mut link = self.link().await?;
        if !matches!(link.conn, Conn::Cluster(_)) {
            return scan_one(&mut link.conn, pattern, None).await;
        }
        let slots: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut link.conn)
            .await
            .map_err(map_err)?;
        let mut keys = Vec::new();
        for (host, port) in primaries(&slots) {
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
            keys.extend(scan_one(&mut link.conn, pattern, Some(route)).await?);
        }
        Ok(keys)
    }

    /// One server's connection, made on first use.
    async fn fixed(
        &self,
        client: &redis::Client,
        conn: &OnceCell<ConnectionManager>,
    ) -> Result<ConnectionManager> {
        let conn = conn
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(self.timeout + self.replicas_timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(200));
                let connecting = ConnectionManager::new_with_config(client.clone(), config);
                self.connecting(connecting).await
            })
            .await?;
        Ok(conn.clone())
    }

    /// The Cluster's connection (one per node, the driver's), made on
    /// first use.
    async fn cluster(
        &self,
        client: &ClusterClient,
        conn: &OnceCell<ClusterConnection>,
    ) -> Result<ClusterConnection> {
        let conn = conn
            .get_or_try_init(|| async { self.connecting(client.get_async_connection()).await })
            .await?;
        Ok(conn.clone())
    }

    /// A connection being made, or `Unavailable` once twice the connect
    /// timeout has passed (a reconnect and its retry included).
    async fn connecting<C>(
        &self,
        f: impl std::future::Future<Output = redis::RedisResult<C>>,
    ) -> Result<C> {
        match tokio::time::timeout(self.connect_timeout * 2, f).await {
            Ok(r) => r.map_err(map_err),
            Err(_) => Err(Error::unavailable(format!(
                "{}: connect timed out",
                self.url
            ))),
        }
    }
}

/// Every key matching `pattern` on one server: the connection's own, or
/// the Cluster node `route` names.
async fn scan_one(
    conn: &mut Conn,
    pattern: &str,
    route: Option<RoutingInfo>,
) -> Result<Vec<String>> {
    let (mut cursor, mut keys) = (0u64, Vec::new());
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        let reply = match (&route, &mut *conn) {
            (Some(route), Conn::Cluster(c)) => c.route_command(cmd, route.clone()).await,
            _ => cmd.query_async::<Value>(conn).await,
        };
        let (next, batch): (u64, Vec<Vec<u8>>) =
            FromRedisValue::from_redis_value(reply.map_err(map_err)?)
                .map_err(|e| map_err(e.into()))?;
        // A key that is not UTF-8 is no lock key of ours: skipped, not an
        // error that would fail the whole listing.
        keys.extend(batch.into_iter().filter_map(|k| String::from_utf8(k).ok()));
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// The primaries' addresses in a `CLUSTER SLOTS` reply: each range's
/// first node, once each.
fn primaries(slots: &Value) -> Vec<(String, u16)> {
    let mut found: Vec<(String, u16)> = Vec::new();
    let Value::Array(ranges) = slots else {
        return found;
    };
    for range in ranges {
        let Value::Array(fields) = range else {
            continue;
        };
        let Some(Value::Array(primary)) = fields.get(2) else {
            continue;
        };
        let host = match primary.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => continue,
        };
        let Some(Value::Int(port)) = primary.get(1) else {
            continue;
        };
        let Ok(port) = u16::try_from(*port) else {
            continue;
        };
        if !found.iter().any(|(h, p)| *h == host && *p == port) {
            found.push((host, port));
        }
    }
    found
}
