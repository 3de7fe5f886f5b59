-- Extend the lease of a holder's permits (after permits_prelude.lua); never creates one.
-- ARGV[1] holder id, ARGV[2] lease in ms
-- Returns 1 renewed, 0 not held (released, expired or force-unlocked). A lease that ran
-- out is not renewed, even if nobody has taken its permits back yet.
local until_ms = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not until_ms or tonumber(until_ms) <= now then
  return 0
end
until_ms = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], until_ms, ARGV[1])
keep(until_ms)
return 1
