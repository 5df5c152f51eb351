//! The API's listener against hostile clients (docs/security.md, "The listener"): a
//! header-read timeout that also closes idle keep-alive connections and half-sent heads, a
//! first-request timeout, a cap on open connections and one per source address, beyond
//! which a new connection is closed at once, but for a few reserved for health probes; on
//! plain HTTP and HTTPS alike. The cap fits the process's open-file limit, so idle sockets
//! can never take the descriptors a running deploy needs.

use std::{
    collections::HashMap,
    future::Future,
    io,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use anyhow::{Context as _, Result};
use axum::{
    Router,
    body::Body,
    http::{Method, Request, Response, header},
    response::IntoResponse,
};
use axum_server::{accept::Accept, tls_rustls::RustlsConfig};
use futures::future::BoxFuture;
use hyper_util::rt::TokioTimer;
use manent_api::throttle::Source;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    task::JoinHandle,
};

/// Descriptors kept for everything but API connections: the database, SSH sessions,
/// artifacts, plugin processes and their pipes.
const RESERVED_FDS: u64 = 256;

/// Connections kept beyond the caps for health probes: a connection that finds its cap
/// reached may take one, and is then answered only `GET /healthz` and `GET /readyz`, once
/// (docs/security.md, "The listener").
pub const HEALTH_RESERVE: usize = 8;
/// The most reserved connections one source holds at once (a liveness and a readiness
/// probe), so that one source cannot hold the whole reserve.
pub const HEALTH_RESERVE_PER_SOURCE: usize = 2;

/// What the listener allows (`api.max_connections`, `api.max_connections_per_source`,
/// `api.header_read_timeout`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub max_connections_per_source: usize,
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
        slots: Arc::new(Slots {
            open: Arc::new(Semaphore::new(limits.max_connections)),
            reserve: Arc::new(Semaphore::new(HEALTH_RESERVE)),
            per_source: limits.max_connections_per_source,
            by_source: Mutex::new(HashMap::new()),
        }),
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

/// Which cap a connection found reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cap {
    /// `api.max_connections`.
    Global,
    /// `api.max_connections_per_source`, for this source.
    PerSource(Source),
}

impl std::fmt::Display for Cap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cap::Global => f.write_str("the API's connection cap (api.max_connections) is reached"),
            Cap::PerSource(source) => write!(
                f,
                "the API's connection cap per source (api.max_connections_per_source) is \
                 reached for {source}"
            ),
        }
    }
}

/// Why a connection was closed at once: its cap was reached, and so was the health reserve.
#[derive(Debug)]
struct CapReached(Cap);

impl std::fmt::Display for CapReached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for CapReached {}

/// The connections one source holds: counted against the cap per source, and reserved.
#[derive(Debug, Default, Clone, Copy)]
struct Held {
    open: usize,
    reserved: usize,
}

/// The permits of every connection: the global cap, the health reserve, and what each
/// source holds. A source is in `by_source` only while it holds a connection: the map is
/// never larger than the open connections.
struct Slots {
    open: Arc<Semaphore>,
    reserve: Arc<Semaphore>,
    per_source: usize,
    by_source: Mutex<HashMap<Source, Held>>,
}

impl Slots {
    /// A slot for a new connection from `source`: a full one within both caps, else a
    /// reserved one (health probes only) while the reserve and the source's share of it
    /// last, else the cap that refused it.
    fn admit(self: &Arc<Self>, source: Source) -> Result<Admission, CapReached> {
        let mut by_source = self
            .by_source
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let held = by_source.entry(source).or_default();
        let cap = if held.open >= self.per_source {
            Cap::PerSource(source)
        } else if let Ok(permit) = self.open.clone().try_acquire_owned() {
            held.open += 1;
            return Ok(self.admission(source, permit, None));
        } else {
            Cap::Global
        };
        if held.reserved < HEALTH_RESERVE_PER_SOURCE
            && let Ok(permit) = self.reserve.clone().try_acquire_owned()
        {
            held.reserved += 1;
            return Ok(self.admission(source, permit, Some(cap)));
        }
        if held.open == 0 && held.reserved == 0 {
            by_source.remove(&source);
        }
        Err(CapReached(cap))
    }

    fn admission(
        self: &Arc<Self>,
        source: Source,
        permit: OwnedSemaphorePermit,
        reserved_because: Option<Cap>,
    ) -> Admission {
        Admission {
            slots: self.clone(),
            source,
            reserved_because,
            _permit: permit,
        }
    }
}

/// A connection's slot, given back when the connection is dropped.
struct Admission {
    slots: Arc<Slots>,
    source: Source,
    /// Set when the slot is a reserved one: the cap the connection found reached.
    reserved_because: Option<Cap>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut by_source = self
            .slots
            .by_source
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(held) = by_source.get_mut(&self.source) {
            match self.reserved_because {
                Some(_) => held.reserved = held.reserved.saturating_sub(1),
                None => held.open = held.open.saturating_sub(1),
            }
            if held.open == 0 && held.reserved == 0 {
                by_source.remove(&self.source);
            }
        }
    }
}

/// An acceptor that lets at most the global cap of connections be open, and at most the
/// cap per source from one source, each holding its slot until it closes; one more takes
/// a reserved slot for health probes if one is left, else is closed at once.
#[derive(Clone)]
struct Capped<A> {
    inner: A,
    slots: Arc<Slots>,
    /// Connections closed at once since start (logged now and then, not each).
    shed: Arc<AtomicU64>,
}

