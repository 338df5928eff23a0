//! Parsing Redis URLs into a [`RedisConfig`].

use std::time::Duration;

use lockwright_core::backend::{
    quorum_servers, HostPort, RedactedUrl, Scheme, ServerUrl, TlsFiles, UrlParams,
};
use lockwright_core::{Error, Result};

/// The URL schemes this crate answers to.
pub const SCHEMES: &[Scheme] = &[
    Scheme::new("redis", "Redis", Some(6379)),
    Scheme::new("rediss", "Redis", Some(6379)),
    Scheme::new("redis+unix", "Redis", None),
    Scheme::new("unix", "Redis", None),
    Scheme::new("redis+redlock", "Redlock", Some(6379)),
    Scheme::new("redis+sentinel", "Redis Sentinel", Some(26379)).with_replicas(),
    Scheme::new("rediss+sentinel", "Redis Sentinel", Some(26379)).with_replicas(),
    Scheme::new("redis+cluster", "Redis Cluster", Some(6379)).with_replicas(),
    Scheme::new("rediss+cluster", "Redis Cluster", Some(6379)).with_replicas(),
];

/// The parameters the redis driver reads from a URL's query: `db`, `user`
/// and `pass` only on a unix socket (over TCP they go in the URL's path and
/// userinfo, and the driver ignores them in the query).
const DRIVER_PARAMS_TCP: &[&str] = &["protocol"];
const DRIVER_PARAMS_UNIX: &[&str] = &["protocol", "db", "user", "pass"];

/// The sentinels' own user name and password, if any.
type SentinelAuth = (Option<String>, Option<String>);

/// The default per-request timeout on one server.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// The default per-node timeout for Redlock: its quorum budget, far below any
/// sensible TTL.
const DEFAULT_REDLOCK_TIMEOUT: Duration = Duration::from_millis(100);

/// Where the locks live and how the client behaves.
///
/// Parameters of ours in the URL query (removed before the driver sees the
/// URL): `prefix` (prepended to every key, default `lockwright:`),
/// `timeout` (per-request timeout, default 1s; for Redlock, per node, default
/// 100ms),
/// `connect_timeout` (default 1s), `waiter_refresh` (how often a queued
/// waiter confirms it still waits, default 500ms; a waiter silent for four
/// periods loses its place); for `rediss://`, `rediss+sentinel://` and
/// `rediss+cluster://`, `tls_ca` (a PEM file of root certificates to trust
/// instead of the system's) and `tls_cert` with `tls_key` (PEM files of a
/// client certificate and key, for servers that require them), the same
/// files for every server the backend connects to; for the sentinels of
/// `redis+sentinel://` and `rediss+sentinel://`, `sentinel_password` (with
/// `sentinel_username`, for an ACL user), sent to the sentinels only (the
/// URL's user information is the data nodes'). The driver's own
/// `protocol`, `db`, `user` and `pass` pass through; any other parameter
/// is refused, so that a misspelt `prefx=` cannot silently put the locks
/// in another namespace.
///
/// `replicas=N` (with `replicas_timeout`, default 500ms) makes a grant, a
/// renewal and a hand-off count only once `WAIT` says N replicas have
/// them (see the crate docs, "Replicas and failover").
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
    /// Every connection is TLS (`rediss://`, `rediss+sentinel://`,
    /// `rediss+cluster://`): to the sentinels, the data nodes and every
    /// Cluster node alike; none is ever made in plain text.
    pub secure: bool,
    /// The sentinels to ask for the primary (`redis+sentinel://`,
    /// `rediss+sentinel://`).
    pub sentinel: Option<SentinelConfig>,
    /// The Cluster nodes to start from (`redis+cluster://`,
    /// `rediss+cluster://`), each a `redis://` URL (`rediss://` over TLS);
    /// empty for other schemes.
    pub cluster: Vec<RedactedUrl>,
    /// Replicas that must acknowledge a grant, a renewal and a hand-off.
    pub replicas: u32,
    /// How long to wait for those acknowledgements.
    pub replicas_timeout: Duration,
}

