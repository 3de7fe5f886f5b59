-- Delete a lock whoever holds it, whatever its kind (an admin action), and wake its
-- waiters as its own release would have.
-- KEYS[1] lock hash, KEYS[2] a read-write lock's leases, KEYS[3] a fair lock's queue,
-- KEYS[4] its waiters' deadlines, KEYS[5] the fencing key, KEYS[6] a read-write lock's
-- waiting readers
-- ARGV[1] release channel, ARGV[2] readers' channel, ARGV[3] fair wake channel prefix,
-- ARGV[4] a semaphore's grant channel
-- Returns 1 if a lock was deleted, 0 if there was none.
if redis.call('TYPE', KEYS[1]).ok == 'zset' then
  -- A semaphore (see permits_prelude.lua): its capacity and every permit held go; its
  -- waiters keep their places in line.
  if redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(1e13') == 0 then
    return 0
  end
elseif redis.call('DEL', KEYS[1]) == 0 then
  return 0
end
-- Readers' registrations go too: an admitted reader stays registered while it holds, and
-- the next write release would admit it again, to a hold it lost (and whose renewal would
-- then succeed). Waiting readers, woken below, register again.
redis.call('DEL', KEYS[2], KEYS[6])
-- The last token moves on: a release by the holder whose hold this was is told it lost
-- the lock, not that its release ran already (see once.lua).
local last = redis.call('GET', KEYS[5])
if last then
  redis.call('SET', KEYS[5], string.format('%.0f', tonumber(last) + 1), 'KEEPTTL')
end
-- A plain waiter or a waiting writer (and Redisson's waiters: '0' is its unlock message).
redis.call('PUBLISH', ARGV[1], '0')
-- Waiting readers (still held back by any writer that waits).
redis.call('PUBLISH', ARGV[2], 'read')
-- A semaphore's waiters: every permit is free, and they keep their places in line (the
-- first to try again grants them in order).
redis.call('PUBLISH', ARGV[4], 'read')
-- The fair queue's head, skipping waiters that died.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)) do
  redis.call('LREM', KEYS[3], 0, id)
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local head = redis.call('LINDEX', KEYS[3], 0)
if head then
  -- On its client's channel, by name (see fair_prelude.lua): its turn, to take by asking.
  redis.call('PUBLISH', ARGV[3] .. (string.match(head, '^(.*):') or head), 'wake:' .. head)
end
return 1
