-- A waiting writer gives up (after rw_prelude.lua): drop its registration, and if it was
-- the last one and no writer holds the lock, let every waiting reader proceed.
-- ARGV[1] holder id, ARGV[2] readers' channel
-- Returns 1 if it was registered, 0 if not.
local mode = prune()
if redis.call('ZREM', KEYS[4], ARGV[1]) == 0 then
  return 0
end
if redis.call('ZCARD', KEYS[4]) == 0 and mode ~= 'write' and mode ~= 'foreign' then
  redis.call('PUBLISH', ARGV[2], 'read')
end
return 1
