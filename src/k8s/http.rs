//! The one HTTP server of the daemons: `/metrics`, `/healthz` and `/readyz` on a thread of its
//! own with its own single-threaded runtime, within [`LIMITS`] (anything in the pod network can
//! connect to it). What it answers comes from the daemon through [`Endpoints`].
//!
//! Its own two log lines (the runtime cannot start, the server stopped) use the target
//! [`super::LOG_TARGET`], which every daemon's default log filter shows ([`super::daemon::log_filter`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::LOG_TARGET;

/// Why `/metrics` has no answer (500).
#[derive(Debug, thiserror::Error)]
#[error("cannot encode the metrics: {0}")]
pub struct EncodeError(#[from] pub std::fmt::Error);

/// Why a probe answers 503; the text says what, for people (the answer's body).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unhealthy {
    /// Not live (`/healthz`, and so `/readyz`): something has made no progress for too long.
    #[error("{0}")]
    Stuck(String),
    /// Live but not ready (`/readyz`): not connected, or not listed or passed yet.
    #[error("{0}")]
    NotReady(String),
}

/// Why the HTTP server does not run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
    /// The address cannot be bound (a port in use, an address not on this host).
    #[error(
        "cannot listen on {addr} for /metrics, /healthz and /readyz: {source}; give a free port with --metrics-address (and the probes' port in the DaemonSet)"
    )]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The bound socket cannot be used (its address, its runtime registration).
    #[error("{0}")]
    Socket(std::io::Error),
    /// The server's thread cannot be started.
    #[error("cannot start the metrics server's thread: {0}")]
    Thread(std::io::Error),
}

/// What the one HTTP server of the daemons (the provisioner, the controller; [`serve`]) answers:
/// `/metrics`, `/healthz` and `/readyz`.
pub(crate) trait Endpoints: Send + Sync + 'static {
    /// The registry as OpenMetrics text.
    fn metrics(&self) -> Result<String, EncodeError>;
    /// `/healthz` at `at`: `Err` says what is stuck.
    fn live(&self, at: Instant) -> Result<(), Unhealthy>;
    /// `/readyz` at `at`: `Err` says why not ready.
    fn ready(&self, at: Instant) -> Result<(), Unhealthy>;
}

/// The answer to `GET path`: status and body.
pub(crate) fn answer(shared: &dyn Endpoints, path: &str, at: Instant) -> (u16, String) {
    let probe = |r: Result<(), Unhealthy>| match r {
        Ok(()) => (200, "ok\n".to_owned()),
        Err(e) => (503, format!("{e}\n")),
    };
    match path {
        "/metrics" => match shared.metrics() {
            Ok(s) => (200, s),
            Err(e) => (500, format!("{e}\n")),
        },
        "/healthz" | "/livez" => probe(shared.live(at)),
        "/readyz" => probe(shared.ready(at)),
        _ => (404, "not found: /metrics, /healthz, /readyz\n".to_owned()),
    }
}

/// How many connections the server holds at once, and for how long. Anything in the pod network
/// (every tenant's pods) can connect to `--metrics-address`: without a bound, one pod opening
/// connections and sending nothing would hold sockets and tasks until the process runs out of
/// descriptors, and kubelet's probes would fail with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Connections held at once from one peer address (the excess is closed at once, unread).
    pub(crate) per_peer: usize,
    /// Connections held at once in all (the excess is closed at once, unread).
    pub(crate) total: usize,
    /// A connection must send its request head within this.
    pub(crate) header: Duration,
    /// A connection is closed this long after it was accepted, whatever it is doing (a client
    /// that sends slowly or never reads the answer).
    pub(crate) connection: Duration,
}

/// The server's [`Limits`]: a pod (one peer address) holds at most 4 connections, everyone at
/// most 64, each at most 10 s. kubelet's probes come from the node's address (one at a time per
/// probe, each within its 5 s timeout) and Prometheus scrapes from its own: neither is a tenant's
/// pod, so one tenant's pod cannot crowd them out; only 16 pods of distinct addresses together
/// can fill the total, for 10 s at a time (a NetworkPolicy keeps them out altogether:
/// drivers/deploy/README.md, section 7).
pub(crate) const LIMITS: Limits = Limits {
    per_peer: 4,
    total: 64,
    header: Duration::from_secs(5),
    connection: Duration::from_secs(10),
};

