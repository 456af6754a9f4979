//! LVM: attachable logical volumes, created on demand, formatted only when provably blank,
//! resizable.
//!
//! Who runs what (docs/protocol.md §3): with `attach: true`, kube-controller-manager runs
//! `attach`, `isattached` and `detach` on a control-plane host that cannot see the node's volume
//! groups, so those verbs never touch the host. All node work happens in the verbs kubelet runs on
//! the node.
//!
//! - `attach <json> <node>`: validate the options, answer `/dev/<vg>/<lv>`. A pure function.
//! - `isattached`: "Not supported", always. The controller cannot see node-local LVM, so any
//!   answer would be a guess; "Not supported" is cached by kube-controller-manager (no exec every
//!   minute per volume) and leaves the volume attached, which is exactly what a made-up
//!   `"attached": true` would do.
//! - `detach <volume> <node>`: Success, nothing to do (the LV is deactivated by `unmountdevice`).
//! - `waitforattach <device> <json>` (node): under the volume lock, one `lvm lvs` of the VG tells
//!   whether the LV exists, is active and where it is, and whether the node policy lets volumes
//!   use it (`policy.rs`: allowed VG or tagged LV, not in use by the host, and for an LV the
//!   provisioner made, tagged `flexvol.pv.<pv>`, the PV's `capabilityToken`). Active with its device
//!   node present: Success at once. Missing: with `size` and an allowed VG, create it under the
//!   VG lock (`maxVolumeSize`, free space and `vgReserve` checked, size rounded up to whole
//!   extents, tagged `flexvol.created`); without, fail. Then activate and wait (bounded) for
//!   `/dev/<vg>/<lv>`.
//! - `mountdevice <globalDir> <device> <json>` (node): under the volume lock: already mounted there
//!   from this device → Success. Otherwise probe with `blkid -p`: exit 2 (blank) → mkfs (never for
//!   a read-only volume, never for an LV tagged `flexvol.formatted`, i.e. one that lost its
//!   filesystem); a filesystem of the requested type → mount it as is; a different type, a
//!   partition table, an LVM/RAID/crypto signature, an ambivalent probe or a probe error →
//!   Failure, and no mkfs. The state record is written before mkfs and mount, and says
//!   `formatting` until the tag is set: a call cut short between mkfs and the tag (a kill) leaves
//!   that record, and the retry, finding a filesystem there, sets the tag.
//! - `mount <podDir> <json>` (node): bind the global mount onto the pod directory (read-only when
//!   asked). The global directory is computed the way kubelet computes it (docs/protocol.md §7):
//!   the kubelet root (the pod directory's prefix before `/pods/<uid>/volumes/...`) +
//!   `plugins/kubernetes.io/flexvolume/<vendor>/<driver>/mounts/<pvOrVolumeName>`, and then
//!   checked in mountinfo to be a mount of this LV; a mismatch fails instead of binding something
//!   else. Before that, the capability check (`policy.rs`): a `capabilityToken` is checked alone;
//!   a call without one costs one `lvs` for the LV's tags, so that an LV the provisioner made is
//!   bound only into a pod of its PV. Computing beats searching state: it needs no record to survive, and the check makes it
//!   safe.
//! - `unmount <podDir>`: undo the bind(s), forget the record.
//! - `unmountdevice <globalDir>` (no options): find VG/LV in the record written by `mountdevice`
//!   (or, without one, from the `/dev/mapper/<vg>-<lv>` source in mountinfo), unmount, and
//!   deactivate the LV (`lvchange -an`) unless it is still mounted elsewhere.
//! - `expandvolume`: Success, no side effects (stock kube-controller-manager never calls it).
//! - `expandfs <json> <device> <podDir> <new> <old>` (node): `lvextend` to `new` (rounded up to
//!   whole extents) when the LV is smaller, then grow the mounted filesystem (`resize2fs <dev>`,
//!   `xfs_growfs -d <mountpoint>`). Repeating is Success.
//!
//! Every mutating verb holds the lock `lvm:<vg>/<lv>`; creation also holds `lvm:vg:<vg>` so that
//! parallel creations in one VG check free space one at a time.
//!
//! Seams, beside the call's `Context` ([`Seams`]): every LVM command goes through the LV service
//! ([`lvs`]: list, create, extend, remove, activate, tag; the LVM provisioner, `provision::storage::lvm`,
//! uses the same one), block devices through [`devices`]. `report.rs` holds what `lvm` reports,
//! `tools.rs` the other tools (blkid, mkfs, the growers), `policy.rs` the node policy.

