-- One decision (or refund) against the buckets KEYS name: a bucket, and
-- its parent's in a cascade. Redis runs the script atomically, so it reads,
-- refills, decides and writes with nothing in between, whatever the number
-- of Sluice replicas. The arithmetic is backend/bucket's, step for step
-- (Refill, Reconcile, Decide, Refund); the Go side computes everything
-- else (costs, TTLs, waits) and a differential test holds the two equal.
--
-- Numbers are Lua doubles: every value stays below 2^53 (tokens below
-- 2^40 * 1000, times in epoch milliseconds), divisions are corrected to
-- exact integer quotients, and numbers are written with %.0f, never with
-- Lua's %.14g, which would round them.
--
-- ARGV: now, mode ("decide" or "refund"), then per key: ttl (ms; 0 keeps
-- the bucket forever), cfg (fingerprint of the limits), n, and n times:
-- name, amount, period, burst, cost (for a refund: the tokens it gives
-- back). Every amount in millitokens, every time in milliseconds.
--
-- Reply: allowed (1 or 0), then per key and limit: tokens, clock,
-- consumed, as decimal strings.

local function fdiv(a, b)
  local q = math.floor(a / b)
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
    a, b = b, math.fmod(a, b)
  end
  return a
end

-- bucket.Refill
local function refill(amount, period, burst, tk, rf, now)
  if tk >= burst then return burst, now end
  if tk < 0 then tk = 0 end
  if rf > now or amount == 0 then return tk, rf end
  local g = gcd(amount, period)
  local dt, da = period / g, amount / g
  local steps = fdiv(now - rf, dt)
  if steps >= cdiv(burst - tk, da) then return burst, now end
  return tk + steps * da, rf + steps * dt
end

local function num(s) return tonumber(s) end
local function str(n) return string.format('%.0f', n) end
local function field(name, f) return 'b_' .. name .. '_' .. f end

local now = num(ARGV[1])
local refund = ARGV[2] == 'refund'
local buckets = {}
local at = 3
for k = 1, #KEYS do
  local b = {key = KEYS[k], ttl = num(ARGV[at]), cfg = ARGV[at + 1], limits = {}}
  local n = num(ARGV[at + 2])
  at = at + 3
  for i = 1, n do
    b.limits[i] = {name = ARGV[at], amount = num(ARGV[at + 1]), period = num(ARGV[at + 2]),
      burst = num(ARGV[at + 3]), cost = num(ARGV[at + 4])}
    at = at + 5
  end
  buckets[k] = b
end

-- Read and bring every limit to now: bucket.Reconcile (a kept limit
-- refilled at its stored rate; a new one full), then bucket.Refill at the
-- limit's rate, which caps a kept limit at its new burst.
local allowed, anyCost = true, false
for _, b in ipairs(buckets) do
  b.stale = redis.call('HGET', b.key, 'cfg') ~= b.cfg
  for _, l in ipairs(b.limits) do
    local st = redis.call('HMGET', b.key, field(l.name, 'tk'), field(l.name, 'rf'), field(l.name, 'tc'),
      field(l.name, 'ra'), field(l.name, 'rp'), field(l.name, 'bx'))
    local tk, rf
    if st[1] and st[2] and st[4] and st[5] and st[6] then
      tk, rf = refill(num(st[4]), num(st[5]), num(st[6]), num(st[1]), num(st[2]), now)
    else
      tk, rf = l.burst, now
    end
    l.tk, l.rf = refill(l.amount, l.period, l.burst, tk, rf, now)
    l.tc = st[3] or '0'
    if l.cost > 0 then anyCost = true end
    if l.tk < l.cost then allowed = false end
  end
end

if refund then
  allowed = true
  for _, b in ipairs(buckets) do
    for _, l in ipairs(b.limits) do
      l.tk = math.min(l.burst, l.tk + l.cost)
      if l.tk == l.burst then l.rf = now end
    end
  end
elseif allowed then
  for _, b in ipairs(buckets) do
    for _, l in ipairs(b.limits) do
      l.tk = l.tk - l.cost
    end
  end
end

-- A denial, and a check that costs nothing, leave the buckets as stored:
-- refill is exact, so what was not written is credited again later.
if refund or (allowed and anyCost) then
  for _, b in ipairs(buckets) do
    if b.stale then
      -- The limits changed: drop the fields of those removed.
      local keep = {}
      for _, l in ipairs(b.limits) do keep[l.name] = true end
      for _, f in ipairs(redis.call('HKEYS', b.key)) do
        local name = string.match(f, '^b_(.*)_%a%a$')
        if name and not keep[name] then redis.call('HDEL', b.key, f) end
      end
    end
    local set = {'cfg', b.cfg}
    for _, l in ipairs(b.limits) do
      table.insert(set, field(l.name, 'tk')); table.insert(set, str(l.tk))
      table.insert(set, field(l.name, 'rf')); table.insert(set, str(l.rf))
      table.insert(set, field(l.name, 'cp')); table.insert(set, str(l.amount))
      table.insert(set, field(l.name, 'ra')); table.insert(set, str(l.amount))
      table.insert(set, field(l.name, 'rp')); table.insert(set, str(l.period))
      table.insert(set, field(l.name, 'bx')); table.insert(set, str(l.burst))
    end
    redis.call('HSET', b.key, unpack(set))
    for _, l in ipairs(b.limits) do
      if not refund and l.cost > 0 then
        -- Redis's own 64-bit integers: consumption outgrows 2^53. Read
        -- back as a string: an integer reply becomes a Lua double. At
        -- 2^63 it saturates, as bucket.Decide does (HINCRBY refuses the
        -- overflow before it changes anything); a damaged count starts
        -- again rather than fail every decision.
        local r = redis.pcall('HINCRBY', b.key, field(l.name, 'tc'), str(l.cost))
        if type(r) == 'table' and r.err then
          local tc = str(l.cost)
          if string.find(r.err, 'overflow') then tc = '9223372036854775807' end
          redis.call('HSET', b.key, field(l.name, 'tc'), tc)
        end
        l.tc = redis.call('HGET', b.key, field(l.name, 'tc'))
      end
    end
    if b.ttl > 0 then
      redis.call('PEXPIRE', b.key, str(b.ttl))
    else
      redis.call('PERSIST', b.key)
    end
  end
end

local reply = {allowed and '1' or '0'}
for _, b in ipairs(buckets) do
  for _, l in ipairs(b.limits) do
    table.insert(reply, str(l.tk))
    table.insert(reply, str(l.rf))
    table.insert(reply, l.tc)
  end
end
return reply
