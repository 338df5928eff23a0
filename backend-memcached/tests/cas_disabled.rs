//! A memcached run with CAS disabled (`-C`): every item's CAS is 0.
//!
//! The backend remembers the CAS its own last write of a lock left, to
//! release (`md <key> C<cas>`) and renew (`cas … <cas>`) without reading
//! the item first (`known.rs`). A CAS value names one version of one
//! item, so such a write needs no owner check... unless every version of
//! every item is named 0. On a `-C` server (memcached 1.6.18, checked by
//! hand) `md <key> C0` deletes whatever item is there, any owner's
//! (`HD`; `C7` answers `EX`), while a classic `cas` is refused
//! (`EXISTS`) whatever CAS it carries. So a remembered 0 must never be
//! used: the owner would go unchecked.

use std::time::{Duration, Instant};

use lockwright_conformance::kit::free_port;
use lockwright_core::backend::{Acquire, LockBackend, LockBackendExt, Release, Renew};
use lockwright_core::{ErrorKind, LockKey, OwnerToken};
use lockwright_memcached::MemcachedBackend;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

mod common;

use common::OwnServer;

const PREFIX: &str = "cas0:";
/// The backend's shortest TTL (memcached counts whole seconds).
const TTL: Duration = Duration::from_secs(2);

/// A memcached of the test's own with CAS disabled, started as the lock
/// servers are (`-M -o no_slab_reassign`, see the crate docs), killed
/// with the test; and its `host:port`.
fn cas_disabled_server() -> (OwnServer, String) {
    let server = OwnServer::start_with(free_port(), 64, &["-C"]);
    let addr = server.addr();
    (server, addr)
}

/// A client of its own (its own connections, its own remembered CAS
/// values).
fn client(addr: &str) -> MemcachedBackend {
    MemcachedBackend::connect(&format!("memcache://{addr}?prefix={PREFIX}")).expect("a valid URL")
}

/// `command`'s reply lines, up to and including the first that `last`
/// says ends it, on a connection of its own.
async fn raw(addr: &str, command: &str, last: impl Fn(&str) -> bool) -> Vec<String> {
    let mut s = BufReader::new(TcpStream::connect(addr).await.unwrap());
    s.get_mut().write_all(command.as_bytes()).await.unwrap();
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        let n = s.read_line(&mut line).await.unwrap();
        assert!(n > 0, "{addr} closed the connection after {lines:?}");
        let line = line.trim_end().to_owned();
        let done = last(line.as_str());
        lines.push(line);
        if done {
            return lines;
        }
    }
}

/// The premise: the server has CAS off and answers 0 as `name`'s CAS.
async fn assert_cas_zero(addr: &str, name: &str) {
    let end = |l: &str| l == "END" || l.starts_with("ERROR");
    let settings = raw(addr, "stats settings\r\n", end).await;
    assert!(
        settings.iter().any(|l| l == "STAT cas_enabled no"),
        "the server runs with CAS on: {settings:?}"
    );
    let read = raw(addr, &format!("mg {PREFIX}{name} c\r\n"), |_| true).await;
    assert_eq!(read, ["HD c0"], "the item's CAS as the server answers it");
}

