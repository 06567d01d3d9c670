//! Connections: the accept loop under a cap, each connection's header and idle timeouts, and
//! a shutdown that answers what was read, closes kept-alive connections cleanly and gives up
//! after a deadline.
//!
//! A connection is served by hyper's HTTP/1 connection with its header read timeout (which
//! hyper counts from the moment the connection may send a request, so it bounds an idle
//! connection too). A watchdog beside it closes a connection that has had no request in
//! flight and no bytes moving for the idle timeout. The body read timeout is a layer in front
//! of the router (see `body_timeout`), armed only once a handler's reading has to wait.
//!
//! On shutdown, a connection with a request in flight answers it with `Connection: close`;
//! an idle one closes at once, unless its next request has arrived (bytes of it read, or
//! waiting in the socket): that request is answered first, with `Connection: close`. So a
//! request sent on an idle kept-alive connection before the shutdown began is answered, not
//! dropped with the connection. (hyper alone closes an idle connection without looking at
//! its socket.) A request pipelined behind one in flight is not looked for: the connection
//! closes after the answer in flight, as HTTP/1.1 allows a server to.

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use crate::body_timeout::BodyTimeoutLayer;
use crate::config::ConnectionLimits;

/// Serves `app` on `listener` under `limits` until `shutdown` completes, each request's
/// body bounded by `body_timeout` (see `body_timeout`; `None`: unbounded); then stops
/// accepting, lets each connection answer the request it has in flight or that has arrived
/// (idle ones with nothing arrived close at once), and returns when all are done or the
/// shutdown timeout has passed, whichever is first.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    body_timeout: Option<Duration>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    // `true` once the service stops; each connection holds a receiver until it is closed.
    let (stopping, _) = watch::channel(false);
    let started = quanta::Instant::now();
    tokio::pin!(shutdown);
    loop {
        // A free slot first: at the cap, new connections wait in the kernel's listen queue.
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            stream = accept(&listener) => stream,
            () = &mut shutdown => break,
        };
        let activity = Arc::new(Activity {
            started,
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            head_read: AtomicBool::new(false),
            waiting: AtomicBool::new(false),
        });
        activity.touch();
        let io = TokioIo::new(Tracked {
            stream,
            activity: Arc::clone(&activity),
        });
        let service = InFlight {
            inner: app.clone(),
            activity: Arc::clone(&activity),
        };
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .keep_alive(true);
        let service = tower::Layer::layer(&BodyTimeoutLayer::new(body_timeout), service);
        let connection = builder.serve_connection(io, TowerToHyperService::new(service));
        let idle_timeout = limits.idle_timeout;
        // Held until the connection is closed: the shutdown waits for every one.
        let mut stop_receiver = stopping.subscribe();
        tokio::spawn(async move {
            let mut connection = pin!(connection);
            // Ready on the shutdown (or an error if the service is gone: stop too).
            let mut stop = pin!(stop_receiver.wait_for(|stopping| *stopping));
            let check = (idle_timeout / 4).max(Duration::from_millis(1));
            let mut watchdog = pin!(tokio::time::sleep(check));
            let mut closing = false;
            std::future::poll_fn(|cx| {
                if !activity.stopping.load(Ordering::Relaxed) && stop.as_mut().poll(cx).is_ready() {
                    // Polling the connection next makes an idle one look at its socket.
                    activity.stopping.store(true, Ordering::Relaxed);
                }
                loop {
                    if connection.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(());
                    }
                    if closing
                        || !activity.stopping.load(Ordering::Relaxed)
                        || activity.request_arriving()
                    {
                        break;
                    }
                    // A request in flight gets `Connection: close`; an idle connection
                    // closes (polled again at once to do so).
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
                while watchdog.as_mut().poll(cx).is_ready() {
                    if activity.idle_for() >= idle_timeout {
                        // Nothing in flight, nothing moving: dropping the connection closes
                        // it.
                        return Poll::Ready(());
                    }
                    let next = tokio::time::Instant::now() + check;
                    watchdog.as_mut().reset(next);
                }
                Poll::Pending
            })
            .await;
            drop(slot);
        });
    }
    drop(listener);
    stopping.send_replace(true);
    tokio::select! {
        () = stopping.closed() => {}
        () = tokio::time::sleep(limits.shutdown_timeout) => {}
    }
    Ok(())
}

