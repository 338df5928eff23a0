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
//!   - **held by a group** (semaphore permits, read holds) is the hash
//!     form too, with `~k` the group's kind and a field per member: see
//!     `claims.rs`. A semaphore's **lone permit** (one
//!     permit, nobody queued) is the string form with the kind after the
//!     fence, `<owner> <s> <µs> p<N>` (`0 0` for an unfenced one), taken
//!     by `SET NX PX` and freed by `DEL` as the lock is; the next claim on
//!     the name, or a waiting mutex, turns it into its group.
//! - **queue**, the waiters in arrival order: a sorted set of tickets, scored
//!   by arrival time;
//! - **waiters**, a hash from ticket to its entry,
//!   `<live-until µs> <ttl ms> <liveness ms> <hub channel> <owner>`, then,
//!   for an owner that advertises a value, a space and the value's raw
//!   bytes to the end of the entry (so a hand-off writes it with the grant);
//!   a permit's or reader's entry starts `c <kind> `.
//!
//! A lock that carries a value also has a pub/sub **channel**, the lock's
//! key name and `:changes`, on which the scripts announce each grant,
//! release, hand-off and proclaim of it (`granted`, `released`,
//! `proclaimed`) for election observers. A channel keeps nothing.
//!
//! Everything of a lock goes with its key, on release or at expiry, and
//! the queue's keys expire once nobody refreshes them: nothing is kept per
//! name once the lock is free.

use lockwright_core::LockKey;

/// The Redis keys of one lock, in the order the scripts take them. The lock
/// name sits inside `{…}`, so the lock and its wait queue share a hash tag
/// and stay in one cluster slot. The mapping is injective: fixed prefix and
/// suffixes around the name itself. Every one of them expires: the lock
/// with its lease, the queue when nobody waits.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    all: [String; 3],
}

/// `<prefix>{<key>}<suffix>` (`{=` opening the tag on a cluster).
fn joined(prefix: &str, key: &LockKey, cluster: bool, suffix: &str) -> String {
    let (open, key) = (open(cluster), key.as_str());
    let mut s = String::with_capacity(prefix.len() + open.len() + key.len() + 1 + suffix.len());
    s.push_str(prefix);
    s.push_str(open);
    s.push_str(key);
    s.push('}');
    s.push_str(suffix);
    s
}

impl Keys {
    /// The keys of `key` under `prefix`; on a `cluster`, the name's tag
    /// opens with `{=`, so that it is never empty (a name starting with
    /// `}` would make `{}`, which Redis does not take as a tag, and
    /// scatter the lock's keys over slots).
    pub(crate) fn new(prefix: &str, key: &LockKey, cluster: bool) -> Self {
        // Built by hand, not with `format!`: on every acquire and release,
        // formatting cost a client more than a tenth of its work
        // (callgrind, `lockwright-bench redis`).
        let named = |suffix: &str| joined(prefix, key, cluster, suffix);
        Keys {
            all: [named(":lock"), named(":queue"), named(":waiters")],
        }
    }

    /// Lock, queue and waiters, in the order the scripts take them.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub(crate) fn names(&self) -> &[String; 3] {
        &self.all
    }

    /// The lock's own key, all a renewal touches.
    pub(crate) fn lock(prefix: &str, key: &LockKey, cluster: bool) -> String {
        joined(prefix, key, cluster, ":lock")
    }

    /// The channel on which the scripts announce the changes of a lock
    /// that carries a value: the lock's key and `:changes`, as the scripts
    /// name it (`KEYS[1] .. ':changes'`).
    pub(crate) fn changes(&self) -> String {
        format!("{}:changes", self.all[0])
    }

    /// The channel on which, on a Cluster, the scripts publish the grants
    /// of this lock to its waiters (sharded pub/sub: see `shards.rs`).
    pub(crate) fn grants(&self) -> String {
        format!("{}:grants", self.all[0])
    }

    /// A call of `script` on all three keys.
    pub(crate) fn call<'a>(&self, script: &'a redis::Script) -> redis::ScriptInvocation<'a> {
        let mut call = script.prepare_invoke();
        for k in &self.all {
            call.key(k);
        }
        call
    }
}

