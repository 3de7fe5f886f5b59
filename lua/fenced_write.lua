-- Write a value guarded by fencing tokens: applied only if no larger token wrote it
-- before (the resource side of fencing: a holder paused past its lease, whose lock a
-- newer holder has taken since, is refused).
-- KEYS[1] the value: a hash with `token` (the newest token that wrote) and `value`
-- ARGV[1] the writer's fencing token, ARGV[2] the value
-- Returns {1} written, {0, newest} refused: `newest` is the larger token that wrote.
local newest = tonumber(redis.call('HGET', KEYS[1], 'token'))
if newest and newest > tonumber(ARGV[1]) then
  return {0, newest}
end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'value', ARGV[2])
return {1}
