-- Prepended to every script that issues fencing tokens: how a token is made, once.

-- A new fencing token for the lock whose fencing key is `fence`, from `clock` (TIME's
-- answer): the server clock in µs, or one above the last token when the clock is not
-- past it (it stepped back), so a lock's tokens only grow. Written to `fence` with the
-- expiry `...` ('PX', ms or 'PXAT', ms; none for no expiry). Returns the token as a
-- number (µs since 1970 are exact in Lua's numbers, below 2^53) and as the text to write
-- elsewhere: TIME's two answers joined, µs padded to six digits, which costs Redis a
-- tenth of the snprintf it runs for a number argument (Lua's tostring and `..` would
-- write 1.7e+15).
local function issue_token(fence, clock, ...)
  local token = clock[1] * 1000000 + clock[2]
  local text = clock[1] .. string.sub('000000', #clock[2] + 1) .. clock[2]
  -- SET .. GET writes it and reads the last one in one call; only a clock that stepped
  -- back needs the second write.
  local last = tonumber(redis.call('SET', fence, text, 'GET', ...))
  if last and last >= token then
    token = last + 1
    text = string.format('%.0f', token)
    redis.call('SET', fence, text, ...)
  end
  return token, text
end
