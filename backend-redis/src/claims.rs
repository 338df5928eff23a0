//! Semaphore permits and read holds (every claim but the mutex's): the
//! Lua they add to the scripts, and what their replies mean.
//!
//! A group of holders keeps the lock's key in the hash form, as a mutex
//! with waiters does, with `~k` its kind (`p<N>`: N permits; `s`: readers)
//! and one field per member, `<holds> <fence> <lease end, ms> <ticket>`
//! (the ticket it was handed on, `-` if none). The key lives until the
//! latest member's lease ends; an expired member is dropped by the next
//! script that counts the group. So a mutex or writer meets a group as a
//! hash it has no hold in (contended, and queued if it waits), the mutex's
//! release and renewal see no count in a member's field, and one queue
//! orders every waiter of the name: a claim waiter's entry is
//! `c <kind> <live-until µs> <ttl ms> <liveness ms> <hub> <owner>`. When
//! the name falls free the head waiter is served, whatever its kind; a
//! group then serves the waiters behind it that join it (readers, or
//! permits while there is room), stopping at the first that does not, so
//! a waiting writer keeps later readers out and nobody barges past the
//! queue. Each served waiter is told on its hub as a mutex waiter is.
//!
//! A semaphore's first permit on a free name with nobody queued is
//! cheaper: the lock's string form with the kind after the fence (see
//! [`layout`](crate::layout)), so it is taken, renewed and freed by the
//! lock's own commands. A claim on the name (another permit, a re-entry,
//! a reader, another N) or a waiting mutex first makes it the group's
//! hash, the permit its one member with the key's expiry as its lease and
//! its fence kept, then goes on as with any group; a mutex that would not
//! wait is refused with the semaphore's N and changes nothing.
//!
//! A writer refused by readers with no place in the queue (a Redlock
//! node's, which has no queue) leaves a mark in the hash, `~w<owner>`,
//! the time until which new readers stay out: it lives the writer's TTL
//! up to [`MARK_LIFE`](lockwright_core::backend::MARK_LIFE), and goes
//! when the writer gives up. When the last reader leaves a live mark, the
//! key stays, marked (`~k` = `m`) until the mark's end: a writer or a
//! mutex takes the name as free, a reader waits.
//!
//! A downgrade turns the writer's holds into a member with its lease,
//! marked `W` in place of a ticket: still exclusive, so new readers wait
//! until it goes, and the name into a group of readers beside it: the
//! writer's release and renewal then find its member field.

use std::time::Duration;

use lockwright_core::backend::{refusal, Acquire, Found, Grant};
use lockwright_core::{
    Claim, Error, FencingToken, Holder, LockKey, LockStatus, OwnerToken, Result,
};

/// Functions of the group, defined after the mutex's `take` and before its
/// `hand_off`, which serves a claim waiter at the head of the queue.
pub(crate) const GROUP: &str = r"
local function now_ms()
  local t = redis.call('time')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- A member's field: holds, fence, lease end (ms), ticket ('W': the hold
-- of a writer that downgraded, still exclusive).
local function member(v)
  local h, f, e, t = string.match(v or '', '^(%d+) (%d+) (%d+) (%S+)$')
  if h then
    return tonumber(h), tonumber(f), tonumber(e), t
  end
end

local function put_member(owner, h, f, e, t)
  redis.call('hset', KEYS[1], owner, string.format('%d %.0f %.0f %s', h, f, e, t))
end

-- The key lives until its latest member's lease ends.
local function extend(ttl)
  if redis.call('pttl', KEYS[1]) < ttl then
    redis.call('pexpire', KEYS[1], ttl)
  end
end

