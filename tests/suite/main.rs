//! The integration suite, one binary (links once). Tests are named by tier:
//! `contract_*` (no privileges), `root_*` (real mounts, needs root), `install_*`, `guest_*`
//! (ignored on the host; run inside the test VM).

#![allow(
    clippy::print_stderr,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used
)]

mod admission_policy;
mod conformance;
mod contract;
mod controller_manifests;
#[path = "shared/csi_client.rs"]
mod csi_client;
mod docs_commands;
mod extender_manifests;
mod faults;
mod guest_lvm;
mod guest_lvmprov;
mod guest_nfs;
mod guest_nfs_provision;
mod guest_quota;
mod hostns;
mod hot_symbols;
mod install;
mod lints;
mod manifests;
mod manifests_render;
mod ops;
mod provisioner_env;
mod provisioner_health;
mod release;
mod root_csi;
mod root_csi_ephemeral;
mod root_hostpath;
mod security_policy;
mod util;
