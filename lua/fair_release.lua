-- Drop one re-entry of a fair lock; at zero the lock goes straight to the head of the
-- queue (after fair_prelude.lua).
-- ARGV[1] holder id, ARGV[2] wake channel prefix
-- To complete a claim as well (see release.lua): KEYS[5] outcome key; ARGV[3] outcome,
-- ARGV[4] how long to keep it in ms, ARGV[5] the lock's release channel.
-- Returns -1 not held by this holder, 0 freed, n > 0 re-entries left.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  -- Lost (taken over or expired): a grant taken up from its notice leaves its entry here;
  -- it goes too, unless this holder also waits in the queue (a place of its own).
  if not redis.call('LPOS', KEYS[3], ARGV[1]) then
    redis.call('ZREM', KEYS[4], ARGV[1])
  end
  return -1
end
if KEYS[5] then
  redis.call('SET', KEYS[5], ARGV[3], 'PX', ARGV[4])
  redis.call('PUBLISH', ARGV[5], 'completed')
end
local left = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if left > 0 then
  return left
end
redis.call('DEL', KEYS[1])
-- A grant taken up from its notice leaves its entry here until now.
redis.call('ZREM', KEYS[4], ARGV[1])
prune()
grant_head(ARGV[2])
return 0
