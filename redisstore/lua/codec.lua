--[[ codec.lua: the SLUICE_* error replies, integers read from and
written as strings, and the stored form of a fixed-size state. Go twin:
redisstore/codec.go, scriptError (which reads the error replies raise,
corrupt and read answer) and intArg (which writes the integer arguments
arg reads). The integers the script writes and reads back itself (int,
fmt, idx) and the stored form (encodeFields … decodeState) have no Go
side: Go neither writes nor reads them. ]]

-- raise aborts the decision with a SLUICE_* error reply (caught by the
-- pcall around main; nothing has been written when it is raised).
-- raise ports scriptError's other side: it writes the error reply scriptError reads.
local function raise(code, msg)
  error({sluice = code .. ' ' .. msg})
end

-- corrupt raises SLUICE_CORRUPT: key holds what this script never writes.
-- corrupt ports scriptError's other side: SLUICE_CORRUPT.
local function corrupt(key, msg)
  raise('SLUICE_CORRUPT', key .. ': ' .. msg)
end

-- read runs a reading command on key. A WRONGTYPE error means key holds
-- what this script never writes there: SLUICE_CORRUPT. Any other error
-- (NOPERM, …) aborts the script with its own code.
-- read ports scriptError's other side: a WRONGTYPE read answered as SLUICE_CORRUPT.
local function read(key, cmd, ...)
  local r = redisPcall(cmd, key, ...)
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
  if type(s) ~= 'string' or (s ~= '0' and not stringFind(s, '^%-?[1-9]%d*$')) then
    return nil
  end
  if #s >= 16 then -- compare long ones as strings: doubles round beyond 2^53
    local digits = s
    if stringByte(s, 1) == 45 then
      digits = string.sub(s, 2)
    end
    if #digits > 16 or (#digits == 16 and digits > '9007199254740992') then
      return nil
    end
  end
  return toNumber(s)
end

-- arg parses an integer argument, which redisstore.go writes with
-- strconv: any whole number of magnitude below 2^53, or nil.
-- arg ports intArg's other side: it reads the integers intArg writes.
local function arg(s)
  local n = toNumber(s)
  if n == nil or n % 1 ~= 0 or n >= MAX_EXACT or n <= -MAX_EXACT then
    return nil
  end
  return n
end

-- SMALL maps the decimals "0" to "255" to their integers: the counts
-- and costs most decisions send, read without a conversion; SMALL_TEXT
-- maps -1 to 255 to their decimals, the indexes most reads of a list or
-- a set name.
local SMALL, SMALL_TEXT = {}, {}
for i = -1, 255 do
  SMALL['' .. i], SMALL_TEXT[i] = i, '' .. i
end
SMALL['-1'] = nil

-- fmt writes an integer as int reads it. %d formats a C long (64 bits
-- here), exact for every integer the store writes (below 2^53), in about
-- half the time of %.0f.
local function fmt(n)
  return stringFormat('%d', n)
end

-- idx writes an index of a list or a set as a command takes it: a Lua
-- number passed to a command is written with %.17g, several times the
-- cost of a small integer's decimal.
local function idx(i)
  return SMALL_TEXT[i] or fmt(i)
end

-- A fixed-size state is kept as one string: the byte STATE_BINARY, then
-- its fields as little-endian IEEE doubles (exact for every integer below
-- 2^53), e.g. 41 bytes for GCRA's five — short enough for Redis to keep
-- value and object in one allocation. Older versions of this code kept
-- the fields as decimals joined by ':' (no such string starts with that
-- byte); decodeState still reads them, and the next write replaces them.
local STATE_BINARY = 1
local STATE_FORMAT = {[2] = '<Bdd', [3] = '<Bddd', [4] = '<Bdddd', [5] = '<Bddddd'}
local STATE_DECIMAL = {
  [2] = '^(%d+):(%d+)$',
  [3] = '^(%d+):(%d+):(%d+)$',
  [4] = '^(%d+):(%d+):(%d+):(%d+)$',
  [5] = '^(%d+):(%d+):(%d+):(%d+):(%d+)$',
}

-- encodeFields returns the stored form of the n fields a to e (those
-- after the nth are not written).
local function encodeFields(n, a, b, c, d, e)
  return structPack(STATE_FORMAT[n], STATE_BINARY, a, b, c, d, e)
end

-- encodeState returns the stored form of the n fields v.
local function encodeState(v, n)
  return encodeFields(n, v[1], v[2], v[3], v[4], v[5])
end

-- badField reports whether x, a field as stored, is no integer in
-- [0, 2^53]: NaN, an infinity, a fraction, a negative zero (encodeState
-- writes the integers the algorithms compute, and no arithmetic on them
-- yields −0).
local function badField(x)
  return not (x >= 0 and x <= MAX_EXACT and x % 1 == 0) or (x == 0 and 1 / x < 0)
end

-- fieldCorrupt raises SLUICE_CORRUPT for field i of key, x.
local function fieldCorrupt(key, i, x)
  local lowest = '0'
  if i == 1 then
    lowest = '-2^53'
  end
  corrupt(key, 'field ' .. i .. ' = ' .. stringFormat('%.17g', x) .. ': want an integer in [' .. lowest .. ', 2^53]')
end

-- decodeFields returns the n fields stored at key as raw, as values (0
-- after the nth). Anything encodeFields (or an older version) did not
-- write is corrupt: another length, a field that is not an integer in
-- [0, 2^53], the first in [-2^53, 2^53] (a token bucket's tokens go below
-- empty after a settle's debt; every algorithm's first field is held to
-- its own lower bound). What each algorithm can have written of such
-- integers is its own check (fixedWindowCorrupt, …).
local function decodeFields(key, raw, n)
  if stringByte(raw, 1) == STATE_BINARY and #raw == 1 + 8 * n then
    local _, a, b, c, d, e = structUnpack(STATE_FORMAT[n], raw)
    -- The first two fields, the most a state has, are badField written
    -- out: a call costs more than the test.
    if not (a >= -9007199254740992 and a <= MAX_EXACT and a % 1 == 0) or (a == 0 and 1 / a < 0) then
      fieldCorrupt(key, 1, a)
    elseif not (b >= 0 and b <= MAX_EXACT and b % 1 == 0) or (b == 0 and 1 / b < 0) then
      fieldCorrupt(key, 2, b)
    elseif n == 2 then
      return a, b, 0, 0, 0
    elseif badField(c) then
      fieldCorrupt(key, 3, c)
    end
    if n == 3 then
      return a, b, c, 0, 0
    elseif badField(d) then
      fieldCorrupt(key, 4, d)
    elseif n == 4 then
      return a, b, c, d, 0
    elseif badField(e) then
      fieldCorrupt(key, 5, e)
    end
    return a, b, c, d, e
  end
  local f = {string.match(raw, STATE_DECIMAL[n])}
  local v = {0, 0, 0, 0, 0}
  for i = 1, n do
    v[i] = int(f[i])
    if v[i] == nil then
      -- Only printable bytes go into the reply: Redis cuts it at a NUL.
      local shown = string.gsub(string.sub(raw, 1, 60), '[^%w%p ]', '?')
      corrupt(key, 'holds ' .. #raw .. ' bytes, ' .. shown .. ': want ' .. n .. ' integers >= 0')
    end
  end
  return v[1], v[2], v[3], v[4], v[5]
end

-- decodeState returns the n fields stored at key as raw, as an array of
-- five (0 after the nth): decodeFields.
local function decodeState(key, raw, n)
  local a, b, c, d, e = decodeFields(key, raw, n)
  return {a, b, c, d, e}
end
