//! flexvol: a Kubernetes FlexVolume driver for hostPath, NFS and LVM volumes, and a dynamic
//! provisioner for the three, in one binary.
//!
//! Every top-level module, bottom layer first:
//! - [`protocol`]: the surface kubelet sees (argv grammar, options JSON, the one reply) and
//!   kubelet's side of it for the commands that judge drivers (Go's JSON rules, the `init` judge);
//! - [`sys`]: system seams (running programs, mount syscalls, the mount table, locks, symlink-safe
//!   paths, our own process: start-up, deadline, signals), each behind a trait tests replace;
//! - [`node`]: node bookkeeping (the node config, state records, the call log, capability tokens)
//!   and [`error`], the error a verb answers with;
//! - [`backend`]: the driver verbs of `hostpath`, `nfs` and `lvm`, one function per verb;
//! - [`driver`]: one kubelet call, top to bottom (it never starts the async runtime nor the
//!   Kubernetes client);
//! - [`vocab`]: the shared vocabulary (the annotations, labels and finalizer flexvol writes, the
//!   class parameters that are not a kind's own, the capacity record's wire format); it imports
//!   no other room;
//! - [`k8s`]: the one Kubernetes layer the daemons share (client, call deadline and typed API
//!   errors, the watch adapter, the work queue, Leases, finalizer patches, one daemon start, one
//!   HTTP server); it imports no daemon;
//! - [`provision`]: `flexvol provisioner`, the per-node daemon that makes volumes and PVs for
//!   claims: the reconciler, the API seam (`provision::cluster`), the per-kind storage work
//!   behind the `Provisioner` seam (`provision::storage`); [`ops`]: the commands for operators
//!   (`install`, `doctor`, `status`, `gc`, `conformance`, and the inventories of mounted and
//!   provisioned volumes they share); [`controller`]: `flexvol controller`, the one
//!   cluster-wide replica (node loss, capacity objects), and `flexvol scheduler-extender`; it
//!   imports [`k8s`] and [`vocab`], never the provisioner's internals (the extender's one
//!   exception: the provisioner's pure claim planning in `provision::storage`, so both decide
//!   alike);
//! - [`csi`]: `flexvol csi`, the CSI node plugin (hostPath), a second front end on the same
//!   backend code, with its gRPC runtime (never reached from `driver`);
//! - [`cli`]: how the binary is invoked: a driver verb by its name (`argv[0]`), else the commands for people.
//!
//! **Dependencies point one way.** No file of `src/` imports, through the `crate::` and `super::`
//! paths of its code, a file that imports it back, directly or through others; the lint
//! `contract_no_import_cycle_between_source_files` (tests/suite/lints.rs) fails naming the cycle.
//! What each room may import is a table, `ROOMS` in tests/suite/lints.rs, which
//! `contract_rooms_import_only_what_they_may` enforces. The layers above are the usual direction
//! (a module imports from its own layer or lower: `cli` → `driver`/`csi`/`controller`/`ops` →
//! `provision` → `k8s`/`vocab`; `driver` → `backend` → `node`/`error` → `sys` → `protocol`), with one
//! crossing by design: the node config and call log compose the config and option types each
//! backend owns, which in turn import nothing that imports the node config. The rule the lint
//! enforces is the file-level one.
//!
//! **Public surface.** Items are `pub(crate)` unless something outside this library needs them:
//! the binary (`main.rs` calls [`cli::main_os`]), the integration suite (`tests/suite/`, which
//! drives the verbs, the operator tools and the daemons' pure parts through this crate) and the
//! benches (`benches/`). Only those are `pub`, so a `pub` item is one a test or the binary relies
//! on, and changing it is seen there; the compiler reports anything else nobody uses as dead.
//! `csi::proto` is `pub` whole: its messages are the CSI wire format the suite's gRPC client
//! speaks. Within the crate, which room may use which is `ROOMS` (above), not visibility.

pub mod backend;
pub mod cli;
pub mod controller;
pub mod csi;
pub mod driver;
pub mod error;
pub mod k8s;
pub mod node;
pub mod ops;
pub mod protocol;
pub mod provision;
pub mod sys;
pub mod version;
pub mod vocab;
