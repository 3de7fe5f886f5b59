-- Take or re-enter a lock in one step (after once.lua and token.lua).
-- KEYS[1] lock hash (field = holder id, value = re-entry count)
-- KEYS[2] fencing key (last token issued for this lock; lives as long as the lock)
-- KEYS[3] optional: the outcome key of a claim (see release.lua); when it exists the
--         work is done already and its outcome is returned instead of the lock
-- ARGV[1] holder id, ARGV[2] lease in ms, ARGV[3] '1' for a holder made for this
--         acquisition, last: this call's id (see once.lua)
-- Returns the token taken (bare), {2, token} re-entered, {0, pttl} held by another,
-- {3, outcome} completed before, {1, token} taken by this very call before (see below).

-- Whether this lock's holds get fencing tokens. A client built without them runs a
-- variant in which this line reads `local fenced = false` (store/redis/scripts.rs): its
-- holds' token is 0, and neither the clock nor the fencing key is touched, a third of a
-- cycle's work for Redis (`scripts/script_cost.sh --instructions`).
local fenced = true
if KEYS[3] then
  local outcome = redis.call('GET', KEYS[3])
  if outcome then
    return {3, outcome}
  end
end
-- PTTL, not EXISTS: -2 says the lock is free, and a busy lock's answer needs it anyway
-- (a refused attempt is then two calls, PTTL and HGET; HMGET on a cluster, see once.lua).
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then
  -- The server clock is read only here: a lock found busy does not need it.
  local token = fenced and issue_token(KEYS[2], redis.call('TIME'), 'PX', ARGV[2]) or 0
  set_count(KEYS[1], ARGV[1], '1', call)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  -- Bare, not {1, token}: Redis writes a table reply with ~6,500 more instructions, a
  -- twentieth of the whole cycle (`scripts/script_cost.sh --instructions`).
  return token
end
local count, last = count_of(KEYS[1], ARGV[1])
if count then
  -- This very call ran before (a holder made for it holds nothing else; any other finds
  -- its own id): answered as then, counted once.
  if ARGV[3] == '1' or last == call then
    local state = (ARGV[3] == '1' or count == '1') and 1 or 2
    return {state, fenced and tonumber(redis.call('GET', KEYS[2])) or 0}
  end
  set_count(KEYS[1], ARGV[1], tonumber(count) + 1, call)
  -- A re-entry never shortens the hold: one with a short lease inside a longer (or
  -- watchdog) hold would otherwise let the lock expire under its outer holder.
  if ttl < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    if fenced then
      redis.call('PEXPIRE', KEYS[2], ARGV[2])
    end
  end
  return {2, fenced and tonumber(redis.call('GET', KEYS[2])) or 0}
end
return {0, ttl}
