//! etcd backend for lockwright: a lock is Go's `concurrency.Mutex`.
//!
//! `etcd://[user:password@]h1:2379,h2:2379,h3:2379/root?lease_ttl=10s`
//! (see [`EtcdConfig`]). A lock `name` is the keys `<root>/<name>/<lease
//! id in hex>`, one per contender, each attached to its backend's lease;
//! the one with the lowest create revision holds. So a Go service that locks
//! `<root>/<name>` with `concurrency.NewMutex`, or a shell with `etcdctl
//! lock <root>/<name>`, and a Rust service that locks `name` on
//! `etcd://…/<root>` exclude each other, both ways.
//!
//! # The lease is the session
//!
//! Each backend (each `Locker`'s connection) grants one lease, with the
//! URL's `lease_ttl`, and keeps it alive in the background every third of
//! it; its keys live as long as it does. A crashed holder's lock frees
//! one lease TTL after it was last heard from, and a dropped backend
//! revokes its lease, so its keys go at once, as Go's `Session.Close`. The
//! `Locker` renews a hold at least every third of the lease TTL (a
//! keep-alive and one read of the hold's key, in one round trip each, for
//! every hold of a batch at once) and trusts it for one lease TTL after the
//! last confirmed renewal, less drift: its lost signal fires before the
//! cluster could have let the lease go and given the lock to another. A
//! grant (and a re-entry) is trusted from its attempt on, and a put does
//! not renew the lease its key is on, so each attempt keeps the lease
//! alive in the same round trip and grants nothing unless that is
//! confirmed. A keep-alive answer is read only by the request that asked
//! for it: a stream left with an answer in flight is dropped. A
//! lease the cluster says is gone (expired, revoked) loses every hold on
//! it at the next renewal, and the next acquire grants a new one.
//!
//! A name with `/` or `%` has those two %-escaped (`a%2Fb`), so no name's
//! keys fall under another's prefix (Go's lock `a` waits for ever on the
//! keys of `a/b`); every other name is its own, as Go's.
//!
//! # Fencing
//!
//! A grant's token is its key's create revision: the cluster's own total
//! order of writes, so tokens strictly increase across every name and
//! every grant, with no state kept per name.
//!
//! # Waiting in line
//!
//! A caller prepared to wait keeps its key: its place in the one line, by
//! create revision, that Go's and `etcdctl`'s waiters stand in too. It
//! watches only the delete of the key just before its own, as Go's
//! `waitDeletes` does, and looks again when it goes; a waiter that gives
//! up deletes its key. So waiters are served in arrival order, each woken
//! by its predecessor's release, with no polling.
//!
//! # Elections
//!
//! As Go's `concurrency.Election` on `<root>/<name>`: a candidate's key
//! carries its value (written with the key, so a waiting candidate's is
//! there when it comes first), the first contender leads with its key's
//! create revision as its term, a proclaim rewrites the leader's key in
//! place on the same lease, compared on its create revision, and an
//! observer watches the name's prefix. So `etcdctl elect` and a Go
//! service's `Election` share our elections both ways. A leader's value
//! may not start with `lockwright:`: such values mark permits and readers.
//!
//! # Semaphores and read-write locks
//!
//! In the same one line per name, each key saying its kind in its value
//! (see `claims.rs`): a semaphore's permit is `lockwright:permits=N` and
//! holds while fewer than N keys are before it; a reader's is
//! `lockwright:shared` and holds while only readers are before it; a
//! writer is a mutex (first in line holds), so Go's mutex and `etcdctl
//! lock` on the name are writers of our read-write lock, and a waiting
//! writer stops later readers. A claim that meets another kind or another
//! N is refused, typed, its key deleted first. A writer's downgrade reads
//! on the writer's own key, rewritten as a reader's when the writer lets
//! go, so it keeps the writer's place in line. Fences are create
//! revisions, but for a downgrade's read hold, whose fence is the revision
//! of a write to the writer's key made as it downgrades (above the
//! writer's). So a writer that queued before the downgrade, and holds after
//! the reader, has a lower fence than that read hold: a resource that
//! checks fences should check writers' fences only. Semaphore and reader
//! waiters watch the whole line, not one predecessor (N holders leave in
//! any order), and read it again at each release.
//!
//! # One attempt
//!
//! One attempt is one transaction, as Go's `TryLock`: the contender's key
//! is put on the lease if missing and the name's first contender (the
//! whole line, for a semaphore or reader) read in the same step; a
//! contender that does not hold deletes its key before it reports the
//! lock held. A put whose answer was lost (a timeout, a
//! dropped future) is followed by the delete of the key, in the
//! background while the lease lives.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod attempt;
mod backend;
mod claims;
mod config;
mod error;
mod layout;
mod node;
mod observe;
mod queue;
mod renew;
mod state;
mod status;

pub use backend::EtcdBackend;
pub use config::EtcdConfig;
pub use config::SCHEMES;
pub use lockwright_core::backend::TlsFiles;

use lockwright_core::backend::{Driver, ServerUrl};

/// Opens the etcd backend for an `etcd://` URL; no connection is made
/// until the first request.
///
/// # Errors
/// `Config`/`InvalidOptions` for a bad URL.
pub fn open(
    url: &str,
) -> lockwright_core::Result<std::sync::Arc<dyn lockwright_core::backend::LockBackend>> {
    Ok(std::sync::Arc::new(EtcdBackend::connect(url)?))
}

/// The lease and the key layout, for tests that revoke a backend's lease
/// from outside or read its keys. Only with the `internals` feature, and
/// outside semver.
#[cfg(feature = "internals")]
pub mod internals {
    pub use etcd_client;

    /// The lease of `backend`'s current session, if it was granted one.
    pub async fn lease(backend: &crate::EtcdBackend) -> Option<i64> {
        backend.lease().await
    }

    /// The name whose contender `key` is, under `root`.
    pub fn name_of(root: &str, key: &str) -> Option<String> {
        crate::layout::name_of(root, key)
    }
}

/// This crate's declaration for the facade's registry: its schemes, its
/// opener, and which URLs must reach their servers directly (TLS checks
/// the server's name, which a local proxy would stand in for).
pub const DRIVER: Driver = Driver::new(SCHEMES, open).with_direct(checks_names);

/// See [`DRIVER`].
fn checks_names(url: &ServerUrl) -> bool {
    url.scheme() == "etcds"
}
