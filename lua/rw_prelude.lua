-- Prepended to every rw_*.lua script (after clock.lua, once.lua and token.lua): the
-- read-write lock's layout and the pruning of holds whose lease ran out.
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
-- KEYS[5] waiting readers: zset, member = the read hold's field (`<holder>:r`), score =
--         deadline (server ms) of its registration: named as in the leases, so that a
--         release admitting them all (see admit_readers) copies the set into the leases in
--         one call. An admitted reader stays here until it takes its hold up or releases
--         it: its entry is how it tells an admission from a re-entry.

-- Drops expired holds; returns the mode left: nil (free), 'read', 'write', or 'foreign' (a
-- plain lock of the same name holds the hash: never touch it). Expired writers'
-- registrations go when they are looked at (writers_waiting).
local function prune()
  local mode = redis.call('HGET', KEYS[1], 'mode')
  if not mode then
    if redis.call('EXISTS', KEYS[1]) == 1 then
      return 'foreign'
    end
    -- Leases outlive the hash only if it was deleted under us (a force unlock).
    redis.call('DEL', KEYS[2])
    return nil
  end
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now_text)
  if #gone == 0 then
    return mode
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_text)
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

-- Whether a writer waits (a live registration), expired ones dropped first. The key
-- expires with its last registration, so without it none does: one call on the
-- uncontended path, and none in scripts that do not ask.
local function writers_waiting()
  if redis.call('EXISTS', KEYS[4]) == 0 then
    return false
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now_text)
  return redis.call('ZCARD', KEYS[4]) > 0
end

-- Takes the free lock for the hold `field` in `mode` ('read' or 'write') with a lease of
-- `ms`: the count, the mode and a new fencing token (see token.lua; kept in the hash for
-- the holds of this phase) in one write; and, the hold being the only one, every key
-- expiring at its deadline. Returns the token.
local function take_free(field, mode, ms)
  local deadline = int(now + tonumber(ms))
  local token = issue_token(KEYS[3])
  set_count(KEYS[1], field, '1', call, 'mode', mode, 'token', int(token))
  redis.call('ZADD', KEYS[2], deadline, field)
  redis.call('PEXPIREAT', KEYS[1], deadline)
  redis.call('PEXPIREAT', KEYS[2], deadline)
  redis.call('PEXPIREAT', KEYS[3], deadline)
  return token
end

-- The latest hold's deadline (server ms, as text), nil if none.
local function latest()
  return redis.call('ZRANGE', KEYS[2], '-1', '-1', 'WITHSCORES')[2]
end

-- The lock's keys live until the latest hold's deadline. take_free and admit_readers set
-- the hash's and leases' expiry inline: one more helper for those two calls measured
-- +5,600 instructions per read cycle (`scripts/kind_cost.py`).
local function expire_with_latest()
  local last = latest()
  if last then
    redis.call('PEXPIREAT', KEYS[1], last)
    redis.call('PEXPIREAT', KEYS[2], last)
    redis.call('PEXPIREAT', KEYS[3], last)
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
  local first = redis.call('ZRANGE', KEYS[2], '0', '0', 'WITHSCORES')
  if first[2] then
    at = tonumber(first[2])
  end
  if with_writers then
    local last = redis.call('ZRANGE', KEYS[4], '-1', '-1', 'WITHSCORES')
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


-- Registers `member` in the waiters' set `key` (a refused writer's id in KEYS[4], a
-- refused reader's hold field in KEYS[5]) as waiting until `ms` from now; the set expires
-- with its last registration. A single try (`ms` = 0) does not wait and does not register.
local function register(key, member, ms)
  if tonumber(ms) > 0 then
    redis.call('ZADD', key, int(now + tonumber(ms)), member)
    local last = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
    redis.call('PEXPIREAT', key, last[2])
  end
end

