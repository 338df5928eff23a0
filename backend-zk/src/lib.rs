//! ZooKeeper backend for lockwright: Curator's `InterProcessMutex`,
//! `InterProcessSemaphoreV2` and `InterProcessReadWriteLock` recipes, so
//! Rust services share locks with Java (Curator) fleets.
//!
//! # The scheme
//!
//! A lock is a directory, `<root>/<key>`, made as a *container* node (ZooKeeper
//! 3.5+), which the server reaps once it is empty. A contender creates an
//! ephemeral sequential node in it, named as Curator names its own:
//! `_c_<uuid>-lock-<sequence>`, holding its owner's advertised value, if
//! any (see *Leader election*). The lowest
//! sequence holds the lock. Every other waiter watches only the node just
//! before its own (no thundering herd), so waiters are served in arrival
//! order and a release wakes exactly one of them. Curator sorts by the same
//! rule (the text after the last `lock-`), so a Curator `InterProcessMutex`
//! on the same path and lockwright exclude each other, both ways.
//!
//! - `try_acquire` creates a node and lists the directory in one round trip
//!   (the client sends both at once; the server answers in order). If ours
//!   is not first, it is deleted and the answer is `Contended`.
//! - A waiting acquire keeps its node in the queue; the lock is handed to
//!   it (a `Granted` notice) when the node before it goes.
//! - `release` deletes the node. Its path carries our UUID, so it can only
//!   ever be our node; a node of an ended session is gone already.
//! - `renew` checks that the node exists and that its `ephemeralOwner` is
//!   our live session.
//! - Re-entry is counted in this process: a second acquire by the same
//!   owner checks the node and adds a hold.
//!
//! # What Curator does, which this backend must match
//!
//! Curator's `InterProcessMutex` creates `<path>/_c_<uuid>-lock-<sequence>`:
//! its lock name `lock-` behind the prefix of its *protected mode*, which
//! lets a client find its own node after a create whose answer was lost.
//! It makes missing parents as containers. It orders a directory's
//! children by the text after their last `lock-`, the zero-padded
//! sequence compared as text, so the UUID plays no part and a child
//! without `lock-` sorts by its whole name (ties, which Curator leaves to
//! the listing's order, sort here by whole name). The first child holds
//! the lock, and every other watches the one just before it. A release
//! deletes the node with no version or owner check: its unique path is its
//! identity. Mutual exclusion with Java clients rests on every one of these
//! rules (names, order, containers), and breaks silently if one drifts:
//! `tests/curator.rs` runs Curator itself against this backend.
//!
//! Python's kazoo names its nodes `<uuid>__lock__<sequence>`, and sees
//! Curator's, and so ours, only when its lock is given
//! `extra_lock_patterns=["-lock-"]`.
//!
//! # Leader election
//!
//! An election is the lock on its name, as Curator's `LeaderSelector` is
//! an `InterProcessMutex` on its path: a campaign is a contender node whose
//! data is the value it advertises, written by the create that queues it,
//! so the node is never first without it. `LeaderSelector` writes its
//! participant id (UTF-8) there in the same way, and its `getLeader()`
//! reads the first node's data, so each side reads the other's leader: a
//! Curator leader's id is our leader's value, and our value its id. A
//! proclaim sets the data of the holder's own node, only while it is its
//! live session's and first, and conditioned on the version just read;
//! the value goes with the node. A plain lock's node holds no data (never
//! its owner token: nothing reads the data back, and Curator would show
//! it as an id), and empty data reads as no value. Our node's UUID is
//! marked version 8, so that a node of lockwright before values, which
//! held a generated owner token, is known and its token never shown.
//!
//! An election's observer hears each change from ZooKeeper itself: a
//! children watch on the lock's directory and a data watch on its first
//! node, set again each time one fires (an existence watch while the
//! directory does not exist), so a new leader, a resignation or a proclaim
//! shows within a round trip or two, and the poll only bounds a notice lost
//! with a session.
//!
//! # Semaphores and read-write locks
//!
//! In Curator's layouts, so that Java services share them (proven by
//! `tests/curator.rs` against Debian's Curator 5.4, downgrade included):
//!
//! - A semaphore of N on `P` is `InterProcessSemaphoreV2`'s: its gate
//!   `P/locks` (a mutex queue like the lock's) and its leases
//!   `P/leases/_c_<uuid>-lease-<seq>`. First at the gate, a contender
//!   makes its lease node and lists the leases in one round trip; it holds
//!   a permit when they number N or fewer, its own included, and then
//!   deletes its gate node. A waiter keeps both and lists again when the
//!   leases change. When nobody is at the gate, a contender first makes
//!   its lease without it and reads the gate, the leases and their N in
//!   one `multiRead` (ZooKeeper 3.6 or later), keeping the lease only if
//!   it is held and the gate was empty (safe without the gate: of N + 1
//!   leases held at once, the listing of the one created last would have
//!   counted them all);
//!   otherwise the lease goes at once and the gate is taken. Curator keeps N in no node and checks none; ours
//!   writes N as the data of `P/leases` (a container, gone with the last
//!   lease) and refuses another N while other leases live. A Java peer's
//!   N is not checked: give every side the same N. A semaphore of 1 is the
//!   mutex on every store, here too: its node is a lock's, which a Java
//!   `InterProcessSemaphoreV2` of 1 does not see (use N ≥ 2 with Java
//!   semaphore peers, or Curator's `InterProcessMutex` for one holder).
//! - A read-write lock on `P` is `InterProcessReadWriteLock`'s: readers
//!   `_c_<uuid>-__READ__<seq>` and writers `_c_<uuid>-__WRIT__<seq>` in
//!   one queue, ordered by sequence. A writer holds when first; a reader
//!   when no writer (or mutex holder) is before it, so a waiting writer
//!   keeps later readers out. A writer's downgrade is Curator 5.5's: an
//!   ephemeral read node with the writer's own sequence, so a writer that
//!   queued behind ours stays behind the read hold (CURATOR-621; Curator
//!   5.4 peers sort by the same rule, and so honour it, as the interop
//!   test shows; a 5.4 peer's own downgrade has the gap Curator fixed).
//!   Only `ReadWriteLock::write` makes a writer's node: an exclusive claim
//!   of `lock_all_claims` is a lock's, which Curator's readers do not see.
//! - A name is one kind at a time: a mutex, writer or reader meeting a
//!   semaphore's live leases, or a semaphore meeting their nodes, is
//!   `InvalidOptions`. Curator's own mutex does not see readers and
//!   writers, nor they it; ours see both.
//! - kazoo's recipes share no layout with Curator's; it is a benchmark
//!   peer only.
//!
//! # Keys
//!
//! A key that is a plain ZooKeeper node name (no `/`, not `.` or `..`, no
//! control or private-use characters, at most 255 bytes, not starting with
//! `%`) is the directory's name as it is, so `orders` is `<root>/orders`,
//! where Curator finds it. Any other key becomes `%` followed by its UTF-8
//! bytes percent-encoded (all but `A-Z a-z 0-9 . _ -`), or, if that is
//! longer than 255 bytes, `%~` and the SHA-256 of the key in hex. No two
//! keys share a directory.
//!
//! # Fencing tokens
//!
//! A grant's token is the `czxid` of the holder's node, which the create
//! returns (no extra round trip). Zxids are totally ordered across the
//! ensemble, leader changes included (the epoch is the high 32 bits), and
//! grants follow creation order, so tokens strictly increase across
//! release, session expiry and the reaping of the directory. The node's
//! sequence number would not do: a directory that was reaped and made
//! again numbers its nodes from zero.
//!
//! # Sessions: what "suspect" means
//!
//! The lock lives as long as the session that created the node. A holder
//! cut off from the ensemble cannot know whether its session still lives,
//! so its lock is *suspect* from its last confirmed contact: the server
//! ends the session between one session timeout and one tick more after
//! it last heard from the client, which is no earlier than the moment the
//! client sent any request the server answered, and may then grant the
//! lock to someone else. The client crate itself declares a session
//! expired only after 1.4 session timeouts out of touch, too late to warn
//! a holder, so the warning is the `Locker`'s. The backend
//! reports the session timeout as [`Capabilities::max_lease`](lockwright_core::backend::Capabilities::max_lease): the
//! `Locker` confirms each hold at least every third of it, and a hold not
//! confirmed within one session timeout (minus clock drift) of the last
//! confirmation fires the guard's lost signal, before the server could have
//! ended the session. A GC pause or a frozen process longer than the
//! session timeout loses the lock the same way: pick a session timeout
//! longer than your pauses, and use the fencing token for writes.
//!
//! An ended session is never reused: the next request opens a new one.
//! A node is only ever taken as ours if its `ephemeralOwner` is the live
//! session that created it, never because a listing shows our name: after
//! a reconnect under a new session, the old session's node can still be
//! listed while the server expires it, and a client that took it for its
//! own would hold the lock alongside the next holder (Curator's
//! CURATOR-604). A create whose answer was lost is followed up in the
//! background: the node is found by its UUID and our session, and deleted.
//! While disconnected, the client reconnects with backoff (never a busy
//! loop) and requests wait at most `timeout` before they are `Unavailable`.
//!
//! # What stays in ZooKeeper
//!
//! Only live contenders' ephemeral nodes, and lock directories, which are
//! container nodes the server deletes once empty, within its
//! `znode.container.checkIntervalMs` (default a minute; tell the backend
//! with `?retention=`). Nodes of a crashed client go with its session.
//!
//! # Why not the client's own lock
//!
//! The `zookeeper-client` crate has `Client::lock` with a Curator prefix.
//! This backend builds on its `create`, `list_children`,
//! `get_and_watch_data`, `check_stat` and `delete` instead, because that
//! lock only blocks (the contract needs a single attempt), drops the
//! create's `Stat` (the fence would cost a round trip), retries a lost
//! connection until the session dies (never `Unavailable`), and its clean-up
//! of a Curator-named node on drop passes a bare name to `delete`, which
//! fails and leaves the node in the queue. What else of the client shapes
//! this crate is told where it matters: sessions in `node.rs`, requests
//! that outlive their future in `cleanup.rs`.
//!
//! Connection URLs are read by [`ZkConfig::from_url`].

