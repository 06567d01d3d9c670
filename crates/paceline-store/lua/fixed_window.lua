-- `fixed_window`: the Lua twin of `paceline_core::policy::fixed_window`.
-- Parameters: p[1] = limit, p[2] = the window length W (µs).
-- State: { window_us, { index, count, index, count, ... } }, the window length the counts
-- were written with and the (index, count) pairs of the windows holding cost, sorted by
-- index. `PL.windows` holds the helpers `sliding_window` shares (`fixed_window::rebucket`,
-- `count_at`, `add_at`).
--
-- Integers are doubles below 2^53 here, where `floor(a / b)` is u64 division.

-- Window counts being worked on: `idx`, the window indices in increasing order, and `cnt`,
-- index -> count (absent: 0).
PL.windows = {}

-- `rebucket`: the stored pairs of `s` (written with windows of s[1] µs) moved to windows of
-- `w` µs, each into the new window holding the old window's start; those below `first` and
-- zero counts are dropped, counts landing in one window add up. An old window's new index
-- never decreases as the old index grows, so the sorted pairs stay sorted and equal indices
-- are neighbours.
function PL.windows.load(s, w, first)
  local idx, cnt = {}, {}
  if s then
    local old_w, flat = s[1], s[2]
    for k = 1, #flat, 2 do
      local index, count = flat[k], flat[k + 1]
      if count > 0 then
        if old_w ~= w then
          index = floor(index * old_w / w)
        end
        if index >= first then
          if cnt[index] then
            cnt[index] = min(cnt[index] + count, PL.MAX_CHARGED)
          else
            idx[#idx + 1] = index
            cnt[index] = count
          end
        end
      end
    end
  end
  return { idx = idx, cnt = cnt }
end

-- `count_at`.
function PL.windows.count(ws, index)
  return ws.cnt[index] or 0
end

-- `add_at`: adds `cost` to window `index`, keeping `idx` sorted.
function PL.windows.add(ws, index, cost)
  local idx, cnt = ws.idx, ws.cnt
  if cnt[index] then
    cnt[index] = min(cnt[index] + cost, PL.MAX_CHARGED)
    return
  end
  local at = #idx + 1
  while at > 1 and idx[at - 1] > index do
    idx[at] = idx[at - 1]
    at = at - 1
  end
  idx[at] = index
  cnt[index] = min(cost, PL.MAX_CHARGED)
end

-- The highest window index held, or nil.
function PL.windows.last(ws)
  return ws.idx[#ws.idx]
end

-- The state to store for windows of `w` µs.
function PL.windows.state(ws, w)
  local flat = {}
  for k, index in ipairs(ws.idx) do
    flat[2 * k - 1] = index
    flat[2 * k] = ws.cnt[index]
  end
  return { w, flat }
end

-- `fixed_window::MAX_BOOKED_WINDOWS`: a `pace` books at most this many windows ahead (the
-- current one and the ones after it).
PL.windows.MAX_BOOKED = 10000

-- `fixed_window::settle`: how a request to either window algorithm ends, once it is known
-- whether it fits now, its delay and the window it would count in; `outlook` gives remaining
-- and reset_after. Returns the five values of `PL.alg`.
function PL.windows.settle(ws, limit, w, now, op, cost, max_wait, fits_now, delay, window, outlook)
  local admit
  if op == 'charge' then
    -- Counted in the current window, past the limit if need be.
    PL.windows.add(ws, floor(now / w), cost)
    local remaining, reset_after = outlook(ws, limit, w, now)
    return true, 0, remaining, reset_after, PL.windows.state(ws, w)
  elseif op == 'peek' then
    admit = false
  elseif op == 'limit' then
    admit = fits_now
  else
    -- Over `max_wait`, or past the horizon (`past_horizon`): rejected, retry-after the later
    -- of the two.
    local retry
    if max_wait and delay > max_wait then
      retry = PL.retry_after_max_wait(delay, max_wait)
    end
    local horizon = PL.windows.MAX_BOOKED
    if window - floor(now / w) >= horizon then
      local past = max((window - horizon + 1) * w - now, 0)
      retry = max(retry or 0, past)
    end
    if retry then
      local remaining, reset_after = outlook(ws, limit, w, now)
      return false, retry, remaining, reset_after, nil
    end
    admit = true
  end
  if not admit then
    -- A peek or a rejected `limit`: the stored state stays as it was (not even pruned).
    local remaining, reset_after = outlook(ws, limit, w, now)
    return fits_now, delay, remaining, reset_after, nil
  end
  PL.windows.add(ws, window, cost)
  local remaining, reset_after = outlook(ws, limit, w, now)
  return true, delay, remaining, reset_after, PL.windows.state(ws, w)
end

-- `earliest_with_room`: the smallest window index >= `from` with room for `cost`.
local function earliest_with_room(ws, from, cost, limit)
  local candidate = from
  for _, index in ipairs(ws.idx) do
    if index >= candidate then
      if index > candidate or ws.cnt[index] + cost <= limit then
        break
      end
      candidate = candidate + 1
    end
  end
  return candidate
end

-- `FixedWindow::decision`: remaining and reset_after for `ws` at `now`.
local function outlook(ws, limit, w, now)
  local remaining = max(limit - PL.windows.count(ws, floor(now / w)), 0)
  local last = PL.windows.last(ws)
  local reset_after = 0
  if last then
    reset_after = max(last * w + w - now, 0)
  end
  return remaining, reset_after
end

-- `from` (a `pace` booked no earlier than it, Rust's `pace_from`; nil: now).
PL.alg.fixed_window = function(p, s, now, op, cost, max_wait, _, from)
  local limit, w = p[1], p[2]
  from = from or now
  local current = floor(now / w)
  local ws = PL.windows.load(s, w, current)
  local slot = current
  if op ~= 'charge' then
    slot = earliest_with_room(ws, max(floor(from / w), current), cost, limit)
  end
  local delay = max(max(slot * w, from) - now, 0)
  return PL.windows.settle(ws, limit, w, now, op, cost, max_wait, slot == current, delay, slot, outlook)
end
