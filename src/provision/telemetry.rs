//! What an operator sees of `flexvol provisioner`: levelled logs, Prometheus metrics, and the
//! health endpoints kubelet probes.
//!
//! - **Logs** ([`init_logs`]): `tracing` events with the target [`LOG_TARGET`], on stderr, as text
//!   (`<RFC 3339 time> <LEVEL> flexvol-provisioner: <message>`, the default) or JSON lines
//!   (`--log-format json`), filtered by `--log-filter` or `RUST_LOG` (`info`,
//!   `flexvol-provisioner=debug,kube=info`: tracing-subscriber's `Targets` syntax; the default
//!   shows this provisioner's `info` and nothing of the libraries, whose errors it logs itself:
//!   kube-client's own line for each failed request would only double them). Set up only by
//!   [`super::run`]: the driver verbs never reach this module.
//! - **Metrics** ([`Metrics`]): the names in drivers/deploy/README.md ("7. Metrics, health and logs"), kept in a
//!   `prometheus-client` registry, served as OpenMetrics text (which Prometheus reads).
//! - **Health** ([`Health`]): `/healthz` answers 200 while the loop is alive (a pass ended, or
//!   the loop waited for a config, within [`Health::live_window`]); `/readyz` answers 200 once the
//!   watch caches have listed and a pass ended within [`Health::ready_window`].
//!
//! The HTTP server ([`serve`]) runs on a thread of its own with its own single-threaded runtime:
//! a pass does blocking work (mounts, `lvm` commands, NFS servers that may not answer), which on
//! the loop's runtime would stall a scrape and fail a probe; and a slow scraper never touches the
//! loop, which only updates atomics and the registry's short-held locks.

use super::reconcile::{Action, Outcome, Report};
use crate::node::config::Config;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// The target of the provisioner's log events (what text lines show before the message).
pub const LOG_TARGET: &str = "flexvol-provisioner";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `<time> <LEVEL> flexvol-provisioner: <message>`, one line per event.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the event's fields.
    Json,
}

/// RFC 3339 UTC times, as the provisioner's lines always had.
struct Rfc3339;

impl tracing_subscriber::fmt::time::FormatTime for Rfc3339 {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        w.write_str(&crate::node::calllog::rfc3339(SystemTime::now()))
    }
}

/// The filter for `spec` (`None`: this provisioner's `info`, nothing of the libraries).
pub fn log_filter(
    spec: Option<&str>,
    default_target: &str,
) -> Result<tracing_subscriber::filter::Targets, String> {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    match spec.map(str::trim).filter(|s| !s.is_empty()) {
        None => Ok(Targets::new()
            .with_target(default_target, LevelFilter::INFO)
            .with_default(LevelFilter::OFF)),
        Some(s) => s.parse().map_err(|e| {
            format!("log filter {s:?}: {e}; write e.g. info or {default_target}=debug,kube=info")
        }),
    }
}

/// Sets the process's log subscriber: `format` on stderr, filtered by `filter` (or `RUST_LOG`;
/// with neither, `default_target`'s info and nothing of the libraries).
pub fn init_logs(
    format: LogFormat,
    filter: Option<&str>,
    default_target: &str,
) -> Result<(), String> {
    use tracing_subscriber::layer::SubscriberExt;
    let env = std::env::var("RUST_LOG").ok();
    let targets = log_filter(filter.or(env.as_deref()), default_target)?;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_timer(Rfc3339);
    let sub = tracing_subscriber::registry().with(targets);
    let set = match format {
        LogFormat::Text => tracing::subscriber::set_global_default(sub.with(fmt)),
        LogFormat::Json => {
            tracing::subscriber::set_global_default(sub.with(fmt.json().flatten_event(true)))
        }
    };
    set.map_err(|e| format!("cannot set up logging: {e}"))
}

/// The start of a daemon command that keeps no signal thread (`flexvol controller`,
/// `flexvol scheduler-extender`), after the caller has set its panic hook (whose log line must
/// name the caller's own target): the termination signals that main() blocks for the driver verbs
/// are unblocked (without it SIGTERM would wait for the kubelet's SIGKILL), and the logs are set
/// up as [`init_logs`] does. `false` when logging cannot be set up, after saying why on stderr
/// (there is no logger yet): the caller exits 2. Call it on the main thread before any other
/// thread exists (threads inherit the signal mask).
#[must_use]
pub fn start_daemon(format: LogFormat, filter: Option<&str>, default_target: &str) -> bool {
    {
        use nix::sys::signal::{SigSet, Signal};
        let mut set = SigSet::empty();
        for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
            set.add(s);
        }
        let _ = set.thread_unblock();
    }
    match init_logs(format, filter, default_target) {
        Ok(()) => true,
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("{default_target}: {e}");
            }
            false
        }
    }
}

