-- Drop one re-entry of a read or write hold (after rw_prelude.lua).
-- ARGV[1] holder id, ARGV[2] 'r' or 'w', ARGV[3] writers' channel, ARGV[4] readers' channel,
-- ARGV[5] the hold's fencing token ('' unknown), last: this call's id (see once.lua)
-- When the lock becomes free, one waiting writer per client is woken ('0' on the writers'
-- channel); when it becomes free or leaves write mode and no writer waits, every waiting
-- reader is ('read' on the readers' channel: they can all proceed at once).
-- Returns -2 or -1 not held by this holder (see once.lua), 0 this hold ended, n > 0
-- re-entries left.
local mode = prune()
local field = ARGV[1] .. ':' .. ARGV[2]
if mode == 'foreign' then
  return -1
end
local held = redis.call('HMGET', KEYS[1], field, op_of(field))
if not held[1] then
  return not_held(KEYS[3], ARGV[5])
end
if held[2] == call then
  -- This very call ran before: what it left.
  return tonumber(held[1])
end
local left = tonumber(held[1]) - 1
if left > 0 then
  set_count(KEYS[1], field, left, call)
  return left
end
redis.call('HDEL', KEYS[1], field, op_of(field))
redis.call('ZREM', KEYS[2], field)
local readers_may_go = redis.call('ZCARD', KEYS[4]) == 0
if redis.call('ZCARD', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('PUBLISH', ARGV[3], '0')
  if readers_may_go then
    redis.call('PUBLISH', ARGV[4], 'read')
  end
  return 0
end
if ARGV[2] == 'w' then
  -- Downgraded: the holder's read holds remain.
  redis.call('HSET', KEYS[1], 'mode', 'read')
  if readers_may_go then
    redis.call('PUBLISH', ARGV[4], 'read')
  end
end
expire_with_latest()
return 0