pub(crate) mod csi;
pub(crate) mod devices;
pub(crate) mod lvs;
pub(crate) mod options;
pub(crate) mod policy;
pub mod report;
pub(crate) mod tools;

pub(crate) use devices::{Devices, SysDevices};
pub(crate) use lvs::{LvService, LvmCommands, LvmError};
pub(crate) use options::{FsType, LvmOptions, check_name};
#[cfg(test)]
use policy::LvmConfig;
pub(crate) use policy::{TAG_CREATED, TAG_PV_PREFIX, kubelet_owned};
pub(crate) use report::LvRow;
pub(crate) use tools::Probe;

use crate::backend::{Backend, Context};
use crate::error::{Error, Result};
use crate::node::state::VolumeRecord;
use crate::protocol::options::Options;
use crate::protocol::reply::Reply;
use crate::protocol::verb::Call;
use crate::sys::mount::{MountError, UnmountMode};
use crate::sys::mountinfo::MountTable;
use crate::sys::process::checkpoint;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const BACKEND: Backend = Backend::Lvm;
/// Tag on LVs this driver formatted: such an LV that probes blank has lost its filesystem, and is
/// never formatted again.
pub(crate) const TAG_FORMATTED: &str = "flexvol.formatted";
/// Tag of an LV whose filesystem is smaller than the LV (a clone larger than its source, made by
/// the provisioner): `mountdevice` grows the filesystem to the LV after mounting it read-write,
/// then removes the tag (growing again is a no-op, so a kill in between is harmless).
pub(crate) const TAG_GROW_FS: &str = "flexvol.grow-fs";

/// The LVM backend's own seams, beside the call's [`Context`]: the block devices and the LV
/// service. Unit tests pass doubles; [`Seams::SYSTEM`] are the node's.
#[derive(Clone, Copy)]
pub(crate) struct Seams<'a> {
    /// Device numbers, swap, holders (the real one is [`SysDevices`]).
    pub(crate) devices: &'a dyn Devices,
    /// Every LVM command (the real one is [`LvmCommands`]).
    pub(crate) lvs: &'a dyn LvService,
}

impl Seams<'static> {
    /// The node's own: `/dev`, `/proc/swaps` and sysfs, and the `lvm` binary.
    pub(crate) const SYSTEM: Self = Self {
        devices: &SysDevices,
        lvs: &LvmCommands,
    };
}

/// Answers the LVM verbs.
pub(crate) fn handle(call: &Call, ctx: &Context, seams: &Seams) -> Result<Reply> {
    let parse =
        |json: &str| -> Result<LvmOptions> { Ok(LvmOptions::parse(&Options::parse(json)?)?) };
    match call {
        Call::Attach { options, .. } => attach(&parse(options)?),
        Call::IsAttached { .. } => Ok(Reply::not_supported()),
        Call::Detach { .. } | Call::ExpandVolume { .. } => Ok(Reply::success()),
        Call::WaitForAttach { device, options } => {
            wait_for_attach(ctx, seams, device, &parse(options)?)
        }
        Call::MountDevice {
            mount_dir,
            device,
            options,
        } => mount_device(ctx, seams, Path::new(mount_dir), device, &parse(options)?),
        Call::UnmountDevice { mount_dir } => unmount_device(ctx, seams, Path::new(mount_dir)),
        Call::Mount { mount_dir, options } => {
            mount(ctx, seams, Path::new(mount_dir), &parse(options)?)
        }
        Call::Unmount { mount_dir } => unmount(ctx, Path::new(mount_dir)),
        Call::ExpandFs {
            options,
            device,
            new_size,
            ..
        } => expand_fs(
            ctx,
            seams,
            device,
            *new_size,
            &parse(options)?,
            Grow::Options,
        ),
        _ => Ok(Reply::not_supported()),
    }
}

/// `attach`: runs in kube-controller-manager; never touches the host.
fn attach(o: &LvmOptions) -> Result<Reply> {
    Ok(Reply::device(o.device().to_string_lossy()))
}

/// The device kubelet passes must be the one the options name (or empty): a different one means
/// the PV changed under a mounted volume.
fn check_device_arg(device: &str, o: &LvmOptions) -> Result<()> {
    if device.is_empty() || Path::new(device) == o.device() {
        return Ok(());
    }
    Err(Error::refused(format!(
        "device {device} does not match the volume's {} (options volumegroup/volumeID); was the PV edited? Detach the volume and attach it again",
        o.device().display()
    )))
}