/// Where the sentinels are and what they watch (`redis+sentinel://`,
/// `rediss+sentinel://`).
#[derive(Clone)]
pub struct SentinelConfig {
    /// The sentinels, asked together; the freshest answer wins.
    pub sentinels: Vec<HostPort>,
    /// The user name for the sentinels (`sentinel_username`), if any.
    pub sentinel_user: Option<String>,
    /// The password for the sentinels (`sentinel_password`), if any
    /// (never shown).
    pub sentinel_password: Option<String>,
    /// The master name the sentinels monitor.
    pub master: String,
    /// The user name for the data nodes, if any.
    pub user: Option<String>,
    /// The password for the data nodes, if any (never shown).
    pub password: Option<String>,
    /// The database on the data nodes.
    pub db: i64,
}

impl std::fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelConfig")
            .field("sentinels", &self.sentinels)
            .field("sentinel_user", &self.sentinel_user)
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "***"),
            )
            .field("master", &self.master)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .finish()
    }
}

impl RedisConfig {
    /// Parses `redis://[user:pass@]host:port[/db]`, `rediss://…` (TLS),
    /// `redis+unix:///path/to/sock`, or
    /// `redis+redlock://[user:pass@]h1:p1,h2:p2,h3:p3[/db]`, or
    /// `redis+sentinel://[user:pass@]s1:26379,s2,s3/<master>[/db]` (the user
    /// and password are the data nodes'; the sentinels' own go in
    /// `sentinel_password` and `sentinel_username`), or
    /// `redis+cluster://[user:pass@]h1:7000,h2:7001,…` (any nodes of the
    /// Cluster; it finds the rest); `rediss+sentinel://…` and
    /// `rediss+cluster://…` are the same over TLS to every server.
    ///
    /// # Errors
    /// `Config` for an unknown scheme, an empty host list, a Redlock with
    /// fewer than 3 nodes or the same node twice, TLS files on a scheme
    /// without TLS, or sentinel credentials without sentinels;
    /// `InvalidOptions` for an unknown parameter or a bad value.
    pub fn from_url(url: &str) -> Result<Self> {
        let scheme = Scheme::find(SCHEMES, url)?.name;
        let redlock = scheme == "redis+redlock";
        let secure = scheme.starts_with("rediss");
        if matches!(scheme, "redis+unix" | "unix") {
            // A socket path, not a host list: nothing for `ServerUrl`.
            let mut p = UrlParams::new(url);
            let mut config = Self::read_params(&mut p, redlock)?;
            Self::sentinel_auth(&mut p, false)?;
            config.tls.check(p.shown(), false, "rediss")?;
            let driver_url = p.finish(DRIVER_PARAMS_UNIX)?;
            config.nodes.push(RedactedUrl::new(driver_url));
            return Ok(config);
        }
        let mut u = ServerUrl::parse_for(SCHEMES, url)?;
        let mut config = Self::read_params(u.params(), redlock)?;
        config.secure = secure;
        let sentinel = matches!(scheme, "redis+sentinel" | "rediss+sentinel");
        let auth = Self::sentinel_auth(u.params(), sentinel)?;
        // The TLS files go only with a TLS scheme, and say which one.
        let tls_scheme = match scheme {
            "redis+sentinel" | "rediss+sentinel" => "rediss+sentinel",
            "redis+cluster" | "rediss+cluster" => "rediss+cluster",
            _ => "rediss",
        };
        if sentinel {
            u.finish(&[])?;
            config.tls.check(u.shown(), secure, tls_scheme)?;
            config.sentinel = Some(Self::sentinel(&u, auth)?);
            config.nodes.push(u.url());
            return Ok(config);
        }
        if matches!(scheme, "redis+cluster" | "rediss+cluster") {
            u.finish(&[])?;
            config.tls.check(u.shown(), secure, tls_scheme)?;
            if !matches!(u.path(), "" | "/") {
                return Err(Error::config(format!(
                    "{}: a Cluster has one database: expected {scheme}://h1:7000,h2:7001",
                    u.shown()
                )));
            }
            if config.prefix.contains(['{', '}']) {
                return Err(u.params().invalid(
                    "prefix",
                    "on a Cluster the prefix may not hold { or }: the lock name is the keys' hash tag",
                ));
            }
            let seeds = u
                .servers("redis+cluster://127.0.0.1:7000,127.0.0.1:7001")?
                .to_vec();
            let seed_scheme = if secure { "rediss" } else { "redis" };
            config.cluster = seeds
                .iter()
                .map(|h| {
                    let mut one = u
                        .url_with(seed_scheme, std::slice::from_ref(h))
                        .expose()
                        .to_owned();
                    if one.ends_with('/') {
                        one.pop();
                    }
                    RedactedUrl::new(one)
                })
                .collect();
            config.nodes.push(u.url());
            return Ok(config);
        }
        u.finish(DRIVER_PARAMS_TCP)?;
        config.tls.check(u.shown(), secure, tls_scheme)?;
        let hosts = u.servers("redis://host:6379")?;
        if !redlock {
            if hosts.len() > 1 {
                return Err(Error::config(format!(
                    "{}: a {scheme}:// URL names one server; for a quorum over several \
                     independent masters use redis+redlock://h1,h2,h3",
                    u.shown()
                )));
            }
            config.nodes.push(u.url());
            return Ok(config);
        }
        if config.replicas > 0 {
            return Err(u.params().invalid(
                "replicas",
                "Redlock's masters are independent: no replica acknowledges their writes",
            ));
        }
        quorum_servers(&u, "Redlock")?;
        config.redlock = true;
        config.nodes = hosts
            .iter()
            .map(|h| u.url_with("redis", std::slice::from_ref(h)))
            .collect();
        Ok(config)
    }

