//! A URL whose scheme names one kind of store, pointed at a server of
//! another kind (or at a MySQL server with no database): `run` exits 64,
//! "configuration that retrying will not fix", at once and naming what the
//! server turned out to be where it can tell; never 69 (which `--wait`
//! would retry for its whole length) or 76.

#![cfg(all(
    feature = "redis",
    feature = "mysql",
    feature = "etcd",
    feature = "memcached",
    feature = "zookeeper"
))]

mod common;

use std::time::{Duration, Instant};

use common::{lockwright, output};
use lockwright_conformance::kit::servers;

/// `run … --wait 60s -- true` on `url`: its exit code and stderr, and how
/// long it took.
fn run(url: &str) -> (i32, String, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let o = output(lockwright(
        dir.path(),
        &[
            "run",
            "--url",
            url,
            "--key",
            "wrong-server",
            "--wait",
            "60s",
            "--",
            "true",
        ],
    ));
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        start.elapsed(),
    )
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .expect("a port")
}

#[test]
fn a_server_of_another_kind_is_a_configuration_error() {
    let redis = port_of(&servers::redis_url());
    let sentinel = servers::redis_sentinel_ports()[0];
    let mysql = servers::mysql_url();
    // The MySQL test URL without its database.
    let no_db = mysql[..mysql.rfind('/').expect("a database path")].to_owned();
    for (url, says) in [
        (no_db, "names no database"),
        (
            format!("redis+cluster://127.0.0.1:{redis}"),
            "not a Redis Cluster node",
        ),
        (
            format!("redis+sentinel://127.0.0.1:{redis}/mymaster"),
            "not a Sentinel",
        ),
        (
            format!("redis://127.0.0.1:{sentinel}"),
            "answered as a Redis Sentinel",
        ),
        (
            format!("etcd://127.0.0.1:{redis}/x"),
            "answered as Redis, not etcd",
        ),
        (
            format!("memcache://127.0.0.1:{redis}"),
            "answered as Redis, not memcached",
        ),
        (
            format!("zk://127.0.0.1:{redis}/x"),
            "answered as Redis, not ZooKeeper",
        ),
        (
            format!("redis://127.0.0.1:{}", port_of(&servers::memcached_url())),
            "answered as memcached, not Redis",
        ),
    ] {
        let (code, err, took) = run(&url);
        assert_eq!(code, 64, "{url}: {err}");
        assert!(err.contains(says), "{url}: {err}");
        // Not retried for the wait's 60 s.
        assert!(took < Duration::from_secs(40), "{url} took {took:?}: {err}");
    }
}
