-- Prepended to the fair and read-write scripts (before their preludes): the server
-- clock, read once per call, and how large numbers are written.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
-- `now` as a call's argument, made from TIME's answer by joining strings: Redis writes a
-- number argument with snprintf('%.17g'), ~3,000 instructions each time (a read-write
-- release used to pay that ten times; `scripts/kind_cost.py`).
local now_text = clock[1] .. string.sub(string.sub('000000', #clock[2] + 1) .. clock[2], 1, 3)

-- %d: Lua's tostring would write large numbers as 1.7e+15; '%d' costs Redis ~2,100
-- instructions, '%.0f' ~4,700 and a number argument's snprintf ~3,500.
local function int(n)
  return string.format('%d', n)
end
