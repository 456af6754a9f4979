//! `flexvol provisioner`: dynamic provisioning, one instance per node.
//!
//! Each node's instance serves claims whose class names `<vendor>/<kind>` for each kind in
//! [`provisioners`]: node-local ones (hostPath directories under the node's roots, [`hostpath`]; LVs
//! in the volume groups the node config grants, [`lvm`]) for the claims the scheduler placed on
//! its node (`volume.kubernetes.io/selected-node`, WaitForFirstConsumer), and shared ones (NFS
//! subdirectories, [`nfs`]) for any claim of their class, by the one serving instance that leads
//! them; it makes the volume and the PV for it (with the PV finalizer
//! `external-provisioner.volume.kubernetes.io/finalizer`), grows both when the claim asks for more,
//! and deletes both when a PV of reclaim policy Delete that it made is Released, or is deleted
//! and its claim is gone; only then does its finalizer go. The decisions are in
//! [`reconcile`], the node-side work behind the [`storage::Provisioner`] seam (one module per
//! kind under [`storage`]; the directory work of hostPath and NFS in the marked-directory
//! library, [`storage::volumedir`]), the API server behind the [`cluster::Cluster`] seam
//! (implemented over kube-rs in [`cluster::live`], with watch caches of only what this instance
//! works on, [`cache`], fed by [`crate::k8s::watch`]). The work runs in two lanes ([`lanes`]:
//! node-local and shared, each on its own thread, with a work queue, per-object backoff and
//! breakers from [`crate::k8s::queue`]); docs/provisioner-controller.md describes the whole.
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

pub(crate) mod cache;
pub(crate) mod calltail;
pub(crate) mod capacity;
pub mod cluster;
pub mod labeller;
pub(crate) mod lanes;
pub mod leadership;
pub mod reconcile;
pub mod storage;
pub mod telemetry;

use crate::k8s::daemon::LogFormat;
use crate::node::config::Config;
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use telemetry::LOG_TARGET;
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
    pub(crate) vendor: String,
    /// A full pass at least this often, even without changes seen by the watches.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub(crate) resync_seconds: u64,
    /// A lane (node-local, shared) that has made no progress for this long is stuck: /healthz and
    /// /readyz fail naming it, and this instance gives up its Leases until it moves again
    /// (default: 10 resyncs, at least 300).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) lane_timeout_seconds: Option<u64>,
    /// Serve /metrics, /healthz and /readyz here (the DaemonSet's pod network; the probes use it;
    /// on the host's network, as the systemd unit runs, pick a port free on every node).
    #[arg(long, default_value = "0.0.0.0:9479", value_name = "ADDRESS:PORT")]
    pub metrics_address: std::net::SocketAddr,
    /// Log lines as `text` (`<time> <LEVEL> flexvol-provisioner: <message>`) or `json`.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// Which events to log, e.g. `debug` or `flexvol-provisioner=debug,kube=info` (default:
    /// `RUST_LOG`, else this provisioner's info and nothing of the libraries).
    #[arg(long, value_name = "FILTER")]
    pub(crate) log_filter: Option<String>,
    /// Namespace of the Leases that let one instance at a time do the shared work (`flexvol-claims`,
    /// `flexvol-nfs`; drivers/deploy/rbac.yaml grants them in kube-system). Default: the client's
    /// namespace (the pod's in a cluster, else the kubeconfig context's, else `default`).
    #[arg(long, value_name = "NAMESPACE")]
    pub(crate) lease_namespace: Option<String>,
    /// Run in the host's mount namespace (PID 1's; the pod needs hostPID: true and privileged:
    /// true): the host's lvm, mount.nfs, mkfs and xfs_quota, its /dev, hostPath roots and
    /// /etc/flexvol; the ServiceAccount token is still read from this container's volume.
    /// Every other path (--kubeconfig, FLEXVOL_CONFIG) is then the host's.
    #[arg(long)]
    pub host_mount_namespace: bool,
    /// Publish this node's free capacity for `flexvol scheduler-extender` (the ConfigMap
    /// `flexvol-capacity/<node>`, which the controller creates; docs/scheduler-extender.md).
    /// drivers/deploy/daemonset.yaml sets it; rbac.yaml grants the update.
    #[arg(long)]
    pub(crate) publish_capacity: bool,
    /// With --host-mount-namespace: the process whose mount namespace is the node's (default 1,
    /// the node's init under hostPID). Only for nodes where PID 1 cannot be read (the test
    /// machine, whose PID 1 is a sandbox supervisor: tests/cluster/deploy-e2e points it at a
    /// process of the node); the DaemonSet leaves it at 1.
    #[arg(long, value_name = "PID", default_value_t = 1, requires = "host_mount_namespace",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) host_mount_namespace_pid: u32,
    /// Where the in-cluster service account is read (set by `run`, not on the command line):
    /// `/proc/self/fd/N` after `--host-mount-namespace`, else kube-rs's fixed path.
    #[arg(skip)]
    pub(crate) service_account_dir: Option<PathBuf>,
}

