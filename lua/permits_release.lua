-- Give a holder's permits back and grant them to waiters (after permits_prelude.lua).
-- ARGV[1] holder id, ARGV[2] the channel grants are told on
-- Returns 0 released, -1 not held (released already, expired, or force-unlocked).
local capacity, used, fifo, held = prune(ARGV[1])
if not held or capacity == 'foreign' then
  return -1
end
give_back(ARGV[1], held, used, capacity, fifo, ARGV[2])
return 0
