//! What an operator sees of `flexvol controller` besides its log: its metrics and probes, served
//! by the provisioner's HTTP server ([`crate::k8s::http::serve`], the one serving path
//! of the daemons, with its connection bounds) on `--metrics-address`.
//!
//! - **Metrics** ([`Metrics`]): per loop (`node-loss`, `capacity`), passes, errors, actions taken
//!   and the time of the last successful pass; `flexvol_build_info`. Every series is present from
//!   start, at zero.
//! - **Health** ([`Health`]), per loop, as the provisioner's lanes: `/healthz` answers 200 while
//!   every running loop has ended a pass (whatever its outcome) within [`Health::live_window`],
//!   else 503 naming the loop and since when (an API call that never returns is bounded by
//!   [`crate::k8s::call::DEADLINE`], so a stuck loop is a bug, and a restart its cure);
//!   `/readyz` answers 200 once the API client is connected and every running loop's last pass
//!   listed what it reads.

use crate::k8s::http::{Endpoints, Unhealthy};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// The controller's loops (`loop` label values), in [`Health`]'s slot order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loop {
    /// Node loss ([`super::nodeloss`]).
    NodeLoss,
    /// The capacity objects ([`super::capacity`]; only with `--capacity-objects`).
    Capacity,
}

impl Loop {
    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Loop::NodeLoss => "node-loss",
            Loop::Capacity => "capacity",
        }
    }

    fn index(self) -> usize {
        match self {
            Loop::NodeLoss => 0,
            Loop::Capacity => 1,
        }
    }
}

const LOOPS: [Loop; 2] = [Loop::NodeLoss, Loop::Capacity];

/// The actions (`action` label values) of each loop.
pub(crate) const ACTIONS: [(Loop, &str); 4] = [
    (Loop::NodeLoss, "claim-deleted"),
    (Loop::NodeLoss, "pv-deleted"),
    (Loop::Capacity, "object-created"),
    (Loop::Capacity, "object-deleted"),
];

type LoopLabels = [(&'static str, &'static str); 1];
type ActionLabels = [(&'static str, &'static str); 2];

