//! LVM: attachable logical volumes, formatted only when provably blank, resizable.
//!
//! Not built yet (issue #4): every verb it will support fails (never "Not supported", which
//! kubelet would cache).

use crate::backend::{Backend, Context};
use crate::error::{Error, Result};
use crate::protocol::reply::Reply;
use crate::protocol::verb::Call;
use serde::Deserialize;

/// Node policy for LVM (`"lvm"` in the config file).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct LvmConfig {}

/// Answers the LVM verbs.
pub fn handle(_call: &Call, _ctx: &Context) -> Result<Reply> {
    Err(Error::NotBuilt {
        backend: Backend::Lvm.name(),
        version: env!("CARGO_PKG_VERSION"),
    })
}
