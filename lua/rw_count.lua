-- How many times a holder holds the read or the write side (after rw_prelude.lua).
-- ARGV[1] holder id, ARGV[2] 'r' or 'w'
-- Returns the re-entry count, 0 if not held.
local mode = prune()
if mode == 'foreign' then
  return 0
end
return tonumber(redis.call('HGET', KEYS[1], ARGV[1] .. ':' .. ARGV[2])) or 0
