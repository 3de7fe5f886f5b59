-- Drop one re-entry of a read or write hold (after rw_prelude.lua); at zero the hold ends
-- (see end_hold: waiting writers are woken, waiting readers admitted).
-- ARGV[1] holder id, ARGV[2] 'r' or 'w', ARGV[3] writers' channel, ARGV[4] readers' channel,
-- ARGV[5] the hold's fencing token ('' unknown), last: this call's id (see once.lua)
-- Returns -2 or -1 not held by this holder (see once.lua), 0 this hold ended, n > 0
-- re-entries left.
local mode = prune()
local field = ARGV[1] .. ':' .. ARGV[2]
if mode == 'foreign' then
  return -1
end
local count, last = count_of(KEYS[1], field)
if not count then
  return not_held(KEYS[3], ARGV[5])
end
if last == call then
  -- This very call ran before: what it left.
  return tonumber(count)
end
local left = tonumber(count) - 1
if left > 0 then
  set_count(KEYS[1], field, left, call)
  return left
end
end_hold(ARGV[1], ARGV[2], ARGV[3], ARGV[4])
return 0
