-- `pacer`: the Lua twin of `paceline_core::policy::pacer`.
-- Parameters: p[1] = the emission interval (µs), p[2] = max_burst, p[3] =
-- burst_allowance_factor (nil when unset: 0.5 for `pace`, 1 for `limit` and `peek`).
-- State: { watermark, last_drip, next_shot }, the last two in µs.
local PACER_EPSILON = 1e-9

-- Zero-delay cost-1 requests left at `now` for a watermark and next free slot.
local function pacer_remaining(max_burst, now, watermark, next_shot)
  if next_shot > now then
    return 0
  end
  return PL.floor_count(max_burst - watermark + PACER_EPSILON) + 1
end

-- Time from `now` until the state is idle, leaking at the slowest factor any op may use
-- (`configured`, else 0.5).
local function pacer_reset_after(interval, configured, now, watermark, last_drip, next_shot)
  local slowest = configured or 0.5
  local empty_at = (next_shot > last_drip and next_shot or last_drip) + watermark * interval / slowest
  local reset_after = (empty_at > next_shot and empty_at or next_shot) - now
  return 0 > reset_after and 0 or reset_after
end

-- The algorithm over bare numbers, without tables: `w`, `l`, `n` are the key's live state
-- (`w` nil: idle). Returns allowed, delay, reset_after; if the request changes the key,
-- its new watermark, last_drip and next_shot (else three nils); then the watermark and
-- next_shot that `remaining` counts from (`pacer_remaining`, left to the callers that
-- answer with it).
function PL.pacer_step(interval, max_burst, configured, w, l, n, now, op, cost, max_wait)
  local factor = configured or (op == 'pace' and 0.5 or 1.0)

  -- Steps 1 and 2: the key as it stands at `now`, before this request.
  -- An idle key has an empty bucket and its next free slot now (leaking it changes nothing).
  local watermark, next_shot = 0, now
  if w then
    watermark, next_shot = w, now > n and now or n
    if next_shot <= now then
      -- Leak only over idle time, since the *stored* last_drip/next_shot (not the clamped
      -- one).
      local idle = now - (n > l and n or l)
      watermark = watermark - (0 > idle and 0 or idle) / interval * factor
      if watermark * interval / factor < 1 then
        watermark = 0
      end
    end
  end
  local cur_watermark, cur_next_shot = watermark, next_shot

  -- Steps 3 and 4.
  local new_watermark, new_next_shot = watermark + cost, next_shot
  local shot = now
  if new_watermark > max_burst + PACER_EPSILON then
    shot = new_next_shot
    new_next_shot = shot + cost * interval
  end
  new_watermark = max_burst < new_watermark and max_burst or new_watermark
  local delay = shot - now

  local save, allowed
  if op == 'peek' then
    save = false
  elseif op == 'limit' then
    save = delay == 0
  elseif max_wait and delay > max_wait then
    save = false
    allowed, delay = false, PL.retry_after_max_wait(delay, max_wait)
  else
    save = true
  end
  if save then
    if op == 'charge' then
      -- Booked as a `pace` is, owed nothing now.
      delay = 0
    end
    return true, delay,
      pacer_reset_after(interval, configured, now, new_watermark, now, new_next_shot),
      new_watermark, now, new_next_shot, new_watermark, new_next_shot
  end
  -- Unchanged: remaining from the drained view, reset_after from the stored state.
  if allowed == nil then
    allowed = delay == 0
  end
  return allowed, delay, w and pacer_reset_after(interval, configured, now, w, l, n) or 0,
    nil, nil, nil, cur_watermark, cur_next_shot
end

PL.alg.pacer = function(p, s, now, op, cost, max_wait)
  local w, l, n
  if s then
    w, l, n = s[1], s[2], s[3]
  end
  local allowed, delay, reset_after, new_w, new_l, new_n, seen_w, seen_n =
    PL.pacer_step(p[1], p[2], p[3], w, l, n, now, op, cost, max_wait)
  local remaining = pacer_remaining(p[2], now, seen_w, seen_n)
  if new_w then
    return allowed, delay, remaining, reset_after, { new_w, new_l, new_n }
  end
  return allowed, delay, remaining, reset_after, nil
end
