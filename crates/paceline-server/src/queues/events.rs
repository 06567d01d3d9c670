//! `GET /v1/queues/{queue}/events`: the queue's events as Server-Sent Events, from every
//! instance sharing its store, from the moment the stream opens.
//!
//! Each change is one `data:` line of JSON (`{"event", "id", "group", "time_ms", ...}`),
//! then a blank line; a listener that fell behind (or whose instance lost its subscription
//! to the store) gets `event: missed` with `{"missed": N}` (N at least that many, 0 for an
//! unknown number) and goes on from the oldest event still held. A comment (`: keep-alive`)
//! every 15 s (more often under a shorter `idle_timeout`) keeps the service and proxies from
//! closing a quiet stream and finds listeners that went away. The stream ends when the
//! service stops; a client reconnects (`EventSource` does on its own). A `HEAD` request
//! answers the stream's head and follows nothing.
//!
//! The stream follows the queue for a request that lists `text/event-stream` in `Accept`
//! (as `EventSource` and SSE client libraries do; with curl, `-N -H 'Accept:
//! text/event-stream'`). Any other request (`Accept: */*`, a client that reads whole
//! answers and would wait forever) gets the stream's opening and a comment saying what to
//! send to follow, and the answer ends there: a `200` of the same type, never a hang.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use paceline_queue::core::UNTIL_RESUMED;
use paceline_queue::{Event, EventKind, Events, Watched};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::QueueAt;
use crate::error::{ApiError, Envelope};
use crate::extract::Authorized;
use crate::state::AppState;
use crate::units::unix_ms;

/// The whole answer to a request that does not accept an event stream.
const NOT_FOLLOWING: &str = ": paceline queue events\n\n: this answer ends here; to follow the \
                             queue's events, send Accept: text/event-stream (with curl: -N -H \
                             'Accept: text/event-stream')\n\n";

/// How often a quiet stream says it is alive, at most.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// How often a quiet stream says it is alive on a service that closes connections with no
/// bytes moving for `idle_timeout`: well within it (a stream's request is no longer in
/// flight once its head is sent), so that a listener that reads is never cut, while one
/// that stops reading (its socket full, nothing moving) still is.
fn keep_alive_every(idle_timeout: Duration) -> Duration {
    (idle_timeout / 3).clamp(Duration::from_millis(10), KEEP_ALIVE)
}

/// The stream's filters: `?group=G&event=started,acked`.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct EventsQuery {
    /// Only this group's events (and the whole queue's pauses).
    #[param(pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]{1,256}$")]
    group: Option<String>,
    /// Only these kinds, comma-separated: `enqueued`, `started`, `acked`, `failed`,
    /// `retried`, `dead`, `lease_expired`, `paused`.
    #[param(
        pattern = "^(enqueued|started|acked|failed|retried|dead|lease_expired|paused)(,(enqueued|started|acked|failed|retried|dead|lease_expired|paused))*$"
    )]
    event: Option<String>,
}

/// What one change says, as the `data:` of its event.
#[derive(Serialize, ToSchema)]
#[schema(as = QueueEvent)]
pub(super) struct EventBody<'a> {
    /// What happened.
    #[schema(value_type = String, pattern = "^(enqueued|started|acked|failed|retried|dead|lease_expired|paused)$")]
    event: &'static str,
    /// The job's id: `null` for a pause asked by hand.
    id: Option<&'a str>,
    /// The job's group, or the group paused: `null` for the whole queue's pause.
    group: Option<&'a str>,
    /// When, in Unix milliseconds on the queue's clock.
    time_ms: u64,
    /// `started`, `failed`, `lease_expired`: the attempt, from 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    attempt: Option<u32>,
    /// `started`: the worker that leased the job.
    #[serde(skip_serializing_if = "Option::is_none")]
    worker: Option<&'a str>,
    /// `failed`, `dead`: the job's last error.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    /// `retried`: when the job may start again.
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_at_ms: Option<u64>,
    /// `paused`: when the pause ends (`null`: until resumed).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>)]
    paused_until_ms: Option<Option<u64>>,
}

