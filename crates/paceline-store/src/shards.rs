//! The memory store's shards: values behind reader-writer locks whose shared side scales
//! with threads.
//!
//! A classic reader-writer lock keeps one count of its readers, so two threads taking the
//! shared lock on the same shard at once fight over that count's cache line, even though
//! neither waits for the other. Here every *thread slot* has a count per shard of its own,
//! and a thread's counts for all shards lie side by side, away from every other slot's: a
//! shared lock touches only the thread's own cache line and reads the shard's writer flag,
//! which stays in every core's cache until a writer comes. The exclusive lock (taken only
//! to add or remove keys) is dearer: it raises the flag, then waits until every slot's count
//! for the shard is zero.
//!
//! The protocol is Dekker's: a reader increments its count, then reads the flag; a writer
//! raises the flag, then reads the counts; both with sequentially consistent operations, so
//! at least one of them sees the other and the reader backs off. A reader that finds the
//! flag raised waits on the writer's mutex (it sleeps; it does not spin through a long
//! sweep); a writer waits for readers by spinning, since a shared lock is held only for the
//! few dozen nanoseconds of one decision.
//!
//! Not re-entrant: a thread holding a guard on a shard must not take another on the same
//! shard (a write after a read would wait for its own count forever; a second read could
//! wait behind a writer that waits for the first). The memory store holds at most one
//! guard at a time.

use std::cell::{Cell, UnsafeCell};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Reader counts in one cache line (two, with the adjacent-line prefetcher in mind).
const COUNTS_PER_LINE: usize = 32;

#[repr(align(128))]
struct CountLine([AtomicU32; COUNTS_PER_LINE]);

/// One shard's value, its writer flag and the mutex that orders its writers, on cache lines
/// of their own.
#[repr(align(128))]
struct ShardCell<T> {
    /// Raised while a writer holds (or is about to hold) the exclusive lock.
    writing: AtomicBool,
    writer: Mutex<()>,
    value: UnsafeCell<T>,
}

/// An array of values, each behind its own reader-writer lock.
pub(crate) struct Shards<T> {
    cells: Box<[ShardCell<T>]>,
    /// `counts[slot * lines_per_slot + shard / COUNTS_PER_LINE]`: the shared locks that
    /// threads of `slot` hold on `shard`.
    counts: Box<[CountLine]>,
    lines_per_slot: usize,
    slot_mask: usize,
}

// SAFETY: a value is reached only through the guards below: shared references under the
// shared lock (so `T: Sync`), an exclusive reference under the exclusive lock, possibly on
// another thread than the one that made it (so `T: Send`).
unsafe impl<T: Send + Sync> Sync for Shards<T> {}
// SAFETY: as above; the array owns its values.
unsafe impl<T: Send> Send for Shards<T> {}

thread_local! {
    /// This thread's slot number, before masking; `usize::MAX` until first used.
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Slot numbers handed out so far.
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

/// The calling thread's slot number: threads get consecutive numbers as they first take a
/// shared lock, so threads alive together rarely share a slot (sharing one is correct, only
/// slower).
#[inline]
fn thread_slot() -> usize {
    SLOT.with(|slot| {
        let number = slot.get();
        if number != usize::MAX {
            return number;
        }
        let number = NEXT_SLOT.fetch_add(1, Ordering::Relaxed) & (usize::MAX >> 1);
        slot.set(number);
        number
    })
}

impl<T> Shards<T> {
    /// `count` shards, each holding `make()`, with a count line per shard for each of
    /// `slots` thread slots (`slots` is rounded up to a power of two).
    pub(crate) fn new(count: usize, slots: usize, mut make: impl FnMut() -> T) -> Shards<T> {
        let slots = slots.max(1).next_power_of_two();
        let lines_per_slot = count.div_ceil(COUNTS_PER_LINE).max(1);
        Shards {
            cells: (0..count)
                .map(|_| ShardCell {
                    writing: AtomicBool::new(false),
                    writer: Mutex::new(()),
                    value: UnsafeCell::new(make()),
                })
                .collect(),
            counts: (0..slots * lines_per_slot)
                .map(|_| CountLine(std::array::from_fn(|_| AtomicU32::new(0))))
                .collect(),
            lines_per_slot,
            slot_mask: slots - 1,
        }
    }

    /// The number of shards.
    pub(crate) fn len(&self) -> usize {
        self.cells.len()
    }

    fn count(&self, slot: usize, shard: usize) -> &AtomicU32 {
        &self.counts[slot * self.lines_per_slot + shard / COUNTS_PER_LINE].0
            [shard % COUNTS_PER_LINE]
    }

    /// The shared lock on shard `index`: any number of threads at once.
    #[inline]
    pub(crate) fn read(&self, index: usize) -> ReadGuard<'_, T> {
        let cell = &self.cells[index];
        let count = self.count(thread_slot() & self.slot_mask, index);
        loop {
            count.fetch_add(1, Ordering::SeqCst);
            if !cell.writing.load(Ordering::SeqCst) {
                return ReadGuard { cell, count };
            }
            // A writer is in or coming: step aside, sleep until it is done, try again.
            count.fetch_sub(1, Ordering::Release);
            drop(cell.writer.lock().unwrap_or_else(PoisonError::into_inner));
        }
    }

    /// The exclusive lock on shard `index`: waits for the readers in it to leave; readers
    /// that come meanwhile wait for this lock to be dropped.
    pub(crate) fn write(&self, index: usize) -> WriteGuard<'_, T> {
        let cell = &self.cells[index];
        // A writer that panicked left the value whole (see the memory store), so a poisoned
        // mutex is used as it is.
        let writer = cell.writer.lock().unwrap_or_else(PoisonError::into_inner);
        cell.writing.store(true, Ordering::SeqCst);
        for slot in 0..=self.slot_mask {
            let count = self.count(slot, index);
            let mut spins = 0u32;
            while count.load(Ordering::SeqCst) != 0 {
                if spins < 64 {
                    std::hint::spin_loop();
                    spins += 1;
                } else {
                    std::thread::yield_now();
                }
            }
        }
        WriteGuard {
            cell,
            _writer: writer,
        }
    }
}

