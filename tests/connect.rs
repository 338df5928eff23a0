//! `connect` checks the store before it returns; `connect_lazy` does not.

#![cfg(all(feature = "sqlite", feature = "postgres", feature = "redis"))]

use lockwright::ErrorKind;

use lockwright_conformance::kit::{process::redis_server, servers::postgres_url as pg_url};

#[tokio::test]
async fn refused_credentials_fail_connect_not_the_first_lock() {
    let (_redis, port) = redis_server(&["--requirepass", "right-password"]);
    let right = format!("redis://:right-password@127.0.0.1:{port}");
    let ok = lockwright::connect(&right).await;
    assert!(ok.is_ok(), "{:?}", ok.err().map(|e| e.chain()));

    let wrong = format!("redis://:not-the-password@127.0.0.1:{port}");
    let e = lockwright::connect(&wrong).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{}", e.chain());
    assert!(!e.chain().contains("not-the-password"), "{}", e.chain());

    // Lazy: the same URL opens, and the first lock says what is wrong.
    let lazy = lockwright::connect_lazy(&wrong).await.expect("no I/O yet");
    let e = lazy.try_lock("connect-test").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{}", e.chain());
}

#[tokio::test]
async fn a_database_that_does_not_exist_fails_connect() {
    let ok = lockwright::connect(&pg_url()).await;
    assert!(
        ok.is_ok(),
        "the test server must be up: {:?}",
        ok.err().map(|e| e.chain())
    );
    let mut u = url::Url::parse(&pg_url()).expect("a PostgreSQL URL");
    u.set_path("/no_such_database_for_connect");
    let e = lockwright::connect(u.as_str()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{}", e.chain());
}

#[tokio::test]
async fn a_store_that_is_down_fails_connect_as_unavailable() {
    // Nothing listens on port 1.
    let e = lockwright::connect("redis://127.0.0.1:1?connect_timeout=500ms")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
    let e = lockwright::connect("redis+redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
    assert!(e.to_string().contains("0 of 3"), "{e}");
    assert!(lockwright::connect_lazy("redis://127.0.0.1:1")
        .await
        .is_ok());
}

#[tokio::test]
async fn connect_creates_the_lease_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let url = format!("sqlite://{}", path.display());
    let locker = lockwright::connect(&url).await.unwrap();
    // Before any lock: the table is there.
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let tables: Vec<(String,)> =
        sqlx::query_as("SELECT name FROM sqlite_master WHERE type = 'table'")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert!(
        tables.iter().any(|(t,)| t.contains("lock")),
        "tables after connect: {tables:?}"
    );
    locker.close().await.unwrap();
}
