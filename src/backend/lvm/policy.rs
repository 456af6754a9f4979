//! Which LVs a volume may use, and how much it may allocate: the node policy (`"lvm"` in the
//! config file) and the "in use by the host" check.
//!
//! Options are hostile: a PV author, or a pod author with an inline `flexVolume`, names any VG and
//! LV. Without a policy they could take the node's root LV (activate, mount read-write) or fill a
//! VG. So:
//!
//! - **Which LVs.** An LV may be used when its VG is listed in `allowedVolumeGroups`, or when it
//!   carries [`TAG_CREATED`] (flexvol made it) or [`TAG_ALLOWED`] (an administrator granted it).
//!   The default list is empty: only tagged LVs, nothing created. Creation (`size`) needs the VG
//!   in the list. A refusal reads the same whether or not the LV exists, so it cannot be used to
//!   probe LV names.
//! - **Whose LV.** An LV the provisioner made carries `flexvol.pv.<pv>` ([`TAG_PV_PREFIX`]); it is
//!   served only through [`crate::node::capability::authorize`] ([`check_capability`]): the
//!   call's `capabilityToken` must be the node key's token for that PV and `<vg>/<lv>` (the
//!   provisioner puts it in the PV's options), or, for an LV made before tokens, a legacy grant
//!   must name that PV (and, in `mount`, the pod's namespace). kubelet's `pvOrVolumeName` must
//!   name the tagged PV too. So an inline volume naming a claim's VG and LV gets nothing, though
//!   the LV passes the first rule by its `flexvol.created` tag.
//! - **Not the host's.** Even an allowed LV is refused while the host uses it: its device is
//!   mounted anywhere but in kubelet's directories of this driver (a global mount
//!   `.../plugins/kubernetes.io/flexvolume/<vendor>/<driver>/mounts/<name>`, a pod volume
//!   `.../pods/<uid>/volumes/<vendor>~<driver>/<name>` or a subPath bind
//!   `.../pods/<uid>/volume-subpaths/<name>/<container>/<n>`), it is active swap, another device
//!   is stacked on it (`holders` in sysfs: dm-crypt, a PV of an active VG, ...), or it is open
//!   (`lv_attr` "o") while not mounted by kubelet at all. A mount explains the open count, which
//!   is how a volume that kubelet mounted for one pod is attached again for another.
//! - **How much.** `maxVolumeSize` caps `size` and growth; `vgReserve` is left free in a VG by
//!   every thick creation and growth (thin LVs allocate from their pool).
//!
//! Callers: `waitforattach` checks both before activating or creating and before answering for an
//! active LV (one `lvs` report it runs anyway); `mountdevice` checks host use (without the open
//! flag) before probing, and the policy and the open flag before mkfs, from the `lvs` it runs
//! there anyway (kubelet always runs `waitforattach` first for the same spec, so the existing-
//! filesystem path needs no extra `lvs`); `expandfs` checks both before `lvextend`.
//!
//! The capability check rides on the same reports: `waitforattach` and `expandfs` judge the row
//! they read, `mountdevice` the row of its mkfs path. A call that carries a token is judged by the
//! token alone wherever no row is at hand (`mountdevice` of an existing filesystem, `mount`: one
//! HMAC, no LVM command). A call without a token costs `mount` one `lvs` (it binds the LV into the
//! pod, and only `mount` knows the pod's namespace, which a legacy grant names); `mountdevice` of
//! an existing filesystem does not repeat the check for it: kubelet ran `waitforattach` with the
//! same options just before, and the global mount it makes reaches no pod except through `mount`.
//! `attach` runs in kube-controller-manager, has no key and checks nothing (it touches nothing).
//!
//! Limitation: LVM reports whether a device is open, not how often; an LV that kubelet mounted
//! and that some process also holds open raw is not detected.

use super::devices::Devices;
use super::options::{LvmOptions, check_name, parse_size};
use super::report::LvRow;
use crate::error::{Error, Result};
use crate::sys::mountinfo::MountTable;
use serde::Deserialize;
use std::path::{Component, Path};

