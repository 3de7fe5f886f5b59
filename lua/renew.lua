-- Extend the lease of a lock this holder still holds; never creates a lock.
-- KEYS[1] lock hash, KEYS[2] fencing key; ARGV[1] holder id, ARGV[2] lease in ms
-- Returns 1 renewed, 0 not held by this holder (gone, expired or taken over).
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
return 0
