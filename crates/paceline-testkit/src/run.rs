//! Running tests: a runtime for synchronous runners, property cases, and the open files a
//! test with many connections needs.

/// Raises this process's soft limit of open files to `wanted` if it is lower (as far as the
/// hard limit allows), for tests that open many connections; answers the limit now.
pub fn open_files_at_least(wanted: u64) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` and `setrlimit` read and write only the struct they are given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < wanted {
            let raised = libc::rlimit {
                rlim_cur: wanted.min(limit.rlim_max),
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit.rlim_cur = raised.rlim_cur;
            }
        }
    }
    limit.rlim_cur
}

/// A current-thread tokio runtime with I/O and time, for tests that drive async stores from
/// a synchronous runner (proptest's).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Runs property `test` over `strategy`'s cases (`PROPTEST_CASES` of them if set, else
/// `default`), without persisting failures; panics with proptest's report (the minimal
/// failing case) and the seed that replays the run at the first failure. The same as
/// [`Cases::new(default).run(strategy, test)`](crate::differential::Cases).
pub fn check_cases<S: proptest::strategy::Strategy>(
    default: u32,
    strategy: &S,
    test: impl Fn(S::Value) -> Result<(), proptest::test_runner::TestCaseError>,
) {
    crate::differential::Cases::new(default).run(strategy, test);
}
