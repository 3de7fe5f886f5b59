-- Prepended to every script that issues fencing tokens: how a token is made, once.

-- A new fencing token for the lock whose fencing key is `fence`, from `clock` (TIME's
-- answer): the server clock in µs, or one above the last token when the clock is not
-- past it (it stepped back), so a lock's tokens only grow. Written to `fence` with the
-- expiry `...` ('PX', ms or 'PXAT', ms; none for no expiry) and returned in digits.
local function issue_token(fence, clock, ...)
  -- Seconds and zero-padded µs joined: about 1 µs of Redis CPU less than string.format
  -- of their sum. SET .. GET writes it and reads the last one in one call; only a clock
  -- that stepped back needs the second write.
  local token = clock[1] .. string.sub('00000' .. clock[2], -6)
  local last = tonumber(redis.call('SET', fence, token, 'GET', ...))
  if last and last >= tonumber(token) then
    -- %.0f: tostring would write 1.7e+15.
    token = string.format('%.0f', last + 1)
    redis.call('SET', fence, token, ...)
  end
  return token
end
