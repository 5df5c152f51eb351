//! The API's listener against hostile clients (docs/security.md, "The listener"): a
//! header-read timeout that also closes idle keep-alive connections and half-sent heads, a
//! first-request timeout, and a cap on open connections, beyond which a new connection is
//! closed at once; on plain HTTP and HTTPS alike. The cap fits the process's open-file
//! limit, so idle sockets can never take the descriptors a running deploy needs.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use anyhow::{Context as _, Result};
use axum::Router;
use axum_server::{accept::Accept, tls_rustls::RustlsConfig};
use futures::future::BoxFuture;
use hyper_util::rt::TokioTimer;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpListener,
    sync::{OwnedSemaphorePermit, Semaphore},
    task::JoinHandle,
};

/// Descriptors kept for everything but API connections: the database, SSH sessions,
/// artifacts, plugin processes and their pipes.
const RESERVED_FDS: u64 = 256;

/// What the listener allows (`api.max_connections`, `api.header_read_timeout`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
}

/// The open-file limit as the process found it and as it leaves it, and the connection cap
/// that fits: `wanted`, or fewer when even the hard limit leaves too few descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fit {
    pub cap: usize,
    /// The soft limit to set, if it must be raised.
    pub raise_soft_to: Option<u64>,
}

/// Fits `wanted` connections to an open-file limit of `soft` (raisable up to `hard`;
/// `None` is unlimited), keeping [`RESERVED_FDS`] for the rest of the process.
pub fn fit(wanted: usize, soft: Option<u64>, hard: Option<u64>) -> Fit {
    let wanted_u64 = u64::try_from(wanted).unwrap_or(u64::MAX);
    let need = wanted_u64.saturating_add(RESERVED_FDS);
    let soft = soft.unwrap_or(u64::MAX);
    let hard = hard.unwrap_or(u64::MAX);
    let raise_soft_to = (soft < need)
        .then(|| need.min(hard))
        .filter(|&to| to > soft);
    let usable = raise_soft_to.unwrap_or(soft).saturating_sub(RESERVED_FDS);
    let cap = usize::try_from(usable.min(wanted_u64))
        .unwrap_or(wanted)
        .max(1);
    Fit { cap, raise_soft_to }
}

/// Applies [`fit`] to this process: raises the soft open-file limit if it must and can,
/// and says (a warning) when the cap had to be lowered.
pub fn fit_to_this_process(wanted: usize) -> usize {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let fit = fit(wanted, limit.current, limit.maximum);
    let mut soft = limit.current;
    if let Some(to) = fit.raise_soft_to {
        match setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(to),
                maximum: limit.maximum,
            },
        ) {
            Ok(()) => soft = Some(to),
            Err(e) => {
                tracing::warn!(error = %e, "cannot raise the open-file limit for the API's connections");
            }
        }
    }
    let cap = fit.cap.min(
        usize::try_from(soft.unwrap_or(u64::MAX).saturating_sub(RESERVED_FDS))
            .unwrap_or(usize::MAX)
            .max(1),
    );
    if cap < wanted {
        tracing::warn!(
            max_connections = wanted,
            cap,
            open_file_limit = ?soft,
            "api.max_connections lowered to what the open-file limit allows (keeping {RESERVED_FDS} descriptors for deploys); raise the limit (systemd LimitNOFILE, ulimit -n) to allow more"
        );
    }
    cap
}

/// Serves `app` on `listener` until `shutdown` resolves (then gracefully), with `limits`,
/// over TLS when `tls` is given. HTTP/1.1 only, as before.
pub fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<RustlsConfig>,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<JoinHandle<io::Result<()>>> {
    let handle = axum_server::Handle::new();
    let stopper = handle.clone();
    tokio::spawn(async move {
        shutdown.await;
        stopper.graceful_shutdown(None);
    });
    let capped = Capped {
        inner: axum_server::accept::DefaultAcceptor::new(),
        open: Arc::new(Semaphore::new(limits.max_connections)),
        shed: Arc::new(AtomicU64::new(0)),
    };
    let std_listener = listener
        .into_std()
        .context("cannot hand the API's listener to the server")?;
    let server = axum_server::from_tcp(std_listener)
        .context("cannot serve on the API's listener")?
        .handle(handle)
        .http1_only()
        .first_request_timeout(limits.header_read_timeout);
    // Each request carries its peer address: the source the throttle of failed
    // authentications counts (docs/security.md, "Failed authentications").
    let make_service = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    let task = match tls {
        None => {
            let mut server = server
                .acceptor(capped.clone())
                .accept_error_handler(move |_, e| capped.note_error(e));
            with_header_timeout(server.http_builder(), limits);
            tokio::spawn(async move { server.serve(make_service).await })
        }
        Some(tls) => {
            // The handshake happens once the connection holds its permit: it counts too.
            let acceptor = axum_server::tls_rustls::RustlsAcceptor::new(tls)
                .handshake_timeout(limits.header_read_timeout)
                .acceptor(capped.clone());
            let mut server = server
                .acceptor(acceptor)
                .accept_error_handler(move |_, e| capped.note_error(e));
            with_header_timeout(server.http_builder(), limits);
            tokio::spawn(async move { server.serve(make_service).await })
        }
    };
    Ok(task)
}

