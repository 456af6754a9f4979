//! The one Kubernetes layer: what `flexvol provisioner`, `flexvol controller` and
//! `flexvol scheduler-extender` share to talk to the API server and to run as daemons.
//!
//! - [`client`]: the client — where the API server is, the CA rules, a rotating ServiceAccount
//!   token re-read.
//! - [`watch`]: the one watch adapter over kube-runtime's watcher (with its backoff).
//! - [`queue`]: the work queue, per-object backoff and per-fault-domain breakers.
//! - [`call`] and [`error`]: one API call under a deadline, its failure typed.
//! - [`events`]: events on objects (core/v1 `Event`, created only), the provisioner's and the
//!   controller's alike.
//! - [`daemon`]: one daemon start (signals, logs, the metrics registry with the build-info metric).
//! - [`http`]: the one HTTP server for `/metrics`, `/healthz`, `/readyz`.
//! - [`lease`]: leader election over `coordination.k8s.io/v1` Leases.
//!
//! **Direction.** This room imports nothing of the daemons (`provision`, `controller`) nor of
//! the driver; they are its clients (a lint in tests/suite/lints.rs keeps it so). The driver's
//! verbs never reach it: nothing here runs unless a daemon's `run` calls it.

/// The target of this room's own log lines (the API client's warnings, the electors, the HTTP
/// server's failures): every daemon's default log filter shows it at `info`
/// ([`daemon::log_filter`]).
pub(crate) const LOG_TARGET: &str = "flexvol-k8s";

pub(crate) mod call;
pub(crate) mod client;
pub(crate) mod daemon;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod http;
pub(crate) mod lease;
pub mod patch;
pub mod queue;
pub(crate) mod watch;
