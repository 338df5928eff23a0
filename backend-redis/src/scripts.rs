//! The Lua scripts: each operation is one script, so each is atomic in
//! Redis. The keys they take and what those hold are in [`layout`](crate::layout).
//!
//! A script that has to record more than the string form holds (a second
//! hold, a queued waiter) turns it into the hash form first, keeping its
//! expiry.
//!
//! The fencing token is the server's clock in µs when the grant was made,
//! or one above the token it follows when the lock is handed over within a
//! script. Grants of one key are separate commands, each taking more than a
//! microsecond, so tokens strictly increase across release, expiry and a
//! restart that lost the data, as long as the server's clock does not step
//! back (see the crate docs). Redlock asks for no token, and its scripts
//! then write none: each script comes in a fenced and an unfenced variant.
//!
//! A ticket not refreshed by its waiter within its liveness window is
//! dropped when it reaches the head of the queue. When the lock falls free
//! with waiters queued, the script that freed it takes it for the longest
//! live waiter at once and publishes `<ticket> <fence> <lease ms>` on that
//! waiter's hub channel: the waiter holds the lock as the message arrives,
//! with no round trip of its own, and no newcomer can barge in between. The
//! hand-off lease is the shorter of the TTL and the waiter's liveness
//! window, so a waiter that died unseen since its last refresh holds the
//! next one up for that window, not a whole TTL; the new holder extends it
//! to the TTL halfway through it. The lock hash then also records the
//! ticket it was handed to (`~grant`), so a waiter whose message was lost
//! finds its grant on its next refresh, and one that gave up can hand it
//! on; the record goes with the lock.
//!
//! A lock that carries a value (an election's) is announced on its
//! channel (see [`layout`](crate::layout)) by the script that grants it
//! (a hand-off included), frees it or proclaims on it, in the same atomic
//! step, so an observer woken by the message reads the change. A plain
//! lock is never announced: the one thing it pays is one more field in
//! the `HMGET` of a release in the hash form.
//!
//! The common case is cheap, because Redis charges for every call a script
//! makes and every key and argument it is given (measured with callgrind on
//! the server): a free key with nobody queued is taken with one `EXISTS`,
//! `TIME` and `SET`, answered with the bare fence, and released with one
//! `TYPE`, `GET` and `DEL`. A queue flag that outlived its queue only costs
//! that release one `EXISTS`. (`TYPE` rather than a `GET` that may fail on
//! the hash form: a failed call counts as an error in the server's
//! statistics, which users watch.)

use std::sync::{Arc, Mutex, OnceLock};

use lockwright_core::backend::lock_unpoisoned;
use redis::Script;

use crate::claims;
use crate::functions::{COMMON, COMMON_TAIL};

/// The common case of [`ACQUIRE`], run before [`COMMON`] defines its
/// functions: Redis runs the whole script body on every call, and making
/// those closures cost more than the rest of an uncontended pair (measured).
/// Nobody queued and the key free: `SET NX` takes it in the string form.
/// The `TIME` call is wasted when the key is held, which only the contended
/// path pays. (`value` is declared for [`ACQUIRE`]'s sake, and stays nil.)
const ACQUIRE_FAST: &str = r"
local owner, ttl, ticket, value = ARGV[1], ARGV[2], ARGV[3]
if redis.call('exists', KEYS[2]) == 0 then
  if fenced then
    local t = redis.call('time')
    local s = t[1] + shift
    if redis.call('set', KEYS[1], owner .. ' ' .. s .. ' ' .. t[2], 'NX', 'PX', ttl) then
      return s * 1000000 + t[2]
    end
  elseif redis.call('set', KEYS[1], owner, 'NX', 'PX', ttl) then
    return 0
  end
end
";