/// Tag on LVs this driver created.
pub(crate) const TAG_CREATED: &str = "flexvol.created";
/// Tag an administrator puts on an LV to let flexvol volumes use it outside an allowed VG.
pub(crate) const TAG_ALLOWED: &str = "flexvol.allowed";
/// Prefix of the tag naming the PV the provisioner made an LV for (`flexvol.pv.<pv>`).
pub(crate) const TAG_PV_PREFIX: &str = "flexvol.pv.";
/// What a missing node key's message says.
const NODE_KEY_FIX: &str = "flexvol provisioner creates it on this node when it makes an LV; a volume carrying a capabilityToken was made by it here, so the state directory (stateDir) may have been wiped or the volume belongs to another node";

/// Node policy for LVM (`"lvm"` in the config file).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct LvmConfig {
    /// How long `waitforattach` waits for `/dev/<vg>/<lv>` after activation.
    pub device_wait_seconds: u64,
    /// VGs whose LVs volumes may use and create. Empty: only tagged LVs, no creation.
    #[serde(deserialize_with = "vg_names")]
    pub allowed_volume_groups: Vec<String>,
    /// Largest size a volume may be created with or grown to, in bytes; `None`: no cap beyond
    /// the VG's free space.
    #[serde(deserialize_with = "opt_quantity")]
    pub(crate) max_volume_size: Option<u64>,
    /// Bytes of every VG that thick creations and growths leave free.
    #[serde(deserialize_with = "quantity")]
    pub(crate) vg_reserve: u64,
    /// The provisioner's limit on thin pools: the virtual sizes of all thin LVs in a pool may
    /// add up to at most this multiple of the pool's size. `1.0` (the default) allows no
    /// overcommitment at all: a pool can never run full by writes to provisioned volumes alone.
    /// In thousandths (`1000` is 1.0).
    #[serde(deserialize_with = "ratio", rename = "thinOverprovisionRatio")]
    pub thin_overprovision_permille: u64,
}

impl Default for LvmConfig {
    fn default() -> Self {
        Self {
            device_wait_seconds: 10,
            allowed_volume_groups: Vec::new(),
            max_volume_size: None,
            vg_reserve: 0,
            thin_overprovision_permille: 1000,
        }
    }
}

fn vg_names<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<String>, D::Error> {
    let v = Vec::<String>::deserialize(d)?;
    for n in &v {
        check_name("lvm.allowedVolumeGroups", n, false).map_err(serde::de::Error::custom)?;
    }
    Ok(v)
}

/// The range `lvm.thinOverprovisionRatio` accepts, in thousandths.
pub(crate) const THIN_RATIO_RANGE: (u64, u64) = (100, 100_000);

/// `lvm.thinOverprovisionRatio`: a JSON number with at most three decimals (`1`, `2.5`, `1.125`)
/// between 0.1 and 100, kept in thousandths so the limit is computed in integers.
fn ratio<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    let text = n.to_string();
    let bad = || {
        serde::de::Error::custom(format!(
            "lvm.thinOverprovisionRatio must be a number between 0.1 and 100 with at most three decimals (1: no overcommitment), got {text}"
        ))
    };
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || int.len() > 4 || frac.len() > 3 || !digits(int) || !digits(frac) {
        return Err(bad());
    }
    let int: u64 = int.parse().map_err(|_| bad())?;
    let frac: u64 = format!("{frac:0<3}").parse().map_err(|_| bad())?;
    let permille = int * 1000 + frac;
    let (lo, hi) = THIN_RATIO_RANGE;
    if !(lo..=hi).contains(&permille) {
        return Err(bad());
    }
    Ok(permille)
}

/// A ratio in thousandths, as written in the config (`2.5`).
pub(crate) fn show_ratio(permille: u64) -> String {
    let s = format!("{}.{:03}", permille / 1000, permille % 1000);
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn parse_quantity<E: serde::de::Error>(s: &str) -> std::result::Result<u64, E> {
    if s == "0" {
        return Ok(0);
    }
    parse_size(s).map_err(|r| E::custom(format!("size {s:?}: {r}")))
}

fn quantity<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    parse_quantity(&String::deserialize(d)?)
}

