//! Redis backend for lockwright.
//!
//! # The scheme
//!
//! A lock is one key with a millisecond expiry. Held once with nobody
//! waiting, the common case, it is a plain string: the holder's owner token
//! (128 random bits) and the grant's fencing token, taken with `SET NX PX`
//! and freed with `DEL` inside the scripts. Held more than once or with
//! waiters queued, it is a Redis hash whose owner field is the owner token
//! and whose value is the hold count, so that one owner can hold it
//! again. The scripts turn the first form into the second when they need
//! to; Redis charges for each call a script makes, and the plain string
//! takes one call where the hash takes two. Acquire, release and
//! renew are each one Lua script, so each is atomic and owner-checked: a
//! holder whose lease ran out and was taken over cannot release or extend
//! the new holder's lock. Lock and wait queue share a `{hash tag}` and stay
//! in one cluster slot.
//!
//! # What stays in Redis
//!
//! Only live locks and live queues. The lock's key (string or hash) goes on
//! release and at the end of its lease (Redis's own expiry); the queue's two keys expire
//! when the last waiter stops refreshing them. No key is kept per name once
//! a lock is free, so locking millions of distinct names leaves nothing
//! behind: the retention is zero.
//!
//! # Fencing tokens
//!
//! A grant's token is the Redis server's clock in microseconds when the
//! grant was made (`TIME` inside the script), or one above the token it
//! follows when a release hands the lock straight to a waiter in the same
//! script. Every grant of a key is a separate command, and Redis takes more
//! than a microsecond per command, so tokens strictly increase across
//! release, expiry, takeover and a restart that lost the data, **provided
//! the server's clock does not step back** (NTP slews rather than steps).
//! The token is kept in the lock's key only while the lock lives.
//!
//! Under Sentinel and on a Cluster the clock is shifted by an hour per
//! *config epoch*, which every failover raises: the epoch the sentinels
//! name the primary in (read with its address), or on a Cluster the
//! granting node's own (`cluster_my_epoch`, read by the script itself, which
//! a failover, or a slot moved to the node through `IMPORTING` as
//! `redis-cli --cluster reshard` does, makes the greatest). So a
//! promoted replica's tokens are above the old primary's even when its
//! clock is up to an hour behind. The assumption becomes: **within one
//! epoch the primary's clock does not step back, and a new primary's clock
//! is less than an hour behind the old one's.** 2^53 µs leaves room for
//! two million epochs beyond today's clock. Not covered: sentinels that
//! start again without their config (or `SENTINEL RESET`, a new
//! `MONITOR`) count epochs from 0 again, and slots given to a node by
//! hand (`ADDSLOTS`, `SETSLOT … NODE` without `IMPORTING`) leave its epoch
//! as it was; after either, tokens can fall below earlier ones.
//!
//! Earlier versions kept a counter key `…{name}:fence` per name, for
//! ever. They are no longer read or written: their values (seeded from the
//! same clock, one per grant) are all below the clock now, so the new
//! tokens are higher. Delete them at leisure, for example with
//! `redis-cli --scan --pattern 'lockwright:{*}:fence' | xargs -r redis-cli unlink`
//! (with your prefix). A lock held by an old version across the upgrade is
//! respected. Upgrade every client of a keyspace together: an old client
//! still running keeps counting its own per-name counter, which can be
//! below the tokens new clients handed out, and it does not know the plain
//! string form: where a new client holds a lock that way, an old client's
//! attempt on it fails with a `WRONGTYPE` error (never a second grant).
//! The same goes for a version from before a semaphore's lone permit took
//! the string form (see below): it reads one as a lock held by an owner it
//! cannot name, so its claims of the semaphore are refused
//! (`InvalidOptions`) while the lone permit is held, its status shows a
//! lock, and its waiting lock or read hold on the name makes the hash that
//! version knows, where the permit's holder finds no hold of its own and
//! is told its permit is lost. None of them is ever a second grant.
//!
//! # Hand-off: a fair queue, and the lock delivered by message
//!
//! A caller prepared to wait queues a ticket in Redis (arrival order) with
//! its first attempt. The script that frees the lock (a release, or any
//! attempt that finds an expired lease) takes it at once for the longest
//! live waiter and publishes the grant on that waiter's *hub*: one pub/sub
//! connection per backend, subscribed before the waiter queues, so a release
//! between a failed attempt and the subscription cannot be missed. The waiter
//! holds the lock when the message arrives, without a round trip of its own;
//! only that waiter wakes, and nobody (the releaser included) can barge in
//! ahead of it. A queued waiter refreshes its place every `waiter_refresh`
//! (500 ms by default), which also picks up a grant whose message was lost;
//! a waiter silent for four periods (its process died) is skipped. The
//! watchdog renews all of a locker's leases in one script call per batch.
//!
//! A hand-off grants only the waiter's liveness window (four refresh
//! periods, 2 s by default) when that is shorter than the TTL; the new
//! holder's watchdog extends it to the TTL halfway through that window, in
//! the background, so the hand-off is not delayed and a holder done within
//! a second never pays for the extension. So a waiter that died
//! unseen (SIGKILL, a stalled host) between its last refresh and the grant
//! holds the next waiter up for at most that window plus one refresh
//! period, not a whole TTL.
//!
//! # Semaphores and read-write locks
//!
//! A group of holders (permits of a semaphore, or readers) keeps the
//! lock's key in the hash form: its kind, and one field per holder with
//! its own holds, fence and lease; the key lives until the latest lease
//! ends, and a holder whose lease ran out is dropped by the next script
//! that counts the group. A mutex or writer meets a group as a lock held
//! by someone else, and waits in the same FIFO queue as everyone: a
//! release serves the head of the queue, whatever it asks for, and a
//! group then takes every waiter behind it that joins it (several readers
//! at once, or permits while there is room), up to the first that does
//! not. So a waiting writer keeps later readers out, and nobody barges
//! past the queue. Each holder gets its own fence, above the group's last.
//! A permit on a free name with nobody queued is the lock's string form
//! with the semaphore's N after the fence, so an uncontended permit costs
//! what the lock does; the next claim on the name, or a waiting mutex,
//! makes it a group.
//! A downgrade turns the writer's hold into a reader's beside the new read
//! hold. Another N, or a read claim on a semaphore, is `InvalidOptions`;
//! a semaphore of 1 is the mutex. On Redlock the generic quorum counts
//! permits over the nodes, and a writer that readers refuse leaves a
//! short mark on each node, which keeps new readers out while it waits.
//!
//! # Leader election
//!
//! Both backends keep a value with a lock, so `Locker::election` works on
//! them. The value lives in the lock's own key: a field `~v` of the hash
//! form (raw bytes, up to 1024), written in the same script as the grant,
//! including a hand-off, for which a queued waiter's entry carries its
//! value. A holder with a value is therefore always in the hash form; a
//! plain lock keeps the string form and the scripts and arguments it had.
//! `proclaim` is one owner-checked script, and the value goes with the key
//! on release and at expiry. Under Redlock the value is set on every node
//! and reported where a quorum of the holder's nodes agree on it.
//!
//! # Redis under Sentinel
//!
//! `redis+sentinel://[user:password@]s1:26379,s2,s3/<master>[/<db>]`: the
//! user and password are the data nodes'; sentinels that require a
//! password of their own take it as `?sentinel_password=…` (with
//! `sentinel_username=…` for an ACL user), sent to them only.
//! The sentinels are all asked, and the answer with the highest config
//! epoch names the primary; `ROLE` on the connection that then carries the
//! scripts must say `master`, so a demoted node is never written to. The
//! backend listens on every sentinel for `+promoted-slave` (sent by the
//! sentinel leading a failover the moment the replica is a primary) and
//! `+switch-master`, and moves to the new primary at once: the old one
//! keeps taking writes until the sentinels get round to demoting it,
//! seconds later, and a client left on it would hold locks the new primary
//! never sees. `READONLY`, a dropped connection or a timeout also make it
//! ask again (its connection to a primary does not reconnect by itself,
//! so it is never back on a node without a fresh `ROLE`). A write a
//! demoted primary refused (`READONLY`) is sent once more to the new one,
//! and so is a request that may run twice to the same effect (a renewal,
//! a read) whose connection broke; an acquire or a release whose reply
//! was lost is not (it may have run), and is the caller's to undo, as on
//! one server. Waiters move with
//! it: the grant channel is subscribed again there, and a grant published
//! while it moved is found by the waiter's next refresh.
//!
//! # Redis Cluster
//!
//! `redis+cluster://[user:password@]h1:7000,h2:7001,…` (Redis 7.0 or
//! later, for sharded pub/sub): any nodes; the
//! driver finds the rest and routes each script to the primary of its
//! keys' slot, following `MOVED` and `ASK` (a resharding, a failover) with
//! a few short retries rather than the driver's default of sixteen from
//! 1.28 s. A lock's keys carry the tag `{=<name>}`, so all of them (lock,
//! queue, waiters, its change channel) share one slot whatever the name;
//! a prefix holding `{` or `}` is refused. The watchdog's renewal batch is
//! split by slot, a script per slot, all at once. Grants and changes go
//! by sharded pub/sub (`SPUBLISH` in the script, to `<lock key>:grants`
//! and `<lock key>:changes`, in the lock's slot), so a message reaches the
//! shard that serves the lock, not every node; a waiter subscribes
//! (`SSUBSCRIBE`) to its lock's grant channel before it queues, on a
//! connection of the backend's own, and grants to other waiters of that
//! lock are ignored by their ticket. A failover or a slot's move drops the
//! shard's subscribers; the channel is subscribed again by the waiter's
//! next refresh, which also finds a grant sent meanwhile. Locks across
//! slots: the core's ordered `lock_all`.
//!
//! # TLS under Sentinel and on a Cluster
//!
//! `rediss+sentinel://…` and `rediss+cluster://…` take the forms above
//! with TLS on every connection: to the sentinels and the data nodes they
//! name, or to every node of the Cluster, with one set of files
//! (`tls_ca`, `tls_cert`, `tls_key`) for all of them; never a plain-text
//! one. An untrusted certificate, or one the server refused, is `Config`.
//! The servers must serve TLS where they are announced: the sentinels
//! name the data nodes' addresses (`tls-replication yes` makes the
//! replicas announce their TLS ports), and a Cluster's nodes announce
//! their TLS ports in `CLUSTER SLOTS` and in `MOVED` and `ASK` only with
//! `tls-cluster yes` (best with `port 0`, so that no plain port is
//! announced). Each certificate must name the address it is reached at.
//!
//! # Replicas and failover
//!
//! Replication is asynchronous: a primary that fails before passing a
//! grant on takes it with it, and the promoted replica lets someone else
//! take the lock. The holder hears of it at its next renewal on the new
//! primary (its lost signal, `NotHeld`), and the new grant's fence is
//! higher (above), so a resource that checks fences refuses the old
//! holder; one that does not may see both.
//!
//! `?replicas=N&replicas_timeout=500ms` (any Redis URL but Redlock's)
//! sends `WAIT N timeout` in one pipeline with each grant, renewal and
//! release, on the same connection (`WAIT` counts that connection's
//! writes only). A grant fewer than N replicas acknowledged is undone and
//! reported `Unavailable`; such a renewal fails (the watchdog tries again,
//! and the lock is lost at its deadline if the replicas never catch up);
//! a release stands, and the waiter it handed the lock to must get its
//! own renewal acknowledged. What this promises: a failover to one of the
//! N replicas that acknowledged keeps every grant and renewal. What it
//! does not: `WAIT` is not consensus. The sentinels (or the Cluster) may
//! promote a replica that had not acknowledged yet, a write is in memory
//! and not on disk, and a write counted as short still happened on the
//! primary (so it is undone by hand, as Redisson's `checkLockSyncedSlaves`
//! does). With N = 1 and two replicas, a failover loses a grant only when
//! the one replica that had it is not the one promoted.
//!
//! # Schemes not shipped, and why
//!
//! * **`SETNX` then `EXPIRE`**: two commands, so a client that dies between
//!   them leaves a lock that never expires.
//! * **`SETNX` with an expiry timestamp as the value, `GETSET` to take over
//!   a stale one**: depends on every client's clock agreeing, lets a loser
//!   overwrite the winner's timestamp, and carries no owner, so any client
//!   can delete anyone's lock.
//!
//! Both are superseded by `SET key token NX PX ttl` with a compare-and-delete
//! script, which is what the hash scheme here generalises to re-entrancy.
//!
//! # Redlock
//!
//! [`RedlockBackend`] runs the scripts on N independent masters in parallel
//! with a per-node timeout well below the TTL, and holds the lock when a
//! quorum (N/2+1) granted it within `ttl − elapsed − drift`. Redlock gives
//! **no fencing tokens**: each master keeps its own counter and a grant's
//! quorum differs from the next one's, so no single sequence orders the
//! grants; a token from one node could repeat or go backwards. Use single
//! node Redis, SQL or ZooKeeper where the resource checks fences. Its nodes
//! therefore keep no fencing state at all: a Redlock grant writes the owner
//! token only, and a failed one leaves no key of any kind behind.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod claims;
mod config;
mod conn;
mod error;
mod failover;
mod functions;
mod hub;
#[cfg(feature = "internals")]
pub mod internals;
mod layout;
mod node;
mod redlock;
mod scripts;
mod sentinel;
mod shards;
mod tls;

