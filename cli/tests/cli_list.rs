//! `lockwright list` on every kind of store: `run` holders of a lock, a
//! semaphore and a read lock, and an `elect` leader, under one prefix, are
//! listed with their holders and who each is (host, pid, `--label`, shown
//! escaped); a released name is not; memcached says it cannot list, and
//! shows who holds in `status`. A label over 128 bytes is refused.

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

/// `list --prefix P --json`: each name with its holders' labels, sorted
/// (`?` for a holder that says nothing of itself).
fn listed(dir: &Path, url: &str, prefix: &str) -> BTreeMap<String, Vec<String>> {
    let all = json_of(dir, &["list", "--url", url, "--prefix", prefix, "--json"]);
    all.as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let holders = s["holders"].as_array().unwrap();
            assert!(holders.iter().all(|h| h["id"].is_string()), "{url}: {s}");
            let mut labels: Vec<String> = holders.iter().map(|h| label_of(url, h)).collect();
            labels.sort();
            (s["key"].as_str().unwrap().to_owned(), labels)
        })
        .collect()
}

/// A holder's label, after checking that its host and pid are there.
fn label_of(url: &str, holder: &serde_json::Value) -> String {
    let who = &holder["who"];
    if who.is_null() {
        return "?".to_owned();
    }
    assert!(
        who["pid"].as_u64().is_some_and(|p| p > 0),
        "{url}: {holder}"
    );
    assert!(
        who["host"].as_str().is_some_and(|h| !h.is_empty()),
        "{url}: {holder}"
    );
    who["label"].as_str().unwrap_or("-").to_owned()
}

/// A label with a quote and a newline, shown escaped in text.
const ODD_LABEL: &str = "reader \"q\"\nline";

fn lists_every_kind(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let prefix = format!("{}/", unique("list"));
    let name = |n: &str| format!("{prefix}{n}");
    let start = |args: &[&str], label: &str| -> Reaped {
        let mut all = vec![args[0], "--url", url, "--label", label];
        all.extend_from_slice(&args[1..]);
        all.extend_from_slice(&["--", "sleep", "60"]);
        Reaped(lockwright(d, &all).spawn().unwrap())
    };
    let (lock, sem, readers, leader) = (name("lock"), name("sem"), name("readers"), name("leader"));
    // Held until the end of the test, then killed and reaped.
    let _runs = [
        start(&["run", "--key", &lock], "lock-1"),
        start(&["run", "--key", &sem, "--permits", "3"], "sem-a"),
        start(&["run", "--key", &sem, "--permits", "3"], "sem-b"),
        start(&["run", "--key", &readers, "--shared"], ODD_LABEL),
        start(
            &["elect", "--key", &leader, "--value", "node-1"],
            "leader-1",
        ),
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
    let labels = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let expected: BTreeMap<String, Vec<String>> = [
        (lock, labels(&["lock-1"])),
        (sem, labels(&["sem-a", "sem-b"])),
        (readers, labels(&[ODD_LABEL])),
        (leader.clone(), labels(&["leader-1"])),
    ]
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
    assert!(
        text.contains(r#"by reader \"q\"\nline on "#) && text.contains("by leader-1 on "),
        "{url}: the labels, escaped: {text}"
    );
    // The identity records are not names an application holds.
    let everything = json_of(d, &["list", "--url", url, "--json"]);
    assert!(
        !everything.to_string().contains("lockwright/holder/"),
        "{url}: {everything}"
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

#[test]
fn list_on_mysql() {
    lists_every_kind(&servers::mysql_url());
}

/// memcached has no key listing: `list` says so (64), not "nothing held";
/// `status` shows who holds.
#[test]
fn memcached_says_it_cannot_list() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let url = servers::memcached_url();
    let o = output(lockwright(d, &["list", "--url", &url]));
    assert_eq!(o.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot list"));
    let key = unique("who");
    let run = [
        "run", "--url", &url, "--label", "mc-1", "--key", &key, "--", "sleep", "60",
    ];
    let _run = Reaped(lockwright(d, &run).spawn().unwrap());
    let started = Instant::now();
    loop {
        let s = json_of(d, &["status", "--url", &url, "--key", &key, "--json"]);
        let holders = s["holders"].as_array().unwrap();
        if holders.len() == 1 && label_of(&url, &holders[0]) == "mc-1" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{s}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A label over 128 bytes is refused before anything is taken or run.
#[test]
fn a_long_label_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let url = format!("sqlite://{}", d.join("l.db").display());
    let long = "x".repeat(10 * 1024);
    let marker = d.join("ran");
    let touch = format!("touch {}", marker.display());
    let o = output(lockwright(
        d,
        &[
            "run", "--url", &url, "--label", &long, "--key", "k", "--", "sh", "-c", &touch,
        ],
    ));
    assert_eq!(o.status.code(), Some(64), "{o:?}");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("at most 128 bytes"), "{stderr}");
    assert!(stderr.len() < 500, "the label is not echoed back: {stderr}");
    assert!(!marker.exists(), "the command did not run");
}
