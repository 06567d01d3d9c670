//! Typed construction: every algorithm's constructor gives the policy its spec string
//! gives, and refuses what the spec parser refuses, naming the same field.

use std::time::Duration;

use paceline_core::policy::{
    Concurrency, ExecEvenly, FixedWindow, Gcra, Pacer, SlidingLog, SlidingWindow, SmoothBursty,
    SmoothWarmingUp,
};
use paceline_core::{InputError, Policy, Rate};

fn spec(text: &str) -> Policy {
    text.parse()
        .unwrap_or_else(|e| panic!("{text} does not parse: {e}"))
}

#[test]
fn every_algorithm_built_typed_equals_its_spec() -> Result<(), InputError> {
    let secs = Duration::from_secs;
    let ms = Duration::from_millis;
    let typed: Vec<(Policy, &str)> = vec![
        (
            Pacer::new(Rate::per_second(10)?, 2.0, None)?.into(),
            "pacer:rate=10/s,max_burst=2",
        ),
        (
            Pacer::new(Rate::per_minute(30)?, 0.0, Some(0.5))?.into(),
            "pacer:qps=30/m,burst_allowance_factor=0.5",
        ),
        (
            Gcra::new(Rate::per_second(10)?, 5)?.into(),
            "gcra:rate=10/s,burst=5",
        ),
        (
            Gcra::new(Rate::new(5, secs(10))?, 1)?.into(),
            "gcra:rate=5/10s",
        ),
        (
            FixedWindow::new(10, secs(10))?.into(),
            "fixed_window:limit=10,window=10s",
        ),
        (
            ExecEvenly::new(10, secs(1), None)?.into(),
            "exec_evenly:points=10,duration=1s",
        ),
        (
            ExecEvenly::new(10, secs(1), Some(ms(50)))?.into(),
            "exec_evenly:points=10,duration=1s,min_delay=50ms",
        ),
        (
            SlidingLog::new(100, secs(60), Duration::ZERO, false)?.into(),
            "sliding_log:limit=100,window=1m",
        ),
        (
            SlidingLog::new(3, secs(10), ms(100), true)?.into(),
            "sliding_log:limit=3,window=10s,min_interval=100ms,count_blocked=true",
        ),
        (
            SlidingWindow::new(100, secs(60))?.into(),
            "sliding_window:limit=100,window=1m",
        ),
        (
            SmoothBursty::new(Rate::per_second(5)?, 1.0)?.into(),
            "smooth_bursty:rate=5/s",
        ),
        (
            SmoothWarmingUp::new(Rate::per_second(2)?, secs(4), 3.0)?.into(),
            "smooth_warming_up:rate=2/s,warmup=4s",
        ),
        (
            Gcra::new(Rate::per_hour(1000)?, 1)?.into(),
            "gcra:rate=1000/h",
        ),
        (Gcra::new(Rate::per_day(1)?, 1)?.into(), "gcra:rate=1/d"),
        (
            Concurrency::new(10, secs(30))?.into(),
            "concurrency:limit=10,lease=30s",
        ),
    ];
    let mut algorithms: Vec<&str> = typed.iter().map(|(p, _)| p.algorithm()).collect();
    algorithms.sort_unstable();
    algorithms.dedup();
    assert_eq!(
        algorithms.len(),
        paceline_core::ALGORITHMS.len(),
        "every algorithm"
    );
    for (policy, text) in typed {
        assert_eq!(policy, spec(text), "{text}");
        // And the canonical spec reads back to the same policy.
        assert_eq!(spec(&policy.to_string()), policy, "{text}");
    }
    Ok(())
}

#[test]
fn typed_values_are_refused_like_their_spec() {
    let field = |r: Result<Policy, InputError>| r.map(|_| ()).unwrap_err().field().to_string();
    let secs = Duration::from_secs;
    let cases: Vec<(String, &str)> = vec![
        (
            Rate::per_second(0)
                .map(|_| ())
                .unwrap_err()
                .field()
                .to_string(),
            "rate",
        ),
        (
            Rate::per_second(f64::NAN)
                .map(|_| ())
                .unwrap_err()
                .field()
                .to_string(),
            "rate",
        ),
        (
            Rate::new(1, Duration::ZERO)
                .map(|_| ())
                .unwrap_err()
                .field()
                .to_string(),
            "rate",
        ),
        (
            field(Gcra::new(Rate::per_second(1).unwrap(), 0).map(Policy::from)),
            "burst",
        ),
        (
            field(FixedWindow::new(0, secs(1)).map(Policy::from)),
            "limit",
        ),
        (
            field(FixedWindow::new(1, Duration::ZERO).map(Policy::from)),
            "window",
        ),
        (
            field(ExecEvenly::new(1, Duration::from_nanos(1500), None).map(Policy::from)),
            "duration",
        ),
        (
            field(SlidingLog::new(20_000, secs(1), Duration::ZERO, false).map(Policy::from)),
            "limit",
        ),
        (
            field(
                SmoothWarmingUp::new(Rate::per_second(1).unwrap(), Duration::ZERO, 3.0)
                    .map(Policy::from),
            ),
            "warmup",
        ),
        (
            field(Pacer::new(Rate::per_second(1).unwrap(), -1.0, None).map(Policy::from)),
            "max_burst",
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got, want);
    }
    // The same fields as the spec parser names.
    for (text, want) in [
        ("gcra:rate=0/s", "rate"),
        ("gcra:rate=1/s,burst=0", "burst"),
        ("fixed_window:limit=0,window=1s", "limit"),
        ("sliding_log:limit=20000,window=1s", "limit"),
        ("smooth_warming_up:rate=1/s,warmup=0s", "warmup"),
        ("pacer:rate=1/s,max_burst=-1", "max_burst"),
    ] {
        assert_eq!(text.parse::<Policy>().unwrap_err().field(), want, "{text}");
    }
}
