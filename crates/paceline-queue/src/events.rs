//! What happens in a queue, as it happens: [`Event`]s, which [`Queue::events`] delivers
//! from every process sharing the queue.
//!
//! Each event is decided inside the atomic step that made the change (by [`QueueCore`] or
//! its Lua twin, in the same order), so every listener sees the changes in the order the
//! queue made them. Events are *told*, not kept: a listener sees what happens while it
//! listens, nothing from before; one that falls behind by more than
//! [`EVENT_BUFFER`] events is told how many it missed ([`Watched::Missed`]) and goes on
//! from the oldest event still held. For what must not be missed, read the queue's state (`stats`, `job`,
//! `jobs`) after a [`Watched::Missed`], or keep results with `keep_completed`.
//!
//! A queue nobody listens to pays nothing for its events: the Redis twin collects them only
//! while a listener has said, within the last [`WATCH_FOR`], that it listens.
//!
//! [`Queue::events`]: crate::Queue::events
//! [`QueueCore`]: crate::QueueCore

use std::time::Duration;

use tokio::sync::broadcast;

/// How many events a listener may fall behind by before it misses some.
pub const EVENT_BUFFER: usize = 4_096;

/// How long a listener's word that it listens holds in a shared store; it renews it at a
/// third of this. A process that stops listening costs its queue's calls their events for
/// at most this long.
pub const WATCH_FOR: Duration = Duration::from_secs(90);

/// What happened. The names are the `event` field of the HTTP API's events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A job was added (by a producer or a schedule); not for an enqueue answered by
    /// deduplication.
    Enqueued,
    /// A worker leased a job: [`Event::attempt`] and [`Event::worker`] say which.
    Started,
    /// A worker acknowledged a job: it is done.
    Acked,
    /// An attempt failed ([`Event::error`] says how); a [`Retried`](Self::Retried) or a
    /// [`Dead`](Self::Dead) event follows.
    Failed,
    /// A job goes back to wait for another attempt: after a failure, from
    /// [`Event::at`] on; or a dead job retried by hand, at once.
    Retried,
    /// A job went to the dead set: a fatal failure, its attempts spent (a failure or a lease
    /// running out on the last one), or a cost beyond what its policies now admit
    /// ([`Event::error`] says which).
    Dead,
    /// A lease ran out before its worker reported: the job goes back to the head of its
    /// group (or, its attempts spent, a [`Dead`](Self::Dead) event follows). Told when the
    /// queue notices, at its first call after the lease's end (its [`Event::time`]).
    LeaseExpired,
    /// A group (or, with no [`Event::group`], the whole queue) was paused until
    /// [`Event::at`]: by hand, or by a worker for its upstream's refusal (with the job's
    /// [`Event::id`]).
    Paused,
}

impl EventKind {
    /// Every kind.
    pub const ALL: [EventKind; 8] = [
        EventKind::Enqueued,
        EventKind::Started,
        EventKind::Acked,
        EventKind::Failed,
        EventKind::Retried,
        EventKind::Dead,
        EventKind::LeaseExpired,
        EventKind::Paused,
    ];

