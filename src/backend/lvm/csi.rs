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
//! **Whose LV**: a CSI call carries no PV name (kubelet sends none), so the check that binds an LV
//! the provisioner made to its own PV cannot be made. Until the provisioner writes CSI PVs with a
//! capability bound to their volume handle, an LV the provisioner made (tagged
//! `flexvol.pv.<pv>`) or a call carrying a `capabilityToken` is refused on every call, before
//! anything is activated, created, formatted or mounted ([`check_static`]); static LVs are served
//! under the node's LVM policy exactly as through the FlexVolume driver (allowed VG or tagged LV,
//! never one the host uses, `maxVolumeSize`, `vgReserve`).

use super::{BACKEND, LvmOptions, Seams, TAG_PV_PREFIX, check_name};
use crate::backend::Context;
use crate::error::{Error, Result};
use crate::protocol::reply::Reply;
use std::path::Path;

/// Refuses a provisioned LV or a capability token (module doc, "Whose LV"): one `lvs` of the VG.
pub(crate) fn check_static(ctx: &Context, seams: &Seams, o: &LvmOptions) -> Result<()> {
    let refuse = || {
        Error::refused(format!(
            "LV {} is a volume made by flexvol provisioner (or the call carries a capabilityToken); through CSI only static LVs are served for now, because a CSI call does not say which PV it is for. Use the volume through its flexVolume PV",
            o.key()
        ))
    };
    if o.token.is_some() {
        return Err(refuse());
    }
    let lvs = seams.lvs.list(ctx, &o.vg)?;
    let provisioned = lvs
        .iter()
        .find(|r| r.lv_name == o.lv)
        .is_some_and(|r| r.lv_tags.split(',').any(|t| t.starts_with(TAG_PV_PREFIX)));
    if provisioned {
        return Err(refuse());
    }
    Ok(())
}

/// NodeStageVolume: the LV made to exist and be active (`waitforattach`), then formatted if
/// provably blank and mounted at `staging` (`mountdevice`). The staging directory is made when
/// missing (older kubelets make only its parent) and removed again if the stage fails.
pub(crate) fn stage(ctx: &Context, seams: &Seams, staging: &Path, o: &LvmOptions) -> Result<Reply> {
    check_static(ctx, seams, o)?;
    let created = crate::backend::CreatedTarget::make(staging)?;
    let result = super::wait_for_attach(ctx, seams, "", o)
        .and_then(|_| super::mount_device(ctx, seams, staging, "", o));
    if result.is_err() {
        created.undo();
    }
    result
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
    let created = crate::backend::CreatedTarget::make(target)?;
    let result = publish_made(ctx, seams, staging, target, o);
    if result.is_err() {
        created.undo();
    }
    result
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
    check_static(ctx, seams, o)?;
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
/// extents) and its mounted filesystem. Which LV, and its filesystem type, come from the state
/// record `mountdevice` wrote for `staging` (root's, never the request's): `volume_id` must name
/// that LV (`<vg>/<lv>`). Returns the LV's size afterwards.
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
    check_static(ctx, seams, &o)?;
    super::expand_fs(ctx, seams, "", new_size, &o)?;
    let lvs = seams.lvs.list(ctx, &o.vg)?;
    Ok(lvs
        .iter()
        .find(|r| r.lv_name == o.lv)
        .map_or(new_size, |r| r.lv_size))
}
