-- Batches of decisions (and refunds), in groups: each group is the calls
-- on one set of buckets (a bucket, or a cascade's bucket and its
-- parent's) under one set of limits. Redis runs the script atomically, so
-- it reads, refills, decides and writes with nothing in between, whatever
-- the number of Sluice replicas. Groups are handled one after the other,
-- each reading its buckets as the groups before it left them. A group's
-- calls are decided in order, each all or nothing over every limit of
-- every bucket, each against the state the ones before it left, and its
-- buckets are written once at the end: this replica's concurrent
-- decisions cost one run, however many buckets they are on. The
-- arithmetic is backend/bucket's, step for step (Refill, Reconcile,
-- Decide, Refund); the Go side computes everything else (costs, TTLs,
-- waits) and a differential test holds the two equal.
--
-- Numbers are Lua doubles: every value stays below 2^53 (tokens below
-- 2^40 * 1000, times in epoch milliseconds), divisions are corrected to
-- exact integer quotients, and numbers are written with %d (or %.0f),
-- never with Lua's %.14g, which would round them, nor handed to Redis as
-- numbers, which Redis versions convert differently. Consumption, which
-- outgrows 2^53, is summed here while that is exact, and by Redis's own
-- 64-bit integers (HINCRBY) past it.
--
-- Cost per group in the common case (the limits unchanged since the
-- bucket was written): one HMGET, one HSET and one PEXPIRE per bucket.
-- A bucket's cfg field holds the fingerprint of the limits it was written
-- under; only when it differs are the stored rates read and the fields of
-- removed limits dropped.
--
-- Most of a script's time goes to Lua's own work rather than to the
-- commands (on a run of 16 buckets the three commands per bucket are
-- about half of it: BenchmarkScript), so that work is kept small: the sets of limits
-- ("layouts") come once per run, however many buckets share them, with
-- their field names and refill rates in lowest terms computed once; the
-- per-group scratch tables are made once per run and reused; numbers are
-- written with string.format's %d, which costs Redis less than %.0f or
-- tostring.
--
-- ARGV: now; the width (ms) of lease expiry windows; the number of
-- layouts, and per layout cfg (fingerprint of its limits), n, and n
-- times: name, amount, period, burst, debt (bucket.Limit.Debt: 0 for
-- one burst, -1 for none), and for a budget (bucket.Limit.Calendar) the
-- start of its period at now and of the period before (0 and 0 for a
-- rate) and its calendar (bucket.Limit.CalendarKey, "" for a rate): the
-- Go side does the calendar arithmetic, the script only compares
-- clocks with the starts; the number of groups, and per
-- group: the number of its keys, per key its layout (an index) and ttl
-- (ms; 0 keeps the bucket forever); then the number of its calls, and
-- per call mode ("d" decide, "r" refund, "l" decide for a replica with
-- leases, "c" charge and "m" charge for a replica with leases: a charge
-- takes its cost whatever the limit holds, down to the limit's floor,
-- bucket.Charge) and per key and limit its cost (for a refund, what it
-- gives back); a lease call ("l" or "m") then has, per key and limit, what its lease gives
-- back before the decision, the grant it asks for after it, and its
-- report: what the bucket counts out for the lease, what of its tokens
-- the lease keeps, the window they are out in, and the window of the
-- new lease. Every amount in millitokens, every time in milliseconds.
-- KEYS: every group's keys, in order.
--
-- Reply, per group: "ok", then per call allowed (1 or 0) and per key and
-- limit the tokens and clock after it, as integers, and for a lease call
-- then per key and limit the grant it took, the consumed total after it,
-- what the burst cut off what it gave back, what of its tokens the lease
-- kept out, and what every lease of the bucket holds after it, and for a
-- charge then per key and limit whether it held the cost (1 or 0); or, when
-- a key of the group holds something other than a hash, Redis's error,
-- and the group changes nothing (the other groups go on).
-- Tokens out on lease count against the burst (bucket.State.Out): a
-- limit's field ol lists them by expiry window, refill stops at the
-- burst less their sum, and a window is freed a margin after it ends.
-- A lease's grant leaves the bucket like an admission: it counts in the
-- consumed total when it is taken, and what comes back adds to the
-- tokens, never to that total.

