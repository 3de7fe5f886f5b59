-- Extend the lease of a read or write hold this holder still holds (after rw_prelude.lua);
-- never creates one, and never shortens it (see renew.lua: a hold lasts as long as the
-- latest any of its guards asked).
-- ARGV[1] holder id, ARGV[2] 'r' or 'w', ARGV[3] lease in ms
-- Returns 1 renewed, 0 not held (released, expired or force-unlocked).
local mode = prune()
local field = ARGV[1] .. ':' .. ARGV[2]
if mode == 'foreign' or not redis.call('ZSCORE', KEYS[2], field) then
  return 0
end
lease_at_least(field, ARGV[3])
return 1
