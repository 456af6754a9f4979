//! NFS: mount an export into the pod directory, safely when the server is dead.
//!
//! Not built yet (issue #5): `mount` and `unmount` fail so that kubelet does not cache a
//! "Not supported"; every other verb is permanently "Not supported" (not attachable, not resizable).

use crate::backend::{Backend, Context};
use crate::error::{Error, Result};
use crate::protocol::reply::Reply;
use crate::protocol::verb::Call;
use serde::Deserialize;

/// Node policy for NFS (`"nfs"` in the config file).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct NfsConfig {}

/// Answers the NFS verbs.
pub fn handle(call: &Call, _ctx: &Context) -> Result<Reply> {
    match call {
        Call::Mount { .. } | Call::Unmount { .. } => Err(Error::NotBuilt {
            backend: Backend::Nfs.name(),
            version: env!("CARGO_PKG_VERSION"),
        }),
        _ => Ok(Reply::not_supported()),
    }
}