    /// The sentinels, the master's name and the data nodes' database from
    /// `redis+sentinel://…/<master>[/db]`, with the sentinels' own
    /// credentials `auth` (user, password).
    fn sentinel(u: &ServerUrl, auth: SentinelAuth) -> Result<SentinelConfig> {
        let sentinels = u
            .servers("redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster")?
            .to_vec();
        let form = || {
            Error::config(format!(
                "{}: expected {}://sentinel1,sentinel2,…/<master name>[/<db>]",
                u.shown(),
                u.scheme()
            ))
        };
        let path = u.root("")?;
        let mut parts = path.strip_prefix('/').unwrap_or(&path).split('/');
        let master = parts.next().filter(|m| !m.is_empty()).ok_or_else(form)?;
        let db = match parts.next() {
            None | Some("") => 0,
            Some(db) => db
                .parse::<i64>()
                .ok()
                .filter(|d| *d >= 0)
                .ok_or_else(form)?,
        };
        if parts.next().is_some() || master.chars().any(char::is_whitespace) {
            return Err(form());
        }
        let (sentinel_user, sentinel_password) = auth;
        Ok(SentinelConfig {
            sentinels,
            sentinel_user,
            sentinel_password,
            master: master.to_owned(),
            user: u.user()?.filter(|u| !u.is_empty()),
            password: u.password()?,
            db,
        })
    }

    /// `sentinel_username` and `sentinel_password`, the sentinels' own
    /// credentials (the URL's user information is the data nodes'), which
    /// only a Sentinel URL takes.
    fn sentinel_auth(p: &mut UrlParams, sentinel: bool) -> Result<SentinelAuth> {
        const NAMES: [&str; 2] = ["sentinel_password", "sentinel_username"];
        if !sentinel {
            if let Some(name) = NAMES.iter().find(|n| p.peek(n).is_some()) {
                return Err(Error::config(format!(
                    "{}: {name} is for the sentinels of a redis+sentinel:// or \
                     rediss+sentinel:// URL; this URL names no sentinels",
                    p.shown()
                )));
            }
            return Ok((None, None));
        }
        let password = p.text(NAMES[0])?.filter(|s| !s.is_empty());
        let user = p.text(NAMES[1])?.filter(|s| !s.is_empty());
        if user.is_some() && password.is_none() {
            return Err(Error::config(format!(
                "{}: sentinel_username needs sentinel_password",
                p.shown()
            )));
        }
        Ok((user, password))
    }

