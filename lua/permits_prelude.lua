-- Prepended to every permits_*.lua script (after clock.lua and token.lua): a semaphore's
-- layout, the return of permits whose lease ran out, and the grants to waiters.
--
-- KEYS[1] semaphore hash: `permits` (its capacity), `used` (permits held), `fifo` ('1':
--         strict arrival order), and one field per holder, `<holder id>` =
--         '<permits>:<token>'. A holder is made for each acquisition, so a field is
--         never re-entered, and holding it already means this very call ran before (or
--         a release granted it to this waiter).
-- KEYS[2] leases: zset, holder id -> deadline (server ms). Each hold expires on its own.
-- KEYS[3] fencing key: the last token issued for this semaphore
-- KEYS[4] waiting: zset, '<permits>:<lease ms>:<holder id>' -> arrival (server µs): the
--         order of grants
-- KEYS[5] waiting until: zset, the same members -> registration deadline (server ms)
--
-- The capacity is stored while the semaphore is in use (held or waited for); the first
-- acquire of an idle semaphore stores its own, and the stored one wins until it is idle
-- again or an admin call changes it.

-- Drops holds whose lease ran out (their permits come back) and waiters whose
-- registration did. Returns the state: capacity (nil: idle, nothing stored; 'foreign': a
-- lock of another kind holds the name), permits used, whether the order is strict,
-- `holder`'s field (its '<permits>:<token>') if it holds, and whether anyone waits.
local function prune(holder)
  -- The waiting sets go with their last registration: without them nobody waits.
  local waiting = redis.call('EXISTS', KEYS[4]) == 1
  if waiting then
    local silent = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now_text)
    if #silent > 0 then
      -- A thousand at a time: unpack has a stack limit.
      for i = 1, #silent, 1000 do
        redis.call('ZREM', KEYS[4], unpack(silent, i, math.min(i + 999, #silent)))
      end
      redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now_text)
      waiting = redis.call('EXISTS', KEYS[4]) == 1
    end
  end
  local state = redis.call('HMGET', KEYS[1], 'permits', 'used', 'fifo', holder)
  local capacity = tonumber(state[1])
  if not capacity then
    if redis.call('EXISTS', KEYS[1]) == 1 then
      return 'foreign'
    end
    -- Leases outlive the hash only if it was deleted under us (a force unlock).
    redis.call('DEL', KEYS[2])
    return nil, 0, false, nil, waiting
  end
  local used = tonumber(state[2])
  local held = state[4]
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now_text)
  if #gone > 0 then
    for _, id in ipairs(gone) do
      local field = redis.call('HGET', KEYS[1], id)
      if field then
        used = used - tonumber(string.match(field, '^%d+'))
        redis.call('HDEL', KEYS[1], id)
      end
      if id == holder then
        held = nil
      end
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_text)
    redis.call('HSET', KEYS[1], 'used', used)
  end
  if used <= 0 and not waiting then
    -- Idle: nothing is kept, the next acquire stores its capacity.
    redis.call('DEL', KEYS[1], KEYS[2])
    return nil, 0, false, nil, false
  end
  return capacity, used, state[3] == '1', held, waiting
end

-- The hash, the leases and the fencing key live until `until_ms` (server ms) at least.
-- They are moved a lease further than asked, so the calls of the next lease need not
-- move them again. The leases are looked at: they are made last (call this after adding
-- to them). Returns when they expire.
local function keep(until_ms)
  local ttl = redis.call('PTTL', KEYS[2])
  if ttl >= 0 and now + ttl >= until_ms then
    return now + ttl
  end
  local at = until_ms + (until_ms - now)
  local text = int(at)
  redis.call('PEXPIREAT', KEYS[1], text)
  redis.call('PEXPIREAT', KEYS[2], text)
  redis.call('PEXPIREAT', KEYS[3], text)
  return at
end

