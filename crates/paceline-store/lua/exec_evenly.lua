-- `exec_evenly`: the Lua twin of `paceline_core::policy::exec_evenly`.
-- Parameters: p[1] = points, p[2] = duration (µs), p[3] = min_delay (µs), all integers.
-- State: { start, consumed }: the window's start (µs) and the points consumed in it.
-- Rust's u64 arithmetic is exact here: every value stays below 2^53, and integer division
-- is floor(a / b).

-- `spread_ms`: d1(t) = ceil(((end - t) / 1000) / k) whole milliseconds.
local function ee_spread_ms(window_end, t, k)
  return ceil(max(window_end - t, 0) / 1000 / k)
end

PL.alg.exec_evenly = function(p, s, now, op, cost, max_wait, max_wait_us)
  local points, duration, min_delay = p[1], p[2], p[3]
  local active = s and now < s[1] + duration
  local start, consumed = now, 0
  if active then
    start, consumed = s[1], s[2]
  end
  local window_end = start + duration
  local after = min(consumed + cost, PL.MAX_CHARGED)
  local fits = after <= points
  local k = points - after + 2

  local delay = 0
  if fits and consumed > 0 then
    local step = ee_spread_ms(window_end, now, k) * 1000
    if step < min_delay then
      delay = after * min_delay
    else
      delay = step
    end
  end
  local until_end = max(window_end - now, 0)

  -- What the key looks like if this request changes nothing.
  local function unchanged(allowed, d)
    if active then
      return allowed, d, max(points - s[2], 0), until_end, nil
    end
    return allowed, d, points, 0, nil
  end

  if op == 'peek' then
    if fits then
      return unchanged(true, delay)
    end
    return unchanged(false, until_end)
  end
  if op == 'charge' then
    -- Consumed past the points if need be, owed nothing now.
    return true, 0, max(points - after, 0), until_end, { start, after }
  end
  if not fits then
    return unchanged(false, until_end)
  end
  if op == 'pace' and max_wait then
    -- Rust compares with `Duration::as_micros`: whole microseconds, rounded down.
    local max_us = max_wait_us
    if delay > max_us then
      local at = window_end
      -- The earliest t in [now, end) with d1(t) <= limit_ms, or nil (d1 never grows with t).
      local function first(limit_ms)
        local lo, hi = now, window_end - 1
        if hi < 0 or limit_ms == 0 or lo > hi or ee_spread_ms(window_end, hi, k) > limit_ms then
          return nil
        end
        while lo < hi do
          local mid = lo + floor((hi - lo) / 2)
          if ee_spread_ms(window_end, mid, k) <= limit_ms then
            hi = mid
          else
            lo = mid + 1
          end
        end
        return lo
      end
      local within_ms = floor(max_us / 1000)
      local below_min_ms = floor(max(min_delay - 1, 0) / 1000)
      if after * min_delay <= max_us then
        -- Both branches of the delay fit once d1 <= max(within_ms, below_min_ms).
        at = first(max(within_ms, below_min_ms)) or window_end
      else
        -- Only d1 * 1000 fits: below_min_ms < d1 <= within_ms.
        local fit, too_low = first(within_ms), first(below_min_ms)
        if fit and (not too_low or fit < too_low) then
          at = fit
        end
      end
      return unchanged(false, max(at - now, 0))
    end
  end
  return true, delay, points - after, until_end, { start, after }
end