-- `owner` joins the group of `kind` for `ttl` ms, its fence above the
-- group's last and `after`; a live member holds once more instead.
-- Returns the fence (0 unfenced), and whether it is a new member.
local function join(owner, kind, ttl, now, after, ticket)
  local h, f, e, t = member(redis.call('hget', KEYS[1], owner))
  if h and e > now then
    put_member(owner, h + 1, f, math.max(e, now + ttl), t)
    extend(ttl)
    return f, false
  end
  local fence = 0
  if fenced then
    fence = fence_now()
    local last = tonumber(redis.call('hget', KEYS[1], '~f')) or 0
    if after and after > last then
      last = after
    end
    if last >= fence then
      fence = last + 1
    end
    redis.call('hset', KEYS[1], '~f', string.format('%.0f', fence))
  end
  redis.call('hset', KEYS[1], '~k', kind)
  put_member(owner, 1, fence, now + ttl, ticket or '-')
  extend(ttl)
  return fence, true
end

-- How many members `kind` admits (nil: any number of readers).
local function cap_of(kind)
  if kind == 's' then
    return nil
  end
  return tonumber(string.sub(kind, 2))
end

-- The live members (expired ones dropped), the latest lease end, and
-- until when new readers stay out (false: they may enter): a writer
-- refused without a place in the queue leaves a mark, `~w<owner>`, and a
-- writer that downgraded keeps them out while its own hold lives.
local function members(now)
  local all = redis.call('hgetall', KEYS[1])
  local n, last, marked = 0, 0, false
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == '~w' then
      local until_ms = tonumber(all[i + 1])
      if until_ms > now then
        marked = math.max(marked or 0, until_ms)
      else
        redis.call('hdel', KEYS[1], all[i])
      end
    elseif string.byte(all[i], 1) ~= 126 then
      local h, _, e, t = member(all[i + 1])
      if h and e > now then
        n = n + 1
        last = math.max(last, e)
        if t == 'W' then
          marked = math.max(marked or 0, e)
        end
      else
        redis.call('hdel', KEYS[1], all[i])
      end
    end
  end
  return n, last, marked
end

-- A group's key with no live member left goes (kept while a live mark
-- must keep readers out, if `keep_marked`). Returns whether it went, and
-- the group's last fence, which the next grant must rise above.
local function settle(keep_marked)
  if not redis.call('hget', KEYS[1], '~k') then
    return false
  end
  local n, _, marked = members(now_ms())
  if n > 0 or (marked and keep_marked) then
    return false
  end
  local f = tonumber(redis.call('hget', KEYS[1], '~f'))
  redis.call('del', KEYS[1])
  return true, f
end

-- Serves the waiters at the head of the queue that join the group of
-- `kind` (`n` members; readers stay out while `marked`), dropping dead
-- entries, up to the first that does not fit. `me` is served without a
-- message. Returns the members, and `me`'s fence if it was served.
local function serve(kind, n, now, after, me, marked)
  local cap = cap_of(kind)
  local us, mine = nil, nil
  while (not cap or n < cap) and not (marked and kind == 's') do
    local head = redis.call('zrange', KEYS[2], 0, 0)[1]
    if not head then
      break
    end
    local v = redis.call('hget', KEYS[3], head) or ''
    local live = tonumber(string.match(v, '^c %S+ (%d+) ') or string.match(v, '^(%d+) '))
    us = us or now_us()
    local alive = head == me or (live and live > us)
    local k, _, ttl, life, hub, owner =
      string.match(v, '^c (%S+) (%d+) (%d+) (%d+) (%S+) (%S+)$')
    if alive and k ~= kind then
      break
    end
    redis.call('zpopmin', KEYS[2])
    redis.call('hdel', KEYS[3], head)
    if alive and k then
      local lease = math.min(tonumber(ttl), tonumber(life))
      if head == me then
        lease = tonumber(ttl)
      end
      local fence, fresh = join(owner, kind, lease, now, after, head)
      after = math.max(after or 0, fence)
      if fresh then
        n = n + 1
      end
      if head == me then
        mine = fence
      else
        tell(hub, head .. ' ' .. string.format('%.0f', fence) .. ' ' .. lease)
      end
    end
  end
  return n, mine
