--[[ carry.lua: a key rotation's older state carried into a decision.
Go twin: internal/engine/algorithm/carry.go (live: Policy.Live, which
memstore runs too). carriedEntries and carryOver check and keep what
redisstore/redisstore.go's Store.previous read under the older subject
and sent: the I/O side, whose checks are Evaluate's corruption bounds
of any state read (records.lua). ]]

-- Key rotation: state read under an older subject of the same caller.

-- live reports whether st, the state of policy p, is there and not yet
-- equal to absent at now (Policy.Live).
-- live ports Policy.Live.
local function live(p, st, now)
  return st ~= nil and bounds(p, st) > now
end

-- carriedEntries returns the entries of a log or of leases carried in
-- ARGV as raw (a log's times, or leases' id,expiry pairs as ZRANGE
-- WITHSCORES reads them, ascending) for key: as ZADD or RPUSH arguments,
-- and the newest. Everything a decision could read of them is checked
-- first, as readState and the entry readers would once they are kept:
-- at most MOST_ENTRIES, integers >= 1, ascending, within (newest − 365 days,
-- newest].
local function carriedEntries(key, raw, kind)
  local out, member, prev, oldest = {}, nil, 0, nil
  local leases = kind == KIND_CONCURRENCY
  for x in string.gmatch(raw, '[^,]+') do
    if leases and member == nil then
      member = x
    else
      local v = int(x)
      if v == nil or v < prev or v < 1 then
        corrupt(key, 'carried entry ' .. string.sub(x, 1, 40) .. ': want ascending integers > 0')
      end
      out[#out + 1], prev, oldest = x, v, oldest or v
      if leases then
        out[#out + 1], member = member, nil
      end
    end
  end
  if member ~= nil then
    corrupt(key, 'carried leases: want id,expiry pairs')
  elseif #out > MOST_ENTRIES[kind] * (leases and 2 or 1) then
    corrupt(key, 'carried ' .. #out .. ' values: want at most ' .. MOST_ENTRIES[kind] .. ' entries')
  elseif oldest ~= nil and oldest <= prev - MAX_WINDOW then
    corrupt(key, 'carried entry ' .. fmt(oldest) .. ': want one in (newest - 365 days, newest], newest ' .. fmt(prev))
  end
  return out, prev
end

-- carryOver gives each policy of ev without a live state the state
-- carried in ARGV, if any: checked first (anything the store would not
-- have written is corrupt), then kept at its key with its TTL.
local function carryOver(KEYS, ARGV, ev, now)
  local n = #ev.policies
  local take = {}
  for i, p in ipairs(ev.policies) do
    local base = LAYOUT.ARGV_POLICIES + LAYOUT.ARGV_PER_POLICY * n + LAYOUT.CARRY_PER_POLICY * (i - 1)
    local raw, ttl = ARGV[base + 1], arg(ARGV[base + 2])
    if raw ~= '' and ttl ~= nil and ttl >= 1 and not live(p, ev.states[i], now) then
      local newest
      if p.kind == KIND_CONCURRENCY then
        local zadd, latest = carriedEntries(KEYS[i], raw, p.kind)
        take[i], newest = {leases = zadd, ttl = ttl}, latest - p.window
      elseif p.kind == KIND_SLIDING_LOG then
        local entries, latest = carriedEntries(KEYS[i], raw, p.kind)
        take[i], newest = {entries = entries, ttl = ttl}, latest
      else
        local a, b, c, d, e = decodeChecked(KEYS[i], raw, p.kind, now)
        local v = {a, b, c, d, e}
        take[i] = {v = v, ttl = ttl}
        local _, nw = bounds(p, v)
        newest = nw
      end
      if ARGV[LAYOUT.ARGV_NOW] == '' then
        ahead(KEYS[i], p, newest, now, 'carried state: ')
      end
    end
  end
  for i, p in ipairs(ev.policies) do
    local c = take[i]
    if c ~= nil and c.leases ~= nil then
      redisCall('DEL', KEYS[i])
      for j = 1, #c.leases, 1000 do
        redisCall('ZADD', KEYS[i], unpack(c.leases, j, mathMin(j + 999, #c.leases)))
      end
      redisCall('PEXPIRE', KEYS[i], fmt(c.ttl))
      ev.states[i] = readState(KEYS[i], p, now, false) -- checked as carried
    elseif c ~= nil and c.v ~= nil then
      redisCall('SET', KEYS[i], encodeState(c.v, FIELDS[p.kind]), 'PX', fmt(c.ttl))
      ev.states[i] = c.v
    elseif c ~= nil then
      redisCall('DEL', KEYS[i])
      for j = 1, #c.entries, 1000 do
        redisCall('RPUSH', KEYS[i], unpack(c.entries, j, mathMin(j + 999, #c.entries)))
      end
      redisCall('PEXPIRE', KEYS[i], fmt(c.ttl))
      ev.states[i] = readState(KEYS[i], p, now, false) -- checked as carried
    end
  end
end