pub use backend::RedisBackend;
pub use config::RedisConfig;
pub use config::SCHEMES;
pub use lockwright_core::backend::TlsFiles;
pub use redlock::RedlockBackend;

use std::sync::Arc;

use lockwright_core::backend::{Driver, LockBackend, Scheme, ServerUrl};

/// Opens the backend a Redis URL names: [`RedlockBackend`] for
/// `redis+redlock://`, [`RedisBackend`] for the others. No connection is
/// made until the first request.
///
/// # Errors
/// As [`RedisConfig::from_url`].
pub fn open(url: &str) -> lockwright_core::Result<Arc<dyn LockBackend>> {
    Ok(if Scheme::find(SCHEMES, url)?.name == "redis+redlock" {
        Arc::new(RedlockBackend::connect(url)?)
    } else {
        Arc::new(RedisBackend::connect(url)?)
    })
}

/// This crate's declaration for the facade's registry: its schemes, its
/// opener, which URLs must reach their servers directly (TLS checks the
/// server's name; sentinels and a Cluster's nodes name the servers the
/// client goes to next), and the failover a fault run may make.
pub const DRIVER: Driver = Driver::new(SCHEMES, open)
    .with_direct(reaches_servers_directly)
    .with_failover(|url| Box::pin(async move { failover::failover(&url).await }));

/// See [`DRIVER`].
fn reaches_servers_directly(url: &ServerUrl) -> bool {
    matches!(
        url.scheme(),
        "rediss" | "redis+sentinel" | "rediss+sentinel" | "redis+cluster" | "rediss+cluster"
    )
}
