//! The gRPC listener's connections, held to the service's connection limits as the HTTP
//! listener's are: at most `max_connections` open at once (beyond, new ones wait in the
//! kernel's listen queue until one closes), and a connection that sends nothing within
//! `header_read_timeout` of its opening is closed, so that connections opened and left
//! silent cannot hold the listener's slots.
//!
//! Envoy keeps its connections to the rate limit service open for good: once a connection
//! has spoken, only HTTP/2 keep-alive pings (set on the server) end it, when its peer stops
//! answering them.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::conn::accept;

/// One accepted connection: its slot among the `max_connections`, given back when the
/// connection closes, and, until its first bytes arrive, the deadline for them.
pub(crate) struct Guarded {
    io: TcpStream,
    _slot: OwnedSemaphorePermit,
    first_bytes: Option<Pin<Box<Sleep>>>,
}

impl Connected for Guarded {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Some(deadline) = this.first_bytes.as_mut() {
            match &read {
                Poll::Ready(Ok(())) if buf.filled().len() > before => this.first_bytes = None,
                Poll::Pending if deadline.as_mut().poll(cx).is_ready() => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the connection sent nothing within the header read timeout",
                    )));
                }
                _ => {}
            }
        }
        read
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The connections `listener` accepts, at most `max_connections` open at once, each closed
/// if it sends nothing within `first_bytes` of its opening (accepted as the HTTP listener
/// accepts: [`accept`]).
pub(crate) fn incoming(
    listener: TcpListener,
    max_connections: usize,
    first_bytes: Duration,
) -> Pin<Box<dyn Stream<Item = io::Result<Guarded>> + Send>> {
    let slots = Arc::new(Semaphore::new(max_connections.max(1)));
    Box::pin(futures_util::stream::unfold(
        (listener, slots),
        move |(listener, slots)| async move {
            // A free slot first: at the cap, new connections wait in the listen queue.
            let slot = Arc::clone(&slots).acquire_owned().await.ok()?;
            let guarded = Guarded {
                io: accept(&listener).await,
                _slot: slot,
                first_bytes: Some(Box::pin(tokio::time::sleep(first_bytes))),
            };
            Some((Ok(guarded), (listener, slots)))
        },
    ))
}
