//! **lockwright**: distributed locks over many stores behind one async API.
//!
//! Pick the store with a connection URL; the code that takes locks does not
//! change when the store does.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockwright::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let url = format!("sqlite://{}/locks.db", dir.path().display());
//! use std::time::Duration;
//! use lockwright::LockOptions;
//!
//! // "sqlite://locks.db", "memory://", later "redis://…", "postgres://…"
//! let locker = lockwright::connect(&url).await?;
//! let opts = LockOptions::new()
//!     .ttl(Duration::from_secs(10))
//!     .wait_for(Duration::from_secs(5));
//! // Runs the work under the lock, stops it if the lock is lost (the
//! // answer is then `Err(Lost)`), and gives the lock back before returning.
//! let charged = locker
//!     .with_lock_with("charge-card/order-42", &opts, async |guard| {
//!         // Hand the fencing token to the resource so a stale holder is refused.
//!         let _fence = guard.fence();
//!         // ... the critical section ...
//!         true
//!     })
//!     .await?;
//! # assert!(charged);
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
//! | `redis+sentinel://s1:26379,s2,s3/<master>`, `rediss+sentinel://…` | Redis under Sentinel, following failovers | `redis` |
//! | `redis+cluster://h1:7000,h2:7001,h3:7002`, `rediss+cluster://…` | Redis Cluster | `redis` |
//! | `zk://h1:2181,h2:2181,h3:2181/root` | ZooKeeper, Curator-compatible | `zookeeper` |
//! | `etcd://h1:2379,h2:2379,h3:2379/root`, `etcds://…` | etcd, Go `concurrency.Mutex`- and `Election`-compatible | `etcd` |
//! | `memcache://h:11211`, `memcache://h1,h2,h3`, `memcaches://…` | memcached: one server, or a quorum | `memcached` |
//! | `memory://` | this process only (tests) | always |

#![cfg_attr(docsrs, feature(doc_cfg))]

pub use lockwright_core::{
    Claim, Election, Error, ErrorKind, FencingToken, Holder, HolderInfo, IntoLockKey, Leader,
    LeaderListener, Leadership, Lease, LeaseState, LockGuard, LockKey, LockOptions, LockStatus,
    Locker, LostReason, LostSignal, MultiGuard, Mutex, OwnerToken, Permits, ReadWriteLock, Reign,
    RenewalFailure, Result, Semaphore, Stand, WaitPolicy, MAX_KEY_LEN, MAX_PERMITS, MAX_TTL,
    MAX_VALUE_LEN, OBSERVE_EVERY,
};

/// The names of the metrics lockwright records (see the README's table).
pub use lockwright_core::meter;

mod identify;

/// For backend authors and tools: the [`LockBackend`](backend::LockBackend) contract, the
/// helpers backends share, and the registry: [`open`](backend::open), which
/// dispatches a URL to a bare backend without a [`Locker`] on top,
/// [`scheme`](backend::scheme), what a URL's scheme names, and
/// [`register`](backend::register), which adds a store written outside
/// this repository.
pub mod backend {
    pub use lockwright_core::backend::*;
    pub use lockwright_core::forward_backend;

    pub use crate::registry::{driver, failover, open, register, scheme, verify};
}

mod registry;

/// The SQL backend: SQLite, PostgreSQL, MySQL/MariaDB.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use lockwright_sql as sql;

/// The Redis backends: single node and Redlock.
#[cfg(feature = "redis")]
pub use lockwright_redis as redis;

/// The memcached backend (one server, or a quorum of several).
#[cfg(feature = "memcached")]
pub use lockwright_memcached as memcached;

/// The etcd backend (Go `concurrency.Mutex`- and `Election`-compatible).
#[cfg(feature = "etcd")]
pub use lockwright_etcd as etcd;
/// The ZooKeeper backend (Curator-compatible locks).
#[cfg(feature = "zookeeper")]
pub use lockwright_zk as zookeeper;

/// Opens a [`Locker`] on the store a URL names (see [`backend::open`]) and
/// checks the store before returning: reachable, credentials accepted, the
/// lease table in place (created if missing). So a wrong password or a
/// server that is down shows here, at start-up, not at the first lock.
///
/// # Errors
/// As [`backend::open`]; then `Unavailable` if the store cannot be reached,
/// `Config` if it refuses the credentials, database or certificate.
pub async fn connect(url: &str) -> Result<Locker> {
    let store = backend::scheme(url)?.name;
    let backend = backend::open(url).await?;
    backend::verify(url, &*backend).await?;
    Ok(Locker::from_arc(backend).with_store_label(store))
}

/// Opens a [`Locker`] like [`connect`] but without talking to the store:
/// the first lock makes the connection, and a store that is down shows up
/// there as `Unavailable`. For services that must start while their store
/// is still coming up.
///
/// # Errors
/// As [`backend::open`]: only a malformed URL or bad parameters.
pub async fn connect_lazy(url: &str) -> Result<Locker> {
    let store = backend::scheme(url)?.name;
    Ok(Locker::from_arc(backend::open(url).await?).with_store_label(store))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn schemes_dispatch_or_say_why_not() {
        assert!(connect("memory://").await.is_ok());
        for (url, needle) in [
            ("sqlit://:hunter2@h/x", "unknown scheme"),
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
        assert!(connect_lazy("postgresql://u:pw@127.0.0.1:1/db")
            .await
            .is_ok());
        #[cfg(feature = "mysql")]
        assert!(connect_lazy("mariadb://u:pw@127.0.0.1:1/db?mode=session")
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