/// `waitforattach`: make the LV exist and be active, return its device.
fn wait_for_attach(ctx: &Context, seams: &Seams, device: &str, o: &LvmOptions) -> Result<Reply> {
    check_device_arg(device, o)?;
    let _lock = ctx.lock(BACKEND, &o.key())?;
    let lvs = seams.lvs.list(ctx, &o.vg)?;
    let lv = match lvs.iter().find(|r| r.lv_name == o.lv) {
        Some(lv) => lv.clone(),
        None => {
            policy::check_allowed(&ctx.config.lvm, o, None)?;
            create(ctx, seams, o, &lvs)?;
            checkpoint("lvm-waitforattach-after-lvcreate");
            seams.lvs.activate(ctx, &o.key())?;
            tools::wait_for_device(ctx, seams.devices, &o.device(), device_wait(ctx))?;
            return Ok(Reply::device(o.device().to_string_lossy()));
        }
    };
    policy::check_allowed(&ctx.config.lvm, o, Some(&lv))?;
    policy::check_capability(&ctx.config.state_dir, o, Some(&lv), None)?;
    if !lv.usable() {
        return Err(Error::refused(format!(
            "{} is a {} LV (attributes {}), not one that can hold a filesystem; point volumeID at a regular or thin LV",
            o.key(),
            if lv.is_thin_pool() {
                "thin pool"
            } else {
                "special"
            },
            lv.lv_attr
        )));
    }
    if lv.active()
        && let Some(devnum) = seams.devices.block_device(&o.device())?
    {
        check_not_in_use(ctx, seams, o, devnum, lv.open())?;
        return Ok(Reply::device(o.device().to_string_lossy()));
    }
    seams.lvs.activate(ctx, &o.key())?;
    let devnum = tools::wait_for_device(ctx, seams.devices, &o.device(), device_wait(ctx))?;
    if lv.active() {
        // Active before we came (its device node was late): the host may be using it.
        check_not_in_use(ctx, seams, o, devnum, lv.open())?;
    }
    Ok(Reply::device(o.device().to_string_lossy()))
}

/// The host-use check (policy.rs) for an active LV, given its `lvs` row's open flag. A device
/// that is not open is not mounted, not swap and has no holders (each of those holds it open),
/// so the hot path (an LV activated for a first pod) reads nothing more than the `lvs` it ran.
fn check_not_in_use(
    ctx: &Context,
    seams: &Seams,
    o: &LvmOptions,
    devnum: (u32, u32),
    open: bool,
) -> Result<()> {
    if !open {
        return Ok(());
    }
    let table = ctx.mounter.table()?;
    check_open(ctx, seams, &table, o, devnum, open)
}

/// Mounts, swap and holders first (no waiting), then the open flag unless kubelet's mounts
/// explain it. udev opens a device for a moment after activation and whenever a writer closes it
/// (its blkid probe), so an unexplained open flag is believed only if it persists over ~2 s of
/// re-reading; only a refusal pays for that.
fn check_open(
    ctx: &Context,
    seams: &Seams,
    table: &MountTable,
    o: &LvmOptions,
    devnum: (u32, u32),
    open: bool,
) -> Result<()> {
    policy::check_not_in_use(ctx.driver_name, seams.devices, table, o, devnum, None)?;
    let by_kubelet = table
        .entries
        .iter()
        .any(|m| (m.major, m.minor) == devnum && kubelet_owned(ctx.driver_name, &m.mount_point));
    if !open || by_kubelet {
        return Ok(());
    }
    let until = std::time::Instant::now() + ctx.deadline.cap(Duration::from_secs(2));
    while std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
        let lvs = seams.lvs.list(ctx, &o.vg)?;
        if !lvs.iter().any(|r| r.lv_name == o.lv && r.open()) {
            return Ok(());
        }
    }
    policy::check_not_in_use(ctx.driver_name, seams.devices, table, o, devnum, Some(true))
}

fn device_wait(ctx: &Context) -> Duration {
    Duration::from_secs(ctx.config.lvm.device_wait_seconds.max(1))
}

