//! The capacity record's wire format: what each node publishes in its ConfigMap of [`NAMESPACE`]
//! (written by `provision::capacity`, read by the scheduler extender and `flexvol status
//! --capacity`; docs/scheduler-extender.md), and the checks every reader applies to it (a record
//! is written by a node's credential, so the extender treats it as input, bounded and validated).

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The namespace that holds the per-node capacity ConfigMaps, and nothing else.
pub const NAMESPACE: &str = "flexvol-capacity";
/// The ConfigMap data key of the record.
pub(crate) const DATA_KEY: &str = "capacity.json";
/// The label on every capacity object: the controller creates them with it and deletes only
/// objects that carry it; the node's update (`provision::capacity::publish`) writes it back, since an update replaces
/// the whole object, labels included.
pub(crate) const LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub(crate) const LABEL_VALUE: &str = "flexvol-controller";
/// The only record version this build reads and writes.
pub(crate) const VERSION: u32 = 1;
/// A record longer than this is ignored unread (a real one is a few KiB).
pub(crate) const MAX_RECORD_BYTES: usize = 64 * 1024;
/// At most this many roots, volume groups, thin pools per VG, or classes per root.
pub(crate) const MAX_ITEMS: usize = 256;

/// What one node can still hold. Field names are the JSON's (camelCase).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityRecord {
    /// [`VERSION`].
    pub version: u32,
    /// The node it describes; must equal the ConfigMap's name.
    pub node: String,
    /// When the node measured it, seconds since the epoch by the node's clock (the extender
    /// also stamps when it received it and uses the older of the two, so a fast clock cannot
    /// keep a record fresh).
    pub(crate) published_at: u64,
    /// Classes that have a hostPath root list of their own on this node (local-path's
    /// `storageClassConfigs`); every other class uses the roots marked `default`.
    #[serde(default)]
    pub(crate) hostpath_classes: Vec<String>,
    /// The node's hostPath roots.
    #[serde(default)]
    pub(crate) hostpath: Vec<RootCapacity>,
    /// The volume groups the node's config grants (`lvm.allowedVolumeGroups`) that exist.
    #[serde(default)]
    pub lvm: Vec<VgCapacity>,
}

/// One hostPath root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RootCapacity {
    /// The root's path, as in the node config.
    pub(crate) path: String,
    /// Serves classes without a root list of their own (local-path's top-level map).
    #[serde(default)]
    pub(crate) default: bool,
    /// Classes (of `hostpathClasses`) whose root list names this root.
    #[serde(default)]
    pub(crate) classes: Vec<String>,
    /// The filesystem's size (`statvfs`).
    pub(crate) size: u64,
    /// Bytes available to unprivileged writers (`statvfs` `f_bavail`).
    pub(crate) available: u64,
    /// Where project quotas are enforced: the sum over this root's volumes of their limit minus
    /// their usage, i.e. space already promised to existing volumes. 0 where not enforced.
    #[serde(default)]
    pub(crate) promised: u64,
    /// Whether the root's filesystem enforces project quotas (sizes are then real).
    #[serde(default)]
    pub(crate) quota_enforced: bool,
    /// Set when the root could not be measured (the numbers are then 0 and mean nothing): the
    /// extender treats the classes it serves as unknown on this node, never as full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

impl RootCapacity {
    /// What a new volume may still take: available minus what is promised.
    pub(crate) fn allocatable(&self) -> u64 {
        self.available.saturating_sub(self.promised)
    }
}

/// One volume group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VgCapacity {
    /// The VG's name.
    pub name: String,
    /// `vg_size`.
    pub size: u64,
    /// `vg_free`.
    pub(crate) free: u64,
    /// The node's `lvm.vgReserve`: a thick LV must leave this free.
    #[serde(default)]
    pub(crate) reserve: u64,
    /// `vg_extent_size`: sizes are rounded up to it.
    pub(crate) extent_size: u64,
    /// The node's `lvm.maxVolumeSize`, if any.
    #[serde(default)]
    pub(crate) max_volume_size: Option<u64>,
    /// Its thin pools.
    #[serde(default)]
    pub(crate) thin_pools: Vec<ThinPoolCapacity>,
    /// Set when the VG could not be measured (numbers 0, meaningless): its classes are unknown
    /// on this node, never full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

impl VgCapacity {
    /// What a new thick LV may still take: free minus the reserve.
    pub(crate) fn allocatable(&self) -> u64 {
        self.free.saturating_sub(self.reserve)
    }
}

/// One thin pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ThinPoolCapacity {
    /// The pool LV's name.
    pub name: String,
    /// The pool's data size.
    pub(crate) size: u64,
    /// The virtual bytes its thin LVs may total: size × `lvm.thinOverprovisionRatio`.
    pub(crate) limit: u64,
    /// The virtual sizes of its thin LVs, summed.
    pub(crate) committed: u64,
}

