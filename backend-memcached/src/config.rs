//! Parsing `memcache://` and `memcaches://` URLs into a [`MemcachedConfig`].

use std::time::Duration;

use lockwright_core::backend::{quorum_servers, RedactedUrl, Scheme, ServerUrl, TlsFiles};
use lockwright_core::{Error, Result};

/// The URL schemes this crate answers to.
pub const SCHEMES: &[Scheme] = &[
    Scheme::new("memcache", "memcached", Some(11211)),
    Scheme::new("memcached", "memcached", Some(11211)),
    Scheme::new("memcaches", "memcached", Some(11211)),
];

/// The longest key prefix: a hashed key (`<prefix>#` and 64 hex digits)
/// must stay within memcached's 250 bytes.
const MAX_PREFIX: usize = 100;
/// Connections per server by default: a few requests in flight at once;
/// a batch of renewals needs one.
const DEFAULT_CONNECTIONS: usize = 4;
/// The most connections per server a URL may ask for.
const MAX_CONNECTIONS: usize = 64;

/// Where the locks live and how the client behaves.
///
/// `memcache://host1[:port][,host2[:port],…][?params]` (also
/// `memcached://`), or `memcaches://…` for TLS to every server (memcached
/// run with `-Z`). One server holds the locks; several are a **quorum**
/// (Redlock's rules, never key hashing across servers). memcached's text
/// protocol has no authentication, so a user or password is refused
/// (a client certificate is the way to keep clients out).
///
/// Parameters: `prefix` (prepended to every key, default `lockwright:`;
/// printable ASCII without spaces, at most 100 bytes), `timeout` (one
/// exchange with one server, default 1s; 100ms in a quorum; an operation
/// of two exchanges, and a redial, may take up to `timeout` +
/// `connect_timeout`), `connect_timeout` (default 1s), and `connections`
/// (the most connections a backend opens to each server, default 4, 1 to
/// 64: requests wait for a free one, and a batch of renewals shares one);
/// for `memcaches://`, `tls_ca` (a PEM file of root certificates to trust
/// instead of the system's) and `tls_cert` with `tls_key` (PEM files of a
/// client certificate and key, for a server run with `ssl_verify_mode=2`).
/// Each server's certificate must name the host the URL gives for it.
/// Any other parameter is refused. Several servers must be at least 3.
#[derive(Debug, Clone)]
pub struct MemcachedConfig {
    /// The URL as given.
    pub url: RedactedUrl,
    /// One `host:port` per server, each with a port.
    pub servers: Vec<String>,
    /// Prepended to every memcached key this backend writes.
    pub prefix: String,
    /// How long one request to one server may take.
    pub timeout: Duration,
    /// How long a connection to one server may take to open.
    pub connect_timeout: Duration,
    /// The most connections open to each server at once.
    pub connections: usize,
    /// TLS (`memcaches://`), with the files it names; `None` for plain text.
    pub tls: Option<TlsFiles>,
}

impl MemcachedConfig {
    /// Parses a `memcache://` or `memcaches://` URL (the TLS files are
    /// only named here; the backend reads them).
    ///
    /// # Errors
    /// `Config` for another scheme, no host, a bad port, credentials, a
    /// server named twice, or TLS files on a plain-text URL or a
    /// certificate without its key; `InvalidOptions` for an unknown
    /// parameter or a bad value.
    pub fn from_url(url: &str) -> Result<Self> {
        let mut u = ServerUrl::parse_for(SCHEMES, url)?;
        let shown = u.shown().clone();
        let p = u.params();
        let (ms, hour) = (Duration::from_millis(1), Duration::from_secs(3600));
        let prefix = p
            .text("prefix")?
            .unwrap_or_else(|| "lockwright:".to_owned());
        let timeout = p.duration("timeout", ms..=hour)?;
        let connect_timeout = p
            .duration("connect_timeout", ms..=hour)?
            .unwrap_or(Duration::from_secs(1));
        let connections = p.integer("connections", 1..=MAX_CONNECTIONS)?;
        let files = TlsFiles::from_params(p)?;
        u.finish(&[])?;
        let tls = u.scheme() == "memcaches";
        files.check(&shown, tls, "memcaches")?;
        if u.has_userinfo() {
            return Err(Error::config(format!(
                "{shown}: memcached's text protocol has no authentication; remove the user and password"
            )));
        }
        if !matches!(u.path(), "" | "/") {
            return Err(Error::config(format!(
                "{shown}: a memcached URL has no path; expected memcache://host:11211"
            )));
        }
        let servers: Vec<String> = u
            .servers("memcache://host:11211")?
            .iter()
            .map(ToString::to_string)
            .collect();
        if servers.len() > 1 {
            // One server under two names would make a fake quorum.
            quorum_servers(&u, "memcached")?;
        }
        if prefix.len() > MAX_PREFIX || !prefix.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(p_invalid(&shown, "prefix"));
        }
        let default_timeout = if servers.len() > 1 {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(1)
        };
        Ok(MemcachedConfig {
            url: shown,
            servers,
            prefix,
            timeout: timeout.unwrap_or(default_timeout),
            connect_timeout,
            connections: connections.unwrap_or(DEFAULT_CONNECTIONS),
            tls: tls.then_some(files),
        })
    }
}

