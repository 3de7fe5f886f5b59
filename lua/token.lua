-- Prepended to every script that issues fencing tokens: how a token is made, once.

-- A new fencing token for the lock whose fencing key is `fence`, from `clock` (TIME's
-- answer): the server clock in µs, or one above the last token when the clock is not
-- past it (it stepped back), so a lock's tokens only grow. Written to `fence` with the
-- expiry `...` ('PX', ms or 'PXAT', ms; none for no expiry) and returned as a number.
-- µs since 1970 are exact in Lua's numbers (below 2^53), and `redis.call` writes a number
-- in full; `..` and tostring would write 1.7e+15, so a message takes `int(token)`
-- (clock.lua). Arithmetic, not strings: each string Lua makes is hashed and kept, which
-- cost Redis ~2,400 instructions a take (`scripts/script_cost.sh --instructions`).
local function issue_token(fence, clock, ...)
  local token = clock[1] * 1000000 + clock[2]
  -- SET .. GET writes it and reads the last one in one call; only a clock that stepped
  -- back needs the second write.
  local last = tonumber(redis.call('SET', fence, token, 'GET', ...))
  if last and last >= token then
    token = last + 1
    redis.call('SET', fence, token, ...)
  end
  return token
end