/// Creates the missing LV under the VG lock; every check happens before `lvcreate`.
fn create(ctx: &Context, seams: &Seams, o: &LvmOptions, lvs: &[LvRow]) -> Result<()> {
    let size = o.size.ok_or_else(|| {
        Error::refused(format!(
            "logical volume {} does not exist and no size was given; create it (lvcreate) or set options.size (e.g. 10Gi) so flexvol creates it",
            o.key()
        ))
    })?;
    policy::check_max_size(&ctx.config.lvm, o, size)?;
    let _vg_lock = ctx.lock(BACKEND, &format!("vg:{}", o.vg))?;
    if let Some(pool) = &o.thin_pool {
        match lvs.iter().find(|r| &r.lv_name == pool) {
            Some(p) if p.is_thin_pool() => {}
            Some(p) => {
                return Err(Error::refused(format!(
                    "thinpool {pool} in volume group {} is not a thin pool (attributes {}); fix options.thinpool",
                    o.vg, p.lv_attr
                )));
            }
            None => {
                return Err(Error::refused(format!(
                    "thin pool {}/{pool} does not exist; create it (lvcreate --type thin-pool) or fix options.thinpool",
                    o.vg
                )));
            }
        }
        seams.lvs.create(
            ctx,
            &o.vg,
            &o.lv,
            round_up(size, 512)?,
            Some(pool),
            &[TAG_CREATED],
        )?;
        return Ok(());
    }
    // Free space changes with every creation: read it under the VG lock, not from the earlier list.
    let vg = seams.lvs.vg(ctx, &o.vg)?;
    let bytes = round_up(size, vg.vg_extent_size.max(1))?;
    policy::check_free(&ctx.config.lvm, o, bytes, vg.vg_free)?;
    Ok(seams
        .lvs
        .create(ctx, &o.vg, &o.lv, bytes, None, &[TAG_CREATED])?)
}

pub(crate) fn round_up(size: u64, unit: u64) -> Result<u64> {
    size.checked_next_multiple_of(unit).ok_or_else(|| {
        Error::refused(format!(
            "size {size} bytes cannot be rounded up to whole {unit}-byte extents without overflow"
        ))
    })
}

fn require_dir(dir: &Path) -> Result<PathBuf> {
    crate::backend::canonical_mount_dir(dir)?.ok_or_else(|| {
        Error::refused(format!(
            "mount directory {} does not exist (kubelet creates it before this call)",
            dir.display()
        ))
    })
}

fn active_device(seams: &Seams, o: &LvmOptions) -> Result<(u32, u32)> {
    seams.devices.block_device(&o.device())?.ok_or_else(|| {
        Error::refused(format!(
            "{} does not exist: the LV is missing or not active. kubelet activates it with waitforattach first; check `lvs {}`",
            o.device().display(),
            o.key()
        ))
    })
}

fn busy(e: MountError, what: &Path) -> Error {
    if crate::backend::is_busy(&e) {
        crate::backend::busy(what)
    } else {
        e.into()
    }
}

fn record(o: &LvmOptions, verb: &str, target: &Path, source: &Path) -> VolumeRecord {
    VolumeRecord {
        volume: o.volume_name.clone(),
        extra: BTreeMap::from([
            ("vg".to_owned(), o.vg.clone()),
            ("lv".to_owned(), o.lv.clone()),
            ("fsType".to_owned(), o.fs.name().to_owned()),
        ]),
        ..crate::backend::record(
            BACKEND,
            verb,
            target,
            source.to_string_lossy().into_owned(),
            o.read_only,
            None,
        )
    }
}

/// Key of a mount record's `extra` saying that this attempt formats the LV (until its
/// [`TAG_FORMATTED`] is set).
const FORMATTING: &str = "formatting";

