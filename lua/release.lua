-- Drop one re-entry of this holder; at zero delete the lock and tell waiters.
-- KEYS[1] lock hash; ARGV[1] holder id, ARGV[2] release channel
-- To complete a claim instead, also:
-- KEYS[2] outcome key; ARGV[3] outcome, ARGV[4] how long to keep it in ms.
--   The outcome is stored only by the holder, and every waiter is told (all of them can
--   use it), not only the next one.
-- Returns -1 not held by this holder, 0 freed, n > 0 re-entries left.
-- HGET, not HEXISTS + HINCRBY: the common release is then three calls (HGET, DEL, PUBLISH).
local count = redis.call('HGET', KEYS[1], ARGV[1])
if not count then
  return -1
end
-- '0' is also Redisson's unlock message, so waiters of either library wake on it.
local notice = '0'
if KEYS[2] then
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
  notice = 'completed'
end
local left = tonumber(count) - 1
if left <= 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], left)
end
if left <= 0 or KEYS[2] then
  redis.call('PUBLISH', ARGV[2], notice)
end
return math.max(left, 0)
