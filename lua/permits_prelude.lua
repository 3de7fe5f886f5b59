-- Prepended to every permits_*.lua script: a semaphore's layout, the server's clock, an
-- acquire's take of an idle semaphore, and the grants to waiters.
--
-- KEYS[1] the semaphore: one sorted set, each part of its state in a range of scores, so
--         that a count of a part is one `ZCOUNT` and no part needs a key of its own:
--           `capacity` -> -<capacity> (-<capacity> - 0.5 in strict arrival order): the
--             capacity stored while the semaphore is in use, its lowest member;
--           every permit held -> the deadline of its lease (server ms, below 1e13): a hold
--             of k permits is k members, `<k>:<lease ms>:<holder id>`, then the same with
--             `#2` .. `#k`;
--           every waiter, `<k>:<lease ms>:<holder id>` -> its place, from 1e15: its arrival
--             (server ms; a ms after the last place at least, so places never tie) * 1024
--             + when its registration runs out (server seconds, modulo
--             1024; a place is kept at most 510 s without asking again). Asking again
--             moves only the registration, never the place; a grant moves the member to
--             its lease's deadline, so the place becomes the first permit of the hold.
--         The first acquire of an idle semaphore stores its capacity (a force unlock takes
--         it with the holds: the next acquire stores its own). The set goes with its last
--         hold and waiter: a release sent as plain commands removes the capacity when it
--         is the only member left (`ZREMRANGEBYRANK <key> -1 0` removes a set's single
--         member, and nothing from a larger one).
-- KEYS[2] fencing key: the last token issued for this semaphore (see token.lua)
--
-- A holder is made for each acquisition (a member names it), so a hold is never re-entered
-- and a second run of a call finds what its first run did. Scores are read as little as
-- can be: Redis writes each with snprintf ('%.17g', ~3,500 instructions) and Lua reads it
-- back with strtod; counts are integers. A lock of another kind at the name (a hash) fails
-- the first call with WRONGTYPE: the client reads that as held by another (an acquire),
-- or gone (a release); renew.lua looks at the key's type first.

local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
-- Whether ARGV[1] names a hold of more than one permit (variants `local many = true`):
-- then it is that many members.
local many = false

