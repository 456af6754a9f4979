//! Whether the plugin's work is moving: every piece of blocking work (a CSI call's backend step,
//! a pass of the ephemeral volumes' sweep) is registered while its thread runs, with a heartbeat
//! (`sys::progress`) that the long steps beat as they go (each entry of a tree walk, each tool
//! that ends). Work that has gone [`STUCK_AFTER`] times its deadline without a beat is stuck (a
//! syscall that never returns: a hung NFS server, a disk that stopped answering); a walk of a
//! tenant's millions of files is slow, never stuck. Probe then answers FAILED_PRECONDITION and
//! `/healthz` 503 (when `--metrics-address` is given), naming what is stuck, so that kubelet's
//! liveness probe restarts the plugin instead of it answering calls that queue behind a dead
//! thread for ever.
//!
//! **Contract**: [`Work::start`] is called by whoever runs blocking work, before it starts; the
//! returned [`Running`] must live exactly as long as the work, and be [`Running::attach`]ed on
//! the thread that runs it, since its drop is what says the work ended and the thread's beats
//! are what say it moves.

use crate::sys::progress;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Work that has gone this many times its deadline without a beat is stuck.
pub(crate) const STUCK_AFTER: u32 = 2;

/// One piece of running work: what it is, its heartbeat, and how long it may go without one.
struct Entry {
    id: u64,
    what: String,
    started: Instant,
    heart: Arc<AtomicU64>,
    patience_ms: u64,
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
        let heart = progress::heart();
        let patience_ms =
            u64::try_from(deadline.saturating_mul(STUCK_AFTER).as_millis()).unwrap_or(u64::MAX);
        self.lock().push(Entry {
            id,
            what,
            started: Instant::now(),
            heart: heart.clone(),
            patience_ms,
        });
        Running {
            work: self,
            id,
            heart,
        }
    }

    /// What is stuck at `now_ms` ([`progress::now_ms`]), each with how long it has gone without
    /// progress; empty when all is well.
    pub(crate) fn stuck(&self, now_ms: u64) -> Vec<String> {
        self.lock()
            .iter()
            .filter_map(|e| {
                let quiet = now_ms.saturating_sub(e.heart.load(Ordering::Relaxed));
                (quiet >= e.patience_ms).then(|| {
                    format!(
                        "{} has made no progress for {} s (running for {} s)",
                        e.what,
                        quiet / 1000,
                        e.started.elapsed().as_secs()
                    )
                })
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
    heart: Arc<AtomicU64>,
}

impl Running {
    /// The calling thread's beats (`sys::progress::beat`) are this work's, until the guard drops.
    pub(crate) fn attach(&self) -> progress::Attached {
        progress::attach(self.heart.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.work.lock().retain(|e| e.id != self.id);
    }
}

/// What [`check`] found stuck, said for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stuck: {}; restart the plugin (kubelet's liveness probe does) and look at the node's storage", .0.join("; "))]
pub(crate) struct Stuck(pub(crate) Vec<String>);

/// [`WORK`]'s judgement for a probe.
pub(crate) fn check() -> Result<(), Stuck> {
    let stuck = WORK.stuck(progress::now_ms());
    if stuck.is_empty() {
        Ok(())
    } else {
        Err(Stuck(stuck))
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
        self.stuck.set(count(WORK.stuck(progress::now_ms()).len()));
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &self.registry)?;
        Ok(s)
    }

    fn live(&self, _at: Instant) -> Result<(), crate::k8s::http::Unhealthy> {
        check().map_err(|s| crate::k8s::http::Unhealthy::Stuck(s.to_string()))
    }

    fn ready(&self, at: Instant) -> Result<(), crate::k8s::http::Unhealthy> {
        self.live(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_stuck_after_twice_its_deadline_without_progress_and_gone_when_it_ends() {
        static W: Work = Work::new();
        let t0 = progress::now_ms();
        let a = W.start("NodePublishVolume of v".into(), Duration::from_secs(10));
        let b = W.start("a sweep pass".into(), Duration::from_secs(100));
        assert_eq!(W.running(), 2);
        assert!(W.stuck(t0 + 19_000).is_empty());
        let s = W.stuck(t0 + 25_000);
        assert_eq!(s.len(), 1, "{s:?}");
        assert!(
            s[0].starts_with("NodePublishVolume of v has made no progress for 2"),
            "{s:?}"
        );
        // A beat on its thread (a walk's entry, a tool that ended) is progress: not stuck then.
        std::thread::scope(|sc| {
            sc.spawn(|| {
                let _on = a.attach();
                std::thread::sleep(Duration::from_millis(5));
                progress::beat();
            });
        });
        let beaten = a.heart.load(Ordering::Relaxed);
        assert!(
            W.stuck(beaten + 19_000)
                .iter()
                .all(|l| !l.starts_with("NodePublish"))
        );
        drop(a);
        assert_eq!(W.stuck(t0 + 300_000).len(), 1);
        drop(b);
        assert_eq!(W.running(), 0);
    }
}
