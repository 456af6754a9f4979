//! The error every verb returns. Its `Display` is the `message` of the Failure reply, so each
//! variant says what went wrong, where, and (when there is one) what the operator can do.
//!
//! Bad argv and a bad node config are not among them: the driver answers those itself, before a
//! backend runs (`driver.rs`), so this type depends on no config.

use crate::node::state::StateError;
use crate::protocol::options::OptionsError;
use crate::sys::exec::ExecError;
use crate::sys::lock::LockError;
use crate::sys::mount::MountError;
use std::path::PathBuf;

/// Any failure of a call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad options JSON or option value.
    #[error(transparent)]
    Options(#[from] OptionsError),
    /// An external tool failed.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// A mount syscall failed.
    #[error(transparent)]
    Mount(#[from] MountError),
    /// The volume lock could not be taken.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// State could not be read or written.
    #[error(transparent)]
    State(#[from] StateError),
    /// Input or node state that the driver refuses to act on; the text is the whole message.
    #[error("{0}")]
    Refused(String),
    /// The mount directory already holds something else: another volume, a mount flexvol did not
    /// make, files a bind would hide, or this volume with another access mode. Said like
    /// [`Error::Refused`]; typed because CSI answers it with its own code (ALREADY_EXISTS).
    #[error("{0}")]
    Occupied(String),
    /// A bound of the node's is reached (an inline ephemeral preset's count per namespace, its
    /// root's free space). Said like [`Error::Refused`]; typed because CSI answers it with its
    /// own code (RESOURCE_EXHAUSTED), which kubelet retries.
    #[error("{0}")]
    Exhausted(String),
    /// A filesystem operation on a named path failed.
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Error {
    /// Shorthand for [`Error::Refused`].
    pub fn refused(msg: impl Into<String>) -> Self {
        Error::Refused(msg.into())
    }

    /// Shorthand for [`Error::Occupied`].
    pub(crate) fn occupied(msg: impl Into<String>) -> Self {
        Error::Occupied(msg.into())
    }

    /// Shorthand for [`Error::Exhausted`].
    pub(crate) fn exhausted(msg: impl Into<String>) -> Self {
        Error::Exhausted(msg.into())
    }

    /// Shorthand for [`Error::Io`].
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            what,
            path: path.into(),
            source,
        }
    }
}

/// Result of a call.
pub(crate) type Result<T> = std::result::Result<T, Error>;
