//! The conformance suite against a user's URL: clients are plain clients of
//! that store; a "down" store is the same URL pointed at a closed local
//! port; and what only a harness with control of the server can do (end a
//! session from the server side, count the store's own state) is refused
//! and reported as skipped. Every lock a case was granted is released at
//! the end.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use lockwright::backend::{
    Acquire, AcquireRequest, Capabilities, HoldId, LockBackend, Release, Renew, RenewRequest,
};
use lockwright::{Error, LockKey, OwnerToken, Result};
use lockwright_conformance::Harness;

use lockwright_conformance::faults::{Observed, Observer};

/// Cases that count the store's own state, which needs access to it.
pub(crate) const NEEDS_STORE_ACCESS: &[&str] = &[
    "store_state_is_bounded",
    "fencing_rises_after_state_is_collected",
];

/// Why those cases are skipped.
pub(crate) const STORE_ACCESS: &str =
    "counts the keys, rows or nodes the store keeps, which needs access to the store itself";

/// Every (key, owner) a case was granted. Not the clients: a session
/// store's locks must end with their client, as the cases expect.
type Granted = Arc<Mutex<Vec<HoldId>>>;

/// A harness over one URL.
pub(crate) struct UrlHarness {
    url: String,
    down_url: Option<String>,
    /// What the running case asked for that this harness cannot do.
    refused: Mutex<Option<&'static str>>,
    granted: Granted,
}

impl UrlHarness {
    /// A harness for `url`; `down_url`, if any, reaches nothing.
    pub(crate) fn new(url: &str, down_url: Option<String>) -> UrlHarness {
        UrlHarness {
            url: url.to_owned(),
            down_url,
            refused: Mutex::new(None),
            granted: Arc::default(),
        }
    }

    /// Why the last case could not be run here, if it asked for server control.
    pub(crate) fn take_refusal(&self) -> Option<&'static str> {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    fn refuse(&self, why: &'static str) -> anyhow::Error {
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        anyhow::anyhow!("{why}")
    }

    /// Releases every hold any case was granted (owner-checked, so a
    /// lock a case already released or lost is left alone; a session
    /// store's locks ended with their clients). Returns how many keys are
    /// still held afterwards.
    pub(crate) async fn clean_up(&self) -> usize {
        let granted = std::mem::take(&mut *self.granted.lock().unwrap_or_else(|e| e.into_inner()));
        let mut keys = std::collections::HashSet::new();
        let Ok(client) = lockwright::backend::open(&self.url).await else {
            return granted.len();
        };
        for hold in &granted {
            for _ in 0..64 {
                match client.release(hold).await {
                    Ok(Release::StillHeld(_)) => continue,
                    _ => break,
                }
            }
            keys.insert(hold.key.clone());
        }
        let mut held = 0;
        for key in keys {
            if client.inspect(&key).await.is_ok_and(|s| s.held) {
                held += 1;
            }
        }
        held
    }
}

#[async_trait]
impl Harness for UrlHarness {
    async fn client(&self) -> Arc<dyn LockBackend> {
        match lockwright::backend::open(&self.url).await {
            Ok(inner) => Observed::wrap(inner, Tracking(self.granted.clone())),
            Err(e) => Arc::new(Refusing(e.to_string())),
        }
    }

    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        let opened = match &self.down_url {
            Some(url) => lockwright::backend::open(url).await.ok(),
            None => None,
        };
        match opened {
            Some(b) => b,
            None => {
                let why = self.refuse(
                    "needs a copy of the store that is down; a store reached without TCP \
                     (a file, a Unix socket) cannot be pointed at a closed port",
                );
                Arc::new(Refusing(why.to_string()))
            }
        }
    }

    async fn end_sessions(&self, _client: &Arc<dyn LockBackend>) -> anyhow::Result<()> {
        Err(self.refuse(
            "ends a client's session from the server side, which needs control of the server",
        ))
    }

    async fn stored_names(&self, _prefix: &str) -> anyhow::Result<u64> {
        Err(self.refuse(STORE_ACCESS))
    }
}

/// A client that answers every call with a configuration error: stands in
/// for a client this harness cannot make, so the case fails (and is then
/// reported as skipped) rather than passing.
#[derive(Debug)]
struct Refusing(String);

impl Refusing {
    fn err(&self) -> Error {
        Error::config(format!("not available in `lockwright check`: {}", self.0))
    }
}

#[async_trait]
impl LockBackend for Refusing {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    async fn try_acquire(&self, _: &AcquireRequest) -> Result<Acquire> {
        Err(self.err())
    }
    async fn release(&self, _: &HoldId) -> Result<Release> {
        Err(self.err())
    }
    async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        requests.iter().map(|_| Err(self.err())).collect()
    }
    // As the trait's defaults were: no status, and nothing to leave.
    async fn inspect(&self, _: &LockKey) -> Result<lockwright::LockStatus> {
        Err(Error::new(
            lockwright::ErrorKind::Unsupported,
            "this store cannot report a lock's status",
        ))
    }
    async fn abandon(&self, _: &HoldId, _: &OwnerToken) -> Result<()> {
        Ok(())
    }
}

/// Remembers every grant, for the clean-up.
#[derive(Debug)]
struct Tracking(Granted);

impl Observer for Tracking {
    fn granted(&self, hold: &HoldId) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(hold.clone());
    }
}
