//! What an operator sees of `flexvol provisioner`: levelled logs, Prometheus metrics, and the
//! health endpoints kubelet probes.
//!
//! - **Logs** ([`init_logs`]): `tracing` events with the target [`LOG_TARGET`], on stderr, as text
//!   (`<RFC 3339 time> <LEVEL> flexvol-provisioner: <message>`, the default) or JSON lines
//!   (`--log-format json`), filtered by `--log-filter` or `RUST_LOG` (`info`,
//!   `flexvol-provisioner=debug,kube=info`: tracing-subscriber's `Targets` syntax; the default
//!   shows this provisioner's `info` and nothing of the libraries, whose errors it logs itself:
//!   kube-client's own line for each failed request would only double them). Set up only by
//!   [`crate::provision::run`]: the driver verbs never reach this module.
//! - **Metrics** ([`Metrics`]): the names in drivers/deploy/README.md ("7. Metrics, health and logs"), kept in a
//!   `prometheus-client` registry, served as OpenMetrics text (which Prometheus reads).
//! - **Health** ([`Health`]), per lane: `/healthz` answers 200 while every lane makes progress (a
//!   pass or one object's work ended, or it waited for its config or client, within
//!   [`Health::live_window`]), else 503 naming the stuck lane and since when; `/readyz` answers
//!   200 once the watch caches have listed, no lane is stuck and each lane's last pass ended
//!   within [`Health::ready_window`].
//!
//! The server holds at most [`LIMITS`] connections (per peer address and in all; each for a
//! bounded time): anything in the pod network can connect to it.
//!
//! The HTTP server ([`serve`]) runs on a thread of its own with its own single-threaded runtime:
//! a pass does blocking work (mounts, `lvm` commands, NFS servers that may not answer), which on
//! the loop's runtime would stall a scrape and fail a probe; and a slow scraper never touches the
//! loop, which only updates atomics and the registry's short-held locks.

use crate::k8s::http::Unhealthy;
use crate::k8s::queue::Lane;
use crate::provision::reconcile::{Action, Outcome, Report};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// The target of the provisioner's log events (what text lines show before the message).
pub(crate) const LOG_TARGET: &str = "flexvol-provisioner";

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

/// The watches (`watch` label values of `flexvol_provisioner_watch_events_total`), as
/// [`crate::provision::cache`] names them.
pub(crate) const WATCHES: [&str; 6] = [
    "claims-node",
    "claims-all",
    "claims-shared",
    "pvs-node",
    "pvs-shared",
    "classes",
];

/// The kinds the provisioners of this binary make (`kind` label values), as
/// [`crate::provision::provisioners`] lists them.
pub(crate) const KINDS: [&str; 3] = ["hostpath", "lvm", "nfs"];

/// `flexvol_driver_calls_total{driver,verb,outcome}` and
/// `flexvol_driver_call_duration_seconds{driver,verb}`: the driver's calls on this node, as its
/// call log says (the driver is exec'd per call and serves nothing itself; [`crate::provision::calltail`]
/// reads the log). Every driver × verb × outcome is present from start, at zero.
#[derive(Debug, Clone)]
pub(crate) struct DriverCalls {
    calls: Family<[(&'static str, &'static str); 3], Counter>,
    seconds: Family<[(&'static str, &'static str); 2], Histogram>,
    unreadable: Counter,
}

/// The drivers (`driver` label values): the backends' names.
pub(crate) const DRIVERS: [&str; 3] = ["hostpath", "nfs", "lvm"];
/// The verbs (`verb` label values): kubelet's FlexVolume verbs; anything else is `other`.
pub(crate) const VERBS: [&str; 13] = [
    "init",
    "getvolumename",
    "attach",
    "isattached",
    "detach",
    "waitforattach",
    "mountdevice",
    "unmountdevice",
    "mount",
    "unmount",
    "expandvolume",
    "expandfs",
    "other",
];
/// The outcomes (`outcome` label values): the reply's status (`not_supported`: a verb the driver
/// never supports, which kubelet then stops calling).
pub(crate) const DRIVER_OUTCOMES: [&str; 3] = ["success", "failure", "not_supported"];