/// Labels of an operation: `action`, `kind`, `outcome`.
type OpLabels = [(&'static str, &'static str); 3];
/// Labels of a capacity: `kind` and `pool` (a hostPath root's path or an LVM volume group).
type PoolLabels = [(&'static str, String); 2];

fn action_name(a: Action) -> &'static str {
    match a {
        Action::Provision => "provision",
        Action::Delete => "delete",
        Action::Resize => "resize",
    }
}

fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Success => "success",
        Outcome::Failure => "failure",
        Outcome::Rescheduled => "rescheduled",
    }
}

/// Bytes as a gauge value (saturating: no filesystem or VG comes near 2^63 bytes).
fn gauge_bytes(b: u64) -> i64 {
    i64::try_from(b).unwrap_or(i64::MAX)
}

/// `flexvol_provisioner_watch_events_total{watch=...}`: objects each watch received (the items
/// of a list and every event), shared with the metrics registry.
pub type WatchEvents = Family<[(&'static str, &'static str); 1], Counter>;

/// The provisioner's metrics; the handles are cheap to update and shared with the registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    ops: Family<OpLabels, Counter>,
    op_seconds: Family<OpLabels, Histogram>,
    passes: Counter,
    pass_seconds: Histogram,
    errors: Counter,
    cached: Family<[(&'static str, &'static str); 1], Gauge>,
    last_pass: Gauge,
    queue_depth: Family<[(&'static str, &'static str); 1], Gauge>,
    retries: Family<[(&'static str, &'static str); 1], Gauge>,
    breakers_open: Family<[(&'static str, &'static str); 1], Gauge>,
    size: Family<PoolLabels, Gauge>,
    free: Family<PoolLabels, Gauge>,
    leader: Family<[(&'static str, String); 1], Gauge>,
    watch_events: WatchEvents,
    claim_labels: Family<[(&'static str, &'static str); 1], Counter>,
    quota_drift: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric, all at zero.
    pub fn new() -> Self {
        fn hist() -> Histogram {
            // 5 ms .. ~82 s: a directory, an LV with mkfs, an NFS server that is slow to answer.
            Histogram::new(exponential_buckets(0.005, 2.0, 15))
        }
        let mut r = Registry::default();
        let m = Self {
            ops: Family::default(),
            op_seconds: Family::new_with_constructor(hist),
            passes: Counter::default(),
            pass_seconds: hist(),
            errors: Counter::default(),
            cached: Family::default(),
            last_pass: Gauge::default(),
            queue_depth: Family::default(),
            retries: Family::default(),
            breakers_open: Family::default(),
            size: Family::default(),
            free: Family::default(),
            leader: Family::default(),
            watch_events: Family::default(),
            claim_labels: Family::default(),
            quota_drift: Counter::default(),
            registry: Registry::default(),
        };
        r.register(
            "flexvol_provisioner_operations",
            "Provision, delete and resize attempts by kind and outcome (a failure is retried after a backoff)",
            m.ops.clone(),
        );
        r.register(
            "flexvol_provisioner_operation_duration_seconds",
            "Duration of provision, delete and resize attempts by kind and outcome",
            m.op_seconds.clone(),
        );
        r.register(
            "flexvol_provisioner_passes",
            "Batches of work run by the lanes (a batch: the keys due, or a resync of all)",
            m.passes.clone(),
        );
        r.register(
            "flexvol_provisioner_pass_duration_seconds",
            "Duration of the lanes' batches",
            m.pass_seconds.clone(),
        );
        r.register(
            "flexvol_provisioner_errors",
            "Failures reported by passes (API errors, volume errors, events not recorded); each is retried",
            m.errors.clone(),
        );
        r.register(
            "flexvol_provisioner_cached_objects",
            "Objects in this instance's watch caches, by resource",
            m.cached.clone(),
        );
        r.register(
            "flexvol_provisioner_last_pass_timestamp_seconds",
            "Unix time the last pass ended",
            m.last_pass.clone(),
        );
        r.register(
            "flexvol_provisioner_queue_depth",
            "Keys in a lane's work queue: due now or waiting out a backoff after a failure, by lane",
            m.queue_depth.clone(),
        );
        r.register(
            "flexvol_provisioner_retries",
            "Keys a lane has retried after a failure since start (per-object exponential backoff), by lane",
            m.retries.clone(),
        );
        r.register(
            "flexvol_provisioner_breakers_open",
            "Servers (fault domains) whose work a lane holds back after a failure, by lane",
            m.breakers_open.clone(),
        );
        r.register(
            "flexvol_provisioner_capacity_bytes",
            "Size of this node's hostPath roots' filesystems (kind hostpath, pool: the root)",
            m.size.clone(),
        );
        r.register(
            "flexvol_provisioner_free_bytes",
            "Free bytes of this node's hostPath roots (for unprivileged use) and allowed LVM volume groups (pool: root or VG)",
            m.free.clone(),
        );
        r.register(
            "flexvol_provisioner_leader",
            "1 while this instance holds the Lease (label lease: flexvol-claims, flexvol-nfs), else 0",
            m.leader.clone(),
        );
        r.register(
            "flexvol_provisioner_watch_events",
            "Objects this instance's watches received (list items and events), by watch: claims-node (claims labelled flexvol/node=<this node>), claims-all (every claim, while holding flexvol-claims), claims-shared and pvs-shared (the shared kinds', while leading them), pvs-node",
            m.watch_events.clone(),
        );
        r.register(
            "flexvol_provisioner_claim_labels",
            "Label writes on claims by the holder of flexvol-claims (flexvol/node, flexvol/kind), by outcome",
            m.claim_labels.clone(),
        );
        r.register(
            "flexvol_provisioner_quota_drift",
            "Enforced hostPath sizes found drifted by a pass (the volume directory moved out of its recorded project or without the project-inherit flag, as a pod with CAP_FOWNER can do), each put back with a QuotaDrift event on the PV",
            m.quota_drift.clone(),
        );
        Self { registry: r, ..m }
    }

    /// The gauge of the Lease `lease` (1: this instance leads), shared with the registry.
    pub fn leader(&self, lease: &str) -> Gauge {
        self.leader
            .get_or_create(&[("lease", lease.to_owned())])
            .clone()
    }

    /// The watch event counters, shared with the registry (for the watch caches).
    pub fn watch_events(&self) -> WatchEvents {
        self.watch_events.clone()
    }

    /// Counts one label write on a claim (`outcome`: success, failure).
    pub fn claim_labelled(&self, outcome: &'static str) {
        self.claim_labels
            .get_or_create(&[("outcome", outcome)])
            .inc();
    }

    /// Counts what a pass did, which took `took`.
    pub fn record(&self, r: &Report, took: Duration) {
        self.passes.inc();
        self.pass_seconds.observe(took.as_secs_f64());
        self.errors
            .inc_by(u64::try_from(r.failed.len()).unwrap_or(u64::MAX));
        self.quota_drift
            .inc_by(u64::try_from(r.quota_drift.len()).unwrap_or(u64::MAX));
        for op in &r.ops {
            let l = [
                ("action", action_name(op.action)),
                ("kind", op.kind),
                ("outcome", outcome_name(op.outcome)),
            ];
            self.ops.get_or_create(&l).inc();
            self.op_seconds
                .get_or_create(&l)
                .observe(op.took.as_secs_f64());
        }
        let (claims, volumes) = r.seen;
        for (res, n) in [
            ("persistentvolumeclaims", claims),
            ("persistentvolumes", volumes),
        ] {
            self.cached
                .get_or_create(&[("resource", res)])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        self.last_pass
            .set(i64::try_from(now.as_secs()).unwrap_or(i64::MAX));
    }

    /// Sets a lane's queue gauges: keys queued, retries so far, breakers open.
    pub fn set_queue(&self, lane: &'static str, depth: usize, retries: u64, breakers: usize) {
        let l = [("lane", lane)];
        let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.queue_depth.get_or_create(&l).set(g(depth));
        self.retries
            .get_or_create(&l)
            .set(i64::try_from(retries).unwrap_or(i64::MAX));
        self.breakers_open.get_or_create(&l).set(g(breakers));
    }

    /// Sets the capacity gauges to `pools` (kind, pool, size if known, free), forgetting pools no
    /// longer listed (a root removed from the config).
    pub fn set_capacity(&self, pools: &[Pool]) {
        self.size.clear();
        self.free.clear();
        for p in pools {
            let l = [("kind", p.kind.to_owned()), ("pool", p.pool.clone())];
            if let Some(s) = p.size {
                self.size.get_or_create(&l).set(gauge_bytes(s));
            }
            self.free.get_or_create(&l).set(gauge_bytes(p.free));
        }
    }

    /// The registry as OpenMetrics text.
    pub fn encode(&self) -> Result<String, String> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .map_err(|e| format!("cannot encode the metrics: {e}"))?;
        Ok(out)
    }
}

/// The space of one place volumes are made in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// `hostpath` or `lvm`.
    pub kind: &'static str,
    /// The root's path, or the VG's name.
    pub pool: String,
    /// Total bytes, where known (a root's filesystem; `vgs` is not asked for a VG's size).
    pub size: Option<u64>,
    /// Bytes free for new volumes.
    pub free: u64,
}

