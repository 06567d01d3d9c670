//! The queue's events in Redis: each call that decides some publishes them, in one message,
//! on the queue's channel `events` (see `events_out` in `lua/queue.lua`), only while a
//! listener's key `watch` says someone listens. A handle follows that channel on a
//! connection of its own from its first listener on, renewing `watch` at a third of
//! [`WATCH_FOR`] while it has listeners, and stops (letting the key run out) when it has
//! none.
//!
//! Each message carries the queue's count of messages so far: a listener told of message 7
//! after message 5 missed one, and so does one whose renewal finds the count beyond the
//! last message it got a renewal before (its subscription died without a word): it then
//! subscribes anew and tells its listeners ([`Watched::Missed`]).

use std::cmp::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use paceline_store::redis::{FunctionHost, Payloads};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::caller::{self, Caller};
use super::decode::{protocol, reader};
use crate::error::QueueError;
use crate::events::{Event, EventKind, Feed, Watched, WATCH_FOR};

/// A handle's follower of its queue's events: its listeners' feed, and the task following
/// the channel while it has any.
pub(super) struct Follower {
    feed: Feed,
    host: FunctionHost,
    caller: Arc<Caller>,
    channel: String,
    /// The task following the channel; `None` while nobody listens. Held while a listener
    /// joins, and by the task while it decides to stop, so that a listener never joins a
    /// task that is stopping.
    task: tokio::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut() {
            task.abort();
        }
    }
}

impl Follower {
    /// The follower of the queue at `base` (nothing followed until a listener asks).
    pub(super) fn new(host: FunctionHost, caller: Arc<Caller>, base: &str) -> Follower {
        Follower {
            feed: Feed::default(),
            host,
            caller,
            channel: format!("{base}events"),
            task: tokio::sync::Mutex::new(None),
        }
    }

    /// A new listener's receiver, which gets every event of a call that ends after this
    /// answers.
    pub(super) async fn watch(
        self: &Arc<Self>,
    ) -> Result<broadcast::Receiver<Watched>, QueueError> {
        let mut task = self.task.lock().await;
        let receiver = self.feed.subscribe();
        let running = task.as_ref().is_some_and(|t| !t.is_finished());
        if running {
            self.register().await?;
        } else {
            let messages = self.host.subscribe_payloads(&[&self.channel]).await?;
            // Subscribed first: every message from the count this answers on arrives.
            let count = self.register().await?;
            *task = Some(tokio::spawn(follow(Arc::downgrade(self), messages, count)));
        }
        Ok(receiver)
    }

    /// Says in the queue that someone listens, for [`WATCH_FOR`]; answers the queue's
    /// count of event messages so far.
    async fn register(&self) -> Result<u64, QueueError> {
        let ms = u64::try_from(WATCH_FOR.as_millis()).unwrap_or(u64::MAX);
        let reply = self.caller.call("watch", &[caller::arg(ms)]).await?;
        let mut r = reader(reply)?;
        r.u64()?;
        Ok(r.u64()?)
    }
}

/// How often a follower renews its word that it listens, and checks that its subscription
/// still delivers.
const RENEW_EVERY: Duration = Duration::from_secs(WATCH_FOR.as_secs() / 3);

/// Follows the channel for the follower while it lives and has listeners: each message's
/// events go out to them; a gap in the messages' count, a lost subscription or one found
/// silent is told as missed events. `count`: the queue's count of messages when it
/// subscribed.
async fn follow(follower: Weak<Follower>, mut messages: Payloads, count: u64) {
    let mut last = count;
    // The count a renewal found: every message up to it has arrived by the next one.
    let mut due: Option<u64> = None;
    let mut renew_at = tokio::time::Instant::now() + RENEW_EVERY;
    loop {
        let next = tokio::time::timeout_at(renew_at, messages.next()).await;
        let Some(follower) = follower.upgrade() else {
            return;
        };
        match next {
            Ok(Some(payload)) => match decode(&payload) {
                Ok((n, events)) => {
                    match n.cmp(&last.saturating_add(1)) {
                        Ordering::Equal => {}
                        Ordering::Greater => follower.feed.send(Watched::Missed(n - last - 1)),
                        // The count went back: the server lost or replaced its data (a
                        // restart without persistence, a failover, a flush).
                        Ordering::Less => {
                            follower.feed.send(Watched::Missed(0));
                            due = None;
                        }
                    }
                    last = n;
                    for event in events {
                        follower.feed.send(Watched::Event(event));
                    }
                }
                Err(_) => follower.feed.send(Watched::Missed(1)),
            },
            Ok(None) => {
                // The subscription was lost: follow anew, from the count then.
                follower.feed.send(Watched::Missed(0));
                match follow_again(&follower).await {
                    Some((m, n)) => {
                        messages = m;
                        last = n;
                        due = None;
                    }
                    None => return,
                }
            }
            Err(_) => {
                let mut task = follower.task.lock().await;
                if !follower.feed.listened() {
                    // Nobody listens: the word runs out, and the queue's calls stop
                    // making events.
                    *task = None;
                    return;
                }
                drop(task);
                renew_at = tokio::time::Instant::now() + RENEW_EVERY;
                match follower.register().await {
                    Ok(n) => {
                        if n < last || due.is_some_and(|d| d > last) {
                            // Messages published a whole period ago never came, or the
                            // count went back (the server lost its data, a failover): the
                            // subscription may be dead without having said so.
                            let missed = due.map_or(0, |d| d.saturating_sub(last));
                            follower.feed.send(Watched::Missed(missed));
                            match follow_again(&follower).await {
                                Some((m, n)) => {
                                    messages = m;
                                    last = n;
                                    due = None;
                                    continue;
                                }
                                None => return,
                            }
                        }
                        due = Some(n);
                    }
                    // The store did not answer: the word may run out, and what happens
                    // meanwhile goes untold.
                    Err(_) => follower.feed.send(Watched::Missed(0)),
                }
            }
        }
    }
}