/// The controller's metrics.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    passes: Family<LoopLabels, Counter>,
    errors: Family<LoopLabels, Counter>,
    actions: Family<ActionLabels, Counter>,
    last_success: Family<LoopLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric and series, at zero.
    pub(crate) fn new() -> Self {
        // The process's registry (the build info is in it); this daemon's families below.
        let mut r = crate::k8s::daemon::registry();
        let m = Self {
            registry: Registry::default(),
            passes: Family::default(),
            errors: Family::default(),
            actions: Family::default(),
            last_success: Family::default(),
        };
        for l in LOOPS {
            let k = [("loop", l.name())];
            drop(m.passes.get_or_create(&k));
            drop(m.errors.get_or_create(&k));
            drop(m.last_success.get_or_create(&k));
        }
        for (l, a) in ACTIONS {
            drop(
                m.actions
                    .get_or_create(&[("loop", l.name()), ("action", a)]),
            );
        }
        r.register(
            "flexvol_controller_passes",
            "Passes of the controller's loops (node-loss; capacity with --capacity-objects), whatever their outcome",
            m.passes.clone(),
        );
        r.register(
            "flexvol_controller_errors",
            "Failures of the controller's passes, by loop: a list that failed (the pass decided nothing) or one object's work (retried after a backoff)",
            m.errors.clone(),
        );
        r.register(
            "flexvol_controller_actions",
            "What the loops did, by loop and action: claims and PVs of lost nodes deleted, capacity objects created and deleted",
            m.actions.clone(),
        );
        r.register(
            "flexvol_controller_last_success_timestamp_seconds",
            "Unix time a loop's last pass without error ended (0: none yet)",
            m.last_success.clone(),
        );
        Self { registry: r, ..m }
    }

    /// Counts a pass of `l` that did `actions` (action, how many) and failed `errors` times.
    pub(crate) fn record(&self, l: Loop, actions: &[(&'static str, u64)], errors: u64) {
        let k = [("loop", l.name())];
        self.passes.get_or_create(&k).inc();
        self.errors.get_or_create(&k).inc_by(errors);
        for (a, n) in actions {
            self.actions
                .get_or_create(&[("loop", l.name()), ("action", a)])
                .inc_by(*n);
        }
        if errors == 0 {
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            self.last_success
                .get_or_create(&k)
                .set(i64::try_from(now.as_secs()).unwrap_or(i64::MAX));
        }
    }

    /// The registry as OpenMetrics text.
    pub(crate) fn encode(&self) -> Result<String, crate::k8s::http::EncodeError> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

const NEVER: u64 = u64::MAX;

/// Liveness and readiness per loop, from the end of each loop's passes (milliseconds since
/// `start`, atomics: a probe never waits for a loop).
#[derive(Debug)]
pub(crate) struct Health {
    start: Instant,
    resync: Duration,
    /// Which loops run (capacity only with `--capacity-objects`).
    running: [bool; 2],
    /// The end of each loop's last pass (`NEVER` before the first).
    pass: [AtomicU64; 2],
    /// Whether each loop's last pass listed what it reads.
    listed: [AtomicBool; 2],
    connected: AtomicBool,
}

impl Health {
    /// Health of loops that pass at least every `resync`, alive as of `start`; `capacity`: whether
    /// the capacity loop runs.
    pub(crate) fn new(start: Instant, resync: Duration, capacity: bool) -> Self {
        Self {
            start,
            resync,
            running: [true, capacity],
            pass: [AtomicU64::new(NEVER), AtomicU64::new(NEVER)],
            listed: [AtomicBool::new(false), AtomicBool::new(false)],
            connected: AtomicBool::new(false),
        }
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.start).as_millis()).unwrap_or(NEVER - 1)
    }

    /// How long a loop may go without ending a pass before it is stuck: 10 resyncs, at least 5
    /// minutes (a pass makes a few API calls per PV, each bounded by the client's deadline).
    pub(crate) fn live_window(&self) -> Duration {
        (self.resync * 10).max(Duration::from_secs(300))
    }

    /// The API client is made (the process has its credentials and the server's address).
    pub(crate) fn connected(&self) {
        self.connected.store(true, Ordering::Relaxed);
    }

    /// A pass of `l` ended at `at`; `listed`: it read what it decides from.
    pub(crate) fn passed(&self, l: Loop, at: Instant, listed: bool) {
        self.pass[l.index()].store(self.ms(at), Ordering::Relaxed);
        self.listed[l.index()].store(listed, Ordering::Relaxed);
    }

    /// `/healthz` at `at`: `Err` names the loops without a pass for too long.
    pub(crate) fn live(&self, at: Instant) -> Result<(), Unhealthy> {
        let window = self.live_window();
        let stuck: Vec<String> = LOOPS
            .iter()
            .filter(|l| self.running[l.index()])
            .filter_map(|l| {
                let ms = self.pass[l.index()].load(Ordering::Relaxed);
                // Before its first pass, a loop counts from the start.
                let since = if ms == NEVER { 0 } else { ms };
                let age = Duration::from_millis(self.ms(at).saturating_sub(since));
                (age > window).then(|| {
                    format!(
                        "loop {}: no pass ended for {}s (limit {}s): stuck",
                        l.name(),
                        age.as_secs(),
                        window.as_secs()
                    )
                })
            })
            .collect();
        if stuck.is_empty() {
            Ok(())
        } else {
            Err(Unhealthy::Stuck(stuck.join("\n")))
        }
    }

    /// `/readyz` at `at`: live, connected, and every running loop's last pass listed.
    pub(crate) fn ready(&self, at: Instant) -> Result<(), Unhealthy> {
        self.live(at)?;
        if !self.connected.load(Ordering::Relaxed) {
            return Err(Unhealthy::NotReady("no API client yet".into()));
        }
        let not: Vec<String> = LOOPS
            .iter()
            .filter(|l| self.running[l.index()])
            .filter_map(|l| {
                let i = l.index();
                if self.pass[i].load(Ordering::Relaxed) == NEVER {
                    Some(format!("loop {}: no pass has ended yet", l.name()))
                } else if !self.listed[i].load(Ordering::Relaxed) {
                    Some(format!(
                        "loop {}: its last pass could not list what it reads (see the log)",
                        l.name()
                    ))
                } else {
                    None
                }
            })
            .collect();
        if not.is_empty() {
            Ok(())
        } else {
            Err(Unhealthy::NotReady(not.join("\n")))
        }
    }
}

/// What the controller's HTTP server reads.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The metrics.
    pub(crate) metrics: Metrics,
    /// The health.
    pub(crate) health: Health,
}

