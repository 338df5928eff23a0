//! The database goes away while a lock is held, then comes back. Runs against
//! private server instances (`scripts/fault-server`) so stopping them never
//! disturbs the other tests.
#![cfg(all(feature = "postgres", feature = "mysql"))]

use std::time::{Duration, Instant};

use lockwright_conformance::kit::fault_server::{self, Stopped};
use lockwright_conformance::kit::servers::{mysql_fault_url, postgres_fault_url};
use lockwright_core::{ErrorKind, LockOptions, Locker};

async fn outage(server: &str, base_url: &str) {
    fault_server::start(server);
    let mut down = Stopped::new();
    for mode in ["lease", "session"] {
        let url = format!("{base_url}?mode={mode}&connect_timeout=1s");
        let a = Locker::from_arc(lockwright_sql::open(&url).unwrap());
        let b = Locker::from_arc(lockwright_sql::open(&url).unwrap());
        let key = format!("outage/{mode}/{}", std::process::id());
        let ttl = Duration::from_secs(3);
        let guard = a
            .lock_with(key.as_str(), &LockOptions::new().ttl(ttl))
            .await
            .unwrap_or_else(|e| panic!("{server} {mode}: lock before the outage: {e}"));
        assert!(b.try_lock(key.as_str()).await.unwrap().is_none());

        // Note when the lost signal fires, whatever the test is doing then.
        let lost = guard.lost();
        let lost_at = tokio::spawn(async move { (lost.await, Instant::now()) });
        let deadline = guard.deadline().expect("held before the stop");
        down.stop(server);
        let stopped = Instant::now();

        // Down is an error, never "held by someone else", and waiting does not hide it.
        let e = b
            .try_lock(key.as_str())
            .await
            .expect_err("try_lock on a stopped server");
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{server} {mode}: {e}");
        let e = b
            .lock_with(
                "outage/other",
                &LockOptions::new().wait_for(Duration::from_secs(2)),
            )
            .await
            .expect_err("lock on a stopped server");
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{server} {mode}: {e}");

        // The holder is told. Lease mode: by the local deadline, which was set
        // before the server could have expired the row. Session mode: the
        // server freed the lock with the connection, so at the next renewal.
        let (reason, fired) = tokio::time::timeout(ttl * 2, lost_at)
            .await
            .unwrap_or_else(|_| panic!("{server} {mode}: lost signal did not fire"))
            .unwrap();
        let limit = match mode {
            "lease" => deadline + Duration::from_millis(300),
            _ => stopped + ttl / 3 + Duration::from_millis(800),
        };
        assert!(
            fired <= limit,
            "{server} {mode}: lost fired {:?} late",
            fired - limit
        );
        assert!(guard.is_lost());
        eprintln!(
            "{server} {mode}: lost ({reason:?}) {:?} after the stop",
            fired - stopped
        );

        down.start(server);
        // Work resumes: the lease expires on the server's clock (or the
        // session died with the server), and the other client gets the key.
        let got = b
            .lock_with(
                key.as_str(),
                &LockOptions::new().wait_for(Duration::from_secs(20)),
            )
            .await
            .unwrap_or_else(|e| panic!("{server} {mode}: after restart: {e}"));
        got.release().await.unwrap();
        let again = a
            .lock_with(key.as_str(), &LockOptions::new().no_wait())
            .await
            .unwrap();
        again.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_while_held() {
    outage("pg_fault", &postgres_fault_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_stopped_while_held() {
    outage("my_fault", &mysql_fault_url()).await;
}

/// The server stopped for a few seconds under a waiter with a long wait:
/// it gets the lock after the restart; a short wait ends `Unavailable`.
async fn waiter_rides_out(server: &str, base_url: &str) {
    for mode in ["lease", "session"] {
        let url = format!("{base_url}?mode={mode}&connect_timeout=1s");
        eprintln!("{server} {mode}");
        lockwright_conformance::kit::outage::waiter_rides_out_a_stop(
            server,
            Duration::from_secs(3),
            || Locker::from_arc(lockwright_sql::open(&url).unwrap()),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_rides_out_a_postgres_restart() {
    waiter_rides_out("pg_fault", &postgres_fault_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_rides_out_a_mariadb_restart() {
    waiter_rides_out("my_fault", &mysql_fault_url()).await;
}
