//! Giving memory the process no longer uses back to the system.
//!
//! The binary allocates with the system allocator: glibc's malloc on Linux. A burst of new
//! keys fills the memory store's tables and states; once the keys are idle the store's
//! sweeper drops them and frees that memory, but malloc keeps freed memory inside its heaps
//! (one per thread arena), resident, for later allocations: only the top of a heap goes back
//! on its own. [`spawn_trimmer`] starts a thread that watches, once a second, how much freed
//! memory malloc holds and, once that has grown by 16 MiB since its lowest point after the
//! last trim (or by 1 MiB, and the process has gone quiet), has malloc return the free pages
//! inside its heaps (`malloc_trim`). A service that goes idle after a burst of keys thus
//! comes back to about its memory before the burst a second or two after the sweep.
//!
//! mimalloc, the allocator before, could not do this: each thread's freed pages go back only
//! when that thread allocates again, and the service's worker threads sleep once traffic
//! stops, so a service that went quiet after a burst kept most of its peak.

/// Starts the thread that returns freed memory to the system (see the module's docs), for
/// the long-running commands. Nothing where the allocator is not glibc's malloc.
pub(crate) fn spawn_trimmer() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // Without the thread the service still works; freed memory stays resident.
        let _ = std::thread::Builder::new()
            .name("paceline-trim".into())
            .spawn(glibc::trim_forever);
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    use std::os::raw::c_int;
    use std::time::Duration;

    /// How often the trimmer reads how much freed memory malloc holds.
    const CHECK_EVERY: Duration = Duration::from_secs(1);

    /// Trim once the freed memory malloc holds has grown by this many bytes since its lowest
    /// point after the previous trim: memory that a sweep, or anything else, gave back.
    const TRIM_AFTER_FREED: i64 = 16 * 1024 * 1024;

    /// Or once it has grown by this many bytes and then stayed within [`QUIET`] of where it
    /// was a check before: the rest of a burst's memory, once the process has gone quiet.
    const TRIM_WHEN_QUIET: i64 = 1024 * 1024;

    /// How little the freed memory may change between two checks in a quiet process (bytes).
    const QUIET: i64 = 64 * 1024;

    /// glibc's `struct mallinfo`. Its fields are `int`s, so a count past 2 GiB comes out
    /// modulo 2^32; only `fordblks`, the free bytes malloc holds, is read, and only as the
    /// differences between samples. (`mallinfo2`, with `size_t` fields, needs glibc 2.33.)
    #[repr(C)]
    struct Mallinfo {
        arena: c_int,
        ordblks: c_int,
        smblks: c_int,
        hblks: c_int,
        hblkhd: c_int,
        usmblks: c_int,
        fsmblks: c_int,
        uordblks: c_int,
        fordblks: c_int,
        keepcost: c_int,
    }

    extern "C" {
        fn mallinfo() -> Mallinfo;
        fn malloc_trim(pad: usize) -> c_int;
    }

    /// The free bytes malloc holds over all its arenas, modulo 2^32.
    fn free_bytes() -> u32 {
        // SAFETY: `mallinfo` takes no arguments and only reads malloc's statistics, under
        // each arena's lock.
        let info = unsafe { mallinfo() };
        info.fordblks as u32
    }

    pub(super) fn trim_forever() {
        let mut free = FreeMemory::new(free_bytes());
        loop {
            std::thread::sleep(CHECK_EVERY);
            if free.sample(free_bytes()) {
                // SAFETY: `malloc_trim` hands the whole free pages inside malloc's heaps back
                // to the system (madvise), under each arena's lock; no live allocation moves.
                unsafe { malloc_trim(0) };
                free.trimmed();
            }
        }
    }

    /// The freed memory malloc holds, followed from samples of its 32-bit (wrapping) count.
    #[derive(Debug)]
    struct FreeMemory {
        /// The last sample, as malloc reports it.
        last: u32,
        /// The free bytes relative to the first sample: the sum of the samples' differences,
        /// each read as a signed 32-bit number, so exact while the free memory changes by
        /// less than 2 GiB from one sample to the next.
        level: i64,
        /// The lowest `level` since the last trim (or the first sample).
        lowest: i64,
        /// True once the free memory moved by more than [`QUIET`] since the last trim: the
        /// first quiet check after that trims once more, whatever was freed, so that what
        /// the last trim could not hand back (a burst still ending as it ran) goes too.
        active: bool,
    }

    impl FreeMemory {
        fn new(sample: u32) -> FreeMemory {
            FreeMemory {
                last: sample,
                level: 0,
                lowest: 0,
                active: false,
            }
        }

        /// Takes a sample; true if a trim is due.
        fn sample(&mut self, sample: u32) -> bool {
            let change = i64::from(sample.wrapping_sub(self.last) as i32);
            self.level += change;
            self.last = sample;
            self.lowest = self.lowest.min(self.level);
            let freed = self.level - self.lowest;
            let quiet = change.abs() <= QUIET;
            let settled = quiet && self.active;
            self.active |= !quiet;
            freed >= TRIM_AFTER_FREED || (freed >= TRIM_WHEN_QUIET && quiet) || settled
        }

        /// A trim handed the free memory back: count what is freed from here.
        fn trimmed(&mut self) {
            self.active = false;
            self.lowest = self.level;
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        const MIB: u32 = 1024 * 1024;

        #[test]
        fn a_trim_is_due_once_free_memory_grew_by_16_mib_from_its_lowest() {
            let mut free = FreeMemory::new(40 * MIB);
            assert!(!free.sample(30 * MIB));
            assert!(!free.sample(45 * MIB));
            // 16 MiB above the lowest point (30 MiB), though only 6 above the first sample.
            assert!(free.sample(46 * MIB));
            free.trimmed();
            assert!(
                !free.sample(46 * MIB),
                "a trim counts from where it left off"
            );
            assert!(!free.sample(50 * MIB));
            assert!(free.sample(62 * MIB));
        }

        #[test]
        fn a_trim_is_due_once_free_memory_grew_by_1_mib_and_stopped_changing() {
            let mut free = FreeMemory::new(40 * MIB);
            assert!(!free.sample(40 * MIB), "nothing freed");
            assert!(!free.sample(42 * MIB), "still changing");
            assert!(free.sample(42 * MIB));
            free.trimmed();
            assert!(
                !free.sample(42 * MIB + MIB / 2),
                "less than 1 MiB freed, still changing"
            );
            assert!(
                free.sample(42 * MIB + MIB / 2),
                "it moved since the last trim, and has settled: one trim more"
            );
            free.trimmed();
            assert!(!free.sample(42 * MIB + MIB / 2), "idle: no trim after trim");
            assert!(!free.sample(42 * MIB + MIB / 2));
        }

        #[test]
        fn a_count_that_wraps_past_32_bits_counts_by_its_differences() {
            let start = u32::MAX - 4 * MIB;
            let mut free = FreeMemory::new(start);
            // 20 MiB more: the count wraps past zero.
            assert!(free.sample(start.wrapping_add(20 * MIB)));
            free.trimmed();
            // 100 MiB less, wrapping back, then 16 MiB more.
            assert!(!free.sample(start.wrapping_sub(80 * MIB)));
            assert_eq!(free.level, -80 * i64::from(MIB));
            assert!(free.sample(start.wrapping_sub(64 * MIB)));
        }
    }
}
