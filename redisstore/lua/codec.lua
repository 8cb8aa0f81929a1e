--[[ codec.lua: the script's own plumbing, with no Go twin: the SLUICE_*
error replies, and integers read from and written as strings. ]]

-- raise aborts the decision with a SLUICE_* error reply (caught by the
-- pcall around main; nothing has been written when it is raised).
local function raise(code, msg)
  error({sluice = code .. ' ' .. msg})
end

-- corrupt raises SLUICE_CORRUPT: key holds what this script never writes.
local function corrupt(key, msg)
  raise('SLUICE_CORRUPT', key .. ': ' .. msg)
end

-- read runs a reading command on key. A WRONGTYPE error means key holds
-- what this script never writes there: SLUICE_CORRUPT. Any other error
-- (NOPERM, …) aborts the script with its own code.
local function read(key, cmd, ...)
  local r = redis.pcall(cmd, key, ...)
  if type(r) == 'table' and r.err then
    if string.sub(r.err, 1, 9) == 'WRONGTYPE' then
      corrupt(key, 'holds another type (' .. cmd .. ': ' .. r.err .. ')')
    end
    error(r)
  end
  return r
end

-- int parses a decimal integer as Go's strconv.FormatInt writes it (no
-- sign on 0, no leading zeros) of magnitude at most 2^53, or returns nil:
-- for what the store reads back from Redis, where anything else is
-- corrupt.
local function int(s)
  if type(s) ~= 'string' or (s ~= '0' and not string.find(s, '^%-?[1-9]%d*$')) then
    return nil
  end
  if #s >= 16 then -- compare long ones as strings: doubles round beyond 2^53
    local digits = s
    if string.byte(s, 1) == 45 then
      digits = string.sub(s, 2)
    end
    if #digits > 16 or (#digits == 16 and digits > '9007199254740992') then
      return nil
    end
  end
  return tonumber(s)
end

-- arg parses an integer argument, which redisstore.go writes with
-- strconv: any whole number of magnitude below 2^53, or nil.
local function arg(s)
  local n = tonumber(s)
  if n == nil or n ~= math.floor(n) or n >= MAX_EXACT or n <= -MAX_EXACT then
    return nil
  end
  return n
end

-- fmt writes an integer as int reads it. %d formats a C long (64 bits
-- here), exact for every integer the store writes (below 2^53), in about
-- half the time of %.0f.
local function fmt(n)
  return string.format('%d', n)
end
