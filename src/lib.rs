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
//! let guard = locker.lock_with("charge-card/order-42", &opts).await?;
//! // Hand the fencing token to the resource so a stale holder is refused.
//! let fence = guard.fence();
//! tokio::select! {
//!     _ = async { /* the critical section */ } => {}
//!     reason = guard.lost() => eprintln!("lock lost ({reason:?}); stop touching the resource"),
//! }
//! // After a loss the release says `Lost`: report it, it is not an outage.
//! if let Err(e) = guard.release().await {
//!     eprintln!("{e}");
//! }
//! locker.close().await?;
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
//! | `redis+sentinel://s1:26379,s2,s3/<master>`, `rediss+sentinel://…` | Redis under Sentinel, following failovers | `redis` |
//! | `redis+cluster://h1:7000,h2:7001,h3:7002`, `rediss+cluster://…` | Redis Cluster | `redis` |
//! | `zk://h1:2181,h2:2181,h3:2181/root` | ZooKeeper, Curator-compatible | `zookeeper` |
//! | `etcd://h1:2379,h2:2379,h3:2379/root`, `etcds://…` | etcd, Go `concurrency.Mutex`- and `Election`-compatible | `etcd` |
//! | `memcache://h:11211`, `memcache://h1,h2,h3`, `memcaches://…` | memcached: one server, or a quorum | `memcached` |
//! | `memory://` | this process only (tests) | always |

#![cfg_attr(docsrs, feature(doc_cfg))]

pub use lockwright_core::{
    Claim, Election, Error, ErrorKind, FencingToken, Holder, IntoLockKey, Leader, Leadership,
    Lease, LeaseState, LockGuard, LockKey, LockOptions, LockStatus, Locker, LostReason, MultiGuard,
    OwnerToken, ReadWriteLock, RenewalFailure, Result, Semaphore, WaitPolicy, MAX_KEY_LEN,
    MAX_PERMITS, MAX_TTL, MAX_VALUE_LEN, OBSERVE_EVERY,
};

/// The names of the metrics lockwright records (see the README's table).
pub use lockwright_core::meter;

mod identify;

/// For backend authors and tools: the [`LockBackend`](backend::LockBackend) contract, the
/// helpers backends share, and the registry: [`open`](backend::open), which
/// dispatches a URL to a bare backend without a [`Locker`] on top, and
/// [`scheme`](backend::scheme), what a URL's scheme names.
pub mod backend {
    use std::sync::Arc;

    pub use lockwright_core::backend::*;

    use crate::{Error, Result};

    /// Opens one backend crate's backend for a URL it answers to.
    type Opener = fn(&str) -> Result<Arc<dyn LockBackend>>;

    /// A backend crate built into this binary: the schemes it declares and
    /// its `open`.
    #[derive(Clone, Copy)]
    struct Built {
        schemes: &'static [Scheme],
        open: Opener,
    }

