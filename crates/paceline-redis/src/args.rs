//! A policy's parameters as the Lua twins read them (`p[1]`, `p[2]`, ...).
//!
//! Floats are written in Rust's shortest round-trip form, which Lua's `tonumber` reads back
//! to the identical double; derived values (an emission interval, a permit cap) are sent as
//! Rust computed them, so the twins never recompute them differently.

use paceline::Policy;

/// Appends `policy`'s algorithm name, parameter count and parameters to `out`.
pub(crate) fn push_policy(policy: &Policy, out: &mut Vec<String>) {
    let params: Vec<String> = match policy {
        Policy::Pacer(p) => vec![
            float(p.rate().interval_micros()),
            float(p.max_burst()),
            p.burst_allowance_factor().map(float).unwrap_or_default(),
        ],
        Policy::Gcra(g) => vec![float(g.rate().interval_micros()), g.burst().to_string()],
        Policy::FixedWindow(f) => vec![f.limit().to_string(), micros(f.window())],
        Policy::ExecEvenly(e) => vec![
            e.points().to_string(),
            e.duration_micros().to_string(),
            e.min_delay_micros().to_string(),
        ],
        Policy::SlidingLog(l) => vec![
            l.limit().to_string(),
            micros(l.window()),
            micros(l.min_interval()),
            u8::from(l.count_blocked()).to_string(),
        ],
        Policy::SlidingWindow(w) => vec![w.limit().to_string(), micros(w.window())],
        // The Guava twins recompute their configuration from the same inputs as Rust's
        // `guava::Config` (`stable = 1e6 / per_second`, not `interval_micros`).
        Policy::SmoothBursty(b) => vec![float(b.rate().per_second()), float(b.max_burst_seconds())],
        Policy::SmoothWarmingUp(w) => vec![
            float(w.rate().per_second()),
            w.warmup_micros().to_string(),
            float(w.cold_factor()),
        ],
        // `Policy` is non-exhaustive; an algorithm without a Lua twin is refused by the
        // script with an error naming it.
        _ => Vec::new(),
    };
    out.push(policy.algorithm().to_string());
    out.push(params.len().to_string());
    out.extend(params);
}

/// A float in the shortest form that reads back to the same double.
pub(crate) fn float(x: f64) -> String {
    format!("{x:?}")
}

fn micros(d: std::time::Duration) -> String {
    // Windows are whole microseconds (the spec parser works in µs).
    d.as_micros().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_round_trip_and_params_are_counted() {
        for x in [0.1, 1e-7, 1e16, 123_456.789_012_345_67, 2.0f64.powi(53)] {
            assert_eq!(float(x).parse::<f64>().unwrap(), x);
        }
        let mut out = Vec::new();
        push_policy(&"gcra:rate=10/s,burst=3".parse().unwrap(), &mut out);
        assert_eq!(out, ["gcra", "2", "100000.0", "3"]);
        let mut out = Vec::new();
        push_policy(&"pacer:rate=4/s".parse().unwrap(), &mut out);
        assert_eq!(out, ["pacer", "3", "250000.0", "0.0", ""]);
    }
}
