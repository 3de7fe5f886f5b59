-- Drop one re-entry of a fair lock; at zero delete it and wake the head of the queue only.
-- KEYS[1] lock hash, KEYS[2] queue, KEYS[3] deadlines (see fair_acquire.lua)
-- ARGV[1] holder id, ARGV[2] wake channel prefix
-- To complete a claim as well (see release.lua): KEYS[4] outcome key; ARGV[3] outcome,
-- ARGV[4] how long to keep it in ms, ARGV[5] the lock's release channel.
-- Returns -1 not held by this holder, 0 freed, n > 0 re-entries left.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return -1
end
if KEYS[4] then
  redis.call('SET', KEYS[4], ARGV[3], 'PX', ARGV[4])
  redis.call('PUBLISH', ARGV[5], 'completed')
end
local left = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if left > 0 then
  return left
end
redis.call('DEL', KEYS[1])
-- Skip waiters that died: the turn goes to the first one still within its deadline.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, id in ipairs(gone) do
  redis.call('LREM', KEYS[2], 0, id)
end
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
end
local head = redis.call('LINDEX', KEYS[2], 0)
if head then
  redis.call('PUBLISH', ARGV[2] .. head, '0')
end
return 0
