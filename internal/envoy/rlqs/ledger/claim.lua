--[[ claim.lua ports internal/envoy/rlqs/ledger/ledger.go (claim) and memory.go (Memory.Claim, Memory.Release,
memDomain.put, memDomain.sweep): the RLQS ledger in Redis, one atomic call per Claim or Release.

KEYS[1]  the domain's hash, sluice:rlqs:{<first 16 hex of sha256(domain)>}: field = a bucket's subject, value =
         the packed entries of every instance on that bucket (packEntries); the field "" holds when the hash was
         last swept of expired entries (µs), as memDomain.swept does.
ARGV     'claim', instance, ttl (µs), then per claim 2 values: bucket, and its 8 amounts packed as little-endian
         doubles (AMOUNTS: rate, burst, demand, streams, wish, wishBurst, committed, committedBurst; redis.go's
         claimArgs writes them, integers in [0, 2^53)): no decimal text to parse.
         'release', instance.
Reply    claim: now (µs), then per claim the grant's rate, burst, reserved, reservedBurst, demand, streams.
         release: now (µs).
Time     Redis TIME, µs: one clock for every instance.
Errors   'SLUICE_ARGS …' for arguments redis.go never writes; 'SLUICE_CORRUPT …' for a field this code did not
         write. The key's PEXPIRE is at least ttl (rounded up to the ms, plus 1 ms) after every claim, never
         shortened: it outlives every entry. ]]

local mathMax, mathMin, toNumber, redisCall, structPack, structUnpack, stringByte, unpackArgs

-- bindLibrary binds the locals above (while a function library loads, Redis hides them).
local function bindLibrary()
  mathMax, mathMin, toNumber, redisCall = math.max, math.min, tonumber, redis.call
  structPack, structUnpack, stringByte, unpackArgs = struct.pack, struct.unpack, string.byte, unpack
end

-- An entry packs as its instance (length byte, bytes) and five little-endian doubles, exact below 2^53.
local ENTRY = '<Bc0ddddd'
local ENTRY_NUMBERS = 40 -- the bytes of its doubles

-- The most buckets one HSET or HDEL names; the most claims one call carries (redis.go's MaxClaims).
local WRITE_CHUNK = 1000
local MAX_CLAIMS = 1000

-- A claim's amounts pack as eight little-endian doubles.
local AMOUNTS = '<dddddddd'
local AMOUNTS_BYTES = 64

-- unpackEntries returns the entries a field holds, or raises SLUICE_CORRUPT: every entry's length checked before
-- it is read, so no read runs past the value.
local function unpackEntries(v)
  local es, pos, size = {}, 1, #v
  while pos <= size do
    local n = stringByte(v, pos)
    if n == 0 or pos + n + ENTRY_NUMBERS > size then
      error({err = 'SLUICE_CORRUPT a bucket\'s entries cannot be read'})
    end
    local inst, expires, reserved, reservedBurst, demand, streams, nxt = structUnpack(ENTRY, v, pos)
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

-- put ports memDomain.put: a bucket without entries has no field. The writes gather in w, which writeAll sends.
local function put(w, bucket, es)
  if #es == 0 then
    w.dels[#w.dels + 1] = bucket
    return
  end
  local sets = w.sets
  sets[#sets + 1], sets[#sets + 2] = bucket, packEntries(es)
end

-- writes returns an empty gathering of writes, for put.
local function writes()
  return {sets = {}, dels = {}}
end

-- writeAll sends the writes w gathered to key: one HSET and one HDEL per WRITE_CHUNK buckets (a call per bucket
-- costs Redis more than the bucket's whole computation; a sweep or a release may write every bucket of a domain,
-- more than Lua's stack holds as arguments).
local function writeAll(key, w)
  local sets, dels = w.sets, w.dels
  for i = 1, #sets, 2 * WRITE_CHUNK do
    redisCall('HSET', key, unpackArgs(sets, i, mathMin(i + 2 * WRITE_CHUNK - 1, #sets)))
  end
  for i = 1, #dels, WRITE_CHUNK do
    redisCall('HDEL', key, unpackArgs(dels, i, mathMin(i + WRITE_CHUNK - 1, #dels)))
  end
end

-- sweep ports memDomain.sweep: every bucket's expired entries dropped.
local function sweep(key, now)
  local w = writes()
  for _, b in ipairs(filterAll(key, function(e) return e.expires > now end)) do
    put(w, b[1], b[2])
  end
  w.sets[#w.sets + 1], w.sets[#w.sets + 2] = '', string.format('%.0f', now)
  writeAll(key, w)
end

-- number returns ARGV[i] as an integer in [0, 2^53), or raises SLUICE_ARGS.
local function number(args, i)
  local n = toNumber(args[i])
  if n == nil or n < 0 or n >= 9007199254740992 or n % 1 ~= 0 then
    error({err = 'SLUICE_ARGS argument ' .. i .. ' is no integer in [0, 2^53)'})
  end
  return n
end

-- whole reports whether n, a double, is an integer in [0, 2^53) (NaN is not).
local function whole(n)
  return n >= 0 and n < 9007199254740992 and n % 1 == 0
end

-- amounts returns the claim ARGV[i] packs (AMOUNTS), bucket ARGV[i - 1], or raises SLUICE_ARGS.
local function amounts(args, i)
  local v = args[i]
  if #v ~= AMOUNTS_BYTES then
    error({err = 'SLUICE_ARGS argument ' .. i .. ' is no 8 packed amounts'})
  end
  local rate, burst, demand, streams, wish, wishBurst, committed, committedBurst = structUnpack(AMOUNTS, v)
  if not (whole(rate) and whole(burst) and whole(demand) and whole(streams) and whole(wish) and whole(wishBurst)
      and whole(committed) and whole(committedBurst)) then
    error({err = 'SLUICE_ARGS argument ' .. i .. ' holds an amount that is no integer in [0, 2^53)'})
  end
  return {bucket = args[i - 1], rate = rate, burst = burst, demand = demand, streams = streams, wish = wish,
    wishBurst = wishBurst, committed = committed, committedBurst = committedBurst}
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
-- and every field read (one HMGET) before anything is written.
local function readClaims(key, args)
  local cs, entries, fields = {}, {}, {}
  for i = 4, #args, 2 do
    local c = amounts(args, i + 1)
    if c.bucket == '' then
      error({err = 'SLUICE_ARGS a bucket is never empty'})
    end
    if entries[c.bucket] == nil then
      entries[c.bucket] = false
      fields[#fields + 1] = c.bucket
    end
    cs[#cs + 1] = c
  end
  if #fields > 0 then
    local vs = redisCall('HMGET', key, unpackArgs(fields))
    for j, b in ipairs(fields) do
      entries[b] = vs[j] and unpackEntries(vs[j]) or {}
    end
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
  local w = writes()
  for _, c in ipairs(cs) do
    if entries[c.bucket] then
      put(w, c.bucket, entries[c.bucket])
      entries[c.bucket] = false
    end
  end
  writeAll(key, w)
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
  local key, instance, w = keys[1], args[2], writes()
  for _, b in ipairs(filterAll(key, function(e) return e.instance ~= instance end)) do
    put(w, b[1], b[2])
  end
  writeAll(key, w)
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
  if args[1] == 'claim' and (#args - 3) % 2 == 0 and #args <= 3 + 2 * MAX_CLAIMS then
    return claimAll(keys, args)
  elseif args[1] == 'release' and #args == 2 then
    return release(keys, args)
  end
  return redis.error_reply('SLUICE_ARGS want claim, instance, ttl and 2 values per claim (at most 1000), or release and instance')
end
