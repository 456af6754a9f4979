//! The LVM backend's CSI front (`flexvol csi --kind lvm`, [`crate::csi`]): NodeStageVolume,
//! NodeUnstageVolume, NodePublishVolume, NodeUnpublishVolume and NodeExpandVolume, made of the
//! FlexVolume verbs' own steps so that one storage path serves both fronts:
//!
//! | CSI call | FlexVolume steps |
//! |---|---|
//! | NodeStageVolume | `waitforattach` (exists or is created, allowed, active, not the host's) then `mountdevice` at the staging path (mkfs only when `blkid -p` proves it blank) |
//! | NodePublishVolume | `mount`'s bind step, from the staging path the call names (checked to be a mount of this LV) |
//! | NodeUnpublishVolume | `unmount`, then the empty target directory is removed |
//! | NodeUnstageVolume | `unmountdevice` (the LV from the root-only state record; deactivated when nothing else mounts it) |
//! | NodeExpandVolume | `expandfs` on the LV the staging path's record names (`lvextend`, then the online grow) |
//!
//! **Caller contract**: paths are checked CSI paths under the plugin's kubelet root
//! (`crate::csi::node`: staging `.../plugins/kubernetes.io/csi/{pv/<pv>,<driver>/<hash>}/globalmount`,
//! target `.../pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`), and the options are the
//! volume context turned into the LVM options with `volumegroup`/`volumeID` from the volume id
//! (`<vg>/<lv>`), pod identity only from kubelet's keys.
//!
//! **Whose LV**: the checks of the FlexVolume verbs, with the PV name a CSI call can give. An LV
//! the provisioner made (tagged `flexvol.pv.<pv>`) is served only with its PV's
//! `capabilityToken`, only to that PV and, on publish, only to pods of the claim's namespace
//! (`policy::check_capability`). The PV's name comes from kubelet, never from the volume
//! attributes (`crate::csi::node`): the target path's `<name>` on publish, and the staging path's
//! `<pv>` on kubelets before 1.25. A publish of a provisioned LV (or one carrying a token)
//! without a PV name is refused ([`check_publish`]): without it a copy of the PV in the same
//! namespace would pass. A stage without one checks the token against the PV the LV is tagged
//! for, as `mountdevice` does; staging gives no pod anything. NodeExpandVolume takes the LV
//! from the root-only staging record a checked stage wrote, never from the request; for a
//! provisioned LV it grows only the filesystem, to the size the provisioner gave the LV (a claim
//! edit), never the LV itself. Static LVs are served
//! under the node's LVM policy exactly as through the FlexVolume driver (allowed VG or tagged LV,
//! never one the host uses, `maxVolumeSize`, `vgReserve`).

use super::{BACKEND, LvmOptions, Seams, check_name, policy};
use crate::backend::Context;
use crate::error::{Error, Result};
use crate::protocol::reply::Reply;
use std::path::Path;

/// The LV's `lvs` row when it is one the provisioner made (tagged `flexvol.pv.<pv>`).
fn provisioned(ctx: &Context, seams: &Seams, o: &LvmOptions) -> Result<Option<super::LvRow>> {
    let lvs = seams.lvs.list(ctx, &o.vg)?;
    Ok(lvs
        .into_iter()
        .find(|r| r.lv_name == o.lv)
        .filter(|r| !policy::provisioned_for(r).is_empty()))
}

/// The capability check of a publish (module doc, "Whose LV"): the `mount` verb's, with the
/// pod's namespace, after one `lvs`; a provisioned LV or a token without the PV's name is refused.
fn check_publish(ctx: &Context, seams: &Seams, o: &LvmOptions) -> Result<()> {
    let lvs = seams.lvs.list(ctx, &o.vg)?;
    let row = lvs.iter().find(|r| r.lv_name == o.lv);
    let provisioned = row.is_some_and(|r| !policy::provisioned_for(r).is_empty());
    if (provisioned || o.token.is_some()) && o.volume_name.is_none() {
        return Err(Error::refused(format!(
            "LV {} is a volume made by flexvol provisioner (or the call carries a capabilityToken), and this publish does not say which PV it is for: kubelet's pod info must mark the volume persistent (the CSIDriver needs podInfoOnMount: true); nothing was mounted",
            o.key()
        )));
    }
    policy::check_capability(&ctx.config.state_dir, o, row, o.namespace.as_deref())
}

