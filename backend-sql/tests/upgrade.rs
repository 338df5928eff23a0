//! A lease table written by the previous versions (no `value` column, rows
//! kept for ever, fences counted 1, 2, 3… per row, released rows marked
//! with an expiry of 0 or `-infinity`) keeps working under this one: a lock held across the
//! upgrade stays held and its holder can renew and release it, no fence
//! goes below one already given, and the old rows are swept.

mod common;

use std::time::Duration;

use lockwright_conformance::kit::with_params;
use lockwright_core::backend::{Acquire, LockBackendExt, Release, Renew};
use lockwright_core::{LockKey, OwnerToken};
use lockwright_sql::{Dialect, SqlBackend};
use sha2::{Digest, Sha256};

fn hash(key: &LockKey) -> String {
    hex::encode(Sha256::digest(key.as_str().as_bytes()))
}

/// A row as the previous version left it.
struct Legacy {
    key: LockKey,
    owner: Option<String>,
    holds: i64,
    fence: i64,
    /// Seconds from now, or `None` for its "released" marker.
    expires: Option<i64>,
}

fn legacy_rows(run: &str) -> Vec<Legacy> {
    let row = |name: &str, owner: Option<&str>, holds, fence, expires| Legacy {
        key: LockKey::new(format!("upgrade/{run}/{name}")).unwrap(),
        owner: owner.map(|o| format!("{o}-{run}-{}", "0".repeat(24))),
        holds,
        fence,
        expires,
    };
    vec![
        row("held", Some("old-holder"), 1, 7, Some(60)),
        row("released", None, 0, 42, None),
        row("expired", Some("old-crashed"), 1, 9, Some(-600)),
    ]
}

async fn insert_legacy(dialect: Dialect, url: &str, table: &str, run: &str) {
    use sqlx::Connection;
    for Legacy {
        key,
        owner,
        holds,
        fence,
        expires,
    } in legacy_rows(run)
    {
        match dialect {
            Dialect::Postgres => {
                let mut c = sqlx::PgConnection::connect(url).await.unwrap();
                let expires = match expires {
                    Some(s) => format!("now() + interval '{s} seconds'"),
                    None => "'-infinity'".to_owned(),
                };
                sqlx::query(&format!(
                    "INSERT INTO {table} (key_hash, lock_key, owner, holds, fence, expires_at)
                     VALUES ($1, $2, $3, $4, $5, {expires})"
                ))
                .bind(hash(&key))
                .bind(key.as_str())
                .bind(owner)
                .bind(holds)
                .bind(fence)
                .execute(&mut c)
                .await
                .unwrap();
            }
            Dialect::MySql => {
                let mut c = sqlx::MySqlConnection::connect(url).await.unwrap();
                sqlx::query(&format!(
                    "INSERT INTO {table} (key_hash, lock_key, owner, holds, fence, expires_at)
                     VALUES (?, ?, ?, ?, ?,
                             IF(? IS NULL, 0, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + ? * 1000))"
                ))
                .bind(hash(&key))
                .bind(key.as_str())
                .bind(owner)
                .bind(holds)
                .bind(fence)
                .bind(expires)
                .bind(expires)
                .execute(&mut c)
                .await
                .unwrap();
            }
            _ => {
                let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
                sqlx::query(&format!(
                    "INSERT INTO {table} (key_hash, lock_key, owner, holds, fence, expires_at)
                     VALUES (?1, ?2, ?3, ?4, ?5,
                             CASE WHEN ?6 IS NULL THEN 0 ELSE
                             CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + ?6 * 1000 END)"
                ))
                .bind(hash(&key))
                .bind(key.as_str())
                .bind(owner)
                .bind(holds)
                .bind(fence)
                .bind(expires)
                .execute(&mut c)
                .await
                .unwrap();
            }
        }
    }
}

async fn fence_of(b: &SqlBackend, key: &LockKey) -> u64 {
    match b
        .try_lock(key, &OwnerToken::generate(), Duration::from_secs(30))
        .await
        .unwrap()
    {
        Acquire::Acquired(g) => g.fence.expect("lease mode gives fences").0,
        Acquire::Contended { .. } => panic!("{key:?} should be free"),
    }
}

async fn upgrade(dialect: Dialect, base_url: &str, driver_url: &str) {
    let token = OwnerToken::generate();
    let run = &token.as_str()[..10];
    let table = format!("upgrade_{run}");
    let url = with_params(base_url, &format!("table={table}&retention=1s"));
    // The table as the previous version made it (no `value` column: this
    // one adds it on first use), and rows as earlier ones left them.
    let ddl = common::legacy_create_table(dialect, &table);
    common::execute(dialect, driver_url, &ddl).await.unwrap();
    insert_legacy(dialect, driver_url, &table, run).await;
    let b = SqlBackend::connect(&url).unwrap();
    let rows = legacy_rows(run);
    let (held, released, expired) = (&rows[0], &rows[1], &rows[2]);

    // Held across the upgrade: still held, and its holder keeps it.
    let stranger = b
        .try_lock(&held.key, &OwnerToken::generate(), Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        matches!(stranger, Acquire::Contended { .. }),
        "{stranger:?}"
    );
    let old_owner = OwnerToken::from_string(held.owner.clone().unwrap()).unwrap();
    assert_eq!(
        b.renew_lock(&held.key, &old_owner, Duration::from_secs(30))
            .await
            .unwrap(),
        Renew::Renewed
    );
    assert_eq!(
        b.unlock(&held.key, &old_owner).await.unwrap(),
        Release::Freed
    );

    // Fences go on from above the old counters, row or no row.
    assert!(fence_of(&b, &held.key).await > held.fence as u64);
    assert!(fence_of(&b, &released.key).await > released.fence as u64);
    // An acquire above may have started a sweep already; this one finishes
    // whatever is left.
    b.sweep().await.unwrap();
    let prefix = format!("upgrade/{run}/expired");
    assert_eq!(
        common::count_rows(dialect, driver_url, &table, &prefix)
            .await
            .unwrap(),
        0,
        "the crashed holder's old row was not swept"
    );
    assert!(fence_of(&b, &expired.key).await > expired.fence as u64);
    drop_table(dialect, driver_url, &table).await;
}

