//! The Lua scripts: each operation is one script, so each is atomic in Redis.
//!
//! A lock is a hash at `KEYS[1]` whose one field is the owner token and whose
//! value is the hold count (the re-entrant scheme of the design notes), with
//! a millisecond expiry. Its fencing counter is a plain integer key beside
//! it, never expired, so tokens keep rising across release and expiry, and
//! seeded from the server clock so they keep rising across a restart too.
//!
//! Waiters queue in arrival order: a sorted set of tickets (`queue`, scored
//! by arrival time) and a hash `waiters` from ticket to its entry,
//! `<live-until µs> <ttl ms> <liveness ms> <hub channel> <owner>`. A ticket
//! not refreshed by its waiter within its liveness window is dropped when it
//! reaches the head. When the lock falls free with waiters queued, the
//! script that freed it takes it for the longest live waiter at once and
//! publishes `<ticket> <fence> <lease ms>` on that waiter's hub channel: the
//! waiter holds the lock as the message arrives, with no round trip of its
//! own, and no newcomer can barge in between. The hand-off lease is the
//! shorter of the TTL and the waiter's liveness window, so a waiter that died
//! unseen since its last refresh holds the next one up for that window, not
//! a whole TTL; the new holder extends it to the TTL halfway through it.
//! The lock hash then also records the ticket it was handed to (field
//! `~grant`, which no owner token can be), so a waiter whose message was
//! lost finds its grant on its next refresh, and one that gave up can hand
//! it on; the record goes with the lock.

use std::sync::OnceLock;

use redis::Script;

/// Shared by the scripts that can free or take a lock. KEYS: lock, fence
/// counter, queue, waiters.
const COMMON: &str = r"
local function now_us()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The fence counter counts grants. A counter that is new, or was lost with
-- a restart that kept no data, starts from the server time in µs: above any
-- token handed out before, as long as the server's clock does not jump back
-- (grants are far rarer than one per µs, so the count never outruns it).
local function next_fence()
  local fence = redis.call('incr', KEYS[2])
  if fence == 1 then
    fence = now_us()
    redis.call('set', KEYS[2], string.format('%.0f', fence))
  end
  return fence
end

local function take(owner, ttl)
  local fence = next_fence()
  redis.call('hset', KEYS[1], owner, 1)
  redis.call('pexpire', KEYS[1], ttl)
  return fence
end

-- The lock is free: take it for the longest live waiter, unless that is
-- `me`. Returns 'me', the ticket served, or nil when no live waiter is left.
local function hand_off(me)
  local now = nil
  while true do
    local head = redis.call('zpopmin', KEYS[3])[1]
    if not head then
      return nil
    end
    if head == me then
      redis.call('hdel', KEYS[4], head)
      return 'me'
    end
    local v = redis.call('hget', KEYS[4], head)
    redis.call('hdel', KEYS[4], head)
    local live, ttl, life, hub, owner
    if v then
      live, ttl, life, hub, owner = string.match(v, '^(%d+) (%d+) (%d+) (%S+) (%S+)$')
    end
    now = now or now_us()
    if live and tonumber(live) > now then
      -- The waiter may have died since its last refresh: it gets only its
      -- liveness window, and extends the lease when the message reaches it.
      local lease = math.min(tonumber(ttl), tonumber(life))
      local fence = take(owner, lease)
      redis.call('hset', KEYS[1], '~grant', head)
      redis.call('publish', hub, head .. ' ' .. string.format('%.0f', fence) .. ' ' .. lease)
      return head
    end
  end
end

-- Drops one of the `holds` (read just now) of `owner`; frees and hands off
-- at zero. Returns the holds left.
local function drop_hold(owner, holds)
  if holds > 1 then
    return redis.call('hincrby', KEYS[1], owner, -1)
  end
  redis.call('del', KEYS[1])
  if redis.call('exists', KEYS[3]) == 1 then
    hand_off(nil)
  end
  return 0
end
";

