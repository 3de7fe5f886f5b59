-- Give a holder's permits back and grant them to waiters (after permits_prelude.lua).
-- ARGV[1] holder id, ARGV[2] the channel grants are told on, ARGV[3] the hold's fencing
-- token ('' unknown)
-- Returns 0 released; -2 not held, and nobody took permits since the hold's token (this
-- very release ran before: a cluster client sent it again when its connection broke; or
-- the hold ran out with nobody after it); -1 not held (released already, expired and
-- taken, or force-unlocked).
local capacity, used, fifo, held, waiting = prune(ARGV[1])
if not held or capacity == 'foreign' then
  if ARGV[3] ~= '' and redis.call('GET', KEYS[3]) == ARGV[3] then
    return -2
  end
  return -1
end
give_back(ARGV[1], held, used, capacity, fifo, ARGV[2], waiting)
return 0
