-- `smooth_bursty`: the Lua twin of `paceline_core::policy::smooth_bursty` (Guava's
-- `SmoothBursty`), on the shared core in `guava.lua`.
-- Parameters: p[1] = the rate in permits per second (`Rate::per_second`), p[2] =
-- max_burst_seconds.
-- State: `guava.lua`'s { stored_permits, next_free_ticket, max_permits, cool_down_interval }.
PL.alg.smooth_bursty = function(p, s, now, op, cost, max_wait, max_wait_us)
  return PL.guava.apply(PL.guava.bursty(p[1], p[2]), s, now, op, cost, max_wait, max_wait_us)
end