    /// The kind's name: `enqueued`, `started`, `acked`, `failed`, `retried`, `dead`,
    /// `lease_expired` or `paused`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Enqueued => "enqueued",
            EventKind::Started => "started",
            EventKind::Acked => "acked",
            EventKind::Failed => "failed",
            EventKind::Retried => "retried",
            EventKind::Dead => "dead",
            EventKind::LeaseExpired => "lease_expired",
            EventKind::Paused => "paused",
        }
    }

    /// The kind of code `code` in the Redis twin's messages (1 to 8, in
    /// [`ALL`](Self::ALL)'s order, as the Lua twin's `EV` numbers them), if any.
    pub(crate) fn from_code(code: u64) -> Option<EventKind> {
        let i = usize::try_from(code).ok()?.checked_sub(1)?;
        EventKind::ALL.get(i).copied()
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One change of a queue, as [`Queue::events`](crate::Queue::events) delivers it.
///
/// ```
/// use paceline_queue::events::{Event, EventKind};
/// let e = Event::new(EventKind::Started, 1_700_000_000_000_000)
///     .job("7", "guild:1")
///     .attempt(1)
///     .worker("worker-1");
/// assert_eq!(e.kind.as_str(), "started");
/// assert_eq!(e.group.as_deref(), Some("guild:1"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// When, in µs since the Unix epoch on the queue's clock.
    pub time: u64,
    /// The job's id (none for a pause asked by hand).
    pub id: Option<String>,
    /// The job's group, or the group paused (none for the whole queue's pause).
    pub group: Option<String>,
    /// The attempt (from 1): for `started`, `failed` and `lease_expired`.
    pub attempt: Option<u32>,
    /// The worker that leased the job: for `started`.
    pub worker: Option<String>,
    /// The job's last error: for `failed` and `dead`.
    pub error: Option<String>,
    /// For `retried`, when the job may start again; for `paused`, when the pause ends
    /// ([`UNTIL_RESUMED`](crate::core::UNTIL_RESUMED) for none). µs.
    pub at: Option<u64>,
}

impl Event {
    /// An event of `kind` at `time` (µs), with nothing else.
    pub fn new(kind: EventKind, time: u64) -> Event {
        Event {
            kind,
            time,
            id: None,
            group: None,
            attempt: None,
            worker: None,
            error: None,
            at: None,
        }
    }

    /// With the job `id` of `group`.
    #[must_use]
    pub fn job(mut self, id: &str, group: &str) -> Event {
        self.id = Some(id.to_string());
        self.group = Some(group.to_string());
        self
    }

    /// With `attempt`.
    #[must_use]
    pub fn attempt(mut self, attempt: u32) -> Event {
        self.attempt = Some(attempt);
        self
    }

    /// With `worker`.
    #[must_use]
    pub fn worker(mut self, worker: &str) -> Event {
        self.worker = Some(worker.to_string());
        self
    }

    /// With `error` (none: nothing).
    #[must_use]
    pub fn error(mut self, error: Option<&str>) -> Event {
        self.error = error.map(str::to_string);
        self
    }

    /// With `at` (µs).
    #[must_use]
    pub fn at(mut self, at: u64) -> Event {
        self.at = Some(at);
        self
    }
}

/// What a listener of [`Queue::events`](crate::Queue::events) gets next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Watched {
    /// A change.
    Event(Event),
    /// The listener fell behind (or its connection to the store was lost and made anew):
    /// this many events (in Redis, messages of one call's events each), at least, went by
    /// unseen (0: an unknown number). What follows is from the oldest event still held on.
    Missed(u64),
}

/// The events a [`QueueCore`](crate::QueueCore) decided in its calls, kept only while
/// someone listens (see [`QueueCore::watch`](crate::QueueCore::watch)).
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    /// `None`: nobody listens, so nothing is kept.
    kept: Option<Vec<Event>>,
}

impl EventLog {
    /// Keeps events from now on (`true`), or none (`false`, dropping any kept).
    pub(crate) fn watch(&mut self, on: bool) {
        match (on, self.kept.is_some()) {
            (true, false) => self.kept = Some(Vec::new()),
            (false, true) => self.kept = None,
            _ => {}
        }
    }

    /// Keeps the event `make` makes, if someone listens (else it is never made).
    pub(crate) fn push(&mut self, make: impl FnOnce() -> Event) {
        if let Some(kept) = &mut self.kept {
            kept.push(make());
        }
    }

    /// The events kept so far, oldest first, leaving none.
    pub(crate) fn take(&mut self) -> Vec<Event> {
        self.kept.as_mut().map(std::mem::take).unwrap_or_default()
    }
}

