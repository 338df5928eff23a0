//! `lockwright list` on every kind of store: `run` holders of a lock, a
//! semaphore and a read lock, and an `elect` leader, under one prefix, are
//! listed with their holders; a released name is not; memcached says it
//! cannot list.

#![cfg(all(
    unix,
    feature = "sqlite",
    feature = "postgres",
    feature = "redis",
    feature = "memcached",
    feature = "zookeeper",
    feature = "etcd"
))]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{json_of, lockwright, output, unique, Reaped};
use lockwright_conformance::kit::servers;

/// `list --prefix P --json`: each name with its holders' count.
fn listed(dir: &Path, url: &str, prefix: &str) -> BTreeMap<String, usize> {
    let all = json_of(dir, &["list", "--url", url, "--prefix", prefix, "--json"]);
    all.as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let holders = s["holders"].as_array().unwrap();
            assert!(holders.iter().all(|h| h["id"].is_string()), "{url}: {s}");
            (s["key"].as_str().unwrap().to_owned(), holders.len())
        })
        .collect()
}

fn lists_every_kind(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let prefix = format!("{}/", unique("list"));
    let name = |n: &str| format!("{prefix}{n}");
    let start = |args: &[&str]| -> Reaped {
        let mut all = vec![args[0], "--url", url];
        all.extend_from_slice(&args[1..]);
        all.extend_from_slice(&["--", "sleep", "60"]);
        Reaped(lockwright(d, &all).spawn().unwrap())
    };
    let (lock, sem, readers, leader) = (name("lock"), name("sem"), name("readers"), name("leader"));
    // Held until the end of the test, then killed and reaped.
    let _runs = [
        start(&["run", "--key", &lock]),
        start(&["run", "--key", &sem, "--permits", "3"]),
        start(&["run", "--key", &sem, "--permits", "3"]),
        start(&["run", "--key", &readers, "--shared"]),
        start(&["elect", "--key", &leader, "--value", "node-1"]),
    ];
    let o = output(lockwright(
        d,
        &[
            "run",
            "--url",
            url,
            "--key",
            &name("released"),
            "--",
            "true",
        ],
    ));
    assert!(o.status.success(), "{url}");
    let expected: BTreeMap<String, usize> =
        [(lock, 1), (sem, 2), (readers, 1), (leader.clone(), 1)]
            .into_iter()
            .collect();
    let started = Instant::now();
    loop {
        let now = listed(d, url, &prefix);
        if now == expected {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{url}: listed {now:?}, expected {expected:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = output(lockwright(d, &["list", "--url", url, "--prefix", &prefix]));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!("{leader:?}")) && text.contains("value \"node-1\""),
        "{url}: {text}"
    );
}

#[test]
fn list_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    lists_every_kind(&format!("sqlite://{}", dir.path().join("l.db").display()));
}

#[test]
fn list_on_postgres() {
    lists_every_kind(&servers::postgres_url());
}

#[test]
fn list_on_redis() {
    lists_every_kind(&servers::redis_url());
}

#[test]
fn list_on_zookeeper() {
    lists_every_kind(&servers::zk_url());
}

#[test]
fn list_on_etcd() {
    lists_every_kind(&servers::etcd_url());
}

/// memcached has no key listing: `list` says so (64), not "nothing held".
#[test]
fn memcached_says_it_cannot_list() {
    let dir = tempfile::tempdir().unwrap();
    let o = output(lockwright(
        dir.path(),
        &["list", "--url", &servers::memcached_url()],
    ));
    assert_eq!(o.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot list"));
}