/// NodeStageVolume: the LV made to exist and be active (`waitforattach`), then formatted if
/// provably blank and mounted at `staging` (`mountdevice`), with those verbs' capability checks. The staging directory is made when
/// missing (older kubelets make only its parent) and removed again if the stage fails.
pub(crate) fn stage(ctx: &Context, seams: &Seams, staging: &Path, o: &LvmOptions) -> Result<Reply> {
    // `mountdevice` checks a token against the PV the call names; a stage of a later kubelet
    // names none, so it is checked against the PV the LV is tagged for (`waitforattach` does the
    // same with the LV's row).
    let owned;
    let o = match (&o.volume_name, &o.token) {
        (None, Some(_)) => {
            let row = provisioned(ctx, seams, o)?;
            owned = LvmOptions {
                volume_name: row.as_ref().and_then(|r| {
                    match policy::provisioned_for(r).as_slice() {
                        [pv] => Some((*pv).to_owned()),
                        _ => None,
                    }
                }),
                ..o.clone()
            };
            &owned
        }
        _ => o,
    };
    crate::backend::CreatedTarget::around(staging, || {
        super::wait_for_attach(ctx, seams, "", o)
            .and_then(|_| super::mount_device(ctx, seams, staging, "", o))
    })
}

/// NodeUnstageVolume: `unmountdevice` at `staging`. Nothing mounted there and no record is
/// Success (a repeated call).
pub(crate) fn unstage(ctx: &Context, seams: &Seams, staging: &Path) -> Result<Reply> {
    super::unmount_device(ctx, seams, staging)
}

/// NodePublishVolume: bind the LV's mount at `staging` onto `target` (read-only when asked). The
/// target directory is made when missing and removed again if the publish fails.
pub(crate) fn publish(
    ctx: &Context,
    seams: &Seams,
    staging: &Path,
    target: &Path,
    o: &LvmOptions,
) -> Result<Reply> {
    crate::backend::CreatedTarget::around(target, || publish_made(ctx, seams, staging, target, o))
}

fn publish_made(
    ctx: &Context,
    seams: &Seams,
    staging: &Path,
    target: &Path,
    o: &LvmOptions,
) -> Result<Reply> {
    let target = super::require_dir(target)?;
    let staging = crate::backend::canonical_mount_dir(staging)?.ok_or_else(|| {
        Error::refused(format!(
            "staging path {} does not exist: the volume is not staged (NodeStageVolume first)",
            staging.display()
        ))
    })?;
    let _lock = ctx.lock(BACKEND, &o.key())?;
    check_publish(ctx, seams, o)?;
    super::bind_global(ctx, seams, &staging, &target, o)
}

/// NodeUnpublishVolume: `unmount` at `target`, then its directory removed while it is an empty
/// directory that is not a mount point.
pub(crate) fn unpublish(ctx: &Context, target: &Path) -> Result<Reply> {
    let reply = super::unmount(ctx, target)?;
    crate::backend::remove_target(target);
    Ok(reply)
}

/// NodeExpandVolume: grow the LV staged at `staging` to `new_size` bytes (rounded up to whole
/// extents) and its mounted filesystem; a provisioned LV's filesystem only, to the LV's size (a
/// `new_size` beyond it is refused: the provisioner grows the LV). Which LV, and its filesystem
/// type, come from the state record `mountdevice` wrote for `staging` (root's, never the
/// request's): `volume_id` must name that LV (`<vg>/<lv>`). Returns the LV's size afterwards.
pub(crate) fn expand(
    ctx: &Context,
    seams: &Seams,
    staging: &Path,
    volume_id: &str,
    new_size: u64,
) -> Result<u64> {
    let canonical = crate::backend::canonical_mount_dir(staging)?.ok_or_else(|| {
        Error::refused(format!(
            "staging path {} does not exist: the volume is not staged on this node",
            staging.display()
        ))
    })?;
    let rec = ctx.state(BACKEND).load(&canonical)?.ok_or_else(|| {
        Error::refused(format!(
            "no record of a volume staged at {}: the volume is not staged on this node (or was staged by another plugin)",
            staging.display()
        ))
    })?;
    let field = |k: &str| rec.extra.get(k).cloned().unwrap_or_default();
    let (vg, lv, fs) = (field("vg"), field("lv"), field("fsType"));
    check_name("vg", &vg, false)?;
    check_name("lv", &lv, true)?;
    if volume_id != format!("{vg}/{lv}") {
        return Err(Error::refused(format!(
            "volume_id {volume_id:?} is not the volume staged at {} ({vg}/{lv})",
            staging.display()
        )));
    }
    let o = LvmOptions::for_staged(vg, lv, &fs)?;
    let how = if provisioned(ctx, seams, &o)?.is_some() {
        super::Grow::StagedProvisioned
    } else {
        super::Grow::Options
    };
    super::expand_fs(ctx, seams, "", new_size, &o, how)?;
    let lvs = seams.lvs.list(ctx, &o.vg)?;
    Ok(lvs
        .iter()
        .find(|r| r.lv_name == o.lv)
        .map_or(new_size, |r| r.lv_size))
}
