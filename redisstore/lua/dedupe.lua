--[[ dedupe.lua: evaluation ids remembered, their decisions replayed.
Go twin: internal/engine/algorithm/dedupe.go, the DedupeLog memstore
keeps (LookupRecord: recordLookup, Lookup: dedupeLookup; Remember, with
Prune: dedupeRemember; RememberRecord: recordRemember), here in a sorted
set and a hash instead of a slice and an index. ]]

-- Evaluation ids: a sorted set (member: id, score: expiry in µs) and a hash
-- (id -> the reply's integers, comma-separated) per subject and first
-- policy, as algorithm.DedupeLog in memory.

-- ints parses raw, integers joined by ',' ('' for none), into a table
-- appended to out, or raises SLUICE_CORRUPT naming hkey.
-- ints ports DedupeLog.LookupRecord's reading of a record as Redis keeps it.
local function ints(hkey, raw, out)
  for x in string.gmatch(raw, '[^,]+') do
    local v = int(x)
    if v == nil then
      corrupt(hkey, 'a remembered reply holds ' .. string.sub(x, 1, 40) .. ': want integers')
    end
    out[#out + 1] = v
  end
  return out
end

-- recordLookup returns the decisions remembered for id (flat, the
-- replayed flag, here 1, first, held to recordCorrupt), the record's Extra
-- and its Others ('' for none), or nil when there are none or they
-- expired (score <= now).
-- recordLookup ports DedupeLog.LookupRecord.
local function recordLookup(zkey, hkey, id, now)
  for _, key in ipairs({zkey, hkey}) do
    if redisCall('PTTL', key) == -1 then
      corrupt(key, 'has no TTL')
    end
  end
  local score = read(zkey, 'ZSCORE', id)
  if not score then
    return nil
  end
  local exp = int(score)
  if exp == nil then
    corrupt(zkey, 'score of an id = ' .. tostring(score) .. ': want an integer')
  elseif exp <= now then
    return nil
  end
  local raw = read(hkey, 'HGET', id)
  if not raw then
    corrupt(hkey, 'holds no reply for a remembered id')
  end
  -- decisions|extra, and |others after a record of several policies
  local head, tail, others = string.match(raw, '^([^|]*)|([^|]*)|?(.*)$')
  if head == nil then
    head, tail, others = raw, '', ''
  end
  local vals = ints(hkey, head, {1})
  if (#vals - 1) % LAYOUT.REPLY_PER_POLICY ~= 0 then
    corrupt(hkey, 'a remembered reply holds ' .. (#vals - 1) .. ' integers')
  end
  local why = recordCorrupt(vals)
  if why ~= nil then
    corrupt(hkey, 'a remembered reply: ' .. why)
  end
  return vals, ints(hkey, tail, {}), others
end

-- dedupeLookup returns the decisions remembered for id (flat, as
-- evaluate keeps them: the replayed flag, here 1, first), or nil when
-- there are none or they expired (score <= now): recordLookup's, without
-- the record's Extra.
-- dedupeLookup ports DedupeLog.Lookup.
local function dedupeLookup(zkey, hkey, id, now)
  return (recordLookup(zkey, hkey, id, now))
end

-- hdel deletes fields from the hash at key, 1000 at a time: Lua's unpack
-- fails on a few thousand values, and up to 10000 ids may go at once.
local function hdel(key, fields)
  for i = 1, #fields, 1000 do
    redisCall('HDEL', key, unpack(fields, i, mathMin(i + 999, #fields)))
  end
end

-- dedupeRemember records reply for id until now + ttl, forgetting expired
-- ids and, beyond max, the oldest; the keys live until the newest record
-- expires, plus grace.
-- dedupeRemember ports DedupeLog.Remember, with its Prune.
local function dedupeRemember(zkey, hkey, id, now, ttl, max, grace, reply)
  local expired = redisCall('ZRANGEBYSCORE', zkey, '-inf', fmt(now))
  if #expired > 0 then
    redisCall('ZREMRANGEBYSCORE', zkey, '-inf', fmt(now))
    hdel(hkey, expired)
  end
  local vals = {}
  for i = 2, #reply do
    vals[i - 1] = fmt(reply[i])
  end
  redisCall('HSET', hkey, id, table.concat(vals, ','))
  redisCall('ZADD', zkey, fmt(now + ttl), id)
  local over = redisCall('ZCARD', zkey) - max
  if over > 0 then
    local oldest = redisCall('ZRANGE', zkey, 0, over - 1)
    redisCall('ZREMRANGEBYRANK', zkey, 0, over - 1)
    hdel(hkey, oldest)
  end
  local ms = fmt(ceilDiv(ttl + grace, 1000))
  redisCall('PEXPIRE', zkey, ms)
  redisCall('PEXPIRE', hkey, ms)
end

-- recordRemember records reply for id as dedupeRemember does, with extra
-- after '|' and, when not '', others after another.
-- recordRemember ports DedupeLog.RememberRecord.
local function recordRemember(zkey, hkey, id, now, ttl, max, grace, reply, extra, others)
  dedupeRemember(zkey, hkey, id, now, ttl, max, grace, reply)
  if (#extra > 0 or others ~= '') and redisCall('ZSCORE', zkey, id) then
    local vals, more = {}, {}
    for i = 2, #reply do
      vals[i - 1] = fmt(reply[i])
    end
    for i = 1, #extra do
      more[i] = fmt(extra[i])
    end
    local raw = table.concat(vals, ',') .. '|' .. table.concat(more, ',')
    if others ~= '' then
      raw = raw .. '|' .. others
    end
    redisCall('HSET', hkey, id, raw)
  end
end
