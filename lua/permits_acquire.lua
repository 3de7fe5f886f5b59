-- Take permits of a semaphore, or wait for them in line (after permits_prelude.lua, which
-- takes an idle semaphore).
-- ARGV[1] the hold's first member, `<permits>:<lease ms>:<holder id>` (a holder made for
-- this acquisition; the member is also its place in line), ARGV[2] the lease in ms,
-- ARGV[3] the capacity to store if the semaphore is idle, as stored (`-<capacity>`, or
-- `-<capacity>.5` in strict arrival order), ARGV[4] how long a place in line is kept
-- without asking again (ms; '0' for a single try, which never waits in line), ARGV[5] the
-- channel grants are told on
-- Returns the token taken (bare, see acquire.lua); refused, bare: -2 - ms, retry on a grant
-- or after ms (when the earliest lease could run out; -1: none will); {3, capacity}
-- refused for good: more permits asked than the capacity stored.

-- Whether an earlier attempt of this acquisition may have left its place in line (or been
-- granted permits): the first attempt's variant (`local first = true`) looks for neither;
-- a later one, a send again after a broken connection and every send on a cluster run
-- `local first = false`.
local first = true

-- A new place's score, or a place's with its registration moved (`place`: its score), for
-- a registration of `ms` from now (at most 509 s: the client asks again sooner). A new
-- place comes after every place before it, even one taken in the same ms: when places
-- arrived this ms or later (usually none, an empty reply), its arrival is the last one's
-- + 1 ms.
local function placed(place, ms)
  local until_s = math.floor((now + math.min(ms, 509000) + 999) / 1000) % 1024
  if place then
    return string.format('%d', place - place % 1024 + until_s)
  end
  local arrival = now
  local later = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('%d', now * 1024), '+inf',
    'WITHSCORES')
  if later[1] then
    arrival = math.floor(later[#later] / 1024) + 1
  end
  return string.format('%d', arrival * 1024 + until_s)
end

local capacity, fifo, lowest
if head[1] == 'capacity' then
  capacity, fifo = stored(head[2])
  lowest = tonumber(head[4])
else
  -- No capacity: a force unlock took it with the holds, and waiters kept their places.
  -- This acquire's is stored.
  capacity, fifo = stored(ARGV[3])
  lowest = tonumber(head[2])
  redis.call('ZADD', KEYS[1], ARGV[3], 'capacity')
end
local k = many and tonumber(string.match(ARGV[1], '^%d+')) or 1
-- Where this acquisition stands: holding (a score below 1e13), in line (from 1e15), or
-- neither.
local mine
if not first then
  mine = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
  if mine and mine < 1e13 and mine > now then
    -- Granted while this acquisition waited (its notice missed), or this very call ran
    -- before: taken, with at least this lease, and a token of its own (the first never
    -- reached this client).
    local deadline = now + ARGV[2]
    in_batches('ZADD', permits_of(ARGV[1], k, string.format('%d', deadline)), true)
    keep(deadline)
    return issue(1, string.format('%d', deadline))
  end
end
if k > capacity then
  -- The stored capacity is smaller than what this asks for: it would wait for ever.
  if mine and mine >= 1e15 then
    redis.call('ZREM', KEYS[1], ARGV[1])
    admit(capacity, fifo, capacity, ARGV[5])
  end
  return {3, capacity}
end
-- Holds whose lease ran out give their permits back (looked for only once the earliest
-- one has).
if lowest and lowest < 1e13 and lowest <= now then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '0', now)
  lowest = tonumber(redis.call('ZRANGE', KEYS[1], '1', '1', 'WITHSCORES')[2])
  if mine and mine < 1e13 then
    mine = nil
  end
end
-- Permits held: none if the earliest member is no hold; with one permit, at least one is
-- enough to know.
local used = 0
if lowest and lowest < 1e13 then
  used = capacity == 1 and 1 or redis.call('ZCOUNT', KEYS[1], '0', '(1e13')
end
if used + k <= capacity then
  -- Permits are free. Waiters first: free permits with a line (a lease ran out, a waiter
  -- left, the capacity grew) go to it in order.
  local waiting = mine ~= nil or redis.call('ZCOUNT', KEYS[1], '1e15', '+inf') > 0
  if waiting then
    local token, at
    used, token, at, waiting = admit(capacity, fifo, used, ARGV[5], ARGV[1])
    if at then
      return token + at - 1
    elseif at == false then
      -- Dropped: its registration had run out. It asks again as a newcomer.
      mine = nil
    end
    if waiting and fifo and used + k <= capacity then
      waiting = redis.call('ZCOUNT', KEYS[1], '1e15', '+inf') > (mine and 1 or 0)
    end
  end
  -- In strict order nobody passes a waiter; in the default order, one that did not fit.
  if used + k <= capacity and not (fifo and waiting) then
    local deadline = now + ARGV[2]
    local text = string.format('%d', deadline)
    in_batches('ZADD', permits_of(ARGV[1], k, text))
    keep(deadline)
    return issue(1, text)
  end
end

if ARGV[4] ~= '0' then
  -- In line (or still): its registration runs to now + ARGV[4], and the semaphore lives
  -- until a grant then would end.
  if mine then
    redis.call('ZADD', KEYS[1], 'XX', placed(mine, ARGV[4]), ARGV[1])
  else
    redis.call('ZADD', KEYS[1], placed(nil, ARGV[4]), ARGV[1])
  end
  keep(now + ARGV[4] + ARGV[2])
end
-- Asked again when the earliest lease could run out (it may let this waiter in).
if lowest and lowest < 1e13 then
  return -2 - (lowest - now)
end
return -1
