//! What `lvm` reports: the rows of its JSON reports (`lvs`, `vgs`), and what an LV's attributes
//! and tags say. Data only: the reports are run by the LV service ([`super::lvs`]) and judged by
//! the policy (`policy.rs`), and imports neither: the policy, which the node config
//! composes, stays clear of the verbs' `Context`.

use serde::Deserialize;

fn u64_str<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty() {
        return Ok(0);
    }
    s.parse().map_err(serde::de::Error::custom)
}

/// One row of `lvs`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct LvRow {
    /// VG name.
    pub vg_name: String,
    /// LV name.
    pub(crate) lv_name: String,
    /// `/dev/<vg>/<lv>`.
    #[serde(default)]
    pub(crate) lv_path: String,
    /// Size in bytes.
    #[serde(deserialize_with = "u64_str")]
    pub(crate) lv_size: u64,
    /// The 10-character attribute string (`-wi-a-----`, `Vwi-a-tz--`, `twi-aotz--`).
    pub(crate) lv_attr: String,
    /// Comma-separated tags.
    #[serde(default)]
    pub(crate) lv_tags: String,
    /// Thin pool of a thin LV.
    #[serde(default)]
    pub(crate) pool_lv: String,
    /// VG extent size in bytes.
    #[serde(deserialize_with = "u64_str")]
    pub(crate) vg_extent_size: u64,
    /// VG free bytes.
    #[serde(deserialize_with = "u64_str")]
    pub(crate) vg_free: u64,
}

impl LvRow {
    fn attr(&self, i: usize) -> char {
        self.lv_attr.chars().nth(i).unwrap_or('?')
    }
    /// Active (attr[4] == 'a').
    pub(crate) fn active(&self) -> bool {
        self.attr(4) == 'a'
    }
    /// A thin pool (attr[0] == 't').
    pub(crate) fn is_thin_pool(&self) -> bool {
        self.attr(0) == 't'
    }
    /// Its device is open (attr[5] == 'o'): mounted, or held by some process or device.
    pub(crate) fn open(&self) -> bool {
        self.attr(5) == 'o'
    }
    /// A thin LV (attr[0] == 'V'): allocates from its pool, not from the VG's free space.
    pub(crate) fn is_thin(&self) -> bool {
        self.attr(0) == 'V'
    }
    /// Whether this LV can hold a filesystem: not a pool, an internal image, a log or a virtual LV.
    pub(crate) fn usable(&self) -> bool {
        !"teiIlvdDp".contains(self.attr(0))
    }
    /// Whether the LV carries `tag`.
    pub(crate) fn has_tag(&self, tag: &str) -> bool {
        self.lv_tags.split(',').any(|t| t == tag)
    }
}

/// One row of `vgs`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct VgRow {
    /// VG name.
    pub vg_name: String,
    /// Extent size in bytes.
    #[serde(deserialize_with = "u64_str")]
    pub(crate) vg_extent_size: u64,
    /// Free bytes.
    #[serde(deserialize_with = "u64_str")]
    pub(crate) vg_free: u64,
    /// Size in bytes (0 when the report lacks the column).
    #[serde(default, deserialize_with = "u64_str")]
    pub(crate) vg_size: u64,
}

#[derive(Debug, Deserialize)]
struct Report {
    report: Vec<Section>,
}

#[derive(Debug, Deserialize)]
struct Section {
    #[serde(default)]
    lv: Vec<LvRow>,
    #[serde(default)]
    vg: Vec<VgRow>,
}

/// The rows of an `lvm lvs`/`vgs` JSON report (`--reportformat json`).
pub fn parse(stdout: &[u8]) -> serde_json::Result<(Vec<LvRow>, Vec<VgRow>)> {
    let r: Report = serde_json::from_slice(stdout)?;
    let mut lvs = Vec::new();
    let mut vgs = Vec::new();
    for s in r.report {
        lvs.extend(s.lv);
        vgs.extend(s.vg);
    }
    Ok((lvs, vgs))
}