local rcall, rpcall = redis.call, redis.pcall
local ARGV, KEYS = ARGV, KEYS
local num, floor, fmod, format, match, unpack = tonumber, math.floor, math.fmod, string.format, string.match, unpack

local function fdiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function cdiv(a, b)
  if a <= 0 then return 0 end
  local q = fdiv(a, b)
  if q * b < a then q = q + 1 end
  return q
end

local function gcd(a, b)
  while b ~= 0 do
    a, b = b, fmod(a, b)
  end
  return a
end

-- bucket.Refill, at a rate of da millitokens every dt ms (amount / period
-- in lowest terms; da is 0 for an amount of 0), up to burst less what
-- leases hold (bucket.Room; burst here is that room).
local function refill(dt, da, burst, tk, rf, now)
  if tk >= burst then
    if rf > now then return burst, rf end
    return burst, now
  end
  if rf > now or da == 0 then return tk, rf end
  local steps = fdiv(now - rf, dt)
  if steps >= cdiv(burst - tk, da) then return burst, now end
  return tk + steps * da, rf + steps * dt
end

local function lowest(amount, period)
  if amount == 0 then return period, 0 end
  local g = gcd(amount, period)
  return period / g, amount / g
end

-- int writes a count or time, known to be below 2^53; str any number.
local function int(n) return format('%d', n) end
local function str(n) return format('%.0f', n) end
local exact = 9007199254740992 -- 2^53

local reply, nr = {}, 0
-- Per group, reused: the buckets' keys, layouts, ttls, first limits and
-- staleness; per limit its layout entry, state and what calls spent.
local bkey, blay, bttl, bfirst, bstale = {}, {}, {}, {}, {}
local lims, tks, rfs, tcs, spent, costs, grants, cuts = {}, {}, {}, {}, {}, {}, {}, {}
-- Per limit, its leases out (bucket.State.Out): a flat list of window,
-- tokens pairs, their sum, whether they changed, and what a lease call
-- kept out of what it reported.
local outs, outsum, outdirty, kepts, expd = {}, {}, {}, {}, {}
-- Per limit, whether it held the cost of the call in hand.
local helds = {}
local set = {}

-- bucket.Refill's start of a budget's period (budget.go): a state
-- clocked before the period's start ps is given the budget again (twice
-- when clocked before the previous period's, pps), up to the budget, its
-- clock moves to now, and what its leases held is dropped: they ended
-- before the boundary.
local function budgetReset(amount, burst, ps, pps, tk, rf, now, j)
  if rf >= ps then return tk, rf end
  local given = amount
  if rf < pps then given = 2 * amount end
  tk = tk + given
  if tk > burst then tk = burst end
  if #outs[j] > 0 then outs[j], outsum[j], outdirty[j] = {}, 0, true end
  return tk, now
end

