//! StorageClass parameters that are not a kind's own: `flexvol controller`'s node-loss opt-in
//! ([`PARAM`]) and the volume API of the PVs the class gets ([`CSI_DRIVER`]). Each kind's class
//! validation removes them here, once ([`split_param`], [`split_shared`]), before its own parser
//! sees the rest, so that they are checked by the same rules on every node, in the scheduler
//! extender and in the controller.

use std::collections::BTreeMap;
use std::time::Duration;

/// The class parameter that opts a node-local class in: how long a PV's node must have had no
/// Node object before its claim and PV are deleted.
pub(crate) const PARAM: &str = "nodeLossGracePeriod";
/// The class parameter that makes the provisioner write CSI PVs (`spec.csi`, served by `flexvol
/// csi` under this driver name, e.g. `hostpath.csi.flexvol.io`) instead of flexVolume PVs.
pub(crate) const CSI_DRIVER: &str = "csiDriver";
/// The longest CSI driver name (the CSI spec's 63 characters).
const MAX_CSI_DRIVER: usize = 63;
/// The shortest grace accepted. A grace shorter than a few minutes is for tests.
pub(crate) const MIN_GRACE: Duration = Duration::from_secs(10);
/// The longest grace accepted (a year).
pub(crate) const MAX_GRACE: Duration = Duration::from_secs(366 * 24 * 3600);

/// Why a class's [`PARAM`] is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ParamError {
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
    /// [`CSI_DRIVER`] is not a CSI driver name (a DNS name of at most 63 characters).
    #[error(
        "class parameter {CSI_DRIVER} is not a CSI driver name: write the name `flexvol csi --driver-name` registers (lowercase letters, digits, '-' and '.', at most {MAX_CSI_DRIVER} characters, starting and ending with a letter or digit), e.g. hostpath.csi.flexvol.io, or remove it for flexVolume PVs"
    )]
    BadCsiDriver,
}

/// The CSI driver a class's PVs are for ([`CSI_DRIVER`]), `None` for flexVolume PVs. The name is
/// never echoed in the error (a class is an admin's, but its values end up in events).
pub(crate) fn csi_driver(params: &BTreeMap<String, String>) -> Result<Option<&str>, ParamError> {
    let Some(v) = params.get(CSI_DRIVER) else {
        return Ok(None);
    };
    let b = v.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.';
    let edge = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if b.len() > MAX_CSI_DRIVER || !edge(b.first()) || !edge(b.last()) || !b.iter().all(inner) {
        return Err(ParamError::BadCsiDriver);
    }
    Ok(Some(v))
}

/// Parses a grace period as Go's durations are written, with the units `h`, `m` and `s` and
/// whole numbers (`90s`, `10m`, `1h30m`), between [`MIN_GRACE`] and [`MAX_GRACE`].
pub(crate) fn parse_grace(v: &str) -> Result<Duration, ParamError> {
    let bad = |why: &'static str| ParamError::BadDuration {
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

/// For the node-local kinds' class validation: checks [`PARAM`] and [`CSI_DRIVER`] when present
/// and returns the other parameters (what the kind's own parser validates).
pub(crate) fn split_param(
    params: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, ParamError> {
    if let Some(v) = params.get(PARAM) {
        parse_grace(v)?;
    }
    csi_driver(params)?;
    Ok(rest(params))
}

/// For a shared kind's class validation (NFS): [`PARAM`] is an error that says why;
/// [`CSI_DRIVER`] is checked. Returns the other parameters.
pub(crate) fn split_shared(
    params: &BTreeMap<String, String>,
    kind: &str,
) -> Result<BTreeMap<String, String>, ParamError> {
    if params.contains_key(PARAM) {
        return Err(ParamError::SharedKind {
            kind: kind.to_owned(),
        });
    }
    csi_driver(params)?;
    Ok(rest(params))
}

/// `params` without the ones this module owns.
fn rest(params: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    params
        .iter()
        .filter(|(k, _)| k.as_str() != PARAM && k.as_str() != CSI_DRIVER)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn csi_driver_names_are_dns_names_and_never_echoed() {
        for ok in [
            "hostpath.csi.flexvol.io",
            "lvm.csi.example.com",
            "a",
            "x-1.y",
        ] {
            assert_eq!(csi_driver(&params(&[(CSI_DRIVER, ok)])), Ok(Some(ok)));
        }
        let long = "a".repeat(MAX_CSI_DRIVER + 1);
        for bad in [
            "",
            "Upper.csi.io",
            "-lead.io",
            "trail.io.",
            "a/b",
            "a b",
            "../x",
            "x\0y",
            long.as_str(),
        ] {
            let e = csi_driver(&params(&[(CSI_DRIVER, bad)])).unwrap_err();
            assert_eq!(e, ParamError::BadCsiDriver);
            if !bad.is_empty() {
                assert!(!e.to_string().contains(bad), "{e}");
            }
        }
        assert_eq!(csi_driver(&params(&[])), Ok(None));
    }

    #[test]
    fn both_splits_remove_and_check_the_parameters_of_this_module() {
        let p = params(&[
            (CSI_DRIVER, "hostpath.csi.flexvol.io"),
            (PARAM, "10m"),
            ("uid", "1000"),
        ]);
        assert_eq!(split_param(&p).unwrap(), params(&[("uid", "1000")]));
        let shared = params(&[(CSI_DRIVER, "nfs.csi.flexvol.io"), ("server", "s")]);
        assert_eq!(
            split_shared(&shared, "nfs").unwrap(),
            params(&[("server", "s")])
        );
        let bad = params(&[(CSI_DRIVER, "Bad")]);
        assert_eq!(split_param(&bad), Err(ParamError::BadCsiDriver));
        assert_eq!(split_shared(&bad, "nfs"), Err(ParamError::BadCsiDriver));
    }
}