    /// Our own parameters, removed from the URL before the driver sees it.
    fn read_params(p: &mut UrlParams, redlock: bool) -> Result<Self> {
        let (ms, hour) = (Duration::from_millis(1), Duration::from_secs(3600));
        // The per-node default follows the scheme alone: Redlock's is its
        // quorum budget, whatever other parameters the URL has.
        let default_timeout = if redlock {
            DEFAULT_REDLOCK_TIMEOUT
        } else {
            DEFAULT_TIMEOUT
        };
        Ok(RedisConfig {
            nodes: Vec::new(),
            redlock: false,
            prefix: p
                .text("prefix")?
                .unwrap_or_else(|| "lockwright:".to_owned()),
            timeout: p.duration("timeout", ms..=hour)?.unwrap_or(default_timeout),
            connect_timeout: p
                .duration("connect_timeout", ms..=hour)?
                .unwrap_or(Duration::from_secs(1)),
            waiter_refresh: p
                .duration("waiter_refresh", Duration::from_millis(10)..=hour)?
                .unwrap_or(Duration::from_millis(500)),
            tls: TlsFiles::from_params(p)?,
            secure: false,
            sentinel: None,
            cluster: Vec::new(),
            replicas: p.integer("replicas", 0..=64)?.unwrap_or(0),
            replicas_timeout: p
                .duration("replicas_timeout", ms..=hour)?
                .unwrap_or(Duration::from_millis(500)),
        })
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

        // Another parameter whose name holds "timeout" leaves Redlock's
        // per-node budget (and with it the shortest TTL) alone.
        let r = RedisConfig::from_url("redis+redlock://h1:1,h2:2,h3:3?connect_timeout=2s").unwrap();
        assert_eq!(r.timeout, DEFAULT_REDLOCK_TIMEOUT);
        assert_eq!(r.connect_timeout, Duration::from_secs(2));
        let r = RedisConfig::from_url("redis+redlock://h1:1,h2:2,h3:3?timeout=50ms").unwrap();
        assert_eq!(r.timeout, Duration::from_millis(50));

        for bad in [
            "redis+redlock://h1:1,h2:2",
            "memcache://h",
            "redis://h?timeout=soon",
            "redis://h?waiter_refresh=1ms",
            "redis://h?tls_ca=/ca.pem",
            "rediss://h?tls_cert=/c.pem",
            "redis://h?waiter_refresh=100years",
            "redis://h?timeout=0s",
            "redis://h?prefx=app:",
            "redis+redlock://h:6450,h:6450,h:6450",
            "redis+redlock://localhost:6450,127.0.0.1:6450,h3:1",
            "redis+redlock://H1,h1:6379,h2",
            "redis+redlock://127.0.0.1:6450,[::ffff:127.0.0.1]:6450,h3:1",
            "redis://h?db=3",
            "redis://h?pass=secret",
        ] {
            assert!(RedisConfig::from_url(bad).is_err(), "{bad}");
        }
        let e = RedisConfig::from_url("redis://:pw@h?prefx=app:").unwrap_err();
        assert_eq!(e.kind(), lockwright_core::ErrorKind::InvalidOptions);
        assert!(e.to_string().contains("\"prefx\""), "{e}");
        assert!(!e.to_string().contains("pw"), "{e}");
        let r = RedisConfig::from_url("redis+redlock://h1:1,h2:1,h3:1").unwrap();
        assert_eq!(r.timeout, DEFAULT_REDLOCK_TIMEOUT);
        let r = RedisConfig::from_url("redis+redlock://h1:1,h2:1,h3:1?connect_timeout=2s").unwrap();
        assert_eq!(r.timeout, DEFAULT_REDLOCK_TIMEOUT);
        assert!(RedisConfig::from_url("redis://h/0?protocol=resp3").is_ok());
    }

