//! `flexvol provisioner`: dynamic provisioning, one instance per node.
//!
//! Each node's instance serves claims whose class names `<vendor>/<kind>` for each kind in
//! [`provisioners`]: node-local ones (hostPath directories under the node's roots, [`hostpath`]; LVs
//! in the volume groups the node config grants, [`lvm`]) for the claims the scheduler placed on
//! its node (`volume.kubernetes.io/selected-node`, WaitForFirstConsumer), and shared ones (NFS
//! subdirectories, [`nfs`]) for any claim of their class, by whichever serving instance gets there
//! first; it makes the volume and the PV for it (with the PV finalizer
//! `external-provisioner.volume.kubernetes.io/finalizer`), grows both when the claim asks for more,
//! and deletes both when a PV of reclaim policy Delete that it made is Released, or is deleted
//! and its claim is gone; only then does its finalizer go. The decisions are in
//! [`reconcile`], the node-side work behind the [`provisioner::Provisioner`] seam (the directory
//! work of hostPath and NFS in the marked-directory library, [`volumedir`]), the API server behind
//! the [`api::Cluster`] seam (implemented over kube-rs in [`kube`]).
//!
//! **The driver does not pay for it.** Only [`run`] builds the tokio runtime and the kube client,
//! and the driver verbs reach no code under `provision/`: `cli::main` dispatches on `argv[0]`
//! first, and the node config every verb loads (local-path's keys included) is `node`'s, which
//! imports nothing from here. So the binary grows but a verb's startup does not.
//!
//! Logs, metrics and health ([`telemetry`]): one levelled `tracing` event per action on stderr
//! (the container log of the DaemonSet; text or JSON lines), `/metrics` (Prometheus), `/healthz`
//! and `/readyz` on `--metrics-address`. Only [`run`] sets them up; this command is for a daemon,
//! not for kubelet, so the stdout/stderr protocol rule of the verbs does not apply.

pub mod api;
pub mod apiclient;
pub mod error;
pub mod hostpath;
pub mod kube;
pub mod lease;
pub mod lvm;
pub mod nfs;
pub mod provisioner;
pub mod quota;
pub mod reconcile;
pub mod telemetry;
pub mod volumedir;

use crate::node::config::Config;
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use telemetry::{LOG_TARGET, LogFormat};
use tracing::{error, info, warn};

/// Arguments of `flexvol provisioner`.
#[derive(Args, Debug, Clone)]
pub struct ProvisionerArgs {
    /// This node's name (the DaemonSet passes `spec.nodeName`).
    #[arg(long, value_name = "NAME")]
    pub node_name: String,
    /// Talk to the API server with this kubeconfig instead of the pod's service account.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Vendor part of the driver names as installed: the provisioners are `<vendor>/<kind>`.
    #[arg(long, default_value = "flexvol", value_name = "NAME")]
    pub vendor: String,
    /// A full pass at least this often, even without changes seen by the watches.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub resync_seconds: u64,
    /// Serve /metrics, /healthz and /readyz here (the DaemonSet's pod network; the probes use it;
    /// on the host's network, as the systemd unit runs, pick a port free on every node).
    #[arg(long, default_value = "0.0.0.0:9479", value_name = "ADDRESS:PORT")]
    pub metrics_address: std::net::SocketAddr,
    /// Log lines as `text` (`<time> <LEVEL> flexvol-provisioner: <message>`) or `json`.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Which events to log, e.g. `debug` or `flexvol-provisioner=debug,kube=info` (default:
    /// `RUST_LOG`, else this provisioner's info and nothing of the libraries).
    #[arg(long, value_name = "FILTER")]
    pub log_filter: Option<String>,
    /// Namespace of the Leases that let one instance at a time do the shared work (`flexvol-claims`,
    /// `flexvol-nfs`; drivers/deploy/rbac.yaml grants them in kube-system). Default: the client's
    /// namespace (the pod's in a cluster, else the kubeconfig context's, else `default`).
    #[arg(long, value_name = "NAMESPACE")]
    pub lease_namespace: Option<String>,
}

/// Exit code after a panic (EX_SOFTWARE): a bug, as opposed to 1, an environment to fix.
pub const PANIC_EXIT_CODE: i32 = 70;

/// A warning in the log (for the watches in [`kube`]; this file logs with `tracing` directly).
pub fn log(msg: &str) {
    warn!(target: LOG_TARGET, "{msg}");
}

/// The provisioner's identity for these arguments.
pub fn identity(a: &ProvisionerArgs) -> reconcile::Identity {
    reconcile::Identity {
        node: a.node_name.clone(),
        vendor: a.vendor.clone(),
    }
}

/// The kinds of volume served, each as `<vendor>/<kind>`. The one place a provisioner is registered.
pub fn provisioners(id: &reconcile::Identity) -> Vec<Box<dyn provisioner::Provisioner>> {
    vec![
        Box::new(hostpath::HostPathProvisioner::new(
            id.provisioner("hostpath"),
        )),
        Box::new(lvm::LvmProvisioner::new(&id.vendor)),
        Box::new(nfs::NfsProvisioner::new(id.provisioner("nfs"))),
    ]
}

