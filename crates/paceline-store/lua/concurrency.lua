-- `concurrency`: the Lua twin of `paceline_core::policy::concurrency`.
-- Parameters: p[1] = limit, p[2] = the lease's life (µs).
-- State: { next, id, expires, cost, id, expires, cost, ... }: the next lease id and the
-- leases by id. Returns the new lease's id as a seventh value.

-- The live leases of `s` at `now` as { id, expires, cost } tables, the cost they hold and
-- the next id (0 for no state).
local function live_leases(s, now)
  local live, used, next_id = {}, 0, 0
  if s then
    next_id = s[1]
    for i = 2, #s, 3 do
      if s[i + 1] > now then
        live[#live + 1] = { s[i], s[i + 1], s[i + 2] }
        used = used + s[i + 2]
      end
    end
  end
  return live, used, next_id
end

-- The latest expiry of `live` after `now`, in µs from now (0 for none).
local function latest(live, now)
  local left = 0
  for i = 1, #live do
    local l = live[i][2] - now
    if l > left then
      left = l
    end
  end
  return left
end

-- `live` flattened into a state after `next_id`.
local function flatten(next_id, live)
  local s = { next_id }
  for i = 1, #live do
    local l = live[i]
    s[#s + 1], s[#s + 2], s[#s + 3] = l[1], l[2], l[3]
  end
  return s
end

PL.alg.concurrency = function(p, s, now, op, cost)
  local limit, lease = p[1], p[2]
  local live, used, next_id = live_leases(s, now)
  if used + cost > limit then
    -- When enough leases expire, soonest first, for `cost` to fit.
    local by_expiry = {}
    for i = 1, #live do
      by_expiry[i] = live[i]
    end
    table.sort(by_expiry, function(a, b)
      return a[2] < b[2]
    end)
    local held, retry = used, 0
    for i = 1, #by_expiry do
      held = held - by_expiry[i][3]
      if held + cost <= limit then
        retry = by_expiry[i][2] - now
        break
      end
    end
    return false, retry, max(limit - used, 0), latest(live, now), nil
  end
  if op == 'peek' then
    return true, 0, max(limit - used, 0), latest(live, now), nil
  end
  local id = next_id
  if now > id then
    id = now
  end
  live[#live + 1] = { id, now + lease, cost }
  return true, 0, limit - used - cost, latest(live, now), flatten(id + 1, live), nil, id
end

-- Releases or extends a lease: the entry point of `lua/lease.lua`. `action` is 'release'
-- or 'extend'. Returns for a release 1 (the lease was live) or 0; for an extension the new
-- expiry in µs, or -1 (the lease was not live). Writes the key only when a live lease
-- changes, keeping its record's expiry (an extension may lengthen it).
function PL.lease(key, policy, action, id, now, slack)
  local raw = redis.call('GET', key)
  if not raw then
    return action == 'release' and 0 or -1
  end
  local alg, exp, s = PL.unpack(raw)
  if alg ~= 'concurrency' or exp <= now then
    return action == 'release' and 0 or -1
  end
  local live, _, next_id = live_leases(s, now)
  local found
  for i = 1, #live do
    if live[i][1] == id then
      found = i
    end
  end
  if not found then
    return action == 'release' and 0 or -1
  end
  if action == 'release' then
    table.remove(live, found)
    PL.put(key, PL.pack(alg, exp, flatten(next_id, live)), exp, now, slack)
    return 1
  end
  local expires = now + policy.p[2]
  live[found][2] = expires
  if expires > exp then
    exp = expires
  end
  PL.put(key, PL.pack(alg, exp, flatten(next_id, live)), exp, now, slack)
  return expires
end