impl Default for DriverCalls {
    fn default() -> Self {
        fn hist() -> Histogram {
            // 1 ms .. ~16 min: a bind mount, an NFS mount, an mkfs, a waitforattach to its deadline.
            Histogram::new(exponential_buckets(0.001, 4.0, 11))
        }
        let d = Self {
            calls: Family::default(),
            seconds: Family::new_with_constructor(hist),
            unreadable: Counter::default(),
        };
        for driver in DRIVERS {
            for verb in VERBS {
                for outcome in DRIVER_OUTCOMES {
                    drop(d.calls.get_or_create(&[
                        ("driver", driver),
                        ("verb", verb),
                        ("outcome", outcome),
                    ]));
                }
                drop(
                    d.seconds
                        .get_or_create(&[("driver", driver), ("verb", verb)]),
                );
            }
        }
        d
    }
}

impl DriverCalls {
    /// Registers the three metrics in `r`.
    pub(crate) fn register_into(self, r: &mut Registry) {
        r.register(
            "flexvol_driver_calls",
            "kubelet's calls of the flexvol drivers on this node, by driver, verb and outcome (from the call log)",
            self.calls.clone(),
        );
        r.register(
            "flexvol_driver_call_duration_seconds",
            "Duration of the drivers' calls on this node, by driver and verb (from the call log)",
            self.seconds.clone(),
        );
        r.register(
            "flexvol_driver_call_log_unreadable_lines",
            "Call log lines the provisioner could not read as a call record (not counted above)",
            self.unreadable.clone(),
        );
    }

    /// Counts one call: `driver`, `verb` and the reply's `status` as the log wrote them (values
    /// outside the known sets are `other`, or not counted at all for an unknown driver or status).
    pub(crate) fn observe(&self, driver: &str, verb: &str, status: &str, seconds: f64) {
        let (Some(driver), Some(outcome)) = (
            DRIVERS.into_iter().find(|d| *d == driver),
            match status {
                "Success" => Some("success"),
                "Failure" => Some("failure"),
                "Not supported" => Some("not_supported"),
                _ => None,
            },
        ) else {
            self.unreadable.inc();
            return;
        };
        let verb = VERBS.into_iter().find(|v| *v == verb).unwrap_or("other");
        self.calls
            .get_or_create(&[("driver", driver), ("verb", verb), ("outcome", outcome)])
            .inc();
        self.seconds
            .get_or_create(&[("driver", driver), ("verb", verb)])
            .observe(seconds.max(0.0));
    }

    /// Counts a line that is not a call record.
    pub(crate) fn unreadable(&self) {
        self.unreadable.inc();
    }
}

