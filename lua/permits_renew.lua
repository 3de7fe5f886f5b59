-- Extend the lease of a hold's permits (after permits_prelude.lua); never creates one.
-- ARGV[1] the hold's first member (see permits_acquire.lua), ARGV[2] the lease in ms
-- Returns 1 renewed, 0 not held (released, expired or force-unlocked). A lease that ran
-- out is not renewed, even if nobody has taken its permits back yet.
-- A lock of another kind at the name (a force unlock freed it for one): not held. Looked
-- at first, so that a renewal never fails the batch of renewals it goes in.
if redis.call('TYPE', KEYS[1]).ok ~= 'zset' then
  return 0
end
local until_ms = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if not until_ms or until_ms >= 1e13 or until_ms <= now then
  return 0
end
local deadline = now + ARGV[2]
in_batches('ZADD', permits_of(ARGV[1], many and tonumber(string.match(ARGV[1], '^%d+')) or 1,
  string.format('%d', deadline)), true)
keep(deadline)
return 1
