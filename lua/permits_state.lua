-- What a semaphore looks like now (after permits_prelude.lua), its run-out holds and its
-- silent waiters dropped first.
-- Returns {capacity, used, waiting}; capacity -1 when idle (nothing stored). A lock of
-- another kind at the name fails it with WRONGTYPE (see permits_prelude.lua).
local head = redis.call('ZRANGE', KEYS[1], '0', '0', 'WITHSCORES')
if head[1] ~= 'capacity' then
  -- Idle, or force-unlocked with waiters left in line (nothing stored until one asks).
  return {-1, 0, 0}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '0', now)
-- Waiters whose registration ran out leave the line.
local line = redis.call('ZRANGEBYSCORE', KEYS[1], '1e15', '+inf', 'WITHSCORES')
local silent = {}
for i = 1, #line, 2 do
  if (line[i + 1] % 1024 - now_s - 1) % 1024 >= 510 then
    silent[#silent + 1] = line[i]
  end
end
if #silent > 0 then
  in_batches('ZREM', silent)
end
local used = redis.call('ZCOUNT', KEYS[1], '0', '(1e13')
local waiting = redis.call('ZCOUNT', KEYS[1], '1e15', '+inf')
if waiting == 0 and used == 0 then
  redis.call('DEL', KEYS[1])
  return {-1, 0, 0}
end
return {stored(head[2]), used, waiting}
