-- Prepended to every rw_*.lua script (after clock.lua and once.lua): the read-write lock's layout and
-- the pruning of holds whose lease ran out.
--
-- KEYS[1] lock hash: `mode` ('read' or 'write'), `token` (the fencing token of the
--         current phase: the write hold, or the read phase the readers joined), and one
--         re-entry count per hold, field `<holder>:r` (read) or `<holder>:w` (write),
--         with its `<field>:op` (see once.lua)
-- KEYS[2] leases: zset, member = a hold's field name, score = its deadline (server ms).
--         Each hold expires on its own, so a dead reader does not outlive its lease while
--         the others renew theirs; the lock's keys expire with the latest deadline.
-- KEYS[3] fencing key: the last token issued for this lock
-- KEYS[4] waiting writers: zset, member = holder id, score = deadline (server ms) of its
--         registration; while one is live, readers that hold nothing here are refused

-- Drops expired registrations and holds; returns the mode left: nil (free), 'read',
-- 'write', or 'foreign' (a plain lock of the same name holds the hash: never touch it).
local function prune()
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  local mode = redis.call('HGET', KEYS[1], 'mode')
  if not mode then
    if redis.call('EXISTS', KEYS[1]) == 1 then
      return 'foreign'
    end
    -- Leases outlive the hash only if it was deleted under us (a force unlock).
    redis.call('DEL', KEYS[2])
    return nil
  end
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  if #gone == 0 then
    return mode
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) == 0 then
    redis.call('DEL', KEYS[1])
    return nil
  end
  for _, field in ipairs(gone) do
    redis.call('HDEL', KEYS[1], field, op_of(field))
    if string.sub(field, -2) == ':w' then
      -- The writer's lease ran out; what is left are its own read holds (a downgrade).
      mode = 'read'
      redis.call('HSET', KEYS[1], 'mode', mode)
    end
  end
  return mode
end

-- A new fencing token, from the server clock (µs), never at or below the last one.
local function fresh_token()
  local token = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  local last = tonumber(redis.call('GET', KEYS[3]))
  if last and last >= token then
    token = last + 1
  end
  redis.call('SET', KEYS[3], int(token))
  redis.call('HSET', KEYS[1], 'token', int(token))
  return token
end

-- The lock's keys live until the latest hold's deadline.
local function expire_with_latest()
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIREAT', KEYS[1], last[2])
    redis.call('PEXPIREAT', KEYS[2], last[2])
    redis.call('PEXPIREAT', KEYS[3], last[2])
  end
end

-- Gives the hold `field` a lease of `ms` from now (a renewal: exactly that).
local function lease(field, ms)
  redis.call('ZADD', KEYS[2], int(now + tonumber(ms)), field)
  expire_with_latest()
end

-- Gives the hold `field` a lease of at least `ms` from now (an acquisition: a re-entry
-- never shortens the hold it re-enters).
local function lease_at_least(field, ms)
  redis.call('ZADD', KEYS[2], 'GT', int(now + tonumber(ms)), field)
  expire_with_latest()
end

-- The answer to a refused caller: {0, ms it may sleep before the lock can change without
-- a notice}: until the first hold runs out, or (`with_writers`: a refused reader) the
-- last waiting writer's registration does.
local function busy(with_writers)
  local at
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if first[2] then
    at = tonumber(first[2])
  end
  if with_writers then
    local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
    if last[2] and (not at or tonumber(last[2]) < at) then
      at = tonumber(last[2])
    end
  end
  if not at then
    return {0, 0}
  end
  return {0, math.max(at - now, 0)}
end

-- A plain lock holds the name: refused until its lease ends.
local function foreign()
  return {0, math.max(redis.call('PTTL', KEYS[1]), 0)}
end

