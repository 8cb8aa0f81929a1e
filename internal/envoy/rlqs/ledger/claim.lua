--[[ claim.lua ports internal/envoy/rlqs/ledger/ledger.go (claim) and memory.go (Memory.Claim, Memory.Release,
memDomain.put, memDomain.sweep): the RLQS ledger in Redis, one atomic call per Claim or Release.

KEYS[1]  the domain's hash, sluice:rlqs:{<first 16 hex of sha256(domain)>}: field = a bucket's subject, value =
         the entries of every instance on that bucket (ENTRY, in MessagePack); the field "" holds when the hash was
         last swept of expired entries (µs), as memDomain.swept does.
ARGV     'claim', instance, ttl (µs), then per claim 2 values: bucket, and its 8 amounts packed as little-endian
         doubles (AMOUNTS: rate, burst, demand, streams, wish, wishBurst, committed, committedBurst; redis.go's
         claimArgs writes them, integers in [0, 2^53)): no decimal text to parse.
         'release', instance.
Reply    claim: now (µs), then per claim the grant's rate, burst, reserved, reservedBurst, demand, streams.
         release: now (µs).
Time     Redis TIME, µs: one clock for every instance.
Errors   'SLUICE_ARGS …' for arguments redis.go never writes; 'SLUICE_CORRUPT …' for a field this code did not
         write; 'SLUICE_FULL …' for a claim that would put a 1001st instance's entry on a bucket (nothing written). The key's PEXPIRE is at least ttl (rounded up to the ms, plus 1 ms) after every claim, never
         shortened: it outlives every entry. ]]

local mathMin, toNumber, redisCall, structPack, structUnpack, stringByte, stringRep, unpackArgs

-- bindLibrary binds the locals above (while a function library loads, Redis hides them).
local function bindLibrary()
  mathMin, toNumber, redisCall = math.min, tonumber, redis.call
  structPack, structUnpack, stringByte, stringRep, unpackArgs = struct.pack, struct.unpack, string.byte, string.rep, unpack
end

-- A bucket's entries are one flat array, ENTRY values an entry: instance, expires, reserved, reservedBurst, demand,
-- streams (the fields of ledger.go's entry, in order). A field holds them packed: their number k (2 bytes, little
-- endian), then each entry's instance (zero-terminated: redis.go's checkInstance refuses a NUL) and five
-- little-endian doubles (exact below 2^53) — entriesFormat(k), one struct call for the whole field either way.
local ENTRY = 6
local MAX_ENTRIES = 1000 -- a field's values go through Lua's stack (at most 8000) in one call
local MIN_ENTRY_BYTES = 42 -- an instance of one byte, its NUL, five doubles
local formats, countedFormats = {}, {}

-- entriesFormat returns the struct format of k entries, and of their count and them.
local function entriesFormat(k)
  local f = formats[k]
  if f == nil then
    f = stringRep('sddddd', k)
    formats[k], countedFormats[k] = '<' .. f, '<H' .. f
  end
  return formats[k], countedFormats[k]
end

