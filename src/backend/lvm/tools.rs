//! Everything the LVM backend asks of the node: `lvm` reports and commands, the `blkid -p` probe,
//! mkfs and the filesystem growers, and the device-node seam ([`Devices`]).
//!
//! Every lvm call goes through the one `lvm` binary (`lvm lvs`, `lvm lvcreate`, ...), so a single
//! tool has to be found. Reports use `--reportformat json --units b --nosuffix -o <fields>`: byte
//! counts as JSON strings (lvm2 2.03), never localised, never rounded.

use crate::backend::Context;
use crate::error::{Error, Result};
use crate::sys::exec::{Cmd, ExecError};
use serde::Deserialize;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// LV fields every report asks for; one `lvs` of the VG tells existence, activation, path, size,
/// tags and the VG's extent size and free space.
pub const LV_FIELDS: &str =
    "vg_name,lv_name,lv_path,lv_size,lv_attr,lv_tags,pool_lv,vg_extent_size,vg_free";
/// VG fields, for a VG that has no LV yet (an empty `lvs` report carries no VG columns).
pub const VG_FIELDS: &str = "vg_name,vg_extent_size,vg_free";

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
    pub lv_name: String,
    /// `/dev/<vg>/<lv>`.
    #[serde(default)]
    pub lv_path: String,
    /// Size in bytes.
    #[serde(deserialize_with = "u64_str")]
    pub lv_size: u64,
    /// The 10-character attribute string (`-wi-a-----`, `Vwi-a-tz--`, `twi-aotz--`).
    pub lv_attr: String,
    /// Comma-separated tags.
    #[serde(default)]
    pub lv_tags: String,
    /// Thin pool of a thin LV.
    #[serde(default)]
    pub pool_lv: String,
    /// VG extent size in bytes.
    #[serde(deserialize_with = "u64_str")]
    pub vg_extent_size: u64,
    /// VG free bytes.
    #[serde(deserialize_with = "u64_str")]
    pub vg_free: u64,
}