impl ThinPoolCapacity {
    /// Virtual bytes a new thin LV may still take.
    pub(crate) fn allocatable(&self) -> u64 {
        self.limit.saturating_sub(self.committed)
    }
}

/// Why a capacity record is ignored (by the extender) or not published (by its node).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The ConfigMap has no [`DATA_KEY`].
    #[error("no key {DATA_KEY}")]
    Missing,
    /// The text is over [`MAX_RECORD_BYTES`].
    #[error("{len} bytes, more than the {MAX_RECORD_BYTES} a record may have")]
    TooLarge {
        /// Its length.
        len: usize,
    },
    /// The text is not a record's JSON (the parser's message).
    #[error("not a capacity record: {0}")]
    NotARecord(String),
    /// A record that cannot be true ([`validate`]): what is wrong with it.
    #[error("{0}")]
    Invalid(String),
}

fn unique<'a>(what: &str, names: impl Iterator<Item = &'a str>) -> Result<(), RecordError> {
    let mut seen = BTreeSet::new();
    for (i, n) in names.enumerate() {
        if i >= MAX_ITEMS {
            return Err(RecordError::Invalid(format!(
                "more than {MAX_ITEMS} {what}"
            )));
        }
        if n.is_empty() || n.len() > 4096 {
            return Err(RecordError::Invalid(format!(
                "a {what} name is empty or too long"
            )));
        }
        if !seen.insert(n) {
            return Err(RecordError::Invalid(format!(
                "{what} {n:?} is listed twice"
            )));
        }
    }
    Ok(())
}

/// Checks a record published as the ConfigMap `object_name`: the version, the node named as the
/// object, and numbers that can be true (nothing free beyond a size; names unique, bounded).
pub(crate) fn validate(r: &CapacityRecord, object_name: &str) -> Result<(), RecordError> {
    if r.version != VERSION {
        return Err(RecordError::Invalid(format!(
            "version {} (this build reads version {VERSION})",
            r.version
        )));
    }
    if r.node != object_name {
        return Err(RecordError::Invalid(format!(
            "it describes node {:?} but is published as {object_name:?}",
            r.node
        )));
    }
    unique("class", r.hostpath_classes.iter().map(String::as_str))?;
    unique("root", r.hostpath.iter().map(|x| x.path.as_str()))?;
    for root in &r.hostpath {
        if !root.path.starts_with('/') {
            return Err(RecordError::Invalid(format!(
                "root {:?} is not an absolute path",
                root.path
            )));
        }
        if root.available > root.size {
            return Err(RecordError::Invalid(format!(
                "root {}: {} bytes available of {}",
                root.path, root.available, root.size
            )));
        }
        if root.error.as_ref().is_some_and(|e| e.len() > 1024) {
            return Err(RecordError::Invalid(format!(
                "root {}: error text too long",
                root.path
            )));
        }
        unique("class of a root", root.classes.iter().map(String::as_str))?;
        if let Some(c) = root
            .classes
            .iter()
            .find(|c| !r.hostpath_classes.contains(c))
        {
            return Err(RecordError::Invalid(format!(
                "root {} names class {c:?}, which is not in hostpathClasses",
                root.path
            )));
        }
    }
    unique("volume group", r.lvm.iter().map(|v| v.name.as_str()))?;
    for vg in &r.lvm {
        if vg.free > vg.size {
            return Err(RecordError::Invalid(format!(
                "volume group {}: {} bytes free of {}",
                vg.name, vg.free, vg.size
            )));
        }
        if vg.error.as_ref().is_some_and(|e| e.len() > 1024) {
            return Err(RecordError::Invalid(format!(
                "volume group {}: error text too long",
                vg.name
            )));
        }
        if vg.extent_size == 0 && vg.error.is_none() {
            return Err(RecordError::Invalid(format!(
                "volume group {}: extent size 0",
                vg.name
            )));
        }
        unique("thin pool", vg.thin_pools.iter().map(|p| p.name.as_str()))?;
        if let Some(p) = vg.thin_pools.iter().find(|p| p.size > vg.size) {
            return Err(RecordError::Invalid(format!(
                "thin pool {}/{} is larger than its volume group",
                vg.name, p.name
            )));
        }
    }
    Ok(())
}

/// Reads the record in a capacity ConfigMap's data (`None`: the key is absent): bounded, parsed,
/// [`validate`]d. The error says why it is ignored.
pub fn parse(object_name: &str, data: Option<&str>) -> Result<CapacityRecord, RecordError> {
    let text = data.ok_or(RecordError::Missing)?;
    if text.len() > MAX_RECORD_BYTES {
        return Err(RecordError::TooLarge { len: text.len() });
    }
    let r: CapacityRecord =
        serde_json::from_str(text).map_err(|e| RecordError::NotARecord(e.to_string()))?;
    validate(&r, object_name)?;
    Ok(r)
}