impl Endpoints for Shared {
    fn metrics(&self) -> Result<String, crate::k8s::http::EncodeError> {
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
mod tests {
    use super::*;
    use crate::k8s::http::answer;

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map(|v| v.parse().unwrap())
    }

    /// Every series is there from start at zero; a pass counts its actions and errors, and only
    /// one without errors moves the last-success stamp.
    #[test]
    fn passes_actions_and_errors_are_counted_per_loop() {
        let m = Metrics::new();
        let t = m.encode().unwrap();
        for s in [
            r#"flexvol_controller_passes_total{loop="node-loss"}"#,
            r#"flexvol_controller_passes_total{loop="capacity"}"#,
            r#"flexvol_controller_errors_total{loop="capacity"}"#,
            r#"flexvol_controller_actions_total{loop="node-loss",action="claim-deleted"}"#,
            r#"flexvol_controller_actions_total{loop="capacity",action="object-created"}"#,
            r#"flexvol_controller_last_success_timestamp_seconds{loop="node-loss"}"#,
        ] {
            assert_eq!(sample(&t, s), Some(0.0), "{s} in\n{t}");
        }
        assert!(t.contains("flexvol_build_info{"), "{t}");
        m.record(
            Loop::NodeLoss,
            &[("claim-deleted", 2), ("pv-deleted", 1)],
            1,
        );
        let t = m.encode().unwrap();
        assert_eq!(
            sample(
                &t,
                r#"flexvol_controller_actions_total{loop="node-loss",action="claim-deleted"}"#
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(&t, r#"flexvol_controller_errors_total{loop="node-loss"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &t,
                r#"flexvol_controller_last_success_timestamp_seconds{loop="node-loss"}"#
            ),
            Some(0.0),
            "a pass with an error is no success"
        );
        m.record(Loop::NodeLoss, &[], 0);
        let t = m.encode().unwrap();
        assert!(
            sample(
                &t,
                r#"flexvol_controller_last_success_timestamp_seconds{loop="node-loss"}"#
            )
            .unwrap()
                > 1.7e9
        );
        assert_eq!(
            sample(&t, r#"flexvol_controller_passes_total{loop="node-loss"}"#),
            Some(2.0)
        );
    }

    /// Not ready before the client and the first listed pass of every running loop; not live when
    /// a running loop ends no pass within the window (a loop that does not run never counts).
    #[test]
    fn probes_follow_the_loops() {
        let t0 = Instant::now();
        let s = Shared {
            metrics: Metrics::new(),
            health: Health::new(t0, Duration::from_secs(15), false),
        };
        let w = s.health.live_window();
        assert_eq!(w, Duration::from_secs(300));
        assert_eq!(answer(&s, "/healthz", t0).0, 200);
        let (code, body) = answer(&s, "/readyz", t0);
        assert_eq!(code, 503);
        assert!(body.contains("no API client"), "{body}");
        s.health.connected();
        let (code, body) = answer(&s, "/readyz", t0);
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("loop node-loss: no pass"), "{body}");
        s.health.passed(Loop::NodeLoss, t0, false);
        assert!(answer(&s, "/readyz", t0).1.contains("could not list"));
        s.health.passed(Loop::NodeLoss, t0, true);
        assert_eq!(answer(&s, "/readyz", t0), (200, "ok\n".into()));
        let late = t0 + w + Duration::from_secs(1);
        let (code, body) = answer(&s, "/healthz", late);
        assert_eq!(code, 503);
        assert!(
            body.contains("loop node-loss: no pass ended for 301s"),
            "{body}"
        );
        assert_eq!(answer(&s, "/readyz", late).0, 503);
        s.health.passed(Loop::NodeLoss, late, true);
        assert_eq!(answer(&s, "/healthz", late).0, 200);
        // With the capacity loop running, it is waited for too.
        let s = Shared {
            metrics: Metrics::new(),
            health: Health::new(t0, Duration::from_secs(15), true),
        };
        s.health.connected();
        s.health.passed(Loop::NodeLoss, t0, true);
        assert!(answer(&s, "/readyz", t0).1.contains("loop capacity"));
        s.health.passed(Loop::Capacity, t0, true);
        assert_eq!(answer(&s, "/readyz", t0).0, 200);
        assert!(
            answer(&s, "/healthz", late)
                .1
                .contains("loop capacity: no pass ended")
        );
    }
}
