-- Extend the lease of a lock this holder still holds; never creates a lock, and never
-- shortens it: re-entries share one expiry, and a renewal of one (the watchdog's) that
-- cut a longer fixed lease of another would let the hold run out under that guard once
-- the renewed one ends. The hold lasts as long as the latest any of its guards asked.
-- KEYS[1] lock hash, KEYS[2] fencing key; ARGV[1] holder id, ARGV[2] lease in ms
-- Returns 1 renewed (or already held longer), 0 not held by this holder (gone, expired
-- or taken over).
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  end
  return 1
end
return 0
