//! Every error a restart or a failover can give a request is `Unavailable`
//! (the request did not complete; the same one later finds the new
//! primary), never `Backend`; and a grant whose `WAIT` for the replicas is
//! cut short (`UNBLOCKED`, as `CLUSTER FAILOVER FORCE` does to it) is
//! undone and reported `Unavailable`, not left granted behind an error.

use std::time::{Duration, Instant};

use lockwright_conformance::kit::process::redis_server;
use lockwright_core::backend::{LockBackend, LockBackendExt};
use lockwright_core::{ErrorKind, LockKey, OwnerToken};
use lockwright_redis::internals::map_error;
use lockwright_redis::RedisBackend;

/// Each code, as the server sends it in an error reply.
#[test]
fn each_failover_code_is_unavailable() {
    // Written out, not the crate's own list: a code dropped from it fails
    // here.
    for code in [
        "LOADING",
        "MASTERDOWN",
        "READONLY",
        "BUSY",
        "TRYAGAIN",
        "CLUSTERDOWN",
        "MOVED",
        "ASK",
        "UNBLOCKED",
        "NOSCRIPT",
    ] {
        let reply = format!("-{code} the server is changing\r\n");
        let value = redis::parse_redis_value(reply.as_bytes()).unwrap();
        let e = value.extract_error().expect_err("an error reply");
        let mapped = map_error(e);
        assert_eq!(mapped.kind(), ErrorKind::Unavailable, "{code}: {mapped}");
    }
    // An error a retry will not mend stays what it is.
    let value = redis::parse_redis_value(b"-ERR unknown command\r\n").unwrap();
    let mapped = map_error(value.extract_error().unwrap_err());
    assert_eq!(mapped.kind(), ErrorKind::Backend, "{mapped}");
}

/// The id of the client of the server at `port` blocked in `WAIT`.
async fn waiting_client(admin: &mut redis::aio::MultiplexedConnection) -> Option<u64> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(admin)
        .await
        .unwrap();
    list.lines().find_map(|l| {
        l.contains("cmd=wait")
            .then(|| l.split(' ').find_map(|f| f.strip_prefix("id=")))
            .flatten()
            .and_then(|id| id.parse().ok())
    })
}

/// `CLIENT UNBLOCK … ERROR` gives a blocked `WAIT` the same `UNBLOCKED`
/// reply a forced failover gives it, inside the pipeline the grant sent.
async fn unblock_wait(port: u16) {
    let admin = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    let start = Instant::now();
    let id = loop {
        if let Some(id) = waiting_client(&mut admin).await {
            break id;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no client waited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let unblocked: i64 = redis::cmd("CLIENT")
        .arg("UNBLOCK")
        .arg(id)
        .arg("ERROR")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(unblocked, 1);
}

/// A pipeline whose `WAIT` was unblocked: the driver reports it as a
/// pipeline failure with no single code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unblocked_wait_in_a_pipeline_is_unavailable() {
    let (_server, port) = redis_server(&[]);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let pipe = async move {
        redis::pipe()
            .cmd("SET")
            .arg("k")
            .arg("v")
            .cmd("WAIT")
            .arg(1)
            .arg(20_000)
            .query_async::<((), i64)>(&mut conn)
            .await
    };
    let (r, ()) = tokio::join!(pipe, unblock_wait(port));
    let e = r.expect_err("the WAIT was unblocked");
    assert!(e.to_string().contains("UNBLOCKED"), "{e}");
    let mapped = map_error(e);
    assert_eq!(mapped.kind(), ErrorKind::Unavailable, "{mapped}");
}

/// A grant sent with `replicas=1` whose `WAIT` is unblocked: the lock
/// was taken by the script, so it must be undone, and the attempt said
/// `Unavailable` (a waiter's wait then goes on), as when a replica did
/// not acknowledge it in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_wait_was_unblocked_is_undone_and_unavailable() {
    let (_server, port) = redis_server(&[]);
    let url = format!("redis://127.0.0.1:{port}?replicas=1&replicas_timeout=20s");
    let backend = RedisBackend::connect(&url).unwrap();
    let key = LockKey::new("unblocked/grant").unwrap();
    // The scripts loaded first (by a client that asks for no replicas): a
    // script the server lacks is loaded and sent again, with a second
    // `WAIT`, which would make this test wait that one out.
    let plain = RedisBackend::connect(&format!("redis://127.0.0.1:{port}")).unwrap();
    let other = OwnerToken::generate();
    plain
        .try_lock(&key, &other, Duration::from_secs(30))
        .await
        .unwrap();
    plain.unlock(&key, &other).await.unwrap();
    let owner = OwnerToken::generate();
    let attempt = backend.try_lock(&key, &owner, Duration::from_secs(30));
    let start = Instant::now();
    let (r, ()) = tokio::join!(attempt, unblock_wait(port));
    let e = r.expect_err("an unacknowledged grant is no grant");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
    // Answered when the `WAIT` was cut short, not at its timeout.
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
    // Nothing is left held.
    let status = plain.inspect(&key).await.unwrap();
    assert!(
        !status.held,
        "the unacknowledged grant was left in the store: {status:?}"
    );
}
