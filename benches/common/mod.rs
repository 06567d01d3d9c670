//! What both benchmarks of this package share: their settings from the environment, the
//! summary of a run's latencies, and the CPU time a process spent (to report CPU per
//! decision, since the load generator, the service and `redis-server` share the machine).

use std::time::Duration;

/// `name` read from the environment as a number, `default` when unset or unreadable.
///
/// ```text
/// PACELINE_BENCH_SECONDS=5  →  setting("PACELINE_BENCH_SECONDS", 3.0) == 5.0
/// ```
pub fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Latencies of a run, in microseconds, sorted for [`Latencies::at`].
pub struct Latencies(Vec<f64>);

impl Latencies {
    /// Sorts `micros` once.
    pub fn new(mut micros: Vec<f64>) -> Latencies {
        micros.sort_by(f64::total_cmp);
        Latencies(micros)
    }

    /// The nearest-rank quantile `q` (0.5 for the median, 0.99 for p99), in
    /// microseconds; NaN when nothing was measured. With 1..=100 measured, `at(0.99)` is
    /// the 99th value.
    pub fn at(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let rank = (q * self.0.len() as f64).ceil() as usize;
        self.0[rank.clamp(1, self.0.len()) - 1]
    }
}

/// The median of `values` (the mean of the two middle ones for an even count; NaN for none).
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// CPU time (user and system) process `pid` has used so far, from `/proc/PID/stat`; `None`
/// where it cannot be read (no such process, or not Linux).
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its ')' are plain.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, so 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_secs_f64(ticks as f64 / clock_ticks()))
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`; 100 on every Linux build known).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// The CPU time of several processes at one moment, to subtract from a later one.
pub struct CpuMark(Vec<Option<Duration>>);

impl CpuMark {
    /// The CPU time of each of `pids` now.
    pub fn now(pids: &[u32]) -> CpuMark {
        CpuMark(pids.iter().map(|&p| cpu_time(p)).collect())
    }

    /// Microseconds of CPU each of `pids` (the same as [`CpuMark::now`]'s) spent since
    /// this mark, per one of `count` things done; NaN where it could not be read.
    pub fn per(&self, pids: &[u32], count: f64) -> Vec<f64> {
        pids.iter()
            .zip(&self.0)
            .map(|(&p, before)| match (before, cpu_time(p)) {
                (Some(b), Some(a)) if count > 0.0 => {
                    a.saturating_sub(*b).as_secs_f64() * 1e6 / count
                }
                _ => f64::NAN,
            })
            .collect()
    }
}