fn p_invalid(shown: &RedactedUrl, name: &str) -> Error {
    Error::invalid_options(format!(
        "{shown}: {name} must be printable ASCII without spaces, at most {MAX_PREFIX} bytes"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockwright_core::ErrorKind;

    #[test]
    fn urls_read_as_written() {
        let c = MemcachedConfig::from_url("memcache://h1,H2:11212,h3?prefix=app:&timeout=50ms")
            .unwrap();
        assert_eq!(c.servers, ["h1:11211", "h2:11212", "h3:11211"]);
        assert_eq!(c.prefix, "app:");
        assert_eq!(c.timeout, Duration::from_millis(50));
        assert_eq!(c.connections, 4);
        let c = MemcachedConfig::from_url("memcache://h?connections=1").unwrap();
        assert_eq!(c.connections, 1);
        let c = MemcachedConfig::from_url("memcached://127.0.0.1:11211").unwrap();
        assert_eq!((c.servers.len(), c.timeout), (1, Duration::from_secs(1)));
        let c = MemcachedConfig::from_url("memcache://a,b,c").unwrap();
        assert_eq!(c.timeout, Duration::from_millis(100));
        assert_eq!(c.tls, None);
        let c = MemcachedConfig::from_url(
            "memcaches://h1,h2,h3:11212?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/c.key",
        )
        .unwrap();
        assert_eq!(c.servers, ["h1:11211", "h2:11211", "h3:11212"]);
        let tls = c.tls.unwrap();
        assert_eq!(tls.ca.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert_eq!(tls.key.as_deref(), Some(std::path::Path::new("/c.key")));
        // No file: the system's roots.
        let c = MemcachedConfig::from_url("memcaches://h").unwrap();
        assert_eq!(c.tls, Some(TlsFiles::default()));
    }

    #[test]
    fn bad_urls_are_typed_errors() {
        for (url, kind) in [
            ("memcache://", ErrorKind::Config),
            ("memcache://h,,x", ErrorKind::Config),
            ("memcache://h:0", ErrorKind::Config),
            ("memcache://h:x", ErrorKind::Config),
            ("memcache://u:pw@h", ErrorKind::Config),
            ("memcache://h/db", ErrorKind::Config),
            ("memcache://h,H:11211,x", ErrorKind::Config),
            ("memcache://a,b", ErrorKind::Config),
            (
                "memcache://127.0.0.1:11211,localhost:11211,h",
                ErrorKind::Config,
            ),
            ("memcache://h?prefix=a%20b", ErrorKind::InvalidOptions),
            ("memcache://h?prefx=a", ErrorKind::InvalidOptions),
            ("memcache://h?timeout=soon", ErrorKind::InvalidOptions),
            ("memcache://h?connections=0", ErrorKind::InvalidOptions),
            ("memcache://h?connections=65", ErrorKind::InvalidOptions),
            ("redis://h", ErrorKind::Config),
            // TLS files need memcaches://, and a certificate its key.
            ("memcache://h?tls_ca=/ca.pem", ErrorKind::Config),
            ("memcaches://h?tls_cert=/c.pem", ErrorKind::Config),
            ("memcaches://h?tls_ca", ErrorKind::Config),
        ] {
            let e = MemcachedConfig::from_url(url).expect_err(url);
            assert_eq!(e.kind(), kind, "{url}: {e}");
        }
    }
}
