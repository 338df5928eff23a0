//! The server side of session mode: PostgreSQL advisory locks and MySQL
//! `GET_LOCK`, each held by a dedicated connection for as long as the lock
//! is held.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locksmith_core::backend::{Acquire, Grant, Release, Renew};
use locksmith_core::{Error, LockKey, LockStatus, OwnerToken, Result};

use crate::config::{Dialect, SqlConfig};
use crate::error::{bad_url, map_err};
use crate::layout;

/// Idle connections kept for the next attempt; more are closed.
const MAX_IDLE: usize = 4;

#[derive(Debug, Clone)]
enum Options {
    #[cfg(feature = "postgres")]
    Postgres(sqlx::postgres::PgConnectOptions),
    #[cfg(feature = "mysql")]
    MySql(sqlx::mysql::MySqlConnectOptions),
}

#[derive(Debug)]
enum Raw {
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgConnection),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlConnection),
}

/// A connection of our own, outside any pool. Dropping it closes the socket,
/// and the server then ends the session and frees its locks: an acquire
/// cancelled mid-flight can never leave a lock on a reused connection.
#[derive(Debug)]
struct Conn {
    raw: Raw,
    server_id: i64,
}

#[derive(Debug)]
struct Held {
    owner: OwnerToken,
    holds: u32,
    conn: Conn,
}

type Slot = Arc<tokio::sync::Mutex<Option<Held>>>;

#[derive(Debug)]
pub(crate) struct SessionLocks {
    options: Options,
    namespace: String,
    connect_timeout: Duration,
    idle: Mutex<Vec<Conn>>,
    slots: Mutex<HashMap<LockKey, Slot>>,
}

impl SessionLocks {
    pub(crate) fn new(config: &SqlConfig) -> Result<Self> {
        let bad = |e| bad_url(&config.url, e);
        let options = match config.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => Options::Postgres(
                sqlx::postgres::PgConnectOptions::from_str(config.url.expose()).map_err(bad)?,
            ),
            #[cfg(feature = "mysql")]
            Dialect::MySql => Options::MySql(
                sqlx::mysql::MySqlConnectOptions::from_str(config.url.expose()).map_err(bad)?,
            ),
            #[allow(unreachable_patterns)]
            other => {
                return Err(Error::config(format!(
                    "{}: {other:?} has no session locks in this build",
                    config.url
                )))
            }
        };
        Ok(SessionLocks {
            options,
            // Locks of different tables (applications) never meet.
            namespace: config.table.clone(),
            connect_timeout: config.connect_timeout,
            idle: Mutex::new(Vec::new()),
            slots: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn session_ids(&self) -> Vec<i64> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots
            .values()
            .filter_map(|s| {
                s.try_lock()
                    .ok()
                    .and_then(|h| h.as_ref().map(|h| h.conn.server_id))
            })
            .collect()
    }

    fn slot(&self, key: &LockKey) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.entry(key.clone()).or_default().clone()
    }

    /// Forgets an empty slot nobody else is using. Clones are only made under
    /// the map's lock, so the count cannot grow while we look.
    fn tidy(&self, key: &LockKey, slot: &Slot, empty: bool) {
        if !empty {
            return;
        }
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if Arc::strong_count(slot) == 2 {
            slots.remove(key);
        }
    }

    async fn checkout(&self) -> Result<Conn> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        if let Some(conn) = idle {
            return Ok(conn);
        }
        let connect = async {
            let conn: std::result::Result<Conn, sqlx::Error> = match &self.options {
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
        match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(r) => r.map_err(map_err),
            Err(_) => Err(Error::unavailable(format!(
                "no connection to the database within {:?}",
                self.connect_timeout
            ))),
        }
    }

    fn checkin(&self, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }

    #[cfg(feature = "postgres")]
    fn pg_id(&self, key: &LockKey) -> i64 {
        layout::pg_lock_id(&self.namespace, key)
    }

    #[cfg(feature = "mysql")]
    fn my_name(&self, key: &LockKey) -> String {
        layout::mysql_lock_name(&self.namespace, key)
    }

    async fn lock_once(
        &self,
        conn: &mut Conn,
        key: &LockKey,
    ) -> std::result::Result<bool, sqlx::Error> {
        match &mut conn.raw {
            #[cfg(feature = "postgres")]
            Raw::Postgres(c) => {
                sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                    .bind(self.pg_id(key))
                    .fetch_one(c)
                    .await
            }
            #[cfg(feature = "mysql")]
            Raw::MySql(c) => {
                let r: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
                    .bind(self.my_name(key))
                    .fetch_one(c)
                    .await?;
                Ok(r == Some(1))
            }
        }
    }

    /// Drops one hold; with `all`, every lock of the session (the last hold).
    async fn unlock(
        &self,
        conn: &mut Conn,
        key: &LockKey,
        all: bool,
    ) -> std::result::Result<bool, sqlx::Error> {
        match &mut conn.raw {
            #[cfg(feature = "postgres")]
            Raw::Postgres(c) => {
                if all {
                    sqlx::query("SELECT pg_advisory_unlock_all()")
                        .execute(c)
                        .await?;
                    Ok(true)
                } else {
                    sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
                        .bind(self.pg_id(key))
                        .fetch_one(c)
                        .await
                }
            }
            #[cfg(feature = "mysql")]
            Raw::MySql(c) => {
                if all {
                    sqlx::query("SELECT RELEASE_ALL_LOCKS()").execute(c).await?;
                    Ok(true)
                } else {
                    let r: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
                        .bind(self.my_name(key))
                        .fetch_one(c)
                        .await?;
                    Ok(r == Some(1))
                }
            }
        }
    }