impl<A> Capped<A> {
    /// Logs a shed connection, the first and then every 1,000th (a flood must not flood
    /// the log too); other accept errors (a TLS handshake that failed) at debug.
    fn note_error(&self, e: &io::Error) {
        if let Some(cap) = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<CapReached>())
        {
            let shed = self.shed.fetch_add(1, Ordering::Relaxed) + 1;
            if shed == 1 || shed.is_multiple_of(1000) {
                tracing::warn!(
                    shed,
                    health_reserve = HEALTH_RESERVE,
                    "{cap}, and so is the reserve for health probes: new connections are \
                     closed at once"
                );
            }
        } else {
            tracing::debug!(error = %e, "an API connection failed before its first request");
        }
    }
}

impl<S, A> Accept<TcpStream, S> for Capped<A>
where
    A: Accept<TcpStream, S>,
    A::Future: Send + 'static,
    A::Stream: Send + 'static,
    A::Service: Send + 'static,
{
    type Stream = Counted<A::Stream>;
    type Service = Gate<A::Service>;
    type Future = BoxFuture<'static, io::Result<(Self::Stream, Self::Service)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        // IPv4 by address, IPv6 by /64 (docs/security.md, "The listener"); a socket whose
        // peer cannot be read is counted under `unknown`, one source.
        let source = Source::from_ip(stream.peer_addr().ok().map(|addr| addr.ip()));
        let admission = match self.slots.admit(source) {
            Ok(admission) => admission,
            Err(refused) => {
                drop(stream);
                return Box::pin(std::future::ready(Err(io::Error::other(refused))));
            }
        };
        let health_only = admission.reserved_because;
        let accepted = self.inner.accept(stream, service);
        Box::pin(async move {
            let (stream, service) = accepted.await?;
            Ok((
                Counted {
                    stream,
                    _admission: admission,
                },
                Gate {
                    inner: service,
                    health_only,
                },
            ))
        })
    }
}

/// A connection's service: the API, or on a reserved connection only the health probes,
/// each answered with `Connection: close`, anything else 503 naming the cap.
#[derive(Clone)]
pub struct Gate<S> {
    inner: S,
    health_only: Option<Cap>,
}

/// Whether `request` is a health probe, which a reserved connection serves.
fn is_health_probe<B>(request: &Request<B>) -> bool {
    matches!(*request.method(), Method::GET | Method::HEAD)
        && matches!(request.uri().path(), "/healthz" | "/readyz")
}

impl<S, B> tower::Service<Request<B>> for Gate<S>
where
    S: tower::Service<Request<B>, Response = Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let Some(cap) = self.health_only else {
            return Box::pin(self.inner.call(request));
        };
        let answer = if is_health_probe(&request) {
            Box::pin(self.inner.call(request)) as Self::Future
        } else {
            let refusal = manent_api::AppError::Overloaded(format!(
                "{cap}: this connection is one kept for health probes and answers only \
                 GET /healthz and GET /readyz; retry later, or close idle connections"
            ))
            .into_response();
            Box::pin(std::future::ready(Ok(refusal)))
        };
        // One request, then the reserved slot is given back.
        Box::pin(async move {
            let mut response = answer.await?;
            response.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            Ok(response)
        })
    }
}

/// A connection counted against its caps until it is dropped.
pub struct Counted<S> {
    stream: S,
    _admission: Admission,
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

    fn source(text: &str) -> Source {
        Source::from_ip(Some(text.parse().expect("an address")))
    }

    /// What `admit` gave: `full`, `reserved (<cap>)` or `refused (<cap>)`.
    fn admitted(slots: &Arc<Slots>, from: &str, held: &mut Vec<Admission>) -> String {
        match slots.admit(source(from)) {
            Ok(admission) => {
                let what = match admission.reserved_because {
                    None => "full".to_string(),
                    Some(cap) => format!("reserved ({cap:?})"),
                };
                held.push(admission);
                what
            }
            Err(CapReached(cap)) => format!("refused ({cap:?})"),
        }
    }

    #[test]
    fn a_source_past_its_cap_gets_a_reserved_slot_then_none_and_every_slot_comes_back() {
        let slots = Arc::new(Slots {
            open: Arc::new(Semaphore::new(3)),
            reserve: Arc::new(Semaphore::new(HEALTH_RESERVE)),
            per_source: 2,
            by_source: Mutex::new(HashMap::new()),
        });
        let mut held = Vec::new();
        let seen: Vec<String> = ["192.0.2.1"; 5]
            .iter()
            .chain(["2001:db8:1:2::1", "2001:db8:1:2::ffff", "2001:db8:1:3::1"].iter())
            .map(|from| admitted(&slots, from, &mut held))
            .collect();
        assert_eq!(
            seen,
            [
                "full",
                "full",
                "reserved (PerSource(Source(Some(192.0.2.1))))",
                "reserved (PerSource(Source(Some(192.0.2.1))))",
                "refused (PerSource(Source(Some(192.0.2.1))))",
                "full",
                // The same /64: the global cap (3) is reached.
                "reserved (Global)",
                "reserved (Global)",
            ],
            "two full slots per source, then two reserved ones, then none; an IPv6 /64 is one \
             source"
        );
        held.clear();
        assert!(
            slots.by_source.lock().unwrap().is_empty(),
            "closed connections give their slots back and no source is left behind"
        );
        assert_eq!(
            (
                slots.open.available_permits(),
                slots.reserve.available_permits()
            ),
            (3, HEALTH_RESERVE),
            "every permit is back"
        );
    }

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
