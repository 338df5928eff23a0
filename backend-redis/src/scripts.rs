//! The Lua scripts: each operation is one script, so each is atomic in Redis.
//!
//! A lock is a hash at `KEYS[1]` whose one field is the owner token and whose
//! value is the hold count (the re-entrant scheme of the design notes), with
//! a millisecond expiry. Its fencing counter is a plain integer key beside
//! it, never expired, so tokens keep rising across release and expiry, and
//! seeded from the server clock so they keep rising across a restart too.

use std::sync::OnceLock;

use redis::Script;

/// KEYS: lock, fence counter. ARGV: owner, ttl ms.
/// Returns {1, fence, holds} when granted, {0, pttl} when held by another.
///
/// The fence is max(counter + 1, server time in µs): strictly increasing,
/// and still increasing after a restart that lost the counter (no
/// persistence), as long as the server's clock does not jump back. Written
/// with %.0f because Lua would print a 16-digit number in exponent form;
/// doubles hold such integers exactly (below 2^53).
const ACQUIRE: &str = r"
if redis.call('exists', KEYS[1]) == 0 then
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local fence = math.max(tonumber(redis.call('get', KEYS[2]) or '0') + 1, now)
  redis.call('set', KEYS[2], string.format('%.0f', fence))
  redis.call('hset', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, fence, 1}
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  local holds = redis.call('hincrby', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('get', KEYS[2]) or '0'), holds}
end
return {0, redis.call('pttl', KEYS[1])}
";

/// KEYS: lock, release channel. ARGV: owner.
/// Returns -1 when not held by this owner, else the holds left (0: freed,
/// and the release is published so waiters try at once).
const RELEASE: &str = r"
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return -1
end
local holds = redis.call('hincrby', KEYS[1], ARGV[1], -1)
if holds > 0 then
  return holds
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], '0')
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

fn cached(cell: &'static OnceLock<Script>, src: &str) -> &'static Script {
    cell.get_or_init(|| Script::new(src))
}

pub(crate) fn acquire() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    cached(&S, ACQUIRE)
}

pub(crate) fn release() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    cached(&S, RELEASE)
}

pub(crate) fn renew() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    cached(&S, RENEW)
}