    async fn ping(conn: &mut Conn) -> std::result::Result<(), sqlx::Error> {
        match &mut conn.raw {
            #[cfg(feature = "postgres")]
            Raw::Postgres(c) => sqlx::query("SELECT 1").execute(c).await.map(|_| ()),
            #[cfg(feature = "mysql")]
            Raw::MySql(c) => sqlx::query("SELECT 1").execute(c).await.map(|_| ()),
        }
    }

    pub(crate) async fn try_acquire(&self, key: &LockKey, owner: &OwnerToken) -> Result<Acquire> {
        let slot = self.slot(key);
        let mut held = slot.lock().await;
        if let Some(h) = held.as_mut() {
            if h.owner != *owner {
                return Ok(Acquire::Contended { retry_after: None });
            }
            // Re-entry: the server counts holds per session, so lock again on
            // the connection that already holds it.
            return match self.lock_once(&mut h.conn, key).await {
                Ok(true) => {
                    h.holds += 1;
                    Ok(Acquire::Acquired(Grant {
                        fence: None,
                        holds: h.holds,
                        lease: None,
                    }))
                }
                Ok(false) => Err(Error::backend(
                    "the server refused a re-entrant session lock",
                )),
                Err(e) => {
                    // The session is broken, and with it the lock.
                    *held = None;
                    Err(map_err(e))
                }
            };
        }
        let mut conn = self.checkout().await?;
        let got = match self.lock_once(&mut conn, key).await {
            Ok(got) => got,
            Err(_) => {
                // An idle connection may have died with a server restart; one
                // fresh attempt tells that apart from a database that is down.
                drop(conn);
                conn = self.checkout_fresh().await?;
                self.lock_once(&mut conn, key).await.map_err(map_err)?
            }
        };
        if got {
            *held = Some(Held {
                owner: owner.clone(),
                holds: 1,
                conn,
            });
            Ok(Acquire::Acquired(Grant {
                fence: None,
                holds: 1,
                lease: None,
            }))
        } else {
            self.checkin(conn);
            drop(held);
            self.tidy(key, &slot, true);
            Ok(Acquire::Contended { retry_after: None })
        }
    }

    /// A connection is made (or an idle one answers).
    pub(crate) async fn verify(&self) -> Result<()> {
        let mut conn = self.checkout().await?;
        Self::ping(&mut conn).await.map_err(map_err)?;
        self.checkin(conn);
        Ok(())
    }

    /// Whether any session holds `key`, asked of the server on an idle
    /// connection of ours (the server cannot count another session's holds).
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        let mut conn = self.checkout().await?;
        let held = match &mut conn.raw {
            #[cfg(feature = "postgres")]
            Raw::Postgres(c) => {
                // A bigint advisory key shows as classid (high 32 bits) and
                // objid (low 32 bits), with objsubid 1.
                let id = self.pg_id(key) as u64;
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
                       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                       AND objsubid = 1 AND classid::bigint = $1 AND objid::bigint = $2",
                )
                .bind((id >> 32) as i64)
                .bind((id & 0xffff_ffff) as i64)
                .fetch_one(&mut *c)
                .await
                .map_err(map_err)?;
                n > 0
            }
            #[cfg(feature = "mysql")]
            Raw::MySql(c) => {
                let used: i64 =
                    sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) IS NOT NULL AS SIGNED)")
                        .bind(self.my_name(key))
                        .fetch_one(&mut *c)
                        .await
                        .map_err(map_err)?;
                used != 0
            }
        };
        self.checkin(conn);
        Ok(if held {
            LockStatus::held(1)
        } else {
            LockStatus::free()
        })
    }

    async fn checkout_fresh(&self) -> Result<Conn> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.checkout().await
    }

    pub(crate) async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        let slot = self.slot(key);
        let mut held = slot.lock().await;
        let Some(h) = held.as_mut().filter(|h| h.owner == *owner) else {
            let empty = held.is_none();
            drop(held);
            self.tidy(key, &slot, empty);
            return Ok(Release::NotHeld);
        };
        let last = h.holds == 1;
        let outcome = match self.unlock(&mut h.conn, key, last).await {
            Ok(true) if !last => {
                h.holds -= 1;
                return Ok(Release::StillHeld(h.holds));
            }
            Ok(true) => {
                let h = held.take().expect("checked above");
                self.checkin(h.conn);
                Release::Freed
            }
            // The session broke (or lost the lock) while held: closing the
            // connection ends it, and the lock was not reliably ours.
            Ok(false) | Err(_) => {
                *held = None;
                Release::NotHeld
            }
        };
        drop(held);
        self.tidy(key, &slot, true);
        Ok(outcome)
    }

    /// A session lock lasts as long as its connection: renewing checks that
    /// the connection is alive, and a dead one means the lock is gone.
    pub(crate) async fn renew(&self, key: &LockKey, owner: &OwnerToken) -> Result<Renew> {
        let slot = self.slot(key);
        let mut held = slot.lock().await;
        let outcome = match held.as_mut().filter(|h| h.owner == *owner) {
            None => Renew::NotHeld,
            Some(h) => match Self::ping(&mut h.conn).await {
                Ok(()) => return Ok(Renew::Renewed),
                Err(e) => {
                    tracing::warn!(key = %key, error = %e, "session lock's connection failed; the lock is lost");
                    *held = None;
                    Renew::NotHeld
                }
            },
        };
        let empty = held.is_none();
        drop(held);
        self.tidy(key, &slot, empty);
        Ok(outcome)
    }
}