-- Grants free permits to waiters in arrival order, each its own hold with its own token,
-- for the lease it asked for, as if it had taken them now (a granted waiter that died
-- frees them within that lease, as a holder that died does; a live one's watchdog renews
-- them), and tells them on `channel` by name, with the
-- first token (the n-th named holds the first + n - 1), so none asks again:
-- `permits:<token>:<holder> <holder>..`. Strict order (`fifo`) stops at the first waiter
-- that does not fit; otherwise smaller requests behind it may go first. `stored` is the
-- count of permits used as the hash has it (written only if it changes), `waiting`
-- whether anyone is in line (as prune said). Returns the permits used after, and the
-- token of `me` if it was granted.
local function admit(capacity, used, fifo, channel, me, stored, waiting)
  local free = capacity - used
  if free <= 0 or not waiting then
    if used ~= stored then
      redis.call('HSET', KEYS[1], 'used', used)
    end
    return used
  end
  -- Each grant takes a permit at least: strict order looks at no more waiters than there
  -- are permits free; the other, at a few more, bounded.
  local span = fifo and free or free + 64
  local members = redis.call('ZRANGE', KEYS[4], '0', span - 1)
  local granted, holders, latest = {}, {}, 0
  for _, member in ipairs(members) do
    local permits, lease, holder = string.match(member, '^(%d+):(%d+):(.*)$')
    permits = tonumber(permits)
    local registered = redis.call('ZSCORE', KEYS[5], member)
    local until_ms = now + tonumber(lease)
    if not registered then
      -- A place without a deadline (a registration cut short): no live waiter holds it.
      redis.call('ZREM', KEYS[4], member)
    elseif permits <= free then
      free = free - permits
      granted[#granted + 1] = {member, holder, permits, until_ms}
      holders[#holders + 1] = holder
      if until_ms > latest then
        latest = until_ms
      end
    elseif fifo then
      break
    end
    if free == 0 then
      break
    end
  end
  if #granted == 0 then
    if used ~= stored then
      redis.call('HSET', KEYS[1], 'used', used)
    end
    return used
  end
  for _, grant in ipairs(granted) do
    redis.call('ZADD', KEYS[2], grant[4], grant[2])
    redis.call('ZREM', KEYS[4], grant[1])
    redis.call('ZREM', KEYS[5], grant[1])
  end
  local first = issue_token(KEYS[3], 'PXAT', int(keep(latest)))
  local text = int(first)
  local mine
  local fields = {}
  for i, grant in ipairs(granted) do
    local token = i == 1 and text or int(first + i - 1)
    fields[#fields + 1] = grant[2]
    fields[#fields + 1] = grant[3] .. ':' .. token
    used = used + grant[3]
    if grant[2] == me then
      mine = first + i - 1
    end
  end
  if #granted > 1 then
    redis.call('SET', KEYS[3], int(first + #granted - 1), 'KEEPTTL')
  end
  -- The grants and the count in one write (in pieces: unpack has a stack limit); a
  -- release that grants what it freed leaves the count as it was.
  if used ~= stored then
    fields[#fields + 1] = 'used'
    fields[#fields + 1] = used
  end
  for i = 1, #fields, 1000 do
    redis.call('HSET', KEYS[1], unpack(fields, i, math.min(i + 999, #fields)))
  end
  redis.call('PUBLISH', channel, 'permits:' .. text .. ':' .. table.concat(holders, ' '))
  return used, mine
end

-- Ends `holder`'s hold of `permits` (its field read as `held`), and grants what it frees.
-- `waiting`: whether anyone waits (as prune said). The last hold of a semaphore nobody
-- waits for takes the semaphore with it, in one call.
local function give_back(holder, held, used, capacity, fifo, channel, waiting)
  local left = used - tonumber(string.match(held, '^%d+'))
  if left <= 0 and not waiting then
    redis.call('DEL', KEYS[1], KEYS[2])
    return
  end
  redis.call('HDEL', KEYS[1], holder)
  -- The count is written once, by admit (not at all if it grants what was freed). The
  -- lease goes after the grants': the leases set, never emptied, keeps its expiry.
  admit(capacity, left, fifo, channel, nil, used, waiting)
  redis.call('ZREM', KEYS[2], holder)
end
