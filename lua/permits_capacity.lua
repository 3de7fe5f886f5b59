-- An admin changes the capacity of a semaphore in use (after permits_prelude.lua). No
-- held permit is taken back: with less room, new holders wait until enough are released.
-- More room is granted to waiters at once.
-- ARGV[1] the new capacity, ARGV[2] the channel grants are told on
-- Returns 1 changed, 0 the semaphore is idle (nothing is stored; the next acquire
-- stores its own capacity).
local capacity, used, fifo, _, waiting = prune('')
if not capacity or capacity == 'foreign' then
  return 0
end
redis.call('HSET', KEYS[1], 'permits', ARGV[1])
admit(tonumber(ARGV[1]), used, fifo, ARGV[2], nil, used, waiting)
return 1