-- The most buckets one HSET or HDEL names; the most claims one call carries (redis.go's MaxClaims).
local WRITE_CHUNK = 1000
local MAX_CLAIMS = 1000

-- A claim's amounts pack as eight little-endian doubles.
local AMOUNTS = '<dddddddd'
local AMOUNTS_BYTES = 64

-- decodeEntries returns the entries v holds, raising an error (any) unless v is k ≥ 1 whole entries, each of an
-- instance not empty, and nothing after them.
local function decodeEntries(v)
  local lo, hi = stringByte(v, 1, 2)
  local k = lo + 256 * hi
  if k > MAX_ENTRIES or k * MIN_ENTRY_BYTES > #v - 2 then
    error('not whole entries')
  end
  local es = {structUnpack(entriesFormat(k), v, 3)}
  local n = k * ENTRY
  if k == 0 or es[n + 1] ~= #v + 1 then
    error('not whole entries')
  end
  es[n + 1] = nil
  for i = 1, n, ENTRY do
    if es[i] == '' then
      error('an entry of no instance')
    end
  end
  return es
end

-- unpackEntries returns the entries a field holds, or raises SLUICE_CORRUPT.
local function unpackEntries(v)
  local ok, es = pcall(decodeEntries, v)
  if not ok then
    error({err = 'SLUICE_CORRUPT a bucket\'s entries cannot be read'})
  end
  return es
end

-- keepIf moves the entries of es that keep(es, i, a, b) accepts (i their first index) to its front, in order,
-- drops the rest and returns how many values are kept, as Go's kept := entries[:0] filters in place.
local function keepIf(es, keep, a, b)
  local n, size = 0, #es
  for i = 1, size, ENTRY do
    if keep(es, i, a, b) then
      if n + 1 ~= i then
        es[n + 1], es[n + 2], es[n + 3], es[n + 4], es[n + 5], es[n + 6] =
          es[i], es[i + 1], es[i + 2], es[i + 3], es[i + 4], es[i + 5]
      end
      n = n + ENTRY
    end
  end
  for i = size, n + 1, -1 do
    es[i] = nil
  end
  return n
end

-- The tests of keepIf: the entry at i of es is live at now; it is not instance's.
local function live(es, i, now)
  return es[i + 1] > now
end

local function notOf(es, i, instance)
  return es[i] ~= instance
end

-- claim ports claim: the grant of a Claim (its fields as arguments, from rate on: a table a claim costs Redis more
-- than its arithmetic) on the entries es of its bucket as they stand at now — the grant's rate, burst, reserved,
-- reservedBurst, demand and streams — and the entries to keep: es, filtered in place as Go's entries[:0]. min and
-- max are written out (a call each costs more than the rest).
local function claim(now, ttl, instance, es, cRate, cBurst, cDemand, cStreams, wish, wishBurst, committed,
    committedBurst)
  local othersRate, othersBurst, demand, streams, n, size = 0, 0, 0, 0, 0, #es
  for i = 1, size, ENTRY do
    if es[i + 1] > now and es[i] ~= instance then
      othersRate = othersRate + es[i + 2]
      othersBurst = othersBurst + es[i + 3]
      demand = demand + es[i + 4]
      streams = streams + es[i + 5]
      if n + 1 ~= i then
        es[n + 1], es[n + 2], es[n + 3], es[n + 4], es[n + 5], es[n + 6] =
          es[i], es[i + 1], es[i + 2], es[i + 3], es[i + 4], es[i + 5]
      end
      n = n + ENTRY
    end
  end
  for i = size, n + 1, -1 do
    es[i] = nil
  end
  local rate, burst = cRate - othersRate, cBurst - othersBurst
  if wish < rate then rate = wish end
  if rate < 0 then rate = 0 end
  if wishBurst < burst then burst = wishBurst end
  if burst < 0 then burst = 0 end
  local reserved, reservedBurst = rate, burst
  if committed > reserved then reserved = committed end
  if committedBurst > reservedBurst then reservedBurst = committedBurst end
  if cStreams > 0 or reserved > 0 or reservedBurst > 0 then
    es[n + 1], es[n + 2], es[n + 3], es[n + 4], es[n + 5], es[n + 6] =
      instance, now + ttl, reserved, reservedBurst, cDemand, cStreams
  end
  return rate, burst, reserved, reservedBurst, demand + cDemand, streams + cStreams
end

-- filterAll keeps, in every bucket of key, the entries keep(es, i, a) accepts: every field read before any is written.
local function filterAll(key, keep, a)
  local all, changed = redisCall('HGETALL', key), {}
  for i = 1, #all, 2 do
    if all[i] ~= '' then
      local es = unpackEntries(all[i + 1])
      local size = #es
      if keepIf(es, keep, a) < size then
        changed[#changed + 1] = {all[i], es}
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
  local k, sets = #es / ENTRY, w.sets
  if k > MAX_ENTRIES then
    error({err = 'SLUICE_FULL a bucket holds the entries of at most 1000 instances'})
  end
  local _, counted = entriesFormat(k)
  sets[#sets + 1], sets[#sets + 2] = bucket, structPack(counted, k, unpackArgs(es))
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
  for _, b in ipairs(filterAll(key, live, now)) do
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

-- amounts returns the 8 amounts ARGV[i] packs (AMOUNTS), or raises SLUICE_ARGS unless each is an integer in
-- [0, 2^53) (n % 1 == 0 is false for NaN and the infinities; the checks are written out, as in claim).
local function amounts(args, i)
  local v = args[i]
  if #v ~= AMOUNTS_BYTES then
    error({err = 'SLUICE_ARGS argument ' .. i .. ' is no 8 packed amounts'})
  end
  local a, b, c, d, e, f, g, h = structUnpack(AMOUNTS, v)
  local max = 9007199254740992
  if a < 0 or b < 0 or c < 0 or d < 0 or e < 0 or f < 0 or g < 0 or h < 0 or
      a >= max or b >= max or c >= max or d >= max or e >= max or f >= max or g >= max or h >= max or
      a % 1 ~= 0 or b % 1 ~= 0 or c % 1 ~= 0 or d % 1 ~= 0 or e % 1 ~= 0 or f % 1 ~= 0 or g % 1 ~= 0 or h % 1 ~= 0 then
    error({err = 'SLUICE_ARGS argument ' .. i .. ' holds an amount that is no integer in [0, 2^53)'})
  end
  return a, b, c, d, e, f, g, h
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

-- readEntries returns the entries of every bucket args's claims name, and those buckets in order, each once:
-- every field read (one HMGET) before anything is written.
local function readEntries(key, args)
  local entries, fields, nf = {}, {}, 0
  for i = 4, #args, 2 do
    local b = args[i]
    if b == '' then
      error({err = 'SLUICE_ARGS a bucket is never empty'})
    end
    if entries[b] == nil then
      entries[b] = false
      nf = nf + 1
      fields[nf] = b
    end
  end
  if nf > 0 then
    local vs = redisCall('HMGET', key, unpackArgs(fields))
    for j = 1, nf do
      local v = vs[j]
      entries[fields[j]] = v and unpackEntries(v) or {}
    end
  end
  return entries, fields
end

-- claimAll ports Memory.Claim: each claim in order (a bucket claimed twice sees its first claim's entries), every
-- claim computed before anything is written.
local function claimAll(keys, args)
  local key, instance, ttl, now = keys[1], args[2], number(args, 3), redisTime()
  local entries, fields = readEntries(key, args)
  local reply, n = {now}, 1
  for i = 4, #args, 2 do
    reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4], reply[n + 5], reply[n + 6] =
      claim(now, ttl, instance, entries[args[i]], amounts(args, i + 1))
    n = n + 6
  end
  local w = writes()
  for j = 1, #fields do
    put(w, fields[j], entries[fields[j]])
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
  for _, b in ipairs(filterAll(key, notOf, instance)) do
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
