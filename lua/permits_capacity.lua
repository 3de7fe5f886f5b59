-- An admin changes the capacity of a semaphore in use (after permits_prelude.lua). No
-- held permit is taken back: with less room, new holders wait until enough are released.
-- More room is granted to waiters at once.
-- ARGV[1] the new capacity, ARGV[2] the channel grants are told on
-- Returns 1 changed, 0 the semaphore is idle (nothing is stored; the next acquire
-- stores its own capacity).
local head = redis.call('ZRANGE', KEYS[1], '0', '0', 'WITHSCORES')
if head[1] ~= 'capacity' then
  return 0
end
local _, fifo = stored(head[2])
local capacity = tonumber(ARGV[1])
redis.call('ZADD', KEYS[1], 'XX', fifo and -capacity - 0.5 or -capacity, 'capacity')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '0', now)
local used = redis.call('ZCOUNT', KEYS[1], '0', '(1e13')
local _, left
used, _, _, left = admit(capacity, fifo, used, ARGV[2])
if used == 0 and not (left and redis.call('ZCOUNT', KEYS[1], '1e15', '+inf') > 0) then
  redis.call('DEL', KEYS[1])
  return 0
end
return 1
