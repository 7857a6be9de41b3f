-- status.lua: read one scope for the usage endpoint; writes nothing.
--
-- KEYS: 1 leases, 2 requests TAT, 3 tokens TAT, 4 input TAT, 5 output TAT.
-- Returns {now us, live leases, requests TAT, tokens TAT, input TAT, output TAT}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local r = {now, redis.call('ZCOUNT', KEYS[1], string.format('(%.0f', now), '+inf')}
for i = 2, 5 do
  r[#r + 1] = tonumber(redis.call('GET', KEYS[i]) or '0')
end
return r
