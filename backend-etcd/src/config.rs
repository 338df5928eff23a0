//! Parsing `etcd://` URLs into an [`EtcdConfig`].

use std::time::Duration;

use lockwright_core::backend::{RedactedUrl, Scheme, ServerUrl, TlsFiles};
use lockwright_core::{Error, Result};

/// The URL schemes this crate answers to.
pub const SCHEMES: &[Scheme] = &[
    Scheme::new("etcd", "etcd", Some(2379)),
    Scheme::new("etcds", "etcd", Some(2379)),
];

/// Where the locks live when the URL names no path.
const DEFAULT_ROOT: &str = "/lockwright";

/// Where the locks live and how the client behaves.
///
/// `etcd://[user:password@]host1[:port],host2[:port],…[/root/prefix][?params]`.
/// The hosts are one cluster: the client balances over them and fails
/// over by itself. A lock `name` is the keys `<root>/<name>/<lease id in
/// hex>`, as Go's `concurrency.NewMutex(session, "<root>/<name>")` and
/// `etcdctl lock <root>/<name>` make them. Without a path the root is
/// `/lockwright`; with `/` it is the top of the keyspace (so `etcdctl lock
/// name` shares the lock `name`).
///
/// Parameters: `lease_ttl` (the session's lease, default 10s, 2s to 1h:
/// a crashed holder's lock frees that long after it was last heard from),
/// `connect_timeout` (default 2s) and `timeout` (how long one request may
/// wait for its answer before it is `Unavailable`, default 2s); for
/// `etcds://` (TLS), `tls_ca` (a PEM file of root certificates to trust
/// instead of the system's) and `tls_cert` with `tls_key` (PEM files of a
/// client certificate and key, for a cluster that authenticates clients).
/// Any other parameter is refused, so that a misspelt one cannot silently
/// change behaviour.
#[derive(Clone)]
pub struct EtcdConfig {
    /// The URL as given, printing without its password.
    pub url: RedactedUrl,
    /// The cluster's `host:port` endpoints.
    pub endpoints: Vec<String>,
    /// The prefix of every lock's keys, without a trailing `/`; `""` is
    /// the top of the keyspace.
    pub root: String,
    /// Credentials (`user`, `password`), percent-decoded.
    pub auth: Option<(String, String)>,
    /// The TTL of the lease each backend holds its keys on.
    pub lease_ttl: Duration,
    /// How long to wait for a connection.
    pub connect_timeout: Duration,
    /// How long one request may wait for its answer.
    pub timeout: Duration,
    /// TLS (`etcds://`), with the files it names; `None` for `etcd://`.
    pub tls: Option<TlsFiles>,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("url", &self.url)
            .field("endpoints", &self.endpoints)
            .field("root", &self.root)
            .field("user", &self.auth.as_ref().map(|(user, _)| user))
            .field("lease_ttl", &self.lease_ttl)
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("tls", &self.tls)
            .finish()
    }
}

impl EtcdConfig {
    /// Parses an `etcd://` or `etcds://` URL.
    ///
    /// # Errors
    /// `Config` for another scheme, no host, a bad port, root or
    /// credentials, or TLS files on an `etcd://` URL or a certificate
    /// without its key; `InvalidOptions` for an unknown parameter or a bad
    /// value.
    pub fn from_url(url: &str) -> Result<Self> {
        let mut u = ServerUrl::parse_for(SCHEMES, url)?;
        let shown = u.shown().clone();
        let p = u.params();
        let (ms, hour) = (Duration::from_millis(1), Duration::from_secs(3600));
        // etcd raises a shorter TTL to 1.5 election timeouts (2 s by
        // default): the lost signal must be timed on the lease it keeps.
        let lease_ttl = p
            .duration("lease_ttl", Duration::from_secs(2)..=hour)?
            .unwrap_or(Duration::from_secs(10));
        let connect_timeout = p
            .duration("connect_timeout", ms..=hour)?
            .unwrap_or(Duration::from_secs(2));
        let timeout = p
            .duration("timeout", ms..=hour)?
            .unwrap_or(Duration::from_secs(2));
        let files = TlsFiles::from_params(p)?;
        u.finish(&[])?;
        let tls = u.scheme() == "etcds";
        files.check(&shown, tls, "etcds")?;
        let auth = match u.user()? {
            None => None,
            Some(user) => {
                let password = u.password()?.ok_or_else(|| {
                    Error::config(format!("{shown}: a user needs a password (user:password@)"))
                })?;
                Some((user, password))
            }
        };
        let endpoints = u
            .servers("etcd://host:2379")?
            .iter()
            .map(ToString::to_string)
            .collect();
        Ok(EtcdConfig {
            endpoints,
            root: u.root(DEFAULT_ROOT)?,
            auth,
            lease_ttl,
            connect_timeout,
            timeout,
            tls: tls.then_some(files),
            url: shown,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_root_credentials_and_parameters() {
        let c = EtcdConfig::from_url(
            "etcd://u:p%40ss@127.0.0.1:2379,127.0.0.2/apps/locks/?lease_ttl=30s&timeout=500ms",
        )
        .unwrap();
        assert_eq!(c.endpoints, ["127.0.0.1:2379", "127.0.0.2:2379"]);
        assert_eq!(c.root, "/apps/locks");
        assert_eq!(c.auth, Some(("u".into(), "p@ss".into())));
        assert_eq!(c.lease_ttl, Duration::from_secs(30));
        assert_eq!(c.timeout, Duration::from_millis(500));
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        assert!(!format!("{c:?}").contains("p@ss"));
        assert_eq!(
            EtcdConfig::from_url("etcd://h").unwrap().root,
            "/lockwright"
        );
        assert_eq!(EtcdConfig::from_url("etcd://h/").unwrap().root, "");
        assert_eq!(EtcdConfig::from_url("etcd://h").unwrap().tls, None);
        let tls = EtcdConfig::from_url("etcds://h?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/c.key")
            .unwrap()
            .tls
            .unwrap();
        assert_eq!(tls.ca.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert_eq!(tls.key.as_deref(), Some(std::path::Path::new("/c.key")));
    }

    #[test]
    fn bad_urls_are_typed_errors() {
        use lockwright_core::ErrorKind::{Config, InvalidOptions};
        for (url, kind) in [
            ("redis://h", Config),
            ("etcd://", Config),
            ("etcd://h:notaport", Config),
            ("etcd://u@h", Config),
            ("etcd://h?lease_ttl=1s", InvalidOptions),
            ("etcd://h?lease_ttl=banana", InvalidOptions),
            ("etcd://h?ttl=10s", InvalidOptions),
            ("etcd://h/%zz", Config),
            ("etcd://h?tls_ca=/ca.pem", Config),
            ("etcds://h?tls_cert=/c.pem", Config),
            ("etcds://h?tls_ca", Config),
        ] {
            let e = EtcdConfig::from_url(url).expect_err(url);
            assert_eq!(e.kind(), kind, "{url}: {e}");
        }
    }
}
