//! Node-local bookkeeping shared by every backend: the config file (with local-path's provisioning
//! roots), durable volume records, capabilities and the per-call log.

pub(crate) mod calllog;
pub mod capability;
pub mod config;
pub mod localpath;
pub mod state;
