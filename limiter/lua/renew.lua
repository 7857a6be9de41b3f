-- renew.lua: the heartbeat renewal of one scope's live leases.
--
-- KEYS: 1 leases, 2.. one admission record per lease.
-- ARGV: 1 lease TTL us, 2 record TTL ms, then per lease: id, "charged-in charged-out".
-- A lease whose request was settled (or abandoned) is left alone; any other lease is
-- (re-)added with a fresh expiry, which also restores leases and records
-- lost in a Redis restart. Returns the number renewed.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = tonumber(ARGV[1])
local n = 0
for i = 2, #KEYS do
  local rec = redis.call('GET', KEYS[i])
  if rec ~= 's' and rec ~= 'x' then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[2 * i - 1])
    redis.call('SET', KEYS[i], ARGV[2 * i], 'PX', ARGV[2])
    n = n + 1
  end
end
local want = math.ceil(ttl / 1000) + 1000
if n > 0 and redis.call('PTTL', KEYS[1]) < want then
  redis.call('PEXPIRE', KEYS[1], want)
end
return n
