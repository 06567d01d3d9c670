//! The queue's Redis twin against the core in memory at its edges: a policy changed to
//! another algorithm, jobs going back to their places by rank, a queue in the earlier
//! layout, cancelled jobs' entries dropped a bounded number a call, and more groups than
//! the twin keeps unpacked.

use std::sync::Arc;
use std::time::Duration;

use paceline_core::{Clock, ManualClock};
use paceline_queue::{Failure, NewJob, Queue, QueueConfig, RedisQueue};
use paceline_testkit::{runtime, shared_server, unique_name};

mod common;
use common::redis::{open_at, unsigned};

/// A group's policy changed to another algorithm while it has a backlog: the group starts
/// afresh under the new one, exactly as the Rust core does (`QueueCore::set_config`).
#[test]
fn a_changed_algorithm_starts_the_group_afresh_as_in_memory() {
    use paceline_queue::QueueCore;
    runtime().block_on(async {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        let name = unique_name("realgorithm");
        let url = shared_server().url();
        let before = QueueConfig::new("gcra:rate=2/s,burst=2".parse().unwrap());
        let after = QueueConfig::new("fixed_window:limit=3,window=10s".parse().unwrap());
        let mut core = QueueCore::new(before.clone()).unwrap();
        let first = Queue::new(open_at(&url, &name, before, Some(Arc::clone(&shared))).await);
        for n in 0..8u8 {
            let job = NewJob::new("g", vec![n]);
            let now = clock.now_micros();
            assert_eq!(first.enqueue(job.clone()).await, core.enqueue(now, job));
        }
        let now = clock.now_micros();
        assert_eq!(
            first
                .lease("w", 5, None, Duration::ZERO)
                .await
                .map(|jobs| unsigned(&jobs)),
            core.lease(now, "w", 5, None)
        );
        // Another process opens the queue with the new policy.
        core.set_config(after.clone()).unwrap();
        let second = Queue::new(open_at(&url, &name, after, Some(Arc::clone(&shared))).await);
        for _ in 0..3 {
            clock.advance(Duration::from_millis(700));
            let now = clock.now_micros();
            let (a, b) = (
                second
                    .lease("w", 5, None, Duration::ZERO)
                    .await
                    .map(|jobs| unsigned(&jobs)),
                core.lease(now, "w", 5, None),
            );
            assert!(a.is_ok(), "{a:?}");
            assert_eq!(a, b);
        }
        let now = clock.now_micros();
        let (a, b) = (second.stats().await.unwrap(), core.stats(now).unwrap());
        assert_eq!(a, b);
    });
}

/// Opens handles on one Redis queue whose policy no group reaches, on a virtual clock.
struct Opener {
    name: String,
    config: QueueConfig,
    clock: Arc<dyn Clock>,
}

impl Opener {
    async fn open(&self) -> RedisQueue {
        open_at(
            &shared_server().url(),
            &self.name,
            self.config.clone(),
            Some(Arc::clone(&self.clock)),
        )
        .await
    }
}

/// A queue whose policy no group reaches, in memory and (through the opener) in Redis, on
/// one virtual clock.
fn unlimited_twins(prefix: &str) -> (ManualClock, paceline_queue::QueueCore, Opener) {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let config = QueueConfig::new("gcra:rate=1000000/s,burst=1000000".parse().unwrap());
    let core = paceline_queue::QueueCore::new(config.clone()).unwrap();
    let opener = Opener {
        name: unique_name(prefix),
        config,
        clock: Arc::new(clock.clone()),
    };
    (clock, core, opener)
}