-- take moves amount out of limit j's bucket (of the group in hand),
-- counted as consumed.
local function take(j, amount)
  tks[j] = tks[j] - amount
  local cj = costs[j]
  if cj then
    cj[#cj + 1] = amount
  elseif spent[j] + amount < exact then
    spent[j] = spent[j] + amount
  else
    costs[j] = {spent[j], amount}
  end
end

-- charge takes cost out of limit j's bucket whatever it holds, down to
-- its floor, and counts the whole cost as consumed (bucket.Charge).
local function charge(j, cost)
  local tk = tks[j]
  -- bucket.Bottom: the floor less what leases hold.
  local left, low = tk - cost, lims[j].floor - outsum[j]
  if tk < low then low = tk end
  if left < low then left = low end
  take(j, cost)
  tks[j] = left
end

-- give puts amount back into limit j's bucket, never above its burst
-- less what its leases hold, and returns what that cut off.
local function give(j, amount, now)
  local burst = lims[j].burst - outsum[j]
  if burst < 0 then burst = 0 end
  local tk, cut = tks[j] + amount, 0
  if tk >= burst then tk, rfs[j], cut = burst, now, tk - burst end
  tks[j] = tk
  return cut
end

-- readOut parses limit j's leases out (field ol: "window:tokens,...").
local function readOut(j, s)
  local o, sum = {}, 0
  if s then
    for w, t in string.gmatch(s, '(%d+):(%d+)') do
      o[#o + 1] = num(w); o[#o + 1] = num(t); sum = sum + num(t)
    end
  end
  outs[j], outsum[j], outdirty[j] = o, sum, false
end

-- expire frees limit j's windows that ended (window * width) more than
-- the margin before now (bucket.Expire). It runs after the refill, so
-- that the room it makes refills from now on. The windows it frees are
-- kept aside (expd) for this run's reports: a lease stops being spent
-- when it expires, so what its holder reports unspent comes back while
-- its window was still in the bucket.
local function expire(j, width, now)
  local o, keep, sum, gone = outs[j], {}, 0, {}
  for i = 1, #o, 2 do
    if o[i] * width + 2000 < now then -- 2000: bucket.ExpiryMargin
      outdirty[j] = true
      gone[#gone + 1] = o[i]; gone[#gone + 1] = o[i + 1]
    else
      keep[#keep + 1] = o[i]; keep[#keep + 1] = o[i + 1]; sum = sum + o[i + 1]
    end
  end
  outs[j], outsum[j], expd[j] = keep, sum, gone
end

-- reportIn takes out tokens of window win out of the list o of limit j,
-- when o has them, and gives back of them back to the bucket. live: o is
-- the limit's leases out (not windows freed in this run, whose room is
-- back already).
local function reportIn(o, j, win, out, back, now, live)
  for i = 1, #o, 2 do
    if o[i] == win and o[i + 1] >= out then
      o[i + 1] = o[i + 1] - out
      if live then
        if o[i + 1] == 0 then table.remove(o, i + 1); table.remove(o, i) end
        outsum[j] = outsum[j] - out
        outdirty[j] = true
      end
      if back > 0 then
        if back > out then back = out end
        cuts[j] = give(j, back, now)
      end
      return true
    end
  end
  return false
end

-- report takes a lease's report off limit j (bucket.Return): of out
-- tokens it had out in window win, back come back to the bucket. It
-- returns false when neither the leases out nor the windows this run
-- freed hold out in window win: it was freed earlier, and the tokens
-- with it.
local function report(j, win, out, back, now)
  if out <= 0 then return back <= 0 end
  return reportIn(outs[j], j, win, out, back, now, true) or reportIn(expd[j], j, win, out, back, now, false)
end

-- lend counts amount out on lease in window win (bucket.Lend), when a
-- slot is free for it.
local function lend(j, win, amount)
  if amount <= 0 then return true end
  local o = outs[j]
  for i = 1, #o, 2 do
    if o[i] == win then
      o[i + 1] = o[i + 1] + amount
      outsum[j] = outsum[j] + amount; outdirty[j] = true
      return true
    end
  end
  if #o >= 10 then return false end
  o[#o + 1] = win; o[#o + 1] = amount
  outsum[j] = outsum[j] + amount; outdirty[j] = true
  return true
end

local function writeOut(j)
  local o, parts = outs[j], {}
  for i = 1, #o, 2 do parts[#parts + 1] = int(o[i]) .. ':' .. int(o[i + 1]) end
  return table.concat(parts, ',')
end

-- consumedNow is limit j's consumed total with what the group took so
-- far (approximate past 2^53, for a rate).
local function consumedNow(j)
  local tc = num(tcs[j] and match(tcs[j], '^%d+$') or 0)
  if costs[j] then
    for _, c in ipairs(costs[j]) do tc = tc + c end
  else
    tc = tc + spent[j]
  end
  if tc >= exact then tc = exact - 1 end
  return tc
end

-- group decides one group's calls, from ARGV[at] and KEYS[key] on, into
-- reply, and returns where the next group starts.
local function group(now, width, layouts, at, key)
  local nb, n = num(ARGV[at]), 0
  for k = 1, nb do
    local lay = layouts[num(ARGV[at + 2 * k - 1])]
    bkey[k], blay[k], bttl[k], bfirst[k] = KEYS[key], lay, ARGV[at + 2 * k], n
    local ls = lay.limits
    for i = 1, #ls do lims[n + i] = ls[i] end
    n = n + #ls
    key = key + 1
  end
  at = at + 1 + 2 * nb
  local ncalls = num(ARGV[at])
  local calls = at + 1
  local nextGroup = calls
  for _ = 1, ncalls do
    local m = ARGV[nextGroup]
    if m == 'l' or m == 'm' then
      nextGroup = nextGroup + 1 + 7 * n
    else
      nextGroup = nextGroup + 1 + n
    end
  end

  -- Read and bring every limit to now: bucket.Reconcile (a kept limit
  -- refilled at its stored rate; a new one full), then bucket.Refill at
  -- the limit's rate, which caps a kept limit at its new burst. Under
  -- unchanged limits the two refills are one.
  for k = 1, nb do
    local lay, bk = blay[k], bkey[k]
    local st = rpcall('HMGET', bk, unpack(lay.fields))
    if st.err then
      nr = nr + 1; reply[nr] = st.err
      return nextGroup, key
    end
    local stale = st[1] ~= lay.cfg
    bstale[k] = stale
    local rates
    if stale and st[1] then
      rates = rcall('HMGET', bk, unpack(lay.rates))
    end
    local ls, first = lay.limits, bfirst[k]
    for i = 1, #ls do
      local l, j = ls[i], first + i
      local tk, rf = num(st[4 * i - 2]), num(st[4 * i - 1])
      tcs[j] = st[4 * i]
      readOut(j, tk and rf and st[4 * i + 1])
      if tk and rf and stale then
        local ra, rp, bx, pd
        if rates then ra, rp, bx, pd = num(rates[4 * i - 3]), num(rates[4 * i - 2]), num(rates[4 * i - 1]), rates[4 * i] end
        if ra and rp and bx then
          local room = bx - outsum[j]
          if room < 0 then room = 0 end
          if pd and pd ~= '' then
            -- A budget (bucket.Reconcile): under the same calendar it
            -- starts its period as it was and keeps what was used of
            -- it; under another, or as a rate, it keeps what it holds.
            if pd == l.cal then
              tk, rf = budgetReset(ra, bx, l.ps, l.pps, tk, rf, now, j)
              room = bx - outsum[j]
              if room < 0 then room = 0 end
              if tk > room then tk = room end
              tk = tk + l.amount - ra
            elseif rf < now then
              rf = now
            end
          else
            local dt, da = lowest(ra, rp)
            tk, rf = refill(dt, da, room, tk, rf, now)
            if l.cal ~= '' and rf < now then rf = now end
          end
          -- bucket.Reconcile: a debt the new limit does not allow is
          -- forgiven.
          if tk < l.floor - outsum[j] then tk = l.floor - outsum[j] end
        else
          tk = nil
          readOut(j, nil)
        end
      end
      if tk and rf and l.ps > 0 then
        tk, rf = budgetReset(l.amount, l.burst, l.ps, l.pps, tk, rf, now, j)
      end
      local room = l.burst - outsum[j]
      if room < 0 then room = 0 end
      if tk and rf then
        tks[j], rfs[j] = refill(l.dt, l.da, room, tk, rf, now)
      else
        tks[j], rfs[j] = room, now
      end
      expire(j, width, now)
    end
  end

  -- The calls, in order. A denial, and a check that costs nothing, change
  -- nothing: refill is exact, so what is not written is credited again
  -- later, and a group of nothing else writes nothing. Each limit sums
  -- what the allowed calls spent while the sum is exact; past 2^53 it
  -- keeps every cost for Redis to add (costs[j]).
  nr = nr + 1; reply[nr] = 'ok'
  local write = false
  for j = 1, n do spent[j] = 0; costs[j] = false end
  for j = 1, n do if outdirty[j] then write = true end end
  at = calls
  for _ = 1, ncalls do
    local allowed, mode = true, ARGV[at]
    local leased, charged = mode == 'l' or mode == 'm', mode == 'c' or mode == 'm'
    if mode == 'r' then
      write = true
      for j = 1, n do give(j, num(ARGV[at + j]), now) end
    else
      if leased then
        -- A lease call: the report on the replica's lease goes in first
        -- (what it gives back, the decision may spend), then the cost is
        -- decided, then the grant, in whole tokens, from what the bucket
        -- holds, out on lease with what the lease kept.
        for j = 1, n do
          local back, out = num(ARGV[at + n + j]), num(ARGV[at + 3 * n + j])
          local win = num(ARGV[at + 5 * n + j])
          cuts[j], kepts[j] = 0, num(ARGV[at + 4 * n + j])
          if out > 0 or back > 0 then write = true end
          if not report(j, win, out, back, now) then
            -- Its window was freed: nothing it held is covered any more.
            cuts[j], kepts[j] = back, 0
          end
        end
      end
      -- At or below zero a limit denies even a check (bucket.Decide).
      -- A charge says which limits held their cost (helds).
      for j = 1, n do
        local held = tks[j] >= num(ARGV[at + j]) and tks[j] > 0
        if not held then allowed = false end
        helds[j] = held
        if not held and not charged then break end
      end
      if allowed or charged then
        for j = 1, n do
          local cost = num(ARGV[at + j])
          if cost > 0 then
            write = true
            if charged then charge(j, cost) else take(j, cost) end
          end
        end
      end
      if leased then
        for j = 1, n do
          local g, want = 0, num(ARGV[at + 2 * n + j])
          local win = num(ARGV[at + 6 * n + j])
          if (allowed or charged) and want > 0 and tks[j] >= 1000 then
            g = tks[j] - fmod(tks[j], 1000)
            if want < g then g = want end
          end
          if lend(j, win, g + kepts[j]) then
            if g > 0 then write = true; take(j, g) end
          else
            g, kepts[j] = 0, 0
          end
          grants[j] = g
        end
      end
    end
    -- Numbers: Redis answers them as integers, exact below 2^53.
    nr = nr + 1; reply[nr] = allowed and 1 or 0
    for j = 1, n do
      reply[nr + 1] = tks[j]; reply[nr + 2] = rfs[j]
      nr = nr + 2
    end
    if leased then
      -- Then per limit the grant, the consumed total after it (for
      -- the fleet's demand; approximate past 2^53), what the burst
      -- cut off what the lease gave back, what of its tokens the lease
      -- kept out, and what the fleet's leases hold after it.
      for j = 1, n do
        reply[nr + 1] = grants[j]; reply[nr + 2] = consumedNow(j); reply[nr + 3] = cuts[j]
        reply[nr + 4] = kepts[j]; reply[nr + 5] = outsum[j]
        nr = nr + 5
      end
      at = at + 1 + 7 * n
    else
      at = at + 1 + n
    end
    if charged then
      -- Then per limit whether it held the charge (1 or 0).
      for j = 1, n do reply[nr + j] = helds[j] and 1 or 0 end
      nr = nr + n
    end
  end
  if not write then
    return nextGroup, key
  end

  for k = 1, nb do
    local lay, bk, stale = blay[k], bkey[k], bstale[k]
    local m = 0
    if stale then
      -- The limits changed: drop the fields of those removed.
      for _, f in ipairs(rcall('HKEYS', bk)) do
        local prefix = match(f, '^(b_.*_)%a%a$')
        if prefix and not lay.keep[prefix] then rcall('HDEL', bk, f) end
      end
      set[1], set[2], m = 'cfg', lay.cfg, 2
    end
    local slow = false
    local ls, first = lay.limits, bfirst[k]
    for i = 1, #ls do
      local l, j = ls[i], first + i
      set[m + 1] = l.tk; set[m + 2] = int(tks[j])
      set[m + 3] = l.rf; set[m + 4] = int(rfs[j])
      m = m + 4
      if outdirty[j] then
        set[m + 1] = l.ol; set[m + 2] = writeOut(j)
        m = m + 2
      end
      if stale then
        set[m + 1] = l.f .. 'cp'; set[m + 2] = l.amountArg
        set[m + 3] = l.f .. 'ra'; set[m + 4] = l.amountArg
        set[m + 5] = l.f .. 'rp'; set[m + 6] = l.periodArg
        set[m + 7] = l.f .. 'bx'; set[m + 8] = l.burstArg
        m = m + 8
        if l.debtArg ~= '0' then
          set[m + 1] = l.f .. 'db'; set[m + 2] = l.debtArg
          m = m + 2
        else
          rcall('HDEL', bk, l.f .. 'db')
        end
        if l.cal ~= '' then
          set[m + 1] = l.f .. 'pd'; set[m + 2] = l.cal
          m = m + 2
        else
          rcall('HDEL', bk, l.f .. 'pd')
        end
      end
      if spent[j] > 0 and not costs[j] then
        -- The consumed total, exact as a double below 2^53; past it (or
        -- when the stored one is not a plain count), Redis adds.
        local tc = 0
        local s = tcs[j]
        if s then tc = match(s, '^%d+$') and num(s) end
        if tc and tc + spent[j] < exact then
          set[m + 1] = l.tc; set[m + 2] = int(tc + spent[j])
          m = m + 2
        else
          costs[j] = {spent[j]}
        end
      end
      slow = slow or costs[j]
    end
    rcall('HSET', bk, unpack(set, 1, m))
    if slow then
      for i = 1, #ls do
        -- Each cost on its own: a batch's sum may pass 2^63 where one
        -- cost does not. At 2^63 the count saturates, as bucket.Decide's
        -- does (HINCRBY refuses the overflow before it changes
        -- anything); a damaged count starts again rather than fail every
        -- decision.
        for _, cost in ipairs(costs[first + i] or {}) do
          local r = rpcall('HINCRBY', bk, ls[i].tc, str(cost))
          if type(r) == 'table' and r.err then
            local tc = str(cost)
            if string.find(r.err, 'overflow') then tc = '9223372036854775807' end
            rcall('HSET', bk, ls[i].tc, tc)
          end
        end
      end
    end
    local ttl = bttl[k]
    if ttl ~= '0' then
      rcall('PEXPIRE', bk, ttl)
    else
      rcall('PERSIST', bk)
    end
  end
  return nextGroup, key
end

-- The layouts, each with the fields a read fetches (cfg, then per limit
-- tk, rf, tc, ol), those of its stored rates, and its limits' field
-- prefixes.
local now, width = num(ARGV[1]), num(ARGV[2])
local layouts, at = {}, 4
for li = 1, num(ARGV[3]) do
  local lay = {cfg = ARGV[at], limits = {}, fields = {'cfg'}, rates = {}, keep = {}}
  at = at + 2
  for i = 1, num(ARGV[at - 1]) do
    local f = 'b_' .. ARGV[at] .. '_'
    local amount, period = num(ARGV[at + 1]), num(ARGV[at + 2])
    local ps, pps, cal = num(ARGV[at + 5]), num(ARGV[at + 6]), ARGV[at + 7]
    -- A budget does not refill between its boundaries.
    local dt, da = lowest(cal ~= '' and 0 or amount, period)
    local l = {f = f, tk = f .. 'tk', rf = f .. 'rf', tc = f .. 'tc', ol = f .. 'ol',
      burst = num(ARGV[at + 3]), dt = dt, da = da, amount = amount, ps = ps, pps = pps, cal = cal,
      amountArg = ARGV[at + 1], periodArg = ARGV[at + 2], burstArg = ARGV[at + 3], debtArg = ARGV[at + 4]}
    -- bucket.Floor: the fewest tokens a charge leaves the limit with.
    local debt = num(ARGV[at + 4])
    if debt < 0 then l.floor = 0 elseif debt == 0 then l.floor = -l.burst else l.floor = -debt end
    lay.limits[i] = l
    local fs, rs = lay.fields, lay.rates
    fs[4 * i - 2], fs[4 * i - 1], fs[4 * i], fs[4 * i + 1] = l.tk, l.rf, l.tc, l.ol
    rs[4 * i - 3], rs[4 * i - 2], rs[4 * i - 1], rs[4 * i] = f .. 'ra', f .. 'rp', f .. 'bx', f .. 'pd'
    lay.keep[f] = true
    at = at + 8
  end
  layouts[li] = lay
end

local key = 1
at = at + 1
for _ = 1, num(ARGV[at - 1]) do
  at, key = group(now, width, layouts, at, key)
end
return reply