-- An acquire's take of an idle semaphore, the common case, before anything below is made
-- (permits_acquire.lua's variants have `local taking = true`; its arguments are named
-- there): the capacity stored and the permits taken in one write. The set lives as long
-- as the hold; the fencing key is not moved (a PEXPIREAT costs a seventh of a permit
-- cycle, see token.lua).
local taking = false
local head
if taking then
  head = redis.call('ZRANGE', KEYS[1], '0', '1', 'WITHSCORES')
  if not head[1] then
    local deadline = string.format('%d', now + ARGV[2])
    if not many then
      redis.call('ZADD', KEYS[1], ARGV[3], 'capacity', deadline, ARGV[1])
    else
      local args = {ARGV[3], 'capacity', deadline, ARGV[1]}
      for i = 2, tonumber(string.match(ARGV[1], '^%d+')) do
        args[#args + 1] = deadline
        args[#args + 1] = ARGV[1] .. '#' .. i
        if #args >= 1000 then
          redis.call('ZADD', KEYS[1], unpack(args))
          args = {}
        end
      end
      if #args > 0 then
        redis.call('ZADD', KEYS[1], unpack(args))
      end
    end
    redis.call('PEXPIREAT', KEYS[1], deadline)
    local token = redis.call('INCR', KEYS[2])
    if token ~= 1 then
      return token
    end
    token = redis.call('INCRBY', KEYS[2], clock[1] .. string.sub('000000', #clock[2] + 1) .. clock[2])
    redis.call('PEXPIREAT', KEYS[2], deadline)
    return token
  end
end

-- The capacity and order stored as the `capacity` member's score.
local function stored(score)
  local n = tonumber(score)
  local capacity = math.floor(-n)
  return capacity, capacity ~= -n
end

-- A waiter is still registered while its registration's end, in seconds modulo 1024 (its
-- place's score modulo 1024), is 1 to 510 s ahead: `(score % 1024 - now_s - 1) % 1024 < 510`.
local now_s = math.floor(now / 1000)

-- The members of the `k` permits of the hold whose first member is `first` (it, then `#2`
-- .. `#k`), each after `score` if given: ZREM's members, or ZADD's pairs.
local function permits_of(first, k, score)
  local list = {}
  for i = 1, k do
    if score then
      list[#list + 1] = score
    end
    list[#list + 1] = i == 1 and first or first .. '#' .. i
  end
  return list
end

-- Calls `command` (`ZADD` or `ZREM`) on the semaphore with `args`, a thousand at a time
-- (unpack has a limit), as `ZADD XX GT` if `renew`. Each call names its command on its
-- line: Redis 7.0 names only the line of a call it refused.
local function in_batches(command, args, renew)
  for i = 1, #args, 1000 do
    local j = math.min(i + 999, #args)
    if command == 'ZREM' then
      redis.call('ZREM', KEYS[1], unpack(args, i, j))
    elseif renew then
      redis.call('ZADD', KEYS[1], 'XX', 'GT', unpack(args, i, j))
    else
      redis.call('ZADD', KEYS[1], unpack(args, i, j))
    end
  end
end

-- The semaphore and its fencing key live until `until_ms` (server ms) at least. They are
-- moved a lease further than asked, so the calls of the next lease need not move them
-- again.
local function keep(until_ms)
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl >= 0 and now + ttl >= until_ms then
    return
  end
  local at = string.format('%d', until_ms + (until_ms - now))
  redis.call('PEXPIREAT', KEYS[1], at)
  redis.call('PEXPIREAT', KEYS[2], at)
end

-- `n` new fencing tokens, each one above the last (`INCR`), or, when the key is missing,
-- from the server clock in µs (as token.lua makes them), the key then written to live
-- until `until_text` (server ms). Returns the first, a number (µs since 1970 are exact).
local function issue(n, until_text)
  local last
  if n == 1 then
    last = redis.call('INCR', KEYS[2])
  else
    last = redis.call('INCRBY', KEYS[2], string.format('%d', n))
  end
  if last ~= n then
    return last - n + 1
  end
  last = redis.call('INCRBY', KEYS[2], clock[1] .. string.sub('000000', #clock[2] + 1) .. clock[2])
  redis.call('PEXPIREAT', KEYS[2], until_text)
  return last - n + 1
end

-- Grants free permits to waiters in arrival order, each a hold of its own with its own
-- token, for the lease its place names, as if taken now (a granted waiter that died frees
-- them within that lease, as a holder that died does; a live one's watchdog renews them),
-- and tells them on `channel` by name, with the first token (the n-th named holds the
-- first + n - 1): `permits:<token>:<holder> <holder>..`. Strict order (`fifo`) stops at
-- the first waiter that does not fit; the default order lets smaller requests behind it
-- go first, looking a few waiters further. A waiter whose registration ran out leaves the
-- line instead. `used`: the permits held. Returns the permits used after, the first token
-- granted, where the place `me` stands among the granted (nil: not granted, false: it left
-- the line), and whether anyone may be left in line. The semaphore lives as long as a
-- grant's lease already: each registration moved it so (see permits_acquire.lua).
local function admit(capacity, fifo, used, channel, me)
  local free = capacity - used
  if free <= 0 then
    return used, nil, nil, true
  end
  -- The head of the line, with its place (a score costs Redis a snprintf: one is read
  -- where one permit is free, the common case); further, while permits are left free and
  -- the line goes on (a waiter that left, or in the default order one that did not fit),
  -- once more, a few waiters beyond.
  if free == 1 then
    -- The common case written out: a release of one permit grants the head of the line,
    -- if it is registered and waits for one permit.
    local head = redis.call('ZRANGEBYSCORE', KEYS[1], '1e15', '+inf', 'WITHSCORES', 'LIMIT',
      '0', '1')
    local waiter = head[1]
    if not waiter then
      return used, nil, nil, false
    end
    local lease, holder = string.match(waiter, '^1:(%d+):(.*)$')
    if lease and (head[2] % 1024 - now_s - 1) % 1024 < 510 then
      local score = string.format('%d', now + lease)
      redis.call('ZADD', KEYS[1], score, waiter)
      local token = issue(1, score)
      redis.call('PUBLISH', channel, 'permits:' .. string.format('%d', token) .. ':' .. holder)
      return used + 1, token, waiter == me and 1 or nil, true
    end
  end
  local grants, holders, gone = {}, {}, {}
  local latest, mine, from, want, left = 0, nil, 0, free, false
  for read = 1, 2 do
    local waiters = redis.call('ZRANGEBYSCORE', KEYS[1], '1e15', '+inf', 'WITHSCORES',
      'LIMIT', from == 0 and '0' or string.format('%d', from),
      want == 1 and '1' or string.format('%d', want))
    local kept = false
    for i = 1, #waiters, 2 do
      local waiter = waiters[i]
      if free == 0 then
        kept = true
        break
      end
      from = from + 1
      local k, lease, holder = string.match(waiter, '^(%d+):(%d+):(.*)$')
      k = tonumber(k)
      if (waiters[i + 1] % 1024 - now_s - 1) % 1024 >= 510 then
        gone[#gone + 1] = waiter
        if waiter == me then
          mine = false
        end
      elseif k <= free then
        free = free - k
        used = used + k
        local until_ms = now + lease
        local score = string.format('%d', until_ms)
        grants[#grants + 1] = score
        grants[#grants + 1] = waiter
        for j = 2, k do
          grants[#grants + 1] = score
          grants[#grants + 1] = waiter .. '#' .. j
        end
        holders[#holders + 1] = holder
        if until_ms > latest then
          latest = until_ms
        end
        if waiter == me then
          mine = #holders
        end
      else
        kept = true
        if fifo then
          break
        end
      end
    end
    left = kept or #waiters == 2 * want
    if read == 2 or free == 0 or not left or (fifo and kept) then
      break
    end
    want = free + 64
  end
  if #gone > 0 then
    in_batches('ZREM', gone)
  end
  if #holders == 0 then
    return used, nil, mine, left
  end
  if #grants <= 1000 then
    redis.call('ZADD', KEYS[1], unpack(grants))
  else
    in_batches('ZADD', grants)
  end
  local first = issue(#holders, string.format('%d', latest))
  redis.call('PUBLISH', channel,
    'permits:' .. string.format('%d', first) .. ':' .. table.concat(holders, ' '))
  return used, first, mine, left
end
