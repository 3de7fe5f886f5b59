-- Prepended to every script that issues fencing tokens: how a token is made, once.

-- A new fencing token for the lock whose fencing key is `fence`: one above the lock's last
-- token (`INCR`, whose integer reply costs no parsing), or, when the key is missing (never
-- written, run out, or lost with its server), one above the server clock in µs, the key
-- then set to expire in `ms` (not given where the caller sets the key's expiry itself).
-- The key may run out (a take sets no expiry on it, which costs Redis a PEXPIRE): each
-- token costs Redis more than a µs to issue, so the clock is past every token issued since
-- the last seed and tokens still only grow (unless the clock stepped back while the key
-- was gone). Returns the token as a number: µs since 1970 are exact in Lua's numbers
-- (below 2^53); `int` writes it as text.
local function issue_token(fence, ms)
  local token = redis.call('INCR', fence)
  if token ~= 1 then
    return token
  end
  -- INCR made the missing key 1: add the clock in µs, TIME's two answers joined with the
  -- µs padded to six digits (text: no number to format). INCRBY, not SET, writes in place
  -- and answers an integer, no text to parse (a fresh key's cycle ~2 µs faster).
  local clock = redis.call('TIME')
  token = redis.call('INCRBY', fence, clock[1] .. string.sub('000000', #clock[2] + 1) .. clock[2])
  if ms then
    redis.call('PEXPIRE', fence, ms)
  end
  return token
end