use crate::k8s::daemon::PANIC_EXIT_CODE;

/// A warning in the log (for the watches in [`kube`]; this file logs with `tracing` directly).
pub(crate) fn log(msg: &str) {
    warn!(target: LOG_TARGET, "{msg}");
}

/// The provisioner's identity for these arguments.
pub(crate) fn identity(a: &ProvisionerArgs) -> reconcile::Identity {
    reconcile::Identity {
        node: a.node_name.clone(),
        vendor: a.vendor.clone(),
    }
}

/// The kinds of volume served, each as `<vendor>/<kind>`. The one place a provisioner is registered.
pub(crate) fn provisioners(id: &reconcile::Identity) -> Vec<Box<dyn storage::Provisioner>> {
    vec![
        Box::new(storage::hostpath::HostPathProvisioner::new(
            id.provisioner("hostpath"),
        )),
        Box::new(storage::lvm::LvmProvisioner::new(&id.vendor)),
        Box::new(storage::nfs::NfsProvisioner::new(id.provisioner("nfs"))),
    ]
}

/// Runs the provisioner until killed; returns the exit code on a fatal error.
pub(crate) fn run(a: &ProvisionerArgs) -> i32 {
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
    if let Err(e) = crate::k8s::daemon::init_logs(a.log_format, a.log_filter.as_deref(), LOG_TARGET)
    {
        // No logger yet: the one place this command writes stderr itself.
        #[allow(clippy::print_stderr)]
        {
            eprintln!("flexvol-provisioner: {e}");
        }
        return 2;
    }
    // Before any thread exists (the runtime, the metrics thread): setns(CLONE_NEWNS) refuses a
    // multi-threaded process (crate::sys::hostns).
    let mut a = a.clone();
    if a.host_mount_namespace {
        let sa = std::path::Path::new(crate::k8s::client::SERVICE_ACCOUNT_DIR);
        let target = if a.host_mount_namespace_pid == 1 {
            std::path::PathBuf::from(crate::sys::hostns::HOST_MOUNT_NAMESPACE)
        } else {
            std::path::PathBuf::from(format!("/proc/{}/ns/mnt", a.host_mount_namespace_pid))
        };
        match crate::sys::hostns::enter(&target, &[sa]) {
            Ok(e) => {
                let kept = e.kept.into_iter().next().flatten();
                info!(target: LOG_TARGET,
                "entered the host's mount namespace ({}, whose process is: {}); the service account is read in the container's view at {}",
                target.display(),
                e.pid1,
                kept.as_deref().map_or_else(
                    || format!("{} (absent before the switch: only --kubeconfig can work)", sa.display()),
                    |p| format!("{} ({})", p.display(), sa.display()),
                ));
                if a.kubeconfig.is_none() && kept.is_none() {
                    error!(target: LOG_TARGET,
                        "no service account at {} in this container and no --kubeconfig: mount the projected token there (drivers/deploy/daemonset.yaml) or pass --kubeconfig (a path on the host)",
                        sa.display());
                    return 1;
                }
                a.service_account_dir = kept;
            }
            Err(e) => {
                error!(target: LOG_TARGET, "{e}");
                return 1;
            }
        }
    }
    let a = &a;
    // Started after --host-mount-namespace, which needs a single-threaded process; until then a
    // termination signal stays pending. main() blocks the termination signals for the driver
    // verbs (and every thread inherits the mask). They stay blocked here too: one thread takes
    // them (sigwait) and asks the runtime to stop, which lets go of the Leases this instance holds, so that another instance takes the
    // shared work over at its next read rather than after the lease expires (a rolling update).
    // Every step is restart-safe, so nothing else needs finishing. A second signal, or a stop
    // that takes longer than STOP_LIMIT, ends the process at once.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    if let Err(e) = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || take_signals(&stop_tx))
    {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("flexvol-provisioner: cannot start the signal thread: {e}");
        }
        return 1;
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
        health: telemetry::Health::new(Instant::now(), resync)
            .stuck_after(a.lane_timeout_seconds.map(Duration::from_secs)),
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
    if let Err(e) = calltail::spawn(shared.metrics.driver_calls()) {
        warn!(target: LOG_TARGET, "cannot start the call log's reader: {e}; flexvol_driver_calls_total is not counted");
    }
    match rt.block_on(serve(a, &shared, stop_rx)) {
        Ok(()) => 0,
        Err(e) => {
            error!(target: LOG_TARGET, "error: {e}");
            1
        }
    }
}

