-- Prepended to every script that changes a hold's count: each call counts once.
-- A cluster client sends a call again on a new connection when the old one broke before
-- the reply, so one call may run twice. A holder made for its acquisition tells that
-- apart by itself (holding the lock already means this very call ran). Any other call
-- on a cluster carries an id, kept beside the count it changed, in the field
-- `<count field>:op`, until the count changes again or goes: the second run finds its own
-- id there and only answers.

-- The call's id. One server and Sentinel never send a call twice: there the scripts go as
-- written, with none (''), and no field is written. On a cluster each goes in a variant
-- in which this line reads `local call = ARGV[#ARGV]` (store/redis/scripts.rs): a call
-- that changes a count then takes its id as its last argument ('' for a holder made for
-- its acquisition). An argument costs Redis ~1,450 instructions; one server saves it.
local call = ''

-- The field that remembers the last call that changed the count in `field`.
local function op_of(field)
  return field .. ':op'
end

-- Sets the count in `field` of `hash` to `n` (with `...`, more field-value pairs in the
-- same write), remembering the call `call` unless it is ''. A first count goes as the
-- string '1': Redis 7.0 writes a number argument with snprintf, ~2,300 instructions, 3 %
-- of a plain cycle (`scripts/script_cost.sh --instructions`).
local function set_count(hash, field, n, call, ...)
  if call == '' then
    redis.call('HSET', hash, field, n, ...)
  else
    redis.call('HSET', hash, field, n, op_of(field), call, ...)
  end
end

-- The count in `field` of `hash` (nil if none) and the id of the last call that changed
-- it. Where calls are never sent twice (`call` is '') no id is written, so the count
-- alone is read: one field, and no field name to make.
local function count_of(hash, field)
  if call == '' then
    return redis.call('HGET', hash, field), nil
  end
  local held = redis.call('HMGET', hash, field, op_of(field))
  return held[1], held[2]
end

-- The answer to a release whose holder holds nothing here: -2 if nobody took the lock
-- since the hold's token (`token`; '' when unknown), which `fence` still holds as the
-- lock's last one: this very release ran before, or the hold ran out with nobody after
-- it (a force unlock moves the token on). Else -1.
local function not_held(fence, token)
  if token ~= '' and redis.call('GET', fence) == token then
    return -2
  end
  return -1
end
