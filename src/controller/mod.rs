//! `flexvol controller`: the cluster-wide part of flexvol, one replica per cluster
//! (drivers/deploy-overlays/node-loss/controller.yaml), with a credential of its own (ServiceAccount
//! `kube-system/flexvol-controller`), never on the nodes.
//!
//! Today it does one job, node loss ([`nodeloss`]; the decisions are
//! [`crate::controller::nodeloss::decide`]'s): for a class of a node-local kind that opts in
//! (`nodeLossGracePeriod`), the claims and PVs flexvol made on a node whose Node object has been
//! deleted for that long, with its kubelet silent (no renewed `kube-node-lease` Lease, and none
//! being renewed when the Node was last seen), are deleted, with events, so that their owners
//! recreate them elsewhere.
//!
//! **Why not in the node provisioner.** Deleting claims must not be a power of the node
//! credential: every node runs `flexvol provisioner` with the token of drivers/deploy/rbac.yaml,
//! and root on any node can read it; a token that could delete claims would let one stolen node
//! destroy every tenant's claims. This component's token can, and so it runs once, as a
//! Deployment whose pod can be kept off tenant workloads' nodes (docs/security.md).
//!
//! Contract of the loop ([`run`]): a pass every `--resync-seconds` (sooner when a grace ends
//! before that) lists every kubelet Lease (`kube-node-lease`), every Node and every PV labelled
//! `flexvol/kind` of a node-local kind, each list complete or the pass decides nothing; every API call has [`crate::k8s::call::DEADLINE`];
//! a PV whose work failed is retried after a per-PV backoff (1 s doubling to 5 min,
//! [`crate::k8s::queue::WorkQueue`]); every write is conditional (resourceVersion or uid
//! preconditions), so two replicas running by mistake (a rollout) do the same work once.
//! It reuses the provisioner's API client ([`crate::k8s::client`]: the cluster's CA only,
//! re-read tokens, connect timeout) and its log format.

pub(crate) mod capacity;
pub mod extender;
pub mod nodeloss;
pub mod telemetry;

use crate::k8s::daemon::{self, LogFormat};
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{error, info};

/// The target of the controller's log events.
pub(crate) const LOG_TARGET: &str = "flexvol-controller";

/// Arguments of `flexvol controller`.
#[derive(Args, Debug, Clone)]
pub struct ControllerArgs {
    /// Talk to the API server with this kubeconfig instead of the pod's service account.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Vendor part of the provisioner names (`<vendor>/hostpath`, `<vendor>/lvm`).
    #[arg(long, default_value = "flexvol", value_name = "NAME")]
    pub(crate) vendor: String,
    /// Also keep one capacity ConfigMap per Node in `flexvol-capacity` for the scheduler
    /// extender (docs/scheduler-extender.md; drivers/deploy-overlays/node-loss/controller.yaml sets it and grants it).
    #[arg(long)]
    pub(crate) capacity_objects: bool,
    /// A pass at least this often (sooner when a grace period ends earlier).
    #[arg(long, default_value_t = 15, value_name = "SECONDS")]
    pub(crate) resync_seconds: u64,
    /// Serve /metrics, /healthz and /readyz here (the pod network; the probes use it), as the
    /// provisioner does on its own port.
    #[arg(long, default_value = "0.0.0.0:9480", value_name = "ADDRESS:PORT")]
    pub metrics_address: std::net::SocketAddr,
    /// Log lines as `text` (`<time> <LEVEL> flexvol-controller: <message>`) or `json`.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// Which events to log, e.g. `flexvol-controller=debug,kube=info` (default: `RUST_LOG`,
    /// else this controller's info and nothing of the libraries).
    #[arg(long, value_name = "FILTER")]
    pub(crate) log_filter: Option<String>,
}

