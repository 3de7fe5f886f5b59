-- Prepended to every fair_*.lua script (after clock.lua, once.lua and token.lua): the fair
-- lock's layout, the pruning of silent waiters and the direct handoff to the head of the
-- queue.
--
-- KEYS[1] lock hash (same shape as acquire.lua, so renew.lua renews it)
-- KEYS[2] fencing key
-- KEYS[3] queue: list of waiting holder ids, oldest first
-- KEYS[4] deadlines: zset holder id -> ms (server clock) after which a silent waiter is
--         dropped. A waiter granted the lock stays here (out of the queue) until it takes
--         the grant up: its entry is how it tells a grant from a re-entry.

-- Waiters silent past their deadline leave, wherever they stand: a dead one in the
-- middle must not keep its place for the ones behind it either.
local function prune()
  local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_text)
  for _, id in ipairs(gone) do
    redis.call('LREM', KEYS[3], '0', id)
  end
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now_text)
  end
end

-- Takes the free lock for `holder` until `until_ms` (server clock, as text), for the call
-- `call` (see once.lua); returns its new fencing token (see token.lua).
local function take(holder, until_ms, call)
  set_count(KEYS[1], holder, '1', call)
  redis.call('PEXPIREAT', KEYS[1], until_ms)
  local token = issue_token(KEYS[2])
  redis.call('PEXPIREAT', KEYS[2], until_ms)
  return token
end

-- The channel on which `holder` hears its turn: its client's (`prefix` and the holder id
-- up to its last ':', as holder ids are `<client id>:<number>`), so one subscription
-- serves every waiter of a client; the message names the holder.
local function wake_channel(prefix, holder)
  return prefix .. (string.match(holder, '^(.*):') or holder)
end

-- The lock is free: it goes to the head of the queue, if any, for what is left of the
-- head's deadline (a granted waiter that died frees it within its queue timeout), and the
-- head is told on its client's channel, by name, with the token, so it holds the lock
-- without asking.
local function grant_head(prefix)
  local head = redis.call('LPOP', KEYS[3])
  while head do
    -- A score is written as an integer (see fair_acquire.lua), so its text is one.
    local until_ms = redis.call('ZSCORE', KEYS[4], head)
    if until_ms then
      local text = int(take(head, until_ms, ''))
      redis.call('PUBLISH', wake_channel(prefix, head), 'granted:' .. text .. ':' .. head)
      return
    end
    -- A place without a deadline (its keys were cut apart): no live waiter holds it.
    head = redis.call('LPOP', KEYS[3])
  end
end

-- Moves the lock's expiry to `ms` from now unless it is later already: a re-entry or a
-- grant taken up never shortens the hold.
local function lease_at_least(ms)
  if redis.call('PTTL', KEYS[1]) < tonumber(ms) then
    redis.call('PEXPIRE', KEYS[1], ms)
    redis.call('PEXPIRE', KEYS[2], ms)
  end
end
