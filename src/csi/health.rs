//! Whether the plugin's work is moving: every piece of blocking work (a CSI call's backend step,
//! a pass of the ephemeral volumes' sweep) is registered while it runs, with the time by which
//! it should have ended; one still running well past it is stuck (a syscall that never returns:
//! a hung NFS server, a disk that stopped answering). Probe then answers FAILED_PRECONDITION and
//! `/healthz` 503 (when `--metrics-address` is given), naming what is stuck, so that kubelet's
//! liveness probe restarts the plugin instead of it answering calls that queue behind a dead
//! thread for ever.
//!
//! **Contract**: [`start`] is called by whoever runs blocking work, before it starts; the
//! returned [`Running`] must live exactly as long as the work (moved into its thread), since its
//! drop is what says the work ended. A call's deadline bounds each of its steps, so the work
//! past [`STUCK_AFTER`] times its deadline is not slow: it cannot end.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Work running longer than this many times its deadline is stuck.
pub(crate) const STUCK_AFTER: u32 = 2;

/// One piece of running work: what it is, and when it is stuck.
struct Entry {
    id: u64,
    what: String,
    started: Instant,
    stuck_at: Instant,
}

/// The plugin's running work.
pub(crate) struct Work {
    running: Mutex<Vec<Entry>>,
    next: AtomicU64,
}

/// The work of this process.
pub(crate) static WORK: Work = Work::new();

impl Work {
    const fn new() -> Self {
        Work {
            running: Mutex::new(Vec::new()),
            next: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        // A panic while holding it leaves a list that is still whole.
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers `what`, which has `deadline` to end; running until the returned value drops.
    pub(crate) fn start(&'static self, what: String, deadline: Duration) -> Running {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let stuck_at = started + deadline.saturating_mul(STUCK_AFTER);
        self.lock().push(Entry {
            id,
            what,
            started,
            stuck_at,
        });
        Running { work: self, id }
    }

    /// What is stuck at `now`, each with how long it has run; empty when all is well.
    pub(crate) fn stuck(&self, now: Instant) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|e| now >= e.stuck_at)
            .map(|e| {
                format!(
                    "{} has run for {} s",
                    e.what,
                    now.saturating_duration_since(e.started).as_secs()
                )
            })
            .collect()
    }

    /// How much work runs now.
    pub(crate) fn running(&self) -> usize {
        self.lock().len()
    }
}

/// Running work ([`Work::start`]): dropping it says the work ended.
pub(crate) struct Running {
    work: &'static Work,
    id: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.work.lock().retain(|e| e.id != self.id);
    }
}

/// [`WORK`]'s judgement for a probe: `Err` names what is stuck.
pub(crate) fn check(now: Instant) -> Result<(), String> {
    let stuck = WORK.stuck(now);
    if stuck.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "stuck: {}; restart the plugin (kubelet's liveness probe does) and look at the node's storage",
            stuck.join("; ")
        ))
    }
}

/// `/metrics`, `/healthz` and `/readyz` of `flexvol csi --metrics-address`: live and ready
/// while nothing is stuck; the metrics are the build and the running and stuck work, read at
/// each scrape (docs/metrics.md).
pub(crate) struct Endpoints {
    registry: prometheus_client::registry::Registry,
    running: prometheus_client::metrics::gauge::Gauge,
    stuck: prometheus_client::metrics::gauge::Gauge,
}

impl Endpoints {
    /// The registry: the daemons' build info and this module's two gauges.
    pub(crate) fn new() -> Self {
        let mut registry = crate::k8s::daemon::registry();
        let running = prometheus_client::metrics::gauge::Gauge::default();
        let stuck = prometheus_client::metrics::gauge::Gauge::default();
        registry.register(
            "flexvol_csi_running_work",
            "Blocking work (CSI calls' backend steps, sweep passes) running now",
            running.clone(),
        );
        registry.register(
            "flexvol_csi_stuck_work",
            "Work running past twice its deadline: while above 0, /healthz and Probe fail",
            stuck.clone(),
        );
        Endpoints {
            registry,
            running,
            stuck,
        }
    }
}

impl crate::k8s::http::Endpoints for Endpoints {
    fn metrics(&self) -> Result<String, crate::k8s::http::EncodeError> {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.running.set(count(WORK.running()));
        self.stuck.set(count(WORK.stuck(Instant::now()).len()));
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &self.registry)?;
        Ok(s)
    }

    fn live(&self, at: Instant) -> Result<(), crate::k8s::http::Unhealthy> {
        check(at).map_err(crate::k8s::http::Unhealthy::Stuck)
    }

    fn ready(&self, at: Instant) -> Result<(), crate::k8s::http::Unhealthy> {
        self.live(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_stuck_past_twice_its_deadline_and_gone_when_it_ends() {
        static W: Work = Work::new();
        let t0 = Instant::now();
        let a = W.start("NodePublishVolume of v".into(), Duration::from_secs(10));
        let b = W.start("a sweep pass".into(), Duration::from_secs(100));
        assert_eq!(W.running(), 2);
        assert!(W.stuck(t0 + Duration::from_secs(19)).is_empty());
        let s = W.stuck(t0 + Duration::from_secs(25));
        assert_eq!(s.len(), 1, "{s:?}");
        assert!(
            s[0].starts_with("NodePublishVolume of v has run for 2"),
            "{s:?}"
        );
        drop(a);
        assert!(W.stuck(t0 + Duration::from_secs(25)).is_empty());
        assert_eq!(W.stuck(t0 + Duration::from_secs(300)).len(), 1);
        drop(b);
        assert_eq!(W.running(), 0);
    }
}
