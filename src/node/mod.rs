//! Node-local bookkeeping shared by every backend: the config file, durable volume records and
//! the per-call log.

pub mod calllog;
pub mod capability;
pub mod config;
pub mod state;
