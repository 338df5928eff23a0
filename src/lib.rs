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
//! | `memory://` | this process only (tests) | always |
//!
//! PostgreSQL, MySQL/MariaDB, Redis (single node and Redlock), memcached and
//! ZooKeeper are planned; their schemes are recognised and answer with a
//! `Config` error saying so.

use std::sync::Arc;

pub use locksmith_core::*;

/// The SQL backend (SQLite now; PostgreSQL and MySQL planned).
#[cfg(feature = "sqlite")]
pub use locksmith_sql as sql;

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
    let planned = |store: &str, feature: &str| {
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
        "sqlite" => Err(Error::config(format!(
            "{shown}: SQLite support is not compiled in; enable cargo feature `sqlite`"
        ))),
        "postgres" | "postgresql" => planned("PostgreSQL", "postgres"),
        "mysql" | "mariadb" => planned("MySQL/MariaDB", "mysql"),
        "redis" | "rediss" | "redis+unix" | "redis+redlock" => planned("Redis", "redis"),
        "memcache" | "memcached" => planned("memcached", "memcached"),
        "zk" | "zookeeper" => planned("ZooKeeper", "zookeeper"),
        "" => Err(Error::config(format!(
            "{shown}: not a URL; expected e.g. {DEFAULT_URL} or memory://"
        ))),
        other => Err(Error::config(format!(
            "{shown}: unknown scheme {other:?}; known: sqlite, memory \
             (planned: postgres, mysql, redis, memcache, zk)"
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
            ("redis://:hunter2@h:6379", "`redis`"),
            ("postgres://u:hunter2@h/db", "`postgres`"),
            ("ftp://h", "unknown scheme"),
            ("locks.db", "not a URL"),
        ] {
            let e = connect(url).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config, "{url}");
            assert!(e.to_string().contains(needle), "{url}: {e}");
            assert!(!e.to_string().contains("hunter2"), "secret leaked: {e}");
        }
    }
}

/// The README's examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
