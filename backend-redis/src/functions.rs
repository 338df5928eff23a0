//! The Lua functions shared by the scripts that can take or free a lock
//! (see `scripts.rs`, which puts them together): the string form's parsing
//! and its turn into the hash form, the grant, the hand-off to the queue's
//! head, and the drop of a hold. [`claims`](crate::claims)'s functions are
//! defined between the two parts, since each part calls into the other.

/// Shared by the scripts that can free or take a lock, after their fast
/// paths. KEYS: lock, queue, waiters. `fenced` is the variant's constant.
pub(crate) const COMMON: &str = r"
local function now_us()
  local t = redis.call('time')
  return t[1] * 1000000 + t[2]
end

-- A new fencing token: the clock in µs, shifted by the primary's epoch
-- (see `sentinel`).
local function fence_now()
  local t = redis.call('time')
  return (t[1] + shift) * 1000000 + t[2]
end

-- The owner of a lock in the string form, and its fence (nil if unfenced);
-- for a semaphore's lone permit (see `group`), also its kind.
local function parse(v)
  local owner, s, us = string.match(v, '^(%S+) (%d+) (%d+)$')
  if owner then
    return owner, s * 1000000 + us
  end
  local kind
  owner, s, us, kind = string.match(v, '^(%S+) (%d+) (%d+) (p%d+)$')
  if owner then
    local fence = s * 1000000 + us
    if fence == 0 then
      fence = nil
    end
    return owner, fence, kind
  end
  return v, nil
end

-- Turns a string-form lock into its hash form, keeping its expiry: a lone
-- permit becomes its group, with the permit as its one member.
local function to_hash()
  local owner, fence, kind = parse(redis.call('get', KEYS[1]))
  -- Always an expiry: in its last millisecond a key still exists with a
  -- PTTL of 0, and a hash left without one would be held for ever.
  local pttl = math.max(redis.call('pttl', KEYS[1]), 1)
  redis.call('del', KEYS[1])
  if kind then
    local t = redis.call('time')
    local e = t[1] * 1000 + math.floor(t[2] / 1000) + pttl
    redis.call('hset', KEYS[1], '~k', kind, owner, string.format('1 %.0f %.0f -', fence or 0, e))
    if fence then
      redis.call('hset', KEYS[1], '~f', string.format('%.0f', fence))
    end
  elseif fence then
    redis.call('hset', KEYS[1], owner, 1, '~f', fence)
  else
    redis.call('hset', KEYS[1], owner, 1)
  end
  redis.call('pexpire', KEYS[1], pttl)
end

-- Tells a waiter its grant: on its hub's channel, or on a Cluster on the
-- lock's own (sharded: it lives in the lock's slot).
local function tell(hub, msg)
  if sharded then
    redis.call('spublish', KEYS[1] .. ':grants', msg)
  else
    redis.call('publish', hub, msg)
  end
end

-- Tells election observers that the lock, which carries a value, changed.
local function announce(what)
  redis.call(sharded and 'spublish' or 'publish', KEYS[1] .. ':changes', what)
end

-- Takes the free lock for `owner`, in the hash form, with the `value` it
-- advertises, if any (and then announces the grant). `after` is the token
-- of the grant this one follows within the same script (a hand-off), if
-- any. Returns the fence, 0 when none is asked for.
local function take(owner, ttl, after, queued, value)
  local fence = 0
  if fenced then
    fence = fence_now()
    if after and after >= fence then
      fence = after + 1
    end
    redis.call('hset', KEYS[1], owner, 1, '~f', fence)
  else
    redis.call('hset', KEYS[1], owner, 1)
  end
  if queued then
    redis.call('hset', KEYS[1], '~q', 1)
  end
  redis.call('pexpire', KEYS[1], ttl)
  if value then
    redis.call('hset', KEYS[1], '~v', value)
    announce('granted')
  end
  return fence
end

";

/// The rest of [`COMMON`], after the group's functions (see [`claims`](crate::claims)).
pub(crate) const COMMON_TAIL: &str = r"
-- The lock is free: take it for the longest live waiter, unless that is
-- `me`; a claim waiter's group then takes the waiters behind it that join
-- it. Returns 'me', the ticket served, or nil when no live waiter is left.
local function hand_off(me, after)
  local now = nil
  while true do
    local head = redis.call('zpopmin', KEYS[2])[1]
    if not head then
      return nil
    end
    if head == me then
      redis.call('hdel', KEYS[3], head)
      return 'me'
    end
    local v = redis.call('hget', KEYS[3], head)
    redis.call('hdel', KEYS[3], head)
    local live, ttl, life, hub, owner, value
    local kind, clive, cttl, clife, chub, cowner =
      string.match(v or '', '^c (%S+) (%d+) (%d+) (%d+) (%S+) (%S+)$')
    now = now or now_us()
    if kind and tonumber(clive) > now then
      local lease = math.min(tonumber(cttl), tonumber(clife))
      local ms = now_ms()
      local fence = join(cowner, kind, lease, ms, after, head)
      tell(chub, head .. ' ' .. string.format('%.0f', fence) .. ' ' .. lease)
      serve(kind, 1, ms, fence, nil, false)
      return head
    end
    if v and not kind then
      -- The owner's value, if any, is the rest of the entry, raw.
      local _, e
      _, e, live, ttl, life, hub, owner = string.find(v, '^(%d+) (%d+) (%d+) (%S+) (%S+)')
      if e and e < #v then
        value = string.sub(v, e + 2)
      end
    end
    if live and tonumber(live) > now then
      -- The waiter may have died since its last refresh: it gets only its
      -- liveness window, and extends the lease when the message reaches it.
      local lease = math.min(tonumber(ttl), tonumber(life))
      local queued = redis.call('exists', KEYS[2]) == 1
      local fence = take(owner, lease, after, queued, value)
      redis.call('hset', KEYS[1], '~grant', head)
      tell(hub, head .. ' ' .. string.format('%.0f', fence) .. ' ' .. lease)
      return head
    end
  end
end

-- Drops one of the `holds` (read just now) of `owner` on a hash-form lock;
-- frees at zero (announced if the lock carried a value), and hands off if
-- the lock says someone may be queued. Returns the holds left.
local function drop_hold(owner, holds, queued, fence, valued)
  if holds > 1 then
    return redis.call('hincrby', KEYS[1], owner, -1)
  end
  redis.call('del', KEYS[1])
  if valued then
    announce('released')
  end
  if queued and redis.call('exists', KEYS[2]) == 1 then
    hand_off(nil, fence)
  end
  return 0
end

-- The token of the live hold, made now for a hold that lacks one (taken by
-- an older version, whose tokens were never above the clock).
local function fence_of()
  if not fenced then
    return 0
  end
  local fence = tonumber(redis.call('hget', KEYS[1], '~f'))
  if not fence then
    fence = fence_now()
    redis.call('hset', KEYS[1], '~f', fence)
  end
  return fence
end
";
