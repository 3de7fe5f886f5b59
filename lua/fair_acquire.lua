-- Take, re-enter or queue for a fair (first come, first served) lock, in one step (after
-- fair_prelude.lua).
-- ARGV[1] holder id, ARGV[2] lease in ms, ARGV[3] queue timeout in ms,
-- ARGV[4] wake channel prefix (a waiter hears its turn on prefix .. its client id),
-- ARGV[5] '1' to join (or keep) a place in the queue, '0' for a single try that never queues
-- ARGV[6] '1' if an earlier attempt of this acquisition queued: holding the lock then means
--         it was granted (its notice missed), not a re-entry
-- ARGV[7] '1' if the holder was made for this acquisition (it held nothing before),
-- last: this call's id (see once.lua)
-- Returns the token taken (bare, see acquire.lua), {2, token} re-entered,
-- {0, ms} not yours: retry by yourself after ms at the latest (a notice may come sooner);
-- ms is -1 if the lock has no expiry and nobody is ahead.
local me = ARGV[1]

local count, last = count_of(KEYS[1], me)
if count then
  -- Not a re-entry: granted while this acquisition waited (its notice missed), or this
  -- very call ran before (see once.lua). Taken, with this caller's lease, counted once.
  local granted = ARGV[6] == '1' and redis.call('ZREM', KEYS[4], me) == 1
  if granted or ARGV[7] == '1' then
    -- Remembered, so that this call sent again is not taken for a re-entry either.
    if granted and call ~= '' then
      set_count(KEYS[1], me, count, call)
    end
    lease_at_least(ARGV[2])
    return tonumber(redis.call('GET', KEYS[2])) or 0
  end
  if last == call then
    return {count == '1' and 1 or 2, tonumber(redis.call('GET', KEYS[2])) or 0}
  end
  set_count(KEYS[1], me, tonumber(count) + 1, call)
  lease_at_least(ARGV[2])
  return {2, tonumber(redis.call('GET', KEYS[2])) or 0}
end

local free = redis.call('EXISTS', KEYS[1]) == 0
-- The queue's keys go with their last deadline: without them nobody waits, and a free
-- lock is taken without pruning or reading the queue (one call instead of two).
local queue = not free or redis.call('EXISTS', KEYS[3], KEYS[4]) > 0
if queue then
  prune()
end
if free then
  local head = queue and redis.call('LINDEX', KEYS[3], '0')
  if not head or head == me then
    if head then
      redis.call('LPOP', KEYS[3])
      redis.call('ZREM', KEYS[4], me)
    end
    return take(me, int(now + tonumber(ARGV[2])), call)
  end
  -- Free, but another waiter's turn (the lock expired, or a waiter ahead was dropped):
  -- the head gets it now, as a release would have given it.
  grant_head(ARGV[4])
end

if ARGV[5] == '1' then
  -- ZADD answers 1 only for a newcomer: it joins at the tail, a known waiter keeps its place.
  if redis.call('ZADD', KEYS[4], int(now + tonumber(ARGV[3])), me) == 1 then
    redis.call('RPUSH', KEYS[3], me)
  end
  -- The queue outlives no waiter: both keys go once the last deadline has passed.
  local last = redis.call('ZRANGE', KEYS[4], '-1', '-1', 'WITHSCORES')
  local gone_at = int(tonumber(last[2]) + 1)
  redis.call('PEXPIREAT', KEYS[3], gone_at)
  redis.call('PEXPIREAT', KEYS[4], gone_at)
end

-- Retry by the deadline of the waiter in front (of the tail, if not queued): if it has
-- died, it can be dropped then, so a dead waiter stalls the next for its own timeout only.
local pos = redis.call('LPOS', KEYS[3], me)
local ahead
if not pos then
  ahead = redis.call('LINDEX', KEYS[3], '-1')
elseif pos > 0 then
  ahead = redis.call('LINDEX', KEYS[3], pos - 1)
end
local wait = -1
if ahead then
  wait = tonumber(redis.call('ZSCORE', KEYS[4], ahead) or now) - now + 1
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then
  -- Still free: nobody was queued ahead to grant it to (a lone single try never gets here).
  return {0, math.max(wait, 0)}
end
if wait >= 0 and (ttl < 0 or wait < ttl) then
  ttl = wait
end
return {0, ttl}
