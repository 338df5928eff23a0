//! The Redis keys of one lock, and what each of them holds.
//!
//! A lock has three keys, in the order the scripts take them:
//!
//! - **lock**, with a millisecond expiry, in one of two forms:
//!   - **one hold, nobody queued** (the common case) is a plain string: the
//!     owner token, then for a fenced lock the server's `TIME` at the grant,
//!     `<owner> <s> <µs>`. One `SET NX PX` takes it and one `DEL` frees it.
//!   - **anything else** is a hash whose one owner field is the owner token
//!     and whose value is the hold count (the re-entrant form). Fields
//!     starting with `~`, which no owner token can, carry the rest: `~f`
//!     the grant's fencing token, `~q` "someone may be queued", `~grant`
//!     the ticket of a hand-off, `~v` the value the holder advertises (an
//!     election's leader value, raw bytes). A lock with a value is always
//!     in this form.
//! - **queue**, the waiters in arrival order: a sorted set of tickets, scored
//!   by arrival time;
//! - **waiters**, a hash from ticket to its entry,
//!   `<live-until µs> <ttl ms> <liveness ms> <hub channel> <owner>`, then,
//!   for an owner that advertises a value, a space and the value's raw
//!   bytes to the end of the entry (so a hand-off writes it with the grant).
//!
//! A lock that carries a value also has a pub/sub **channel**, the lock's
//! key name and `:changes`, on which the scripts announce each grant,
//! release, hand-off and proclaim of it (`granted`, `released`,
//! `proclaimed`) for election observers. A channel keeps nothing.
//!
//! Everything of a lock goes with its key, on release or at expiry, and
//! the queue's keys expire once nobody refreshes them: nothing is kept per
//! name once the lock is free.

use locksmith_core::LockKey;

/// The Redis keys of one lock, in the order the scripts take them. The lock
/// name sits inside `{…}`, so the lock and its wait queue share a hash tag
/// and stay in one cluster slot. The mapping is injective: fixed prefix and
/// suffixes around the name itself. Every one of them expires: the lock
/// with its lease, the queue when nobody waits.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    all: [String; 3],
}

impl Keys {
    pub(crate) fn new(prefix: &str, key: &LockKey) -> Self {
        let base = format!("{prefix}{{{}}}", key.as_str());
        Keys {
            all: [
                Self::lock(prefix, key),
                format!("{base}:queue"),
                format!("{base}:waiters"),
            ],
        }
    }

    /// Lock, queue and waiters, in the order the scripts take them.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub(crate) fn names(&self) -> &[String; 3] {
        &self.all
    }

    /// The lock's own key, all a renewal touches.
    pub(crate) fn lock(prefix: &str, key: &LockKey) -> String {
        format!("{prefix}{{{}}}:lock", key.as_str())
    }

    /// The channel on which the scripts announce the changes of a lock
    /// that carries a value: the lock's key and `:changes`, as the scripts
    /// name it (`KEYS[1] .. ':changes'`).
    pub(crate) fn changes(&self) -> String {
        format!("{}:changes", self.all[0])
    }

    /// A call of `script` on all three keys.
    pub(crate) fn call(&self, script: &'static redis::Script) -> redis::ScriptInvocation<'static> {
        let mut call = script.prepare_invoke();
        for k in &self.all {
            call.key(k);
        }
        call
    }
}