    /// One store the facade knows, built in or not: the registry is the one
    /// place that maps a scheme to a backend crate and to the cargo feature
    /// that builds it in.
    struct Entry {
        store: &'static str,
        schemes: &'static [&'static str],
        /// The cargo feature of this crate (empty: always there).
        feature: &'static str,
        built: Option<Built>,
    }

    const MEMORY: Built = Built {
        schemes: &[Scheme::new("memory", "in-process memory", None)],
        open: |_| Ok(Arc::new(MemoryBackend::new())),
    };
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    const SQL: Option<Built> = Some(Built {
        schemes: lockwright_sql::SCHEMES,
        open: lockwright_sql::open,
    });
    #[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
    const SQL: Option<Built> = None;
    // The SQL crate is built when any dialect is; each dialect only with its own feature.
    const SQLITE: Option<Built> = if cfg!(feature = "sqlite") { SQL } else { None };
    const POSTGRES: Option<Built> = if cfg!(feature = "postgres") {
        SQL
    } else {
        None
    };
    const MYSQL: Option<Built> = if cfg!(feature = "mysql") { SQL } else { None };
    #[cfg(feature = "redis")]
    const REDIS: Option<Built> = Some(Built {
        schemes: lockwright_redis::SCHEMES,
        open: lockwright_redis::open,
    });
    #[cfg(not(feature = "redis"))]
    const REDIS: Option<Built> = None;
    #[cfg(feature = "memcached")]
    const MEMCACHED: Option<Built> = Some(Built {
        schemes: lockwright_memcached::SCHEMES,
        open: lockwright_memcached::open,
    });
    #[cfg(not(feature = "memcached"))]
    const MEMCACHED: Option<Built> = None;
    #[cfg(feature = "zookeeper")]
    const ZOOKEEPER: Option<Built> = Some(Built {
        schemes: lockwright_zk::SCHEMES,
        open: lockwright_zk::open,
    });
    #[cfg(not(feature = "zookeeper"))]
    const ZOOKEEPER: Option<Built> = None;
    #[cfg(feature = "etcd")]
    const ETCD: Option<Built> = Some(Built {
        schemes: lockwright_etcd::SCHEMES,
        open: lockwright_etcd::open,
    });
    #[cfg(not(feature = "etcd"))]
    const ETCD: Option<Built> = None;

    #[rustfmt::skip]
    const REGISTRY: &[Entry] = &[
        Entry { store: "in-process memory", schemes: &["memory"], feature: "", built: Some(MEMORY) },
        Entry { store: "SQLite", schemes: &["sqlite"], feature: "sqlite", built: SQLITE },
        Entry { store: "PostgreSQL", schemes: &["postgres", "postgresql"], feature: "postgres", built: POSTGRES },
        Entry { store: "MySQL/MariaDB", schemes: &["mysql", "mariadb"], feature: "mysql", built: MYSQL },
        Entry { store: "Redis", schemes: &["redis", "rediss", "redis+unix", "unix"], feature: "redis", built: REDIS },
        Entry { store: "Redlock", schemes: &["redis+redlock"], feature: "redis", built: REDIS },
        Entry { store: "Redis Sentinel", schemes: &["redis+sentinel", "rediss+sentinel"], feature: "redis", built: REDIS },
        Entry { store: "Redis Cluster", schemes: &["redis+cluster", "rediss+cluster"], feature: "redis", built: REDIS },
        Entry { store: "memcached", schemes: &["memcache", "memcached", "memcaches"], feature: "memcached", built: MEMCACHED },
        Entry { store: "ZooKeeper", schemes: &["zk", "zookeeper"], feature: "zookeeper", built: ZOOKEEPER },
        Entry { store: "etcd", schemes: &["etcd", "etcds"], feature: "etcd", built: ETCD },
    ];

    /// The registry entry and, when its backend is built in, the scheme as
    /// the backend declares it.
    fn lookup(url: &str) -> Result<(Scheme, Opener)> {
        let name = scheme_of(url)?;
        let shown = RedactedUrl::new(url);
        let Some(entry) = REGISTRY.iter().find(|e| e.schemes.contains(&name.as_str())) else {
            let known: Vec<&str> = REGISTRY.iter().flat_map(|e| e.schemes).copied().collect();
            return Err(Error::config(format!(
                "{shown}: unknown scheme {name:?}; known: {}",
                known.join(", ")
            )));
        };
        entry
            .built
            .and_then(|b| Some((*b.schemes.iter().find(|s| s.name == name)?, b.open)))
            .ok_or_else(|| {
                Error::config(format!(
                    "{shown}: {} support is not compiled in; enable cargo feature `{}`",
                    entry.store, entry.feature
                ))
            })
    }

    /// What a URL's scheme names: the store, and the port of a server
    /// written without one.
    ///
    /// ```
    /// let s = lockwright::backend::scheme("memory://").unwrap();
    /// assert_eq!((s.store, s.default_port), ("in-process memory", None));
    /// assert!(lockwright::backend::scheme("ftp://h").is_err());
    /// ```
    ///
    /// # Errors
    /// `Config` for text that is not a URL, an unknown scheme, or a backend
    /// whose cargo feature is off (the message names the feature).
    pub fn scheme(url: &str) -> Result<Scheme> {
        lookup(url).map(|(scheme, _)| scheme)
    }

    /// Fails the deployment `url` names over to a replica and waits until
    /// the new primary serves; says which node took over from which.
    /// Redis under Sentinel (`SENTINEL FAILOVER`) and a Redis Cluster
    /// (`CLUSTER FAILOVER` on a replica of one of its primaries) only. It
    /// changes the deployment: `lockwright check --faults …,failover` makes
    /// failovers with it only when asked.
    ///
    /// # Errors
    /// As [`scheme`]; `Unsupported` for any other store; `Unavailable` when
    /// no failover could be made, or it did not finish within a minute.
    pub async fn failover(url: &str) -> Result<String> {
        let (scheme, _) = lookup(url)?;
        #[cfg(feature = "redis")]
        if matches!(
            scheme.name,
            "redis+sentinel" | "rediss+sentinel" | "redis+cluster" | "rediss+cluster"
        ) {
            return lockwright_redis::failover(url).await;
        }
        Err(Error::new(
            crate::ErrorKind::Unsupported,
            format!(
                "{}: no failover to make on {}; it needs a redis+sentinel:// or redis+cluster:// URL",
                RedactedUrl::new(url),
                scheme.store
            ),
        ))
    }

    /// Checks the store `url` names, through `backend` opened on it
    /// ([`LockBackend::verify`]); a failure that a server of another kind
    /// explains (a `memcache://` URL pointed at Redis) is a `Config` error
    /// naming what answered, since no retry mends it.
    ///
    /// # Errors
    /// As [`LockBackend::verify`], or `Config` as said.
    pub async fn verify(url: &str, backend: &dyn LockBackend) -> Result<()> {
        let Err(e) = backend.verify().await else {
            return Ok(());
        };
        if matches!(
            e.kind(),
            crate::ErrorKind::Config | crate::ErrorKind::InvalidOptions
        ) {
            return Err(e);
        }
        let Ok((scheme, _)) = lookup(url) else {
            return Err(e);
        };
        let first = scheme
            .default_port
            .and_then(|port| ServerUrl::parse(url, port).ok())
            .and_then(|u| u.hosts().first().cloned());
        let Some(first) = first else {
            return Err(e);
        };
        match crate::identify::identify(first.host(), first.port()).await {
            Some(what) if !what.serves(scheme.store) => Err(Error::config(format!(
                "{}:{} answered as {}, not {}",
                first.host(),
                first.port(),
                what.name(),
                scheme.store
            ))
            .with_source(e)),
            _ => Err(e),
        }
    }

    /// Opens the backend a URL names, without a [`Locker`](crate::Locker) on top.
    ///
    /// # Errors
    /// As [`scheme`], then `Config`/`InvalidOptions` for what the backend
    /// refuses in the URL. Nothing is sent to the store yet: call
    /// [`LockBackend::verify`] to check it now.
    pub async fn open(url: &str) -> Result<Arc<dyn LockBackend>> {
        let (_, open) = lookup(url)?;
        open(url)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// The registry's scheme names are the ones each built-in crate
        /// declares, no more and no fewer.
        #[test]
        fn the_registry_matches_what_each_backend_declares() {
            for entry in REGISTRY {
                let Some(built) = entry.built else { continue };
                let declared: Vec<&str> = built
                    .schemes
                    .iter()
                    .filter(|s| s.store == entry.store)
                    .map(|s| s.name)
                    .collect();
                assert_eq!(declared, entry.schemes, "{}", entry.store);
            }
            let mut all: Vec<&str> = REGISTRY.iter().flat_map(|e| e.schemes).copied().collect();
            let n = all.len();
            all.sort_unstable();
            all.dedup();
            assert_eq!(all.len(), n, "a scheme is registered twice");
        }
    }
}

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

/// The store used when no URL is given: an SQLite file in the working directory.
pub const DEFAULT_URL: &str = "sqlite://lockwright.db";

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
