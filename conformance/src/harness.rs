//! [`Harness`]: what a backend's tests give the suite, under every case
//! (the cases and the crate root both use it, so it sits below them).

use std::sync::Arc;

use async_trait::async_trait;
use lockwright_core::backend::LockBackend;

/// What a backend's tests provide so the suite can drive a real store.
#[async_trait]
pub trait Harness: Send + Sync {
    /// A new client of the store under test, with its own connection(s), as a
    /// separate process would have.
    async fn client(&self) -> Arc<dyn LockBackend>;

    /// A client configured like the others but pointed at a store that is
    /// down or unreachable (a closed port, a missing database file).
    async fn unreachable_client(&self) -> Arc<dyn LockBackend>;

    /// Ends every session `client` has with the store, from the server side,
    /// as a crash or a lost network would. Session-bound backends
    /// ([`Binding::Session`](lockwright_core::backend::Binding::Session)) must provide
    /// it: their cases end a holder's session where lease-bound cases wait
    /// for the lease to run out.
    async fn end_sessions(&self, client: &Arc<dyn LockBackend>) -> anyhow::Result<()> {
        let _ = client;
        anyhow::bail!("this harness cannot end a client's sessions, which session-bound cases need")
    }

    /// How many lock names starting with `prefix` the store keeps any state
    /// for, read from the store itself: Redis keys, SQL rows, in-memory
    /// slots. Under Redlock, the most any one node keeps. The bounded-state
    /// cases need it; a harness that cannot inspect its store fails them.
    async fn stored_names(&self, prefix: &str) -> anyhow::Result<u64> {
        let _ = prefix;
        anyhow::bail!("this harness cannot inspect its store, which the bounded-state cases need")
    }
}
