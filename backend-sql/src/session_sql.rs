//! The statements of session mode, on one connection of our own:
//! PostgreSQL advisory locks (exclusive and shared, and the turnstile a
//! waiting writer holds) and MySQL `GET_LOCK`.
//!
//! A name's lock is PostgreSQL's one-`bigint` advisory key
//! ([`layout::pg_lock_id`]); its turnstile is the two-`int4` key made of the
//! same 64 bits, which PostgreSQL keeps apart from every `bigint` key
//! (`objsubid` 2, not 1). A waiting writer holds the turnstile
//! exclusively; a new reader takes it shared for one statement only (a
//! transaction-level lock) before its shared lock, so while a writer waits
//! no new reader gets in, and readers never hold the turnstile.

use std::str::FromStr;
use std::time::Duration;

use lockwright_core::{Error, LockKey, LockStatus, Result};

use crate::config::{Dialect, SqlConfig};
use crate::error::{bad_url, map_err};
use crate::layout;

type SqlResult<T> = std::result::Result<T, sqlx::Error>;

#[derive(Debug, Clone)]
pub(crate) enum Options {
    #[cfg(feature = "postgres")]
    Postgres(sqlx::postgres::PgConnectOptions),
    #[cfg(feature = "mysql")]
    MySql(sqlx::mysql::MySqlConnectOptions),
}

impl Options {
    pub(crate) fn new(config: &SqlConfig) -> Result<Self> {
        let bad = |e| bad_url(&config.url, e);
        match config.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => Ok(Options::Postgres(
                sqlx::postgres::PgConnectOptions::from_str(config.url.expose()).map_err(bad)?,
            )),
            #[cfg(feature = "mysql")]
            Dialect::MySql => Ok(Options::MySql(
                sqlx::mysql::MySqlConnectOptions::from_str(config.url.expose()).map_err(bad)?,
            )),
            #[allow(unreachable_patterns)]
            other => Err(Error::config(format!(
                "{}: {other:?} has no session locks in this build",
                config.url
            ))),
        }
    }

    /// Whether the server has shared locks (PostgreSQL does, MySQL not).
    pub(crate) fn shared(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Options::Postgres(_) => true,
            #[cfg(feature = "mysql")]
            Options::MySql(_) => false,
        }
    }

    /// A new connection, within `timeout`.
    pub(crate) async fn connect(&self, timeout: Duration) -> Result<Conn> {
        let connect = async {
            let conn: SqlResult<Conn> = match self {
                #[cfg(feature = "postgres")]
                Options::Postgres(o) => {
                    use sqlx::ConnectOptions;
                    let mut c = o.connect().await?;
                    let (pid,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
                        .fetch_one(&mut c)
                        .await?;
                    Ok(Conn {
                        raw: Raw::Postgres(c),
                        server_id: i64::from(pid),
                    })
                }
                #[cfg(feature = "mysql")]
                Options::MySql(o) => {
                    use sqlx::ConnectOptions;
                    let mut c = o.connect().await?;
                    let (id,): (u64,) = sqlx::query_as("SELECT CONNECTION_ID()")
                        .fetch_one(&mut c)
                        .await?;
                    Ok(Conn {
                        raw: Raw::MySql(c),
                        server_id: id as i64,
                    })
                }
            };
            conn
        };
        match tokio::time::timeout(timeout, connect).await {
            Ok(r) => r.map_err(map_err),
            Err(_) => Err(Error::unavailable(format!(
                "no connection to the database within {timeout:?}"
            ))),
        }
    }
}

#[derive(Debug)]
enum Raw {
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgConnection),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlConnection),
}

/// A name's server-side lock names.
#[derive(Debug)]
pub(crate) struct Name {
    #[cfg(feature = "postgres")]
    pg: i64,
    #[cfg(feature = "mysql")]
    my: String,
}

