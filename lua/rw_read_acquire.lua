-- Take or re-enter a read hold (after rw_prelude.lua).
-- ARGV[1] holder id, ARGV[2] lease in ms, ARGV[3] '1' if the holder was made for this
-- acquisition (it held nothing before)
-- Returns {1, token} a new read hold, {2, token} re-entered, {0, ms} refused: retry on a
-- notice or after ms. A holder's first read hold while it holds the write lock (a
-- downgrade) is a new hold with the write's token.
local mode = prune()
if mode == 'foreign' then
  return foreign()
end
local field = ARGV[1] .. ':r'
local writers_wait = redis.call('ZCARD', KEYS[4]) > 0
if not mode then
  -- Writer preference: a free lock goes to a waiting writer first.
  if writers_wait then
    return busy(true)
  end
  redis.call('HSET', KEYS[1], 'mode', 'read')
  local token = fresh_token()
  redis.call('HSET', KEYS[1], field, 1)
  lease_at_least(field, ARGV[2])
  return {1, token}
end
local token = tonumber(redis.call('HGET', KEYS[1], 'token')) or 0
-- Only this very call, sent again, can have taken it for a new holder (see acquire.lua).
if ARGV[3] == '1' and redis.call('HEXISTS', KEYS[1], field) == 1 then
  return {1, token}
end
-- What this holder already holds it may always read (re-entry, downgrade): refusing it
-- for a waiting writer would deadlock, as the writer waits for this holder.
if redis.call('HEXISTS', KEYS[1], field) == 1
    or redis.call('HEXISTS', KEYS[1], ARGV[1] .. ':w') == 1 then
  local count = redis.call('HINCRBY', KEYS[1], field, 1)
  lease_at_least(field, ARGV[2])
  if count == 1 then
    return {1, token}
  end
  return {2, token}
end
if mode == 'write' or writers_wait then
  return busy(mode ~= 'write')
end
-- Joins the read phase and shares its token.
redis.call('HSET', KEYS[1], field, 1)
lease_at_least(field, ARGV[2])
return {1, token}
