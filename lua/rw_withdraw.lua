-- A waiter gives up (after rw_prelude.lua): drop its registration. A writer that was the
-- last one, while no writer holds the lock, lets every waiting reader in; a reader
-- admitted meanwhile (its notice missed) gives its admission back, as a release would.
-- ARGV[1] holder id, ARGV[2] 'r' or 'w', ARGV[3] writers' channel, ARGV[4] readers' channel
-- Returns 1 if it was registered, 0 if not.
local mode = prune()
local me = ARGV[1]
if ARGV[2] == 'r' then
  local field = me .. ':r'
  if redis.call('ZREM', KEYS[5], field) == 0 then
    return 0
  end
  local count = tonumber(redis.call('HGET', KEYS[1], field))
  if count and count > 1 then
    set_count(KEYS[1], field, count - 1, '')
  elseif count then
    end_hold(me, 'r', ARGV[3], ARGV[4])
  end
  return 1
end
if redis.call('ZREM', KEYS[4], me) == 0 then
  return 0
end
if not writers_waiting() and (mode == nil or mode == 'read') then
  admit_readers(ARGV[4], mode == nil)
end
return 1
