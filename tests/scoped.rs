//! A process whose `main` returns right after `with_lock` leaves nothing
//! held: the scoped form awaited the release, where a guard's drop leaves
//! it to a task that a runtime shutting down never runs. Each store is
//! checked from this process after a child process did the work and exited.

#![cfg(all(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis",
    feature = "memcached",
    feature = "zookeeper",
    feature = "etcd"
))]

use std::process::Command;
use std::time::Duration;

use lockwright::{LockOptions, Locker};
use lockwright_conformance::kit::{servers, with_params};

/// The child's store and key, in the environment.
const CHILD_URL: &str = "LOCKWRIGHT_SCOPED_CHILD_URL";
const CHILD_KEY: &str = "LOCKWRIGHT_SCOPED_CHILD_KEY";

/// Run only as the child: a `main` of its own (a runtime built and
/// dropped here), which takes the lock with a long lease, does its work
/// under it and returns at once, with no `close`.
#[test]
#[ignore = "run by its parent test as a process of its own"]
fn child_works_under_a_lock_and_returns() {
    let (Ok(url), Ok(key)) = (std::env::var(CHILD_URL), std::env::var(CHILD_KEY)) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let locker = lockwright::connect(&url).await.unwrap();
        let opts = LockOptions::new().ttl(Duration::from_secs(60));
        let fence = locker
            .with_lock_with(key.as_str(), &opts, async |guard| guard.fence())
            .await
            .unwrap();
        println!("worked under {key:?}, fence {fence:?}");
    });
}

/// Runs the child against `url`, then reads the key's status: nobody
/// may hold it, long before its 60 s lease could have run out.
async fn nothing_held_after_the_child(url: &str) {
    let key = format!("scoped-exit-{}", std::process::id());
    let ran = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_works_under_a_lock_and_returns",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_URL, url)
        .env(CHILD_KEY, &key)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success() && said.contains("worked under"),
        "{url}: the child failed: {said}{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let locker: Locker = lockwright::connect(url).await.unwrap();
    let status = locker.status(key.as_str()).await.unwrap();
    assert_eq!(
        status.holder_count(),
        0,
        "{url}: {key:?} is still held after the process that worked under it exited: {status:?}"
    );
    locker.close().await.unwrap();
}

#[tokio::test]
async fn a_process_leaves_nothing_held_after_with_lock() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}/locks.db", dir.path().display());
    for url in [
        sqlite,
        servers::postgres_url(),
        servers::mysql_url(),
        servers::redis_url(),
        servers::memcached_url(),
        with_params(&servers::zk_url(), "session_timeout=30s"),
        with_params(&servers::etcd_url(), "lease_ttl=60s"),
    ] {
        nothing_held_after_the_child(&url).await;
    }
}
