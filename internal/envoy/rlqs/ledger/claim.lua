--[[ claim.lua ports internal/envoy/rlqs/ledger/ledger.go (claim) and memory.go (Memory.Claim, Memory.Release,
memDomain.put, memDomain.sweep): the RLQS ledger in Redis, one atomic call per Claim or Release.

KEYS[1]  the domain's hash, sluice:rlqs:{<first 16 hex of sha256(domain)>}: field = a bucket's subject, value =
         the packed entries of every instance on that bucket (packEntries); the field "" holds when the hash was
         last swept of expired entries (µs), as memDomain.swept does.
ARGV     'claim', instance, ttl (µs), then per claim 9 values: bucket, rate, burst, demand, streams, wish,
         wishBurst, committed, committedBurst (redis.go's claimArgs writes them; integers in [0, 2^53)).
         'release', instance.
Reply    claim: now (µs), then per claim the grant's rate, burst, reserved, reservedBurst, demand, streams.
         release: now (µs).
Time     Redis TIME, µs: one clock for every instance.
Errors   'SLUICE_ARGS …' for arguments redis.go never writes; 'SLUICE_CORRUPT …' for a field this code did not
         write. The key's PEXPIRE is at least ttl (rounded up to the ms, plus 1 ms) after every claim, never
         shortened: it outlives every entry. ]]

local mathMax, mathMin, toNumber, redisCall, structPack, structUnpack

-- bindLibrary binds the locals above (while a function library loads, Redis hides them).
local function bindLibrary()
  mathMax, mathMin, toNumber, redisCall = math.max, math.min, tonumber, redis.call
  structPack, structUnpack = struct.pack, struct.unpack
end

-- An entry packs as its instance (length byte, bytes) and five little-endian doubles, exact below 2^53.
local ENTRY = '<Bc0ddddd'

-- unpackEntries returns the entries a field holds, or raises SLUICE_CORRUPT.
local function unpackEntries(v)
  local es, pos = {}, 1
  while pos <= #v do
    local ok, inst, expires, reserved, reservedBurst, demand, streams, nxt = pcall(structUnpack, ENTRY, v, pos)
    if not ok or inst == '' or nxt == nil then
      error({err = 'SLUICE_CORRUPT a bucket\'s entries cannot be read'})
    end
    es[#es + 1] = {instance = inst, expires = expires, reserved = reserved, reservedBurst = reservedBurst,
      demand = demand, streams = streams}
    pos = nxt
  end
  return es
end

-- packEntries returns the field value of es.
local function packEntries(es)
  local parts = {}
  for i, e in ipairs(es) do
    parts[i] = structPack(ENTRY, #e.instance, e.instance, e.expires, e.reserved, e.reservedBurst, e.demand, e.streams)
  end
  return table.concat(parts)
end

-- claim ports claim: the grant of c on the entries of its bucket as they stand at now, and the entries to keep.
local function claim(now, ttl, instance, c, entries)
  local g = {rate = 0, burst = 0, reserved = 0, reservedBurst = 0, demand = 0, streams = 0}
  local othersRate, othersBurst = 0, 0
  local kept = {}
  for _, e in ipairs(entries) do
    if e.expires > now and e.instance ~= instance then
      othersRate = othersRate + e.reserved
      othersBurst = othersBurst + e.reservedBurst
      g.demand = g.demand + e.demand
      g.streams = g.streams + e.streams
      kept[#kept + 1] = e
    end
  end
  g.rate = mathMax(0, mathMin(c.wish, c.rate - othersRate))
  g.burst = mathMax(0, mathMin(c.wishBurst, c.burst - othersBurst))
  g.reserved = mathMax(c.committed, g.rate)
  g.reservedBurst = mathMax(c.committedBurst, g.burst)
  g.demand = g.demand + c.demand
  g.streams = g.streams + c.streams
  if c.streams > 0 or g.reserved > 0 or g.reservedBurst > 0 then
    kept[#kept + 1] = {instance = instance, expires = now + ttl, reserved = g.reserved,
      reservedBurst = g.reservedBurst, demand = c.demand, streams = c.streams}
  end
  return g, kept
end

-- filterAll keeps, in every bucket of key, the entries keep accepts: every field read before any is written.
local function filterAll(key, keep)
  local all, changed = redisCall('HGETALL', key), {}
  for i = 1, #all, 2 do
    if all[i] ~= '' then
      local es, kept = unpackEntries(all[i + 1]), {}
      for _, e in ipairs(es) do
        if keep(e) then
          kept[#kept + 1] = e
        end
      end
      if #kept < #es then
        changed[#changed + 1] = {all[i], kept}
      end
    end
  end
  return changed
end

-- put ports memDomain.put: a bucket without entries has no field.
local function put(key, bucket, es)
  if #es == 0 then
    redisCall('HDEL', key, bucket)
    return
  end
  redisCall('HSET', key, bucket, packEntries(es))
end

-- sweep ports memDomain.sweep: every bucket's expired entries dropped.
local function sweep(key, now)
  for _, b in ipairs(filterAll(key, function(e) return e.expires > now end)) do
    put(key, b[1], b[2])
  end
  redisCall('HSET', key, '', string.format('%.0f', now))
end

-- number returns ARGV[i] as an integer in [0, 2^53), or raises SLUICE_ARGS.
local function number(args, i)
  local n = toNumber(args[i])
  if n == nil or n < 0 or n >= 9007199254740992 or n % 1 ~= 0 then
    error({err = 'SLUICE_ARGS argument ' .. i .. ' is no integer in [0, 2^53)'})
  end
  return n
end

-- redisTime returns the time of this call by Redis TIME, in µs.
local function redisTime()
  local t = redisCall('TIME')
  return toNumber(t[1]) * 1000000 + toNumber(t[2])
end

-- keepFor makes key outlive ttl µs from now, never shortening its life.
local function keepFor(key, ttl)
  local ms = math.ceil(ttl / 1000) + 1
  if redisCall('PTTL', key) < ms then
    redisCall('PEXPIRE', key, ms)
  end
end

-- readClaims returns the claims args carries and the entries of each bucket they name, every argument checked
-- and every field read before anything is written.
local function readClaims(key, args)
  local cs, entries = {}, {}
  for i = 4, #args, 9 do
    local c = {bucket = args[i], rate = number(args, i + 1), burst = number(args, i + 2), demand = number(args, i + 3),
      streams = number(args, i + 4), wish = number(args, i + 5), wishBurst = number(args, i + 6),
      committed = number(args, i + 7), committedBurst = number(args, i + 8)}
    if c.bucket == '' then
      error({err = 'SLUICE_ARGS a bucket is never empty'})
    end
    if entries[c.bucket] == nil then
      local v = redisCall('HGET', key, c.bucket)
      entries[c.bucket] = v and unpackEntries(v) or {}
    end
    cs[#cs + 1] = c
  end
  return cs, entries
end

-- claimAll ports Memory.Claim: each claim in order (a bucket claimed twice sees its first claim's entries).
local function claimAll(keys, args)
  local key, instance, ttl, now = keys[1], args[2], number(args, 3), redisTime()
  local cs, entries = readClaims(key, args)
  local reply = {now}
  for _, c in ipairs(cs) do
    local g
    g, entries[c.bucket] = claim(now, ttl, instance, c, entries[c.bucket])
    local n = #reply
    reply[n + 1], reply[n + 2], reply[n + 3] = g.rate, g.burst, g.reserved
    reply[n + 4], reply[n + 5], reply[n + 6] = g.reservedBurst, g.demand, g.streams
  end
  for _, c in ipairs(cs) do
    if entries[c.bucket] then
      put(key, c.bucket, entries[c.bucket])
      entries[c.bucket] = false
    end
  end
  local swept = toNumber(redisCall('HGET', key, '') or '')
  if swept == nil then
    redisCall('HSET', key, '', string.format('%.0f', now))
  elseif now - swept >= ttl then
    sweep(key, now)
  end
  keepFor(key, ttl)
  return reply
end

-- release ports Memory.Release: instance's entries of every bucket removed.
local function release(keys, args)
  local key, instance = keys[1], args[2]
  for _, b in ipairs(filterAll(key, function(e) return e.instance ~= instance end)) do
    put(key, b[1], b[2])
  end
  return {redisTime()}
end

-- ledger is the entry point: FCALL's function, or the script's body.
local function ledger(keys, args)
  if redisCall == nil then
    bindLibrary()
  end
  if #keys ~= 1 or args[2] == nil or args[2] == '' then
    return redis.error_reply('SLUICE_ARGS want one key, an operation and an instance')
  end
  if args[1] == 'claim' and (#args - 3) % 9 == 0 then
    return claimAll(keys, args)
  elseif args[1] == 'release' and #args == 2 then
    return release(keys, args)
  end
  return redis.error_reply('SLUICE_ARGS want claim, instance, ttl and 9 values per claim, or release and instance')
end
