-- A cheaper decision than lockwarden's, measured to show what its clock costs: no `TIME`;
-- the key's expiry is its TAT in ms (`PTTL` is the debt) and its value the sub-ms
-- slack, so "now" is the server's clock cut to the ms: a bucket that starts full again
-- starts up to 1 ms early (up to rate × 1 ms more admitted than GCRA allows), and a
-- debt reads up to 1 ms long. One key, one policy, nothing kept for an inspector.
-- KEYS[1] the key; ARGV[1] µs the decision adds; ARGV[2] the most debt (µs) it may find.
local ms = redis.call('PTTL', KEYS[1])
local debt = 0
if ms > 0 then
  debt = ms * 1000 - redis.call('GET', KEYS[1])
  if debt < 0 then debt = 0 end
end
if debt > tonumber(ARGV[2]) then
  return -debt - 1
end
debt = debt + ARGV[1]
local ceil = math.floor((debt + 999) / 1000)
redis.call('SET', KEYS[1], ceil * 1000 - debt, 'PX', ceil)
return debt