end
";

/// Defined after the mutex's `hand_off`, which it calls.
pub(crate) const GROUP_TAIL: &str = r"
-- `owner` (its field `v`) drops one hold, leaving the group at its last;
-- the last member out frees the name and serves the queue, and a member
-- leaving lets the waiters in that now fit. The holds left, or -1 for no
-- live hold.
local function leave(owner, v)
  local h, f, e, t = member(v)
  local now = now_ms()
  if not h or e <= now then
    return -1
  end
  if h > 1 then
    put_member(owner, h - 1, f, e, t)
    return h - 1
  end
  redis.call('hdel', KEYS[1], owner)
  local n, last, marked = members(now)
  if n == 0 then
    local fence = tonumber(redis.call('hget', KEYS[1], '~f'))
    if marked and redis.call('exists', KEYS[2]) == 0 then
      -- Readers gone, a writer's mark live: the name stays marked (`m`),
      -- free to a writer or a mutex, closed to new readers.
      redis.call('hset', KEYS[1], '~k', 'm')
      redis.call('pexpire', KEYS[1], math.max(marked - now, 1))
      return 0
    end
    redis.call('del', KEYS[1])
    if redis.call('exists', KEYS[2]) == 1 then
      hand_off(nil, fence)
    end
    return 0
  end
  redis.call('pexpire', KEYS[1], math.max(last - now, 1))
  if redis.call('exists', KEYS[2]) == 1 then
    serve(redis.call('hget', KEYS[1], '~k'), n, now, nil, nil, marked)
  end
  return 0
end

-- The group's kind as a number: 0 none (or only a mark), -1 readers, N
-- permits.
local function kind_num(k)
  if not k or k == 'm' then
    return 0
  elseif k == 's' then
    return -1
  end
  return tonumber(string.sub(k, 2))
end
";

/// The common case of [`CLAIM_ACQUIRE`], before the shared functions are
/// made (as the mutex's fast path is, see `scripts`): nothing held and
/// nobody queued, so the caller is the group's first member: a permit as
/// a lone permit in the string form (`SET NX PX`, answered with the bare
/// fence, as the mutex's), a read hold as the group's hash.
pub(crate) const CLAIM_ACQUIRE_FAST: &str = r"
local owner, ttl, kind, writer, ticket = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
if writer == '' then
  writer = nil
end
if not writer and string.byte(kind) == 112 then
  -- A permit: on a free name with nobody queued, the lock's string form.
  if redis.call('exists', KEYS[2]) == 0 then
    local fence, v = 0, owner .. ' 0 0 ' .. kind
    if fenced then
      local t = redis.call('time')
      local s = t[1] + shift
      fence, v = s * 1000000 + t[2], owner .. ' ' .. s .. ' ' .. t[2] .. ' ' .. kind
    end
    if redis.call('set', KEYS[1], v, 'NX', 'PX', ttl) then
      if ticket then
        redis.call('hdel', KEYS[3], ticket)
      end
      return fence
    end
  end
elseif not writer and redis.call('exists', KEYS[1], KEYS[2]) == 0 then
  local t = redis.call('time')
  local fence = 0
  if fenced then
    fence = (t[1] + shift) * 1000000 + t[2]
    redis.call('hset', KEYS[1], '~f', string.format('%.0f', fence))
  end
  local v = string.format('1 %.0f %.0f -', fence, t[1] * 1000 + math.floor(t[2] / 1000) + ttl)
  redis.call('hset', KEYS[1], '~k', kind, owner, v)
  redis.call('pexpire', KEYS[1], ttl)
  if ticket then
    redis.call('hdel', KEYS[3], ticket)
  end
  return {1, fence, 1}
end
";