/// `mountdevice`: format if provably blank, mount at the global directory.
fn mount_device(
    ctx: &Context,
    seams: &Seams,
    dir: &Path,
    device: &str,
    o: &LvmOptions,
) -> Result<Reply> {
    check_device_arg(device, o)?;
    let target = require_dir(dir)?;
    if let FsType::Other(_) = o.fs
        && !ctx.runner.has_tool(&o.fs.mkfs_tool())
    {
        return Err(Error::refused(format!(
            "fsType {} is not supported on this node: {} is not installed. Use ext4 or xfs, or install it",
            o.fs.name(),
            o.fs.mkfs_tool()
        )));
    }
    let _lock = ctx.lock(BACKEND, &o.key())?;
    if o.token.is_some() {
        policy::check_capability(&ctx.config.state_dir, o, None, None)?;
    }
    let dev = o.device();
    let devnum = active_device(seams, o)?;

    let table = ctx.mounter.table()?;
    if let Some(m) = table.at(&target) {
        if (m.major, m.minor) != devnum {
            return Err(crate::backend::foreign_mount(
                &target,
                &format_args!("{} {}", m.fs_type, m.source),
            ));
        }
        if m.read_only() != o.read_only {
            return Err(Error::refused(format!(
                "{} is already mounted {} but {} was asked; it is remounted on the next attach",
                target.display(),
                if m.read_only() {
                    "read-only"
                } else {
                    "read-write"
                },
                if o.read_only {
                    "read-only"
                } else {
                    "read-write"
                },
            )));
        }
        // A grow that failed after the mount is retried here.
        if needs_grow(ctx, seams, o)? {
            grow_fs_once(ctx, seams, o, &target)?;
        }
        return Ok(Reply::success());
    }
    policy::check_not_in_use(ctx.driver_name, seams.devices, &table, o, devnum, None)?;

    let blank = match tools::probe(ctx, &dev)? {
        Probe::Blank => true,
        Probe::Filesystem(t) if t == o.fs.name() => false,
        Probe::Filesystem(t) => {
            return Err(Error::refused(format!(
                "{} already holds a {t} filesystem, but fsType {} was asked; flexvol never reformats a volume. Set fsType: {t} in the PV, or wipe the LV yourself if its data is not needed",
                dev.display(),
                o.fs.name()
            )));
        }
        Probe::Other(what) => {
            return Err(Error::refused(format!(
                "{} holds {what}, not a filesystem; refusing to format it (that could destroy data). Inspect it with `blkid -p {}` and point the PV at the right LV",
                dev.display(),
                dev.display()
            )));
        }
    };
    if blank {
        if o.read_only {
            return Err(Error::refused(format!(
                "{} is blank and the volume is read-only; a read-only volume is never formatted. Mount it read-write once to format it",
                dev.display()
            )));
        }
        let lvs = seams.lvs.list(ctx, &o.vg)?;
        let row = lvs.iter().find(|r| r.lv_name == o.lv);
        policy::check_allowed(&ctx.config.lvm, o, row)?;
        policy::check_capability(&ctx.config.state_dir, o, row, None)?;
        // Blank and open, yet not mounted by kubelet: someone uses it raw (a VM, a database).
        check_open(ctx, seams, &table, o, devnum, row.is_some_and(LvRow::open))?;
        if row.is_some_and(|r| r.has_tag(TAG_FORMATTED)) {
            return Err(Error::refused(format!(
                "{} was formatted by flexvol before but now shows no filesystem; refusing to format it again (that would hide data loss). Check the device, or remove the tag with `lvchange --deltag {TAG_FORMATTED} {}` to allow formatting",
                dev.display(),
                o.key()
            )));
        }
        if !ctx.runner.has_tool(&o.fs.mkfs_tool()) {
            return Err(Error::refused(format!(
                "{} is not installed; install it to format {} volumes",
                o.fs.mkfs_tool(),
                o.fs.name()
            )));
        }
    }

    // A kill between our mkfs and its tag left the filesystem untagged: the record of that
    // attempt (this target's, root-only) says so, and the tag is added now — without it, a
    // filesystem that later reads as blank would be formatted again instead of refused. A record
    // that cannot be read is no evidence (it is rewritten below): the mount goes on as before.
    let state = ctx.state(BACKEND);
    if !blank
        && !o.read_only
        && state
            .load(&target)
            .ok()
            .flatten()
            .is_some_and(|r| r.extra.get(FORMATTING).is_some_and(|v| v == "true"))
    {
        let lvs = seams.lvs.list(ctx, &o.vg)?;
        if lvs
            .iter()
            .any(|r| r.lv_name == o.lv && !r.has_tag(TAG_FORMATTED))
        {
            seams.lvs.add_tag(ctx, &o.key(), TAG_FORMATTED)?;
        }
    }
    // Read before the mount, so a failure to read leaves nothing mounted.
    let grow = !blank && needs_grow(ctx, seams, o)?;
    let mut rec = record(o, "mountdevice", &target, &dev);
    if blank {
        rec.extra.insert(FORMATTING.to_owned(), "true".to_owned());
    }
    state.save(&rec)?;
    if blank {
        tools::mkfs(ctx, &o.fs, &o.mkfs_args, &dev)?;
        checkpoint("lvm-mountdevice-after-mkfs");
        seams.lvs.add_tag(ctx, &o.key(), TAG_FORMATTED)?;
        rec.extra.remove(FORMATTING);
        state.save(&rec)?;
    }
    ctx.mounter
        .mount_fs(&dev, &target, o.fs.name(), o.read_only, &o.mount_data)?;
    checkpoint("lvm-mountdevice-after-mount");
    if grow {
        grow_fs_once(ctx, seams, o, &target)?;
    }
    Ok(Reply::success())
}