/// What [`ACQUIRE_FAST`] sets, for an owner that advertises a value: the
/// value is the last argument, after the waiter's if any. The string form
/// has no room for it, so every grant takes the hash form in [`ACQUIRE`];
/// a separate script keeps the plain path's arguments and calls as they are.
const ACQUIRE_VALUED_FAST: &str = r"
local owner, ttl, ticket, value = ARGV[1], ARGV[2], nil, ARGV[#ARGV]
if #ARGV > 3 then
  ticket = ARGV[3]
end
";

/// KEYS: lock, queue, waiters.
/// ARGV: owner, ttl ms; and for a waiter: ticket, liveness ms, hub channel;
/// then, in the valued variant only, the owner's value.
/// Returns the bare fence (0 when unfenced) for a first hold taken by
/// [`ACQUIRE_FAST`], {1, fence, holds} for any other grant, {0, pttl} when
/// held by another (a waiter is then queued, or its place refreshed).
/// A first grant writes the value (`~v`); a re-entry leaves it alone.
/// Follows [`ACQUIRE_FAST`] or [`ACQUIRE_VALUED_FAST`], whose locals it uses.
const ACQUIRE: &str = r"
local form = redis.call('type', KEYS[1])['ok']
local after = nil
if form == 'hash' then
  -- A group with no live member left (or only a writer's mark, which a
  -- mutex passes): free, its fences still to rise above (see `group`).
  local gone, f = settle(false)
  if gone then
    form, after = 'none', f
  end
end
if form == 'string' then
  -- Held in the string form. Someone else's, and we would not queue:
  -- nothing to record (but a lone permit's N, see `group`). Ours
  -- (re-entry), or a waiter to flag: the hash form.
  local holder, _, k = parse(redis.call('get', KEYS[1]))
  if not ticket and holder ~= owner then
    return {0, redis.call('pttl', KEYS[1]), kind_num(k)}
  end
  to_hash()
  form = 'hash'
end
if form == 'none' then
  local served = hand_off(ticket, after)
  if served == nil or served == 'me' then
    local queued = redis.call('exists', KEYS[2]) == 1
    return {1, take(owner, ttl, after, queued, value), 1}
  end
elseif redis.call('hexists', KEYS[1], owner) == 1 then
  local group = redis.call('hget', KEYS[1], '~k')
  if group then
    -- A live member (`settle` dropped lapsed ones) asking to hold it alone.
    return {3, kind_num(group)}
  end
  if ticket and redis.call('hget', KEYS[1], '~grant') == ticket then
    -- Handed to us while our notice was lost or still on its way; the
    -- short hand-off lease becomes the full one.
    redis.call('hdel', KEYS[1], '~grant')
    redis.call('pexpire', KEYS[1], ttl)
    return {1, fence_of(), tonumber(redis.call('hget', KEYS[1], owner))}
  end
  local holds = redis.call('hincrby', KEYS[1], owner, 1)
  redis.call('pexpire', KEYS[1], ttl)
  if ticket then
    redis.call('zrem', KEYS[2], ticket)
    redis.call('hdel', KEYS[3], ticket)
  end
  return {1, fence_of(), holds}
end
if ticket then
  local life, hub = tonumber(ARGV[4]), ARGV[5]
  local now = now_us()
  redis.call('zadd', KEYS[2], 'NX', now, ticket)
  local entry = string.format('%.0f %s %d %s %s', now + life * 1000, ttl, life, hub, owner)
  if value then
    -- Concatenated, not formatted: `%s` would stop at a NUL.
    entry = entry .. ' ' .. value
  end
  redis.call('hset', KEYS[3], ticket, entry)
  -- The holder's release looks for waiters only when this flag is set.
  redis.call('hset', KEYS[1], '~q', 1)
  -- The queue's keys live while anyone waits, and go after.
  if redis.call('pttl', KEYS[2]) < life then
    redis.call('pexpire', KEYS[2], life)
    redis.call('pexpire', KEYS[3], life)
  end
end
-- Held in the hash form here: the group's kind, if a group holds it. A
-- writer readers refuse, with no place in the queue, marks the group.
local group = redis.call('hget', KEYS[1], '~k')
if group == 's' and not ticket then
  redis.call('hset', KEYS[1], '~w' .. owner, now_ms() + math.min(tonumber(ttl), mark_life))
end
return {0, redis.call('pttl', KEYS[1]), kind_num(group)}
";

/// KEYS: lock, queue, waiters. ARGV: owner.
/// Returns -1 when not held by this owner, else the holds left (0: freed,
/// and handed to the longest live waiter if any). The common cases come
/// before [`COMMON`], as in [`ACQUIRE_FAST`]: the string form (a lone
/// permit's too: nobody queues on it without making it a hash), then a
/// hash with more than one hold or no queue flag.
const RELEASE_FAST: &str = r"
local owner = ARGV[1]
local form = redis.call('type', KEYS[1])['ok']
if form == 'string' then
  local v = redis.call('get', KEYS[1])
  if string.sub(v, 1, #owner) == owner and (#v == #owner or string.byte(v, #owner + 1) == 32) then
    redis.call('del', KEYS[1])
    return 0
  end
  return -1
elseif form ~= 'hash' then
  return -1
end
local v = redis.call('hmget', KEYS[1], owner, '~q', '~f', '~v')
if not v[1] then
  return -1
end
-- No count: a member of a group (see `group`), left to `RELEASE` unless
-- it is the only one, at its last hold, with nothing else in the hash
-- (its kind and fence aside) and nobody queued.
local holds = tonumber(v[1])
if holds and holds > 1 then
  return redis.call('hincrby', KEYS[1], owner, -1)
end
if holds and not v[2] then
  redis.call('del', KEYS[1])
  if v[4] then
    redis.call(sharded and 'spublish' or 'publish', KEYS[1] .. ':changes', 'released')
  end
  return 0
end
if not holds then
  local e = string.match(v[1], '^1 %d+ (%d+) %S+$')
  if e and redis.call('hlen', KEYS[1]) == (v[3] and 3 or 2) then
    local t = redis.call('time')
    if tonumber(e) > t[1] * 1000 + math.floor(t[2] / 1000)
        and redis.call('exists', KEYS[2]) == 0 then
      redis.call('del', KEYS[1])
      return 0
    end
  end
end
";

/// The rest of [`RELEASE_FAST`]: the lock says someone may be queued, or
/// the owner is a member of a group.
const RELEASE: &str = r"
if not holds then
  return leave(owner, v[1])
end
return drop_hold(owner, holds, v[2], tonumber(v[3]), v[4])
";

/// KEYS: lock, queue, waiters. ARGV: owner, ticket.
/// A waiter gives up: leaves the queue, and drops the hold it was handed if
/// the hand-off already happened (a hand-off always leaves the hash form).
/// Returns 1 if it dropped such a hold.
const ABANDON: &str = r"
redis.call('zrem', KEYS[2], ARGV[2])
redis.call('hdel', KEYS[3], ARGV[2])
if redis.call('type', KEYS[1])['ok'] ~= 'hash' then
  return 0
end
redis.call('hdel', KEYS[1], '~w' .. ARGV[1])
local v = redis.call('hmget', KEYS[1], ARGV[1], '~grant', '~f', '~v')
local holds = tonumber(v[1])
if holds and v[2] == ARGV[2] then
  redis.call('hdel', KEYS[1], '~grant')
  drop_hold(ARGV[1], holds, true, tonumber(v[3]), v[4])
  return 1
end
-- A group member handed on this ticket.
local _, _, _, t = member(v[1])
if t == ARGV[2] then
  leave(ARGV[1], v[1])
  return 1
end
-- The waiters behind this one (or behind this writer's mark) may join now.
local k = redis.call('hget', KEYS[1], '~k')
if k and k ~= 'm' and redis.call('exists', KEYS[2]) == 1 then
  local now = now_ms()
  local n, _, marked = members(now)
  serve(k, n, now, nil, nil, marked)
end
return 0
";

/// KEYS: lock, queue, waiters. ARGV: owner, value.
/// Sets the value `owner` advertises if it holds the lock (a live key is a
/// live lease): 1, else 0 and nothing written. A string-form hold becomes
/// the hash form, which has room for the value.
const PROCLAIM: &str = r"
local owner = ARGV[1]
local form = redis.call('type', KEYS[1])['ok']
if form == 'string' then
  local holder, _, k = parse(redis.call('get', KEYS[1]))
  if holder ~= owner or k then
    return 0
  end
  to_hash()
elseif form ~= 'hash' or redis.call('hexists', KEYS[1], owner) == 0 then
  return 0
end
redis.call('hset', KEYS[1], '~v', ARGV[2])
announce('proclaimed')
return 1
";

/// KEYS: lock keys. ARGV: owner and ttl ms for each key, in turn.
/// Returns one 1 (renewed) or 0 (not held) per key: the watchdog's batch.
const RENEW: &str = r"
local out = {}
for i, key in ipairs(KEYS) do
  local owner = ARGV[2 * i - 1]
  local form = redis.call('type', key)['ok']
  local mine = false
  if form == 'string' then
    local v = redis.call('get', key)
    mine = string.sub(v, 1, #owner) == owner and (#v == #owner or string.byte(v, #owner + 1) == 32)
  elseif form == 'hash' then
    local v = redis.call('hget', key, owner)
    mine = tonumber(v) ~= nil
    -- A group member (see `group`): its own lease, and the key's to the latest.
    local h, f, e, t = string.match(v or '', '^(%d+) (%d+) (%d+) (%S+)$')
    local ttl = tonumber(ARGV[2 * i])
    if h then
      local tm = redis.call('time')
      local now = tm[1] * 1000 + math.floor(tm[2] / 1000)
      if tonumber(e) > now then
        redis.call('hset', key, owner, h .. ' ' .. f .. ' ' .. string.format('%.0f', now + ttl) .. ' ' .. t)
        if redis.call('pttl', key) < ttl then
          redis.call('pexpire', key, ttl)
        end
        form = 'member'
      end
    end
  end
  if form == 'member' then
    out[i] = 1
  elseif mine then
    redis.call('pexpire', key, ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
";

/// One script in its two variants, fenced and unfenced, each made once;
/// and, for a Sentinel primary whose config epoch shifts the tokens' clock
/// (see [`sentinel`](crate::sentinel)), its shifted variants, made when a
/// new shift is first asked for.
struct Variants {
    fast: &'static str,
    body: &'static str,
    common: bool,
    cells: [OnceLock<Script>; 2],
    /// The shifted variants last made: a failover's new epoch replaces
    /// them, so a long-lived process keeps a few, not one per epoch.
    shifted: Mutex<Vec<(bool, Shift, Arc<Script>)>>,
}

/// How far a script shifts the clock its fencing tokens are made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shift {
    /// Seconds the client knows: 0 on one server, the config epoch's hours
    /// under Sentinel (see [`sentinel`](crate::sentinel)).
    Const(i64),
    /// On a Cluster the script reads its own node's config epoch (`CLUSTER
    /// INFO`, `cluster_my_epoch`), which a failover or a slot's move (by
    /// `IMPORTING`) makes
    /// the greatest, and shifts by its hours; plus these seconds (a test's
    /// skew).
    Cluster(i64),
}

/// A script to run: one of the unshifted variants, or a shifted one.
pub(crate) enum Scripted {
    Plain(&'static Script),
    Shifted(Arc<Script>),
}

impl std::ops::Deref for Scripted {
    type Target = Script;
    fn deref(&self) -> &Script {
        match self {
            Scripted::Plain(s) => s,
            Scripted::Shifted(s) => s,
        }
    }
}

impl Variants {
    const fn new(fast: &'static str, body: &'static str, common: bool) -> Self {
        Variants {
            fast,
            body,
            common,
            cells: [OnceLock::new(), OnceLock::new()],
            shifted: Mutex::new(Vec::new()),
        }
    }

    /// `fenced` and the clock's `shift` (seconds) as constants, `fast`,
    /// then the shared functions, then `body`. Constants rather than
    /// arguments: every argument costs the server on every call.
    fn make(&self, fenced: bool, shift: Shift) -> Script {
        let common = if self.common {
            [COMMON, claims::GROUP, COMMON_TAIL, claims::GROUP_TAIL].concat()
        } else {
            String::new()
        };
        let mark_life = lockwright_core::backend::MARK_LIFE.as_millis();
        let sharded = matches!(shift, Shift::Cluster(_));
        let shift = match shift {
            Shift::Const(secs) => secs.to_string(),
            Shift::Cluster(secs) => format!(
                "tonumber(string.match(redis.call('cluster', 'info'), \
                 'cluster_my_epoch:(%d+)')) * {} + {secs}",
                crate::sentinel::EPOCH_SHIFT_SECS
            ),
        };
        Script::new(&format!(
            "local fenced, mark_life, sharded = {fenced}, {mark_life}, {sharded}\n\
             local shift = {shift}\n{}{common}{}",
            self.fast, self.body
        ))
    }

    fn get(&'static self, fenced: bool) -> &'static Script {
        self.cells[usize::from(fenced)].get_or_init(|| self.make(fenced, Shift::Const(0)))
    }

    fn at(&'static self, fenced: bool, shift: Shift) -> Scripted {
        if shift == Shift::Const(0) || !fenced {
            return Scripted::Plain(self.get(fenced));
        }
        let mut shifted = lock_unpoisoned(&self.shifted);
        if let Some((_, _, s)) = shifted.iter().find(|(f, n, _)| *f == fenced && *n == shift) {
            return Scripted::Shifted(s.clone());
        }
        let script = Arc::new(self.make(fenced, shift));
        if shifted.len() >= 4 {
            shifted.remove(0);
        }
        shifted.push((fenced, shift, script.clone()));
        Scripted::Shifted(script)
    }
}

static ACQUIRE_SCRIPT: Variants = Variants::new(ACQUIRE_FAST, ACQUIRE, true);
static ACQUIRE_VALUED_SCRIPT: Variants = Variants::new(ACQUIRE_VALUED_FAST, ACQUIRE, true);
static PROCLAIM_SCRIPT: Variants = Variants::new("", PROCLAIM, true);
static RELEASE_SCRIPT: Variants = Variants::new(RELEASE_FAST, RELEASE, true);
static CLAIM_ACQUIRE_SCRIPT: Variants =
    Variants::new(claims::CLAIM_ACQUIRE_FAST, claims::CLAIM_ACQUIRE, true);
static ABANDON_SCRIPT: Variants = Variants::new("", ABANDON, true);
static RENEW_SCRIPT: Variants = Variants::new("", RENEW, false);
static INSPECT_SCRIPT: Variants = Variants::new("", crate::layout::INSPECT, false);

/// The acquire script (KEYS: lock, queue, waiters; ARGV: owner, ttl ms),
/// unshifted.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub(crate) fn acquire(fenced: bool) -> &'static Script {
    ACQUIRE_SCRIPT.get(fenced)
}

/// The release script (KEYS as acquire; ARGV: owner), unshifted.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub(crate) fn release(fenced: bool) -> &'static Script {
    RELEASE_SCRIPT.get(fenced)
}

/// The acquire script, its tokens' clock shifted by `shift` seconds.
pub(crate) fn acquire_at(fenced: bool, shift: Shift) -> Scripted {
    ACQUIRE_SCRIPT.at(fenced, shift)
}

/// The acquire script for an owner that advertises a value (ARGV as
/// acquire, then the value).
pub(crate) fn acquire_valued_at(fenced: bool, shift: Shift) -> Scripted {
    ACQUIRE_VALUED_SCRIPT.at(fenced, shift)
}

/// The acquire script of a permit or a read hold (see [`claims::CLAIM_ACQUIRE`]).
pub(crate) fn claim_acquire_at(fenced: bool, shift: Shift) -> Scripted {
    CLAIM_ACQUIRE_SCRIPT.at(fenced, shift)
}

/// The release script, which may hand the lock on and so make a token.
pub(crate) fn release_at(fenced: bool, shift: Shift) -> Scripted {
    RELEASE_SCRIPT.at(fenced, shift)
}

pub(crate) fn abandon_at(fenced: bool, shift: Shift) -> Scripted {
    ABANDON_SCRIPT.at(fenced, shift)
}

/// The proclaim script (KEYS as acquire; ARGV: owner, value). It writes
/// no fence, so one variant serves both roles; but a Cluster's announces
/// on sharded pub/sub.
pub(crate) fn proclaim_at(shift: Shift) -> Scripted {
    match shift {
        Shift::Cluster(_) => PROCLAIM_SCRIPT.at(true, shift),
        Shift::Const(_) => Scripted::Plain(PROCLAIM_SCRIPT.get(false)),
    }
}

pub(crate) fn renew() -> &'static Script {
    RENEW_SCRIPT.get(false)
}

pub(crate) fn inspect() -> &'static Script {
    INSPECT_SCRIPT.get(false)
}
