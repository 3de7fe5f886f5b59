-- Take or re-enter a lock in one step.
-- KEYS[1] lock hash (field = holder id, value = re-entry count)
-- KEYS[2] fencing key (the lock's last token, see token.lua)
-- KEYS[3] optional: the outcome key of a claim (see release.lua); when it exists the
--         work is done already and its outcome is returned instead of the lock
-- ARGV[1] holder id, ARGV[2] lease in ms, last: this call's id (see once.lua)
-- Returns, bare: the token taken (>= 0; 0 without fencing tokens), or -2 - pttl held by
-- another (-1: a hash without expiry, not one of ours); in a table: {2, token}
-- re-entered, {3, outcome} completed before, {1, token} taken by this very call before.
--
-- A waiter's mark: the fields `~w1` and `~w2` (no holder id begins with `~`), written by a
-- refused attempt of an acquisition that waits. A release sent as plain commands deletes
-- them with its holder's field (`HDEL <lock> <holder> ~w1 ~w2`) and sends the notice only
-- if it deleted them: its count says 1 released, 2 not held but marked, 3 both, which one
-- field could not. Every other release deletes the hash and always sends the notice.
--
-- It keeps once.lua's rules, and makes tokens as token.lua does, without their helpers:
-- each function a script defines is made again on every call, and those five cost a lock
-- cycle ~6,000 instructions, a tenth of it (`scripts/kind_cost.py`).

-- The call's id, as in once.lua (a cluster's variant reads it from the last argument).
local call = ''
-- Whether this lock's holds get fencing tokens. A client built without them runs a
-- variant in which this line reads `local fenced = false` (store/redis/scripts.rs): its
-- holds' token is 0 and the fencing key is not touched.
local fenced = true
-- Whether the holder was made for this acquisition (it held nothing before): then holding
-- the lock already means this very call ran before (one sent again after its connection
-- broke), not a re-entry. A holder the caller gave runs the variant in which this line
-- reads `local fresh = false`: a variant costs nothing, an argument ~1,500 instructions.
local fresh = true
-- Whether this is the first send of a fresh holder's attempt on one server: then the
-- holder cannot hold the lock yet (an earlier attempt of its acquisition that took it
-- would have ended the acquisition, one that got no answer made a new holder), and a
-- refused attempt skips looking for it. A send again after a broken connection runs the
-- variant in which this line reads `local first = false`, which looks.
local first = true
-- Whether an earlier attempt of this acquisition was refused, so that it waits: then a
-- refusal marks the lock, and its release sends the notice. Such attempts run the variants
-- in which this line reads `local waiting = true`; a first attempt (after which a waiter
-- subscribes and tries again before it sleeps) and a single try leave no mark.
local waiting = false
if KEYS[3] then
  local outcome = redis.call('GET', KEYS[3])
  if outcome then
    return {3, outcome}
  end
end
-- PTTL, not EXISTS: -2 says the lock is free, and a busy lock's answer needs it anyway.
-- A refused attempt is one call (two where the holder may hold it already): a waiter's
-- attempt before every handoff costs little, where a take that wrote first would have to
-- undo its write.
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then
  if call == '' then
    redis.call('HSET', KEYS[1], ARGV[1], '1')
  else
    redis.call('HSET', KEYS[1], ARGV[1], '1', ARGV[1] .. ':op', call)
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  -- Bare, not {1, token}: Redis writes a table reply with ~5,000 more instructions.
  if not fenced then
    return 0
  end
  -- token.lua's issue_token, written out (tests::acquire_issues_tokens_as_token_lua_does).
  local token = redis.call('INCR', KEYS[2])
  if token ~= 1 then
    return token
  end
  local clock = redis.call('TIME')
  token = redis.call('INCRBY', KEYS[2], clock[1] .. string.sub('000000', #clock[2] + 1) .. clock[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return token
end
if not first then
  -- The holder's count, and on a cluster the id of the last call that changed it.
  local count, last
  if call == '' then
    count = redis.call('HGET', KEYS[1], ARGV[1])
  else
    local held = redis.call('HMGET', KEYS[1], ARGV[1], ARGV[1] .. ':op')
    count, last = held[1], held[2]
  end
  if count then
    -- This very call ran before (a holder made for it holds nothing else; any other finds
    -- its own id): answered as then, counted once.
    if fresh or last == call then
      local state = (fresh or count == '1') and 1 or 2
      return {state, fenced and tonumber(redis.call('GET', KEYS[2])) or 0}
    end
    if call == '' then
      redis.call('HSET', KEYS[1], ARGV[1], tonumber(count) + 1)
    else
      redis.call('HSET', KEYS[1], ARGV[1], tonumber(count) + 1, ARGV[1] .. ':op', call)
    end
    -- A re-entry never shortens the hold: one with a short lease inside a longer (or
    -- watchdog) hold would otherwise let the lock expire under its outer holder.
    if ttl < tonumber(ARGV[2]) then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
      if fenced then
        redis.call('PEXPIRE', KEYS[2], ARGV[2])
      end
    end
    return {2, fenced and tonumber(redis.call('GET', KEYS[2])) or 0}
  end
end
-- Refused, bare (a busy answer is as common as a take on a hot lock). A waiter marks a
-- lock of ours (one with an expiry).
if waiting and ttl >= 0 then
  redis.call('HSET', KEYS[1], '~w1', '1', '~w2', '1')
end
return -2 - ttl