/// Jobs that go back to their group (released, here in a scrambled order, some among new
/// jobs and one of them cancelled) take their places by rank in the group's line in Redis,
/// as in memory: the next leases start them in the order they were first enqueued, then
/// the new ones. The next event is the same on both, with nothing to wait for and with
/// leases out.
#[test]
fn returned_jobs_take_their_places_by_rank_as_in_memory() {
    use paceline_queue::QueueBackend;
    runtime().block_on(async {
        let (clock, mut core, opener) = unlimited_twins("ranks");
        // A second handle on the queue, for what `Queue` does not show.
        let (redis, backend) = (Queue::new(opener.open().await), opener.open().await);
        assert_eq!(backend.next_event().await, Ok(None));
        assert_eq!(core.next_event(), None);
        let total = 40usize;
        for n in 0..total {
            let job = NewJob::new("g", vec![n as u8]);
            let now = clock.now_micros();
            assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        }
        let now = clock.now_micros();
        let (leased, expected) = (
            redis.lease("w", total, None, Duration::ZERO).await.unwrap(),
            core.lease(now, "w", total, None).unwrap(),
        );
        assert_eq!(unsigned(&leased), expected);
        // Released in the order 0, 17, 34, 11, ... (17 is prime to 40: each once), with
        // a new job after every eighth.
        for i in 0..total {
            let job = &leased[i * 17 % total];
            let now = clock.now_micros();
            assert_eq!(
                redis.fail(&job.id, &job.token, Failure::Release).await,
                core.fail(now, &job.id, job.lease, Failure::Release, 0.5),
                "release {i}"
            );
            if i % 8 == 7 {
                let job = NewJob::new("g", b"new".to_vec());
                let now = clock.now_micros();
                assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
            }
        }
        let cancelled = &leased[total / 2].id;
        let now = clock.now_micros();
        assert_eq!(redis.cancel(cancelled).await, core.cancel(now, cancelled));
        let now = clock.now_micros();
        let (again, expected) = (
            redis.lease("w", 1_000, None, Duration::ZERO).await.unwrap(),
            core.lease(now, "w", 1_000, None).unwrap(),
        );
        assert_eq!(unsigned(&again), expected);
        let order: Vec<&str> = again.iter().map(|j| j.id.as_str()).collect();
        let first: Vec<&str> = leased
            .iter()
            .map(|j| j.id.as_str())
            .filter(|id| id != cancelled)
            .collect();
        assert_eq!(
            order[..total - 1],
            first[..],
            "the returned jobs first, by rank"
        );
        assert!(again[total - 1..].iter().all(|j| j.payload == b"new"));
        assert_eq!(again.len(), total - 1 + total / 8);
        let expiry = core.next_event();
        assert!(
            expiry.is_some_and(|at| at > clock.now_micros()),
            "{expiry:?}"
        );
        assert_eq!(backend.next_event().await, Ok(expiry));
    });
}

