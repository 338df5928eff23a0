//! `lockwright status` on every store shipped, and `RUST_LOG` showing what
//! the lock does, through the binary against the real servers.

#![cfg(all(
    unix,
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis"
))]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use lockwright::{LockOptions, OwnerToken};

use common::BIN;

/// Every store shipped, each URL once.
fn stores(sqlite: &str) -> Vec<String> {
    let (pg, my) = (common::postgres_url(), common::mysql_url());
    vec![
        format!("sqlite://{sqlite}"),
        pg.clone(),
        format!("{pg}?mode=session"),
        my.clone(),
        format!("{my}?mode=session"),
        common::redis_url(),
        // 250 ms per node: the first request also connects, on a loaded host.
        common::redlock_url("?timeout=250ms"),
    ]
}

fn status(url: &str, key: &str, json: bool) -> String {
    let mut cmd = Command::new(BIN);
    cmd.args(["status", "--url", url, "--key", key]);
    if json {
        cmd.arg("--json");
    }
    let o = cmd.stdin(Stdio::null()).output().expect("lockwright runs");
    assert!(
        o.status.success(),
        "{url}: status exited {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_says_held_or_free_on_every_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("status.db");
    let key = format!("status-{}", OwnerToken::generate().as_str());
    for url in stores(&db.display().to_string()) {
        let locker = lockwright::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {}", e.chain()));
        let free: serde_json::Value = serde_json::from_str(&status(&url, &key, true)).unwrap();
        assert_eq!(free["held"], false, "{url}: {free}");
        assert!(status(&url, &key, false).contains("free"), "{url}");

        let ttl = Duration::from_secs(30);
        let guard = locker
            .lock_with(key.as_str(), &LockOptions::new().ttl(ttl))
            .await
            .unwrap();
        let held: serde_json::Value = serde_json::from_str(&status(&url, &key, true)).unwrap();
        assert_eq!(held["held"], true, "{url}: {held}");
        assert_eq!(held["holds"], 1, "{url}: {held}");
        assert_eq!(held["key"], key.as_str());
        match guard.fence() {
            Some(f) => assert_eq!(held["fence"], f.0, "{url}: {held}"),
            None => assert!(held["fence"].is_null(), "{url}: {held}"),
        }
        if !url.contains("mode=session") {
            let left = held["remaining_ms"]
                .as_u64()
                .expect("a lease has time left");
            assert!(left > 0 && left <= 30_000, "{url}: {held}");
        }
        if url.starts_with("redis://") {
            assert_eq!(held["waiters"], 0, "{url}: {held}");
        }
        let line = status(&url, &key, false);
        assert!(line.contains("held (1 hold)"), "{url}: {line}");

        guard.release().await.unwrap();
        let after: serde_json::Value = serde_json::from_str(&status(&url, &key, true)).unwrap();
        assert_eq!(after["held"], false, "{url}: {after}");
        locker.close().await.unwrap();
    }
}

#[test]
fn status_on_a_store_that_is_down_exits_69() {
    let o = Command::new(BIN)
        .args(["status", "--url", "redis://127.0.0.1:1", "--key", "k"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(69),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn rust_log_shows_the_acquire_and_the_renewals() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/log.db", dir.path().display());
    let o = Command::new(BIN)
        .env("RUST_LOG", "debug")
        .args([
            "run", "--url", &url, "--key", "logged", "--ttl", "600ms", "--", "sleep", "1",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("lock acquired"), "{err}");
    assert!(err.contains("lock renewed"), "{err}");
    assert!(err.contains("lock released"), "{err}");
    // Without RUST_LOG or -v, none of it.
    let o = Command::new(BIN)
        .env_remove("RUST_LOG")
        .args(["run", "--url", &url, "--key", "quiet", "--", "true"])
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(!String::from_utf8_lossy(&o.stderr).contains("lock acquired"));
}

#[test]
fn wait_accepts_none_forever_or_a_duration() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/wait.db", dir.path().display());
    for wait in ["none", "forever", "2s"] {
        let o = Command::new(BIN)
            .args([
                "run", "--url", &url, "--key", "w", "--wait", wait, "--", "true",
            ])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "--wait {wait}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = Command::new(BIN)
        .args([
            "run", "--url", &url, "--key", "w", "--wait", "soon", "--", "true",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&o.stderr).contains("forever"));
}

#[tokio::test]
async fn status_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not-yet.db");
    let url = format!("sqlite://{}", path.display());
    assert!(status(&url, "k", false).contains("free"));
    assert!(!path.exists(), "status created the SQLite file");
    // An existing file without the lease table: still free, still no table.
    std::fs::File::create(&path).unwrap();
    assert!(status(&url, "k", false).contains("free"));
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let tables: Vec<(String,)> = sqlx::query_as("SELECT name FROM sqlite_master")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert!(tables.is_empty(), "status created {tables:?}");
}

/// `--permits` and `--shared` on a store that cannot grant them
/// (MySQL's session locks) are a usage error (64) naming what is missing,
/// before the command runs.
#[test]
fn permits_and_shared_holds_are_refused_where_the_store_lacks_them() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let url = common::mysql_url();
    let url = if url.contains('?') {
        format!("{url}&mode=session")
    } else {
        format!("{url}?mode=session")
    };
    for (flags, says) in [
        (&["--permits", "3"][..], "semaphore's permits"),
        (&["--shared"][..], "shared (read) holds"),
    ] {
        let mut args = vec!["run", "--url", &url, "--key", "k"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "sh", "-c", &touch]);
        let o = Command::new(BIN)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("lockwright runs");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(64), "{flags:?}: {err}");
        assert!(err.contains(says), "{flags:?}: {err}");
        assert!(!marker.exists(), "{flags:?}: the command ran");
    }
}
