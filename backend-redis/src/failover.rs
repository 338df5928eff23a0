//! Failovers made on purpose, for `lockwright check --faults …,failover`:
//! `SENTINEL FAILOVER` under Sentinel, `CLUSTER FAILOVER` on a replica of
//! one of a Cluster's primaries, each waited for until the new primary
//! serves. They change the deployment: nothing here runs unless asked.

use std::time::{Duration, Instant};

use lockwright_core::backend::{HostPort, RedactedUrl, Scheme};
use lockwright_core::{Error, ErrorKind, Result};

use crate::config::{RedisConfig, SCHEMES};
use crate::error::map_err;
use crate::tls;
use redis::IntoConnectionInfo;

/// How long a failover may take before it is reported as failed.
const PATIENCE: Duration = Duration::from_secs(60);

/// A connection to `at`: a sentinel (with the sentinels' own
/// credentials), or a Cluster node (with the user and password of the
/// URL's first node); over TLS when the URL asks for it.
async fn conn(at: &HostPort, config: &RedisConfig) -> Result<redis::aio::MultiplexedConnection> {
    let settings = match (config.cluster.first(), &config.sentinel) {
        (Some(seed), _) => seed
            .expose()
            .into_connection_info()
            .map_err(map_err)?
            .redis_settings()
            .clone(),
        (None, Some(s)) => {
            tls::credentials(s.sentinel_user.as_deref(), s.sentinel_password.as_deref())
        }
        (None, None) => redis::RedisConnectionInfo::default(),
    };
    let certs = if config.secure {
        Some(tls::certificates(&config.tls, &config.nodes[0])?)
    } else {
        None
    };
    let c = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.timeout.max(Duration::from_secs(2))));
    tls::client(at, settings, certs.as_ref())
        .map_err(map_err)?
        .get_multiplexed_async_connection_with_config(&c)
        .await
        .map_err(map_err)
}

fn overdue(what: &str, start: Instant) -> Result<()> {
    if start.elapsed() > PATIENCE {
        return Err(Error::unavailable(format!(
            "{what} did not finish within {PATIENCE:?}"
        )));
    }
    Ok(())
}

/// Fails the deployment `url` names over to a replica and waits until the
/// new primary serves; says which node took over from which.
///
/// # Errors
/// `Unsupported` for a URL that is neither `redis+sentinel://` nor
/// `redis+cluster://` (nor their `rediss+` forms); `Config` for a TLS
/// file that cannot be used; `Unavailable` when no failover could be made or
/// it did not finish within a minute.
pub(crate) async fn failover(url: &str) -> Result<String> {
    // Only Sentinel and Cluster have a replica to promote: any other URL
    // is refused before it is read, as the facade did when it chose.
    let scheme = Scheme::find(SCHEMES, url)?;
    if !matches!(
        scheme.name,
        "redis+sentinel" | "rediss+sentinel" | "redis+cluster" | "rediss+cluster"
    ) {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "{}: no failover to make on {}; it needs a redis+sentinel:// or \
                 redis+cluster:// URL",
                RedactedUrl::new(url),
                scheme.store
            ),
        ));
    }
    let config = RedisConfig::from_url(url)?;
    // A TLS file that cannot be used is `Config` now, not a minute of
    // connections that fail below (which skip a server that refuses).
    if config.secure {
        tls::certificates(&config.tls, &config.nodes[0])?;
    }
    if let Some(s) = &config.sentinel {
        return sentinel(&config, &s.sentinels, &s.master).await;
    }
    if !config.cluster.is_empty() {
        return cluster(&config).await;
    }
    Err(Error::new(
        ErrorKind::Unsupported,
        "a failover needs a redis+sentinel:// or redis+cluster:// URL",
    ))
}

/// The address every answering sentinel names for `master`, once they agree.
async fn named(config: &RedisConfig, sentinels: &[HostPort], master: &str) -> Option<String> {
    let mut agreed: Option<String> = None;
    for s in sentinels {
        let Ok(mut c) = conn(s, config).await else {
            continue;
        };
        let addr: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(master)
            .query_async(&mut c)
            .await
            .ok()?;
        let addr = addr.map(|(h, p)| format!("{h}:{p}"))?;
        if agreed.as_ref().is_some_and(|a| *a != addr) {
            return None;
        }
        agreed = Some(addr);
    }
    agreed
}

