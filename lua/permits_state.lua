-- What a semaphore looks like now (after permits_prelude.lua), its run-out holds and
-- registrations dropped first.
-- Returns {capacity, used, waiting}; capacity -1 when idle (nothing stored), -2 when a
-- lock of another kind holds the name.
local capacity, used = prune('')
if capacity == 'foreign' then
  return {-2, 0, 0}
end
if not capacity then
  return {-1, 0, 0}
end
return {capacity, used, redis.call('ZCARD', KEYS[4])}
