-- Prepended to every script that issues fencing tokens: how a token is made, once.

-- A new fencing token for the lock whose fencing key is `fence`: one above the lock's last
-- token (`INCR`, whose integer reply costs no parsing), or, when the key is missing (never
-- written, run out, or lost with its server), the server clock in µs, written with the
-- expiry `...` ('PX', ms or 'PXAT', ms; none for no expiry). The key may run out (a take
-- sets no expiry on it, which costs Redis a PEXPIRE): each token costs Redis more than a
-- µs to issue, so the clock is past every token issued since the last seed and tokens
-- still only grow (unless the clock stepped back while the key was gone). Returns the token as a number: µs since
-- 1970 are exact in Lua's numbers (below 2^53); `int` writes it as text.
local function issue_token(fence, ...)
  -- INCR makes a missing key 1: then TIME's two answers joined, µs padded to six digits,
  -- are the clock in µs as text, without a number to format.
  local token = redis.call('INCR', fence)
  if token ~= 1 then
    return token
  end
  local clock = redis.call('TIME')
  local text = clock[1] .. string.sub('000000', #clock[2] + 1) .. clock[2]
  redis.call('SET', fence, text, ...)
  return tonumber(text)
end