/// Whether the provisioned LV (read-write, with a capability token: only the provisioner sets
/// [`TAG_GROW_FS`], on clones larger than their source) carries [`TAG_GROW_FS`]: one `lvs`, only
/// for such volumes.
fn needs_grow(ctx: &Context, seams: &Seams, o: &LvmOptions) -> Result<bool> {
    if o.read_only || o.token.is_none() {
        return Ok(false);
    }
    let lvs = seams.lvs.list(ctx, &o.vg)?;
    Ok(lvs
        .iter()
        .any(|r| r.lv_name == o.lv && r.has_tag(TAG_GROW_FS)))
}

/// Grows the filesystem mounted at `target` to the LV (a no-op when it fills it already), then
/// removes [`TAG_GROW_FS`]; a kill in between grows again next time, harmlessly.
fn grow_fs_once(ctx: &Context, seams: &Seams, o: &LvmOptions, target: &Path) -> Result<()> {
    tools::grow_fs(ctx, o.fs.name(), &o.device(), target)?;
    checkpoint("lvm-mountdevice-after-grow");
    seams.lvs.del_tag(ctx, &o.key(), TAG_GROW_FS)?;
    Ok(())
}

/// VG and LV from a mount source: `/dev/<vg>/<lv>` (how this driver and kubelet mount it) or
/// `/dev/mapper/<vg>-<lv>` (`-` inside names doubled). Names are checked by the caller.
fn split_dm_name(source: &str) -> Option<(String, String)> {
    let Some(name) = source.strip_prefix("/dev/mapper/") else {
        let rest = source.strip_prefix("/dev/")?;
        let (vg, lv) = rest.split_once('/')?;
        return (!lv.contains('/') && vg != "mapper").then(|| (vg.to_owned(), lv.to_owned()));
    };
    let b = name.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'-' {
            if b.get(i + 1) == Some(&b'-') {
                i += 2;
                continue;
            }
            let (vg, lv) = (&name[..i], &name[i + 1..]);
            return Some((vg.replace("--", "-"), lv.replace("--", "-")));
        }
        i += 1;
    }
    None
}

/// `unmountdevice`: unmount the global directory, deactivate the LV when nothing else uses it.
fn unmount_device(ctx: &Context, seams: &Seams, dir: &Path) -> Result<Reply> {
    let state = ctx.state(BACKEND);
    let Some(target) = crate::backend::canonical_mount_dir(dir)? else {
        state.remove(dir)?;
        return Ok(Reply::success());
    };
    let rec = state.load(&target)?;
    let table = ctx.mounter.table()?;
    let ids = match &rec {
        Some(r) => match (r.extra.get("vg"), r.extra.get("lv")) {
            (Some(vg), Some(lv)) => Some((vg.clone(), lv.clone())),
            _ => None,
        },
        None => table.at(&target).and_then(|m| split_dm_name(&m.source)),
    }
    .filter(|(vg, lv)| check_name("vg", vg, false).is_ok() && check_name("lv", lv, true).is_ok());
    let key = match &ids {
        Some((vg, lv)) => format!("{vg}/{lv}"),
        None => target.to_string_lossy().into_owned(),
    };
    let _lock = ctx.lock(BACKEND, &key)?;

    for _ in 0..table.all_at(&target).count() {
        ctx.mounter
            .unmount(&target, UnmountMode::Normal)
            .map_err(|e| busy(e, &target))?;
    }
    checkpoint("lvm-unmountdevice-after-unmount");
    if let Some((vg, lv)) = &ids {
        let dev = PathBuf::from(format!("/dev/{vg}/{lv}"));
        if let Some(devnum) = seams.devices.block_device(&dev)? {
            let after = ctx.mounter.table()?;
            let elsewhere = after.entries.iter().find(|m| (m.major, m.minor) == devnum);
            match elsewhere {
                Some(_) => {} // still mounted elsewhere (e.g. by hand): leave it active
                None => seams.lvs.deactivate(ctx, &key).map_err(|e| {
                    Error::refused(format!(
                        "{} is unmounted, but the LV could not be deactivated ({e}); it stays active, which is harmless. Find its user with `dmsetup info {vg}-{lv}` and run `lvchange -an {key}`",
                        target.display()
                    ))
                })?,
            }
        }
    }
    state.remove(&target)?;
    Ok(Reply::success())
}