impl<'a> EventBody<'a> {
    fn new(e: &'a Event) -> EventBody<'a> {
        let (retry_at_ms, paused_until_ms) = match e.kind {
            EventKind::Retried => (e.at.map(unix_ms), None),
            EventKind::Paused => (
                None,
                Some(e.at.filter(|&t| t != UNTIL_RESUMED).map(unix_ms)),
            ),
            _ => (None, None),
        };
        EventBody {
            event: e.kind.as_str(),
            id: e.id.as_deref(),
            group: e.group.as_deref(),
            time_ms: unix_ms(e.time),
            attempt: e.attempt,
            worker: e.worker.as_deref(),
            error: e.error.as_deref(),
            retry_at_ms,
            paused_until_ms,
        }
    }
}

/// Which events a stream passes.
struct Filter {
    group: Option<String>,
    kinds: Option<HashSet<EventKind>>,
}

impl Filter {
    /// The filter `query` asks for: a `400` naming `group` or `event` for one that names
    /// no group or no kind.
    fn of(query: EventsQuery) -> Result<Filter, ApiError> {
        if let Some(group) = &query.group {
            paceline_queue::config::check_group(group).map_err(|e| ApiError::input(&e))?;
        }
        let kinds = match &query.event {
            None => None,
            Some(list) => {
                let mut kinds = HashSet::new();
                for name in list.split(',') {
                    let kind = EventKind::ALL
                        .into_iter()
                        .find(|k| k.as_str() == name)
                        .ok_or_else(|| {
                            ApiError::invalid(
                                "event",
                                "must list kinds separated by commas, each one of enqueued, \
                                 started, acked, failed, retried, dead, lease_expired, paused",
                            )
                        })?;
                    kinds.insert(kind);
                }
                Some(kinds)
            }
        };
        Ok(Filter {
            group: query.group,
            kinds,
        })
    }

    fn passes(&self, e: &Event) -> bool {
        let kind = self.kinds.as_ref().is_none_or(|k| k.contains(&e.kind));
        // A pause of the whole queue holds every group's jobs too.
        let group = match (&self.group, &e.group) {
            (None, _) | (Some(_), None) => true,
            (Some(want), Some(got)) => want == got,
        };
        kind && group
    }
}

/// Whether `headers` accept an event stream (`text/event-stream` listed, not refused).
fn accepts_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';');
            let media = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| {
                let p = p.trim();
                p.strip_prefix("q=")
                    .or_else(|| p.strip_prefix("Q="))
                    .and_then(|q| q.trim().parse::<f64>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            media.eq_ignore_ascii_case("text/event-stream") && !refused
        })
}

