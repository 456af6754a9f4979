//! The block-device seam of the LVM backend ([`Devices`]): device numbers, swap and holders, so
//! the "in use by the host" check (`policy.rs`) can be tested with fake devices.
//! [`SysDevices`] reads the real `/dev`, `/proc/swaps` and sysfs.

use crate::error::{Error, Result};
use crate::sys::process::Deadline;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

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
    /// Copies the first `bytes` of the block device `from` onto the block device `to` (both must
    /// be block devices, `to` at least `bytes` long), then flushes `to`; fails once `deadline`
    /// has passed (checked between chunks). For thick LV clones (`provision::storage::lvm`): the caller
    /// made `to` and checked that nothing uses either.
    fn copy_blocks(&self, from: &Path, to: &Path, bytes: u64, deadline: &Deadline) -> Result<()>;
}

/// The real `/dev`.
pub(crate) struct SysDevices;

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

    fn copy_blocks(&self, from: &Path, to: &Path, bytes: u64, deadline: &Deadline) -> Result<()> {
        let open = |p: &Path, write: bool| -> Result<std::fs::File> {
            let f = std::fs::OpenOptions::new()
                .read(!write)
                .write(write)
                .open(p)
                .map_err(|e| Error::io("open", p, e))?;
            let m = f.metadata().map_err(|e| Error::io("stat", p, e))?;
            if !m.file_type().is_block_device() {
                return Err(Error::refused(format!(
                    "{} is not a block device; refusing to copy",
                    p.display()
                )));
            }
            Ok(f)
        };
        let (mut src, mut dst) = (open(from, false)?, open(to, true)?);
        let mut buf = vec![0u8; 4 << 20];
        let mut left = bytes;
        while left > 0 {
            if deadline.expired() {
                return Err(Error::refused(format!(
                    "copying {} to {} did not finish in time ({} of {bytes} bytes left); it is made again on the next pass",
                    from.display(),
                    to.display(),
                    left
                )));
            }
            let want = usize::try_from(left).map_or(buf.len(), |l| l.min(buf.len()));
            let n = src
                .read(&mut buf[..want])
                .map_err(|e| Error::io("read", from, e))?;
            if n == 0 {
                return Err(Error::refused(format!(
                    "{} ended {left} bytes before its size; nothing was copied for good",
                    from.display()
                )));
            }
            dst.write_all(&buf[..n])
                .map_err(|e| Error::io("write", to, e))?;
            left -= u64::try_from(n).unwrap_or(left);
        }
        dst.sync_all().map_err(|e| Error::io("fsync", to, e))
    }
}
