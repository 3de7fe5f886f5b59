-- Take (or re-enter) several locks at once, all or nothing (after once.lua and token.lua).
-- KEYS: lock hash and fencing key of each lock, in pairs: lock1, fence1, lock2, fence2, ...
-- ARGV[1] holder id, ARGV[2] lease in ms, ARGV[3] '1' for a holder made for this call,
-- last: this call's id (see once.lua)
-- Returns {1, token1, token2, ...} when every lock is now held by this holder (each
-- token as acquire.lua gives it), or {0, i, pttl} when lock i (1-based) is held by
-- another holder; then nothing was changed.
local n = #KEYS / 2
-- Whether an earlier attempt was refused, so that this one waits: then a refusal leaves the
-- busy lock a waiter's mark (see acquire.lua). Such attempts run the variant in which this
-- line reads `local waiting = true`.
local waiting = false
-- This very call ran before (see once.lua; a holder made for it is told apart below):
-- it holds every lock, counted once.
if call ~= '' and redis.call('HGET', KEYS[1], op_of(ARGV[1])) == call then
  local out = {1}
  for i = 1, n do
    out[i + 1] = tonumber(redis.call('GET', KEYS[2 * i])) or 0
  end
  return out
end
for i = 1, n do
  local lock = KEYS[2 * i - 1]
  if redis.call('EXISTS', lock) == 1 and redis.call('HEXISTS', lock, ARGV[1]) == 0 then
    local ttl = redis.call('PTTL', lock)
    if waiting and ttl >= 0 then
      redis.call('HSET', lock, '~w1', '1', '~w2', '1')
    end
    return {0, i, ttl}
  end
end
local out = {1}
for i = 1, n do
  local lock, fence = KEYS[2 * i - 1], KEYS[2 * i]
  -- What a holder made for this acquisition holds here it took in this acquisition (this
  -- very call, run before and sent again, see acquire.lua, or an earlier attempt that
  -- could not give it back): it holds it once.
  local again = ARGV[3] == '1' and redis.call('HEXISTS', lock, ARGV[1]) == 1
  local count = 0
  if not again then
    count = redis.call('HINCRBY', lock, ARGV[1], '1')
    if call ~= '' then
      redis.call('HSET', lock, op_of(ARGV[1]), call)
    end
  end
  if count == 1 then
    out[i + 1] = issue_token(fence, ARGV[2])
    redis.call('PEXPIRE', lock, ARGV[2])
  else
    -- A re-entry (or a hold taken again) never shortens the hold (see acquire.lua).
    if redis.call('PTTL', lock) < tonumber(ARGV[2]) then
      redis.call('PEXPIRE', lock, ARGV[2])
      redis.call('PEXPIRE', fence, ARGV[2])
    end
    out[i + 1] = tonumber(redis.call('GET', fence)) or 0
  end
end
return out
