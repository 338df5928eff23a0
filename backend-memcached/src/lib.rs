//! memcached backend for locksmith: `add` with an expiry, and release and
//! renewal that compare the owner atomically in the store.
//!
//! # The scheme
//!
//! A lock is one item whose value is `<owner token> <holds>`.
//! - **Acquire** is `ms <key> ME T<ttl>` ("add" mode): the first writer
//!   wins. A lock already held is read with `mg v c t`; another owner's is
//!   `Contended` (with its seconds left as the latest time to look again),
//!   and our own gets one more hold, stored with `C<cas>`.
//! - **Release** reads the item (`mg v c`), checks the owner, then deletes
//!   it with `md <key> C<cas>` (or stores one hold fewer with `C<cas>`).
//! - **Renew** reads the item, checks the owner, and stores the same value
//!   again with `C<cas> T<ttl>`.
//!
//! The CAS makes each write conditional on nothing having changed since
//! the read, so a holder whose lease ran out and was taken over reads the
//! new owner's token and gets `NotHeld` without writing anything: never a
//! plain `delete`, never a `touch` (`mg … T` touches without looking at
//! the CAS). The CAS is read again every time, never cached: memcached
//! restarts its CAS counter at 1, so a cached one could match another
//! owner's item after a restart. (A restart *between* our read and our
//! write, with the new counter reaching the value we read within that one
//! round trip, is the window left.)
//!
//! # Client
//!
//! The `memcache` crate's async meta-protocol client
//! (`memcache::exp::AsyncMetaClient`, on tokio): its classic client blocks
//! a thread per call and checks each pooled connection with an extra
//! round trip. One client per server: the crate's own multi-server mode
//! hashes keys across servers, which moves a lock to a server that knows
//! nothing of it when one fails.
//!
//! # Time
//!
//! memcached counts whole seconds, and an item stored for N seconds may
//! expire after N − 1 of them (its clock ticks once a second). TTLs are
//! sent rounded up *plus one second*, so a lease lasts at least its TTL and
//! at most two seconds more; the shortest TTL is 2 s.
//!
//! # No fencing tokens
//!
//! memcached keeps no durable counter: an item can be evicted under memory
//! pressure (run the server with `-M` to refuse writes instead) and a
//! restart forgets everything, the CAS counter included. A lock whose item
//! vanished early is noticed at its next renewal, which finds it gone:
//! the lost signal fires.
//!
//! # Several servers
//!
//! `memcache://h1:11211,h2:11211,h3:11211` (3 or more) is a quorum
//! ([`Quorum`](locksmith_core::backend::Quorum), Redlock's rules): every
//! request goes to every server, a lock is held when a majority granted it
//! within `ttl − elapsed − drift`, a failed acquire is undone on every
//! server that granted it or did not answer, and renewal counts a majority
//! too.
//!
//! Two limits, both Redlock's too:
//! - **A restarted server forgets its locks.** The holder's next renewal
//!   (every third of the TTL) puts its vote back there while a majority
//!   still holds the lock; until then, a second server restarting would
//!   leave a majority free for another owner. Stagger restarts by more
//!   than a renewal period (Redlock's own rule, keeping a restarted node
//!   out for one TTL, is the safe one, and memcached cannot enforce it).
//! - **An undo can overtake the request it undoes.** The client sends them
//!   on different pooled connections, so an acquire that timed out after
//!   it was sent may still land after the undo looked: that vote then stays
//!   until its TTL.
//!
//! # Keys
//!
//! A key of printable ASCII without spaces that does not start with `#` and
//! fits with the prefix in 250 bytes is the item's key after the prefix;
//! any other is `<prefix>#` and the SHA-256 of the key in hex.

mod backend;
mod config;
mod node;
mod wire;

pub use backend::MemcachedBackend;
pub use config::MemcachedConfig;

/// Opens the memcached backend for a `memcache://` URL; no connection is
/// made until the first request.
///
/// # Errors
/// `Config`/`InvalidOptions` for a bad URL.
pub fn open(
    url: &str,
) -> locksmith_core::Result<std::sync::Arc<dyn locksmith_core::backend::LockBackend>> {
    Ok(std::sync::Arc::new(MemcachedBackend::connect(url)?))
}
