//! What the provisioners' work can fail with, typed so the reconciler can branch on it: the
//! [`crate::provision::storage::Provisioner`] seam's `check_class`, `delete` and `expand`, and the
//! marked-directory library's ownership checks and deletes ([`crate::provision::storage::volumedir`]).
//!
//! The message (`Display`) is the text people read in events and logs, unchanged from when these
//! were plain strings; the variant says what kind of failure it is. A plain `String` converts to
//! [`ProvisionError::Failed`]: an untyped message is a step to retry, as every error was before.

/// Why a provisioner could not do what it was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProvisionError {
    /// A StorageClass's parameters are invalid (an unknown key, a bad value): only a fixed class
    /// helps.
    #[error("{0}")]
    InvalidClass(String),
    /// The volume, or the PV that describes it, is not provably ours for this PV (no record or
    /// marker naming it, another claim's, a mount or another volume inside it, a PV missing what
    /// was recorded at creation): it is left alone for a person; retrying changes nothing until
    /// they act.
    #[error("{0}")]
    Refused(String),
    /// The volume is not where its PV says (for a resize: nothing to grow).
    #[error("{0}")]
    NotFound(String),
    /// A step failed (a tool, a mount, the filesystem, a racing instance): the next pass tries
    /// again.
    #[error("{0}")]
    Failed(String),
    /// The backend's server did not answer or failed (mounting or unmounting an NFS export failed
    /// or timed out): as [`ProvisionError::Failed`], and it opens the breaker of the volume's
    /// fault domain ([`crate::k8s::queue::Breakers`]). Made only where the server is asked, never
    /// from a message.
    #[error("{0}")]
    Unavailable(String),
}

/// Why a StorageClass's parameters are invalid (an unknown key, a bad value, a missing one): the
/// hostPath, LVM and NFS parameter parsers' error, which the scheduler extender and the
/// provisioner share ([`crate::provision::storage::plan_claim`]). Only a fixed class helps. The
/// message names the parameter and may quote its value: a StorageClass is readable by every
/// user of the cluster, so what it holds is not a secret (no class parameter is a credential).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ClassError(pub(crate) String);

/// A bad `nodeLossGracePeriod` (or one in a shared kind's class) is an invalid class.
impl From<crate::vocab::class::ParamError> for ClassError {
    fn from(e: crate::vocab::class::ParamError) -> Self {
        Self(e.to_string())
    }
}

/// An invalid class is [`ProvisionError::InvalidClass`].
impl From<ClassError> for ProvisionError {
    fn from(e: ClassError) -> Self {
        Self::InvalidClass(e.0)
    }
}

/// A PV that is not as flexvol makes its own (a field missing, a name or value that cannot be
/// what flexvol wrote): nothing is done for or to it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct MalformedPv(pub(crate) String);

/// A malformed PV is [`ProvisionError::Refused`]: left alone for a person.
impl From<MalformedPv> for ProvisionError {
    fn from(e: MalformedPv) -> Self {
        Self::Refused(e.0)
    }
}

impl From<String> for ProvisionError {
    fn from(why: String) -> Self {
        Self::Failed(why)
    }
}

impl From<&str> for ProvisionError {
    fn from(why: &str) -> Self {
        Self::Failed(why.to_owned())
    }
}

impl ProvisionError {
    /// The same kind of error with `f` applied to its message (context added, paths relabelled).
    pub(crate) fn map(self, f: impl FnOnce(String) -> String) -> Self {
        match self {
            Self::InvalidClass(m) => Self::InvalidClass(f(m)),
            Self::Refused(m) => Self::Refused(f(m)),
            Self::NotFound(m) => Self::NotFound(f(m)),
            Self::Failed(m) => Self::Failed(f(m)),
            Self::Unavailable(m) => Self::Unavailable(f(m)),
        }
    }

    /// The message of a failure that is the server's ([`ProvisionError::Unavailable`]): what
    /// opens its breaker. `None` for every other kind, whatever its message says.
    pub(crate) fn server_failure(&self) -> Option<&str> {
        match self {
            Self::Unavailable(m) => Some(m),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_is_the_text_and_context_keeps_the_kind() {
        let e = ProvisionError::Refused("x is not ours".into());
        assert_eq!(e.to_string(), "x is not ours");
        assert_eq!(
            e.map(|m| format!("srv:/e: {m}")),
            ProvisionError::Refused("srv:/e: x is not ours".into())
        );
        assert_eq!(
            ProvisionError::from("a tool failed".to_owned()),
            ProvisionError::Failed("a tool failed".into())
        );
    }

    /// A bad class is the kind only a fixed class helps, a malformed PV one left alone for a
    /// person; the messages are the text as it was.
    #[test]
    fn a_class_error_is_invalid_and_a_malformed_pv_refused() {
        let e = ProvisionError::from(ClassError("class parameter x is missing".into()));
        assert_eq!(
            e,
            ProvisionError::InvalidClass("class parameter x is missing".into())
        );
        let e = ProvisionError::from(MalformedPv("it has no spec".into()));
        assert_eq!(e, ProvisionError::Refused("it has no spec".into()));
        let grace = crate::vocab::class::ParamError::SharedKind { kind: "nfs".into() };
        assert_eq!(
            ClassError::from(grace.clone()).to_string(),
            grace.to_string()
        );
    }

    #[test]
    fn only_the_typed_server_failure_is_the_servers() {
        // A step failure that reads like a dead server is still not the server's: the kind
        // decides, never the words.
        let words = "NFS server 192.0.2.1 is unreachable: mount timed out; cannot mount";
        for e in [
            ProvisionError::Failed(words.into()),
            ProvisionError::Refused(words.into()),
            ProvisionError::NotFound(words.into()),
            ProvisionError::InvalidClass(words.into()),
            ProvisionError::from(words),
        ] {
            assert_eq!(e.server_failure(), None, "{e:?}");
        }
        let e = ProvisionError::Unavailable("no answer".into());
        assert_eq!(e.server_failure(), Some("no answer"));
        assert_eq!(
            e.map(|m| format!("srv:/e: {m}")).server_failure(),
            Some("srv:/e: no answer")
        );
    }
}
