-- region_sync.lua: one edge node's rebalancing step for one tenant, on the
-- global store, on its Redis TIME. Shares are fractions of the tenant's
-- global limits (1 = the whole limit), so a changed limit needs no
-- migration here.
--
-- KEYS: 1 the tenant's region hash: field "<region>|<node>" ->
--       "reserve seen_us demand inflight" (one entry per edge node).
-- ARGV: 1 this region, 2 this node, 3 cur: the share the node enforces now
--       (the most it may have enforced since its last sync), 4 demand: the
--       node's use as a fraction of the global limit per minute,
--       5 floor: every region's guaranteed share, 6 hold us, 7 decay us,
--       8 demand freshness us, 9 key TTL ms, 10 inflight: the node's
--       streams in flight as a fraction of the global concurrency limit,
--       11.. the configured regions.
-- Returns: {grant, global demand, sum of reserves, reserve of this region}
--          as strings ("%.9f").
--
-- The invariant kept: the reserves of all regions sum to at most 1. A
-- node's reserve is the larger of what it reported enforcing and what it
-- was granted, so a share a region gives up is only lent once every node
-- of that region has reported enforcing the smaller value (lend, then
-- borrow). A reserve not renewed by its node is held for `hold` and then
-- decays linearly to the floor over `decay` (the node decays its own share
-- on the same schedule from an earlier instant, its send time). A
-- region's reserve is also at least the sum of its nodes' in-flight
-- fractions: concurrency a region lowered stays reserved until its streams
-- have ended.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local me, node = ARGV[1], ARGV[2]
local cur, dem = tonumber(ARGV[3]), tonumber(ARGV[4])
local floor = tonumber(ARGV[5])
local hold, decay, fresh = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])

local function decayed(v, age)
  if age <= hold then return v end
  if v <= floor then return v end
  local f = (age - hold) / decay
  if f >= 1 then return floor end
  return v - (v - floor) * f
end

local reserve, demand, inflight = {}, {}, {}
local myinf = tonumber(ARGV[10])
for i = 11, #ARGV do
  reserve[ARGV[i]] = floor
  demand[ARGV[i]] = 0
end
reserve[me] = reserve[me] or floor
demand[me] = demand[me] or 0

local mine = me .. '|' .. node
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local f, v = all[i], all[i + 1]
  if f ~= mine then
    local region = string.match(f, '^(.*)|[^|]*$')
    local r, seen, d, inf = string.match(v, '^(%S+) (%S+) (%S+) (%S+)$')
    r, seen, d, inf = tonumber(r), tonumber(seen), tonumber(d), tonumber(inf)
    if region and r and seen and d and inf then
      local age = now - seen
      if age > hold + decay + fresh then
        redis.call('HDEL', KEYS[1], f) -- decayed to the floor long ago
      else
        local rv = decayed(r, age)
        if rv > (reserve[region] or floor) then reserve[region] = rv end
        if reserve[region] == nil then reserve[region] = floor end
        if age <= fresh then demand[region] = (demand[region] or 0) + d end
        inflight[region] = (inflight[region] or 0) + inf
      end
    end
  end
end
demand[me] = demand[me] + dem
inflight[me] = (inflight[me] or 0) + myinf
for region, inf in pairs(inflight) do
  if inf > (reserve[region] or floor) then reserve[region] = math.min(inf, 1) end
end
local others_min = reserve[me]
if cur > reserve[me] then reserve[me] = cur end

-- Target: the floor plus a demand-proportional part of what the floors
-- leave; an idle fleet splits evenly.
local n, sumd = 0, 0
for region, d in pairs(demand) do
  n = n + 1
  sumd = sumd + d
end
local spare = math.max(0, 1 - n * floor)
local target
if sumd > 0 then
  target = floor + spare * demand[me] / sumd
else
  target = 1 / n
end

-- Never grant more than what the other regions do not reserve.
local others = 0
for region, r in pairs(reserve) do
  if region ~= me then others = others + r end
end
local grant = math.min(target, 1 - others)
if grant < floor then grant = floor end
-- A node of this region that is still enforcing more (it has not synced
-- since a decrease) keeps the region's reserve up until it reports.
local keep = math.max(cur, grant)
redis.call('HSET', KEYS[1], mine, string.format('%.9f %.0f %.9f %.9f', keep, now, dem, myinf))
redis.call('PEXPIRE', KEYS[1], ARGV[9])
local myres = math.max(keep, others_min)
local total = others + myres
return {string.format('%.9f', grant), string.format('%.9f', sumd),
  string.format('%.9f', total), string.format('%.9f', myres)}