/// This node's pools: its hostPath roots (statvfs) and the VGs its config allows (one `lvm vgs`
/// each, under the config's verb timeout); with what could not be read.
pub fn capacity(cfg: &Config, node: &str, lvm_driver: &str) -> (Vec<Pool>, Vec<String>) {
    let (mut pools, mut failed) = (Vec::new(), Vec::new());
    for root in cfg.local_path.node_roots(node) {
        match nix::sys::statvfs::statvfs(&root) {
            Ok(st) => {
                let frag = st.fragment_size();
                pools.push(Pool {
                    kind: "hostpath",
                    pool: root.display().to_string(),
                    size: Some(st.blocks().saturating_mul(frag)),
                    free: st.blocks_available().saturating_mul(frag),
                });
            }
            Err(e) => failed.push(format!("capacity of hostPath root {}: {e}", root.display())),
        }
    }
    for vg in &cfg.lvm.allowed_volume_groups {
        use crate::backend::lvm::lvs::{LvService, LvmCommands};
        let deadline = crate::sys::process::Deadline::after(cfg.verb_timeout());
        match crate::backend::on_node(cfg, deadline, lvm_driver, |ctx| LvmCommands.vg(ctx, vg)) {
            Ok(row) => pools.push(Pool {
                kind: "lvm",
                pool: vg.clone(),
                size: None,
                free: row.vg_free,
            }),
            Err(e) => failed.push(format!("capacity of volume group {vg}: {e}")),
        }
    }
    (pools, failed)
}