/// KEYS: lock, fence counter, queue, waiters.
/// ARGV: owner, ttl ms; and for a waiter: ticket, liveness ms, hub channel.
/// Returns {1, fence, holds} when granted, {0, pttl} when held by another
/// (a waiter is then queued, or its place refreshed).
const ACQUIRE: &str = r"
local owner, ttl, ticket = ARGV[1], ARGV[2], ARGV[3]
-- One call answers the common case: no lock and nobody queued.
if redis.call('exists', KEYS[1], KEYS[3]) == 0 then
  return {1, take(owner, ttl), 1}
end
if redis.call('exists', KEYS[1]) == 0 then
  local served = hand_off(ticket)
  if served == nil or served == 'me' then
    return {1, take(owner, ttl), 1}
  end
elseif redis.call('hexists', KEYS[1], owner) == 1 then
  if ticket and redis.call('hget', KEYS[1], '~grant') == ticket then
    -- Handed to us while our notice was lost or still on its way; the
    -- short hand-off lease becomes the full one.
    redis.call('hdel', KEYS[1], '~grant')
    redis.call('pexpire', KEYS[1], ttl)
    return {1, tonumber(redis.call('get', KEYS[2])), tonumber(redis.call('hget', KEYS[1], owner))}
  end
  local holds = redis.call('hincrby', KEYS[1], owner, 1)
  redis.call('pexpire', KEYS[1], ttl)
  if ticket then
    redis.call('zrem', KEYS[3], ticket)
    redis.call('hdel', KEYS[4], ticket)
  end
  return {1, tonumber(redis.call('get', KEYS[2])), holds}
end
if ticket then
  local life, hub = tonumber(ARGV[4]), ARGV[5]
  local now = now_us()
  redis.call('zadd', KEYS[3], 'NX', now, ticket)
  redis.call('hset', KEYS[4], ticket, string.format('%.0f %s %d %s %s',
    now + life * 1000, ttl, life, hub, owner))
  -- The queue's keys live while anyone waits, and go after.
  if redis.call('pttl', KEYS[3]) < life then
    redis.call('pexpire', KEYS[3], life)
    redis.call('pexpire', KEYS[4], life)
  end
end
return {0, redis.call('pttl', KEYS[1])}
";

/// KEYS: lock, fence counter, queue, waiters. ARGV: owner.
/// Returns -1 when not held by this owner, else the holds left (0: freed,
/// and handed to the longest live waiter if any).
const RELEASE: &str = r"
local holds = tonumber(redis.call('hget', KEYS[1], ARGV[1]))
if not holds then
  return -1
end
return drop_hold(ARGV[1], holds)
";

/// KEYS: lock, fence counter, queue, waiters. ARGV: owner, ticket.
/// A waiter gives up: leaves the queue, and drops the hold it was handed if
/// the hand-off already happened. Returns 1 if it dropped such a hold.
const ABANDON: &str = r"
redis.call('zrem', KEYS[3], ARGV[2])
redis.call('hdel', KEYS[4], ARGV[2])
local holds = tonumber(redis.call('hget', KEYS[1], ARGV[1]))
if holds and redis.call('hget', KEYS[1], '~grant') == ARGV[2] then
  redis.call('hdel', KEYS[1], '~grant')
  drop_hold(ARGV[1], holds)
  return 1
end
return 0
";

/// KEYS: lock keys. ARGV: owner and ttl ms for each key, in turn.
/// Returns one 1 (renewed) or 0 (not held) per key: the watchdog's batch.
const RENEW: &str = r"
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('hexists', key, ARGV[2 * i - 1]) == 1 then
    redis.call('pexpire', key, ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
";

fn cached(cell: &'static OnceLock<Script>, body: &str, common: bool) -> &'static Script {
    cell.get_or_init(|| {
        if common {
            Script::new(&format!("{COMMON}{body}"))
        } else {
            Script::new(body)
        }
    })
}

/// The acquire script (KEYS: lock, fence, queue, waiters; ARGV: owner, ttl ms).
pub fn acquire() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    cached(&S, ACQUIRE, true)
}

/// The release script (KEYS as acquire; ARGV: owner).
pub fn release() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    cached(&S, RELEASE, true)
}

pub(crate) fn abandon() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    cached(&S, ABANDON, true)
}

pub(crate) fn renew() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    cached(&S, RENEW, false)
}