/// Where kubelet asked `mountdevice` to mount this volume (docs/protocol.md §7).
pub(crate) fn global_mount_dir(driver_name: &str, pod_dir: &Path, volume: &str) -> Option<PathBuf> {
    Some(
        crate::backend::kubelet_root(pod_dir)?
            .join("plugins/kubernetes.io/flexvolume")
            .join(driver_name)
            .join("mounts")
            .join(volume),
    )
}

/// `mount`: bind the global mount onto the pod directory.
fn mount(ctx: &Context, seams: &Seams, dir: &Path, o: &LvmOptions) -> Result<Reply> {
    let pod_dir = require_dir(dir)?;
    let volume = o.volume_name.as_deref().ok_or_else(|| {
        Error::refused(
            "kubelet did not send kubernetes.io/pvOrVolumeName, which names the global mount",
        )
    })?;
    if volume.contains('/') || volume == "." || volume == ".." {
        return Err(Error::refused(format!(
            "volume name {volume:?} is not a single path component"
        )));
    }
    let global = global_mount_dir(ctx.driver_name, &pod_dir, volume).ok_or_else(|| {
        Error::refused(format!(
            "{} is not a kubelet pod volume directory (<root>/pods/<uid>/volumes/<driver>/<name>); cannot find the global mount",
            pod_dir.display()
        ))
    })?;
    let _lock = ctx.lock(BACKEND, &o.key())?;
    // The capability check (policy.rs): a token alone, else the LV's tags from one `lvs`.
    let lvs;
    let row = match o.token {
        Some(_) => None,
        None => {
            lvs = seams.lvs.list(ctx, &o.vg)?;
            lvs.iter().find(|r| r.lv_name == o.lv)
        }
    };
    policy::check_capability(&ctx.config.state_dir, o, row, o.namespace.as_deref())?;
    bind_global(ctx, seams, &global, &pod_dir, o)
}

/// The bind step of `mount` (and of CSI NodePublishVolume, `csi.rs`), under the volume's lock
/// with the capability checked by the caller: `global` must be a mount of this LV, and
/// `pod_dir` (canonical, existing) gets a bind of it, read-only when asked; an existing bind of
/// this LV is Success (and finished to read-only when a crash left it read-write).
fn bind_global(
    ctx: &Context,
    seams: &Seams,
    global: &Path,
    pod_dir: &Path,
    o: &LvmOptions,
) -> Result<Reply> {
    let devnum = active_device(seams, o)?;
    let table = ctx.mounter.table()?;
    match table.at(global) {
        Some(g) if (g.major, g.minor) == devnum => {}
        Some(g) => {
            return Err(Error::refused(format!(
                "the global mount {} shows {} {}, not {}; refusing to bind it into the pod",
                global.display(),
                g.fs_type,
                g.source,
                o.device().display()
            )));
        }
        None => {
            return Err(Error::refused(format!(
                "{} is not mounted at {}; kubelet runs mountdevice before mount, so retry (or check the kubelet log)",
                o.device().display(),
                global.display()
            )));
        }
    }
    if let Some(m) = table.at(pod_dir) {
        if (m.major, m.minor) != devnum {
            return Err(crate::backend::foreign_mount(
                pod_dir,
                &format_args!("{} {}", m.fs_type, m.source),
            ));
        }
        return match (m.read_only(), o.read_only) {
            (false, true) => {
                // A crash between the bind and the read-only remount: finish the job.
                ctx.mounter.remount_readonly(pod_dir)?;
                Ok(Reply::success())
            }
            (true, false) => Err(Error::refused(format!(
                "{} is already mounted read-only but read-write was asked; unmount it first",
                pod_dir.display()
            ))),
            _ => Ok(Reply::success()),
        };
    }
    ctx.state(BACKEND)
        .save(&record(o, "mount", pod_dir, global))?;
    checkpoint("lvm-mount-before-bind");
    ctx.mounter.bind(global, pod_dir, o.read_only)?;
    Ok(Reply::success())
}

