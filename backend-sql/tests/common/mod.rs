//! A conformance harness for a database server: clients are independent
//! backends on one URL (`SqlBackend`, or `SqlSessionBackend` in session mode); sessions are ended with the server's own kill.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lockwright_conformance::kit::clients::Clients;
use lockwright_conformance::kit::servers::{mysql_url, postgres_url};
use lockwright_conformance::kit::with_params;
use lockwright_conformance::Harness;
use lockwright_core::backend::LockBackend;
use lockwright_sql::{Dialect, Mode, SqlBackend, SqlConfig, SqlSessionBackend};

/// The shared test server of `dialect` (see the kit's `servers`).
pub fn server_url(dialect: Dialect) -> String {
    match dialect {
        Dialect::Postgres => postgres_url(),
        Dialect::MySql => mysql_url(),
        _ => unreachable!("server dialects only"),
    }
}

pub struct ServerHarness {
    pub url: String,
    dialect: Dialect,
    /// The session-mode clients, whose sessions `end_sessions` kills.
    clients: Clients<SqlSessionBackend>,
}

impl ServerHarness {
    /// `params`: extra URL parameters, e.g. `mode=session`.
    /// Lease mode keeps free rows for 1 s, so the bounded-state cases need
    /// not wait out the default minute.
    pub fn new(dialect: Dialect, params: &str) -> Self {
        let base = server_url(dialect);
        let url = if params.is_empty() {
            with_params(&base, "retention=1s")
        } else {
            with_params(&base, params)
        };
        ServerHarness {
            url,
            dialect,
            clients: Clients::new(),
        }
    }
}

#[async_trait]
impl Harness for ServerHarness {
    async fn client(&self) -> Arc<dyn LockBackend> {
        let config = SqlConfig::from_url(&self.url).expect("valid test URL");
        match config.mode {
            Mode::Session => {
                let c = SqlSessionBackend::with_config(config).expect("valid test URL");
                self.clients.add(Arc::new(c))
            }
            _ => Arc::new(SqlBackend::with_config(config).expect("valid test URL")),
        }
    }

    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        // Same credentials and database, on a port where nothing listens.
        let config = SqlConfig::from_url(&self.url).unwrap();
        let url = config.url.expose().to_owned();
        let (scheme, rest) = url.split_once("://").unwrap();
        let (auth, path) = rest.split_once('@').unwrap();
        let db = path.split_once('/').map(|(_, d)| d).unwrap_or("");
        let dead = format!("{scheme}://{auth}@127.0.0.1:1/{db}");
        let dead = with_params(&dead, "connect_timeout=1s");
        let dead = match config.mode {
            Mode::Session => with_params(&dead, "mode=session"),
            Mode::Lease => dead,
        };
        lockwright_sql::open(&dead).expect("valid URL")
    }

    async fn end_sessions(&self, client: &Arc<dyn LockBackend>) -> anyhow::Result<()> {
        let typed = self
            .clients
            .find(client)
            .ok_or_else(|| anyhow::anyhow!("not a client of this harness"))?;
        let ids = lockwright_sql::internals::session_ids(&typed);
        anyhow::ensure!(!ids.is_empty(), "the client holds no session to end");
        let admin_url = SqlConfig::from_url(&self.url)?.url.expose().to_owned();
        for id in ids {
            kill_session(self.dialect, &admin_url, id).await?;
        }
        Ok(())
    }

    async fn stored_names(&self, prefix: &str) -> anyhow::Result<u64> {
        let config = SqlConfig::from_url(&self.url)?;
        if config.mode == lockwright_sql::Mode::Session {
            // Session locks write no rows; the server drops them with the session.
            return Ok(0);
        }
        count_rows(self.dialect, config.url.expose(), &config.table, prefix).await
    }
}