-- The hash's fields for a read phase with the token `text`, each of `fields` counted once.
local function read_counts(fields, text)
  local counts = {'mode', 'read', 'token', text}
  for _, field in ipairs(fields) do
    counts[#counts + 1] = field
    counts[#counts + 1] = '1'
  end
  return counts
end

-- Calls `command` on `key` with the items of `list` as its further arguments, a thousand
-- at a time (unpack has a stack limit); returns the replies' items in order.
local function in_batches(command, key, list)
  local out = {}
  for i = 1, #list, 1000 do
    local reply = redis.call(command, key, unpack(list, i, math.min(i + 999, #list)))
    if type(reply) == 'table' then
      for _, item in ipairs(reply) do
        out[#out + 1] = item
      end
    end
  end
  return out
end

-- The lock is open to readers (free, or down to read holds) and no writer waits: every
-- waiting reader enters now, in this step. Each gets a read hold for what is left of its
-- registration (an admitted reader that died frees the lock within it; a live one's
-- watchdog renews it), and all are told on the readers' `channel`, with the phase's
-- token, so none asks again: `granted:<token>:<field> <field>..`, the holds' fields as
-- they are (`<holder id>:r`; the client strips the `:r`: made into ids here, a notice to 16
-- readers cost Redis a quarter of the release, `scripts/kind_cost.py`). `free`: the
-- lock's hash and leases are gone, so the registrations become the leases as they are,
-- in one `COPY`: no score formatted or parsed, no field name made (a release admitting 16
-- readers costs Redis a quarter less than with a lease written per reader). Otherwise (a
-- writer downgraded) readers admitted before and still holding keep their holds as they
-- are. Returns whether any reader was admitted.
local function admit_readers(channel, free)
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now_text)
  local fields, text
  if free then
    fields = redis.call('ZRANGE', KEYS[5], '0', '-1')
    if #fields == 0 then
      return false
    end
    redis.call('COPY', KEYS[5], KEYS[2], 'REPLACE')
    local last = latest()
    text = int(issue_token(KEYS[3]))
    in_batches('HSET', KEYS[1], read_counts(fields, text))
    redis.call('PEXPIREAT', KEYS[1], last)
    redis.call('PEXPIREAT', KEYS[2], last)
    redis.call('PEXPIREAT', KEYS[3], last)
  else
    local waiting = redis.call('ZRANGE', KEYS[5], '0', '-1', 'WITHSCORES')
    local names = {}
    for i = 1, #waiting, 2 do
      names[#names + 1] = waiting[i]
    end
    local held = in_batches('HMGET', KEYS[1], names)
    local leases = {}
    fields = {}
    for i, field in ipairs(names) do
      if not held[i] then
        fields[#fields + 1] = field
        leases[#leases + 1] = waiting[2 * i]
        leases[#leases + 1] = field
      end
    end
    if #fields == 0 then
      return false
    end
    in_batches('ZADD', KEYS[2], leases)
    local phase = redis.call('HMGET', KEYS[1], 'mode', 'token')
    text = phase[1] and phase[2]
    if not text then
      text = int(issue_token(KEYS[3]))
    end
    in_batches('HSET', KEYS[1], read_counts(fields, text))
    expire_with_latest()
  end
  redis.call('PUBLISH', channel, 'granted:' .. text .. ':' .. table.concat(fields, ' '))
  return true
end

-- Ends `holder`'s `side` ('r' or 'w') hold, whose count is down to zero. When the lock is
-- then free and no writer waits, every waiting reader is admitted (see admit_readers, on
-- the `readers` channel); if none is, one waiting writer per client is woken ('0' on the
-- `writers` channel). When it is down to read holds (a downgrade) and no writer waits,
-- every waiting reader is admitted too.
local function end_hold(holder, side, writers, readers)
  local field = holder .. ':' .. side
  redis.call('ZREM', KEYS[2], field)
  if side == 'r' then
    -- An admission taken up from its notice leaves the reader's entry until now.
    redis.call('ZREM', KEYS[5], field)
  end
  if redis.call('ZCARD', KEYS[2]) == 0 then
    -- The count and its :op go with the hash.
    redis.call('DEL', KEYS[1], KEYS[2])
    -- Readers are admitted only while no writer waits; a writer that then wakes would
    -- find them holding. The registrations expire with the last of them, so without
    -- the key no reader waits: one call instead of three on the uncontended path.
    local admitted = redis.call('EXISTS', KEYS[5]) == 1
      and not writers_waiting()
      and admit_readers(readers, true)
    if not admitted then
      redis.call('PUBLISH', writers, '0')
    end
    return
  end
  redis.call('HDEL', KEYS[1], field, op_of(field))
  if side == 'w' then
    -- Downgraded: the holder's read holds remain.
    redis.call('HSET', KEYS[1], 'mode', 'read')
    if not writers_waiting() then
      admit_readers(readers, false)
    end
  end
  expire_with_latest()
end
