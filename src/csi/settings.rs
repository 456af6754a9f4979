//! What the CSI services share: the settings fixed at start-up and the gRPC status of a backend
//! error. A leaf of `csi`: it imports none of the services.

use crate::error::Error;
use std::path::PathBuf;

/// The `target` of this command's log lines.
pub(crate) const LOG_TARGET: &str = "flexvol_csi";

/// What the services answer with, fixed at start-up.
pub(crate) struct Settings {
    pub(crate) driver_name: String,
    pub(crate) node_name: String,
    pub(crate) kubelet_root: PathBuf,
    pub(crate) kubelet_endpoint: PathBuf,
    /// The topology key NodeGetInfo reports (`--topology-key`); none by default.
    pub(crate) topology_key: Option<String>,
    pub(crate) kind: Kind,
}

/// The kind of volume a plugin serves (`--kind`): which backend its calls run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// Host directories: the FlexVolume `hostpath` driver's backend.
    Hostpath,
    /// NFS exports: the FlexVolume `nfs` driver's backend.
    Nfs,
    /// LVM logical volumes, staged (activated, formatted when blank, mounted) and then bound
    /// into pods: the FlexVolume `lvm` driver's backend.
    Lvm,
}

impl Kind {
    /// The backend's name (`hostpath`, `nfs`), as in `flexvol~<name>`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Hostpath => "hostpath",
            Kind::Nfs => "nfs",
            Kind::Lvm => "lvm",
        }
    }
}

/// The gRPC status for a backend error: bad options are INVALID_ARGUMENT, a directory that holds
/// something else (or this volume with another access) ALREADY_EXISTS, the volume's lock busy
/// ABORTED (CSI: an operation is pending for the volume), a bound of the node's reached
/// RESOURCE_EXHAUSTED, a refusal by the node's policy or state
/// FAILED_PRECONDITION, a system error INTERNAL. The message is the one the FlexVolume reply
/// carries (it never holds a secret: docs/security.md).
pub(crate) fn status_of(e: &Error) -> tonic::Status {
    use tonic::Status;
    let m = e.to_string();
    match e {
        Error::Options(_) => Status::invalid_argument(m),
        Error::Occupied(_) => Status::already_exists(m),
        Error::Exhausted(_) => Status::resource_exhausted(m),
        Error::Lock(_) => Status::aborted(m),
        Error::Refused(_) => Status::failed_precondition(m),
        Error::Exec(_) | Error::Mount(_) | Error::State(_) | Error::Io { .. } => {
            Status::internal(m)
        }
    }
}
