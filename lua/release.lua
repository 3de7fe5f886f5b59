-- Drop one re-entry of this holder; at zero delete the lock and tell waiters.
-- KEYS[1] lock hash; ARGV[1] holder id, ARGV[2] release channel
-- Returns -1 not held by this holder, 0 freed, n > 0 re-entries left.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return -1
end
local left = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if left > 0 then
  return left
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], 'released')
return 0
