-- Give a hold's permits back, or a waiter's place in line, and grant what that frees (after
-- permits_prelude.lua). Also sent alone, to grant, after a release sent as plain commands
-- found waiters in line (`ZREM`, `ZREMRANGEBYRANK <key> -1 0`, `ZCOUNT <key> 1e15 +inf`).
-- ARGV[1] the hold's first member (see permits_acquire.lua), or '' to grant only, ARGV[2]
-- the channel grants are told on
-- Returns 0 released (or left the line, or granted), 1 the same with waiters maybe left in
-- line (the client's next release of this semaphore then runs this script, which grants in
-- the same step); not held (released already, expired, or force-unlocked): -1 - the
-- semaphore's last fencing token (-1: none). The caller tells
-- "ran before" from "lost" by its hold's token: the last one only if nobody took permits
-- since (this very release ran before, a cluster client having sent it again when its
-- connection broke; or the hold ran out with nobody after it).
if ARGV[1] ~= '' then
  -- Its permits, or its place in line (the same first member): a waiter that gives up
  -- gives back permits granted to it meanwhile (its notice missed), as a release does.
  local gone
  if not many then
    gone = redis.call('ZREM', KEYS[1], ARGV[1])
  else
    local members = permits_of(ARGV[1], tonumber(string.match(ARGV[1], '^%d+')))
    gone = 0
    for i = 1, #members, 1000 do
      gone = gone + redis.call('ZREM', KEYS[1], unpack(members, i, math.min(i + 999, #members)))
    end
  end
  if gone == 0 then
    return -1 - (tonumber(redis.call('GET', KEYS[2])) or 0)
  end
end
local capacity = redis.call('ZSCORE', KEYS[1], 'capacity')
if not capacity then
  -- Idle, or force-unlocked with waiters left in line: their next attempts store a
  -- capacity and grant in order.
  return 0
end
local fifo
capacity, fifo = stored(capacity)
local used, _, _, left = admit(capacity, fifo, redis.call('ZCOUNT', KEYS[1], '0', '(1e13'),
  ARGV[2])
if used == 0 and not (left and redis.call('ZCOUNT', KEYS[1], '1e15', '+inf') > 0) then
  -- Only the capacity is left: the semaphore is idle.
  redis.call('DEL', KEYS[1])
  return 0
end
return left and 1 or 0
