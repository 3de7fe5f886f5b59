-- Take or re-enter a read hold (after rw_prelude.lua); a refused reader registers as
-- waiting, to be admitted by the release that opens the lock to readers.
-- ARGV[1] holder id, ARGV[2] lease in ms, ARGV[3] '1' if the holder was made for this
-- acquisition (it held nothing before), ARGV[4] how long the registration lasts (ms; '0'
-- for a single try, which never registers), ARGV[5] '1' if an earlier attempt of this
-- acquisition registered: holding then means it was admitted (its notice missed), not a
-- re-entry; last: this call's id (see once.lua)
-- Returns the token of a new read hold (bare, see acquire.lua), {2, token} re-entered,
-- {0, ms} refused: retry on a notice or after ms. A holder's first read hold while it
-- holds the write lock (a downgrade) is a new hold with the write's token.
local mode = prune()
if mode == 'foreign' then
  return foreign()
end
local me = ARGV[1]
local field = me .. ':r'

-- A new hold ends this holder's registration, if it may have one: one of this
-- acquisition, or of another task waiting as the same given holder (whose next attempt
-- must then count as a re-entry, not take this hold for its admission). A holder made
-- for this acquisition that never registered has none: no call.
local function no_longer_waiting()
  if ARGV[3] ~= '1' or ARGV[5] == '1' then
    redis.call('ZREM', KEYS[5], field)
  end
end
local writers_wait = writers_waiting()
if not mode then
  -- Writer preference: a free lock goes to a waiting writer first.
  if writers_wait then
    register(KEYS[5], field, ARGV[4])
    return busy(true)
  end
  no_longer_waiting()
  return take_free(field, 'read', ARGV[2])
end
local held = redis.call('HMGET', KEYS[1], field, op_of(field), me .. ':w', 'token')
local token = tonumber(held[4]) or 0
if held[1] then
  -- Admitted while this acquisition waited (its notice missed): taken, with this
  -- caller's lease, counted once, and remembered so that this call sent again is not
  -- taken for a re-entry either.
  if ARGV[5] == '1' and redis.call('ZREM', KEYS[5], field) == 1 then
    if call ~= '' then
      set_count(KEYS[1], field, held[1], call)
    end
    lease_at_least(field, ARGV[2])
    return token
  end
  -- This very call ran before (see once.lua): answered as then, counted once.
  if ARGV[3] == '1' or held[2] == call then
    return {(ARGV[3] == '1' or held[1] == '1') and 1 or 2, token}
  end
  set_count(KEYS[1], field, tonumber(held[1]) + 1, call)
  lease_at_least(field, ARGV[2])
  return {2, token}
end
-- A holder may always read what it writes (a downgrade), and other readers join the read
-- phase and share its token, unless a writer waits (refusing a downgrade would deadlock:
-- the writer waits for this holder).
if held[3] or (mode == 'read' and not writers_wait) then
  no_longer_waiting()
  set_count(KEYS[1], field, '1', call)
  lease_at_least(field, ARGV[2])
  return token
end
register(KEYS[5], field, ARGV[4])
return busy(mode ~= 'write')
