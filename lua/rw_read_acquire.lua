-- Take or re-enter a read hold (after rw_prelude.lua).
-- ARGV[1] holder id, ARGV[2] lease in ms, ARGV[3] '1' if the holder was made for this
-- acquisition (it held nothing before), last: this call's id (see once.lua)
-- Returns {1, token} a new read hold, {2, token} re-entered, {0, ms} refused: retry on a
-- notice or after ms. A holder's first read hold while it holds the write lock (a
-- downgrade) is a new hold with the write's token.
local mode = prune()
if mode == 'foreign' then
  return foreign()
end
local field = ARGV[1] .. ':r'
local writers_wait = redis.call('ZCARD', KEYS[4]) > 0
if not mode then
  -- Writer preference: a free lock goes to a waiting writer first.
  if writers_wait then
    return busy(true)
  end
  local token = fresh_token()
  set_count(KEYS[1], field, 1, call, 'mode', 'read')
  lease_at_least(field, ARGV[2])
  return {1, token}
end
local held = redis.call('HMGET', KEYS[1], field, op_of(field), ARGV[1] .. ':w', 'token')
local token = tonumber(held[4]) or 0
-- This very call ran before (see once.lua): answered as then, counted once.
if held[1] and (ARGV[3] == '1' or held[2] == call) then
  return {(ARGV[3] == '1' or held[1] == '1') and 1 or 2, token}
end
-- What this holder already holds it may always read (re-entry, downgrade): refusing it
-- for a waiting writer would deadlock, as the writer waits for this holder.
if held[1] or held[3] then
  local count = (tonumber(held[1]) or 0) + 1
  set_count(KEYS[1], field, count, call)
  lease_at_least(field, ARGV[2])
  if count == 1 then
    return {1, token}
  end
  return {2, token}
end
if mode == 'write' or writers_wait then
  return busy(mode ~= 'write')
end
-- Joins the read phase and shares its token.
set_count(KEYS[1], field, 1, call)
lease_at_least(field, ARGV[2])
return {1, token}
