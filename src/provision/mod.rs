//! `flexvol provisioner`: dynamic provisioning, one instance per node.
//!
//! Each node's instance serves claims whose class names `<vendor>/<kind>` for each kind in
//! [`provisioners`]: node-local ones (hostPath directories under the node's roots, [`hostpath`]; LVs
//! in the volume groups the node config grants, [`lvm`]) for the claims the scheduler placed on
//! its node (`volume.kubernetes.io/selected-node`, WaitForFirstConsumer), and shared ones (NFS
//! subdirectories, [`nfs`]) for any claim of their class, by whichever serving instance gets there
//! first; it makes the volume and the PV for it, grows both when the claim asks for more, and deletes
//! both when a Released PV with reclaim policy Delete is one it made. The decisions are in
//! [`reconcile`], the node-side work behind the [`provisioner::Provisioner`] seam (the directory
//! work of hostPath and NFS in the marked-directory library, [`volumedir`]), the API server behind
//! the [`api::Cluster`] seam (implemented over kube-rs in [`kube`]).
//!
//! **The driver does not pay for it.** Only [`run`] builds the tokio runtime and the kube client,
//! and the driver verbs reach no code under `provision/`: `cli::main` dispatches on `argv[0]`
//! first, and the node config every verb loads (local-path's keys included) is `node`'s, which
//! imports nothing from here. So the binary grows but a verb's startup does not.
//!
//! Logs: one line per action on stderr (the container log of the DaemonSet); this command is for
//! a daemon, not for kubelet, so the stdout/stderr protocol rule of the verbs does not apply.

#![allow(clippy::print_stderr)]

pub mod api;
pub mod apiclient;
pub mod error;
pub mod hostpath;
pub mod kube;
pub mod lvm;
pub mod nfs;
pub mod provisioner;
pub mod quota;
pub mod reconcile;
pub mod volumedir;

use crate::node::config::Config;
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

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
}

/// Exit code after a panic (EX_SOFTWARE): a bug, as opposed to 1, an environment to fix.
pub const PANIC_EXIT_CODE: i32 = 70;

/// One log line on stderr, with a timestamp.
pub fn log(msg: &str) {
    eprintln!(
        "{} flexvol-provisioner: {msg}",
        crate::node::calllog::rfc3339(SystemTime::now())
    );
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
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            log(&format!("cannot start the async runtime: {e}"));
            return 1;
        }
    };
    match rt.block_on(serve(a)) {
        Ok(()) => 0,
        Err(e) => {
            log(&format!("error: {e}"));
            1
        }
    }
}

async fn serve(a: &ProvisionerArgs) -> Result<(), String> {
    // The installer container writes the config; until a valid one exists, wait (no pass on an
    // unknown config: it would send every claim picked for this node back).
    let mut config = loop {
        match Config::load() {
            Ok(c) => break c,
            Err(e) => log(&format!("{e}; waiting for a valid config")),
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    };
    let client = apiclient::client(a.kubeconfig.as_deref()).await?;
    let wake = Arc::new(tokio::sync::Notify::new());
    let cluster = kube::KubeCluster::start(client, a.node_name.clone(), wake.clone());
    if !cluster.ready(Duration::from_secs(60)).await {
        log("the watches of claims and PVs have not listed yet after 60s; going on, will retry");
    }
    let id = identity(a);
    let mut rec = reconcile::Reconciler::new(cluster, id.clone(), provisioners(&id));
    log(&format!(
        "serving {} on node {} (hostPath roots here: {:?})",
        rec.provisioners().join(", "),
        id.node,
        config.local_path.node_roots(&id.node)
    ));
    let resync = Duration::from_secs(a.resync_seconds.max(1));
    loop {
        // The config may change (a ConfigMap update): the last valid one stays in force.
        match Config::load() {
            Ok(c) => config = c,
            Err(e) => log(&format!("{e}; keeping the last valid config")),
        }
        let r = rec.pass(&config).await;
        for (pv, at) in &r.provisioned {
            log(&format!("provisioned {pv} at {at}"));
        }
        for (pv, done) in &r.deleted {
            log(&format!("deleted {pv}: {done}"));
        }
        for (pv, bytes) in &r.resized {
            log(&format!("grew {pv} to {bytes} bytes"));
        }
        for c in &r.rescheduled {
            log(&format!("sent claim {c} back to the scheduler"));
        }
        for a in &r.advice {
            log(a);
        }
        for f in &r.failed {
            log(f);
        }
        // Changes seen by the watches come in bursts: let a burst settle, then pass again.
        let _ = tokio::time::timeout(resync, wake.notified()).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests;
