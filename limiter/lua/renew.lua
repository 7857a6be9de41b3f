-- renew.lua: the heartbeat renewal of one scope's live leases.
--
-- KEYS: 1 leases, 2 scope epoch, 3.. one admission record per lease.
-- ARGV: 1 lease TTL us, 2 record TTL ms, 3 epoch grace us, 4 epoch key TTL ms,
--       then per lease: id, "charged-in charged-out".
-- A lease whose request was settled (or abandoned) is left alone; any other lease is
-- (re-)added with a fresh expiry, which also restores leases and records
-- lost in a Redis restart. A missing epoch (Redis restarted empty) is set to
-- now + grace, as admit.lua does. Returns {number renewed, epoch}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = tonumber(ARGV[1])
local n = 0
for i = 3, #KEYS do
  local rec = redis.call('GET', KEYS[i])
  if rec ~= 's' and rec ~= 'x' then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[2 * i - 1])
    redis.call('SET', KEYS[i], ARGV[2 * i], 'PX', ARGV[2])
    n = n + 1
  end
end
local epoch = tonumber(redis.call('GET', KEYS[2]) or '0')
if epoch == 0 then
  epoch = now + tonumber(ARGV[3])
  redis.call('SET', KEYS[2], string.format('%.0f', epoch), 'PX', ARGV[4])
else
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
local want = math.ceil(ttl / 1000) + 1000
if n > 0 and redis.call('PTTL', KEYS[1]) < want then
  redis.call('PEXPIRE', KEYS[1], want)
end
return {n, epoch}
