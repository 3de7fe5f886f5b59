-- The floor a rate decision is measured against: redis-cell's GCRA (its `CL.THROTTLE`),
-- written in Lua on the server's clock in µs, one key, no multi-policy charge.
-- KEYS[1] the key's TAT; ARGV: burst, count, period (s), quantity.
local burst = tonumber(ARGV[1])
local count = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local quantity = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local interval = period * 1000000 / count
local tolerance = interval * (burst + 1)
local increment = interval * quantity
local tat = redis.call('GET', KEYS[1])
if tat then tat = tonumber(tat) else tat = now end
local new_tat = math.max(tat, now) + increment
local diff = now - (new_tat - tolerance)
if diff < 0 then
  local retry = -1
  if increment <= tolerance then retry = -diff end
  local ttl = tat - now
  local next = tolerance - ttl
  local remaining = 0
  if next > -interval then remaining = math.floor(next / interval) end
  return {1, burst + 1, remaining, retry, ttl}
end
local ttl = new_tat - now
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil(ttl / 1000))
local next = tolerance - ttl
local remaining = 0
if next > -interval then remaining = math.floor(next / interval) end
return {0, burst + 1, remaining, -1, ttl}
