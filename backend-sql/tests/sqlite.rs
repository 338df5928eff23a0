//! The whole conformance suite against SQLite files, plus what is particular
//! to the SQL lease table.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use lockwright_conformance::Harness;
use lockwright_core::backend::{Acquire, LockBackend, LockBackendExt, Release};
use lockwright_core::{ErrorKind, LockKey, OwnerToken};
use lockwright_sql::{Dialect, SqlBackend};

/// Each client is its own pool on one database file in a fresh directory.
struct SqliteHarness {
    dir: tempfile::TempDir,
    /// Holds the "down" database's write lock for as long as the harness
    /// lives: another process that has it locked is what makes an SQLite
    /// store unavailable (a missing directory is a configuration error).
    busy: tokio::sync::Mutex<Option<sqlx::SqliteConnection>>,
}

impl SqliteHarness {
    fn new() -> Self {
        SqliteHarness {
            dir: tempfile::tempdir().expect("temp dir"),
            busy: tokio::sync::Mutex::new(None),
        }
    }

    fn url(&self) -> String {
        format!("sqlite://{}/locks.db", self.dir.path().display())
    }
}

#[async_trait]
impl Harness for SqliteHarness {
    async fn client(&self) -> Arc<dyn LockBackend> {
        // Free rows kept 1 s, so the bounded-state cases need not wait a minute.
        let url = format!("{}?retention=1s", self.url());
        Arc::new(SqlBackend::connect(&url).expect("valid url"))
    }

    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        use sqlx::Connection;
        let path = self.dir.path().join("busy.db");
        let mut busy = self.busy.lock().await;
        if busy.is_none() {
            let url = format!("sqlite://{}?mode=rwc", path.display());
            let mut conn = sqlx::SqliteConnection::connect(&url)
                .await
                .expect("open busy.db");
            sqlx::query("BEGIN EXCLUSIVE")
                .execute(&mut conn)
                .await
                .expect("lock busy.db");
            *busy = Some(conn);
        }
        let url = format!("sqlite://{}?busy_timeout=200ms", path.display());
        Arc::new(SqlBackend::connect(&url).expect("valid url"))
    }

    async fn stored_names(&self, prefix: &str) -> anyhow::Result<u64> {
        let url = format!("sqlite://{}/locks.db", self.dir.path().display());
        common::count_rows(Dialect::Sqlite, &url, lockwright_sql::DEFAULT_TABLE, prefix).await
    }
}

mod conformance {
    lockwright_conformance::conformance_tests!(super::SqliteHarness::new());
}

#[tokio::test]
async fn the_row_survives_release_so_fences_keep_rising_across_tables_reopened() {
    let h = SqliteHarness::new();
    let k = LockKey::new("fence/survives").unwrap();
    let mut last = 0;
    for _ in 0..3 {
        // A fresh backend each round: the fence lives in the table, not the client.
        let b = SqlBackend::connect(&h.url()).unwrap();
        let owner = OwnerToken::generate();
        let Acquire::Acquired(g) = b
            .try_lock(&k, &owner, std::time::Duration::from_secs(30))
            .await
            .unwrap()
        else {
            panic!("free key was contended");
        };
        let fence = g.fence.unwrap().0;
        assert!(fence > last, "fence {fence} after {last}");
        last = fence;
        assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::Freed);
    }
}

/// WAL is switched on once per file, not per connection (see `use_wal`):
/// the file must still end up in it, with many clients opening it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_file_opened_by_many_clients_ends_up_in_wal_mode() {
    let h = SqliteHarness::new();
    let clients: Vec<_> = (0..8)
        .map(|_| SqlBackend::connect(&h.url()).unwrap())
        .collect();
    let results = futures::future::join_all(clients.iter().map(|b| b.migrate())).await;
    for r in results {
        r.expect("migrate on a new file with 8 clients at once");
    }
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect(&h.url()).await.unwrap();
    let (mode,): (String,) = sqlx::query_as("PRAGMA journal_mode")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(mode.to_ascii_lowercase(), "wal");
}

#[tokio::test]
async fn custom_table_names_are_used_and_bad_ones_refused() {
    let h = SqliteHarness::new();
    let b = SqlBackend::connect(&format!("{}?table=app_locks", h.url())).unwrap();
    b.migrate().await.unwrap();
    let k = LockKey::new("t").unwrap();
    assert!(matches!(
        b.try_lock(
            &k,
            &OwnerToken::generate(),
            std::time::Duration::from_secs(5)
        )
        .await
        .unwrap(),
        Acquire::Acquired(_)
    ));
    // The default table is separate: the same key is free there.
    let other = SqlBackend::connect(&h.url()).unwrap();
    assert!(matches!(
        other
            .try_lock(
                &k,
                &OwnerToken::generate(),
                std::time::Duration::from_secs(5)
            )
            .await
            .unwrap(),
        Acquire::Acquired(_)
    ));
    let err = SqlBackend::connect(&format!("{}?table=x%3Bdrop", h.url())).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidOptions);
    let err = SqlBackend::connect(&format!("{}?table=locks;drop table t", h.url())).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidOptions);
}

/// A writer that died while it waited for readers (it left its mark and
/// never came back to give up) keeps new readers out for the mark's two
/// seconds, not for the writer's whole TTL; a live waiting writer renews
/// its mark with every refused attempt.
#[tokio::test]
async fn a_dead_writers_mark_keeps_readers_out_briefly() {
    use lockwright_core::backend::{AcquireRequest, HoldId, HoldKind};
    use std::time::{Duration, Instant};
    let h = SqliteHarness::new();
    let (readers, writer) = (
        SqlBackend::connect(&h.url()).unwrap(),
        SqlBackend::connect(&h.url()).unwrap(),
    );
    let k = LockKey::new("dead/writer").unwrap();
    let ttl = Duration::from_secs(60);
    // An attempt at a read hold of `k` by `owner`.
    let read = |owner: &OwnerToken| {
        let hold = HoldId::new(k.clone(), owner.clone(), HoldKind::Reader { beside: None });
        AcquireRequest::new(hold, ttl)
    };
    let reader = OwnerToken::generate();
    assert!(matches!(
        readers.try_acquire(&read(&reader)).await.unwrap(),
        Acquire::Acquired(_)
    ));
    let dead = OwnerToken::generate();
    assert!(matches!(
        writer.try_lock(&k, &dead, ttl).await.unwrap(),
        Acquire::Contended { .. }
    ));
    drop(writer);
    let late = OwnerToken::generate();
    assert!(
        matches!(
            readers.try_acquire(&read(&late)).await.unwrap(),
            Acquire::Contended { .. }
        ),
        "a reader got in past a waiting writer's mark"
    );
    let start = Instant::now();
    loop {
        if let Acquire::Acquired(_) = readers.try_acquire(&read(&late)).await.unwrap() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "a dead writer's mark kept readers out for 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_lone_permit_moves_out_when_the_group_grows() {
    let h = SqliteHarness::new();
    common::a_lone_permit_moves_out_when_the_group_grows(&h.url()).await;
}
