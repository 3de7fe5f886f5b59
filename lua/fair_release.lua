-- Drop one re-entry of a fair lock; at zero the lock goes straight to the head of the
-- queue (after fair_prelude.lua).
-- ARGV[1] holder id, ARGV[2] wake channel prefix, ARGV[3] the hold's fencing token (''
-- unknown), last: this call's id (see once.lua)
-- To complete a claim as well (see release.lua): KEYS[5] outcome key; ARGV[4] outcome,
-- ARGV[5] how long to keep it in ms, ARGV[6] the lock's release channel.
-- Returns -2 or -1 not held by this holder (see once.lua), 0 freed, n > 0 re-entries left.
local count, last = count_of(KEYS[1], ARGV[1])
if not count then
  -- Lost (taken over or expired): a grant taken up from its notice leaves its entry here;
  -- it goes too, unless this holder also waits in the queue (a place of its own).
  if not redis.call('LPOS', KEYS[3], ARGV[1]) then
    redis.call('ZREM', KEYS[4], ARGV[1])
  end
  return not_held(KEYS[2], ARGV[3])
end
if last == call then
  -- This very call ran before: what it left.
  return tonumber(count)
end
if KEYS[5] then
  redis.call('SET', KEYS[5], ARGV[4], 'PX', ARGV[5])
  redis.call('PUBLISH', ARGV[6], 'completed')
end
local left = tonumber(count) - 1
if left > 0 then
  set_count(KEYS[1], ARGV[1], left, call)
  return left
end
redis.call('DEL', KEYS[1])
-- A grant taken up from its notice leaves its entry here until now. A holder that took
-- the lock free may find nobody queued and no grant waiting: the queue's keys go with
-- their last deadline (see fair_acquire.lua), so one call says so.
if redis.call('ZREM', KEYS[4], ARGV[1]) == 0 and redis.call('EXISTS', KEYS[3], KEYS[4]) == 0 then
  return 0
end
prune()
grant_head(ARGV[2])
return 0
