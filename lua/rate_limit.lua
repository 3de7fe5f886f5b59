-- One rate decision for one key, under every policy of a limiter at once: GCRA on the
-- server's clock, charged to every policy or to none.
-- KEYS[i] policy i's bucket: its theoretical arrival time (TAT, server µs) as 16 digits,
--         then ':<spec>'; absent while the bucket is full. All KEYS share one hash tag.
-- ARGV[3i-2] µs this decision adds to policy i's TAT: cost × emission interval to charge,
--            0 to only look, negative to give back
-- ARGV[3i-1] the most debt (TAT - now, µs) policy i may find and still admit it: its
--            tolerance less the increment (for a look or a give-back, more than any)
-- ARGV[3i]   policy i's spec, '<emission interval µs>:<burst>', kept beside its TAT so
--            the inspector can tell what is left without the application's settings
-- Returns each policy's debt (µs until its bucket is full again) after the decision: a
-- number for one policy, else a table. Refused by any policy: nothing is written and
-- each debt is returned as -debt - 1.
-- Lean on purpose (every replica's every request runs it): the clock once, one GET per
-- policy, one SET per charged policy with its expiry, no table reply for one policy,
-- KEYS and ARGV looked up once.
local keys, argv = KEYS, ARGV
local n = #keys
local time = redis.call('TIME')
local now = time[1] * 1000000 + time[2]
local debts, refused = {}, false
for i = 1, n do
  local debt = 0
  local tat = redis.call('GET', keys[i])
  if tat then
    -- Fixed width: a TAT has 16 digits until the year 2286, so no pattern is needed.
    debt = string.sub(tat, 1, 16) - now
    if debt < 0 then
      debt = 0
    -- A full bucket (none stored) admits every cost a client sends: no need to look.
    elseif debt > tonumber(argv[3 * i - 1]) then
      refused = true
    end
  end
  debts[i] = debt
end
if refused then
  for i = 1, n do
    debts[i] = -debts[i] - 1
  end
else
  for i = 1, n do
    local increment = tonumber(argv[3 * i - 2])
    if increment ~= 0 then
      local debt = debts[i] + increment
      if debt > 0 then
        local tat = now + debt
        -- Expires at the first ms after its TAT, when the bucket is full again: an
        -- absolute time, so however late the SET reads the clock, never before it.
        -- Numbers go as text made by string.format: Redis would write a Lua number with
        -- '%.17g', which costs more.
        redis.call('SET', keys[i], string.format('%016d:%s', tat, argv[3 * i]),
          'PXAT', string.format('%d', math.floor(tat / 1000) + 1))
      else
        if debts[i] > 0 then
          redis.call('DEL', keys[i])
        end
        debt = 0
      end
      debts[i] = debt
    end
  end
end
if n == 1 then
  return debts[1]
end
return debts