/// The shared lock on one shard; dereferences to its value.
pub(crate) struct ReadGuard<'a, T> {
    cell: &'a ShardCell<T>,
    count: &'a AtomicU32,
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: while this guard lives our count is non-zero, so no writer holds the
        // exclusive lock (a writer waits for every count to be zero after raising its flag,
        // and we saw the flag down after raising our count).
        unsafe { &*self.cell.value.get() }
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Release);
    }
}

/// The exclusive lock on one shard; dereferences to its value.
pub(crate) struct WriteGuard<'a, T> {
    cell: &'a ShardCell<T>,
    _writer: MutexGuard<'a, ()>,
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: this guard holds the exclusive lock: the writer mutex, the flag raised and
        // every reader count seen at zero after it was raised.
        unsafe { &*self.cell.value.get() }
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.cell.value.get() }
    }
}

impl<T> Drop for WriteGuard<'_, T> {
    fn drop(&mut self) {
        // Before the mutex is released (the field drops after this), so a reader that
        // wakes on the mutex finds the flag down.
        self.cell.writing.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn readers_and_writers_never_overlap() {
        // Each shard holds a pair that writers keep equal; a reader seeing them differ
        // would have overlapped a writer.
        let shards = Shards::new(3, 2, || (AtomicU64::new(0), AtomicU64::new(0)));
        let torn = AtomicU64::new(0);
        let reads = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (shards, torn, reads) = (&shards, &torn, &reads);
                s.spawn(move || {
                    for i in 0..20_000u64 {
                        let index = ((i + t) % 3) as usize;
                        if (i + t) % 7 == 0 {
                            let guard = shards.write(index);
                            let next = guard.0.load(Ordering::Relaxed) + 1;
                            guard.0.store(next, Ordering::Relaxed);
                            std::hint::spin_loop();
                            guard.1.store(next, Ordering::Relaxed);
                        } else {
                            let guard = shards.read(index);
                            let a = guard.0.load(Ordering::Relaxed);
                            let b = guard.1.load(Ordering::Relaxed);
                            if a != b {
                                torn.fetch_add(1, Ordering::Relaxed);
                            }
                            reads.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(torn.load(Ordering::Relaxed), 0);
        assert!(reads.load(Ordering::Relaxed) > 60_000);
        let writes: u64 = (0..3)
            .map(|i| shards.read(i).0.load(Ordering::Relaxed))
            .sum();
        let expected = (0..4u64)
            .map(|t| (0..20_000u64).filter(|i| (i + t) % 7 == 0).count() as u64)
            .sum::<u64>();
        assert_eq!(writes, expected, "no write is lost");
    }

    #[test]
    fn a_writer_waits_for_a_reader_and_a_reader_for_a_writer() {
        let shards = Shards::new(1, 4, || 0u64);
        let reader = shards.read(0);
        std::thread::scope(|s| {
            let writer = s.spawn(|| {
                *shards.write(0) += 1;
            });
            // The writer cannot finish while the read guard lives.
            std::thread::yield_now();
            assert_eq!(*reader, 0);
            drop(reader);
            writer
                .join()
                .expect("the writer finishes once the reader has left");
        });
        let mut guard = shards.write(0);
        *guard += 1;
        let late = std::thread::scope(|s| {
            let late = s.spawn(|| *shards.read(0));
            std::thread::yield_now();
            drop(guard);
            late.join()
                .expect("the reader finishes once the writer has left")
        });
        assert_eq!(late, 2, "the reader saw the writer's value");
    }
}
