-- A waiter gives up its place in a fair lock's queue (its wait budget is spent or its
-- acquire was dropped), and a grant it never took up (after fair_prelude.lua). If that
-- leaves the lock free, the next waiter gets it, as from a release.
-- ARGV[1] holder id, ARGV[2] wake channel prefix
-- Returns 1 if the waiter was queued or granted, 0 if not.
local me = ARGV[1]
local removed = redis.call('LREM', KEYS[3], '0', me)
if redis.call('ZREM', KEYS[4], me) == 1 and redis.call('HEXISTS', KEYS[1], me) == 1 then
  -- Granted but never taken up: give back the grant's count (the holder may hold
  -- re-entries of its own besides).
  removed = 1
  if redis.call('HINCRBY', KEYS[1], me, '-1') <= 0 then
    redis.call('DEL', KEYS[1])
  end
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  prune()
  grant_head(ARGV[2])
end
if removed > 0 then
  return 1
end
return 0