/// Takes `key` for `owner` (for 30 s) as soon as the lease on it ends.
async fn take_once_expired(b: &MemcachedBackend, key: &LockKey, owner: &OwnerToken) {
    let start = Instant::now();
    loop {
        match b
            .try_lock(key, owner, Duration::from_secs(30))
            .await
            .unwrap()
        {
            Acquire::Acquired(_) => return,
            Acquire::Contended { .. } => {}
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "the lease on {key} never ended"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The line that keeps a CAS of 0 out of the fast paths is in
/// backend-memcached/src/node.rs, `KnownCas::note` (line 257):
///     }) if h.owner == owner.as_str() && h.holds == holds && *cas != 0 => self.put(
/// Remove `&& *cas != 0` to see this fail: A's grant is then remembered
/// with CAS 0 (the `mg` sent with its `add` answers `c0`), and once B
/// holds the lock, A's release takes the fast path over that connection
/// (still open: it was opened before the write, so `release_known` uses
/// it) and sends `md <key> C0`. On a `-C` server B's item has CAS 0 too,
/// so it matches: B's lock is deleted and A is told `Freed`. The asserts
/// on A's release, on the third client's `Contended` and on `inspect`
/// all fail then.
///
/// The renewal half does NOT catch that mutation on memcached 1.6.18 (the
/// Debian 12 server `scripts/test` installs): there a classic `cas` is
/// refused on a `-C` server whatever CAS it carries, so the fast renewal
/// (`cas … 0`) fails, falls back to the read, which finds B's owner and
/// answers `NotHeld` either way. It is kept as a check of the owner on
/// renewal, and would catch it on a memcached that stores `cas … 0`. It
/// runs on a lock of its own, after the release: a renewal of the same
/// lock first would use up (take) the remembered CAS, and the release
/// after it would read and check, hiding the mutation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_holder_can_neither_release_nor_renew_the_next_holders_lock() {
    let (_server, addr) = cas_disabled_server();
    let (a, b, c) = (client(&addr), client(&addr), client(&addr));
    let (a_owner, b_owner) = (OwnerToken::generate(), OwnerToken::generate());
    let released = LockKey::new("released").unwrap();
    let renewed = LockKey::new("renewed").unwrap();

    for key in [&released, &renewed] {
        let got = a.try_lock(key, &a_owner, TTL).await.unwrap();
        assert!(matches!(got, Acquire::Acquired(_)), "{key}: {got:?}");
    }
    assert_cas_zero(&addr, "released").await;

    // A's leases run out (whole seconds, sent as TTL + 2 s); B takes both.
    for key in [&released, &renewed] {
        take_once_expired(&b, key, &b_owner).await;
    }

    let release = a.unlock(&released, &a_owner).await;
    let renew = a.renew_lock(&renewed, &a_owner, TTL).await;
    assert!(
        matches!(release, Ok(Release::NotHeld)),
        "A's release of the lock B holds now: {release:?}"
    );
    assert!(
        matches!(renew, Ok(Renew::NotHeld)),
        "A's renewal of the lock B holds now: {renew:?}"
    );

    // B still holds both, untouched.
    let other = OwnerToken::generate();
    for key in [&released, &renewed] {
        let got = c.try_lock(key, &other, TTL).await.unwrap();
        assert!(
            matches!(got, Acquire::Contended { .. }),
            "a third client on {key}, which B holds: {got:?}"
        );
        let status = c.inspect(key).await.unwrap();
        assert!(status.held, "{key}: {status:?}");
        assert_eq!(
            status.owner.as_ref().map(OwnerToken::as_str),
            Some(b_owner.as_str()),
            "{key}: its holder"
        );
        assert_eq!(b.unlock(key, &b_owner).await.unwrap(), Release::Freed);
    }
}

/// The plain path works on a `-C` server: a lock is taken and released by
/// its owner (`md … C0` over the version just read, the owner checked).
/// A renewal by its owner is not a success there on memcached 1.6.18: a
/// classic `cas` is refused (`EXISTS`) with CAS off, so it ends
/// `Unavailable` ("kept changing"), and the lock stays its owner's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_takes_and_releases_a_lock_on_a_cas_disabled_server() {
    let (_server, addr) = cas_disabled_server();
    let a = client(&addr);
    let owner = OwnerToken::generate();
    let key = LockKey::new("plain").unwrap();
    let ttl = Duration::from_secs(10);

    for round in 0..2 {
        let got = a.try_lock(&key, &owner, ttl).await.unwrap();
        assert!(
            matches!(got, Acquire::Acquired(_)),
            "round {round}: {got:?}"
        );
        if round == 0 {
            assert_cas_zero(&addr, "plain").await;
        }
        match a.renew_lock(&key, &owner, ttl).await {
            Ok(Renew::Renewed) => {}
            Err(e) if e.kind() == ErrorKind::Unavailable => {}
            other => panic!("round {round}: the owner's renewal: {other:?}"),
        }
        let status = a.inspect(&key).await.unwrap();
        assert!(status.held, "round {round}: {status:?}");
        assert_eq!(
            status.owner.as_ref().map(OwnerToken::as_str),
            Some(owner.as_str())
        );
        assert_eq!(a.unlock(&key, &owner).await.unwrap(), Release::Freed);
        assert!(!a.inspect(&key).await.unwrap().held, "round {round}");
    }
}

/// A server run with `-C` is refused when the store is checked (at
/// `connect`, and by `check`): a renewal must match the item's CAS, which
/// such a server never gives, so every lock would end at its first TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cas_disabled_server_is_refused_when_checked() {
    let (_server, addr) = cas_disabled_server();
    let e = client(&addr)
        .verify()
        .await
        .expect_err("a server with CAS disabled is refused");
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.to_string().contains("-C"), "{e}");
}
