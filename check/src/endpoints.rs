//! The TCP servers a store URL names, and the same URL pointed elsewhere:
//! `check` and `bench` put their own proxy between a client and each server
//! without knowing each store's URL grammar beyond its host list.

use std::net::SocketAddr;

use lockwright::backend::{driver, HostPort, RedactedUrl, ServerUrl};
use lockwright::{Error, Result};

/// A store URL and the TCP servers it names, parsed once by the core.
#[derive(Debug)]
pub(crate) struct Endpoints {
    url: ServerUrl,
    /// Each server (`host:port`, `[v6]:port`; the store's default port
    /// filled in).
    pub(crate) servers: Vec<String>,
}

impl Endpoints {
    /// The servers `url` names over TCP, or `None` for a store reached
    /// another way (an SQLite file, a Unix socket, this process's memory)
    /// or over TLS that verifies the server's name.
    ///
    /// # Errors
    /// `Config` for a URL whose scheme is unknown or that does not parse.
    pub(crate) fn of(url: &str) -> Result<Option<Endpoints>> {
        let (scheme, driver) = driver(url)?;
        let Some(port) = scheme.default_port else {
            return Ok(None);
        };
        let url = ServerUrl::parse(url, port)?;
        // The store's driver says which URLs a local proxy cannot stand in
        // for (TLS that checks the server's name; servers that name the
        // servers the client goes to next).
        if driver.is_direct(&url) || url.hosts().is_empty() {
            return Ok(None);
        }
        let servers = url.hosts().iter().map(HostPort::to_string).collect();
        Ok(Some(Endpoints { url, servers }))
    }

    /// The URL with the servers replaced, in order, by `127.0.0.1:<port>`.
    pub(crate) fn with_local_ports(&self, ports: &[u16]) -> String {
        let hosts: Vec<HostPort> = ports
            .iter()
            .map(|&p| HostPort::new("127.0.0.1", p))
            .collect();
        self.url
            .url_with(self.url.scheme(), &hosts)
            .expose()
            .to_owned()
    }

    /// Every server's address, resolved now.
    ///
    /// # Errors
    /// `Unavailable` for a name that does not resolve.
    pub(crate) async fn resolve(&self, url: &str) -> Result<Vec<SocketAddr>> {
        let mut out = Vec::with_capacity(self.servers.len());
        for s in &self.servers {
            let addr = tokio::net::lookup_host(s.as_str())
                .await
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| {
                    Error::unavailable(format!("{}: cannot resolve {s}", RedactedUrl::new(url)))
                })?;
            out.push(addr);
        }
        Ok(out)
    }
}

/// A local port where nothing listens (bound, then closed at once).
pub(crate) fn closed_port() -> Option<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
    l.local_addr().ok().map(|a| a.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_are_replaced_and_the_rest_kept() {
        let e = Endpoints::of("redis+redlock://a:1,b,[::1]:3/?timeout=1s")
            .unwrap()
            .unwrap();
        assert_eq!(e.servers, ["a:1", "b:6379", "[::1]:3"]);
        assert_eq!(
            e.with_local_ports(&[7, 8, 9]),
            "redis+redlock://127.0.0.1:7,127.0.0.1:8,127.0.0.1:9/?timeout=1s"
        );
        let e = Endpoints::of("postgres://u:p@w@db.example/x?mode=session")
            .unwrap()
            .unwrap();
        assert_eq!(e.servers, ["db.example:5432"]);
        assert_eq!(
            e.with_local_ports(&[5]),
            "postgres://u:p@w@127.0.0.1:5/x?mode=session"
        );
        let e = Endpoints::of("zk://h1:2181,h2:2182/locks")
            .unwrap()
            .unwrap();
        assert_eq!(
            e.with_local_ports(&[1, 2]),
            "zk://127.0.0.1:1,127.0.0.1:2/locks"
        );
        assert!(Endpoints::of("sqlite://x.db").unwrap().is_none());
        assert!(Endpoints::of("redis+unix:///tmp/r.sock").unwrap().is_none());
        assert!(Endpoints::of("memory://").unwrap().is_none());
        assert!(Endpoints::of("rediss://h:6380").unwrap().is_none());
        assert!(Endpoints::of("redis+sentinel://h:26379/m")
            .unwrap()
            .is_none());
        assert!(Endpoints::of("redis+cluster://h:7000,h:7001")
            .unwrap()
            .is_none());
        assert!(Endpoints::of("rediss+sentinel://h:26379/m")
            .unwrap()
            .is_none());
        assert!(Endpoints::of("rediss+cluster://h:7000").unwrap().is_none());
        assert!(Endpoints::of("etcds://h:2379").unwrap().is_none());
        assert!(Endpoints::of("postgres://h/db?sslmode=verify-full")
            .unwrap()
            .is_none());
        assert!(Endpoints::of("ftp://x").is_err());
    }
}
