//! What kind of server answers at an address, for [`connect`](crate::connect)
//! to turn "the store failed in a way no retry mends" into a `Config`
//! error that names what the server turned out to be: a `memcache://` URL
//! pointed at Redis, an `etcd://` one at Redis, a `zk://` one at
//! PostgreSQL. Only a positive identification changes an error: a server
//! this cannot name keeps the store's own error.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one probe may take in all: it runs only after the store's own
/// check failed, at start-up.
const PROBE: Duration = Duration::from_secs(2);

/// What answered: the store family's name, as the registry names stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answered {
    Redis,
    Memcached,
    Postgres,
    MySql,
    ZooKeeper,
    /// An HTTP/2 server (etcd serves gRPC over HTTP/2; so do others).
    Http2,
    /// A plain HTTP server.
    Http,
}

impl Answered {
    /// As the error message names it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Answered::Redis => "Redis",
            Answered::Memcached => "memcached",
            Answered::Postgres => "PostgreSQL",
            Answered::MySql => "MySQL/MariaDB",
            Answered::ZooKeeper => "ZooKeeper",
            Answered::Http2 => "an HTTP/2 (gRPC) server",
            Answered::Http => "an HTTP server",
        }
    }

    /// Whether a store the registry names `store` speaks this protocol.
    pub(crate) fn serves(self, store: &str) -> bool {
        match self {
            Answered::Redis => store.starts_with("Redis") || store == "Redlock",
            Answered::Memcached => store == "memcached",
            Answered::Postgres => store == "PostgreSQL",
            Answered::MySql => store == "MySQL/MariaDB",
            Answered::ZooKeeper => store == "ZooKeeper",
            // etcd serves gRPC over HTTP/2 and HTTP/1 on the same port; a
            // web server that is not etcd fails etcd's own checks with
            // its own error.
            Answered::Http2 | Answered::Http => store == "etcd",
        }
    }
}

/// What each address probed so far answered: each is probed once per
/// process. A probe that stops short of a handshake counts, on MySQL, as
/// a connection error against this host (`max_connect_errors`), so a
/// command that retries its connect must not probe with every retry.
static PROBED: std::sync::Mutex<Vec<(String, u16, Option<Answered>)>> =
    std::sync::Mutex::new(Vec::new());

/// Names the server at `host:port`, or `None` if nothing answers there
/// in time or the answer is not one this knows; asked once per process
/// (see [`PROBED`]).
pub(crate) async fn identify(host: &str, port: u16) -> Option<Answered> {
    let known = |probed: &[(String, u16, Option<Answered>)]| {
        probed
            .iter()
            .find(|(h, p, _)| h == host && *p == port)
            .map(|(_, _, a)| *a)
    };
    if let Some(a) = known(&PROBED.lock().unwrap_or_else(|e| e.into_inner())) {
        return a;
    }
    // `None` when nothing listened (or no answer came in time): asked
    // again next time, since a server may start there meanwhile.
    let answered = tokio::time::timeout(PROBE, probe(host, port))
        .await
        .ok()
        .flatten()?;
    let mut probed = PROBED.lock().unwrap_or_else(|e| e.into_inner());
    if known(&probed).is_none() && probed.len() < 64 {
        probed.push((host.to_owned(), port, answered));
    }
    answered
}

/// What answered at `host:port`: `None` if nothing listened there, else
/// what the server turned out to be, if this can tell.
async fn probe(host: &str, port: u16) -> Option<Option<Answered>> {
    let mut s = TcpStream::connect((host, port)).await.ok()?;
    Some(name(host, port, &mut s).await)
}

/// What the server on `s` (connected to `host:port`) is, if this can tell.
async fn name(host: &str, port: u16, s: &mut TcpStream) -> Option<Answered> {
    // MySQL and MariaDB speak first: a handshake packet, protocol 10.
    let mut buf = [0u8; 512];
    if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await {
        return (n > 4 && buf[4] == 10).then_some(Answered::MySql);
    }
    // A line the text protocols answer: Redis `+PONG` (or an error
    // reply), memcached `ERROR`, an HTTP/1 server a status line.
    s.write_all(b"PING\r\n").await.ok()?;
    let n = read_some(s, &mut buf).await;
    let reply = &buf[..n];
    if n > 0 {
        return if reply.starts_with(b"+PONG") || reply.starts_with(b"-") {
            Some(Answered::Redis)
        } else if reply.starts_with(b"ERROR") {
            Some(Answered::Memcached)
        } else if reply.starts_with(b"HTTP/") {
            Some(Answered::Http)
        } else {
            None
        };
    }
    // Closed, or silent: binary protocols, each asked on a connection of
    // its own with what it answers at once. ZooKeeper's `srvr` (a
    // four-letter word allowed by default); PostgreSQL's SSL request
    // (answered with one byte, `S` or `N`); HTTP/2's preface (answered
    // with a SETTINGS frame: etcd serves gRPC over it).
    let asks: [Ask; 3] = [
        (
            b"srvr",
            |r| r.starts_with(b"Zookeeper version"),
            Answered::ZooKeeper,
        ),
        (
            &[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f],
            |r| r == b"S" || r == b"N",
            Answered::Postgres,
        ),
        (
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            |r| r.len() >= 9 && r[3] == 0x04,
            Answered::Http2,
        ),
    ];
    for (ask, answers, what) in asks {
        let Ok(mut s) = TcpStream::connect((host, port)).await else {
            return None;
        };
        if s.write_all(ask).await.is_err() {
            continue;
        }
        let n = read_some(&mut s, &mut buf).await;
        if answers(&buf[..n]) {
            return Some(what);
        }
    }
    None
}

/// What to send on a connection of its own, whether the reply says the
/// server is of a kind, and which.
type Ask = (&'static [u8], fn(&[u8]) -> bool, Answered);

/// What the server sends within half a second (0 for nothing, or a close).
async fn read_some(s: &mut TcpStream, buf: &mut [u8]) -> usize {
    match tokio::time::timeout(Duration::from_millis(500), s.read(buf)).await {
        Ok(Ok(n)) => n,
        _ => 0,
    }
}
