//! Parsing `zk://` URLs into a [`ZkConfig`].

use std::time::Duration;

use lockwright_core::backend::{RedactedUrl, Scheme, ServerUrl};
use lockwright_core::{Error, Result};

use crate::layout;

/// The URL schemes this crate answers to.
pub const SCHEMES: &[Scheme] = &[
    Scheme::new("zk", "ZooKeeper", Some(2181)),
    Scheme::new("zookeeper", "ZooKeeper", Some(2181)),
];

/// Where the lock directories go when the URL names no path.
const DEFAULT_ROOT: &str = "/lockwright";

/// Where the locks live and how the client behaves.
///
/// `zk://[user:password@]host1[:port],host2[:port],…[/root/path][?params]`
/// (also `zookeeper://`). The hosts are one ensemble: the client fails over
/// between them on its own. Without a path the root is `/lockwright`.
/// With a user and password the client authenticates with the `digest`
/// scheme: the lock directories and nodes it creates give that identity,
/// and nobody else, any right to them, and the root path's levels it
/// creates let anyone else list them and create in them (their own keys).
///
/// Parameters: `session_timeout` (default 10s, at least 1s; the server may
/// grant a longer one, never accepted shorter: see [`ZkBackend`](crate::ZkBackend)),
/// `connect_timeout` (default 2s, per host; the client caps it at about
/// half the session timeout), `timeout` (how long one request may wait for
/// its answer, a reconnection of the session included, before it is
/// `Unavailable`; default 2s; a request that needs a new session first
/// waits for the connection, up to `connect_timeout` per host), and `retention` (how long an empty lock directory may stay
/// before the server reaps it: the server's
/// `znode.container.checkIntervalMs`, default 60s). Any other parameter is
/// refused, so that a misspelt one cannot silently change behaviour.
#[derive(Clone)]
pub struct ZkConfig {
    /// The URL as given, printing without its password.
    pub url: RedactedUrl,
    /// The ensemble's `host:port` list, comma-separated, each with a port.
    pub hosts: String,
    /// The root path under which each lock is a directory; `""` is the
    /// top of the tree.
    pub root: String,
    /// Digest credentials (`user`, `password`), percent-decoded.
    pub auth: Option<(String, String)>,
    /// The session timeout asked for.
    pub session_timeout: Duration,
    /// How long to wait for a connection to some server of the ensemble.
    pub connect_timeout: Duration,
    /// How long one request may wait for its answer.
    pub timeout: Duration,
    /// How long an empty lock directory may stay before it is reaped.
    pub retention: Duration,
}

impl std::fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The digest password is the identity's secret: only the user shows.
        f.debug_struct("ZkConfig")
            .field("url", &self.url)
            .field("hosts", &self.hosts)
            .field("root", &self.root)
            .field("user", &self.auth.as_ref().map(|(user, _)| user))
            .field("session_timeout", &self.session_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("retention", &self.retention)
            .finish()
    }
}

impl ZkConfig {
    /// Parses a `zk://` URL.
    ///
    /// # Errors
    /// `Config` for another scheme, no host, a bad port or root path, or
    /// bad credentials; `InvalidOptions` for an unknown parameter or a bad
    /// value.
    pub fn from_url(url: &str) -> Result<Self> {
        let mut u = ServerUrl::parse_for(SCHEMES, url)?;
        let shown = u.shown().clone();
        let p = u.params();
        let (ms, hour) = (Duration::from_millis(1), Duration::from_secs(3600));
        let session_timeout = p
            .duration("session_timeout", Duration::from_secs(1)..=hour)?
            .unwrap_or(Duration::from_secs(10));
        let connect_timeout = p
            .duration("connect_timeout", ms..=hour)?
            .unwrap_or(Duration::from_secs(2));
        let timeout = p
            .duration("timeout", ms..=hour)?
            .unwrap_or(Duration::from_secs(2));
        let retention = p
            .duration(
                "retention",
                Duration::from_secs(1)..=Duration::from_secs(24 * 3600),
            )?
            .unwrap_or(Duration::from_secs(60));
        u.finish(&[])?;
        let auth = credentials(&u)?;
        let hosts: Vec<String> = u
            .servers("zk://host:2181")?
            .iter()
            .map(ToString::to_string)
            .collect();
        Ok(ZkConfig {
            hosts: hosts.join(","),
            root: root_path(&u)?,
            auth,
            session_timeout,
            connect_timeout,
            timeout,
            retention,
            url: shown,
        })
    }
}

