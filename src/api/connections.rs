//! The server's connections: at most `max_connections` open at once (the
//! next waits to be accepted until one closes, as Go's
//! `netutil.LimitListener` does), and none held for a client that sends
//! nothing. From the moment the server waits for a request, its head must
//! arrive within the idle timeout (a head sent a byte at a time, slowloris,
//! does not keep the connection either), and its body must not pause longer
//! than that. While a request is being answered (waiting for the engine,
//! loading, generating, streaming) the client owes nothing and no clock
//! runs.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::Request;
use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::middleware::Next;
use axum::response::Response;
use axum::serve::{IncomingStream, Listener};
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// Accepts a connection only while fewer than its bound are open.
pub(crate) struct BoundedListener {
    listener: TcpListener,
    places: Arc<Semaphore>,
    idle_timeout: Duration,
}

impl BoundedListener {
    pub fn new(listener: TcpListener, max_connections: usize, idle_timeout: Duration) -> Self {
        Self {
            listener,
            places: Arc::new(Semaphore::new(max_connections.max(1))),
            idle_timeout: idle_timeout.max(Duration::from_millis(1)),
        }
    }
}

impl Listener for BoundedListener {
    type Io = WatchedConnection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // The semaphore is never closed, so this waits for a place and
        // never fails.
        let place = match self.places.clone().acquire_owned().await {
            Ok(place) => place,
            Err(_) => std::future::pending().await,
        };
        // axum's accept for a TcpListener, which rides out accept errors
        // (running out of file descriptors: it waits and tries again).
        let (stream, address) = Listener::accept(&mut self.listener).await;
        // Each token goes out as it comes, not held back to fill a packet.
        let _ = stream.set_nodelay(true);
        let connection = WatchedConnection {
            stream,
            watch: ConnectionWatch::new(),
            last_read: Instant::now(),
            deadline: Box::pin(tokio::time::sleep(self.idle_timeout)),
            idle_timeout: self.idle_timeout,
            _place: place,
        };
        (connection, address)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// What a connection is waiting for.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// A request's head, since then (the connection opened, or the last
    /// answer ended).
    Request { since: Instant },
    /// The rest of a request's body, since it began.
    Body { since: Instant },
    /// Nothing from the client: the server is answering.
    Answering,
}

/// A connection's phase, shared by its reads and its requests (which reach
/// it as connect info).
#[derive(Clone)]
pub(crate) struct ConnectionWatch(Arc<Mutex<Phase>>);

impl ConnectionWatch {
    fn new() -> Self {
        Self(Arc::new(Mutex::new(Phase::Request {
            since: Instant::now(),
        })))
    }

    fn set(&self, phase: Phase) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = phase;
    }

    /// When the client must have sent more, if it owes anything: a head by
    /// a fixed time, a body within the timeout of its last bytes.
    fn deadline(&self, last_read: Instant, timeout: Duration) -> Option<Instant> {
        match *self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            Phase::Request { since } => Some(since + timeout),
            Phase::Body { since } => Some(since.max(last_read) + timeout),
            Phase::Answering => None,
        }
    }
}

impl Connected<IncomingStream<'_, BoundedListener>> for ConnectionWatch {
    fn connect_info(stream: IncomingStream<'_, BoundedListener>) -> Self {
        stream.io().watch.clone()
    }
}

/// Sets a phase when dropped: when a request's body has been read (or
/// given up), or an answer has been sent (or abandoned).
struct OnDrop(ConnectionWatch, fn() -> Phase);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.set((self.1)());
    }
}

/// Keeps each connection's phase as its requests go: reading a body, then
/// answering until the answer's last byte (a stream's too), then waiting
/// for the next request.
pub(crate) async fn watch_requests(request: Request, next: Next) -> Response {
    let Some(ConnectInfo(watch)) = request
        .extensions()
        .get::<ConnectInfo<ConnectionWatch>>()
        .cloned()
    else {
        return next.run(request).await;
    };
    let size = HttpBody::size_hint(request.body());
    // Nothing to read, or more than the server reads (refused at once, by
    // its length): the client owes nothing.
    let request = if size.exact() == Some(0) || size.lower() > super::MAX_BODY_BYTES as u64 {
        watch.set(Phase::Answering);
        request
    } else {
        watch.set(Phase::Body {
            since: Instant::now(),
        });
        let read = OnDrop(watch.clone(), || Phase::Answering);
        request.map(|body| {
            Body::from_stream(body.into_data_stream().map(move |chunk| {
                let _ = &read;
                chunk
            }))
        })
    };
    let response = next.run(request).await;
    let answered = OnDrop(watch, || Phase::Request {
        since: Instant::now(),
    });
    if HttpBody::size_hint(response.body()).exact().is_some() {
        // Whole already: written at once (a client that does not read it
        // is waited for no longer than for a request).
        return response;
    }
    response.map(|body| {
        Body::from_stream(body.into_data_stream().map(move |chunk| {
            let _ = &answered;
            chunk
        }))
    })
}

/// A connection that gives up on a client that owes bytes and sends none
/// in time, and frees its place when closed.
pub(crate) struct WatchedConnection {
    stream: TcpStream,
    watch: ConnectionWatch,
    /// When bytes last arrived.
    last_read: Instant,
    deadline: Pin<Box<Sleep>>,
    idle_timeout: Duration,
    _place: OwnedSemaphorePermit,
}

impl AsyncRead for WatchedConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let filled = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if polled.is_ready() {
            if buf.filled().len() > filled {
                this.last_read = Instant::now();
            }
            return polled;
        }
        let Some(deadline) = this.watch.deadline(this.last_read, this.idle_timeout) else {
            return Poll::Pending;
        };
        if this.deadline.deadline() != deadline {
            this.deadline.as_mut().reset(deadline);
        }
        match this.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client sent nothing within the idle timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for WatchedConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
