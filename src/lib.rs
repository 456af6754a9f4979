//! flexvol: a Kubernetes FlexVolume driver for hostPath, NFS and LVM volumes.
//!
//! Layout, by what a file is about:
//! - the protocol surface kubelet sees: [`protocol`] (argv grammar, options, the reply) and
//!   [`driver`] (one call, top to bottom);
//! - the backends: [`backend`] (`hostpath`, `nfs`, `lvm`);
//! - system seams: [`sys`] (running programs, mount syscalls, mountinfo, locks, paths, our own
//!   process) and node bookkeeping in [`node`] (config, state records, call log);
//! - commands for people: [`cli`] and [`ops`].

pub mod backend;
pub mod cli;
pub mod driver;
pub mod error;
pub mod node;
pub mod ops;
pub mod protocol;
pub mod provision;
pub mod sys;
