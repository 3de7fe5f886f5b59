-- Take, re-enter or queue for a fair (first come, first served) lock, in one step.
-- KEYS[1] lock hash (same shape as acquire.lua, so renew.lua renews it)
-- KEYS[2] fencing key
-- KEYS[3] queue: list of waiting holder ids, oldest first
-- KEYS[4] deadlines: zset holder id -> ms (server clock) after which a silent waiter is dropped
-- ARGV[1] holder id, ARGV[2] lease in ms, ARGV[3] queue timeout in ms,
-- ARGV[4] wake channel prefix (a waiter hears its turn on prefix .. its id),
-- ARGV[5] '1' to join (or keep) a place in the queue, '0' for a single try that never queues,
-- ARGV[6] '1' if the holder was made for this acquisition (it held nothing before)
-- Returns {1, token} taken, {2, token} re-entered,
-- {0, ms} not yours: retry by yourself after ms at the latest (a notice may come sooner);
-- ms is -1 if the lock has no expiry and nobody is ahead.
local me = ARGV[1]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

if redis.call('HEXISTS', KEYS[1], me) == 1 then
  -- Only this very call, sent again, can have taken it for a new holder (see acquire.lua).
  if ARGV[6] == '1' then
    return {1, tonumber(redis.call('GET', KEYS[2])) or 0}
  end
  redis.call('HINCRBY', KEYS[1], me, 1)
  -- A re-entry never shortens the hold (see acquire.lua).
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  end
  return {2, tonumber(redis.call('GET', KEYS[2])) or 0}
end

-- Waiters silent past their deadline leave, wherever they stand: a dead one in the
-- middle must not keep its place for the ones behind it either.
local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
for _, id in ipairs(gone) do
  redis.call('LREM', KEYS[3], 0, id)
end
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
end

local free = redis.call('EXISTS', KEYS[1]) == 0
local head = redis.call('LINDEX', KEYS[3], 0)
if free and (not head or head == me) then
  if head then
    redis.call('LPOP', KEYS[3])
    redis.call('ZREM', KEYS[4], me)
  end
  -- Tokens as in acquire.lua: server clock in µs, never at or below the last one.
  local token = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  local last = tonumber(redis.call('GET', KEYS[2]))
  if last and last >= token then
    token = last + 1
  end
  redis.call('HSET', KEYS[1], me, 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('SET', KEYS[2], string.format('%.0f', token), 'PX', ARGV[2])
  return {1, token}
end

if ARGV[5] == '1' then
  -- ZADD answers 1 only for a newcomer: it joins at the tail, a known waiter keeps its place.
  if redis.call('ZADD', KEYS[4], now + tonumber(ARGV[3]), me) == 1 then
    redis.call('RPUSH', KEYS[3], me)
  end
  -- The queue outlives no waiter: both keys go once the last deadline has passed.
  local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[3], tonumber(last[2]) + 1)
  redis.call('PEXPIREAT', KEYS[4], tonumber(last[2]) + 1)
end

-- Retry by the deadline of the waiter in front (of the tail, if not queued): if it has
-- died, it can be dropped then, so a dead waiter stalls the next for its own timeout only.
local pos = redis.call('LPOS', KEYS[3], me)
local ahead
if not pos then
  ahead = redis.call('LINDEX', KEYS[3], -1)
elseif pos > 0 then
  ahead = redis.call('LINDEX', KEYS[3], pos - 1)
end
local wait = -1
if ahead then
  wait = tonumber(redis.call('ZSCORE', KEYS[4], ahead) or now) - now + 1
end

if free then
  -- Free, but another waiter's turn. Its notice may have been lost, or it has just become
  -- head because the one before it was dropped: tell it (again; a spare notice is harmless).
  head = redis.call('LINDEX', KEYS[3], 0)
  if head and head ~= me then
    redis.call('PUBLISH', ARGV[4] .. head, '0')
  end
  return {0, math.max(wait, 0)}
end
local ttl = redis.call('PTTL', KEYS[1])
if wait >= 0 and (ttl < 0 or wait < ttl) then
  ttl = wait
end
return {0, ttl}