/// The glob `SCAN` matches the lock keys of every name starting with
/// `name_prefix` by: the fixed parts around the name, the name's prefix
/// with the glob's own characters escaped, then anything.
pub(crate) fn locks_matching(prefix: &str, name_prefix: &str, cluster: bool) -> String {
    let mut glob = String::new();
    for c in prefix
        .chars()
        .chain(open(cluster).chars())
        .chain(name_prefix.chars())
    {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^') {
            glob.push('\\');
        }
        glob.push(c);
    }
    glob.push_str("*}:lock");
    glob
}

/// The name whose lock key `lock` is (see [`Keys::lock`]), if it is one:
/// the text between the fixed parts, which the mapping puts around the
/// name alone.
pub(crate) fn name_of_lock(prefix: &str, lock: &str, cluster: bool) -> Option<LockKey> {
    let name = lock
        .strip_prefix(prefix)?
        .strip_prefix(open(cluster))?
        .strip_suffix("}:lock")?;
    LockKey::new(name).ok()
}

/// What opens a name's hash tag (see [`Keys::new`]).
fn open(cluster: bool) -> &'static str {
    if cluster {
        "{="
    } else {
        "{"
    }
}

/// Reads a lock without changing it. KEYS: lock, queue, waiters. Answers
/// `{holds, fence or -1, pttl ms, queued, owner, value or false, kind,
/// members}`; a free lock has 0 holds and an empty owner. (`false`, since a
/// nil would end the reply early.) A group (see `claims.rs`) has its kind (-1
/// readers, N permits; 0 for a mutex) and its live members, each `{owner,
/// holds, fence, ms left, 1 for a downgraded writer's exclusive hold}`.
pub(crate) const INSPECT: &str = r"
local queued = redis.call('zcard', KEYS[2])
local t = redis.call('type', KEYS[1]).ok
if t == 'none' then
  return {0, -1, -2, queued, '', false, 0, {}}
end
local pttl = redis.call('pttl', KEYS[1])
if t == 'string' then
  local v = redis.call('get', KEYS[1])
  local lone, ls, lus, n = string.match(v, '^(%S+) (%d+) (%d+) p(%d+)$')
  if lone then
    local f = ls * 1000000 + lus
    return {0, f > 0 and f or -1, pttl, queued, '', false, tonumber(n), {{lone, 1, f, pttl, 0}}}
  end
  local owner, s, us = string.match(v, '^(%S+) (%d+) (%d+)$')
  local fence = -1
  if owner then
    fence = s * 1000000 + us
  else
    owner = v
  end
  return {1, fence, pttl, queued, owner, false, 0, {}}
end
local holds, fence, owner, value, kind, members = 0, -1, '', false, 0, {}
local h = redis.call('hgetall', KEYS[1])
local tm = redis.call('time')
local now = tm[1] * 1000 + math.floor(tm[2] / 1000)
for i = 1, #h, 2 do
  if h[i] == '~f' then
    fence = tonumber(h[i + 1])
  elseif h[i] == '~v' then
    value = h[i + 1]
  elseif h[i] == '~k' then
    if h[i + 1] == 's' then
      kind = -1
    elseif h[i + 1] ~= 'm' then
      kind = tonumber(string.sub(h[i + 1], 2))
    end
  elseif string.sub(h[i], 1, 1) ~= '~' then
    local mh, mf, me, mt = string.match(h[i + 1], '^(%d+) (%d+) (%d+) (%S+)$')
    if mh then
      if tonumber(me) > now then
        local alone = 0
        if mt == 'W' then
          alone = 1
        end
        table.insert(members, {h[i], tonumber(mh), tonumber(mf), tonumber(me) - now, alone})
      end
    else
      holds, owner = tonumber(h[i + 1]), h[i]
    end
  end
end
return {holds, fence, pttl, queued, owner, value, kind, members}
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_key_gives_its_name_back_and_the_glob_escapes_the_prefix() {
        for cluster in [false, true] {
            for name in ["jobs/report", "a}:lock", "{x}", "*"] {
                let key = LockKey::new(name).unwrap();
                let lock = Keys::lock("lockwright:", &key, cluster);
                assert_eq!(name_of_lock("lockwright:", &lock, cluster), Some(key));
            }
        }
        assert_eq!(locks_matching("lw:", "a*[b", false), "lw:{a\\*\\[b*}:lock");
        assert_eq!(locks_matching("lw:", "", true), "lw:{=*}:lock");
        assert_eq!(name_of_lock("lw:", "other:{a}:lock", false), None);
    }
}