/// Runs the provisioner until killed; returns the exit code on a fatal error.
pub fn run(a: &ProvisionerArgs) -> i32 {
    // main() installs the driver's panic hook, which answers kubelet in JSON on stdout. A daemon
    // has no caller to answer: a panic (a bug) is one log line and exit code 70, so that the
    // DaemonSet restarts it (every step is restart-safe), never a half-dead process whose watch
    // task died.
    std::panic::set_hook(Box::new(|info| {
        log(&format!(
            "internal error ({info}); exiting, please report it with this log"
        ));
        crate::sys::process::kill_children();
        #[allow(clippy::exit)]
        std::process::exit(PANIC_EXIT_CODE)
    }));
    // main() blocks the termination signals for the driver verbs (and every thread inherits the
    // mask). The provisioner may stop anywhere (every step is restart-safe), so SIGTERM from
    // kubelet stopping the pod ends it at once, like the default action.
    {
        use nix::sys::signal::{SigSet, Signal};
        let mut set = SigSet::empty();
        for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
            set.add(s);
        }
        let _ = set.thread_unblock();
    }
    if let Err(e) = telemetry::init_logs(a.log_format, a.log_filter.as_deref()) {
        // No logger yet: the one place this command writes stderr itself.
        #[allow(clippy::print_stderr)]
        {
            eprintln!("flexvol-provisioner: {e}");
        }
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
        health: telemetry::Health::new(Instant::now(), resync),
    });
    match telemetry::serve(a.metrics_address, shared.clone()) {
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

async fn serve(a: &ProvisionerArgs, shared: &telemetry::Shared) -> Result<(), String> {
    let health = &shared.health;
    // The installer container writes the config; until a valid one exists, wait (no pass on an
    // unknown config: it would send every claim picked for this node back).
    let mut config = loop {
        health.beat(Instant::now());
        match Config::load() {
            Ok(c) => break c,
            Err(e) => warn!(target: LOG_TARGET, "{e}; waiting for a valid config"),
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    };
    let client = apiclient::client(a.kubeconfig.as_deref()).await?;
    // Who does the shared work (one instance at a time): kept for the lanes to ask.
    let _leadership = lease::Leadership::start(
        &client,
        a.lease_namespace.as_deref(),
        &a.node_name,
        &shared.metrics,
    );
    let wake = Arc::new(tokio::sync::Notify::new());
    let cluster = kube::KubeCluster::start(client, a.node_name.clone(), wake.clone());
    if cluster.ready(Duration::from_secs(60)).await {
        health.synced();
    } else {
        warn!(
            target: LOG_TARGET,
            "the watches of claims and PVs have not listed yet after 60s; going on, will retry"
        );
    }
    let id = identity(a);
    let mut rec = reconcile::Reconciler::new(cluster, id.clone(), provisioners(&id));
    info!(
        target: LOG_TARGET,
        node = %id.node,
        "serving {} on node {} (hostPath roots here: {:?})",
        rec.provisioners().join(", "),
        id.node,
        config.local_path.node_roots(&id.node)
    );
    let resync = Duration::from_secs(a.resync_seconds.max(1));
    let lvm_driver = id.provisioner("lvm");
    let mut capacity_at: Option<Instant> = None;
    loop {
        // The config may change (a ConfigMap update): the last valid one stays in force.
        match Config::load() {
            Ok(c) => config = c,
            Err(e) => warn!(target: LOG_TARGET, "{e}; keeping the last valid config"),
        }
        if !health.is_synced() && rec.cluster.ready(Duration::ZERO).await {
            health.synced();
        }
        let t0 = Instant::now();
        let r = rec.pass(&config).await;
        let took = t0.elapsed();
        for (pv, at) in &r.provisioned {
            info!(target: LOG_TARGET, pv = %pv, "provisioned {pv} at {at}");
        }
        for (pv, done) in &r.deleted {
            info!(target: LOG_TARGET, pv = %pv, "deleted {pv}: {done}");
        }
        for (pv, bytes) in &r.resized {
            info!(target: LOG_TARGET, pv = %pv, bytes, "grew {pv} to {bytes} bytes");
        }
        for pv in &r.protected {
            info!(target: LOG_TARGET, pv = %pv, "gave {pv} (made before the PV finalizer) the finalizer");
        }
        for pv in &r.released {
            info!(target: LOG_TARGET, pv = %pv, "released {pv}: deleted with a reclaim policy other than Delete, its volume kept");
        }
        for c in &r.rescheduled {
            info!(target: LOG_TARGET, claim = %c, "sent claim {c} back to the scheduler");
        }
        for a in &r.advice {
            warn!(target: LOG_TARGET, "{a}");
        }
        for f in &r.failed {
            warn!(target: LOG_TARGET, "{f}");
        }
        shared.metrics.record(&r, took);
        // Capacity: after any volume work, else once a minute (statvfs per root, `lvm vgs` per VG).
        if !r.ops.is_empty() || capacity_at.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
            let (pools, failed) = telemetry::capacity(&config, &id.node, &lvm_driver);
            shared.metrics.set_capacity(&pools);
            for f in failed {
                warn!(target: LOG_TARGET, "{f}");
            }
            capacity_at = Some(Instant::now());
        }
        health.passed(Instant::now());
        // Changes seen by the watches come in bursts: let a burst settle, then pass again.
        let _ = tokio::time::timeout(resync, wake.notified()).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests;
