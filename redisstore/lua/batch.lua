--[[ batch.lua: several decisions in one call. Go twin:
redisstore/batch.go, allCmd (which writes what decideAll reads) and
spread (which reads what it answers). ]]

-- decideAll takes several decisions in one call, each as decide takes it
-- alone, in order. ARGV[1] is their number m, ARGV[2] the number s of
-- specs (short.lua's specOf) and ARGV[3 .. 2 + s] the specs; then one head
-- per decision: "-j" for a short decision on Redis time by spec j, with
-- one key and no arguments of its own, else its number of keys. KEYS
-- holds the decisions' keys one after the other, and ARGV, after the
-- heads, the others' arguments likewise: LAYOUT.ARGV_POLICIES plus
-- LAYOUT.ARGV_PER_POLICY per policy each (no carried state: a decision that
-- carries some goes alone), or a short decision's (FAST_ARGS). The reply
-- is the time the Redis-time decisions shared (0 if none read it), then
-- per decision its reply or error reply, except that a decision by spec
-- admitted with no retry answers two integers in its place: remaining and
-- resetAfter (redisstore.go's spread knows its limit). The library
-- registers it beside decide (FCALL <name>_all).
-- decideAll ports allCmd and spread's other side: it reads the call allCmd writes and answers what spread reads.
local function decideAll(keys, args)
  if redisCall == nil then
    bindLibrary()
  end
  local m, s = arg(args[1]), arg(args[2])
  if m == nil or m < 1 or s == nil or s < 0 or #args < 2 + s + m then
    return redis.error_reply('SLUICE_ARGS decideAll: want the number of decisions and of specs, the specs, then each decision\'s head')
  end
  local byRef, at = {}, nil
  for i = 1, s do
    local ok, sp = pcall(specOf, args[2 + i])
    if not ok then
      return answer(ok, sp)
    end
    byRef['-' .. i] = sp
  end
  local out, o = {0}, 1
  local ko, ao = 0, 2 + s + m
  for j = 1, m do
    local head = args[2 + s + j]
    local sp = byRef[head]
    if sp ~= nil then
      if at == nil then
        at = redisTime()
      end
      local ok, allowed, limit, remaining, resetAfter, retryAfter
      if sp.floor then
        ok, allowed, limit, remaining, resetAfter, retryAfter = pcall(fixedWindowFloor, keys[ko + 1], sp.p, sp.cost, at)
      else
        ok, allowed, limit, remaining, resetAfter, retryAfter = pcall(specMain, keys[ko + 1], sp, at)
      end
      if not ok then
        ok, allowed = shortError(keys[ko + 1], allowed)
      end
      if not ok then
        out[o + 1], o = answer(ok, allowed), o + 1
      elseif allowed and retryAfter == 0 then
        out[o + 1], out[o + 2], o = remaining, resetAfter, o + 2
      else
        out[o + 1], o = {0, allowed and 1 or 0, limit, remaining, resetAfter, retryAfter, at}, o + 1
      end
      ko = ko + 1
    else
      local nk = SMALL[head] or arg(head)
      if nk == nil or nk < 1 or ko + nk > #keys then
        return redis.error_reply('SLUICE_ARGS decideAll: decision ' .. j .. ' names ' .. tostring(head) .. ' keys')
      end
      local na = FAST_ARGS[args[ao + 1]]
      if na ~= nil and nk == 1 then
        if ao + na > #args then
          return redis.error_reply('SLUICE_ARGS decideAll: decision ' .. j .. ' wants ' .. na .. ' arguments')
        end
        if at == nil and FAST_ON_REDIS[args[ao + 1]] then
          at = redisTime()
        end
        local ok, res = pcall(fastMain, keys[ko + 1], args, ao, at)
        if not ok then
          ok, res = shortError(keys[ko + 1], res)
        end
        out[o + 1] = answer(ok, res)
      else
        local n = nk
        if args[ao + LAYOUT.ARGV_ID] ~= '' then
          n = n - 2
        end
        na = LAYOUT.ARGV_POLICIES + LAYOUT.ARGV_PER_POLICY * n
        local A = {unpack(args, ao + 1, ao + na)}
        if at == nil and A[LAYOUT.ARGV_NOW] == '' then
          at = redisTime()
        end
        out[o + 1] = decide({unpack(keys, ko + 1, ko + nk)}, A, at)
      end
      ko, ao, o = ko + nk, ao + na, o + 1
    end
  end
  out[1] = at or 0
  return out
end
