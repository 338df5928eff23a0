//! memcached backend for lockwright: `add` with an expiry, and release and
//! renewal that compare the owner atomically in the store.
//!
//! # The scheme
//!
//! A lock is one item whose value is `<owner token> <holds>`, then, when
//! the holder advertises a value (a leader's), a newline and the value's
//! bytes (the layout module has the details, and why items of earlier
//! versions still read as holds).
//! - **Acquire** is `add <key> 0 <ttl>`: the first writer wins. A lock
//!   already held is read with `mg v c t`; another owner's is `Contended`
//!   (with its seconds left as the latest time to look again), and our own
//!   gets one more hold, stored with `cas`.
//! - **Release** reads the item (`mg v c t`), checks the owner, then deletes
//!   it with `md <key> C<cas>` (or stores one hold fewer with `cas`).
//! - **Renew** reads the item, checks the owner, and stores the same value
//!   again with `cas` and the new expiry.
//! - **Proclaim** (a leader's new value) reads the item, checks the owner,
//!   and stores the new value with `cas` and the expiry the item had: the
//!   seconds left `mg` reported, which the server counts from the same
//!   clock, so the lease ends when it would have. A first grant writes the
//!   value the acquire request carries with the `add`; re-entries, renewals
//!   and releases of one hold keep the item's value.
//!
//! The CAS makes each write conditional on nothing having changed since
//! the read, so a holder whose lease ran out and was taken over reads the
//! new owner's token and gets `NotHeld` without writing anything: never a
//! plain `delete`, never a `touch` or `mg … T` (both extend an item without
//! looking at its CAS, and could shorten another owner's lease). The CAS
//! is read again every time, never cached: memcached restarts its CAS
//! counter at 1, so a cached one could match another owner's item after a
//! restart. (A restart *between* our read and our write, with the new
//! counter reaching the value we read within that one round trip, is the
//! window left.) Nor can the client choose the CAS itself to make it
//! unique: memcached 1.6.18 (Debian 12's) refuses the meta commands' `E`
//! flag with `CLIENT_ERROR invalid flag`.
//!
//! # A full server
//!
//! memcached's meta `ms` (in every mode, "add" included) and classic `set`
//! unlink the existing item when they cannot allocate the new one; `add`
//! and `cas` leave it alone, and `mg` and `md` allocate nothing (its
//! `proto_text.c`, 1.6.18 to today). So this backend sends only those:
//! on a full server started with `-M`, a held lock stays held, contenders
//! are told `Contended`, and new locks and renewals are refused with
//! `Unavailable` ("out of memory"). Any out-of-memory answer also raises
//! the backend's [`alarm`](lockwright_core::backend::LockBackend::alarm)
//! (but a renewal's, which read its lock just before): other writers to a
//! full server (an older client using `ms`) may have unlinked locks, and
//! the `Locker` renews each lease it keeps renewed at once. A refusal for
//! want of memory changed nothing, and says so
//! ([`Error::is_unapplied`](lockwright_core::Error::is_unapplied)), so a
//! quorum does not undo it: the undo of a failed re-entry would release
//! the owner's earlier hold. memcached's slab page mover can still drop
//! items it cannot move (`-o no_slab_reassign` stops it).
//!
//! # Client
//!
//! The backend speaks the text protocol itself (`wire.rs`), sending only
//! `add`, `cas`, `mg`, `md` and `mn`: the five commands whose failure on a
//! full server leaves a held lock alone. The `memcache` crate would not
//! do: its async meta client writes with `ms` and opens a connection for
//! every concurrent request, and its classic client blocks a thread per
//! call and checks out each pooled connection with an extra `version`
//! round trip. Here each server gets at most `connections` connections
//! (default 4), each carrying one exchange at a time, and the renewals of
//! a batch go as one write of `mg` reads and one of `cas` writes. Each
//! server is a client of its own: a multi-server client hashes keys across
//! servers, which moves a lock to a server that knows nothing of it when
//! one fails.
//!
//! # Time
//!
//! memcached counts whole seconds: its clock is the monotonic clock's
//! whole seconds, refreshed by a timer re-armed a second after each tick
//! (`clock_handler` in its `memcached.c`). Each tick comes a little late,
//! and when the lateness carries it across a second the clock jumps by
//! two, so an item stored for N seconds may expire after N − 2 of them.
//! TTLs are sent rounded up *plus two seconds*, so a lease lasts at least
//! its TTL and at most three seconds more; the shortest TTL is 2 s.
//! Rounding up alone would not do: a quorum's grant is valid for its TTL
//! only if every server that granted it keeps it at least that long. For
//! the same reason, the seconds left that `mg` reports (`t`) are read as
//! anywhere in (t − 2, t].
//!
//! # No fencing tokens
//!
//! memcached keeps no durable counter: an item can be evicted under memory
//! pressure (run the server with `-M` to refuse writes instead: see "A
//! full server") and a restart forgets everything, the CAS counter
//! included. A lock whose item
//! vanished early is noticed at its next renewal, which finds it gone:
//! the lost signal fires.
//!
//! # Semaphores and read-write locks
//!
//! A name held by several holders (a semaphore's permits, readers) is
//! still one item, holding the whole group, changed only by `cas` over
//! the version read; each holder's lease ends at a time on the server's
//! own clock, read in the same round trip (the claims module has the
//! layout, and the clock module the clock).
//!
//! # Several servers
//!
//! `memcache://h1:11211,h2:11211,h3:11211` (3 or more) is a quorum
//! ([`Quorum`](lockwright_core::backend::Quorum), Redlock's rules): every
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
//! - **An undo can overtake the request it undoes.** The client may send
//!   them on different pooled connections, so an acquire that timed out
//!   after it was sent may still land after the undo looked: that vote then
//!   stays until its TTL.
//!
//! # TLS
//!
//! `memcaches://h:11211?tls_ca=/etc/memcached/ca.pem` speaks TLS to a
//! memcached run with `-Z -o ssl_chain_cert=…,ssl_key=…`, to every server
//! of a quorum alike (`memcaches://h1,h2,h3`), never falling back to plain
//! text. The server's certificate must be signed by a CA in `tls_ca` (the
//! system's roots without it) and name the host as the URL writes it (an
//! IP address as an IP name). `tls_cert` and `tls_key` give a client
//! certificate, for a server run with `ssl_ca_cert=…,ssl_verify_mode=2`:
//! memcached's text protocol has no passwords, so this is how a server
//! keeps other clients out. The files are read when the backend is made;
//! a server certificate we refuse is a `Config` error naming the
//! parameter, never taken for a server that is down. A server refusing
//! ours says so after the handshake (TLS 1.3): `Config` when its alert
//! arrives before the connection closes, `Unavailable` when it does not.
//!
//! # Keys
//!
//! A key of printable ASCII without spaces that does not start with `#` and
//! fits with the prefix in 250 bytes is the item's key after the prefix;
//! any other is `<prefix>#` and the SHA-256 of the key in hex.

mod backend;
mod claims;
mod clock;
mod config;
mod error;
mod known;
mod layout;
mod node;
mod rules;
mod server;
mod tls;
mod wire;

pub use backend::MemcachedBackend;
pub use config::MemcachedConfig;
pub use config::SCHEMES;

use lockwright_core::backend::{Driver, ServerUrl};

/// Opens the memcached backend for a `memcache://` or `memcaches://` URL;
/// no connection is made until the first request.
///
/// # Errors
/// `Config`/`InvalidOptions` for a bad URL; `Config` for a TLS file that
/// cannot be read or used.
pub fn open(
    url: &str,
) -> lockwright_core::Result<std::sync::Arc<dyn lockwright_core::backend::LockBackend>> {
    Ok(std::sync::Arc::new(MemcachedBackend::connect(url)?))
}

/// This crate's declaration for the facade's registry: its schemes, its
/// opener, and which URLs must reach their servers directly (TLS checks
/// the server's name, which a local proxy would stand in for).
pub const DRIVER: Driver = Driver::new(SCHEMES, open).with_direct(checks_names);

/// See [`DRIVER`].
fn checks_names(url: &ServerUrl) -> bool {
    url.scheme() == "memcaches"
}
