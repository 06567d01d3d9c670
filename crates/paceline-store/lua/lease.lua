-- Releases or extends a lease of a `concurrency` key (see `PL.lease` in `concurrency.lua`).
-- KEYS[1]: the key. ARGV: the clock (`PL.clock`), 'release' or 'extend', the lease id, then
-- the policy as `PL.read_policy` reads it.
local now, _, slack = PL.clock(ARGV[1])
local action, id = ARGV[2], tonumber(ARGV[3])
local policy, err = PL.read_policy(ARGV, 4)
if not policy then
  return redis.error_reply(err)
end
if policy.alg ~= 'concurrency' then
  return redis.error_reply('paceline: leases need a concurrency policy, not ' .. policy.alg)
end
if (action ~= 'release' and action ~= 'extend') or not id then
  return redis.error_reply('paceline: a lease call of ' .. tostring(action) .. ' ' .. tostring(ARGV[3]))
end
return PL.lease(KEYS[1], policy, action, id, now, slack)
