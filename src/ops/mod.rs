//! Commands for node operators (run as `flexvol <command>`), as opposed to the verbs kubelet runs.

pub mod conformance;
pub mod install;