impl Name {
    pub(crate) fn new(namespace: &str, key: &LockKey) -> Self {
        let _ = (namespace, key);
        Name {
            #[cfg(feature = "postgres")]
            pg: layout::pg_lock_id(namespace, key),
            #[cfg(feature = "mysql")]
            my: layout::mysql_lock_name(namespace, key),
        }
    }

    /// The turnstile's two `int4` keys: the lock's 64 bits, split.
    #[cfg(feature = "postgres")]
    fn turnstile(&self) -> (i32, i32) {
        ((self.pg >> 32) as i32, self.pg as i32)
    }
}

/// What an exclusive attempt got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Got {
    /// The lock.
    Lock,
    /// Not the lock, but the turnstile: new readers stay out.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Turnstile,
    /// Neither.
    Refused,
}

/// A connection of our own, outside any pool. Dropping it closes the socket,
/// and the server then ends the session and frees its locks: an acquire
/// cancelled mid-flight can never leave a lock on a reused connection.
#[derive(Debug)]
pub(crate) struct Conn {
    raw: Raw,
    /// The server's id of the session (PostgreSQL pid, MySQL connection id).
    pub(crate) server_id: i64,
}

impl Conn {
    /// Tries the lock exclusively; refused and with `mark`, tries the
    /// turnstile (PostgreSQL only).
    pub(crate) async fn exclusive(&mut self, n: &Name, mark: bool) -> SqlResult<Got> {
        #[cfg(not(feature = "postgres"))]
        let _ = mark;
        let got = |b: bool| if b { Got::Lock } else { Got::Refused };
        match &mut self.raw {
            #[cfg(feature = "postgres")]
            Raw::Postgres(c) if mark => {
                let (hi, lo) = n.turnstile();
                let r: i32 = sqlx::query_scalar(
                    "SELECT CASE WHEN pg_try_advisory_lock($1) THEN 1
                                 WHEN pg_try_advisory_lock($2, $3) THEN 2 ELSE 0 END",
                )
                .bind(n.pg)
                .bind(hi)
                .bind(lo)
                .fetch_one(c)
                .await?;
                Ok(match r {
                    1 => Got::Lock,
                    2 => Got::Turnstile,
                    _ => Got::Refused,
                })
            }
            #[cfg(feature = "postgres")]
            Raw::Postgres(c) => sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(n.pg)
                .fetch_one(c)
                .await
                .map(got),
            #[cfg(feature = "mysql")]
            Raw::MySql(c) => {
                let r: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
                    .bind(&n.my)
                    .fetch_one(c)
                    .await?;
                Ok(got(r == Some(1)))
            }
        }
    }

    /// Tries the lock shared: a new reader passes the turnstile first
    /// (`turnstile`), a holder re-entering or a writer downgrading does not.
    pub(crate) async fn shared(&mut self, n: &Name, turnstile: bool) -> SqlResult<bool> {
        #[cfg(not(feature = "postgres"))]
        let _ = (n, turnstile);
        match &mut self.raw {
            #[cfg(feature = "postgres")]
            Raw::Postgres(c) if turnstile => {
                let (hi, lo) = n.turnstile();
                sqlx::query_scalar(
                    "SELECT CASE WHEN pg_try_advisory_xact_lock_shared($2, $3)
                                 THEN pg_try_advisory_lock_shared($1) ELSE false END",
                )
                .bind(n.pg)
                .bind(hi)
                .bind(lo)
                .fetch_one(c)
                .await
            }
            #[cfg(feature = "postgres")]
            Raw::Postgres(c) => {
                sqlx::query_scalar("SELECT pg_try_advisory_lock_shared($1)")
                    .bind(n.pg)
                    .fetch_one(c)
                    .await
            }
            #[cfg(feature = "mysql")]
            Raw::MySql(_) => Err(sqlx::Error::Protocol("MySQL has no shared locks".into())),
        }
    }