impl LvRow {
    fn attr(&self, i: usize) -> char {
        self.lv_attr.chars().nth(i).unwrap_or('?')
    }
    /// Active (attr[4] == 'a').
    pub fn active(&self) -> bool {
        self.attr(4) == 'a'
    }
    /// A thin pool (attr[0] == 't').
    pub fn is_thin_pool(&self) -> bool {
        self.attr(0) == 't'
    }
    /// Its device is open (attr[5] == 'o'): mounted, or held by some process or device.
    pub fn open(&self) -> bool {
        self.attr(5) == 'o'
    }
    /// Thick (attr[0] not 'V', the thin-volume type): allocates from the VG's free space.
    pub fn is_thin(&self) -> bool {
        self.attr(0) == 'V'
    }
    /// Whether this LV can hold a filesystem: not a pool, an internal image, a log or a virtual LV.
    pub fn usable(&self) -> bool {
        !"teiIlvdDp".contains(self.attr(0))
    }
    /// Whether the LV carries `tag`.
    pub fn has_tag(&self, tag: &str) -> bool {
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
    pub vg_extent_size: u64,
    /// Free bytes.
    #[serde(deserialize_with = "u64_str")]
    pub vg_free: u64,
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

fn parse_report(cmd: &Cmd, stdout: &[u8]) -> Result<(Vec<LvRow>, Vec<VgRow>)> {
    let r: Report = serde_json::from_slice(stdout).map_err(|e| {
        Error::refused(format!(
            "cannot read the JSON report of `{}` ({e}); is lvm2 at least 2.02.158?",
            cmd.display()
        ))
    })?;
    let mut lvs = Vec::new();
    let mut vgs = Vec::new();
    for s in r.report {
        lvs.extend(s.lv);
        vgs.extend(s.vg);
    }
    Ok((lvs, vgs))
}

fn lvm(ctx: &Context, sub: &str) -> Cmd {
    Cmd::new("lvm")
        .arg(sub)
        .timeout(ctx.deadline.cap(ctx.config.command_timeout()))
}

fn report(ctx: &Context, sub: &str, fields: &str, vg: &str) -> Result<(Vec<LvRow>, Vec<VgRow>)> {
    let cmd = lvm(ctx, sub).args([
        "--reportformat",
        "json",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        fields,
        "--",
        vg,
    ]);
    let out = ctx.runner.check(&cmd).map_err(|e| vg_error(vg, e))?;
    parse_report(&cmd, &out.stdout)
}

fn vg_error(vg: &str, e: ExecError) -> Error {
    match &e {
        ExecError::Failed { output, .. } if output.tail().contains("not found") => {
            Error::refused(format!(
                "volume group {vg} not found on this node ({e}); create it (vgcreate) or fix options.volumegroup"
            ))
        }
        _ => e.into(),
    }
}

/// Every LV of `vg` (one `lvm lvs`).
pub fn list_lvs(ctx: &Context, vg: &str) -> Result<Vec<LvRow>> {
    Ok(report(ctx, "lvs", LV_FIELDS, vg)?.0)
}

/// The VG's extent size and free space (one `lvm vgs`).
pub fn vg_info(ctx: &Context, vg: &str) -> Result<VgRow> {
    report(ctx, "vgs", VG_FIELDS, vg)?
        .1
        .into_iter()
        .find(|r| r.vg_name == vg)
        .ok_or_else(|| Error::refused(format!("volume group {vg} not found on this node; create it (vgcreate) or fix options.volumegroup")))
}

/// `lvm lvcreate`: a thick LV of `bytes` (already a whole number of extents), or a thin LV in
/// `pool`, carrying `tags` from the start (one metadata commit: there is never an untagged LV). `-Zy -Wy` zero the start and wipe old signatures, so a new LV made of extents that held
/// someone else's filesystem probes blank instead of exposing the old data.
pub fn lvcreate(
    ctx: &Context,
    vg: &str,
    lv: &str,
    bytes: u64,
    pool: Option<&str>,
    tags: &[&str],
) -> Result<()> {
    // No autoactivation for thick LVs: this driver activates the LV in waitforattach and
    // deactivates it in unmountdevice. Otherwise udev's `vgchange -aay` on any later PV event (and
    // every boot) re-activates LVs no pod uses (seen in the guest tier with udev running). Thin
    // LVs refuse the option; their pool's setting (the operator's) governs them.
    let mut cmd = lvm(ctx, "lvcreate").args(["-y", "-Wy"]);
    for tag in tags {
        cmd = cmd.args(["--addtag", tag]);
    }
    cmd = cmd.args(["-n", lv]);
    cmd = match pool {
        Some(p) => cmd.args(["-V", &format!("{bytes}b"), "--thinpool", p]),
        None => cmd.args([
            "--setautoactivation",
            "n",
            "-Zy",
            "-L",
            &format!("{bytes}b"),
        ]),
    };
    ctx.runner.check(&cmd.args(["--", vg]))?;
    Ok(())
}

/// `lvm lvchange -ay` (activation-skip flags ignored: the PV names this LV on purpose).
pub fn activate(ctx: &Context, vg_lv: &str) -> Result<()> {
    ctx.runner
        .check(&lvm(ctx, "lvchange").args(["-ay", "-K", "--", vg_lv]))?;
    Ok(())
}

/// `lvm lvchange -an`.
pub fn deactivate(ctx: &Context, vg_lv: &str) -> Result<()> {
    ctx.runner
        .check(&lvm(ctx, "lvchange").args(["-an", "--", vg_lv]))?;
    Ok(())
}

/// `lvm lvremove -y <vg>/<lv>`. The caller checked, under the volume lock, that the LV is ours
/// and not in use; `-y` only answers lvremove's "really remove?" question (no `-f`: lvremove still
/// refuses an LV that is open).
pub fn lvremove(ctx: &Context, vg_lv: &str) -> Result<()> {
    ctx.runner
        .check(&lvm(ctx, "lvremove").args(["-y", "--", vg_lv]))?;
    Ok(())
}

/// `lvm lvchange --addtag`.
pub fn add_tag(ctx: &Context, vg_lv: &str, tag: &str) -> Result<()> {
    ctx.runner
        .check(&lvm(ctx, "lvchange").args(["-y", "--addtag", tag, "--", vg_lv]))?;
    Ok(())
}

/// `lvm lvextend -L <bytes>b` (no `-r`: the filesystem is grown by us, with the mounted path).
pub fn lvextend(ctx: &Context, vg_lv: &str, bytes: u64) -> Result<()> {
    ctx.runner.check(&lvm(ctx, "lvextend").args([
        "-y",
        "-L",
        &format!("{bytes}b"),
        "--",
        vg_lv,
    ]))?;
    Ok(())
}

/// What `blkid -p` found on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
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
pub fn probe(ctx: &Context, dev: &Path) -> Result<Probe> {
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
pub fn mkfs(ctx: &Context, fs: &super::FsType, args: &[String], dev: &Path) -> Result<()> {
    let mut cmd = Cmd::new(&fs.mkfs_tool())
        .timeout(ctx.deadline.cap(ctx.config.command_timeout()))
        .cwd(empty_dir(ctx)?);
    if matches!(fs, super::FsType::Ext4 | super::FsType::Xfs) {
        cmd = cmd.arg("-q");
    }
    ctx.runner.check(&cmd.args(args).arg(dev))?;
    Ok(())
}

/// `<runDir>/lvm-empty`: a directory of root's, mode 0500, that nothing writes into; created on
/// first use. Anything else at that path (a symlink, a file) is an error.
pub fn empty_dir(ctx: &Context) -> Result<std::path::PathBuf> {
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
pub fn grow_fs(ctx: &Context, fs_type: &str, dev: &Path, mount_point: &Path) -> Result<()> {
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

/// The device seam: tests substitute device numbers for real block devices, and say what the
/// host does with them.
pub trait Devices {
    /// `(major, minor)` of the block device at `path` (symlinks followed); `None` when absent.
    fn block_device(&self, path: &Path) -> Result<Option<(u32, u32)>>;
    /// Device numbers of the block devices in use as swap (`/proc/swaps`; swap files live on a
    /// mounted filesystem, which the mount check sees).
    fn swaps(&self) -> Result<Vec<(u32, u32)>>;
    /// Names of the devices stacked on this one (`/sys/dev/block/<major>:<minor>/holders`).
    fn holders(&self, dev: (u32, u32)) -> Result<Vec<String>>;
}

/// The real `/dev`.
pub struct SysDevices;

impl Devices for SysDevices {
    fn block_device(&self, path: &Path) -> Result<Option<(u32, u32)>> {
        match std::fs::metadata(path) {
            Ok(m) if m.file_type().is_block_device() => {
                let rdev = m.rdev();
                // rustix splits dev_t as the kernel does (major 12 bits, minor 20): both are u32.
                Ok(Some((rustix::fs::major(rdev), rustix::fs::minor(rdev))))
            }
            Ok(_) => Err(Error::refused(format!(
                "{} exists but is not a block device; refusing to use it",
                path.display()
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("stat", path, e)),
        }
    }

    fn swaps(&self) -> Result<Vec<(u32, u32)>> {
        let path = Path::new("/proc/swaps");
        let text = match std::fs::read(path) {
            Ok(t) => t,
            // A kernel without swap support has no /proc/swaps.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("read", path, e)),
        };
        let mut out = Vec::new();
        for line in text.split(|b| *b == b'\n').skip(1) {
            let mut fields = line
                .split(|b| b.is_ascii_whitespace())
                .filter(|f| !f.is_empty());
            let (Some(name), Some(kind)) = (fields.next(), fields.next()) else {
                continue;
            };
            if kind != b"partition" {
                continue;
            }
            let name = std::ffi::OsString::from_vec(crate::sys::mountinfo::unescape(name));
            if let Ok(Some(n)) = self.block_device(Path::new(&name)) {
                out.push(n);
            }
        }
        Ok(out)
    }

    fn holders(&self, (major, minor): (u32, u32)) -> Result<Vec<String>> {
        let dir = format!("/sys/dev/block/{major}:{minor}/holders");
        match std::fs::read_dir(&dir) {
            Ok(d) => Ok(d
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(Error::io("read", Path::new(&dir), e)),
        }
    }
}

/// Waits (bounded by `limit` and the call's deadline) for the device node to appear: with udev the
/// `/dev/<vg>/<lv>` link may come a moment after `lvchange` returns.
pub fn wait_for_device(ctx: &Context, dev: &Path, limit: Duration) -> Result<(u32, u32)> {
    let until = Instant::now() + ctx.deadline.cap(limit);
    loop {
        if let Some(n) = ctx.devices.block_device(dev)? {
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
