//! One API call under a deadline, its failure typed ([`super::error::ApiError`]).

use super::error::{ApiError, ApiErrorKind, ApiResult};
use std::future::Future;
use std::time::Duration;

/// Deadline of every single API call (rule 5).
pub(crate) const DEADLINE: Duration = Duration::from_secs(30);

/// One API call under [`DEADLINE`], its failure as an [`ApiError`] (also for `flexvol controller`).
pub(crate) async fn call<T>(
    what: impl Into<String>,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> ApiResult<T> {
    let what = what.into();
    match tokio::time::timeout(DEADLINE, fut).await {
        Err(_) => Err(ApiError::new(
            what,
            ApiErrorKind::Timeout,
            format!(
                "no answer from the API server within {}s",
                DEADLINE.as_secs()
            ),
        )),
        Ok(Ok(v)) => Ok(v),
        Ok(Err(kube::Error::Api(e))) => {
            let kind = match (e.code, e.reason.as_str()) {
                (404, _) => ApiErrorKind::NotFound,
                (409, "AlreadyExists") => ApiErrorKind::AlreadyExists,
                (409, _) => ApiErrorKind::Conflict,
                _ => ApiErrorKind::Other,
            };
            let hint = if e.code == 403 {
                " (a missing RBAC rule: apply drivers/deploy/rbac.yaml)"
            } else {
                ""
            };
            Err(ApiError::new(what, kind, format!("{}{hint}", e.message)))
        }
        Ok(Err(e)) => Err(ApiError::new(what, ApiErrorKind::Other, e.to_string())),
    }
}