    /// Lets go of the turnstile this session holds.
    pub(crate) async fn unmark(&mut self, n: &Name) -> SqlResult<bool> {
        #[cfg(not(feature = "postgres"))]
        let _ = n;
        match &mut self.raw {
            #[cfg(feature = "postgres")]
            Raw::Postgres(c) => {
                let (hi, lo) = n.turnstile();
                sqlx::query_scalar("SELECT pg_advisory_unlock($1, $2)")
                    .bind(hi)
                    .bind(lo)
                    .fetch_one(c)
                    .await
            }
            #[cfg(feature = "mysql")]
            Raw::MySql(_) => Ok(false),
        }
    }

    /// Drops one hold of the lock, shared or not; with `all`, every lock
    /// of the session (its last hold).
    pub(crate) async fn unlock(&mut self, n: &Name, shared: bool, all: bool) -> SqlResult<bool> {
        #[cfg(not(feature = "postgres"))]
        let _ = shared;
        match &mut self.raw {
            #[cfg(feature = "postgres")]
            Raw::Postgres(c) => {
                if all {
                    sqlx::query("SELECT pg_advisory_unlock_all()")
                        .execute(c)
                        .await?;
                    return Ok(true);
                }
                let sql = if shared {
                    "SELECT pg_advisory_unlock_shared($1)"
                } else {
                    "SELECT pg_advisory_unlock($1)"
                };
                sqlx::query_scalar(sql).bind(n.pg).fetch_one(c).await
            }
            #[cfg(feature = "mysql")]
            Raw::MySql(c) => {
                if all {
                    sqlx::query("SELECT RELEASE_ALL_LOCKS()").execute(c).await?;
                    return Ok(true);
                }
                let r: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
                    .bind(&n.my)
                    .fetch_one(c)
                    .await?;
                Ok(r == Some(1))
            }
        }
    }

    pub(crate) async fn ping(&mut self) -> SqlResult<()> {
        match &mut self.raw {
            #[cfg(feature = "postgres")]
            Raw::Postgres(c) => sqlx::query("SELECT 1").execute(c).await.map(|_| ()),
            #[cfg(feature = "mysql")]
            Raw::MySql(c) => sqlx::query("SELECT 1").execute(c).await.map(|_| ()),
        }
    }

    /// Who holds the name, asked of the server (which cannot count another
    /// session's re-entries: each session is one holder).
    pub(crate) async fn status(&mut self, n: &Name) -> Result<LockStatus> {
        match &mut self.raw {
            #[cfg(feature = "postgres")]
            Raw::Postgres(c) => {
                // A bigint advisory key shows as classid (high 32 bits) and
                // objid (low 32 bits), with objsubid 1: a row per session
                // and mode.
                let id = n.pg as u64;
                let shared: Vec<bool> = sqlx::query_scalar(
                    "SELECT mode = 'ShareLock' FROM pg_locks
                      WHERE locktype = 'advisory' AND granted
                        AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                        AND objsubid = 1 AND classid::bigint = $1 AND objid::bigint = $2",
                )
                .bind((id >> 32) as i64)
                .bind((id & 0xffff_ffff) as i64)
                .fetch_all(&mut *c)
                .await
                .map_err(map_err)?;
                Ok(match shared.as_slice() {
                    [] => LockStatus::free(),
                    [false] => LockStatus::held(1),
                    _ => LockStatus::of_holders(
                        shared
                            .iter()
                            .map(|s| lockwright_core::Holder::new(*s, 1))
                            .collect(),
                    ),
                })
            }
            #[cfg(feature = "mysql")]
            Raw::MySql(c) => {
                let used: i64 =
                    sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) IS NOT NULL AS SIGNED)")
                        .bind(&n.my)
                        .fetch_one(&mut *c)
                        .await
                        .map_err(map_err)?;
                Ok(if used != 0 {
                    LockStatus::held(1)
                } else {
                    LockStatus::free()
                })
            }
        }
    }
}
