-- Take or re-enter the write hold (after rw_prelude.lua); a refused writer registers as
-- waiting, which keeps new readers out until it gets the lock, gives up or dies.
-- ARGV[1] holder id, ARGV[2] lease in ms, ARGV[3] how long the registration lasts (ms; '0'
-- for a single try, which never registers),
-- ARGV[4] '1' if the holder was made for this acquisition (it held nothing before),
-- last: this call's id (see once.lua)
-- Returns the token taken (bare, see acquire.lua), {2, token} re-entered, {3, 0} refused
-- for good: this holder holds a read hold and no write hold (an upgrade would wait for
-- itself), {0, ms} refused: retry on a notice or after ms.
local mode = prune()
if mode == 'foreign' then
  return foreign()
end
local field = ARGV[1] .. ':w'
if not mode then
  redis.call('ZREM', KEYS[4], ARGV[1])
  return take_free(field, 'write', ARGV[2])
end
local held = redis.call('HMGET', KEYS[1], field, op_of(field), 'token')
if held[1] then
  local token = tonumber(held[3]) or 0
  -- This very call ran before (see once.lua): answered as then, counted once.
  if ARGV[4] == '1' or held[2] == call then
    return {(ARGV[4] == '1' or held[1] == '1') and 1 or 2, token}
  end
  set_count(KEYS[1], field, tonumber(held[1]) + 1, call)
  lease_at_least(field, ARGV[2])
  return {2, token}
end
if redis.call('HEXISTS', KEYS[1], ARGV[1] .. ':r') == 1 then
  return {3, 0}
end
register(KEYS[4], ARGV[1], ARGV[3])
return busy(false)