#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod claims;
mod claims_permit;
mod cleanup;
mod config;
mod error;
mod layout;
mod node;
mod observe;
mod queue;
mod state;
mod status;

pub use backend::ZkBackend;
pub use config::ZkConfig;
pub use config::SCHEMES;

use lockwright_core::backend::Driver;

/// Opens the ZooKeeper backend for a `zk://` URL; no connection is made
/// until the first request.
///
/// # Errors
/// `Config`/`InvalidOptions` for a bad URL.
pub fn open(
    url: &str,
) -> lockwright_core::Result<std::sync::Arc<dyn lockwright_core::backend::LockBackend>> {
    Ok(std::sync::Arc::new(ZkBackend::connect(url)?))
}

/// Session handles and the key layout, for tests that end a client's
/// session from outside or read the tree. Only with the `internals`
/// feature, and outside semver.
#[cfg(feature = "internals")]
pub mod internals {
    pub use zookeeper_client;

    /// The current session of `backend`, if it has one that has not ended.
    pub async fn session(backend: &crate::ZkBackend) -> Option<zookeeper_client::SessionInfo> {
        backend.session_info().await
    }

    /// The full paths of the nodes `backend`'s waiters last set their watch
    /// on (a waiter handed the lock since keeps its last): each should be
    /// the node just before the waiter's own.
    pub fn watched(backend: &crate::ZkBackend) -> Vec<String> {
        backend.watched()
    }

    /// The directory name of `key` (at the top of the tree when `at_top`).
    pub fn dir_name(key: &str, at_top: bool) -> String {
        crate::layout::dir_name(key, at_top)
    }

    /// The key a directory name stands for; `None` for a hashed one.
    pub fn key_of(dir: &str) -> Option<String> {
        crate::layout::key_of(dir)
    }
}

/// This crate's declaration for the facade's registry: its schemes and
/// its opener.
pub const DRIVER: Driver = Driver::new(SCHEMES, open);
