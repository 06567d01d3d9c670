-- `guava`: the Lua twin of `paceline_core::policy::guava`, the `SmoothRateLimiter` core that
-- `smooth_bursty.lua` and `smooth_warming_up.lua` share, as `PL.guava`.
-- Configuration (`PL.guava.bursty`, `PL.guava.warming_up`): Rust's `guava::Config`, computed
-- from the same inputs with the same float operations.
-- State: { stored_permits, next_free_ticket (µs), max_permits, cool_down_interval (µs) },
-- Rust's `guava::State`; the last two are the configuration the state was last set with.
--
-- Rust's i64 arithmetic is done on doubles: exact below 2^53 µs (285 years), saturating at
-- ±2^63 (i64::MAX's nearest double) beyond.
local G = {}
PL.guava = G

local I64_MAX = 2 ^ 63
local I64_MIN = -(2 ^ 63)
local PERMIT_EPSILON = 1e-9

-- Rust's `f64 as i64`: toward zero, saturating, NaN to 0.
local function trunc(x)
  if x ~= x then
    return 0
  elseif x >= I64_MAX then
    return I64_MAX
  elseif x <= I64_MIN then
    return I64_MIN
  elseif x >= 0 then
    return floor(x)
  end
  return ceil(x)
end

-- i64 `saturating_add` and `saturating_sub`.
local function add(a, b)
  return min(max(a + b, I64_MIN), I64_MAX)
end
local function sub(a, b)
  return min(max(a - b, I64_MIN), I64_MAX)
end

local function copy(l)
  return { l[1], l[2], l[3], l[4] }
end

-- `SmoothBursty`'s `doSetRate`. `limit` as `Config::limit`.
function G.bursty(per_second, max_burst_seconds)
  local stable = 1e6 / per_second
  local max_permits = max_burst_seconds * per_second
  return {
    stable = stable,
    max_permits = max_permits,
    cool_down = stable,
    initial = 0,
    limit = PL.floor_count(max_permits + PERMIT_EPSILON) + 1,
  }
end

-- `SmoothWarmingUp`'s `doSetRate`; `warmup` in µs.
function G.warming_up(per_second, warmup, cold_factor)
  local stable = 1e6 / per_second
  local cold = stable * cold_factor
  local threshold = 0.5 * warmup / stable
  local max_permits = threshold + 2 * warmup / (stable + cold)
  local slope = (cold - stable) / (max_permits - threshold)
  return {
    stable = stable,
    max_permits = max_permits,
    cool_down = warmup / max_permits,
    initial = max_permits,
    limit = 1,
    threshold = threshold,
    slope = slope,
  }
end

-- `State::resync`, with the state's own configuration; changes `l`.
local function resync(l, now)
  if now > l[2] then
    local new_permits = sub(now, l[2]) / l[4]
    l[1] = min(l[3], l[1] + new_permits)
    l[2] = now
  end
end

-- `State::reset_at`: the first whole µs at which a resync gives `max_permits`.
local function reset_at(l)
  local stored, max_permits, cool_down = l[1], l[3], l[4]
  local short = max_permits - stored
  if short ~= short or short <= 0 then
    return l[2]
  end
  local function full_after(fill)
    return stored + fill / cool_down >= max_permits
  end
  local fill = ceil(short * cool_down)
  if fill >= 1 and full_after(fill - 1) then
    fill = fill - 1
  elseif not full_after(fill) then
    fill = fill + 1
  end
  return add(l[2], trunc(fill))
end

-- `Config::stored_permits_to_wait_time`.
local function stored_permits_to_wait_time(c, stored, take)
  if not c.slope then
    return 0
  end
  local stable, slope = c.stable, c.slope
  local above = stored - c.threshold
  local micros = 0
  if above > 0 then
    local from_above = min(above, take)
    local length = (stable + above * slope) + (stable + (above - from_above) * slope)
    micros = trunc(from_above * length / 2)
    take = take - from_above
  end
  return add(micros, trunc(stable * take))
end

-- `Config::set_rate`: resync with the old configuration, then scale to this one.
local function set_rate(c, old, now)
  local l = copy(old)
  resync(l, now)
  local stored
  if l[3] == 0 then
    stored = c.initial
  else
    stored = l[1] * c.max_permits / l[3]
  end
  return { stored, l[2], c.max_permits, c.cool_down }
end

-- `Config::reserve`: changes `l`, returns the moment the permits are available.
local function reserve(c, l, permits, now)
  resync(l, now)
  local moment = l[2]
  local spend = min(permits, l[1])
  local fresh = permits - spend
  local wait = add(stored_permits_to_wait_time(c, l[1], spend), trunc(fresh * c.stable))
  l[2] = add(l[2], wait)
  l[1] = l[1] - spend
  return moment
end

-- `Config::remaining`.
local function remaining(c, l, now)
  if l[2] > now then
    return 0
  end
  if c.slope then
    return 1
  end
  return min(PL.floor_count(l[1] + PERMIT_EPSILON) + 1, c.limit)
end

-- `Config::apply` with configuration `c` (from `G.bursty` or `G.warming_up`).
function G.apply(c, s, now, op, cost, max_wait, max_wait_us)
  -- A state at or past its reset time is a new key's, even if the store still holds it.
  local live = s
  if s and now >= reset_at(s) then
    live = nil
  end
  -- The limiter at `now` before the request: created, or `setRate` on a parameter change,
  -- else the stored one as it is (not resynced: Guava's tryAcquire checks first). `view`
  -- may be the stored table itself, so it is copied before any change.
  local view
  if not live then
    view = set_rate(c, { 0, now, 0, c.cool_down }, now)
  elseif live[3] == c.max_permits and live[4] == c.cool_down then
    view = live
  else
    view = set_rate(c, live, now)
  end

  local function unchanged(allowed, delay)
    local synced = copy(view)
    resync(synced, now)
    local reset_after = 0
    if live then
      reset_after = sub(reset_at(live), now)
    end
    return allowed, delay, remaining(c, synced, now), reset_after, nil
  end
  local function admit()
    local l = copy(view)
    local moment = reserve(c, l, cost, now)
    local delay = max(sub(moment, now), 0)
    if op == 'charge' then
      -- Reserved as an acquire is, owed nothing now.
      delay = 0
    end
    return true, delay, remaining(c, l, now), sub(reset_at(l), now), l
  end
  -- Guava's `canAcquire` with `timeout` µs, and the retry-after of its rejection.
  local function try_acquire(timeout)
    local earliest = sub(view[2], timeout)
    if earliest <= now then
      return admit()
    end
    return unchanged(false, sub(earliest, now))
  end

  if op == 'peek' then
    local earliest = view[2]
    if earliest <= now then
      return unchanged(true, 0)
    end
    return unchanged(false, sub(earliest, now))
  elseif op == 'limit' then
    return try_acquire(0)
  elseif max_wait then
    -- Whole microseconds, rounded down, as `Duration::as_micros`.
    return try_acquire(max_wait_us)
  end
  return admit()
end
