//! Commands for node operators (run as `flexvol <command>`), as opposed to the verbs kubelet runs.

pub mod conformance;
pub mod doctor;
pub mod gc;
pub mod install;
pub mod inventory;
pub mod provisioned;
pub mod status;
pub(crate) mod uninstall;