/// Binds `addr` now (so a port in use is an error at start) and serves `/metrics`, `/healthz` and
/// `/readyz` on a thread of its own until the process ends, within [`LIMITS`]. No keep-alive, so
/// a connection lives for one request. Returns the address bound (port 0: the one the kernel
/// chose).
pub(crate) fn serve(
    addr: SocketAddr,
    shared: Arc<dyn Endpoints>,
) -> Result<SocketAddr, ServeError> {
    serve_within(addr, shared, LIMITS)
}

/// [`serve`] within `limits` (shorter ones in tests).
pub(crate) fn serve_within(
    addr: SocketAddr,
    shared: Arc<dyn Endpoints>,
    limits: Limits,
) -> Result<SocketAddr, ServeError> {
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|source| ServeError::Bind { addr, source })?;
    let bound = listener.local_addr().map_err(ServeError::Socket)?;
    std::thread::Builder::new()
        .name("flexvol-telemetry".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(target: LOG_TARGET, "cannot start the metrics server's runtime: {e}; no /metrics, /healthz or /readyz");
                    return;
                }
            };
            if let Err(e) = rt.block_on(http(listener, shared, limits)) {
                tracing::error!(target: LOG_TARGET, "the metrics server stopped: {e}; no /metrics, /healthz or /readyz");
            }
        })
        .map_err(ServeError::Thread)?;
    Ok(bound)
}

/// The connections held, by peer address.
#[derive(Debug, Default)]
struct Held {
    by_peer: std::collections::HashMap<std::net::IpAddr, usize>,
    total: usize,
}

/// One connection's place in [`Held`]; given back when dropped.
struct Slot {
    held: Arc<std::sync::Mutex<Held>>,
    peer: std::net::IpAddr,
}

impl Slot {
    /// A place for a connection from `peer`, unless `peer` or everyone holds the most `limits`
    /// allow.
    fn take(
        held: &Arc<std::sync::Mutex<Held>>,
        peer: std::net::IpAddr,
        limits: Limits,
    ) -> Option<Self> {
        let mut h = held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mine = h.by_peer.get(&peer).copied().unwrap_or(0);
        if mine >= limits.per_peer || h.total >= limits.total {
            return None;
        }
        h.by_peer.insert(peer, mine + 1);
        h.total += 1;
        Some(Self {
            held: held.clone(),
            peer,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut h = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        h.total = h.total.saturating_sub(1);
        if let Some(n) = h.by_peer.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                h.by_peer.remove(&self.peer);
            }
        }
    }
}

/// The answer to one request.
fn respond<B>(
    shared: &dyn Endpoints,
    req: &hyper::Request<B>,
) -> hyper::Response<http_body_util::Full<hyper::body::Bytes>> {
    use hyper::{Method, Response, StatusCode, header};
    let (status, body) = if req.method() == Method::GET {
        answer(shared, req.uri().path(), Instant::now())
    } else {
        (405, "GET only\n".to_owned())
    };
    let ctype = if status == 200 && req.uri().path() == "/metrics" {
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    } else {
        "text/plain; charset=utf-8"
    };
    let mut resp = Response::new(http_body_util::Full::from(body));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(ctype),
    );
    resp
}

async fn http(
    listener: std::net::TcpListener,
    shared: Arc<dyn Endpoints>,
    limits: Limits,
) -> Result<(), ServeError> {
    let listener = tokio::net::TcpListener::from_std(listener).map_err(ServeError::Socket)?;
    let held = Arc::new(std::sync::Mutex::new(Held::default()));
    // HTTP/1 only (hyper 1's http1 connection: no HTTP/2 upgrade), one request per connection,
    // the request head within `limits.header` (the timer makes that bound effective).
    let mut conn = hyper::server::conn::http1::Builder::new();
    conn.timer(hyper_util::rt::TokioTimer::new())
        .keep_alive(false)
        .header_read_timeout(limits.header);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, or a connection reset before it was accepted: the
                // listener stays; try again shortly.
                tracing::debug!(target: LOG_TARGET, "metrics server: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // An IPv4 peer on a dual-stack socket counts as its IPv4 address.
        let Some(slot) = Slot::take(&held, peer.ip().to_canonical(), limits) else {
            // Over the cap: closed at once, unread.
            drop(stream);
            continue;
        };
        let shared = shared.clone();
        let serving = conn.serve_connection(
            hyper_util::rt::TokioIo::new(stream),
            hyper::service::service_fn(move |req| {
                let resp = respond(shared.as_ref(), &req);
                async move { Ok::<_, std::convert::Infallible>(resp) }
            }),
        );
        tokio::spawn(async move {
            let _slot = slot;
            let _ = tokio::time::timeout(limits.connection, serving).await;
        });
    }
}