/// `flexvol_provisioner_watch_events_total{watch=...}`: objects each watch received (the items
/// of a list and every event), shared with the metrics registry.
pub(crate) type WatchEvents = Family<[(&'static str, &'static str); 1], Counter>;

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
    retries: Family<[(&'static str, &'static str); 1], Counter>,
    driver: DriverCalls,
    breakers_open: Family<[(&'static str, &'static str); 1], Gauge>,
    lane_stuck: Family<[(&'static str, &'static str); 1], Gauge>,
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
        // The process's registry (the build info is in it); this daemon's families below.
        let mut r = crate::k8s::daemon::registry();
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
            driver: DriverCalls::default(),
            breakers_open: Family::default(),
            lane_stuck: Family::default(),
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
            "Retries a lane handed out after a failure (per-object exponential backoff), by lane",
            m.retries.clone(),
        );
        r.register(
            "flexvol_provisioner_breakers_open",
            "Servers (fault domains) whose work a lane holds back after a failure, by lane",
            m.breakers_open.clone(),
        );
        r.register(
            "flexvol_provisioner_lane_stuck",
            "1 while a lane has made no progress for longer than its liveness window (/healthz fails naming it), else 0; as of the scrape",
            m.lane_stuck.clone(),
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
            "Objects this instance's watches received (list items and events), by watch: claims-node (claims labelled flexvol/node=<this node>), claims-all (every claim, while holding flexvol-claims), claims-shared and pvs-shared (the shared kinds', while leading them), pvs-node, classes (every StorageClass)",
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
        // Series present from start, at zero: every operation this binary's provisioners can
        // report, and each lane's queue (so `rate()` and absent-alerts work before the first).
        for kind in KINDS {
            for action in [Action::Provision, Action::Delete, Action::Resize] {
                for outcome in [Outcome::Success, Outcome::Failure, Outcome::Rescheduled] {
                    drop(m.ops.get_or_create(&[
                        ("action", action_name(action)),
                        ("kind", kind),
                        ("outcome", outcome_name(outcome)),
                    ]));
                }
            }
        }
        for lane in LANES {
            let l = [("lane", lane.name())];
            drop(m.queue_depth.get_or_create(&l));
            drop(m.retries.get_or_create(&l));
            drop(m.breakers_open.get_or_create(&l));
            drop(m.lane_stuck.get_or_create(&l));
        }
        for outcome in ["success", "failure"] {
            drop(m.claim_labels.get_or_create(&[("outcome", outcome)]));
        }
        for watch in WATCHES {
            drop(m.watch_events.get_or_create(&[("watch", watch)]));
        }
        for res in ["persistentvolumeclaims", "persistentvolumes"] {
            drop(m.cached.get_or_create(&[("resource", res)]));
        }
        m.driver.clone().register_into(&mut r);
        Self { registry: r, ..m }
    }

    /// The driver call counters, fed by the call log's tailer ([`crate::provision::calltail`]).
    pub(crate) fn driver_calls(&self) -> DriverCalls {
        self.driver.clone()
    }

    /// The gauge of the Lease `lease` (1: this instance leads), shared with the registry.
    pub(crate) fn leader(&self, lease: &str) -> Gauge {
        self.leader
            .get_or_create(&[("lease", lease.to_owned())])
            .clone()
    }

    /// The watch event counters, shared with the registry (for the watch caches).
    pub(crate) fn watch_events(&self) -> WatchEvents {
        self.watch_events.clone()
    }

    /// Counts one label write on a claim (`outcome`: success, failure).
    pub(crate) fn claim_labelled(&self, outcome: &'static str) {
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
    pub(crate) fn set_queue(
        &self,
        lane: &'static str,
        depth: usize,
        retries: u64,
        breakers: usize,
    ) {
        let l = [("lane", lane)];
        let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.queue_depth.get_or_create(&l).set(g(depth));
        // The queue counts its retries since start; the counter follows it (never backwards).
        let c = self.retries.get_or_create(&l);
        c.inc_by(retries.saturating_sub(c.get()));
        self.breakers_open.get_or_create(&l).set(g(breakers));
    }

    /// Sets the capacity gauges to `pools` (kind, pool, size if known, free), forgetting pools no
    /// longer listed (a root removed from the config).
    pub(crate) fn set_capacity(&self, pools: &[Pool]) {
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
    pub fn encode(&self) -> Result<String, crate::k8s::http::EncodeError> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }

    /// Sets `flexvol_provisioner_lane_stuck` from `health` at `at`.
    pub(crate) fn set_stuck(&self, health: &Health, at: Instant) {
        for l in LANES {
            self.lane_stuck
                .get_or_create(&[("lane", l.name())])
                .set(i64::from(health.is_stuck(l, at)));
        }
    }
}

/// The space of one place volumes are made in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pool {
    /// `hostpath` or `lvm`.
    pub kind: &'static str,
    /// The root's path, or the VG's name.
    pub(crate) pool: String,
    /// Total bytes, where known (a root's filesystem; `vgs` is not asked for a VG's size).
    pub(crate) size: Option<u64>,
    /// Bytes free for new volumes.
    pub(crate) free: u64,
}

