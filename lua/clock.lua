-- Prepended to the fair and read-write scripts (before their preludes): the server
-- clock, read once per call, and how large numbers are written.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
-- `now` as a call's argument, made from TIME's answer by joining strings: Redis writes a
-- number argument with snprintf('%.17g'), ~3,000 instructions each time (a read-write
-- release used to pay that ten times; `scripts/kind_cost.py`).
local now_text = clock[1] .. string.sub(string.sub('000000', #clock[2] + 1) .. clock[2], 1, 3)

-- %.0f: Lua's tostring would write large numbers as 1.7e+15; a third of what Redis pays
-- for a number argument.
local function int(n)
  return string.format('%.0f', n)
end
