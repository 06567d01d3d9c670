-- `gcra`: the Lua twin of `paceline_core::policy::gcra`.
-- Parameters: p[1] = the emission interval T (µs), p[2] = burst.
-- State: { tat }, the theoretical arrival time in µs.
local CELL_EPSILON = 1e-9
-- Below a nanosecond, a delay is float residue: none (Rust's DELAY_EPSILON).
local DELAY_EPSILON = 1e-3

PL.alg.gcra = function(p, s, now, op, cost, max_wait)
  local interval, burst = p[1], p[2]
  local cells_per_micro = 1 / interval
  local tat = now
  if s then
    tat = math.max(s[1], now)
  end
  local new_tat = tat + cost * interval
  local delay = math.max(new_tat - burst * interval - now, 0)
  if delay < DELAY_EPSILON then
    delay = 0
  end
  local allowed, write
  if op == 'peek' then
    allowed = delay == 0
  elseif op == 'limit' then
    allowed = delay == 0
    write = allowed
  elseif max_wait and delay > max_wait then
    allowed = false
    delay = PL.retry_after_max_wait(delay, max_wait)
  else
    allowed, write = true, true
  end
  local ttl = (write and new_tat or tat) - now
  local remaining = PL.floor_count((burst * interval - ttl) * cells_per_micro + CELL_EPSILON)
  if write then
    -- Idle once its TAT has passed.
    return allowed, delay, remaining, ttl, { new_tat }, new_tat
  end
  return allowed, delay, remaining, ttl, nil
end