async fn sentinel(config: &RedisConfig, sentinels: &[HostPort], master: &str) -> Result<String> {
    let start = Instant::now();
    let old = loop {
        if let Some(a) = named(config, sentinels, master).await {
            break a;
        }
        overdue("waiting for the sentinels to agree", start)?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Any sentinel may start it; one that finds no replica ready yet (just
    // after another failover) is asked again.
    'asked: loop {
        let mut last = None;
        for s in sentinels {
            let Ok(mut c) = conn(s, config).await else {
                continue;
            };
            let r: redis::RedisResult<()> = redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(master)
                .query_async(&mut c)
                .await;
            match r {
                Ok(()) => break 'asked,
                Err(e) => last = Some(e.to_string()),
            }
        }
        overdue(
            &format!(
                "SENTINEL FAILOVER ({})",
                last.unwrap_or_else(|| "no sentinel answered".into())
            ),
            start,
        )?;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    loop {
        if let Some(new) = named(config, sentinels, master).await.filter(|n| *n != old) {
            return Ok(format!("{old} -> {new}"));
        }
        overdue("the failover", start)?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One node as `CLUSTER NODES` lists it.
struct ClusterNode {
    id: String,
    addr: HostPort,
    /// A primary (not failing) that serves slots.
    serving: bool,
    /// The primary it replicates, if a replica that is up.
    replica_of: Option<String>,
}

/// `CLUSTER NODES`, from the first seed that answers.
async fn nodes(config: &RedisConfig) -> Result<Vec<ClusterNode>> {
    let mut last = None;
    for seed in &config.cluster {
        let Ok(u) = lockwright_core::backend::ServerUrl::parse(seed.expose(), 6379) else {
            continue;
        };
        let Some(at) = u.hosts().first() else {
            continue;
        };
        let asked = match conn(at, config).await {
            Ok(mut c) => redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async::<String>(&mut c)
                .await
                .map_err(map_err),
            Err(e) => Err(e),
        };
        let text = match asked {
            Ok(t) => t,
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        return Ok(text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                let (host, port) = f.get(1)?.split('@').next()?.rsplit_once(':')?;
                let flags = f.get(2)?;
                let up = !flags.contains("fail") && f.get(7) == Some(&"connected");
                Some(ClusterNode {
                    id: f[0].to_owned(),
                    addr: HostPort::new(host, port.parse().ok()?),
                    serving: up && flags.contains("master") && f.len() > 8,
                    replica_of: (up && flags.contains("slave")).then(|| f[3].to_owned()),
                })
            })
            .collect());
    }
    Err(last.unwrap_or_else(|| Error::unavailable("no Cluster node answered")))
}

/// A pseudo-random number, to pick a primary with.
fn pick(n: usize) -> usize {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    usize::try_from(nanos).unwrap_or(0) % n.max(1)
}

async fn cluster(config: &RedisConfig) -> Result<String> {
    let start = Instant::now();
    loop {
        let all = nodes(config).await?;
        let pairs: Vec<(&HostPort, &HostPort)> = all
            .iter()
            .filter(|p| p.serving)
            .filter_map(|p| {
                let r = all
                    .iter()
                    .find(|r| r.replica_of.as_deref() == Some(&p.id))?;
                Some((&p.addr, &r.addr))
            })
            .collect();
        if let Some((old, replica)) = pairs.get(pick(pairs.len())) {
            let mut c = conn(replica, config).await?;
            // The default mode: the primary stops its clients until the
            // replica has all its writes, so no acknowledged write is lost.
            let asked: redis::RedisResult<()> = redis::cmd("CLUSTER")
                .arg("FAILOVER")
                .query_async(&mut c)
                .await;
            if asked.is_ok() {
                // A manual failover gives up after 5 s; then ask again.
                let asked_at = Instant::now();
                while asked_at.elapsed() < Duration::from_secs(6) {
                    let role: Vec<redis::Value> = redis::cmd("ROLE")
                        .query_async(&mut c)
                        .await
                        .map_err(map_err)?;
                    if matches!(role.first(), Some(redis::Value::BulkString(b)) if b == b"master") {
                        return Ok(format!("{old} -> {replica}"));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        overdue("a Cluster failover", start)?;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
