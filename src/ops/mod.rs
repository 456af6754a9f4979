//! Commands for node operators (run as `flexvol <command>`), as opposed to the verbs kubelet runs.

pub(crate) mod conformance;
pub(crate) mod doctor;
pub(crate) mod gc;
pub mod install;
pub mod inventory;
pub(crate) mod migrate;
pub mod provisioned;
pub mod status;
pub mod uninstall;