/// `unmount`: undo the bind(s) at the pod directory.
fn unmount(ctx: &Context, dir: &Path) -> Result<Reply> {
    let state = ctx.state(BACKEND);
    let Some(pod_dir) = crate::backend::canonical_mount_dir(dir)? else {
        state.remove(dir)?;
        return Ok(Reply::success());
    };
    let key = match state.load(&pod_dir)? {
        Some(r) => match (r.extra.get("vg"), r.extra.get("lv")) {
            (Some(vg), Some(lv)) => format!("{vg}/{lv}"),
            _ => pod_dir.to_string_lossy().into_owned(),
        },
        None => pod_dir.to_string_lossy().into_owned(),
    };
    let _lock = ctx.lock(BACKEND, &key)?;
    let table = ctx.mounter.table()?;
    for _ in 0..table.all_at(&pod_dir).count() {
        ctx.mounter
            .unmount(&pod_dir, UnmountMode::Normal)
            .map_err(|e| busy(e, &pod_dir))?;
    }
    state.remove(&pod_dir)?;
    Ok(Reply::success())
}

/// The mount of the LV's filesystem itself (not a bind of a subdirectory).
fn fs_mount(table: &MountTable, devnum: (u32, u32)) -> Option<&crate::sys::mountinfo::MountInfo> {
    table
        .entries
        .iter()
        .find(|m| (m.major, m.minor) == devnum && m.root == Path::new("/"))
}

/// `expandfs`: grow the LV to the new size, then the mounted filesystem.
/// What vouches for the LV an expand grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grow {
    /// The call's options (`expandfs`; a static LV's staging record through CSI): the capability
    /// check runs on them, and the LV is extended to the size asked (`maxVolumeSize`, `vgReserve`).
    Options,
    /// The staging record of a provisioned LV on this node (CSI NodeExpandVolume): written by a
    /// stage that passed the capability check, and root's. The LV's size is the provisioner's
    /// (a claim edit, `vgReserve` there): only the filesystem grows, to the LV's size, and a size
    /// beyond it is refused, never an `lvextend`.
    StagedProvisioned,
}

fn expand_fs(
    ctx: &Context,
    seams: &Seams,
    device: &str,
    new_size: u64,
    o: &LvmOptions,
    how: Grow,
) -> Result<Reply> {
    check_device_arg(device, o)?;
    if new_size == 0 {
        return Err(Error::refused(
            "the new size is 0 bytes; nothing to grow to",
        ));
    }
    let _lock = ctx.lock(BACKEND, &o.key())?;
    let lvs = seams.lvs.list(ctx, &o.vg)?;
    let lv = lvs
        .iter()
        .find(|r| r.lv_name == o.lv)
        .ok_or_else(|| Error::refused(format!("logical volume {} does not exist", o.key())))?;
    policy::check_allowed(&ctx.config.lvm, o, Some(lv))?;
    if how == Grow::Options {
        policy::check_capability(&ctx.config.state_dir, o, Some(lv), None)?;
    }
    let devnum = active_device(seams, o)?;
    let table = ctx.mounter.table()?;
    policy::check_not_in_use(ctx.driver_name, seams.devices, &table, o, devnum, None)?;
    if lv.lv_size < new_size && how == Grow::StagedProvisioned {
        return Err(Error::refused(format!(
            "LV {} is {} bytes, less than the {new_size} asked: a provisioned LV is grown by flexvol provisioner (edit its claim), never by the node plugin; its filesystem grows once the LV has",
            o.key(),
            lv.lv_size
        )));
    }
    if lv.lv_size < new_size {
        let bytes = round_up(new_size, lv.vg_extent_size.max(1))?;
        policy::check_max_size(&ctx.config.lvm, o, bytes)?;
        if !lv.is_thin() {
            policy::check_free(&ctx.config.lvm, o, bytes - lv.lv_size, lv.vg_free)?;
        }
        seams.lvs.extend(ctx, &o.key(), bytes)?;
        checkpoint("lvm-expandfs-after-lvextend");
    }
    let m = fs_mount(&table, devnum).ok_or_else(|| {
        Error::refused(format!(
            "{} is not mounted, so its filesystem cannot be grown online; kubelet calls expandfs after mounting, so retry",
            o.device().display()
        ))
    })?;
    tools::grow_fs(ctx, &m.fs_type, &o.device(), &m.mount_point)?;
    Ok(Reply::success())
}

#[cfg(test)]
mod tests;