/// Subscribes anew (trying every 200 ms until the store answers, while the follower lives
/// and has listeners) and registers; answers the messages and the count then.
async fn follow_again(follower: &Arc<Follower>) -> Option<(Payloads, u64)> {
    loop {
        if !follower.feed.listened() {
            let mut task = follower.task.lock().await;
            if !follower.feed.listened() {
                // Nobody listens: stop, so as not to say in the queue that someone does.
                *task = None;
                return None;
            }
        }
        if let Ok(m) = follower.host.subscribe_payloads(&[&follower.channel]).await {
            if let Ok(n) = follower.register().await {
                return Some((m, n));
            }
        }
        if Arc::strong_count(follower) <= 1 {
            // Only this task holds it: the queue's handles are gone.
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// No text: the length that says so.
const NO_TEXT: u32 = u32::MAX;

/// A message of the channel: the queue's count of messages, then its events.
pub(super) fn decode(payload: &[u8]) -> Result<(u64, Vec<Event>), QueueError> {
    let mut r = Bytes { rest: payload };
    let count = r.number()?;
    let mut events = Vec::new();
    while !r.rest.is_empty() {
        let code = r.take(1)?[0];
        let kind = EventKind::from_code(u64::from(code))
            .ok_or_else(|| protocol("an event of an unknown kind"))?;
        let mut event = Event::new(kind, r.number()?);
        let attempt = r.maybe()?;
        event.at = r.maybe()?;
        event.attempt = attempt.and_then(|a| u32::try_from(a).ok());
        event.id = r.text()?;
        event.group = r.text()?;
        event.worker = r.text()?;
        event.error = r.text()?;
        events.push(event);
    }
    Ok((count, events))
}

/// Reads a message's fields.
struct Bytes<'a> {
    rest: &'a [u8],
}

impl<'a> Bytes<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], QueueError> {
        if self.rest.len() < n {
            return Err(protocol("a cut event message"));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    /// A whole number sent as a little-endian double.
    fn number(&mut self) -> Result<u64, QueueError> {
        self.maybe()?
            .ok_or_else(|| protocol("an event with a negative number"))
    }

    /// A whole number, or none (-1).
    fn maybe(&mut self) -> Result<Option<u64>, QueueError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        let x = f64::from_le_bytes(b);
        if x < 0.0 {
            return Ok(None);
        }
        if !(x.fract() == 0.0 && x <= 9_007_199_254_740_992.0) {
            return Err(protocol("an event with a number that is not whole"));
        }
        // Whole and below 2^53: exact.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Ok(Some(x as u64))
    }

    fn text(&mut self) -> Result<Option<String>, QueueError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        let n = u32::from_le_bytes(b);
        if n == NO_TEXT {
            return Ok(None);
        }
        let bytes = self.take(usize::try_from(n).unwrap_or(usize::MAX))?;
        Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: Option<&str>) -> Vec<u8> {
        match s {
            None => NO_TEXT.to_le_bytes().to_vec(),
            Some(s) => {
                let mut v = u32::try_from(s.len()).unwrap().to_le_bytes().to_vec();
                v.extend_from_slice(s.as_bytes());
                v
            }
        }
    }

    #[test]
    fn a_message_reads_as_its_count_and_events_and_a_cut_one_is_an_error() {
        let mut m = 7f64.to_le_bytes().to_vec();
        m.push(2);
        for x in [1_000_000f64, 1.0, -1.0] {
            m.extend_from_slice(&x.to_le_bytes());
        }
        for s in [Some("42"), Some("guild:1"), Some("w"), None] {
            m.extend(text(s));
        }
        let (count, events) = decode(&m).unwrap();
        assert_eq!(count, 7);
        assert_eq!(
            events,
            [Event::new(EventKind::Started, 1_000_000)
                .job("42", "guild:1")
                .attempt(1)
                .worker("w")]
        );
        assert!(decode(&m[..m.len() - 1]).is_err());
        m[8] = 99;
        assert!(decode(&m).is_err());
    }
}
