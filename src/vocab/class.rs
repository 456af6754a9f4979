//! StorageClass parameters that are not a kind's own: `flexvol controller`'s node-loss opt-in
//! ([`PARAM`]). Each kind's class validation removes them here, once ([`split_param`]), before its
//! own parser sees the rest, so that the controller's parameters are checked by the same rules on
//! every node and in the controller.

use std::collections::BTreeMap;
use std::time::Duration;

/// The class parameter that opts a node-local class in: how long a PV's node must have had no
/// Node object before its claim and PV are deleted.
pub(crate) const PARAM: &str = "nodeLossGracePeriod";
/// The shortest grace accepted. A grace shorter than a few minutes is for tests.
pub(crate) const MIN_GRACE: Duration = Duration::from_secs(10);
/// The longest grace accepted (a year).
pub(crate) const MAX_GRACE: Duration = Duration::from_secs(366 * 24 * 3600);

/// Why a class's [`PARAM`] is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum GraceError {
    /// The value is not a duration flexvol accepts (`why` says what is wrong with it).
    #[error(
        "class parameter {PARAM}={value:?} {why}; write a duration such as \"10m\", \"1h\" or \"1h30m\" (units h, m, s), at least {}s",
        MIN_GRACE.as_secs()
    )]
    BadDuration {
        /// The value as written in the class.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A shared kind's class (NFS) sets it: such a volume does not go when a node does.
    #[error(
        "class parameter {PARAM} is for node-local kinds (hostpath, lvm) only: a {kind} volume lives on its server, not on a node, and does not go when a node does; remove it from the class"
    )]
    SharedKind {
        /// The kind (`nfs`).
        kind: String,
    },
}

/// Parses a grace period as Go's durations are written, with the units `h`, `m` and `s` and
/// whole numbers (`90s`, `10m`, `1h30m`), between [`MIN_GRACE`] and [`MAX_GRACE`].
pub(crate) fn parse_grace(v: &str) -> Result<Duration, GraceError> {
    let bad = |why: &'static str| GraceError::BadDuration {
        value: v.to_owned(),
        why,
    };
    if v.is_empty() {
        return Err(bad("is empty"));
    }
    let mut total: u64 = 0;
    let mut digits = String::new();
    let mut last_unit = u64::MAX;
    for c in v.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return Err(bad("has a character that is not a digit or one of h, m, s")),
        };
        if digits.is_empty() {
            return Err(bad("has a unit without a number"));
        }
        if unit >= last_unit {
            return Err(bad("repeats a unit or gives them out of order"));
        }
        last_unit = unit;
        let n: u64 = digits.parse().map_err(|_| bad("is too large"))?;
        digits.clear();
        total = n
            .checked_mul(unit)
            .and_then(|x| total.checked_add(x))
            .ok_or_else(|| bad("is too large"))?;
    }
    if !digits.is_empty() {
        return Err(bad("ends in a number without a unit"));
    }
    let d = Duration::from_secs(total);
    if d < MIN_GRACE {
        return Err(bad("is too short"));
    }
    if d > MAX_GRACE {
        return Err(bad("is longer than a year"));
    }
    Ok(d)
}

/// For the node-local kinds' class validation: checks [`PARAM`] when present and returns the
/// other parameters (what the kind's own parser validates).
pub(crate) fn split_param(
    params: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, GraceError> {
    if let Some(v) = params.get(PARAM) {
        parse_grace(v)?;
    }
    Ok(params
        .iter()
        .filter(|(k, _)| k.as_str() != PARAM)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect())
}

/// For a shared kind's class validation (NFS): [`PARAM`] is an error that says why.
pub(crate) fn refuse_for_shared(
    params: &BTreeMap<String, String>,
    kind: &str,
) -> Result<(), GraceError> {
    if params.contains_key(PARAM) {
        return Err(GraceError::SharedKind {
            kind: kind.to_owned(),
        });
    }
    Ok(())
}