/// `GET /v1/queues/{queue}/events`: the queue's events as Server-Sent Events.
#[utoipa::path(
    get,
    path = "/v1/queues/{queue}/events",
    tag = "queues",
    operation_id = "queue_events",
    params(("queue" = String, Path, description = "A configured queue's name"), EventsQuery),
    responses(
        (status = 200, description = "With `Accept: text/event-stream`: a stream of Server-Sent Events that lasts until the client or the service goes: each change one `data:` line holding a `QueueEvent`; `event: missed` with `{\"missed\": N}` when the listener fell behind; `: keep-alive` comments (every 15 s at most). Without it: two comment lines saying what to send to follow the queue, and the end", content_type = "text/event-stream", body = String),
        (status = 400, description = "`invalid_argument`: `group` or `event` is wrong (`field` names it)", body = Envelope),
        (status = 401, description = "`unauthenticated`", body = Envelope),
        (status = 404, description = "`unknown_queue`", body = Envelope),
        (status = 503, description = "`store_unavailable`: the store did not answer the subscription", body = Envelope),
    )
)]
pub(super) async fn events(
    State(state): State<Arc<AppState>>,
    _: Authorized,
    QueueAt { queue, .. }: QueueAt,
    method: Method,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let filter = Filter::of(query)?;
    let mut response = if !accepts_event_stream(&headers) {
        // A client that reads whole answers: told how to follow, not kept waiting.
        Body::from(NOT_FOLLOWING).into_response()
    } else if method == Method::HEAD {
        // The head alone: no listener, so the queue is not asked to make events.
        Body::empty().into_response()
    } else {
        let events = queue.events().await?;
        let stopping = state.stopping.subscribe();
        let idle = state
            .base
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .connections
            .idle_timeout;
        Body::from_stream(stream(events, filter, stopping, keep_alive_every(idle))).into_response()
    };
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Proxies that buffer answers (nginx) pass this one on as it comes.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// The stream's frames: a first comment (so the client knows it is open), then each event
/// that passes `filter`, missed counts, and keep-alive comments, until the events end or the
/// service stops.
fn stream(
    events: Events,
    filter: Filter,
    stopping: tokio::sync::watch::Receiver<bool>,
    every: Duration,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send {
    let mut keep_alive = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let first = futures_util::stream::once(std::future::ready(Ok(Bytes::from_static(
        b": paceline queue events\n\n",
    ))));
    let rest = futures_util::stream::unfold(
        (events, filter, stopping, keep_alive),
        |(mut events, filter, mut stopping, mut keep_alive)| async move {
            loop {
                let frame = tokio::select! {
                    _ = stopping.wait_for(|&s| s) => return None,
                    _ = keep_alive.tick() => Bytes::from_static(b": keep-alive\n\n"),
                    next = events.next() => match next? {
                        Watched::Event(e) if filter.passes(&e) => event_frame(&e),
                        Watched::Event(_) => continue,
                        Watched::Missed(n) => {
                            Bytes::from(format!("event: missed\ndata: {{\"missed\":{n}}}\n\n"))
                        }
                    },
                };
                return Some((Ok(frame), (events, filter, stopping, keep_alive)));
            }
        },
    );
    futures_util::StreamExt::chain(first, rest)
}

/// One event's frame: `data: JSON` and a blank line. (JSON holds no raw line break: one
/// `data:` line each.)
fn event_frame(e: &Event) -> Bytes {
    // Strings and numbers: always serialisable.
    let json = serde_json::to_string(&EventBody::new(e)).unwrap_or_default();
    Bytes::from(format!("data: {json}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn an_event_stream_is_for_requests_that_accept_one() {
        assert!(accepts_event_stream(&accept("text/event-stream")));
        assert!(accepts_event_stream(&accept(
            "text/html, Text/Event-Stream;q=0.5"
        )));
        assert!(!accepts_event_stream(&accept("text/event-stream;q=0")));
        assert!(!accepts_event_stream(&accept("text/event-stream; Q=0.0")));
        assert!(!accepts_event_stream(&accept("*/*")));
        assert!(!accepts_event_stream(&HeaderMap::new()));
    }

    #[test]
    fn a_quiet_stream_speaks_well_within_the_idle_timeout() {
        for (idle, every) in [(5_000, 1_666), (60_000, 15_000), (100, 33), (1, 10)] {
            let got = keep_alive_every(Duration::from_millis(idle));
            assert_eq!(got.as_millis(), every, "idle {idle} ms");
        }
        assert!(keep_alive_every(Duration::from_secs(5)) * 2 < Duration::from_secs(5));
    }

    #[test]
    fn a_frame_is_one_data_line_of_json_even_with_line_breaks_in_an_error() {
        let e = Event::new(EventKind::Failed, 1_700_000_000_123_456)
            .job("7", "guild:1")
            .attempt(2)
            .error(Some("line one\nline two\r\n"));
        let frame = event_frame(&e);
        let text = std::str::from_utf8(&frame).unwrap();
        assert!(
            text.starts_with("data: {") && text.ends_with("}\n\n"),
            "{text}"
        );
        assert_eq!(text.matches('\n').count(), 2, "{text}");
        let json: serde_json::Value = serde_json::from_str(&text[6..text.len() - 2]).unwrap();
        assert_eq!(json["event"], "failed");
        assert_eq!(json["time_ms"], 1_700_000_000_123u64);
        assert_eq!(json["attempt"], 2);
        assert_eq!(json["error"], "line one\nline two\r\n");
        assert!(json.get("retry_at_ms").is_none());
    }

    #[test]
    fn a_pause_until_resumed_has_a_null_end_and_filters_pass_what_they_name() {
        let mut pause = Event::new(EventKind::Paused, 1_000).at(UNTIL_RESUMED);
        let json = serde_json::to_value(EventBody::new(&pause)).unwrap();
        assert!(json["paused_until_ms"].is_null() && json.get("paused_until_ms").is_some());
        assert!(json["group"].is_null() && json["id"].is_null());
        let filter = Filter::of(EventsQuery {
            group: Some("g".into()),
            event: Some("paused,acked".into()),
        })
        .unwrap();
        assert!(filter.passes(&pause), "the queue's pause holds group g too");
        pause.group = Some("h".into());
        assert!(!filter.passes(&pause));
        let started = Event::new(EventKind::Started, 1).job("1", "g");
        assert!(!filter.passes(&started));
        let bad = Filter::of(EventsQuery {
            group: None,
            event: Some("started,bogus".into()),
        });
        let said = format!("{:?}", bad.err());
        assert!(said.contains("field: \"event\""), "{said}");
    }
}
