--[[ batch.lua: several decisions in one call. Go twin:
redisstore/batch.go, allCmd (which writes what decideAll reads), and
redisstore/reply.go, spread (which reads what it answers). ]]

-- allRun takes the run of n decisions by spec sp whose keys follow key
-- ko (and, by a lease's spec, whose leases follow argument ao), at time
-- at, their replies in out after o: one pcall for the run (specRun), not
-- one per decision, and another from the decision after one that aborts.
-- It returns where the replies end, or nil and the error reply of a run
-- that failed before any decision of its own.
-- allRun ports spread's other side for a run by spec: the replies spread reads, compact or whole.
local function allRun(keys, ko, args, ao, n, sp, at, out, o)
  local done = {0} -- specRun's decision under way
  while done[1] < n do -- each pass ends at least one decision
    local from = done[1]
    local ok, last = pcall(specRun, keys, ko, args, ao, from, n, sp, at, out, o, done)
    if ok then
      o = last
    elseif done[1] == from then -- it failed before any decision of its own
      return nil, answer(ok, last)
    else -- decision done[1] aborted, its reply in its place
      ok, last = shortError(keys[ko + done[1]], last)
      o = #out + 1
      out[o] = answer(ok, last)
    end
  end
  return o
end

-- decideAll takes several decisions in one call, each as decide takes it
-- alone, in order. ARGV[1] is their number m (for readers of the call:
-- the heads say where each begins), ARGV[2] the number h of heads,
-- ARGV[3] the number s of specs (short.lua's specOf) and ARGV[4 .. 3 + s]
-- the specs; then the h heads: "-j" and a number n for a run of n
-- decisions (n >= 1) by spec j, short decisions on Redis time with one
-- key each and no arguments of their own but, by a lease's spec, the
-- lease; else one decision's number of
-- keys. KEYS holds the decisions' keys one after the other, and ARGV,
-- after the heads, the others' arguments likewise (a run by a lease's
-- spec: its n leases, in its place): LAYOUT.ARGV_POLICIES
-- plus LAYOUT.ARGV_PER_POLICY per policy each (no carried state: a
-- decision that carries some goes alone), or a short decision's
-- (FAST_ARGS). The reply is the time the Redis-time decisions shared (0
-- if none read it), then per decision its reply or error reply, except
-- that a decision by spec admitted with no retry answers two integers in
-- its place: remaining and resetAfter (reply.go's spread knows its
-- limit). A run is one pcall (specRun), not one per decision. The
-- library registers it beside decide (FCALL <name>_all).
-- decideAll ports allCmd and spread's other side: it reads the call allCmd writes and answers what spread reads.
local function decideAll(keys, args)
  if redisCall == nil then
    bindLibrary()
  end
  local m, h, s = arg(args[1]), arg(args[2]), arg(args[3])
  if m == nil or m < 1 or h == nil or h < 1 or s == nil or s < 0 or #args < 3 + s + h then
    return redis.error_reply('SLUICE_ARGS decideAll: want the number of decisions, of heads and of specs, the specs, then the heads')
  end
  local byRef, at = {}, nil
  for i = 1, s do
    local ok, sp = pcall(specOf, args[3 + i])
    if not ok then
      return answer(ok, sp)
    end
    byRef['-' .. i] = sp
  end
  local out, o = {0}, 1
  local ko, ao, hi = 0, 3 + s + h, 3 + s
  while hi < 3 + s + h do
    local head = args[hi + 1]
    local sp = byRef[head]
    if sp ~= nil then
      local n = SMALL[args[hi + 2]] or arg(args[hi + 2])
      if hi + 2 > 3 + s + h or n == nil or n < 1 or ko + n > #keys or (sp.leased and ao + n > #args) then
        return redis.error_reply('SLUICE_ARGS decideAll: the run of spec ' .. head .. ' names ' .. tostring(args[hi + 2]) .. ' decisions')
      end
      if at == nil then
        at = redisTime()
      end
      local failed
      o, failed = allRun(keys, ko, args, ao, n, sp, at, out, o)
      if o == nil then
        return failed
      end
      ko, hi = ko + n, hi + 2
      if sp.leased then
        ao = ao + n
      end
    else
      local nk = SMALL[head] or arg(head)
      if nk == nil or nk < 1 or ko + nk > #keys then
        return redis.error_reply('SLUICE_ARGS decideAll: head ' .. (hi - 2 - s) .. ' names ' .. tostring(head) .. ' keys')
      end
      local na = FAST_ARGS[args[ao + 1]]
      if na ~= nil and nk == 1 then
        if ao + na > #args then
          return redis.error_reply('SLUICE_ARGS decideAll: head ' .. (hi - 2 - s) .. ' wants ' .. na .. ' arguments')
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
      ko, ao, o, hi = ko + nk, ao + na, o + 1, hi + 1
    end
  end
  out[1] = at or 0
  return out
end