/// Rows of `table` whose lock name starts with `prefix`.
pub async fn count_rows(
    dialect: Dialect,
    url: &str,
    table: &str,
    prefix: &str,
) -> anyhow::Result<u64> {
    use sqlx::Connection;
    let chars = prefix.chars().count() as i64;
    // The names of lease rows, and of holders of permits and read locks
    // (rows of their own table), each counted once.
    let n: i64 = match dialect {
        Dialect::Postgres => {
            let mut c = sqlx::PgConnection::connect(url).await?;
            sqlx::query_scalar(&format!(
                "SELECT count(*) FROM (
                    SELECT lock_key FROM {table} WHERE left(lock_key, $2::int) = $1
                    UNION SELECT lock_key FROM {table}_holders WHERE left(lock_key, $2::int) = $1) n"
            ))
            .bind(prefix)
            .bind(chars)
            .fetch_one(&mut c)
            .await?
        }
        Dialect::MySql => {
            let mut c = sqlx::MySqlConnection::connect(url).await?;
            sqlx::query_scalar(&format!(
                "SELECT COUNT(*) FROM (
                    SELECT lock_key FROM {table} WHERE LEFT(lock_key, ?) = ?
                    UNION SELECT lock_key FROM {table}_holders WHERE LEFT(lock_key, ?) = ?) n"
            ))
            .bind(chars)
            .bind(prefix)
            .bind(chars)
            .bind(prefix)
            .fetch_one(&mut c)
            .await?
        }
        _ => {
            let mut c = sqlx::SqliteConnection::connect(url).await?;
            sqlx::query_scalar(&format!(
                "SELECT count(*) FROM (
                    SELECT lock_key FROM {table} WHERE substr(lock_key, 1, ?2) = ?1
                    UNION SELECT lock_key FROM {table}_holders WHERE substr(lock_key, 1, ?2) = ?1)"
            ))
            .bind(prefix)
            .bind(chars)
            .fetch_one(&mut c)
            .await?
        }
    };
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Ends one server session the way an operator (or a crash) would, and waits
/// until the server has let go of it.
pub async fn kill_session(dialect: Dialect, url: &str, id: i64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    match dialect {
        Dialect::Postgres => {
            use sqlx::Connection;
            let mut admin = sqlx::PgConnection::connect(url).await?;
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(id as i32)
                .execute(&mut admin)
                .await?;
            while Instant::now() < deadline {
                let (n,): (i64,) =
                    sqlx::query_as("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
                        .bind(id as i32)
                        .fetch_one(&mut admin)
                        .await?;
                if n == 0 {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Dialect::MySql => {
            use sqlx::Connection;
            let mut admin = sqlx::MySqlConnection::connect(url).await?;
            // KILL takes no placeholders; the id is an integer we read from the server.
            sqlx::query(&format!("KILL CONNECTION {id}"))
                .persistent(false)
                .execute(&mut admin)
                .await?;
            while Instant::now() < deadline {
                let (n,): (i64,) = sqlx::query_as(
                    "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?",
                )
                .bind(id)
                .fetch_one(&mut admin)
                .await?;
                if n == 0 {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        _ => anyhow::bail!("no sessions in {dialect:?}"),
    }
    anyhow::bail!("session {id} was still there 10 s after it was killed")
}

/// The lease table as the release before leader values created it: every
/// column of today's but `value`.
pub fn legacy_create_table(dialect: Dialect, t: &str) -> String {
    match dialect {
        Dialect::Sqlite => format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                key_hash   TEXT    NOT NULL PRIMARY KEY,
                lock_key   TEXT    NOT NULL,
                owner      TEXT,
                holds      INTEGER NOT NULL DEFAULT 0,
                fence      INTEGER NOT NULL DEFAULT 0,
                expires_at INTEGER NOT NULL DEFAULT 0
            )"
        ),
        Dialect::Postgres => format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                key_hash   TEXT        NOT NULL PRIMARY KEY,
                lock_key   TEXT        NOT NULL,
                owner      TEXT,
                holds      BIGINT      NOT NULL DEFAULT 0,
                fence      BIGINT      NOT NULL DEFAULT 0,
                expires_at TIMESTAMPTZ NOT NULL DEFAULT '-infinity'
            )"
        ),
        _ => format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                key_hash   CHAR(64)     NOT NULL PRIMARY KEY,
                lock_key   TEXT         NOT NULL,
                owner      VARCHAR(128) NULL,
                holds      BIGINT       NOT NULL DEFAULT 0,
                fence      BIGINT       NOT NULL DEFAULT 0,
                expires_at BIGINT       NOT NULL DEFAULT 0
            ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        ),
    }
}

/// Runs one statement on the database at `url`, outside any backend (an
/// SQLite file is created if missing).
pub async fn execute(dialect: Dialect, url: &str, sql: &str) -> anyhow::Result<()> {
    use sqlx::{ConnectOptions, Connection};
    use std::str::FromStr;
    match dialect {
        Dialect::Postgres => {
            let mut c = sqlx::PgConnection::connect(url).await?;
            sqlx::query(sql).execute(&mut c).await?;
        }
        Dialect::MySql => {
            let mut c = sqlx::MySqlConnection::connect(url).await?;
            sqlx::query(sql).execute(&mut c).await?;
        }
        _ => {
            let mut c = sqlx::sqlite::SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                .connect()
                .await?;
            sqlx::query(sql).execute(&mut c).await?;
        }
    }
    Ok(())
}

/// The `value` column of `key_hash`'s row in `table`, read from the store
/// itself: `None` when there is no row.
pub async fn stored_value(
    dialect: Dialect,
    url: &str,
    table: &str,
    key_hash: &str,
) -> anyhow::Result<Option<Option<Vec<u8>>>> {
    use sqlx::Connection;
    let sql = |p: &str| format!("SELECT value FROM {table} WHERE key_hash = {p}");
    Ok(match dialect {
        Dialect::Postgres => {
            let mut c = sqlx::PgConnection::connect(url).await?;
            sqlx::query_scalar(&sql("$1"))
                .bind(key_hash)
                .fetch_optional(&mut c)
                .await?
        }
        Dialect::MySql => {
            let mut c = sqlx::MySqlConnection::connect(url).await?;
            sqlx::query_scalar(&sql("?"))
                .bind(key_hash)
                .fetch_optional(&mut c)
                .await?
        }
        _ => {
            let mut c = sqlx::SqliteConnection::connect(url).await?;
            sqlx::query_scalar(&sql("?1"))
                .bind(key_hash)
                .fetch_optional(&mut c)
                .await?
        }
    })
}

/// Whether `table` has a column `column`, read from the catalog.
pub async fn has_column(
    dialect: Dialect,
    url: &str,
    table: &str,
    column: &str,
) -> anyhow::Result<bool> {
    use sqlx::Connection;
    let n: i64 = match dialect {
        Dialect::Postgres => {
            let mut c = sqlx::PgConnection::connect(url).await?;
            sqlx::query_scalar(
                "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass($1)
                 AND attname = $2 AND NOT attisdropped",
            )
            .bind(table)
            .bind(column)
            .fetch_one(&mut c)
            .await?
        }
        Dialect::MySql => {
            let mut c = sqlx::MySqlConnection::connect(url).await?;
            sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.COLUMNS
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?",
            )
            .bind(table)
            .bind(column)
            .fetch_one(&mut c)
            .await?
        }
        _ => {
            let mut c = sqlx::SqliteConnection::connect(url).await?;
            sqlx::query_scalar("SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2")
                .bind(table)
                .bind(column)
                .fetch_one(&mut c)
                .await?
        }
    };
    Ok(n > 0)
}

/// A free name's first permit lives in the name row (the mutex's own
/// statements take it); a second permit moves it to the holders table
/// under the row's lock, and from then on its holder's re-entry, renewal
/// and release find it there. Nothing is lost or doubled on the way, and
/// the name is a lone permit's again once the group has gone.
pub async fn a_lone_permit_moves_out_when_the_group_grows(url: &str) {
    use lockwright_core::backend::{
        renew_one, Acquire, AcquireRequest, Grant, HoldId, HoldKind, LockBackend, Release, Renew,
        RenewRequest,
    };
    use lockwright_core::{ErrorKind, LockKey, OwnerToken};
    let ttl = Duration::from_secs(30);
    let (a, b) = (
        SqlBackend::connect(url).expect("valid url"),
        SqlBackend::connect(url).expect("valid url"),
    );
    let k = LockKey::new(format!("lone/{}", OwnerToken::generate().as_str())).unwrap();
    let permit = OwnerToken::generate;
    // An owner's hold of one of `k`'s 3 permits, and an attempt at it.
    let three = |o: &OwnerToken| HoldId::new(k.clone(), o.clone(), HoldKind::Permit { permits: 3 });
    let take = |o: &OwnerToken| AcquireRequest::new(three(o), ttl);
    let grant = |got: Acquire| -> Grant {
        match got {
            Acquire::Acquired(g) => g,
            other => panic!("refused: {other:?}"),
        }
    };
    let (first, second) = (permit(), permit());
    let g1 = grant(a.try_acquire(&take(&first)).await.unwrap());
    assert_eq!(g1.holds, 1);
    let again = grant(a.try_acquire(&take(&first)).await.unwrap());
    assert_eq!((again.holds, again.fence), (2, g1.fence), "a lone re-entry");
    let s = b.inspect(&k).await.unwrap();
    assert_eq!((s.holder_count(), s.permits), (1, Some(3)), "{s:?}");
    assert_eq!(s.holders[0].holds, 2);
    assert_eq!(s.holders[0].fence, g1.fence);
    assert_eq!(s.owner.as_ref(), Some(&first));
    // Another N meets the lone permit's N, and a stranger holds nothing.
    let four = HoldId::new(
        k.clone(),
        OwnerToken::generate(),
        HoldKind::Permit { permits: 4 },
    );
    let err = b
        .try_acquire(&AcquireRequest::new(four, ttl))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidOptions, "{err}");
    let stranger = permit();
    assert_eq!(
        b.release(&three(&stranger)).await.unwrap(),
        Release::NotHeld
    );
    assert_eq!(
        renew_one(&b, RenewRequest::new(three(&stranger), ttl))
            .await
            .unwrap(),
        Renew::NotHeld
    );

    let g2 = grant(b.try_acquire(&take(&second)).await.unwrap());
    assert!(g2.fence > g1.fence, "{g2:?} after {g1:?}");
    let s = b.inspect(&k).await.unwrap();
    assert_eq!((s.holder_count(), s.permits), (2, Some(3)), "{s:?}");
    let moved = s
        .holders
        .iter()
        .find(|h| h.owner.as_ref() == Some(&first))
        .expect("the lone holder moved to the holders table");
    assert_eq!((moved.holds, moved.fence), (2, g1.fence));
    // Its holder goes on through the holders table.
    let third = grant(a.try_acquire(&take(&first)).await.unwrap());
    assert_eq!((third.holds, third.fence), (3, g1.fence));
    assert_eq!(
        renew_one(&a, RenewRequest::new(three(&first), ttl))
            .await
            .unwrap(),
        Renew::Renewed
    );
    for left in [2, 1] {
        assert_eq!(
            a.release(&three(&first)).await.unwrap(),
            Release::StillHeld(left)
        );
    }
    assert_eq!(a.release(&three(&first)).await.unwrap(), Release::Freed);
    assert_eq!(a.release(&three(&first)).await.unwrap(), Release::NotHeld);
    assert_eq!(b.inspect(&k).await.unwrap().holder_count(), 1);
    assert_eq!(b.release(&three(&second)).await.unwrap(), Release::Freed);
    assert!(!b.inspect(&k).await.unwrap().held);

    let next = permit();
    let g3 = grant(a.try_acquire(&take(&next)).await.unwrap());
    assert!(g3.fence > g2.fence, "{g3:?} after {g2:?}");
    assert_eq!(b.inspect(&k).await.unwrap().holder_count(), 1);
    assert_eq!(a.release(&three(&next)).await.unwrap(), Release::Freed);
    assert!(!b.inspect(&k).await.unwrap().held);
}