/// A queue written in the earlier layout (its meta record a MessagePack map without `due`,
/// each group's whole line a sorted set scored by rank, group records MessagePack maps that
/// do not know the length of their line's front, job records MessagePack maps) is read as
/// it is and goes on as in memory: the same ids, order, estimates and totals. The sorted
/// set serves as the line's front, new jobs join the list behind it, and each record is
/// written back in the flat layout.
#[test]
fn a_queue_in_the_earlier_layout_goes_on_as_in_memory() {
    runtime().block_on(async {
        let (clock, mut core, opener) = unlimited_twins("layout");
        let (server, name) = (shared_server(), &opener.name);
        let redis = Queue::new(opener.open().await);
        for n in 0..12u8 {
            let job = NewJob::new(format!("g{}", n % 2), vec![n]);
            let now = clock.now_micros();
            assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        }
        // Back to the earlier layout: the meta record as MessagePack, both lines wholly in
        // sorted sets, and group records without the length of the front.
        let base = format!("paceline:v2:{{q:{name}}}:");
        let downgrade = r"
            local function opt(v) if v < 0 then return nil end return v end
            local _, seq, last_id, now, jobs, _, _, a, b, c, d, e, f, g, h =
              struct.unpack('<Bdddddddddddddd', redis.call('GET', KEYS[1] .. 'meta'))
            redis.call('SET', KEYS[1] .. 'meta', cmsgpack.pack({ seq = seq,
              last_id = last_id, now = now, jobs = jobs, totals = { enqueued = a,
              started = b, acked = c, failed = d, retried = e, dead = f,
              lease_expiries = g, pauses = h } }))
            for _, group in ipairs({'g0', 'g1'}) do
              local list = KEYS[1] .. 'q:' .. group
              for _, e in ipairs(redis.call('LRANGE', list, 0, -1)) do
                redis.call('ZADD', KEYS[1] .. 'l:' .. group, tonumber(e:sub(1, 20)), e:sub(21))
              end
              redis.call('DEL', list)
              local _, n, active, idle_at, next_at, paused_until, _, x, ra, ro, rt, tat, last,
                covers, ptat, alg, palg = struct.unpack('<BddddddddddddddBB',
                redis.call('GET', KEYS[1] .. 'g:' .. group))
              local g = { n = n, active = active, idle_at = idle_at, next_at = next_at,
                paused_until = paused_until, x = opt(x), ra = opt(ra), ro = opt(ro),
                rt = opt(rt), state = tat >= 0 and { tat } or nil,
                alg = alg == 1 and 'gcra' or nil }
              if last >= 0 then
                g.p = { last = last, covers = covers, s = ptat >= 0 and { ptat } or nil,
                  alg = palg == 1 and 'gcra' or nil }
              end
              redis.call('SET', KEYS[1] .. 'g:' .. group, cmsgpack.pack(g))
            end
            local places = { 'waiting', 'scheduled', 'active', 'dead' }
            for _, key in ipairs(redis.call('KEYS', KEYS[1] .. 'j:*')) do
              local _, place, head, has_error, rank, attempts, max_attempts, enqueued_at,
                estimate, token, started, expires, at, order, ended, dead_order, group, worker,
                err, payload = struct.unpack('<BBBBddddddddddddI4c0I4c0I4c0I4c0',
                redis.call('GET', key))
              local job = { group = group, rank = rank, payload = payload, attempts = attempts,
                max_attempts = max_attempts, enqueued_at = enqueued_at, place = places[place],
                estimated_start = opt(estimate), token = opt(token), started = opt(started),
                expires = opt(expires), at = opt(at), order = opt(order), ended = opt(ended),
                dead_order = opt(dead_order) }
              if head > 0 then job.head = head == 2 end
              if has_error == 1 then job.last_error = err end
              if place == 3 then job.worker = worker end
              redis.call('SET', key, cmsgpack.pack(job))
            end
            return redis.call('ZCARD', KEYS[1] .. 'l:g0')";
        assert_eq!(
            server.command(&["EVAL", downgrade, "1", &base]).unwrap(),
            ":6"
        );
        let (front, list) = (format!("{base}l:g0"), format!("{base}q:g0"));
        let meta_tag = "return string.byte(redis.call('GET', KEYS[1] .. 'meta'), 1)";
        assert_eq!(server.command(&["TYPE", &front]).unwrap(), "+zset");
        assert_eq!(server.command(&["TYPE", &list]).unwrap(), "+none");
        // A MessagePack map of five entries.
        assert_eq!(
            server.command(&["EVAL", meta_tag, "1", &base]).unwrap(),
            ":133"
        );
        let job = NewJob::new("g0", b"after".to_vec());
        let now = clock.now_micros();
        assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        assert_eq!(server.command(&["ZCARD", &front]).unwrap(), ":6");
        assert_eq!(server.command(&["LLEN", &list]).unwrap(), ":1");
        // Written back in the binary layout ('n': no priorities in use).
        assert_eq!(
            server.command(&["EVAL", meta_tag, "1", &base]).unwrap(),
            ":110"
        );
        let tag = "return string.byte(redis.call('GET', KEYS[1]), 1)";
        let (group, job) = (format!("{base}g:g0"), format!("{base}j:1"));
        // MessagePack maps (0x80 and up) until written.
        let first_byte = server.command(&["EVAL", tag, "1", &job]).unwrap();
        let first_byte: u32 = first_byte.trim_start_matches(':').parse().unwrap();
        assert!(first_byte >= 0x80, "{first_byte}");
        let now = clock.now_micros();
        let (a, b) = (
            redis.lease("w", 100, None, Duration::ZERO).await.unwrap(),
            core.lease(now, "w", 100, None).unwrap(),
        );
        assert_eq!(a.len(), 13);
        assert_eq!(unsigned(&a), b);
        // Each record written back in the flat layout: 'G' for groups, 'J' for jobs (their
        // fields after those at the defaults).
        assert_eq!(server.command(&["EVAL", tag, "1", &group]).unwrap(), ":71");
        assert_eq!(server.command(&["EVAL", tag, "1", &job]).unwrap(), ":74");
        let now = clock.now_micros();
        assert_eq!(redis.stats().await.unwrap(), core.stats(now).unwrap());
    });
}