/// Liveness and readiness, from the loop's heartbeats (milliseconds since `start`, atomics: the
/// loop never waits for a probe).
#[derive(Debug)]
pub struct Health {
    start: Instant,
    /// The loop's last sign of life (a pass ended or the loop waited for a config).
    beat: AtomicU64,
    /// The end of the last pass (`NEVER` before the first).
    pass: AtomicU64,
    synced: AtomicBool,
    resync: Duration,
}

const NEVER: u64 = u64::MAX;

impl Health {
    /// Health of a loop that passes at least every `resync`; alive as of `start`.
    pub fn new(start: Instant, resync: Duration) -> Self {
        Self {
            start,
            beat: AtomicU64::new(0),
            pass: AtomicU64::new(NEVER),
            synced: AtomicBool::new(false),
            resync,
        }
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.start).as_millis()).unwrap_or(NEVER - 1)
    }

    /// How long the loop may go without a sign of life: 10 resyncs, at least 5 minutes (a pass
    /// waits out API deadlines and slow volume work; a restart would not make it quicker).
    pub fn live_window(&self) -> Duration {
        (self.resync * 10).max(Duration::from_secs(300))
    }

    /// How old the last pass may be for the instance to be ready: 3 resyncs, at least a minute.
    pub fn ready_window(&self) -> Duration {
        (self.resync * 3).max(Duration::from_secs(60))
    }

    /// The loop is alive at `at` (waiting for a config, or between passes).
    pub fn beat(&self, at: Instant) {
        self.beat.store(self.ms(at), Ordering::Relaxed);
    }

    /// A pass ended at `at`.
    pub fn passed(&self, at: Instant) {
        let ms = self.ms(at);
        self.pass.store(ms, Ordering::Relaxed);
        self.beat.store(ms, Ordering::Relaxed);
    }

    /// Both watch caches hold a first full list.
    pub fn synced(&self) {
        self.synced.store(true, Ordering::Relaxed);
    }

    /// Whether the caches have listed (the loop asks only until they have).
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    fn age(&self, ms: u64, at: Instant) -> Option<Duration> {
        (ms != NEVER).then(|| Duration::from_millis(self.ms(at).saturating_sub(ms)))
    }

    /// `/healthz` at `at`: `Err` says why not.
    pub fn live(&self, at: Instant) -> Result<(), String> {
        let age = self
            .age(self.beat.load(Ordering::Relaxed), at)
            .unwrap_or_default();
        if age > self.live_window() {
            return Err(format!(
                "no pass has ended for {}s (limit {}s): the reconcile loop is stuck",
                age.as_secs(),
                self.live_window().as_secs()
            ));
        }
        Ok(())
    }

    /// `/readyz` at `at`: `Err` says why not.
    pub fn ready(&self, at: Instant) -> Result<(), String> {
        if !self.is_synced() {
            return Err("the watches of claims and PVs have not listed yet".into());
        }
        match self.age(self.pass.load(Ordering::Relaxed), at) {
            None => Err("no pass has ended yet".into()),
            Some(a) if a > self.ready_window() => Err(format!(
                "the last pass ended {}s ago (limit {}s)",
                a.as_secs(),
                self.ready_window().as_secs()
            )),
            Some(_) => Ok(()),
        }
    }
}

