//! What an API call can fail with, typed so that callers branch on the kind (a 404 on delete
//! is success to the provisioner, a 409 is "read again").

/// What went wrong talking to the API server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {message}")]
pub(crate) struct ApiError {
    /// The operation (`create PersistentVolume pvc-…`).
    pub(crate) what: String,
    /// Kind of failure.
    pub kind: ApiErrorKind,
    /// The server's message, or the transport error.
    pub(crate) message: String,
}

/// Kinds of failure the provisioner acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ApiErrorKind {
    /// 404.
    NotFound,
    /// 409 on create.
    AlreadyExists,
    /// 409 on update (stale resourceVersion).
    Conflict,
    /// Deadline passed.
    Timeout,
    /// Anything else (403 included: a missing RBAC rule shows here).
    Other,
}

impl ApiError {
    /// An error of `kind` for `what`.
    pub fn new(what: impl Into<String>, kind: ApiErrorKind, message: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            kind,
            message: message.into(),
        }
    }
}

/// Result of the API calls.
pub(crate) type ApiResult<T> = Result<T, ApiError>;