/// A queue written in the flat layouts before priorities and costs (meta 'n', groups 'G',
/// jobs 'J': the same records without their last fields) goes on as the core in memory
/// does; records whose new fields are not the defaults are written in the longer layouts
/// (meta 'o', groups 'H', jobs 'K'), the others stay short.
#[test]
fn a_queue_in_the_layout_before_priorities_goes_on_as_in_memory() {
    runtime().block_on(async {
        let (clock, mut core, opener) = unlimited_twins("before-priorities");
        let (server, name) = (shared_server(), &opener.name);
        let redis = Queue::new(opener.open().await);
        for n in 0..8u8 {
            let job = NewJob::new(format!("g{}", n % 2), vec![n]);
            let now = clock.now_micros();
            assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        }
        let now = clock.now_micros();
        let leased = redis.lease("w", 2, None, Duration::ZERO).await.unwrap();
        assert_eq!(unsigned(&leased), core.lease(now, "w", 2, None).unwrap());
        let base = format!("paceline:v2:{{q:{name}}}:");
        // Each record in the layout before (jobs of defaults are written so already): the
        // meta record without `lv` (8 bytes), a group without `c` and `rl` (16), a job
        // without its priority, cost, flags and empty progress and result (18).
        let downgrade = r"
            local function cut(key, from, drop, tag)
              local raw = redis.call('GET', key)
              if raw:byte(1) == from then
                redis.call('SET', key, string.char(tag) .. raw:sub(2, #raw - drop))
              end
              return raw:byte(1) == from or raw:byte(1) == tag
            end
            local n = 0
            for _, key in ipairs(redis.call('KEYS', KEYS[1] .. 'j:*')) do
              if cut(key, 75, 18, 74) then
                n = n + 1
              end
            end
            cut(KEYS[1] .. 'meta', 111, 8, 110)
            cut(KEYS[1] .. 'g:g0', 72, 16, 71)
            cut(KEYS[1] .. 'g:g1', 72, 16, 71)
            return n";
        assert_eq!(
            server.command(&["EVAL", downgrade, "1", &base]).unwrap(),
            ":8"
        );
        let (a, b) = (redis.job("1").await.unwrap(), core.job("1"));
        assert_eq!(a, b);
        let job = NewJob::new("g0", b"after".to_vec());
        let now = clock.now_micros();
        assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        let id = leased[0].id.clone();
        let now = clock.now_micros();
        assert_eq!(
            redis.ack(&id, &leased[0].token).await,
            core.ack(now, &id, leased[0].lease)
        );
        let now = clock.now_micros();
        let (a, b) = (
            redis.lease("w", 100, None, Duration::ZERO).await.unwrap(),
            core.lease(now, "w", 100, None).unwrap(),
        );
        assert_eq!(a.len(), 7);
        assert_eq!(unsigned(&a), b);
        let tag = "return string.byte(redis.call('GET', KEYS[1]), 1)";
        let meta = format!("{base}meta");
        assert_eq!(server.command(&["EVAL", tag, "1", &meta]).unwrap(), ":110");
        let group = format!("{base}g:g0");
        assert_eq!(server.command(&["EVAL", tag, "1", &group]).unwrap(), ":71");
        let job = format!("{base}j:3");
        assert_eq!(server.command(&["EVAL", tag, "1", &job]).unwrap(), ":74");
        // A job of priority 3 and cost 2 alone in its group: the longer layouts.
        let job = NewJob::new("g9", b"urgent".to_vec()).priority(3).cost(2);
        let now = clock.now_micros();
        assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        assert_eq!(server.command(&["EVAL", tag, "1", &meta]).unwrap(), ":111");
        let group = format!("{base}g:g9");
        assert_eq!(server.command(&["EVAL", tag, "1", &group]).unwrap(), ":72");
        let job = format!("{base}j:10");
        assert_eq!(server.command(&["EVAL", tag, "1", &job]).unwrap(), ":75");
        let now = clock.now_micros();
        assert_eq!(
            unsigned(&redis.lease("w", 1, None, Duration::ZERO).await.unwrap()),
            core.lease(now, "w", 1, None).unwrap()
        );
        let now = clock.now_micros();
        assert_eq!(redis.stats().await.unwrap(), core.stats(now).unwrap());
    });
}

/// Enqueues `n` jobs to group `g` in one batch on both queues at `now`, checking that they
/// answer alike; the jobs' ids.
async fn enqueue_both(
    redis: &Queue,
    core: &mut paceline_queue::QueueCore,
    now: u64,
    n: u32,
) -> Vec<String> {
    let jobs: Vec<NewJob> = (0..n)
        .map(|n| NewJob::new("g", n.to_be_bytes().to_vec()))
        .collect();
    let answers = redis.enqueue_batch(jobs.clone()).await;
    answers
        .into_iter()
        .zip(jobs)
        .map(|(enqueued, job)| {
            assert_eq!(enqueued, core.enqueue(now, job));
            enqueued.unwrap().id
        })
        .collect()
}

/// A cancelled job leaves its entry in the group's list until the entry reaches the head
/// (finding it at once would scan the list): a lease drops such entries on its way, at
/// most a thousand a call, so a call after many cancels may answer fewer jobs than memory
/// does and the next calls go on; the jobs started, their order and the counts are the
/// same.
#[test]
fn cancelled_jobs_entries_are_dropped_a_bounded_number_a_call() {
    runtime().block_on(async {
        let (clock, mut core, opener) = unlimited_twins("cancels");
        let redis = Queue::new(opener.open().await);
        let ids = enqueue_both(&redis, &mut core, clock.now_micros(), 1_250).await;
        // The first 1,100 cancelled, and one further back.
        for id in ids[..1_100].iter().chain([&ids[1_200]]) {
            let now = clock.now_micros();
            assert_eq!(redis.cancel(id).await, core.cancel(now, id));
        }
        let now = clock.now_micros();
        let expected = core.lease(now, "w", 1_000, None).unwrap();
        assert_eq!(expected.len(), 149);
        // The first call drops a thousand entries and starts nothing; the next drops the
        // rest ahead of the first live job and starts them all.
        let first = redis.lease("w", 1_000, None, Duration::ZERO).await.unwrap();
        assert!(first.is_empty(), "{} jobs", first.len());
        let second = redis.lease("w", 1_000, None, Duration::ZERO).await.unwrap();
        let ids_of =
            |jobs: &[paceline_queue::Leased]| jobs.iter().map(|j| j.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids_of(&second), ids_of(&expected));
        let now = clock.now_micros();
        let (a, b) = (redis.counts().await.unwrap(), core.counts(now).unwrap());
        assert_eq!((a.waiting, a.active), (b.waiting, b.active));
        assert_eq!((a.waiting, a.active), (0, 149));
        // The thousand is a lease call's, not each group's: live jobs 999 cancelled
        // entries apart, the first call gets past the first gap only.
        let now = clock.now_micros();
        let spaced = enqueue_both(&redis, &mut core, now, 2_001).await;
        for (n, id) in spaced.iter().enumerate() {
            if n % 1_000 != 0 {
                assert_eq!(redis.cancel(id).await, core.cancel(now, id));
            }
        }
        let expected = ids_of(&core.lease(now, "w", 10, None).unwrap());
        assert_eq!(expected, [&*spaced[0], &*spaced[1_000], &*spaced[2_000]]);
        let first = redis.lease("w", 10, None, Duration::ZERO).await.unwrap();
        assert_eq!(ids_of(&first), expected[..2]);
        let second = redis.lease("w", 10, None, Duration::ZERO).await.unwrap();
        assert_eq!(ids_of(&second), expected[2..]);
        // An id cancelled and enqueued again takes its new place: its old entry, met
        // first, is its job's no longer.
        for job in [
            NewJob::new("g", b"1".to_vec()).id("again"),
            NewJob::new("g", b"2".to_vec()).id("between"),
        ] {
            let now = clock.now_micros();
            assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        }
        let now = clock.now_micros();
        assert_eq!(redis.cancel("again").await, core.cancel(now, "again"));
        let job = NewJob::new("g", b"3".to_vec()).id("again");
        assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        let now = clock.now_micros();
        let (a, b) = (
            redis.lease("w", 10, None, Duration::ZERO).await.unwrap(),
            core.lease(now, "w", 10, None).unwrap(),
        );
        assert_eq!(unsigned(&a), b);
        assert_eq!(ids_of(&a), ["between", "again"]);
        // A group whose only job is cancelled is dropped by the next call, which may also
        // make it anew: the cancelled job's entry is not the new group's.
        let job = NewJob::new("h", b"solo".to_vec()).id("solo");
        let now = clock.now_micros();
        assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        assert_eq!(redis.cancel("solo").await, core.cancel(now, "solo"));
        clock.advance(Duration::from_millis(1));
        let job = NewJob::new("h", b"next".to_vec()).id("next");
        let now = clock.now_micros();
        assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        let (a, b) = (
            redis.lease("w", 10, None, Duration::ZERO).await.unwrap(),
            core.lease(now, "w", 10, None).unwrap(),
        );
        assert_eq!(unsigned(&a), b);
        assert_eq!(ids_of(&a), ["next"]);
    });
}

/// More groups than the Redis twin keeps unpacked between calls (256): calls that go round
/// all of them, so that its cache of group records fills, empties and fills again, answer
/// as memory does: the same estimates, starts, acknowledgements and counts.
#[test]
fn more_groups_than_the_twin_keeps_answer_as_in_memory() {
    runtime().block_on(async {
        let (clock, mut core, opener) = unlimited_twins("groups");
        let redis = Queue::new(opener.open().await);
        let groups = 300u32;
        for round in 0..3u32 {
            let jobs: Vec<NewJob> = (0..groups * 2)
                .map(|n| NewJob::new(format!("g{}", (n * 7 + round) % groups), vec![round as u8]))
                .collect();
            let now = clock.now_micros();
            for chunk in jobs.chunks(100) {
                let answers = redis.enqueue_batch(chunk.to_vec()).await;
                for (answer, job) in answers.into_iter().zip(chunk) {
                    assert_eq!(answer, core.enqueue(now, job.clone()));
                }
            }
            clock.advance(Duration::from_millis(1));
            let now = clock.now_micros();
            let (leased, expected) = (
                redis.lease("w", 1_000, None, Duration::ZERO).await.unwrap(),
                core.lease(now, "w", 1_000, None).unwrap(),
            );
            assert_eq!(unsigned(&leased), expected);
            // The new jobs and those released in the round before (at most 1,000 a call).
            assert!(leased.len() >= (groups * 2) as usize, "{}", leased.len());
            // Every other job acknowledged, one at a time; the rest go back to their groups.
            for (i, job) in leased.iter().enumerate() {
                let now = clock.now_micros();
                if i % 2 == 0 {
                    assert_eq!(
                        redis.ack(&job.id, &job.token).await,
                        core.ack(now, &job.id, job.lease)
                    );
                } else {
                    assert_eq!(
                        redis.fail(&job.id, &job.token, Failure::Release).await,
                        core.fail(now, &job.id, job.lease, Failure::Release, 0.5)
                    );
                }
            }
            clock.advance(Duration::from_millis(1));
            let now = clock.now_micros();
            assert_eq!(redis.stats().await.unwrap(), core.stats(now).unwrap());
        }
    });
}
