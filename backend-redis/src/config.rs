//! Parsing Redis URLs into a [`RedisConfig`].

use std::path::PathBuf;
use std::time::Duration;

use locksmith_core::{take_params, Error, RedactedUrl, Result};

/// The URL schemes this crate answers to.
pub const REDIS_SCHEMES: &[&str] = &["redis", "rediss", "redis+unix", "unix", "redis+redlock"];

/// Where the locks live and how the client behaves.
///
/// Parameters of ours in the URL query (removed before the driver sees the
/// URL): `prefix` (prepended to every key, default `locksmith:`),
/// `timeout` (per-request timeout, default 1s; for Redlock, per node),
/// `connect_timeout` (default 1s), `waiter_refresh` (how often a queued
/// waiter confirms it still waits, default 500ms; a waiter silent for four
/// periods loses its place); for `rediss://`, `tls_ca` (a PEM file of root
/// certificates to trust instead of the system's) and `tls_cert` with
/// `tls_key` (PEM files of a client certificate and key, for servers that
/// require them).
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// One URL per node: one for a single server, N for Redlock.
    pub nodes: Vec<RedactedUrl>,
    /// Redlock over the nodes (`redis+redlock://h1:p1,h2:p2,…`).
    pub redlock: bool,
    /// Prepended to every Redis key this backend writes.
    pub prefix: String,
    /// Per-request (per-node) response timeout.
    pub timeout: Duration,
    /// Connection timeout.
    pub connect_timeout: Duration,
    /// How often a queued waiter refreshes its place (and finds a grant
    /// whose message was lost).
    pub waiter_refresh: Duration,
    /// TLS files beyond the system trust store.
    pub tls: TlsFiles,
}

/// PEM files for `rediss://` connections (parameters `tls_ca`, `tls_cert`, `tls_key`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// Root certificates to trust instead of the system's.
    pub ca: Option<PathBuf>,
    /// Client certificate (with `key`), for servers that authenticate clients.
    pub cert: Option<PathBuf>,
    /// The client certificate's private key.
    pub key: Option<PathBuf>,
}

impl TlsFiles {
    /// No file given: the system trust store, no client certificate.
    pub fn is_empty(&self) -> bool {
        *self == TlsFiles::default()
    }
}

impl RedisConfig {
    /// Parses `redis://[user:pass@]host:port[/db]`, `rediss://…` (TLS),
    /// `redis+unix:///path/to/sock`, or
    /// `redis+redlock://[user:pass@]h1:p1,h2:p2,h3:p3[/db]`.
    ///
    /// # Errors
    /// `Config` for an unknown scheme, an empty host list, a Redlock with
    /// fewer than 3 nodes, or a bad parameter.
    pub fn from_url(url: &str) -> Result<Self> {
        let shown = RedactedUrl::new(url);
        let scheme = shown.scheme();
        let mut config = RedisConfig {
            nodes: Vec::new(),
            redlock: false,
            prefix: "locksmith:".to_owned(),
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            waiter_refresh: Duration::from_millis(500),
            tls: TlsFiles::default(),
        };
        let driver_url = take_params(url, |k, v| {
            let duration = |v: &str| {
                humantime::parse_duration(v).map_err(|_| {
                    Error::config(format!("{shown}: {k} must be a duration like 500ms"))
                })
            };
            match k {
                "prefix" => config.prefix = v.to_owned(),
                "timeout" => config.timeout = duration(v)?,
                "connect_timeout" => config.connect_timeout = duration(v)?,
                "tls_ca" => config.tls.ca = Some(PathBuf::from(v)),
                "tls_cert" => config.tls.cert = Some(PathBuf::from(v)),
                "tls_key" => config.tls.key = Some(PathBuf::from(v)),
                "waiter_refresh" => {
                    config.waiter_refresh = duration(v)?;
                    let range = Duration::from_millis(10)..=Duration::from_secs(3600);
                    if !range.contains(&config.waiter_refresh) {
                        return Err(Error::config(format!(
                            "{shown}: waiter_refresh must be between 10ms and 1h"
                        )));
                    }
                }
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        if !config.tls.is_empty() && scheme != "rediss" {
            return Err(Error::config(format!(
                "{shown}: tls_ca, tls_cert and tls_key need a rediss:// URL"
            )));
        }
        if config.tls.cert.is_some() != config.tls.key.is_some() {
            return Err(Error::config(format!(
                "{shown}: tls_cert and tls_key go together"
            )));
        }
        let (base, query) = driver_url.split_once('?').unwrap_or((&driver_url, ""));
        let suffix = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        match scheme.as_str() {
            "redis" | "rediss" | "redis+unix" | "unix" => {
                config
                    .nodes
                    .push(RedactedUrl::new(format!("{base}{suffix}")));
            }
            "redis+redlock" => {
                config.redlock = true;
                let rest = &base["redis+redlock://".len().min(base.len())..];
                let (auth, hosts_and_db) = match rest.rsplit_once('@') {
                    Some((a, h)) => (format!("{a}@"), h),
                    None => (String::new(), rest),
                };
                let (hosts, db) = match hosts_and_db.split_once('/') {
                    Some((h, d)) => (h, format!("/{d}")),
                    None => (hosts_and_db, String::new()),
                };
                for host in hosts.split(',').filter(|h| !h.is_empty()) {
                    config.nodes.push(RedactedUrl::new(format!(
                        "redis://{auth}{host}{db}{suffix}"
                    )));
                }
                if config.nodes.len() < 3 {
                    return Err(Error::config(format!(
                        "{shown}: Redlock needs at least 3 independent nodes, got {}",
                        config.nodes.len()
                    )));
                }
            }
            other => {
                return Err(Error::config(format!(
                    "{shown}: scheme {other:?} is not Redis ({})",
                    REDIS_SCHEMES.join(", ")
                )))
            }
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_nodes() {
        let c = RedisConfig::from_url("redis://:pw@127.0.0.1:6379/2?prefix=app:&timeout=200ms")
            .unwrap();
        assert!(!c.redlock);
        assert_eq!(c.prefix, "app:");
        assert_eq!(c.timeout, Duration::from_millis(200));
        assert_eq!(c.nodes[0].expose(), "redis://:pw@127.0.0.1:6379/2");
        assert!(!format!("{c:?}").contains("pw"));

        let r = RedisConfig::from_url("redis+redlock://:pw@h1:1,h2:2,h3:3/0").unwrap();
        assert!(r.redlock);
        let nodes: Vec<&str> = r.nodes.iter().map(|n| n.expose()).collect();
        assert_eq!(
            nodes,
            [
                "redis://:pw@h1:1/0",
                "redis://:pw@h2:2/0",
                "redis://:pw@h3:3/0"
            ]
        );

        for bad in [
            "redis+redlock://h1:1,h2:2",
            "memcache://h",
            "redis://h?timeout=soon",
            "redis://h?waiter_refresh=1ms",
            "redis://h?tls_ca=/ca.pem",
            "rediss://h?tls_cert=/c.pem",
            "redis://h?waiter_refresh=100years",
        ] {
            assert!(RedisConfig::from_url(bad).is_err(), "{bad}");
        }
    }
}