async fn drop_table(dialect: Dialect, url: &str, table: &str) {
    use sqlx::Connection;
    let sql = format!("DROP TABLE {table}");
    match dialect {
        Dialect::Postgres => {
            let mut c = sqlx::PgConnection::connect(url).await.unwrap();
            sqlx::query(&sql).execute(&mut c).await.unwrap();
            // The holders table of permits and read holds, made beside it.
            let holders = format!("DROP TABLE IF EXISTS {table}_holders");
            sqlx::query(&holders).execute(&mut c).await.unwrap();
        }
        Dialect::MySql => {
            let mut c = sqlx::MySqlConnection::connect(url).await.unwrap();
            sqlx::query(&sql).execute(&mut c).await.unwrap();
        }
        _ => {}
    }
}

#[tokio::test]
async fn an_sqlite_table_of_the_previous_version_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/locks.db", dir.path().display());
    upgrade(Dialect::Sqlite, &url, &url).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_postgres_table_of_the_previous_version_keeps_working() {
    let url = common::server_url(Dialect::Postgres);
    upgrade(Dialect::Postgres, &url, &url).await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn a_mariadb_table_of_the_previous_version_keeps_working() {
    let url = common::server_url(Dialect::MySql);
    upgrade(Dialect::MySql, &url, &url).await;
}

/// The error of a call that must give up within a minute (the bound is
/// 5 s; a loaded host adds to it), not wait for ever.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn bounded(
    call: impl std::future::Future<Output = lockwright_core::Result<()>>,
) -> lockwright_core::Error {
    tokio::time::timeout(Duration::from_secs(60), call)
        .await
        .expect("the upgrade waits a bounded time for the table's lock")
        .expect_err("the reader holds the table")
}

/// Adding the `value` column to an old table that a long transaction is
/// reading waits a bounded time for the table's lock (a queued `ALTER`
/// would stall every statement on the table behind it), then fails
/// `Unavailable` naming the statement, and succeeds on the next use once
/// the reader is gone.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn a_long_reader_bounds_the_upgrade(dialect: Dialect) {
    use lockwright_core::ErrorKind;
    use sqlx::Connection;
    let base = common::server_url(dialect);
    let token = OwnerToken::generate();
    let table = format!("upgrade_wait_{}", &token.as_str()[..10]);
    let ddl = common::legacy_create_table(dialect, &table);
    common::execute(dialect, &base, &ddl).await.unwrap();
    let read = format!("SELECT COUNT(*) FROM {table}");
    let b = SqlBackend::connect(&with_params(&base, &format!("table={table}"))).unwrap();
    let started = std::time::Instant::now();
    let failed = match dialect {
        Dialect::Postgres => {
            let mut reader = sqlx::PgConnection::connect(&base).await.unwrap();
            let mut tx = reader.begin().await.unwrap();
            sqlx::query(&read).execute(&mut *tx).await.unwrap();
            let failed = bounded(b.migrate()).await;
            tx.rollback().await.unwrap();
            failed
        }
        _ => {
            let mut reader = sqlx::MySqlConnection::connect(&base).await.unwrap();
            let mut tx = reader.begin().await.unwrap();
            sqlx::query(&read).execute(&mut *tx).await.unwrap();
            let failed = bounded(b.migrate()).await;
            tx.rollback().await.unwrap();
            failed
        }
    };
    let waited = started.elapsed();
    assert_eq!(failed.kind(), ErrorKind::Unavailable, "{}", failed.chain());
    assert!(
        failed.message().contains("ALTER TABLE") && failed.message().contains(&table),
        "{}",
        failed.message()
    );
    assert!(waited >= Duration::from_secs(4), "gave up after {waited:?}");
    b.migrate()
        .await
        .expect("tried again once the reader is gone");
    let k = LockKey::new(format!("{table}/after")).unwrap();
    use lockwright_core::backend::{AcquireRequest, LockBackend};
    let owner = OwnerToken::generate();
    let request = AcquireRequest::mutex(&k, &owner, Duration::from_secs(30))
        .with_value("v")
        .unwrap();
    assert!(matches!(
        b.try_acquire(&request).await.unwrap(),
        Acquire::Acquired(_)
    ));
    assert_eq!(
        b.inspect(&k).await.unwrap().value.as_deref(),
        Some(&b"v"[..])
    );
    b.unlock(&k, &owner).await.unwrap();
    drop_table(dialect, &base, &table).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_postgres_upgrade_waits_a_bounded_time_for_a_long_reader() {
    a_long_reader_bounds_the_upgrade(Dialect::Postgres).await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn a_mariadb_upgrade_waits_a_bounded_time_for_a_long_reader() {
    a_long_reader_bounds_the_upgrade(Dialect::MySql).await;
}