/// What a connection is doing: when bytes last moved, and how many requests are in flight.
/// Its clock is quanta's (the CPU's time-stamp counter where it is invariant), read each time
/// bytes move; being real time, it does not follow a paused tokio clock.
struct Activity {
    started: quanta::Instant,
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
    /// The service is stopping: the connection closes once it has answered what arrived.
    stopping: AtomicBool,
    /// Bytes were read while no request was in flight, and no request has reached the
    /// router since: the next request's head is (partly) read.
    head_read: AtomicBool,
    /// While stopping: the socket held unread bytes when the connection last found nothing
    /// more to read (its readiness not yet reported by the runtime).
    waiting: AtomicBool,
}

impl Activity {
    /// True while no request is in flight but the next one has arrived, in part or whole:
    /// closing the connection now would drop it unanswered.
    ///
    /// E.g. a client on a kept-alive connection sends its next request just before the
    /// service stops: until the router has it, this is true, and the connection stays open
    /// to answer it (with `Connection: close`).
    fn request_arriving(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) == 0
            && (self.head_read.load(Ordering::Relaxed) || self.waiting.load(Ordering::Relaxed))
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn touch(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// How long the connection has been idle: zero while a request is in flight.
    fn idle_for(&self) -> Duration {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        let last = self.last_ms.load(Ordering::Relaxed);
        Duration::from_millis(self.now_ms().saturating_sub(last))
    }
}

/// The router, counting a request as in flight until its response is made.
#[derive(Clone)]
struct InFlight {
    inner: Router,
    activity: Arc<Activity>,
}

impl<B> tower::Service<axum::http::Request<B>> for InFlight
where
    B: http_body::Body<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::<axum::http::Request<B>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        let activity = Arc::clone(&self.activity);
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        activity.head_read.store(false, Ordering::Relaxed);
        let response = tower::Service::call(&mut self.inner, request.map(axum::body::Body::new));
        Box::pin(async move {
            let mut response = response.await;
            if activity.stopping.load(Ordering::Relaxed) {
                // The last answer on this connection: say so (hyper then closes it).
                if let Ok(response) = &mut response {
                    response.headers_mut().insert(
                        axum::http::header::CONNECTION,
                        axum::http::HeaderValue::from_static("close"),
                    );
                }
            }
            activity.touch();
            activity.in_flight.fetch_sub(1, Ordering::Relaxed);
            response
        })
    }
}

/// The next connection `listener` accepts, its Nagle delay off. An accept error (out of
/// file descriptors, a connection reset before it was accepted) is not the listener's end:
/// it pauses briefly, so that a lasting condition does not spin, and accepts again.
pub(crate) async fn accept(listener: &TcpListener) -> TcpStream {
    loop {
        if let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            return stream;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A socket that notes when bytes move.
struct Tracked {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        let activity = &this.activity;
        if buf.filled().len() > before {
            activity.touch();
            activity.waiting.store(false, Ordering::Relaxed);
            if activity.in_flight.load(Ordering::Relaxed) == 0 {
                activity.head_read.store(true, Ordering::Relaxed);
            }
        } else if polled.is_pending() && activity.stopping.load(Ordering::Relaxed) {
            // The runtime learns of arrived bytes only when it next polls the OS; ask the
            // socket itself.
            let mut byte = [MaybeUninit::<u8>::uninit()];
            let waiting = socket2::SockRef::from(&this.stream)
                .peek(&mut byte)
                .is_ok_and(|n| n > 0);
            activity.waiting.store(waiting, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
