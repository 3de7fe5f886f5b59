-- A waiter gives up its place in a fair lock's queue (its wait budget is spent or its
-- acquire was dropped). If it stood first while the lock is free, the next one's turn has
-- come: wake it, as a release would.
-- KEYS[1] lock hash, KEYS[2] queue, KEYS[3] deadlines (see fair_acquire.lua)
-- ARGV[1] holder id, ARGV[2] wake channel prefix
-- Returns 1 if the waiter was queued, 0 if not.
local was_head = redis.call('LINDEX', KEYS[2], 0) == ARGV[1]
local removed = redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if was_head and redis.call('EXISTS', KEYS[1]) == 0 then
  local head = redis.call('LINDEX', KEYS[2], 0)
  if head then
    redis.call('PUBLISH', ARGV[2] .. head, '0')
  end
end
if removed > 0 then
  return 1
end
return 0
