//! What a backend crate declares so that `lockwright::connect(url)` and the
//! `lockwright` command reach it: its schemes, how it opens a URL, and
//! the few facts about its URLs that tools need without knowing the store.
//! A crate written outside this repository declares one the same way and
//! registers it (`lockwright::backend::register`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::backend::LockBackend;
use crate::url::{Scheme, ServerUrl};
use crate::Result;

/// Opens a backend for a URL whose scheme the driver declares. Nothing is
/// sent to the store yet: `LockBackend::verify` does that.
pub type Opener = fn(&str) -> Result<Arc<dyn LockBackend>>;

/// Makes a deployment fail over on purpose, for fault runs; answers which
/// node took over from which.
pub type FailOver = fn(String) -> Pin<Box<dyn Future<Output = Result<String>> + Send>>;

/// One backend crate's declaration: the schemes it answers to and its
/// opener, plus optional facts and hooks for tools.
///
/// ```
/// use std::sync::Arc;
/// use lockwright_core::backend::{Driver, MemoryBackend, Scheme};
///
/// const SCHEMES: &[Scheme] = &[Scheme::new("mine", "my store", Some(7000))];
/// const DRIVER: Driver = Driver::new(SCHEMES, |_url| Ok(Arc::new(MemoryBackend::new())));
/// assert_eq!(DRIVER.schemes()[0].name, "mine");
/// ```
#[derive(Clone, Copy)]
pub struct Driver {
    schemes: &'static [Scheme],
    open: Opener,
    direct: fn(&ServerUrl) -> bool,
    failover: Option<FailOver>,
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.schemes.iter().map(|s| s.name).collect();
        f.debug_struct("Driver")
            .field("schemes", &names)
            .field("failover", &self.failover.is_some())
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// A driver answering to `schemes` with `open`.
    pub const fn new(schemes: &'static [Scheme], open: Opener) -> Self {
        Driver {
            schemes,
            open,
            direct: |_| false,
            failover: None,
        }
    }

    /// Says which URLs must reach the servers they name directly, so that
    /// a tool's local TCP proxy (`lockwright check` and `bench` put one in
    /// front of each server) cannot stand in for them: TLS that checks the
    /// server's name, or servers that name the servers the client goes to
    /// next (sentinels, a cluster's nodes). The default: none.
    #[must_use]
    pub const fn with_direct(mut self, direct: fn(&ServerUrl) -> bool) -> Self {
        self.direct = direct;
        self
    }

    /// Adds the hook that makes a deployment fail over on purpose
    /// (`lockwright check --faults …,failover`).
    #[must_use]
    pub const fn with_failover(mut self, failover: FailOver) -> Self {
        self.failover = Some(failover);
        self
    }

    /// The schemes this driver answers to.
    pub fn schemes(&self) -> &'static [Scheme] {
        self.schemes
    }

    /// The entry of [`schemes`](Self::schemes) named `name`, if any.
    pub fn scheme(&self, name: &str) -> Option<&'static Scheme> {
        self.schemes.iter().find(|s| s.name == name)
    }

    /// Opens a backend for `url` (see [`Opener`]).
    ///
    /// # Errors
    /// What the backend refuses in the URL (`Config`, `InvalidOptions`).
    pub fn open(&self, url: &str) -> Result<Arc<dyn LockBackend>> {
        (self.open)(url)
    }

    /// Whether `url` must reach its servers directly (see
    /// [`with_direct`](Self::with_direct)).
    pub fn is_direct(&self, url: &ServerUrl) -> bool {
        (self.direct)(url)
    }

    /// The fail-over hook, if the store has one.
    pub fn failover(&self) -> Option<FailOver> {
        self.failover
    }
}
