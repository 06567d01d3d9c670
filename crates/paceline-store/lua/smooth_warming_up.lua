-- `smooth_warming_up`: the Lua twin of `paceline_core::policy::smooth_warming_up` (Guava's
-- `SmoothWarmingUp`), on the shared core in `guava.lua`.
-- Parameters: p[1] = the rate in permits per second (`Rate::per_second`), p[2] = warmup (µs),
-- p[3] = cold_factor.
-- State: `guava.lua`'s { stored_permits, next_free_ticket, max_permits, cool_down_interval }.
PL.alg.smooth_warming_up = function(p, s, now, op, cost, max_wait, max_wait_us)
  return PL.guava.apply(PL.guava.warming_up(p[1], p[2], p[3]), s, now, op, cost, max_wait, max_wait_us)
end