    #[test]
    fn sentinel_and_cluster_urls() {
        let c = RedisConfig::from_url(
            "redis+sentinel://app:pw@s1,s2:26380/mymaster/2?replicas=1&replicas_timeout=200ms",
        )
        .unwrap();
        let s = c.sentinel.as_ref().unwrap();
        let hosts: Vec<String> = s.sentinels.iter().map(ToString::to_string).collect();
        assert_eq!(hosts, ["s1:26379", "s2:26380"]);
        assert_eq!((s.master.as_str(), s.db), ("mymaster", 2));
        assert_eq!(
            (s.user.as_deref(), s.password.as_deref()),
            (Some("app"), Some("pw"))
        );
        assert_eq!(
            (c.replicas, c.replicas_timeout),
            (1, Duration::from_millis(200))
        );
        assert!(!format!("{c:?}").contains("pw"), "{c:?}");

        let c = RedisConfig::from_url("redis+cluster://:pw@h1:7000,h2:7001?timeout=300ms").unwrap();
        let seeds: Vec<&str> = c.cluster.iter().map(|u| u.expose()).collect();
        assert_eq!(seeds, ["redis://:pw@h1:7000", "redis://:pw@h2:7001"]);
        assert!(c.sentinel.is_none());

        for bad in [
            "redis+sentinel://s1",
            "redis+sentinel://s1/",
            "redis+sentinel://s1/m/x",
            "redis+sentinel://s1/m/0/1",
            "redis+sentinel://s1/m?protocol=resp3",
            "redis+sentinel://s1/m?tls_ca=/ca.pem",
            "redis+cluster://h1/3",
            "redis+cluster://h1?prefix=app{x}:",
            "redis+cluster://h1?db=1",
            "redis+redlock://h1,h2,h3?replicas=1",
            "redis://h?replicas=65",
        ] {
            assert!(RedisConfig::from_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tls_topologies_and_the_sentinels_own_password() {
        use lockwright_core::ErrorKind;

        let c = RedisConfig::from_url(
            "rediss+sentinel://app:pw@s1,s2:26380/m/1?tls_ca=/ca.pem&tls_cert=/c.pem\
             &tls_key=/c.key&sentinel_password=spw&sentinel_username=watcher",
        )
        .unwrap();
        assert!(c.secure);
        assert_eq!(c.tls.ca.as_deref(), Some(std::path::Path::new("/ca.pem")));
        let s = c.sentinel.as_ref().unwrap();
        assert_eq!((s.master.as_str(), s.db), ("m", 1));
        assert_eq!(
            (s.user.as_deref(), s.password.as_deref()),
            (Some("app"), Some("pw"))
        );
        assert_eq!(
            (s.sentinel_user.as_deref(), s.sentinel_password.as_deref()),
            (Some("watcher"), Some("spw"))
        );
        // Neither password shows, in the config or in the URL kept.
        for shown in [format!("{c:?}"), c.nodes[0].to_string()] {
            assert!(!shown.contains("spw") && !shown.contains(":pw@"), "{shown}");
        }

        // Over plain TCP too, and with no TLS file (the system's roots).
        let c = RedisConfig::from_url("redis+sentinel://s1/m?sentinel_password=spw").unwrap();
        assert!(!c.secure);
        let s = c.sentinel.unwrap();
        assert_eq!(
            (s.sentinel_user, s.sentinel_password.as_deref()),
            (None, Some("spw"))
        );
        assert!(
            RedisConfig::from_url("rediss+sentinel://s1/m")
                .unwrap()
                .secure
        );

        let c =
            RedisConfig::from_url("rediss+cluster://:pw@h1:7000,h2:7001?tls_ca=/ca.pem").unwrap();
        assert!(c.secure && c.sentinel.is_none());
        let seeds: Vec<&str> = c.cluster.iter().map(|u| u.expose()).collect();
        assert_eq!(seeds, ["rediss://:pw@h1:7000", "rediss://:pw@h2:7001"]);
        assert!(!RedisConfig::from_url("redis+cluster://h1").unwrap().secure);
        assert!(
            RedisConfig::from_url("rediss://h?tls_ca=/ca.pem")
                .unwrap()
                .secure
        );

        // The sentinels' credentials on a URL without sentinels: `Config`,
        // naming the parameter, without its value.
        for bad in [
            "redis://h?sentinel_password=spw",
            "rediss://h?sentinel_password=spw",
            "redis+cluster://h1?sentinel_password=spw",
            "rediss+cluster://h1?sentinel_username=u",
            "redis+redlock://h1,h2,h3?sentinel_password=spw",
            "redis+unix:///tmp/r.sock?sentinel_password=spw",
        ] {
            let e = RedisConfig::from_url(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
            assert!(e.to_string().contains("sentinel_"), "{bad}: {e}");
            assert!(!e.to_string().contains("spw"), "{bad}: {e}");
        }
        for bad in [
            // A user name alone authenticates nobody.
            "redis+sentinel://s1/m?sentinel_username=u",
            // A Cluster has one database, over TLS too.
            "rediss+cluster://h1/3",
            "rediss+cluster://h1?prefix=app{x}:",
            // TLS files need a TLS scheme, whichever the topology.
            "redis+sentinel://s1/m?tls_ca=/ca.pem",
            "redis+cluster://h1?tls_ca=/ca.pem",
            "rediss+sentinel://s1/m?tls_cert=/c.pem",
            "rediss+sentinel://s1",
            "rediss+cluster://h1?protocol=resp3",
        ] {
            let e = RedisConfig::from_url(bad).unwrap_err();
            let kind = e.kind();
            assert!(
                matches!(kind, ErrorKind::Config | ErrorKind::InvalidOptions),
                "{bad}: {e}"
            );
        }
        let e = RedisConfig::from_url("redis+sentinel://s1/m?tls_ca=/ca.pem").unwrap_err();
        assert!(e.to_string().contains("rediss+sentinel://"), "{e}");
    }
}
