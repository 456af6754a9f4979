//! This instance's elections: the Leases of the shared work ([`CLAIMS_LEASE`], [`NFS_LEASE`])
//! over [`crate::k8s::lease`], with the gauges of [`super::telemetry::Metrics`] and the fitness
//! of its lanes.

use crate::k8s::lease::{Leader, Part, TIMING, start};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The Lease of the shared claim work (one instance at a time).
pub const CLAIMS_LEASE: &str = "flexvol-claims";
/// The Lease of the NFS work (one instance at a time among those that serve NFS).
pub const NFS_LEASE: &str = "flexvol-nfs";

/// This instance's elections, started by `serve()`.
#[derive(Debug, Clone)]
pub(crate) struct Leadership {
    /// [`CLAIMS_LEASE`]: every instance is eligible.
    pub(crate) claims: Leader,
    /// [`NFS_LEASE`]: instances that serve a shared kind are eligible.
    pub nfs: Leader,
    /// Set when the process stops: no elector is eligible any more (each releases what it holds).
    stop: Arc<watch::Sender<bool>>,
    /// Cleared while a lane is stuck: no elector is eligible (each releases what it holds).
    fit: Arc<AtomicBool>,
}

impl Leadership {
    /// Starts the electors in `namespace` (`None`: the client's default namespace: the pod's in a
    /// cluster, else the kubeconfig context's, else `default`) as `node`, each with its gauge in
    /// `metrics`; for [`NFS_LEASE`] only while `serves_shared` (set by the shared lane) says so.
    pub(crate) fn start(
        client: &kube::Client,
        namespace: Option<&str>,
        node: &str,
        metrics: &crate::provision::telemetry::Metrics,
        serves_shared: Arc<AtomicBool>,
    ) -> Self {
        let ns = namespace.unwrap_or(client.default_namespace()).to_owned();
        let (stop, stopping) = watch::channel(false);
        let fit = Arc::new(AtomicBool::new(true));
        let elect = |name: &str, eligible: Arc<AtomicBool>| {
            start(
                client.clone(),
                ns.clone(),
                name.to_owned(),
                node.to_owned(),
                Part {
                    eligible,
                    fit: fit.clone(),
                    stopping: stopping.clone(),
                },
                TIMING,
                Some(metrics.leader(name)),
            )
        };
        Self {
            claims: elect(CLAIMS_LEASE, Arc::new(AtomicBool::new(true))),
            nfs: elect(NFS_LEASE, serves_shared),
            stop: Arc::new(stop),
            fit,
        }
    }

    /// Whether this instance is fit to lead: `false` while a lane is stuck
    /// ([`crate::provision::telemetry::Health::live`]). Unfit, each elector at its next round (at most
    /// [`RETRY_PERIOD`] later) stops leading and releases a Lease it holds, as when it is no
    /// longer eligible, so that a healthy instance takes the shared work over at its next read
    /// instead of never (a stuck instance that still renews would keep it forever); fit again,
    /// it takes part again.
    pub(crate) fn set_fit(&self, fit: bool) {
        self.fit.store(fit, Ordering::Relaxed);
    }

    /// Stops taking part (the process is stopping): each elector stops leading at once and
    /// releases a Lease it holds (holderIdentity emptied, by an update conditional on the
    /// resourceVersion read, as any write of the elector), so another instance takes over at its
    /// next read instead of after the lease expires. Waits at most `limit` for the releases;
    /// whether every Lease was let go.
    pub(crate) async fn release(&self, limit: Duration) -> bool {
        self.stop.send_replace(true);
        let end = Instant::now() + limit;
        loop {
            if !self.claims.holds() && !self.nfs.holds() {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What this process leads right now ([`Leader::is_leading`] of each).
    pub(crate) fn leads(&self) -> crate::provision::cache::Leads {
        crate::provision::cache::Leads {
            claims: self.claims.is_leading(),
            shared: self.nfs.is_leading(),
        }
    }
}
