-- `sliding_window`: the Lua twin of `paceline_core::policy::sliding_window`.
-- Parameters: p[1] = limit, p[2] = the window length W (µs).
-- State: as `fixed_window`'s, { window_us, { index, count, ... } }, from the previous window
-- onwards; read and written with the `PL.windows` helpers of fixed_window.lua (whose
-- `settle` refuses a `pace` past the horizon, `PL.windows.MAX_BOOKED` windows ahead).

-- `share`: prev * left / w, multiplied first as in Rust.
local function share(prev, left, w)
  return prev * left / w
end

-- `fits`: share <= limit - cur - cost, the room an integer (none when negative).
local function fits(sh, cur, cost, limit)
  local room = limit - cur - cost
  return room >= 0 and sh <= room
end

-- `first_true`: the smallest e in [lo, hi] with ok(e), ok being false then true and ok(hi)
-- true; `guess` and its neighbour are probed first, then bisection.
local function first_true(lo, hi, guess, ok)
  local g
  if guess ~= guess or guess <= lo then
    g = lo
  elseif guess >= hi then
    g = hi
  else
    g = floor(guess)
  end
  if ok(g) then
    hi = g
    if g > lo then
      if not ok(g - 1) then
        return g
      end
      hi = g - 1
    end
  else
    lo = g + 1
    if ok(lo) then
      return lo
    end
    lo = lo + 1
  end
  while lo < hi do
    local mid = lo + floor((hi - lo) / 2)
    if ok(mid) then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return hi
end

-- `parts`: count(j-1), count(j) and W - elapsed for the time t.
local function parts(ws, w, t)
  local j = floor(t / w)
  local prev = 0
  if j >= 1 then
    prev = PL.windows.count(ws, j - 1)
  end
  return prev, PL.windows.count(ws, j), w - (t - j * w)
end

-- `slot`: the smallest t >= now at which a request of `cost` is admitted, scanning the
-- windows from now's; it ends, at the latest, two windows after the last one holding cost.
local function slot_of(ws, w, limit, now, cost)
  cost = min(cost, limit)
  local j = floor(now / w)
  while true do
    local start = j * w
    local first = max(now, start) - start
    local cur = PL.windows.count(ws, j)
    local prev = 0
    if j >= 1 then
      prev = PL.windows.count(ws, j - 1)
    end
    if cur + cost <= limit then
      if prev == 0 then
        return start + first
      end
      local ok = function(e)
        return fits(share(prev, w - e, w), cur, cost, limit)
      end
      if ok(w - 1) then
        local room = limit - cost - cur
        -- Rust: (w - room * w / prev).ceil(), in this order.
        local guess = ceil(w - room * w / prev)
        return start + first_true(first, w - 1, guess, ok)
      end
    end
    j = j + 1
  end
end

-- `SlidingWindow::decision`: remaining and reset_after for `ws` at `now`.
local function outlook(ws, limit, w, now)
  local prev, cur, left = parts(ws, w, now)
  local remaining = max(max(limit - cur, 0) - ceil(share(prev, left, w)), 0)
  local last = PL.windows.last(ws)
  local reset_after = 0
  if last then
    reset_after = max((last + 2) * w - now, 0)
  end
  return remaining, reset_after
end

PL.alg.sliding_window = function(p, s, now, op, cost, max_wait)
  local limit, w = p[1], p[2]
  local ws = PL.windows.load(s, w, max(floor(now / w) - 1, 0))
  local prev, cur, left = parts(ws, w, now)
  local now_fits = fits(share(prev, left, w), cur, cost, limit)
  local slot = now
  if not now_fits and op ~= 'charge' then
    slot = slot_of(ws, w, limit, now, cost)
  end
  local delay = slot - now
  return PL.windows.settle(ws, limit, w, now, op, cost, max_wait, now_fits, delay, floor(slot / w), outlook)
end
