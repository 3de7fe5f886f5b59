-- A waiter gives up (after permits_prelude.lua): it leaves the line, and permits granted
-- to it meanwhile (its notice missed) go back, as a release would give them.
-- ARGV[1] holder id, ARGV[2] permits it asked for, ARGV[3] the channel grants are told on,
-- ARGV[4] the lease it asked for (ms)
-- Returns 1 if it waited, 0 if not.
local member = ARGV[2] .. ':' .. ARGV[4] .. ':' .. ARGV[1]
local left = redis.call('ZREM', KEYS[4], member)
redis.call('ZREM', KEYS[5], member)
local capacity, used, fifo, held, waiting = prune(ARGV[1])
if held and capacity ~= 'foreign' then
  give_back(ARGV[1], held, used, capacity, fifo, ARGV[3], waiting)
  return 1
end
return left