/// KEYS: lock, queue, waiters. ARGV: owner, ttl ms, kind (`p<N>` or `s`),
/// the writer a read hold is asked beside (a downgrade) or ``; and for a
/// waiter: ticket, liveness ms, hub channel.
/// Returns {1, fence, holds} for a grant (the bare fence for a lone
/// permit taken by [`CLAIM_ACQUIRE_FAST`]), {0, pttl} when it must wait (a
/// waiter is then queued), {2, kind} when the name is held as another kind
/// (1: a mutex or writer), {3, 0} when this owner holds it exclusively.
/// Follows [`CLAIM_ACQUIRE_FAST`], whose locals it uses.
pub(crate) const CLAIM_ACQUIRE: &str = r"
-- A grant takes the caller's place in the queue away, if it had one.
local function granted(fence, holds)
  if ticket then
    redis.call('zrem', KEYS[2], ticket)
    redis.call('hdel', KEYS[3], ticket)
  end
  return {1, fence, holds}
end
local form = redis.call('type', KEYS[1])['ok']
local after = nil
if form == 'hash' then
  local gone, f = settle(kind == 's')
  if gone then
    form, after = 'none', f
  end
end
if form == 'none' then
  if writer then
    -- The writer no longer holds: never a read hold after a gap.
    return {0, -2}
  end
  local served = hand_off(ticket, after)
  if served == nil or served == 'me' then
    local now = now_ms()
    local fence = join(owner, kind, ttl, now, after, nil)
    if redis.call('exists', KEYS[2]) == 1 then
      serve(kind, 1, now, fence, nil, false)
    end
    return granted(fence, 1)
  end
  form = 'hash'
end
if form == 'string' then
  local holder, _, k = parse(redis.call('get', KEYS[1]))
  if k then
    -- A lone permit: its group's hash form, then as any group.
  elseif holder == owner then
    return {3, 0}
  elseif writer ~= holder and kind ~= 's' then
    return {2, 1}
  elseif writer ~= holder and not ticket then
    return {0, redis.call('pttl', KEYS[1])}
  end
  to_hash()
end
local now = now_ms()
local k = redis.call('hget', KEYS[1], '~k')
if not k then
  -- A mutex or writer holds.
  local wh = writer and tonumber(redis.call('hget', KEYS[1], writer))
  if wh then
    -- A downgrade: the writer's holds become a member, still exclusive
    -- (`W`: new readers wait until it goes), beside this read hold.
    local f = fence_of()
    put_member(writer, wh, f, now + redis.call('pttl', KEYS[1]), 'W')
    redis.call('hdel', KEYS[1], '~grant')
    return granted(join(owner, 's', ttl, now, nil, nil), 1)
  elseif redis.call('hexists', KEYS[1], owner) == 1 then
    return {3, 0}
  elseif kind ~= 's' then
    return {2, 1}
  end
elseif k == 'm' then
  -- Marked, with no members: a reader waits for the writer.
elseif k ~= kind then
  return {2, kind_num(k)}
else
  local h, f, e, t = member(redis.call('hget', KEYS[1], owner))
  if h and e > now then
    if ticket and t == ticket then
      -- Handed to us while the notice was lost or on its way.
      put_member(owner, h, f, now + ttl, '-')
    else
      put_member(owner, h + 1, f, math.max(e, now + ttl), t)
      h = h + 1
    end
    extend(ttl)
    return granted(f, h)
  end
  local n, _, marked = members(now)
  if writer then
    -- Beside a writer that downgraded before: whoever waits.
    local _, _, we = member(redis.call('hget', KEYS[1], writer))
    if we and we > now then
      return granted((join(owner, kind, ttl, now, nil, nil)), 1)
    end
    return {0, -2}
  end
  local mine = nil
  if redis.call('exists', KEYS[2]) == 1 then
    n, mine = serve(kind, n, now, nil, ticket, marked)
  end
  if mine then
    return granted(mine, 1)
  end
  local cap = cap_of(kind)
  if (not cap or n < cap) and not marked and redis.call('exists', KEYS[2]) == 0 then
    return granted((join(owner, kind, ttl, now, nil, nil)), 1)
  end
