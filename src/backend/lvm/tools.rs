//! The other tools the LVM backend runs on the node: the `blkid -p` probe, mkfs and the filesystem
//! growers, and the wait for a device node. LVM itself is the LV service's ([`super::lvs`]); the
//! device seam is [`super::devices`].

use super::devices::Devices;
use super::options::FsType;
use crate::backend::Context;
use crate::error::{Error, Result};
use crate::sys::exec::Cmd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// What `blkid -p` found on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Exit 2: no signature at all. The only outcome that allows mkfs.
    Blank,
    /// A filesystem of this type.
    Filesystem(String),
    /// A signature that is not a mountable filesystem (partition table, LVM PV, RAID member,
    /// crypto); described for the message.
    Other(String),
}

/// `blkid -p -o export <dev>`, by exit code (blkid(8)): 0 found, 2 nothing found, anything else
/// (4 usage/IO error, 8 ambivalent) is an error, never "blank".
pub(crate) fn probe(ctx: &Context, dev: &Path) -> Result<Probe> {
    let cmd = Cmd::new("blkid")
        .args(["-p", "-o", "export", "--"])
        .arg(dev)
        .timeout(ctx.deadline.cap(ctx.config.command_timeout()));
    let out = ctx.runner.run(&cmd)?;
    let text = out.stdout_text();
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
            .map(str::to_owned)
    };
    match out.code {
        Some(2) => Ok(Probe::Blank),
        Some(0) => {
            if let Some(pt) = field("PTTYPE") {
                return Ok(Probe::Other(format!("a {pt} partition table")));
            }
            match (field("TYPE"), field("USAGE")) {
                (Some(t), Some(u)) if u == "filesystem" => Ok(Probe::Filesystem(t)),
                (Some(t), u) => Ok(Probe::Other(format!(
                    "a {t} signature ({})",
                    u.unwrap_or_else(|| "unknown usage".into())
                ))),
                (None, _) => Ok(Probe::Other("a signature blkid cannot name".into())),
            }
        }
        Some(8) => Err(Error::refused(format!(
            "blkid found more than one signature on {} (ambivalent probe, exit 8); refusing to format or mount it. Inspect it with `wipefs -n {}`",
            dev.display(),
            dev.display()
        ))),
        _ => Err(Error::refused(format!(
            "cannot tell whether {} is blank: `{}` failed ({}{}); refusing to format it. Check the device (dmesg) and retry",
            dev.display(),
            cmd.display(),
            out.code
                .map_or("killed by a signal".into(), |c| format!("exit status {c}")),
            match out.tail() {
                t if t.is_empty() => String::new(),
                t => format!(": {t}"),
            }
        ))),
    }
}

/// `mkfs.<type> [-q] <args> <dev>`. No force flag: mkfs.ext4 then stops (stdin is /dev/null) and
/// mkfs.xfs refuses if a signature appeared since the probe.
///
/// It runs in [`empty_dir`], not `/`: the option allow-list admits no path, and should one ever
/// slip through, a relative path resolves inside an empty private directory instead of the
/// node's root.
pub(crate) fn mkfs(ctx: &Context, fs: &FsType, args: &[String], dev: &Path) -> Result<()> {
    let mut cmd = Cmd::new(&fs.mkfs_tool())
        .timeout(ctx.deadline.cap(ctx.config.command_timeout()))
        .cwd(empty_dir(ctx)?);
    if matches!(fs, FsType::Ext4 | FsType::Xfs) {
        cmd = cmd.arg("-q");
    }
    ctx.runner.check(&cmd.args(args).arg(dev))?;
    Ok(())
}

/// `<runDir>/lvm-empty`: a directory of root's, mode 0500, that nothing writes into; created on
/// first use. Anything else at that path (a symlink, a file) is an error.
pub(crate) fn empty_dir(ctx: &Context) -> Result<std::path::PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = ctx.config.run_dir.join("lvm-empty");
    match std::fs::DirBuilder::new().mode(0o500).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io("create", &dir, e)),
    }
    let m = std::fs::symlink_metadata(&dir).map_err(|e| Error::io("stat", &dir, e))?;
    if !m.file_type().is_dir() || m.uid() != nix::unistd::geteuid().as_raw() {
        return Err(Error::refused(format!(
            "{} is not a directory of ours; remove it (flexvol recreates it empty)",
            dir.display()
        )));
    }
    if m.permissions().mode() & 0o7777 != 0o500 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o500))
            .map_err(|e| Error::io("chmod", &dir, e))?;
    }
    Ok(dir)
}

/// Grows a mounted filesystem to fill its device: `resize2fs <dev>` (ext2/3/4, online) or
/// `xfs_growfs -d <mountpoint>`. Both are no-ops when there is nothing to grow.
pub(crate) fn grow_fs(ctx: &Context, fs_type: &str, dev: &Path, mount_point: &Path) -> Result<()> {
    let t = ctx.deadline.cap(ctx.config.command_timeout());
    let cmd = match fs_type {
        "ext2" | "ext3" | "ext4" => Cmd::new("resize2fs").arg(dev),
        "xfs" => Cmd::new("xfs_growfs").arg("-d").arg(mount_point),
        other => {
            return Err(Error::refused(format!(
                "cannot grow a {other} filesystem (flexvol grows ext2/3/4 and xfs); the LV has been extended, grow the filesystem by hand"
            )));
        }
    };
    ctx.runner.check(&cmd.timeout(t))?;
    Ok(())
}

/// Waits (bounded by `limit` and the call's deadline) for the device node to appear: with udev the
/// `/dev/<vg>/<lv>` link may come a moment after `lvchange` returns.
pub(crate) fn wait_for_device(
    ctx: &Context,
    devices: &dyn Devices,
    dev: &Path,
    limit: Duration,
) -> Result<(u32, u32)> {
    let until = Instant::now() + ctx.deadline.cap(limit);
    loop {
        if let Some(n) = devices.block_device(dev)? {
            return Ok(n);
        }
        if Instant::now() >= until {
            return Err(Error::refused(format!(
                "{} did not appear within {}s of activating the LV; check that device-mapper and udev work on this node (`lvs`, `dmsetup ls`)",
                dev.display(),
                limit.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