fn credentials(u: &ServerUrl) -> Result<Option<(String, String)>> {
    let shown = u.shown();
    let Some(user) = u.user()? else {
        return Ok(None);
    };
    let password = u.password()?.ok_or_else(|| {
        Error::config(format!(
            "{shown}: digest authentication needs user:password, not only a user name"
        ))
    })?;
    // The digest identity is `user:password`: a ':' in the user would make
    // another identity, and an empty one matches nobody's ACL.
    if user.is_empty() || user.contains(':') {
        return Err(Error::config(format!(
            "{shown}: the user name must be non-empty and hold no ':'"
        )));
    }
    Ok(Some((user, password)))
}

/// The root, from the URL's path. It is prefixed to every path we send,
/// not given to the client as a chroot: a chroot must exist before the
/// client connects, while the root's missing levels are made on first use.
fn root_path(u: &ServerUrl) -> Result<String> {
    // `zk://h` takes the default root; `zk://h/` is the top of the tree.
    let (shown, decoded) = (u.shown(), u.root(DEFAULT_ROOT)?);
    if decoded.is_empty() {
        return Ok(decoded);
    }
    for segment in decoded[1..].split('/') {
        if !layout::is_plain_name(segment) {
            return Err(Error::config(format!(
                "{shown}: {segment:?} is not a valid ZooKeeper node name in the root path"
            )));
        }
    }
    if decoded == "/zookeeper" || decoded.starts_with("/zookeeper/") {
        return Err(Error::config(format!(
            "{shown}: /zookeeper is ZooKeeper's own subtree"
        )));
    }
    Ok(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockwright_core::ErrorKind;

    #[test]
    fn a_full_url_reads_as_written() {
        let c = ZkConfig::from_url(
            "zk://alice:p%40ss@h1:2181,h2,[::1]:2182/apps/locks?session_timeout=6s&connect_timeout=3s",
        )
        .unwrap();
        assert_eq!(c.hosts, "h1:2181,h2:2181,[::1]:2182");
        assert_eq!(c.root, "/apps/locks");
        assert_eq!(c.auth, Some(("alice".into(), "p@ss".into())));
        assert_eq!(c.session_timeout, Duration::from_secs(6));
        assert_eq!(c.connect_timeout, Duration::from_secs(3));
        assert!(!c.url.to_string().contains("p%40ss"));
        assert!(!format!("{c:?}").contains("p@ss"), "{c:?}");
    }

    #[test]
    fn defaults_and_the_top_of_the_tree() {
        let c = ZkConfig::from_url("zookeeper://h").unwrap();
        assert_eq!(
            (c.hosts.as_str(), c.root.as_str()),
            ("h:2181", "/lockwright")
        );
        assert_eq!(c.auth, None);
        assert_eq!(c.session_timeout, Duration::from_secs(10));
        assert_eq!(c.retention, Duration::from_secs(60));
        let c = ZkConfig::from_url("zk://h:2181/").unwrap();
        assert_eq!(c.root, "");
    }

    #[test]
    fn bad_urls_are_typed_errors() {
        for (url, kind) in [
            ("zk://", ErrorKind::Config),
            ("zk://h1,,h2/x", ErrorKind::Config),
            ("zk://h:99999/x", ErrorKind::Config),
            ("zk://h:0/x", ErrorKind::Config),
            ("zk://h/a/../b", ErrorKind::Config),
            ("zk://h/a//b", ErrorKind::Config),
            ("zk://h/zookeeper/x", ErrorKind::Config),
            ("zk://alice@h/x", ErrorKind::Config),
            ("zk://:pw@h/x", ErrorKind::Config),
            ("zk://h/x?session_timeout=soon", ErrorKind::InvalidOptions),
            ("zk://h/x?session_timeout=200ms", ErrorKind::InvalidOptions),
            ("zk://h/x?retention=0s", ErrorKind::InvalidOptions),
            ("zk://h/x?sesion_timeout=6s", ErrorKind::InvalidOptions),
            ("redis://h", ErrorKind::Config),
        ] {
            let e = ZkConfig::from_url(url).expect_err(url);
            assert_eq!(e.kind(), kind, "{url}: {e}");
        }
    }
}