/// A listener's feed of a queue's events, from [`Queue::events`](crate::Queue::events):
/// every event the queue decides from the moment it was made, in the order each process
/// (each partition, for a queue of several) decided them.
///
/// ```
/// use paceline_queue::{NewJob, Queue, QueueConfig, Watched};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), paceline_queue::QueueError> {
/// let queue = Queue::in_memory("roles", QueueConfig::new("gcra:rate=10/s,burst=10".parse()?))?;
/// let mut events = queue.events().await?;
/// queue.enqueue(NewJob::new("guild:1", b"grant".to_vec())).await?;
/// let Some(Watched::Event(e)) = events.next().await else { panic!("no event") };
/// assert_eq!(e.kind.as_str(), "enqueued");
/// assert_eq!(e.group.as_deref(), Some("guild:1"));
/// # Ok(()) }
/// ```
pub struct Events {
    receivers: Feeds,
}

/// What a backend hands a new listener ([`QueueBackend::watch`](crate::QueueBackend::watch)):
/// one receiver per feed of events (one per partition of a partitioned queue), each getting
/// every event of a call that ends after it was made.
pub type Feeds = Vec<broadcast::Receiver<Watched>>;

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("feeds", &self.receivers.len())
            .finish()
    }
}

impl Events {
    /// A feed of what `receivers` get.
    pub(crate) fn new(receivers: Feeds) -> Events {
        Events { receivers }
    }

    /// The next event (or word of missed ones) if one has come, without waiting.
    pub fn try_next(&mut self) -> Option<Watched> {
        let mut i = 0;
        while i < self.receivers.len() {
            match self.receivers[i].try_recv() {
                Ok(watched) => {
                    self.rotate();
                    return Some(watched);
                }
                Err(broadcast::error::TryRecvError::Lagged(n)) => return Some(Watched::Missed(n)),
                Err(broadcast::error::TryRecvError::Closed) => {
                    self.receivers.swap_remove(i);
                }
                Err(broadcast::error::TryRecvError::Empty) => i += 1,
            }
        }
        None
    }

    /// With several feeds (partitions), the next call asks another first, so that a busy
    /// one does not keep the others' events waiting.
    fn rotate(&mut self) {
        if self.receivers.len() > 1 {
            self.receivers.rotate_left(1);
        }
    }

    /// The next event (or word of missed ones), waiting for it; `None` once the queue's
    /// handles are all gone, so that nothing more can come.
    pub async fn next(&mut self) -> Option<Watched> {
        loop {
            let (answer, from) = match self.receivers.as_mut_slice() {
                [] => return None,
                [one] => (one.recv().await, 0),
                many => {
                    let all = many.iter_mut().map(|r| Box::pin(r.recv()));
                    let (answer, from, _) = futures_util::future::select_all(all).await;
                    (answer, from)
                }
            };
            match answer {
                Ok(watched) => {
                    self.rotate();
                    return Some(watched);
                }
                Err(broadcast::error::RecvError::Lagged(n)) => return Some(Watched::Missed(n)),
                Err(broadcast::error::RecvError::Closed) => {
                    self.receivers.swap_remove(from);
                }
            }
        }
    }
}

/// Where a backend sends its events for its listeners: none are made while nobody listens.
#[derive(Debug)]
pub(crate) struct Feed {
    sender: broadcast::Sender<Watched>,
}

impl Default for Feed {
    fn default() -> Feed {
        Feed {
            sender: broadcast::Sender::new(EVENT_BUFFER),
        }
    }
}

impl Feed {
    /// Whether anyone listens.
    pub(crate) fn listened(&self) -> bool {
        self.sender.receiver_count() > 0
    }

    /// A new listener's receiver.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Watched> {
        self.sender.subscribe()
    }

    /// Tells every listener (none: nothing happens).
    pub(crate) fn send(&self, watched: Watched) {
        // An error only says that nobody listens.
        let _ = self.sender.send(watched);
    }
}