/// Liveness and readiness, per lane ([`crate::provision::lanes`]), from each lane's heartbeats
/// (milliseconds since `start`, atomics: a lane never waits for a probe, and a probe never waits
/// for a lane). A lane blocked in a system call (an NFS server that does not answer, a FIFO)
/// stops beating while the other goes on: `/healthz` and `/readyz` then fail and name it, and
/// `serve` gives up the Leases ([`Health::live`] is what it asks).
#[derive(Debug)]
pub(crate) struct Health {
    start: Instant,
    /// The wall-clock time of `start`, for the messages ("since when").
    wall: SystemTime,
    /// Indexed by [`lane_index`].
    lanes: [LaneBeat; 2],
    synced: AtomicBool,
    resync: Duration,
    /// `--lane-timeout-seconds` (`None`: [`Health::live_window`]'s default).
    stuck_after: Option<Duration>,
}

/// One lane's heartbeats.
#[derive(Debug)]
struct LaneBeat {
    /// The lane's last sign of progress: a pass or one object's work ended, or it waited for its
    /// config or its API client.
    beat: AtomicU64,
    /// The end of its last pass (`NEVER` before the first).
    pass: AtomicU64,
}

impl LaneBeat {
    fn new() -> Self {
        Self {
            beat: AtomicU64::new(0),
            pass: AtomicU64::new(NEVER),
        }
    }
}

const NEVER: u64 = u64::MAX;

/// The lanes, in the order of [`Health`]'s slots.
const LANES: [Lane; 2] = [Lane::Local, Lane::Shared];

fn lane_index(lane: Lane) -> usize {
    match lane {
        Lane::Local => 0,
        Lane::Shared => 1,
    }
}

impl Health {
    /// Health of lanes that pass at least every `resync`; alive as of `start`.
    pub(crate) fn new(start: Instant, resync: Duration) -> Self {
        let wall = SystemTime::now()
            .checked_sub(Instant::now().saturating_duration_since(start))
            .unwrap_or_else(SystemTime::now);
        Self {
            start,
            wall,
            lanes: [LaneBeat::new(), LaneBeat::new()],
            synced: AtomicBool::new(false),
            resync,
            stuck_after: None,
        }
    }

