-- `sliding_log`: the Lua twin of `paceline_core::policy::sliding_log`.
-- Parameters: p[1] = limit, p[2] = window (µs), p[3] = min_interval (µs),
-- p[4] = count_blocked (1 or 0).
-- State: { newest, t1, c1, t2, c2, ... }: the latest time ever logged, then the log's
-- (time, cost) entries sorted by time, one per distinct time. All integers in µs (exact as
-- doubles: every value stays far below 2^53).

-- The stored log as it stands at `now`: the entries still alive (`time + window > now`) in
-- two arrays, and `newest` (nil without a state). This script only ever stores logs that are
-- sorted with equal times merged, so Rust's sort and merge have nothing to do here.
local function sl_at(s, now, window)
  local times, costs, n = {}, {}, 0
  if not s then
    return times, costs, 0, nil
  end
  local newest = s[1]
  for i = 2, #s - 1, 2 do
    local t, c = s[i], s[i + 1]
    if c > 0 and t + window > now then
      n = n + 1
      times[n], costs[n] = t, c
    end
  end
  if n > 0 then
    newest = max(times[n], newest)
  end
  return times, costs, n, newest
end

local function sl_total(costs, n)
  local sum = 0
  for i = 1, n do
    sum = sum + costs[i]
  end
  return sum
end

-- The earliest time >= now at which a request of `cost` is not blocked by the log: once
-- enough of the oldest entries have left the window, and `min_interval` after `newest`.
local function sl_earliest(limit, window, min_interval, times, costs, n, newest, now, cost)
  local t_count = now
  local rest = sl_total(costs, n)
  for i = 1, n do
    if rest + cost <= limit then
      break
    end
    rest = rest - costs[i]
    t_count = times[i] + window
  end
  local t_interval = now
  if newest then
    t_interval = newest + min_interval
  end
  return max(now, t_interval, t_count)
end

-- Logs `cost` at `time`, keeping the entries sorted and merged; returns the new count and
-- newest. Times are nearly always the latest, so the search runs from the end.
local function sl_record(times, costs, n, newest, time, cost)
  local i = n
  while i > 0 and times[i] > time do
    i = i - 1
  end
  if i > 0 and times[i] == time then
    costs[i] = min(costs[i] + cost, PL.MAX_CHARGED)
  else
    table.insert(times, i + 1, time)
    table.insert(costs, i + 1, min(cost, PL.MAX_CHARGED))
    n = n + 1
  end
  if newest then
    newest = max(newest, time)
  else
    newest = time
  end
  return n, newest
end

-- The state to store: the newest entries holding at least `limit` cost units, and none
-- older (Rust's `into_state`: dropping them changes no decision, and bounds the log to
-- `limit` entries).
local function sl_state(times, costs, n, newest, limit)
  local first, units = 1, 0
  for k = n, 1, -1 do
    units = units + costs[k]
    if units >= limit then
      first = k
      break
    end
  end
  local s = { newest }
  local j = 2
  for i = first, n do
    s[j], s[j + 1] = times[i], costs[i]
    j = j + 2
  end
  return s
end

-- `from` (a `pace` booked no earlier than it, Rust's `pace_from`; nil: now).
PL.alg.sliding_log = function(p, s, now, op, cost, max_wait, _, from)
  local limit, window, min_interval, count_blocked = p[1], p[2], p[3], p[4] == 1
  local times, costs, n, newest = sl_at(s, now, window)

  -- Rust's `decision`, on the log as it stands after the request.
  local function decide(allowed, delay)
    local free
    if newest and now < newest + min_interval then
      free = 0
    else
      free = max(limit - sl_total(costs, n), 0)
    end
    local remaining = free
    if min_interval > 0 then
      remaining = min(free, 1)
    end
    local idle_at = 0
    if newest then
      idle_at = newest + max(window, min_interval)
    end
    return allowed, delay, remaining, max(idle_at - now, 0)
  end

  if op == 'charge' then
    -- Logged now, past the limit if need be.
    n, newest = sl_record(times, costs, n, newest, now, cost)
    local a, d, r, reset = decide(true, 0)
    return a, d, r, reset, sl_state(times, costs, n, newest, limit)
  end
  local t = sl_earliest(limit, window, min_interval, times, costs, n, newest, now, cost)
  if from and from > t then
    t = from
  end
  local delay = t - now
  if op == 'peek' then
    return decide(delay == 0, delay)
  elseif op == 'limit' then
    if delay == 0 then
      n, newest = sl_record(times, costs, n, newest, now, cost)
      local a, d, r, reset = decide(true, 0)
      return a, d, r, reset, sl_state(times, costs, n, newest, limit)
    elseif count_blocked then
      -- Logged although blocked (possibly before a reservation, hence mid-log); the
      -- retry-after is computed on the log that includes it.
      n, newest = sl_record(times, costs, n, newest, now, cost)
      local retry = sl_earliest(limit, window, min_interval, times, costs, n, newest, now, cost)
        - now
      local a, d, r, reset = decide(false, retry)
      return a, d, r, reset, sl_state(times, costs, n, newest, limit)
    end
    -- A plain rejection stores nothing, not even the pruning.
    return decide(false, delay)
  elseif max_wait and delay > max_wait then
    return decide(false, PL.retry_after_max_wait(delay, max_wait))
  end
  n, newest = sl_record(times, costs, n, newest, t, cost)
  local a, d, r, reset = decide(true, delay)
  return a, d, r, reset, sl_state(times, costs, n, newest, limit)
end
