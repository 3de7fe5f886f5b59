-- Prepended to the fair and read-write scripts (before their preludes): the server
-- clock, read once per call, and how large numbers are written.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

-- %.0f: Lua's tostring would write large numbers as 1.7e+15.
local function int(n)
  return string.format('%.0f', n)
end