/// How long a stop may take (releasing the Leases) before the process ends regardless: well within
/// the DaemonSet's termination grace period (30 s) and a test's patience (5 s).
pub(crate) const STOP_LIMIT: Duration = Duration::from_secs(3);

/// Set when `serve` runs its main loop, which handles a stop (before that, a signal ends the
/// process at once).
static SERVING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The signal thread: the first termination signal asks `serve` to stop (`stop`); a second one, or
/// [`STOP_LIMIT`] plus a second passing, ends the process with `128 + signal`, its children killed.
fn take_signals(stop: &tokio::sync::watch::Sender<bool>) {
    use nix::sys::signal::Signal;
    let Some(sig) = crate::sys::process::wait_for_termination() else {
        return;
    };
    let code = match sig {
        Signal::SIGHUP => 129,
        Signal::SIGINT => 130,
        _ => 143,
    };
    if !SERVING.load(std::sync::atomic::Ordering::Acquire) {
        // Still starting (waiting for its config or its first lists): nothing to hand over that
        // a restart would not; stop at once, as before the handover existed.
        crate::sys::process::kill_children();
        #[allow(clippy::exit)]
        std::process::exit(code)
    }
    stop.send_replace(true);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(crate::sys::process::wait_for_termination());
    });
    // Either a second signal or the limit: the stop did not end the process in time.
    let _ = rx.recv_timeout(STOP_LIMIT + Duration::from_secs(1));
    warn!(target: LOG_TARGET, "not stopped in time after {sig}: exiting now");
    crate::sys::process::kill_children();
    #[allow(clippy::exit)]
    std::process::exit(code)
}

