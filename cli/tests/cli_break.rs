//! `lockwright break` on every kind of store, as an operator uses it: a
//! `run` holder frozen with SIGSTOP is broken, the waiter proceeds at once
//! with a higher fence, and the thawed holder exits 70 without touching
//! the new holder's lock. Also: one permit of three broken leaves two,
//! and the refusals (no confirmation, an unknown id, several holders).

#![cfg(all(
    unix,
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis",
    feature = "memcached",
    feature = "zookeeper",
    feature = "etcd"
))]

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{json_of, lockwright, output, unique, wait_exit, Reaped};
use lockwright_conformance::kit::{servers, with_params};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// `status --json` of `key`.
fn status(dir: &Path, url: &str, key: &str) -> serde_json::Value {
    json_of(dir, &["status", "--url", url, "--key", key, "--json"])
}

/// The ids of `key`'s holders, once `n` hold it (within 20 s).
fn holders(dir: &Path, url: &str, key: &str, n: usize) -> Vec<String> {
    let start = Instant::now();
    loop {
        let s = status(dir, url, key);
        let ids: Vec<String> = s["holders"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["id"].as_str().unwrap_or_default().to_owned())
            .collect();
        if ids.len() == n {
            assert!(
                ids.iter().all(|i| !i.is_empty()),
                "{url}: a holder without an id: {s}"
            );
            return ids;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{url}: never {n} holders: {s}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `lockwright run` of `script` on `key` with a lease of `ttl`, its
/// stderr piped.
fn holder(dir: &Path, url: &str, key: &str, ttl: &str, extra: &[&str], script: &str) -> Reaped {
    let mut args = vec!["run", "--url", url, "--key", key, "--ttl", ttl];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    Reaped(
        lockwright(dir, &args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

/// The fence a holder's command wrote to `file`, once it is there.
fn fence_in(file: &Path) -> Option<u64> {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(file) {
            if text.ends_with('\n') {
                return text.trim().parse().ok();
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{} never written",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A script that waits until `file` exists.
fn until(file: &Path) -> String {
    format!("while [ ! -e {} ]; do sleep 0.1; done", file.display())
}

/// `fenced`: the store gives fences, so both holders must have one.
fn break_frozen_holder(url: &str, fenced: bool) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = unique("break");
    let (first, second, done) = (d.join("first"), d.join("second"), d.join("done"));
    let write =
        |f: &Path, then: &str| format!("echo \"$LOCKWRIGHT_FENCE\" > {}; {then}", f.display());
    // A lease of 30 s (on ZooKeeper and etcd the URL's session or lease):
    // the waiter gets in at the break, not when the frozen hold ends.
    let mut stuck = holder(d, url, &key, "30s", &[], &write(&first, "sleep 60"));
    fence_in(&first);
    let id = holders(d, url, &key, 1).remove(0);
    let mut waiter = holder(
        d,
        url,
        &key,
        "3s",
        &["--wait", "60s"],
        &write(&second, &until(&done)),
    );
    let frozen = Pid::from_raw(i32::try_from(stuck.id()).unwrap());
    kill(frozen, Signal::SIGSTOP).unwrap();

    // Without --yes and with no terminal to ask on, nothing is broken.
    let o = output(lockwright(d, &["break", "--url", url, "--key", &key]));
    assert_eq!(
        o.status.code(),
        Some(64),
        "{url}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--yes"),
        "{url}"
    );
    let o = output(lockwright(
        d,
        &[
            "break", "--url", url, "--key", &key, "--holder", "o00", "--yes",
        ],
    ));
    assert_eq!(o.status.code(), Some(66), "{url}: an unknown id");
    assert_eq!(
        holders(d, url, &key, 1),
        std::slice::from_ref(&id),
        "{url}: the refusals broke nothing"
    );

    let broken_at = Instant::now();
    let o = output(lockwright(
        d,
        &[
            "break", "--url", url, "--key", &key, "--holder", &id, "--yes",
        ],
    ));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{url}: {err}");
    assert!(
        err.contains("broke a hold")
            && err.contains(&id)
            && err.contains(&key)
            && err.contains(" pid ")
            && err.contains("by=\""),
        "{url}: the audit line names the holder, the key and who broke it: {err}"
    );
    let (old, new) = (fence_in(&first), fence_in(&second));
    assert!(
        broken_at.elapsed() < Duration::from_secs(10),
        "{url}: the waiter took {:?} after the break",
        broken_at.elapsed()
    );
    match (fenced, old, new) {
        (true, Some(old), Some(new)) => {
            assert!(
                new > old,
                "{url}: fence {new} after the break, {old} before"
            )
        }
        (false, None, None) => {}
        other => panic!("{url}: fences (fenced, before, after) {other:?}"),
    }
    let new_id = holders(d, url, &key, 1).remove(0);
    assert_ne!(new_id, id, "{url}");

    kill(frozen, Signal::SIGCONT).unwrap();
    assert_eq!(
        wait_exit(&mut stuck, Duration::from_secs(20)),
        70,
        "{url}: the thawed holder"
    );
    let s = status(d, url, &key);
    if s["holders"][0]["id"] != new_id.as_str() {
        let _ = waiter.kill();
        let (_, err) = (waiter.wait(), common::stderr_of(&mut waiter));
        panic!("{url}: the new holder lost it: {s}; the new holder said: {err}");
    }
    std::fs::write(&done, "").unwrap();
    assert_eq!(
        wait_exit(&mut waiter, Duration::from_secs(30)),
        0,
        "{url}: the new holder"
    );
    // Free now: whoever is named holds nothing, which is what was asked.
    let o = output(lockwright(
        d,
        &[
            "break", "--url", url, "--key", &key, "--holder", &id, "--yes",
        ],
    ));
    assert_eq!(o.status.code(), Some(0), "{url}: a break of a free key");
    assert!(String::from_utf8_lossy(&o.stdout).contains("free, nothing to break"));
}

fn one_permit_of_three(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = unique("break-permit");
    // A lease of 9 s: renewals every 3 s leave a loaded host room.
    let mut runs: Vec<Reaped> = (0..3)
        .map(|_| holder(d, url, &key, "9s", &["--permits", "3"], "sleep 60"))
        .collect();
    let ids = holders(d, url, &key, 3);
    let o = output(lockwright(
        d,
        &["break", "--url", url, "--key", &key, "--yes"],
    ));
    assert_eq!(
        o.status.code(),
        Some(64),
        "{url}: three holders and none named"
    );
    let o = output(lockwright(
        d,
        &[
            "break", "--url", url, "--key", &key, "--holder", &ids[1], "--yes",
        ],
    ));
    assert_eq!(
        o.status.code(),
        Some(0),
        "{url}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let left = holders(d, url, &key, 2);
    assert!(!left.contains(&ids[1]), "{url}: {left:?}");
    // The broken one's run ends 70 at its next renewal; the other two run on.
    let start = Instant::now();
    let ended = loop {
        let done: Vec<usize> = (0..3)
            .filter(|i| runs[*i].try_wait().unwrap().is_some())
            .collect();
        if !done.is_empty() || start.elapsed() > Duration::from_secs(20) {
            break done;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(ended.len(), 1, "{url}: one run ends, not {ended:?}");
    assert_eq!(
        wait_exit(&mut runs[ended[0]], Duration::from_secs(1)),
        70,
        "{url}"
    );
    std::thread::sleep(Duration::from_secs(2));
    for (i, r) in runs.iter_mut().enumerate() {
        if i != ended[0] {
            assert!(r.try_wait().unwrap().is_none(), "{url}: run {i} ended too");
        }
    }
    let mut kept = holders(d, url, &key, 2);
    let mut others: Vec<String> = ids.iter().filter(|i| **i != ids[1]).cloned().collect();
    kept.sort();
    others.sort();
    assert_eq!(kept, others, "{url}: the other two still hold");
}

#[test]
fn break_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    break_frozen_holder(&url, true);
    one_permit_of_three(&url);
}

#[test]
fn break_on_postgres() {
    break_frozen_holder(&servers::postgres_url(), true);
    one_permit_of_three(&servers::postgres_url());
}

#[test]
fn break_on_mysql() {
    break_frozen_holder(&servers::mysql_url(), true);
}

#[test]
fn break_on_redis() {
    break_frozen_holder(&servers::redis_url(), true);
    one_permit_of_three(&servers::redis_url());
}

#[test]
fn break_on_memcached() {
    break_frozen_holder(&servers::memcached_url(), false);
}

#[test]
fn break_on_zookeeper() {
    // A frozen holder keeps its session this long: its hold must not end
    // by itself while the test works, on a loaded host.
    // (30 s: within a default server's maximum, 20 ticks of 2 s.)
    let url = with_params(&servers::zk_url(), "session_timeout=30s");
    break_frozen_holder(&url, true);
    one_permit_of_three(&url);
}

#[test]
fn break_on_etcd() {
    // As ZooKeeper's session: the frozen holder's lease outlives the test.
    let url = with_params(&servers::etcd_url(), "lease_ttl=60s");
    break_frozen_holder(&url, true);
    one_permit_of_three(&url);
}

/// SQL's session locks hold by connection: nothing names a holder, and
/// `break` says so instead of answering wrongly.
#[test]
fn session_locks_cannot_be_broken_one_holder_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let url = format!("{}?mode=session", servers::postgres_url());
    let key = unique("break-session");
    let _run = holder(d, &url, &key, "3s", &[], "sleep 60");
    let start = Instant::now();
    while status(d, &url, &key)["held"] != true {
        assert!(start.elapsed() < Duration::from_secs(20), "never held");
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = output(lockwright(
        d,
        &["break", "--url", &url, "--key", &key, "--yes"],
    ));
    assert_eq!(
        o.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("session"));
    assert_eq!(status(d, &url, &key)["held"], true, "nothing was broken");
    let o = output(lockwright(
        d,
        &[
            "break", "--url", &url, "--key", &key, "--holder", "o00", "--yes",
        ],
    ));
    assert_eq!(
        o.status.code(),
        Some(64),
        "a named holder on session locks too"
    );
}
