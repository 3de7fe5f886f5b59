-- Delete a lock whoever holds it (an admin action) and tell waiters.
-- KEYS[1] lock hash; ARGV[1] release channel
-- Returns 1 if a lock was deleted, 0 if there was none.
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[1], '0')
  return 1
end
return 0