/// Runs the controller until killed; returns the exit code on a fatal error.
pub(crate) fn run(a: &ControllerArgs) -> i32 {
    // As the provisioner: a panic is a log line and exit 70 (the Deployment restarts it; every
    // step is restart-safe); SIGTERM ends it at once.
    std::panic::set_hook(Box::new(|info| {
        tracing::error!(target: LOG_TARGET, "internal error ({info}); exiting, please report it with this log");
        #[allow(clippy::exit)]
        std::process::exit(crate::k8s::daemon::PANIC_EXIT_CODE)
    }));
    if !daemon::start_daemon(a.log_format, a.log_filter.as_deref(), LOG_TARGET) {
        return 2;
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!(target: LOG_TARGET, "cannot start the async runtime: {e}");
            return 1;
        }
    };
    let resync = Duration::from_secs(a.resync_seconds.max(1));
    let shared = Arc::new(telemetry::Shared {
        metrics: telemetry::Metrics::new(),
        health: telemetry::Health::new(Instant::now(), resync, a.capacity_objects),
    });
    match crate::k8s::http::serve(a.metrics_address, shared.clone()) {
        Ok(at) => {
            info!(target: LOG_TARGET, "serving /metrics, /healthz and /readyz on http://{at}")
        }
        Err(e) => {
            error!(target: LOG_TARGET, "{e}");
            return 1;
        }
    }
    match rt.block_on(serve(a, &shared)) {
        Ok(()) => 0,
        Err(e) => {
            error!(target: LOG_TARGET, "error: {e}");
            1
        }
    }
}

async fn serve(
    a: &ControllerArgs,
    shared: &telemetry::Shared,
) -> Result<(), crate::k8s::client::ClientError> {
    use telemetry::Loop;
    let client = crate::k8s::client::client(a.kubeconfig.as_deref(), None).await?;
    shared.health.connected();
    let local_kinds: Vec<&'static str> = crate::vocab::NODE_LOCAL_KINDS.to_vec();
    let resync = Duration::from_secs(a.resync_seconds.max(1));
    info!(
        target: LOG_TARGET,
        "node loss: watching the PVs of {} (classes opt in with {}); a pass every {}s",
        local_kinds
            .iter()
            .map(|k| format!("{}/{k}", a.vendor))
            .collect::<Vec<_>>()
            .join(", "),
        crate::vocab::class::PARAM,
        resync.as_secs()
    );
    let capacity_client = a.capacity_objects.then(|| client.clone());
    let mut nl = nodeloss::NodeLoss::new(client, a.vendor.clone(), local_kinds);
    loop {
        if let Some(c) = &capacity_client {
            let r = capacity::sync(c).await;
            let (m, h) = (&shared.metrics, &shared.health);
            match &r {
                Ok(p) => m.record(
                    Loop::Capacity,
                    &[
                        (
                            "object-created",
                            u64::try_from(p.create.len()).unwrap_or(u64::MAX),
                        ),
                        (
                            "object-deleted",
                            u64::try_from(p.delete.len()).unwrap_or(u64::MAX),
                        ),
                    ],
                    0,
                ),
                Err(_) => m.record(Loop::Capacity, &[], 1),
            }
            h.passed(Loop::Capacity, Instant::now(), r.is_ok());
            match r {
                Ok(p) => {
                    for n in &p.create {
                        info!(target: LOG_TARGET, "capacity: made the capacity object of node {n}");
                    }
                    for (n, _) in &p.delete {
                        info!(target: LOG_TARGET, "capacity: removed the capacity object of node {n}, which is gone");
                    }
                }
                Err(e) => {
                    tracing::warn!(target: LOG_TARGET, "capacity objects: {e}; retrying next pass")
                }
            }
        }
        let next = nl.pass().await;
        let s = nl.last;
        shared.metrics.record(
            Loop::NodeLoss,
            &[
                ("claim-deleted", s.claims_deleted),
                ("pv-deleted", s.pvs_deleted),
            ],
            s.errors,
        );
        shared
            .health
            .passed(Loop::NodeLoss, Instant::now(), s.listed);
        let wait = next.map_or(resync, |d| d.min(resync));
        tokio::time::sleep(wait.max(Duration::from_millis(500))).await;
    }
}