/// What the HTTP server reads.
#[derive(Debug)]
pub struct Shared {
    /// The metrics.
    pub metrics: Metrics,
    /// The health.
    pub health: Health,
}

/// The answer to `GET path`: status and body.
pub fn answer(shared: &Shared, path: &str, at: Instant) -> (u16, String) {
    let probe = |r: Result<(), String>| match r {
        Ok(()) => (200, "ok\n".to_owned()),
        Err(e) => (503, format!("{e}\n")),
    };
    match path {
        "/metrics" => match shared.metrics.encode() {
            Ok(s) => (200, s),
            Err(e) => (500, format!("{e}\n")),
        },
        "/healthz" | "/livez" => probe(shared.health.live(at)),
        "/readyz" => probe(shared.health.ready(at)),
        _ => (404, "not found: /metrics, /healthz, /readyz\n".to_owned()),
    }
}

/// Binds `addr` now (so a port in use is an error at start) and serves `/metrics`, `/healthz` and
/// `/readyz` on a thread of its own until the process ends. Connections must send their request
/// head within 5 s; no keep-alive, so a connection lives for one request. Returns the address
/// bound (port 0: the one the kernel chose).
pub fn serve(addr: SocketAddr, shared: Arc<Shared>) -> Result<SocketAddr, String> {
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| {
            format!(
                "cannot listen on {addr} for /metrics, /healthz and /readyz: {e}; give a free port with --metrics-address (and the probes' port in the DaemonSet)"
            )
        })?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
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
            if let Err(e) = rt.block_on(http(listener, shared)) {
                tracing::error!(target: LOG_TARGET, "the metrics server stopped: {e}; no /metrics, /healthz or /readyz");
            }
        })
        .map_err(|e| format!("cannot start the metrics server's thread: {e}"))?;
    Ok(bound)
}

async fn http(listener: std::net::TcpListener, shared: Arc<Shared>) -> Result<(), String> {
    use hyper::service::{make_service_fn, service_fn};
    use hyper::{Body, Method, Response, StatusCode, header};
    let incoming = hyper::server::conn::AddrIncoming::from_listener(
        tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let make = make_service_fn(move |_| {
        let shared = shared.clone();
        async move {
            Ok::<_, std::convert::Infallible>(service_fn(move |req: hyper::Request<Body>| {
                let shared = shared.clone();
                async move {
                    let (status, body) = if req.method() == Method::GET {
                        answer(&shared, req.uri().path(), Instant::now())
                    } else {
                        (405, "GET only\n".to_owned())
                    };
                    let ctype = if status == 200 && req.uri().path() == "/metrics" {
                        "application/openmetrics-text; version=1.0.0; charset=utf-8"
                    } else {
                        "text/plain; charset=utf-8"
                    };
                    let mut resp = Response::new(Body::from(body));
                    *resp.status_mut() =
                        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                    resp.headers_mut().insert(
                        header::CONTENT_TYPE,
                        header::HeaderValue::from_static(ctype),
                    );
                    Ok::<_, std::convert::Infallible>(resp)
                }
            }))
        }
    });
    hyper::Server::builder(incoming)
        .http1_keepalive(false)
        .http1_header_read_timeout(Duration::from_secs(5))
        .serve(make)
        .await
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