/// Why the provisioner stops (it then exits 1; the DaemonSet restarts it).
#[derive(Debug, thiserror::Error)]
enum StartError {
    /// No API client (what to fix is in the message).
    #[error(transparent)]
    Client(#[from] crate::k8s::client::ClientError),
    /// A lane's thread cannot be started.
    #[error("cannot start a lane: {0}")]
    Lane(std::io::Error),
    /// A lane's thread ended (it never returns while the process works).
    #[error("a lane stopped; exiting so that the DaemonSet restarts the provisioner")]
    LaneStopped,
}

async fn serve(
    a: &ProvisionerArgs,
    shared: &Arc<telemetry::Shared>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), StartError> {
    let health = &shared.health;
    // The installer container writes the config; until a valid one exists, wait (no work on an
    // unknown config: it would send every claim picked for this node back).
    let config = loop {
        health.beat(Instant::now());
        match Config::load() {
            Ok(c) => break c,
            Err(e) => warn!(target: LOG_TARGET, "{e}; waiting for a valid config"),
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    };
    let client =
        crate::k8s::client::client(a.kubeconfig.as_deref(), a.service_account_dir.as_deref())
            .await?;
    let id = identity(a);
    let kinds = lanes::all_kinds(&id);
    let names = |local: bool| -> Vec<String> {
        kinds
            .iter()
            .filter(|k| k.node_local == local)
            .map(|k| id.provisioner(k.name))
            .collect()
    };
    // What this instance leads (the Leases decide; nothing until they do). The shared lane says
    // whether this node serves a shared kind, which makes it eligible for that Lease.
    let serves_shared = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let leadership = crate::provision::leadership::Leadership::start(
        &client,
        a.lease_namespace.as_deref(),
        &a.node_name,
        &shared.metrics,
        serves_shared.clone(),
    );
    let (leads_tx, leads_rx) = tokio::sync::watch::channel(leadership.leads());
    let scope = cache::Scope {
        node: id.node.clone(),
        local: names(true),
        shared: names(false),
        shared_kinds: kinds
            .iter()
            .filter(|k| !k.node_local)
            .map(|k| k.name.to_owned())
            .collect(),
        leads: leads_rx.clone(),
    };
    let (local_tx, local_rx) = tokio::sync::mpsc::unbounded_channel();
    let (shared_tx, shared_rx) = tokio::sync::mpsc::unbounded_channel();
    let routes = cache::Routes {
        local: local_tx,
        shared: shared_tx,
    };
    // The holder of flexvol-claims labels every claim with where its work is done
    // (labeller), so that every other instance watches only its own.
    let (label_tx, label_rx) = tokio::sync::mpsc::unbounded_channel();
    let relabel = Arc::new(labeller::Relabel::new(Arc::new(scope.clone()), label_tx));
    tokio::spawn(labeller::run(
        client.clone(),
        relabel.clone(),
        label_rx,
        leads_rx.clone(),
        shared.clone(),
    ));
    let observer: cache::ClaimObserver = relabel;
    let cluster = cluster::live::KubeCluster::start(
        client,
        a.node_name.clone(),
        scope,
        routes,
        Some(observer),
        shared.metrics.watch_events(),
    );
    if cluster.ready(Duration::from_secs(60)).await {
        health.synced();
    } else {
        warn!(
            target: LOG_TARGET,
            "the watches of claims and PVs have not listed yet after 60s; going on, will retry"
        );
    }
    info!(
        target: LOG_TARGET,
        node = %id.node,
        "serving {} on node {} (hostPath roots here: {:?})",
        kinds.iter().map(|k| id.provisioner(k.name)).collect::<Vec<_>>().join(", "),
        id.node,
        config.local_path.node_roots(&id.node)
    );
    let resync = Duration::from_secs(a.resync_seconds.max(1));
    // Each lane's window counts from its start, not from the waits above.
    health.beat(Instant::now());
    let mut lanes = Vec::new();
    for (lane, keys) in [
        (cache::Lane::Local, local_rx),
        (cache::Lane::Shared, shared_rx),
    ] {
        let args = lanes::LaneArgs {
            lane,
            cluster: cluster.clone(),
            kubeconfig: a.kubeconfig.clone(),
            service_account_dir: a.service_account_dir.clone(),
            id: id.clone(),
            keys,
            shared: shared.clone(),
            resync,
            leads: leads_rx.clone(),
            serves_shared: serves_shared.clone(),
            publish_capacity: a.publish_capacity,
        };
        lanes.push(lanes::spawn(args).map_err(StartError::Lane)?);
    }
    // The watches, the electors and the API calls run on this runtime; the lanes on their own
    // threads. Every 200 ms: whether a lane is stuck (then the electors give up the Leases, so
    // that a healthy instance takes the shared work over: a stuck lane must not keep it), what
    // this instance leads (a lead lost at its renew deadline shows here even if the elector's
    // reports are late), and readiness once the caches are listed. Nothing here ever waits for
    // a lane: a stuck one cannot hold up this loop, the Leases or a stop.
    SERVING.store(true, std::sync::atomic::Ordering::Release);
    let mut fit = true;
    loop {
        let live = health.live(Instant::now());
        if live.is_ok() != fit {
            fit = live.is_ok();
            leadership.set_fit(fit);
            match &live {
                Err(why) => error!(target: LOG_TARGET,
                    "{}; giving up the Leases this instance holds until it moves again (kubelet's liveness probe restarts the container)",
                    why.to_string().replace('\n', "; ")),
                Ok(()) => {
                    info!(target: LOG_TARGET, "every lane moves again: taking part in the Leases again")
                }
            }
        }
        leads_tx.send_if_modified(|l| {
            let now = leadership.leads();
            std::mem::replace(l, now) != now
        });
        if !health.is_synced() && cluster.ready(Duration::ZERO).await {
            health.synced();
        }
        if lanes.iter().any(|l| l.is_finished()) {
            return Err(StartError::LaneStopped);
        }
        if let Ok(Err(_)) = tokio::time::timeout(Duration::from_millis(200), stop.changed()).await {
            // The signal thread is gone (it could not wait): no stop will come, just the pace.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if *stop.borrow() {
            // Stop leading first (the lanes' shared work stops at its next key), then let go.
            leads_tx.send_replace(cache::Leads::default());
            info!(target: LOG_TARGET, "stopping (signal): releasing the Leases this instance holds");
            if leadership.release(STOP_LIMIT).await {
                info!(target: LOG_TARGET, "stopped: no Lease held");
            } else {
                warn!(target: LOG_TARGET, "stopped without releasing every Lease within {STOP_LIMIT:?}: another instance takes over when it expires");
            }
            crate::sys::process::kill_children();
            // A requested stop is a clean end (systemd and kubelet expect 0 or death by SIGTERM).
            #[allow(clippy::exit)]
            std::process::exit(0);
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod class_param_tests {
    use crate::vocab::class::PARAM;
    use std::collections::BTreeMap;

    /// The node-local kinds accept the parameter (and check its value); NFS refuses it, saying why.
    /// The controller's list of node-local kinds ([`crate::vocab::NODE_LOCAL_KINDS`]) is the
    /// provisioners' own.
    #[test]
    fn node_local_kinds_are_the_provisioners() {
        let id = crate::provision::reconcile::Identity {
            node: "n".into(),
            vendor: "flexvol".into(),
        };
        let local: Vec<&str> = crate::provision::provisioners(&id)
            .iter()
            .map(|b| b.kind())
            .filter(|k| k.node_local)
            .map(|k| k.name)
            .collect();
        assert_eq!(local, crate::vocab::NODE_LOCAL_KINDS);
    }

    #[test]
    fn classes_accept_the_grace_only_for_node_local_kinds() {
        let id = crate::provision::reconcile::Identity {
            node: "n".into(),
            vendor: "flexvol".into(),
        };
        let p = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let mut seen = Vec::new();
        for b in crate::provision::provisioners(&id) {
            let k = b.kind();
            seen.push(k.name);
            let base: &[(&str, &str)] = match k.name {
                "hostpath" => &[("mode", "0770")],
                "lvm" => &[("volumegroup", "vg0")],
                _ => &[("server", "10.0.0.5"), ("share", "/export")],
            };
            assert!(b.check_class(&p(base)).is_ok(), "{}", k.name);
            let mut with = base.to_vec();
            with.push((PARAM, "10m"));
            let r = b.check_class(&p(&with));
            if k.node_local {
                assert!(r.is_ok(), "{}: {r:?}", k.name);
                let mut bad = base.to_vec();
                bad.push((PARAM, "10 minutes"));
                let e = b.check_class(&p(&bad)).unwrap_err().to_string();
                assert!(e.contains(PARAM) && e.contains("10 minutes"), "{e}");
                let mut typo = base.to_vec();
                typo.push(("nodeLossGrace", "10m"));
                let e = b.check_class(&p(&typo)).unwrap_err().to_string();
                assert!(e.contains(PARAM), "the unknown-key error lists it: {e}");
            } else {
                let e = r.unwrap_err().to_string();
                assert!(e.contains("node-local kinds (hostpath, lvm) only"), "{e}");
            }
        }
        assert_eq!(seen, ["hostpath", "lvm", "nfs"]);
    }
}
