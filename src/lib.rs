//! **locksmith**: distributed locks over many stores behind one async API.
//!
//! Pick the store with a connection URL; the code that takes locks does not
//! change when the store does.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> locksmith::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let url = format!("sqlite://{}/locks.db", dir.path().display());
//! use std::time::Duration;
//! use locksmith::LockOptions;
//!
//! // "sqlite://locks.db", "memory://", later "redis://…", "postgres://…"
//! let locker = locksmith::connect(&url).await?;
//! let opts = LockOptions::new()
//!     .ttl(Duration::from_secs(10))
//!     .wait_for(Duration::from_secs(5));
//! let guard = locker.lock_with("charge-card/order-42", &opts).await?;
//! // Hand the fencing token to the resource so a stale holder is refused.
//! let fence = guard.fence();
//! tokio::select! {
//!     _ = async { /* the critical section */ } => {}
//!     reason = guard.lost() => eprintln!("lock lost ({reason:?}); stop touching the resource"),
//! }
//! guard.release().await?;
//! # let _ = fence;
//! # Ok(())
//! # }
//! ```
//!
//! Stores and their URL schemes, each behind a cargo feature:
//!
//! | scheme | store | feature |
//! |---|---|---|
//! | `sqlite://path` | SQLite file, embedded | `sqlite` (default) |
//! | `postgres://…`, `postgresql://…` | PostgreSQL (add `?mode=session` for advisory locks) | `postgres` |
//! | `mysql://…`, `mariadb://…` | MySQL/MariaDB (add `?mode=session` for `GET_LOCK`) | `mysql` |
//! | `redis://…`, `rediss://…`, `redis+unix:///path` | one Redis server | `redis` |
//! | `redis+redlock://h1:p1,h2:p2,h3:p3` | Redlock over independent masters | `redis` |
//! | `memory://` | this process only (tests) | always |
//!
//! memcached and ZooKeeper are planned; their schemes are recognised and
//! answer with a `Config` error saying so.

use std::sync::Arc;

pub use locksmith_core::*;

/// The SQL backend: SQLite, PostgreSQL, MySQL/MariaDB.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use locksmith_sql as sql;

/// The Redis backends: single node and Redlock.
#[cfg(feature = "redis")]
pub use locksmith_redis as redis;

/// The store used when no URL is given: an SQLite file in the working directory.
pub const DEFAULT_URL: &str = "sqlite://locksmith.db";

/// Opens the backend a URL names.
///
/// # Errors
/// `Config` for a malformed URL, an unknown scheme, or a backend whose cargo
/// feature is off (the message names the feature); `InvalidOptions` for bad
/// parameters. Connections are made lazily, so a store that is down shows up
/// as `Unavailable` on first use, not here.
pub async fn backend(url: &str) -> Result<Arc<dyn LockBackend>> {
    let shown = RedactedUrl::new(url);
    let scheme = shown.scheme();
    // Unused when every store is compiled in.
    #[allow(unused_variables)]
    let not_built = |store: &str, feature: &str| -> Result<Arc<dyn LockBackend>> {
        Err(Error::config(format!(
            "{shown}: {store} support is not compiled in; enable cargo feature `{feature}`"
        )))
    };
    let planned = |store: &str, feature: &str| -> Result<Arc<dyn LockBackend>> {
        Err(Error::config(format!(
            "{shown}: the {store} backend is not part of this release yet \
             (it will be behind cargo feature `{feature}`)"
        )))
    };
    match scheme.as_str() {
        "memory" => Ok(Arc::new(MemoryBackend::new())),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(sql::SqlBackend::connect(url)?)),
        #[cfg(not(feature = "sqlite"))]
        "sqlite" => not_built("SQLite", "sqlite"),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(sql::SqlBackend::connect(url)?)),
        #[cfg(not(feature = "postgres"))]
        "postgres" | "postgresql" => not_built("PostgreSQL", "postgres"),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(Arc::new(sql::SqlBackend::connect(url)?)),
        #[cfg(not(feature = "mysql"))]
        "mysql" | "mariadb" => not_built("MySQL/MariaDB", "mysql"),
        #[cfg(feature = "redis")]
        "redis+redlock" => Ok(Arc::new(redis::RedlockBackend::connect(url)?)),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+unix" | "unix" => {
            Ok(Arc::new(redis::RedisBackend::connect(url)?))
        }
        #[cfg(not(feature = "redis"))]
        "redis" | "rediss" | "redis+unix" | "redis+redlock" => not_built("Redis", "redis"),
        "memcache" | "memcached" => planned("memcached", "memcached"),
        "zk" | "zookeeper" => planned("ZooKeeper", "zookeeper"),
        "" => Err(Error::config(format!(
            "{shown}: not a URL; expected e.g. {DEFAULT_URL} or memory://"
        ))),
        other => Err(Error::config(format!(
            "{shown}: unknown scheme {other:?}; known: sqlite, postgres, mysql, \
             mariadb, redis, rediss, redis+redlock, memory (planned: memcache, zk)"
        ))),
    }
}

/// Opens a [`Locker`] on the store a URL names (see [`backend`]).
///
/// # Errors
/// As [`backend`].
pub async fn connect(url: &str) -> Result<Locker> {
    Ok(Locker::from_arc(backend(url).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn schemes_dispatch_or_say_why_not() {
        assert!(connect("memory://").await.is_ok());
        for (url, needle) in [
            ("memcache://:hunter2@h:11211", "`memcached`"),
            ("ftp://h", "unknown scheme"),
            ("locks.db", "not a URL"),
        ] {
            let e = connect(url).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config, "{url}");
            assert!(e.to_string().contains(needle), "{url}: {e}");
            assert!(!e.to_string().contains("hunter2"), "secret leaked: {e}");
        }
        // Built with the SQL features, server URLs dispatch (lazily: no I/O yet).
        #[cfg(feature = "postgres")]
        assert!(connect("postgresql://u:pw@127.0.0.1:1/db").await.is_ok());
        #[cfg(feature = "mysql")]
        assert!(connect("mariadb://u:pw@127.0.0.1:1/db?mode=session")
            .await
            .is_ok());
        #[cfg(not(feature = "postgres"))]
        assert!(connect("postgres://u:hunter2@h/db")
            .await
            .unwrap_err()
            .to_string()
            .contains("`postgres`"));
    }
}

/// The README's examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
