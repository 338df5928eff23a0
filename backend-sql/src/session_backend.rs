//! [`SqlSessionBackend`]: the [`LockBackend`] over server-side session
//! locks (PostgreSQL advisory locks, MySQL `GET_LOCK`).

use std::sync::Arc;

use async_trait::async_trait;
use lockwright_core::backend::{
    Acquire, AcquireRequest, Binding, Capabilities, HoldId, LockBackend, Release, Renew,
    RenewRequest, Watch,
};
use lockwright_core::{Error, LockKey, LockStatus, OwnerToken, Result};

use crate::config::{Mode, SqlConfig, MIN_TTL};
use crate::notify::LocalReleases;
use crate::session_locks::SessionLocks;

/// Locks in PostgreSQL or MySQL as session locks (`?mode=session`): each
/// held lock is a server-side lock on a connection of its own, freed by the
/// server when that connection ends, so a crashed holder frees its locks at
/// once. No rows, no fencing tokens (see the crate docs). Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqlSessionBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: SqlConfig,
    locks: SessionLocks,
    local: Arc<LocalReleases>,
}

impl SqlSessionBackend {
    /// Opens a backend for a `postgres://…?mode=session` or
    /// `mysql://…?mode=session` URL (see [`SqlConfig::from_url`]). No
    /// connection is made yet.
    ///
    /// # Errors
    /// `Config`/`InvalidOptions` for a bad URL, and `Config` for a URL
    /// without `mode=session` (lease rows are [`SqlBackend`](crate::SqlBackend)'s).
    pub fn connect(url: &str) -> Result<Self> {
        Self::with_config(SqlConfig::from_url(url)?)
    }

    /// Opens a backend from a parsed configuration.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub fn with_config(config: SqlConfig) -> Result<Self> {
        if config.mode != Mode::Session {
            return Err(Error::config(format!(
                "{}: lease rows need SqlBackend (or lockwright::connect); add ?mode=session \
                 for session locks",
                config.url
            )));
        }
        let locks = SessionLocks::new(&config)?;
        // Session locks notify only this process's waiters: a lock freed
        // with its connection sends nothing anyway.
        let local = LocalReleases::for_scope(
            &format!("{}\u{0}session", config.url.expose()),
            &config.table,
            #[cfg(feature = "postgres")]
            None,
        );
        Ok(SqlSessionBackend {
            inner: Arc::new(Inner {
                config,
                locks,
                local,
            }),
        })
    }

    /// The configuration in use (its URL prints without secrets).
    pub fn config(&self) -> &SqlConfig {
        &self.inner.config
    }

    /// Server-side ids (PostgreSQL backend pid, MySQL connection id) of the
    /// connections holding this client's locks.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub(crate) fn session_ids(&self) -> Vec<i64> {
        self.inner.locks.session_ids()
    }
}

#[async_trait]
impl LockBackend for SqlSessionBackend {
    fn capabilities(&self) -> Capabilities {
        // No row to keep a counter or a value in: no fences (see the crate
        // docs), no leader values (`proclaim` keeps the trait's
        // `Unsupported`, and elections are refused), and nothing kept once
        // a lock is free. Releases made by this process
        // wake this process's waiters at once; others are found by polling.
        // PostgreSQL's shared advisory locks give readers; MySQL has no
        // shared locks, and neither has a row to count a semaphore's
        // permits in.
        Capabilities::default()
            .with_min_ttl(MIN_TTL)
            .with_binding(Binding::Session)
            .with_shared(self.inner.locks.shared())
    }

    /// A connection is made and answers.
    async fn verify(&self) -> Result<()> {
        self.inner.locks.verify().await
    }

    async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        self.inner.locks.inspect(key).await
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.inner.locks.try_acquire(&request.hold).await
    }

    async fn release(&self, hold: &HoldId) -> Result<Release> {
        let key = &hold.key;
        let r = self.inner.locks.release(key, &hold.owner).await?;
        if r == Release::Freed {
            self.inner.local.released(key);
        }
        Ok(r)
    }

    async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        let each = requests
            .iter()
            .map(|r| self.inner.locks.renew(r.key(), r.owner()));
        futures::future::join_all(each).await
    }

    async fn watch(&self, key: &LockKey, _ticket: &OwnerToken) -> Result<Option<Watch>> {
        Ok(Some(self.inner.local.watch(key)))
    }

    /// Lets go of the turnstile a waiting writer holds, if any.
    async fn abandon(&self, hold: &HoldId, _ticket: &OwnerToken) -> Result<()> {
        // Readers of this process that the turnstile kept out; a waiter
        // that left no mark wakes nobody.
        if self.inner.locks.abandon(&hold.key, &hold.owner).await? {
            self.inner.local.released(&hold.key);
        }
        Ok(())
    }
}