fn opt_quantity<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<u64>, D::Error> {
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(s) => parse_quantity(&s).map(|n| (n > 0).then_some(n)),
    }
}

impl LvmConfig {
    /// Whether `vg` is in `allowedVolumeGroups`.
    pub(crate) fn vg_allowed(&self, vg: &str) -> bool {
        self.allowed_volume_groups.iter().any(|v| v == vg)
    }
}

fn not_available(o: &LvmOptions) -> Error {
    Error::refused(format!(
        "{} is not available to flexvol volumes on this node: volume group {} is not in the node config's lvm.allowedVolumeGroups, and there is no LV {} tagged {TAG_CREATED} or {TAG_ALLOWED}. An administrator allows one LV with `lvchange --addtag {TAG_ALLOWED} {}`, or a whole VG (and creating LVs in it) with lvm.allowedVolumeGroups (see drivers/lvm/README.md)",
        o.key(),
        o.vg,
        o.key(),
        o.key()
    ))
}

/// May a volume use the existing LV `lv` (or, with `None`, create `o`'s LV)?
pub(crate) fn check_allowed(cfg: &LvmConfig, o: &LvmOptions, lv: Option<&LvRow>) -> Result<()> {
    if cfg.vg_allowed(&o.vg) {
        return Ok(());
    }
    match lv {
        Some(lv) if lv.has_tag(TAG_CREATED) || lv.has_tag(TAG_ALLOWED) => Ok(()),
        _ => Err(not_available(o)),
    }
}

/// The PVs an LV's `flexvol.pv.<pv>` tags name (the provisioner writes exactly one).
pub(crate) fn provisioned_for(lv: &LvRow) -> Vec<&str> {
    lv.lv_tags
        .split(',')
        .filter_map(|t| t.strip_prefix(TAG_PV_PREFIX))
        .collect()
}

/// May this call use an LV the provisioner made (module doc, "Whose LV")? `row` is the LV's
/// `lvs` row; `None` when the LV does not exist, or when the caller has no row and the call
/// carries a token (a token alone decides: it is valid only for the PV the provisioner tagged
/// the LV for). `namespace` is kubelet's pod namespace, `mount` only.
pub(crate) fn check_capability(
    state_dir: &Path,
    o: &LvmOptions,
    row: Option<&LvRow>,
    namespace: Option<&str>,
) -> Result<()> {
    use crate::node::capability::{Key, Location, authorize, node_key_path};
    let token = o.token.as_ref().map(|t| t.0.as_str());
    let owners = row.map(provisioned_for).unwrap_or_default();
    let pv = match owners.as_slice() {
        [] if token.is_none() => return Ok(()),
        [] => o.volume_name.as_deref(),
        [pv] => {
            if let Some(name) = o.volume_name.as_deref()
                && name != *pv
            {
                return Err(Error::refused(format!(
                    "LV {} is a volume made by flexvol provisioner and is served only to the PV it was made for, not to {name:?}; use the PersistentVolumeClaim, not an inline volume",
                    o.key()
                )));
            }
            Some(*pv)
        }
        _ => {
            return Err(Error::refused(format!(
                "LV {} carries more than one {TAG_PV_PREFIX}<pv> tag, so flexvol cannot tell which PV it belongs to; an administrator removes the wrong one with `lvchange --deltag`",
                o.key()
            )));
        }
    };
    let key = Key::load(&node_key_path(state_dir), NODE_KEY_FIX);
    authorize(
        key.as_ref(),
        state_dir,
        &Location::Lvm {
            vg: &o.vg,
            lv: &o.lv,
        },
        pv,
        namespace,
        token,
    )
    .map(|_| ())
    .map_err(Error::refused)
}

/// Checks a size against `maxVolumeSize`.
pub(crate) fn check_max_size(cfg: &LvmConfig, o: &LvmOptions, bytes: u64) -> Result<()> {
    match cfg.max_volume_size {
        Some(max) if bytes > max => Err(Error::refused(format!(
            "{} would be {bytes} bytes, more than this node's lvm.maxVolumeSize of {max} bytes; ask for less",
            o.key()
        ))),
        _ => Ok(()),
    }
}

