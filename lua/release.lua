-- Drop one re-entry of this holder; at zero delete the lock and tell waiters (after
-- once.lua).
-- KEYS[1] lock hash, KEYS[2] fencing key; ARGV[1] holder id, ARGV[2] release channel,
-- ARGV[3] the hold's fencing token ('' unknown), last: this call's id (see once.lua)
-- To complete a claim instead, also:
-- KEYS[3] outcome key; ARGV[4] outcome, ARGV[5] how long to keep it in ms.
--   The outcome is stored only by the holder, and every waiter is told (all of them can
--   use it), not only the next one.
-- Returns -2 or -1 not held by this holder (see once.lua), 0 freed, n > 0 re-entries left.
-- HGET, not HEXISTS + HINCRBY: the common release is then three calls (HGET, DEL,
-- PUBLISH).
local count, last = count_of(KEYS[1], ARGV[1])
if not count then
  return not_held(KEYS[2], ARGV[3])
end
if last == call then
  -- This very call ran before (see once.lua): what it left.
  return tonumber(count)
end
-- '0' is also Redisson's unlock message, so waiters of either library wake on it.
local notice = '0'
if KEYS[3] then
  redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[5])
  notice = 'completed'
end
local left = tonumber(count) - 1
if left <= 0 then
  redis.call('DEL', KEYS[1])
else
  set_count(KEYS[1], ARGV[1], left, call)
end
if left <= 0 or KEYS[3] then
  redis.call('PUBLISH', ARGV[2], notice)
end
return math.max(left, 0)
