//! A Redis server that dies while a lock is held, and comes back empty (no
//! persistence): clients see Unavailable, the holder's lost signal fires by
//! its deadline, work resumes, and fencing tokens keep rising.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use locksmith_core::{Acquire, ErrorKind, LockBackend, LockKey, LockOptions, Locker, OwnerToken};
use locksmith_redis::RedisBackend;

const PORT: u16 = 16399;

/// The server process, killed when dropped (also when the test panics), so
/// no stray server keeps the port.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start() -> Server {
    let child = Command::new("redis-server")
        .args([
            "--port",
            &PORT.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server is installed (scripts/test installs it)");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", PORT)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Server(child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_loses_nothing_that_matters() {
    let url = format!("redis://127.0.0.1:{PORT}?timeout=300ms&connect_timeout=300ms");
    let server = start();
    let key = LockKey::new("restart/k").unwrap();
    let a = Locker::new(RedisBackend::connect(&url).unwrap());
    let b = RedisBackend::connect(&url).unwrap();

    let ttl = Duration::from_secs(2);
    let guard = a
        .lock_with(&key, &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let before = guard.fence().expect("Redis gives fences").0;
    let deadline = guard.deadline().unwrap();
    let lost = guard.lost();
    let lost_at = tokio::spawn(async move { (lost.await, Instant::now()) });

    drop(server);
    let e = b
        .try_acquire(&key, &OwnerToken::generate(), ttl)
        .await
        .expect_err("acquire on a dead server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");

    let (_, fired) = tokio::time::timeout(ttl * 2, lost_at)
        .await
        .expect("lost fired")
        .unwrap();
    assert!(
        fired <= deadline + Duration::from_millis(300),
        "lost fired {:?} late",
        fired - deadline
    );

    let _server = start();
    // The server came back empty; clients reconnect by themselves.
    let start = Instant::now();
    let grant = loop {
        match b.try_acquire(&key, &OwnerToken::generate(), ttl).await {
            Ok(Acquire::Acquired(g)) => break g,
            other => {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "no recovery: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let after = grant.fence.expect("fence").0;
    assert!(
        after > before,
        "fencing token went back after the restart: {before} then {after}"
    );
}