/// hyper's header-read timeout, with the timer it needs to run at all.
fn with_header_timeout(
    builder: &mut hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor>,
    limits: Limits,
) {
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
}

/// Why a connection was closed at once: the cap was reached.
#[derive(Debug)]
struct CapReached;

impl std::fmt::Display for CapReached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the API's connection cap (api.max_connections) is reached")
    }
}

impl std::error::Error for CapReached {}

/// An acceptor that lets at most the semaphore's permits of connections be open, each
/// holding a permit until it closes; one more is closed at once.
#[derive(Clone)]
struct Capped<A> {
    inner: A,
    open: Arc<Semaphore>,
    /// Connections closed at once since start (logged now and then, not each).
    shed: Arc<AtomicU64>,
}

impl<A> Capped<A> {
    /// Logs a shed connection, the first and then every 1,000th (a flood must not flood
    /// the log too); other accept errors (a TLS handshake that failed) at debug.
    fn note_error(&self, e: &io::Error) {
        if e.get_ref().is_some_and(|inner| inner.is::<CapReached>()) {
            let shed = self.shed.fetch_add(1, Ordering::Relaxed) + 1;
            if shed == 1 || shed.is_multiple_of(1000) {
                tracing::warn!(shed, "{CapReached}: new connections are closed at once");
            }
        } else {
            tracing::debug!(error = %e, "an API connection failed before its first request");
        }
    }
}

impl<I, S, A> Accept<I, S> for Capped<A>
where
    A: Accept<I, S>,
    A::Future: Send + 'static,
    A::Stream: Send + 'static,
    A::Service: Send + 'static,
{
    type Stream = Counted<A::Stream>;
    type Service = A::Service;
    type Future = BoxFuture<'static, io::Result<(Self::Stream, Self::Service)>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        let Ok(permit) = self.open.clone().try_acquire_owned() else {
            drop(stream);
            return Box::pin(std::future::ready(Err(io::Error::other(CapReached))));
        };
        let accepted = self.inner.accept(stream, service);
        Box::pin(async move {
            let (stream, service) = accepted.await?;
            Ok((
                Counted {
                    stream,
                    _permit: permit,
                },
                service,
            ))
        })
    }
}

/// A connection counted against the cap until it is dropped.
pub struct Counted<S> {
    stream: S,
    _permit: OwnedSemaphorePermit,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(wanted: usize, soft: Option<u64>, hard: Option<u64>, expected: Fit) {
        assert_eq!(
            fit(wanted, soft, hard),
            expected,
            "{wanted} connections under soft {soft:?}, hard {hard:?}"
        );
    }

    #[test]
    fn the_cap_fits_the_open_file_limit_raising_the_soft_limit_when_it_can() {
        // Room enough: nothing changes.
        check(
            1000,
            Some(65536),
            Some(65536),
            Fit {
                cap: 1000,
                raise_soft_to: None,
            },
        );
        // Debian's default soft 1024, hard 524288: raised to what is needed.
        check(
            4096,
            Some(1024),
            Some(524_288),
            Fit {
                cap: 4096,
                raise_soft_to: Some(4352),
            },
        );
        // A low hard limit: raised to it, and the cap lowered to what is left.
        check(
            4096,
            Some(256),
            Some(1024),
            Fit {
                cap: 768,
                raise_soft_to: Some(1024),
            },
        );
        // Unlimited.
        check(
            4096,
            None,
            None,
            Fit {
                cap: 4096,
                raise_soft_to: None,
            },
        );
        // Nothing left beyond the reserve: one connection, never none.
        check(
            4096,
            Some(200),
            Some(200),
            Fit {
                cap: 1,
                raise_soft_to: None,
            },
        );
    }
}
