-- Take permits of a semaphore, or wait for them in line (after permits_prelude.lua).
-- ARGV[1] holder id (made for this acquisition), ARGV[2] lease in ms, ARGV[3] permits
-- asked, ARGV[4] capacity (stored if the semaphore is idle), ARGV[5] '1' strict arrival
-- order (stored with it), ARGV[6] how long a registration lasts (ms; '0' for a single
-- try, which never waits in line), ARGV[7] the channel grants are told on
-- Returns the token taken (bare, see acquire.lua); {0, ms} refused: retry on a grant or
-- after ms; {3, capacity} refused for good: more permits asked than the semaphore has.
local me, asked = ARGV[1], tonumber(ARGV[3])
-- An idle semaphore nobody waits for (the common case; no leases left by a force unlock
-- either): stored with this acquire's capacity and order, and taken, in as few calls as
-- there are keys to write. Its hash and leases live a lease longer than the hold (as
-- keep() would move them), the fencing key as long, through the token's write.
if redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[4]) == 0 then
  if asked > tonumber(ARGV[4]) then
    return {3, tonumber(ARGV[4])}
  end
  local until_ms = now + tonumber(ARGV[2])
  local at = int(until_ms + (until_ms - now))
  redis.call('ZADD', KEYS[2], until_ms, me)
  local token = issue_token(KEYS[3], 'PXAT', at)
  local text = int(token)
  if ARGV[5] == '1' then
    redis.call('HSET', KEYS[1], 'permits', ARGV[4], 'used', ARGV[3], 'fifo', '1', me, ARGV[3] .. ':' .. text)
  else
    redis.call('HSET', KEYS[1], 'permits', ARGV[4], 'used', ARGV[3], me, ARGV[3] .. ':' .. text)
  end
  redis.call('PEXPIREAT', KEYS[1], at)
  redis.call('PEXPIREAT', KEYS[2], at)
  redis.call('PEXPIREAT', KEYS[3], at)
  return token
end
-- Its place in line names what it waits for: the permits, and the lease a grant gives.
local member = ARGV[3] .. ':' .. ARGV[2] .. ':' .. me
local capacity, used, fifo, held, waiting = prune(me)
if capacity == 'foreign' then
  -- Refused until that lock's lease ends (-1: it has none, not one of ours).
  return {0, redis.call('PTTL', KEYS[1])}
end
if held then
  -- Granted while this acquisition waited (its notice missed), or this very call ran
  -- before (a holder is made for each acquisition): taken, with at least this lease.
  if waiting then
    redis.call('ZREM', KEYS[4], member)
    redis.call('ZREM', KEYS[5], member)
  end
  local until_ms = now + tonumber(ARGV[2])
  redis.call('ZADD', KEYS[2], 'GT', until_ms, me)
  keep(until_ms)
  return tonumber(string.match(held, ':(%d+)$'))
end
local created = not capacity
if created then
  -- Idle: this acquire's capacity and order are stored (waiters from before a force
  -- unlock keep their places in line).
  capacity, used, fifo = tonumber(ARGV[4]), 0, ARGV[5] == '1'
end
if asked > capacity then
  return {3, capacity}
end
if created then
  if fifo then
    redis.call('HSET', KEYS[1], 'permits', ARGV[4], 'used', '0', 'fifo', '1')
  else
    redis.call('HSET', KEYS[1], 'permits', ARGV[4], 'used', '0')
  end
end
local rank
if waiting then
  -- Permits freed without a grant (a lease ran out, a waiter left): waiters first.
  local mine
  used, mine = admit(capacity, used, fifo, ARGV[7], me, used, true)
  if mine then
    return mine
  end
  rank = redis.call('ZRANK', KEYS[4], member)
  waiting = redis.call('EXISTS', KEYS[4]) == 1
end
-- In strict order, only the head of the line (or anyone, with nobody in line) may take.
local behind = fifo and waiting and rank ~= 0
if asked <= capacity - used and not behind then
  local until_ms = now + tonumber(ARGV[2])
  redis.call('ZADD', KEYS[2], until_ms, me)
  local token = issue_token(KEYS[3], 'PXAT', int(keep(until_ms)))
  local text = int(token)
  redis.call('HSET', KEYS[1], me, ARGV[3] .. ':' .. text, 'used', used + asked)
  if rank then
    redis.call('ZREM', KEYS[4], member)
    redis.call('ZREM', KEYS[5], member)
  end
  return token
end

if tonumber(ARGV[6]) > 0 then
  -- The deadline first: a place in line is never without one.
  redis.call('ZADD', KEYS[5], int(now + tonumber(ARGV[6])), member)
  if not rank then
    local arrival = clock[1] .. string.sub('000000', #clock[2] + 1) .. clock[2]
    redis.call('ZADD', KEYS[4], arrival, member)
    rank = redis.call('ZRANK', KEYS[4], member)
  end
  -- The line outlives no waiter: both sets go once the last registration has passed,
  -- and the hash (its capacity) lives as long.
  local last = redis.call('ZRANGE', KEYS[5], '-1', '-1', 'WITHSCORES')
  local gone_at = int(tonumber(last[2]) + 1)
  redis.call('PEXPIREAT', KEYS[4], gone_at)
  redis.call('PEXPIREAT', KEYS[5], gone_at)
  keep(tonumber(last[2]))
elseif created then
  -- Made for waiters in line (from before a force unlock): the hash lives as they do.
  local last = redis.call('ZRANGE', KEYS[5], '-1', '-1', 'WITHSCORES')
  keep(tonumber(last[2] or now))
end

-- Sleep until enough holds could have run out for this waiter to get in without a
-- notice: those ahead in line (counted one permit each) and its own, less what is free.
local needed = (rank or redis.call('ZCARD', KEYS[4])) + asked - (capacity - used)
local nth = redis.call('ZRANGE', KEYS[2], math.max(needed, 1) - 1, math.max(needed, 1) - 1, 'WITHSCORES')
if nth[2] then
  return {0, math.max(tonumber(nth[2]) - now, 0)}
end
-- No hold running out lets it in: only a release (or a waiter ahead leaving) does.
return {0, -1}
