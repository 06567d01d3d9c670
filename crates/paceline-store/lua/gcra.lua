-- `gcra`: the Lua twin of `paceline_core::policy::gcra`.
-- Parameters: p[1] = the emission interval T (µs), p[2] = burst.
-- State: { tat }, the theoretical arrival time in µs.
local CELL_EPSILON = 1e-9
-- Below a nanosecond, a delay is float residue: none (Rust's DELAY_EPSILON).
local DELAY_EPSILON = 1e-3

-- Rust's `Gcra::plan` over a bare TAT (nil: idle): allowed, delay, the TAT seen (raised to
-- `now`), and the TAT to write (nil: nothing changes).
function PL.gcra_plan(interval, burst, stored_tat, now, op, cost, max_wait)
  local tat = now
  if stored_tat then
    tat = now > stored_tat and now or stored_tat
  end
  local new_tat = tat + cost * interval
  local delay = new_tat - burst * interval - now
  if delay < DELAY_EPSILON then
    delay = 0
  end
  if op == 'peek' then
    return delay == 0, delay, tat, nil
  elseif op == 'limit' then
    if delay == 0 then
      return true, delay, tat, new_tat
    end
    return false, delay, tat, nil
  elseif op == 'charge' then
    -- Counted as a `pace` is (past the burst if need be), owed nothing.
    return true, 0, tat, new_tat
  elseif max_wait and delay > max_wait then
    return false, PL.retry_after_max_wait(delay, max_wait), tat, nil
  end
  return true, delay, tat, new_tat
end

PL.alg.gcra = function(p, s, now, op, cost, max_wait)
  local interval, burst = p[1], p[2]
  local allowed, delay, tat, new_tat = PL.gcra_plan(interval, burst, s and s[1], now, op, cost, max_wait)
  local ttl = (new_tat or tat) - now
  local remaining = PL.floor_count((burst * interval - ttl) * (1 / interval) + CELL_EPSILON)
  if new_tat then
    -- Idle once its TAT has passed.
    return allowed, delay, remaining, ttl, { new_tat }, new_tat
  end
  return allowed, delay, remaining, ttl, nil
end