end
if writer then
  return {0, -2}
end
if ticket then
  local life, hub = tonumber(ARGV[6]), ARGV[7]
  local us = now_us()
  redis.call('zadd', KEYS[2], 'NX', us, ticket)
  redis.call('hset', KEYS[3], ticket,
    string.format('c %s %.0f %d %d %s %s', kind, us + life * 1000, ttl, life, hub, owner))
  redis.call('hset', KEYS[1], '~q', 1)
  if redis.call('pttl', KEYS[2]) < life then
    redis.call('pexpire', KEYS[2], life)
    redis.call('pexpire', KEYS[3], life)
  end
end
return {0, redis.call('pttl', KEYS[1])}
";

/// The script's name for a claim: `p<N>` or `s`.
pub(crate) fn kind(claim: Claim) -> String {
    match claim {
        Claim::Exclusive { permits } => format!("p{permits}"),
        Claim::Shared => "s".to_owned(),
    }
}

/// What an acquire script's reply means for `claim` on `key`: a grant,
/// contention, or the caller's mistake (another kind, another N, or a
/// change of claim by a holder).
pub(crate) fn answer(key: &LockKey, claim: Claim, reply: &[i64]) -> Result<Acquire> {
    let n = |k: i64| u32::try_from(k).unwrap_or(u32::MAX);
    // What the script found: a kind number is -1 for readers, 0 or 1
    // for a mutex or writer, N for a semaphore.
    let found = |k: i64| match k {
        -1 => Found {
            readers: true,
            ..Found::NOTHING
        },
        k => Found {
            kept: Some(n(k.max(1))),
            ..Found::NOTHING
        },
    };
    match reply {
        [1, fence, holds] => Ok(Acquire::Acquired(Grant {
            fence: Some(FencingToken(u64::try_from(*fence).unwrap_or(0))),
            holds: n(*holds),
            lease: None,
        })),
        // A mutex or writer meeting a semaphore.
        [0, _, k] if claim == Claim::MUTEX && *k > 1 => Err(refusal(key, claim, found(*k))),
        [0, pttl] | [0, pttl, _] => Ok(Acquire::Contended {
            retry_after: u64::try_from(*pttl).ok().map(Duration::from_millis),
        }),
        // The name is held as another kind.
        [2, k] => Err(refusal(key, claim, found(*k))),
        // The owner holds the name with another kind of claim.
        [3, k] => {
            let own = Found {
                own_shared: Some(*k == -1),
                ..found(*k)
            };
            Err(refusal(key, claim, own))
        }
        other => Err(Error::backend(format!(
            "unexpected acquire reply {other:?}"
        ))),
    }
}

/// A live member as the inspect script reads it: owner, holds, fence, ms
/// left, and 1 for a downgraded writer's hold (exclusive).
pub(crate) type Member = (String, i64, i64, i64, i64);

/// The status of a name a group holds: `kind` -1 for readers, N for N
/// permits.
pub(crate) fn status(kind: i64, members: Vec<Member>) -> LockStatus {
    let holders: Vec<Holder> = members
        .into_iter()
        .map(|(o, holds, fence, left, alone)| {
            let shared = kind < 0 && alone == 0;
            Holder::new(shared, u32::try_from(holds).unwrap_or(u32::MAX))
                .with_owner(OwnerToken::from_string(o).ok())
                .with_fence(
                    u64::try_from(fence)
                        .ok()
                        .filter(|f| *f > 0)
                        .map(FencingToken),
                )
                .with_remaining(u64::try_from(left).ok().map(Duration::from_millis))
        })
        .collect();
    let single = (holders.len() == 1)
        .then(|| holders[0].owner.clone())
        .flatten();
    LockStatus::of_holders(holders)
        .with_permits(u32::try_from(kind).ok())
        .with_owner(single)
}