/// Checks that allocating `needed` more bytes in a VG with `free` bytes leaves `vgReserve` free.
pub(crate) fn check_free(cfg: &LvmConfig, o: &LvmOptions, needed: u64, free: u64) -> Result<()> {
    let usable = free.saturating_sub(cfg.vg_reserve);
    if needed > usable {
        return Err(Error::refused(format!(
            "volume group {} has {free} bytes free{}, but {} needs {needed} bytes (rounded up to whole extents); free space in the VG or ask for less",
            o.vg,
            if cfg.vg_reserve > 0 {
                format!(
                    " of which {} are reserved for the node (lvm.vgReserve)",
                    cfg.vg_reserve.min(free)
                )
            } else {
                String::new()
            },
            o.key()
        )));
    }
    Ok(())
}

/// Whether `p` is one of kubelet's mount points of driver `driver_name`: a global device mount
/// (staging path), a pod volume or a subPath bind. A FlexVolume driver is named
/// `<vendor>/<driver>`; a name without `/` is a CSI driver's (`flexvol csi`), whose staging paths
/// are `.../plugins/kubernetes.io/csi/pv/<pv>/globalmount` (kubelet before 1.25) or
/// `.../plugins/kubernetes.io/csi/<driver>/<hash>/globalmount`, and pod volumes
/// `.../pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`. Mounts of the other front are not
/// kubelet's for this driver: an LV a FlexVolume pod uses is in use for the CSI plugin, and the
/// other way round.
pub(crate) fn kubelet_owned(driver_name: &str, p: &Path) -> bool {
    let c: Vec<&str> = p
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect();
    let n = c.len();
    let sub_path = n >= 6 && c[n - 6] == "pods" && c[n - 4] == "volume-subpaths";
    let Some((vendor, driver)) = driver_name.split_once('/') else {
        let staging = n >= 6
            && c[n - 6..n - 3] == ["plugins", "kubernetes.io", "csi"]
            && (c[n - 3] == "pv" || c[n - 3] == driver_name)
            && c[n - 1] == "globalmount";
        let pod_volume = n >= 6
            && c[n - 6] == "pods"
            && c[n - 4] == "volumes"
            && c[n - 3] == "kubernetes.io~csi"
            && c[n - 1] == "mount";
        return !driver_name.is_empty() && (staging || pod_volume || sub_path);
    };
    let global = n >= 7
        && c[n - 7..n - 1]
            == [
                "plugins",
                "kubernetes.io",
                "flexvolume",
                vendor,
                driver,
                "mounts",
            ];
    let pod_volume = n >= 5
        && c[n - 5] == "pods"
        && c[n - 3] == "volumes"
        && c[n - 2] == format!("{vendor}~{driver}");
    global || pod_volume || sub_path
}

/// Refuses an LV the host uses (see the module docs). `open`: the LV's open flag from `lvs`, when
/// the caller has it.
pub(crate) fn check_not_in_use(
    driver_name: &str,
    devices: &dyn Devices,
    table: &MountTable,
    o: &LvmOptions,
    devnum: (u32, u32),
    open: Option<bool>,
) -> Result<()> {
    let in_use = |how: String| {
        Error::refused(format!(
            "{} is in use by the node ({how}); flexvol never hands a volume the host is using to a pod. Point the volume at another LV",
            o.key()
        ))
    };
    let mut by_kubelet = false;
    for m in table
        .entries
        .iter()
        .filter(|m| (m.major, m.minor) == devnum)
    {
        if !kubelet_owned(driver_name, &m.mount_point) {
            return Err(in_use(format!("mounted at {}", m.mount_point.display())));
        }
        by_kubelet = true;
    }
    if devices.swaps()?.contains(&devnum) {
        return Err(in_use("active swap".into()));
    }
    let holders = devices.holders(devnum)?;
    if !holders.is_empty() {
        return Err(in_use(format!(
            "device {} is stacked on it",
            holders.join(", ")
        )));
    }
    if open == Some(true) && !by_kubelet {
        return Err(in_use(
            "its device is open, and not by a kubelet mount of this driver".into(),
        ));
    }
    Ok(())
}
