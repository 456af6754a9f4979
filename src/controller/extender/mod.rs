//! `flexvol scheduler-extender` (issue #24, item 1; design: docs/scheduler-extender.md): a
//! kube-scheduler 1.20 extender that filters out nodes which cannot hold a pod's unbound flexvol
//! claims, all of them together, and scores the others by the room left, from the capacity each
//! node's provisioner publishes ([`crate::provision::capacity`]).
//!
//! - [`wire`]: the extender API's JSON (`ExtenderArgs`, `ExtenderFilterResult`,
//!   `HostPriorityList`), upstream field names exactly;
//! - [`claims`]: a pod → what its claims need; every claim → what is already headed to each node;
//! - [`decide`]: the decision, pure: [`decide::filter`] and [`decide::prioritize`];
//! - [`server`]: the HTTP side (`POST /filter`, `POST /prioritize`, probes) with its bounds;
//! - [`watch`]: the capacity ConfigMaps, claims and classes kept in [`server::State`];
//! - [`run`]: the `flexvol scheduler-extender` command.
//!
//! Caller contract: the extender is configured `ignorable: true`, and everything here keeps to
//! that direction: missing, stale or malformed data lets a node through (score 0), never filters
//! it; only fresh valid data that shows the claims cannot fit filters a node out.
//!
//! - [`metrics`]: `GET /metrics`.
//!
//! Status: unit-tested piece by piece, and proven end to end with the real v1.20.2 kube-scheduler
//! configured by drivers/deploy/kube-scheduler-config.yaml (tests/cluster/provisioner-e2e
//! `extender`: hostPath claims, records from the node provisioners, objects from the controller).

pub(crate) mod claims;
pub(crate) mod decide;
pub(crate) mod metrics;
pub mod server;
pub mod watch;
pub(crate) mod wire;

use crate::k8s::daemon::{self as telemetry, LogFormat};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tracing::{error, info};

pub(crate) use server::LOG_TARGET;

/// Arguments of `flexvol scheduler-extender`.
#[derive(Args, Debug, Clone)]
pub struct SchedulerExtenderArgs {
    /// Serve kube-scheduler here (its `extenders[].urlPrefix` is `http://<this>`).
    #[arg(long, default_value = "127.0.0.1:8099", value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// Talk to the API server with this kubeconfig instead of the pod's service account.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Vendor part of the provisioner names (`<vendor>/hostpath`, `<vendor>/lvm`).
    #[arg(long, default_value = "flexvol", value_name = "NAME")]
    pub(crate) vendor: String,
    /// At most this many unbound claims of one namespace count as headed to one node (their
    /// `selected-node`); the rest, the newest first, are not counted, so one namespace cannot
    /// fill a node for the others.
    #[arg(long, default_value_t = claims::DEFAULT_MAX_RESERVED_PER_NAMESPACE, value_name = "N")]
    pub(crate) max_reserved_claims_per_namespace: usize,
    /// A node's capacity older than this never filters it (it passes, unpreferred).
    #[arg(long, default_value_t = 180, value_name = "SECONDS")]
    pub(crate) stale_after_seconds: u64,
    /// Log lines as `text` or `json`.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// Which events to log (default: `RUST_LOG`, else this command's info).
    #[arg(long, value_name = "FILTER")]
    pub(crate) log_filter: Option<String>,
}

/// Runs the extender until killed; the exit code on a fatal error.
pub(crate) fn run(a: &SchedulerExtenderArgs) -> i32 {
    // As the controller: a panic is a log line and exit 70 (the DaemonSet restarts it; it holds
    // nothing but caches); SIGTERM ends it at once (telemetry::start_daemon unblocks the
    // termination signals the binary's start blocks for the driver's sake).
    std::panic::set_hook(Box::new(|info| {
        tracing::error!(target: LOG_TARGET, "internal error ({info}); exiting, please report it with this log");
        #[allow(clippy::exit)]
        std::process::exit(crate::k8s::daemon::PANIC_EXIT_CODE)
    }));
    if !telemetry::start_daemon(a.log_format, a.log_filter.as_deref(), LOG_TARGET) {
        return 2;
    }
    let listener = match server::bind(a.listen) {
        Ok(l) => l,
        Err(e) => {
            error!(target: LOG_TARGET, "{e}");
            return 1;
        }
    };
    let mut state = server::State::new(
        a.vendor.clone(),
        Duration::from_secs(a.stale_after_seconds.max(1)),
    );
    state.max_reserved_per_namespace = a.max_reserved_claims_per_namespace;
    let state = Arc::new(RwLock::new(state));
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
    let client = match rt.block_on(crate::k8s::client::client(a.kubeconfig.as_deref(), None)) {
        Ok(c) => c,
        Err(e) => {
            error!(target: LOG_TARGET, "{e}");
            return 1;
        }
    };
    info!(
        target: LOG_TARGET,
        "serving POST /filter and /prioritize on http://{}; capacity from ConfigMaps in {}",
        a.listen,
        crate::vocab::capacity::NAMESPACE
    );
    rt.spawn(watch::run(client, state.clone()));
    match rt.block_on(server::serve(listener, state)) {
        Ok(()) => 0,
        Err(e) => {
            error!(target: LOG_TARGET, "the server stopped: {e}");
            1
        }
    }
}