    /// With the liveness window `--lane-timeout-seconds` gave (`None`: the default).
    #[must_use]
    pub(crate) fn stuck_after(mut self, window: Option<Duration>) -> Self {
        self.stuck_after = window;
        self
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.start).as_millis()).unwrap_or(NEVER - 1)
    }

    fn wall_at(&self, ms: u64) -> String {
        let t = self
            .wall
            .checked_add(Duration::from_millis(ms))
            .unwrap_or(self.wall);
        crate::node::calllog::rfc3339(t)
    }

    /// How long a lane may go without a sign of progress before it is stuck:
    /// `--lane-timeout-seconds`, else 10 resyncs, at least 5 minutes (every object's work waits
    /// out its deadlines, and a restart would not make a slow one quicker).
    pub(crate) fn live_window(&self) -> Duration {
        self.stuck_after
            .unwrap_or_else(|| (self.resync * 10).max(Duration::from_secs(300)))
    }

    /// How old a lane's last pass may be for the instance to be ready: 3 resyncs, at least a
    /// minute (never more than the live window).
    pub(crate) fn ready_window(&self) -> Duration {
        (self.resync * 3)
            .max(Duration::from_secs(60))
            .min(self.live_window())
    }

    /// Every lane is alive at `at` (before the lanes start: `serve` waits for its config and its
    /// first lists).
    pub(crate) fn beat(&self, at: Instant) {
        for l in LANES {
            self.beat_lane(l, at);
        }
    }

    /// `lane` made progress at `at` (one object's work ended, or it waited for its config or
    /// client).
    pub(crate) fn beat_lane(&self, lane: Lane, at: Instant) {
        self.lanes[lane_index(lane)]
            .beat
            .store(self.ms(at), Ordering::Relaxed);
    }

    /// A pass of `lane` ended at `at`.
    pub(crate) fn passed(&self, lane: Lane, at: Instant) {
        let ms = self.ms(at);
        let l = &self.lanes[lane_index(lane)];
        l.pass.store(ms, Ordering::Relaxed);
        l.beat.store(ms, Ordering::Relaxed);
    }

    /// Both watch caches hold a first full list.
    pub(crate) fn synced(&self) {
        self.synced.store(true, Ordering::Relaxed);
    }

    /// Whether the caches have listed (the loop asks only until they have).
    pub(crate) fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    fn age(&self, ms: u64, at: Instant) -> Option<Duration> {
        (ms != NEVER).then(|| Duration::from_millis(self.ms(at).saturating_sub(ms)))
    }

    /// The lanes stuck at `at`: each with how long it has gone without progress and since when.
    fn stuck(&self, at: Instant) -> Vec<String> {
        let window = self.live_window();
        LANES
            .iter()
            .filter_map(|l| {
                let ms = self.lanes[lane_index(*l)].beat.load(Ordering::Relaxed);
                let age = self.age(ms, at).unwrap_or_default();
                (age > window).then(|| {
                    format!(
                        "lane {}: no progress for {}s (limit {}s), since {}: stuck (a system call \
                         that does not return, e.g. on an NFS server that does not answer)",
                        l.name(),
                        age.as_secs(),
                        window.as_secs(),
                        self.wall_at(ms)
                    )
                })
            })
            .collect()
    }

    /// Whether `lane` is stuck at `at` (what `/healthz` says of it).
    pub(crate) fn is_stuck(&self, lane: Lane, at: Instant) -> bool {
        let ms = self.lanes[lane_index(lane)].beat.load(Ordering::Relaxed);
        self.age(ms, at).unwrap_or_default() > self.live_window()
    }

    /// What each lane's last pass was at `at`, one line each (with a failed probe's reason).
    fn passes(&self, at: Instant) -> String {
        LANES
            .iter()
            .map(|l| {
                let ms = self.lanes[lane_index(*l)].pass.load(Ordering::Relaxed);
                let name = l.name();
                match self.age(ms, at) {
                    None => format!("lane {name}: no pass has ended yet\n"),
                    Some(a) => format!("lane {name}: last pass ended {}s ago\n", a.as_secs()),
                }
            })
            .collect()
    }

    /// `/healthz` at `at`: `Err` names the stuck lanes, and says how every lane's last pass was.
    pub(crate) fn live(&self, at: Instant) -> Result<(), Unhealthy> {
        let stuck = self.stuck(at);
        if stuck.is_empty() {
            return Ok(());
        }
        Err(Unhealthy::Stuck(
            format!("{}\n{}", stuck.join("\n"), self.passes(at))
                .trim_end()
                .to_owned(),
        ))
    }

    /// `/readyz` at `at`: `Err` says why not (a lane stuck, the caches not listed, a lane
    /// without a recent pass).
    pub(crate) fn ready(&self, at: Instant) -> Result<(), Unhealthy> {
        self.live(at)?;
        if !self.is_synced() {
            return Err(Unhealthy::NotReady(
                "the watches of claims and PVs have not listed yet".into(),
            ));
        }
        let mut late = Vec::new();
        for l in LANES {
            let name = l.name();
            match self.age(self.lanes[lane_index(l)].pass.load(Ordering::Relaxed), at) {
                None => late.push(format!("lane {name}: no pass has ended yet")),
                Some(a) if a > self.ready_window() => late.push(format!(
                    "lane {name}: the last pass ended {}s ago (limit {}s)",
                    a.as_secs(),
                    self.ready_window().as_secs()
                )),
                Some(_) => {}
            }
        }
        if late.is_empty() {
            Ok(())
        } else {
            Err(Unhealthy::NotReady(late.join("\n")))
        }
    }
}

/// What the HTTP server reads.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The metrics.
    pub(crate) metrics: Metrics,
    /// The health.
    pub(crate) health: Health,
}

impl crate::k8s::http::Endpoints for Shared {
    fn metrics(&self) -> Result<String, crate::k8s::http::EncodeError> {
        self.metrics.set_stuck(&self.health, Instant::now());
        self.metrics.encode()
    }
    fn live(&self, at: Instant) -> Result<(), crate::k8s::http::Unhealthy> {
        self.health.live(at)
    }
    fn ready(&self, at: Instant) -> Result<(), crate::k8s::http::Unhealthy> {
        self.health.ready(at)
    }
}

#[cfg(test)]
mod metrics_doc_tests;
#[cfg(test)]
mod tests;
