-- Which of the commands lockwarden needs may this user not run? Checked once at connect,
-- because a command refused in the middle of a script does not undo what the script
-- already wrote (a lock hash whose PEXPIRE was refused is held forever).
-- KEYS[1] a key of the client's key space (Redis has checked the user may access it)
-- ARGV[1] a channel of that space; ARGV[2..] each command with well-formed arguments,
--   words split by spaces, `K` standing for the key and `C` for the channel.
-- Returns the positions (1 for ARGV[2]) of the refused commands (or unknown to the
-- server), or false on a Redis without `redis.acl_check_cmd` (before 7.0).
if not redis.acl_check_cmd then
  return false
end
local refused = {}
for i = 2, #ARGV do
  local words = {}
  for word in string.gmatch(ARGV[i], '%S+') do
    if word == 'K' then
      word = KEYS[1]
    elseif word == 'C' then
      word = ARGV[1]
    end
    table.insert(words, word)
  end
  -- A command the server does not know (renamed away, as some hosts do with FUNCTION)
  -- makes acl_check_cmd raise: the user cannot run it either.
  local known, allowed = pcall(redis.acl_check_cmd, unpack(words))
  if not (known and allowed) then
    table.insert(refused, i - 1)
  end
end
return refused
