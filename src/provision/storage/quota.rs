//! Enforced sizes for hostPath volume directories: one project quota per directory.
//!
//! Where a root's filesystem enforces project quotas — XFS mounted with `prjquota` (or `pquota`),
//! ext4 with the `project` feature mounted with `prjquota` — each volume directory gets its own
//! project ID, the inherit flag (everything created below it is charged to that project) and a
//! hard block limit of the claim's size rounded up to the filesystem block. Then a write past the
//! size fails (XFS answers ENOSPC; ext4 EDQUOT, and ext4 lets processes with `CAP_SYS_RESOURCE`
//! through, as its generic quota code always does), and `statfs` of the directory — and of any
//! bind mount of it, which is what kubelet's volume stats and `df` in the pod see — reports the
//! project's limit and usage instead of the whole filesystem's. Anywhere else the size is not
//! enforced, and [`Support::NotEnforced`] says why and what to do.
//!
//! Detection ([`detect`]): `statfs` of the root gives the filesystem type; one read of
//! `/proc/self/mountinfo` gives the mount that holds the root and its superblock options, where
//! the kernel shows `prjquota` only when project quotas are accounted *and* enforced (`pqnoenforce`
//! for accounting only). Nothing is guessed from the configuration.
//!
//! Project IDs ([`choose_id`]): derived from the PV name (FNV-1a) into a high range,
//! [`ID_FIRST`]..=[`ID_LAST`], away from the low IDs people put in `/etc/projects` and from
//! kubelet's own range (from 1048577); if the preferred ID is already in use on the filesystem —
//! it has a quota record there (`xfs_quota report` lists every project with usage or limits, and a
//! directory carrying an ID is itself charged to it) or another volume's record (or old marker)
//! names it — the next free one is taken. The caller persists the chosen ID in the volume's
//! root-only ownership record ([`volumedir::Record`]) *before* it is applied, so it is stable across
//! restarts, and a pass after a kill -9 reuses it (the marker in the directory gets a copy, for
//! people only).
//!
//! Safety rules:
//! - `xfs_quota` (and, for one inode's project ID, `xfs_io`) are the only tools, run through the [`Runner`] seam (found in the node's
//!   `toolDirs`, argv only, a deadline on every call). Its `-c` argument is a command string that
//!   `xfs_quota` splits itself: nothing goes in it but our own fixed words, numbers, and a
//!   directory path that passed [`safe_path`] (absolute, characters from a small safe set; others
//!   are refused, never quoted). `-D /dev/null -P /dev/null` keep `/etc/projects` and
//!   `/etc/projid` out of it, so an administrator's entry for the same ID cannot make it touch
//!   another tree.
//! - `project -s` walks the directory without following symlinks or crossing mounts
//!   (`nftw(FTW_PHYS|FTW_MOUNT)`); it is run on a freshly made directory (provisioning), never on a
//!   volume in use except to enforce a size that was not enforced before.
//! - Every step is idempotent: setting the same ID, flag and limit again changes nothing, so a
//!   pass after a kill between `mkdir` and the limit finishes the job. A limit is only ever raised
//!   by [`raise`]; shrinking is the caller's to refuse.
//! - What is reported enforced has been checked: after setting up, the directory's inherit flag
//!   (`FS_IOC_GETFLAGS`), its ID (`xfs_io lsproj` on its descriptor) and the limit (`report`)
//!   are read back. A project limits blocks (the size) and files ([`inode_limit`]).
//! - No check walks a tree: `project -c` would open every name in it (a name a pod can swap for
//!   a symlink to a device between the walk's `lstat` and its `open`) and print a line per inode
//!   that differs. Every read of a directory's project (before a delete, a resize, a drift
//!   repair, and after setting up) is one ioctl on the directory itself, by descriptor; the only
//!   walk left is `project -s` when a size is set up, as above.
//! - A limit is cleared ([`release`]) only when the project holds nothing: a file of a deleted
//!   volume that a process still has open stays charged to it, and bounded.
//! - Nothing a tenant can write chooses the project a command acts on: the ID comes from the
//!   root-only record (an old volume without one: from its marker, which the pod can rewrite), and
//!   before delete clears a limit or resize sets one, [`check_project`] asks the filesystem whether
//!   the directory itself really carries that ID (one ioctl); on a mismatch nothing is changed
//!   and the error says so. (A pod with `CAP_FOWNER` in the initial user namespace could change
//!   its directory's project itself; for an old volume, that and a rewritten marker together
//!   remain possible — records close it for every volume made since.)
//! - Quota drift ([`check_drift`]): such a pod can move its volume's directory out of its project
//!   or clear the inherit flag, and its writes escape the size. Each resync the provisioner reads
//!   the top directory's project and flag on the inode the record names, decides with the pure
//!   [`drift`], and puts back what differs on that inode: the flag by `FS_IOC_SETFLAGS`, the ID by
//!   `xfs_io -r -c 'chproj <id>'` pointed at the open descriptor (`/proc/<pid>/fd/<n>`, one ioctl,
//!   no walk): `FS_IOC_FSSETXATTR` has no safe binding here. Inodes moved out deeper in the tree
//!   are not found (that is a walk of the whole volume); docs/security.md says what holds.

use crate::provision::storage::error::ProvisionError;
use crate::provision::storage::volumedir::{
    self, DirState, Marker, Record, Root, SCAN_DEPTH, VolumeDirError,
};
use crate::sys::dirfd::{self, FsMagic};
use crate::sys::exec::{Cmd, Runner};
use crate::vocab::ANN_PROJECT;
use crate::vocab::{ANN_SIZE, ANN_SIZE_ENFORCED, ANN_SIZE_NOTE};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the project-quota work can fail with, by the kind a caller branches on. The message
/// (`Display`) is the text people read in events, logs and `flexvol status`, unchanged from when
/// these were plain strings. A plain `String` converts to [`QuotaError::Failed`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// Sizes cannot be enforced here: the filesystem does not enforce project quotas (any more),
    /// or a path has characters flexvol does not pass to `xfs_quota`.
    #[error("{0}")]
    Unsupported(String),
    /// A quota tool (`xfs_quota`, `xfs_io`) failed, timed out, or printed what flexvol cannot
    /// read.
    #[error("{0}")]
    Tool(String),
    /// What was set does not read back (the inherit flag, the project, the limit): the size is
    /// not enforced.
    #[error("{0}")]
    NotEnforced(String),
    /// The directory does not carry the project its record or marker names, or its record names
    /// another directory: flexvol touches no quota for it. Left for a person.
    #[error("{0}")]
    NotOurs(String),
    /// The marked-directory library's error (reading or writing the volume's record), its kind
    /// kept.
    #[error(transparent)]
    Dir(#[from] VolumeDirError),
    /// A step failed (the filesystem, every project ID in use): the next pass tries again.
    #[error("{0}")]
    Failed(String),
    /// A deleted volume's project still holds blocks or files (one a process still has open):
    /// its limit stays, and so does the record naming it, until a later try finds it empty.
    #[error("{0}")]
    Held(String),
}

impl From<String> for QuotaError {
    fn from(why: String) -> Self {
        Self::Failed(why)
    }
}

/// Each kind to the provisioners' kind: a directory that does not carry its project is
/// [`ProvisionError::Refused`], the record's errors keep theirs, the rest are failed steps.
impl From<QuotaError> for ProvisionError {
    fn from(e: QuotaError) -> Self {
        match e {
            QuotaError::NotOurs(m) => Self::Refused(m),
            QuotaError::Dir(e) => e.into(),
            QuotaError::Unsupported(m)
            | QuotaError::Tool(m)
            | QuotaError::NotEnforced(m)
            | QuotaError::Failed(m)
            | QuotaError::Held(m) => Self::Failed(m),
        }
    }
}

/// For the marked-directory library's steps that release a project ([`release`] in a
/// `delete_volume_dir_then` or `finish_deletes` callback): a limit that stays keeps the record,
/// whatever the reason, and the step is tried again.
impl From<QuotaError> for VolumeDirError {
    fn from(e: QuotaError) -> Self {
        match e {
            QuotaError::Dir(e) => e,
            other => VolumeDirError::Failed(other.to_string()),
        }
    }
}

/// First project ID flexvol hands out.
pub const ID_FIRST: u32 = 0x4000_0000;
/// Last project ID flexvol hands out (below 2^31, which every project-quota filesystem takes).
pub const ID_LAST: u32 = 0x7fff_fffe;
/// Deadline of one `xfs_quota` call (they touch one directory's metadata and one quota record).
pub(crate) const TIMEOUT: Duration = Duration::from_secs(30);

/// A filesystem kind with project quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FsKind {
    /// XFS (`prjquota`/`pquota`).
    Xfs,
    /// ext4 with the `project` feature (`prjquota`); `xfs_quota` needs `-f` for it.
    Ext4,
}

/// A filesystem that enforces project quotas, as [`detect`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaFs {
    /// Which kind.
    pub kind: FsKind,
    /// The mount point `xfs_quota` is pointed at (the mount that holds the root).
    pub mount_point: PathBuf,
    /// The filesystem block size: limits are rounded up to it.
    pub(crate) block_size: u64,
}

/// Whether sizes can be enforced below a root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// Project quotas are enforced on the root's filesystem.
    Enforced(QuotaFs),
    /// They are not; the text says why and what to do (for the PV's `flexvol/size-note`).
    NotEnforced(String),
}

/// Usage and limit of one project, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Bytes charged to the project.
    pub used_bytes: u64,
    /// Hard block limit (0: none).
    pub limit_bytes: u64,
}

/// Finds out whether the filesystem holding `root` enforces project quotas.
pub fn detect(root: &Path) -> Support {
    let (magic, block_size) = match dirfd::statfs(root) {
        Ok(s) => s,
        Err(e) => return Support::NotEnforced(format!("cannot statfs {}: {e}", root.display())),
    };
    let kind = match magic {
        FsMagic::Xfs => Some(FsKind::Xfs),
        FsMagic::Ext4 => Some(FsKind::Ext4),
        FsMagic::Other => None,
    };
    let table = match crate::sys::mountinfo::MountTable::read() {
        Ok(t) => t,
        Err(e) => return Support::NotEnforced(format!("cannot read the mount table: {e}")),
    };
    let Some(m) = table.containing(root) else {
        return Support::NotEnforced(format!("no mount holds {}", root.display()));
    };
    let block = block_size.unwrap_or(4096).max(512);
    classify(
        root,
        kind,
        &m.fs_type,
        &m.super_options,
        &m.mount_point,
        block,
    )
}

/// The decision of [`detect`], from what it read: the kind by `statfs` magic, the filesystem name,
/// superblock options and mount point of the mount holding `root` from mountinfo.
pub(crate) fn classify(
    root: &Path,
    kind: Option<FsKind>,
    fs_name: &str,
    super_options: &str,
    mount_point: &Path,
    block_size: u64,
) -> Support {
    let has = |o: &str| super_options.split(',').any(|x| x == o);
    let on = format!("{} (mounted at {})", root.display(), mount_point.display());
    match kind {
        Some(k) if has("prjquota") => Support::Enforced(QuotaFs {
            kind: k,
            mount_point: mount_point.to_owned(),
            block_size,
        }),
        Some(FsKind::Xfs) if has("pqnoenforce") => Support::NotEnforced(format!(
            "filesystem xfs on {on} accounts project quotas without enforcing them (pqnoenforce): mount it with -o prjquota to enforce sizes"
        )),
        Some(FsKind::Xfs) => Support::NotEnforced(format!(
            "filesystem xfs without prjquota on {on}: mount it with -o prjquota to enforce sizes"
        )),
        Some(FsKind::Ext4) => Support::NotEnforced(format!(
            "filesystem ext4 without prjquota on {on}: enable its project feature (tune2fs -O project,quota while unmounted) and mount it with -o prjquota to enforce sizes"
        )),
        None => Support::NotEnforced(format!(
            "filesystem {fs_name} on {on} has no project quotas: put the root on XFS mounted with -o prjquota (or ext4 with the project feature, mounted with -o prjquota) to enforce sizes"
        )),
    }
}

/// FNV-1a, 64 bits: a stable hash (std's is seeded per process).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The project ID a volume would get on an empty filesystem.
pub fn preferred_id(volume: &str) -> u32 {
    let span = u64::from(ID_LAST - ID_FIRST) + 1;
    // The remainder is below `span` < 2^31: it fits.
    ID_FIRST + u32::try_from(fnv1a(volume) % span).unwrap_or(0)
}

/// The project ID for `volume`: its preferred one, or the next (wrapping in the range) that is not
/// in `used`. `None` only when the whole range is used.
pub(crate) fn choose_id(volume: &str, used: &BTreeSet<u32>) -> Option<u32> {
    next_free(preferred_id(volume), used, ID_FIRST, ID_LAST)
}

/// The first of `start`, `start + 1`, ... (wrapping from `last` to `first`) not in `used`.
fn next_free(start: u32, used: &BTreeSet<u32>, first: u32, last: u32) -> Option<u32> {
    let mut id = start;
    loop {
        if !used.contains(&id) {
            return Some(id);
        }
        id = if id >= last { first } else { id + 1 };
        if id == start {
            return None;
        }
    }
}

/// Rounds `bytes` up to a multiple of `block` (at least one block).
pub(crate) fn round_up(bytes: u64, block: u64) -> u64 {
    let block = block.max(1);
    bytes.max(1).div_ceil(block).saturating_mul(block)
}

/// Checks that a path may be written into an `xfs_quota` command string: absolute, and made only
/// of ASCII letters, digits and `/ . _ - + @ :` (no spaces, quotes, or anything `xfs_quota`'s own
/// tokenizer could read as a separator). Refused, never quoted.
pub(crate) fn safe_path(p: &Path) -> Result<&str, QuotaError> {
    let s = p.to_str().filter(|s| {
        s.starts_with('/')
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/._-+@:".contains(&b))
    });
    s.ok_or_else(|| {
        QuotaError::Unsupported(format!(
            "the path {:?} has characters flexvol does not pass to xfs_quota (only letters, digits and / . _ - + @ : are); use a root and pathPattern without them to enforce sizes",
            p.display()
        ))
    })
}

/// Parses `xfs_quota -c 'report -p -b -N -n'`: lines `#ID used soft hard warn [grace]`, values
/// in KiB. Lines that do not have that shape are skipped (blank lines, other filesystems' headers).
pub(crate) fn parse_report(text: &str) -> BTreeMap<u32, Usage> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let Some(id) = f
            .next()
            .and_then(|s| s.strip_prefix('#'))
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let nums: Vec<u64> = f.take(3).map_while(|s| s.parse().ok()).collect();
        if let [used, _soft, hard] = nums[..] {
            out.insert(
                id,
                Usage {
                    used_bytes: used.saturating_mul(1024),
                    limit_bytes: hard.saturating_mul(1024),
                },
            );
        }
    }
    out
}

fn xfs_quota(fs: &QuotaFs, command: String) -> Cmd {
    let mut c = Cmd::new("xfs_quota").arg("-x");
    if fs.kind == FsKind::Ext4 {
        c = c.arg("-f"); // ext4 is "foreign" to xfs_quota: without -f, limits are not set
    }
    c.args(["-D", "/dev/null", "-P", "/dev/null", "-c"])
        .arg(command)
        .arg(&fs.mount_point)
        .timeout(TIMEOUT)
}

fn run(runner: &dyn Runner, cmd: &Cmd) -> Result<String, QuotaError> {
    let out = runner
        .check(cmd)
        .map_err(|e| QuotaError::Tool(e.to_string()))?;
    Ok(out.stdout_text())
}

/// Usage and limits of every project on `fs`.
pub fn report(runner: &dyn Runner, fs: &QuotaFs) -> Result<BTreeMap<u32, Usage>, QuotaError> {
    run(runner, &xfs_quota(fs, "report -p -b -N -n".into())).map(|t| parse_report(&t))
}

/// The most files (inodes) a project of `bytes` may hold: one per 2 KiB of its size, at least
/// 1,024. A file with data takes a block of its own (4 KiB on most filesystems), so this binds
/// only a tree of empty files, FIFOs, symlinks or directories — which the block limit would not
/// bound at all: their inodes come from the filesystem's table (ext4's is fixed when it is
/// made; XFS's may take a quarter of the filesystem), and when it runs out no file can be
/// created anywhere on it.
pub fn inode_limit(bytes: u64) -> u64 {
    (bytes / 2048).max(1024)
}

/// Sets the hard limits of project `id`: blocks to `bytes` rounded up to the block (returned),
/// files to [`inode_limit`]. Used both to set a new volume's limits and to raise them.
pub fn set_limit(
    runner: &dyn Runner,
    fs: &QuotaFs,
    id: u32,
    bytes: u64,
) -> Result<u64, QuotaError> {
    let limit = round_up(bytes, fs.block_size);
    set_limits(runner, fs, id, limit, inode_limit(limit))?;
    Ok(limit)
}

fn set_limits(
    runner: &dyn Runner,
    fs: &QuotaFs,
    id: u32,
    limit: u64,
    files: u64,
) -> Result<(), QuotaError> {
    run(
        runner,
        &xfs_quota(fs, format!("limit -p bhard={limit} ihard={files} {id}")),
    )
    .map(drop)
}

/// Files (inodes) each project holds on `fs`, and its file limit (0: none) (`report -p -i`).
fn files_used(runner: &dyn Runner, fs: &QuotaFs) -> Result<BTreeMap<u32, (u64, u64)>, QuotaError> {
    // parse_report reads KiB; inode counts are plain numbers.
    run(runner, &xfs_quota(fs, "report -p -i -N -n".into())).map(|t| {
        parse_report(&t)
            .into_iter()
            .map(|(id, u)| (id, (u.used_bytes / 1024, u.limit_bytes / 1024)))
            .collect()
    })
}

/// Whether `dir` has the project-inherit flag (read with `FS_IOC_GETFLAGS`, no symlink followed).
pub fn has_inherit_flag(dir: &Path) -> Result<bool, QuotaError> {
    let fd = dirfd::open_dir_for_flags(dir)
        .map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
    dirfd::project_inherit(&fd)
        .map_err(|e| QuotaError::Failed(format!("cannot read the flags of {}: {e}", dir.display())))
}

/// Gives `dir` (and what is in it) project `id` with the inherit flag, then the limit `bytes`
/// (rounded up to the block), then reads all three back. Idempotent. Returns the limit set.
pub fn apply(
    runner: &dyn Runner,
    fs: &QuotaFs,
    dir: &Path,
    id: u32,
    bytes: u64,
) -> Result<u64, QuotaError> {
    let p = safe_path(dir)?;
    run(runner, &xfs_quota(fs, format!("project -s -p {p} {id}")))?;
    let limit = set_limit(runner, fs, id, bytes)?;
    verify(runner, fs, dir, id, limit)?;
    Ok(limit)
}

/// Checks that `dir` carries project `id` with the inherit flag and that the project's limit is
/// at least `limit`. The directory itself, by descriptor ([`read_attrs`]): what is below it is
/// its tenant's (on a resize, a live tree), never walked here (see [`check_project`]).
pub(crate) fn verify(
    runner: &dyn Runner,
    fs: &QuotaFs,
    dir: &Path,
    id: u32,
    limit: u64,
) -> Result<(), QuotaError> {
    let fd = dirfd::open_dir(dir).map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
    let seen = read_attrs(runner, &fd)?;
    if seen.id != id || !seen.inherit {
        return Err(QuotaError::NotEnforced(format!(
            "{} carries project {} {} the project-inherit flag, where project {id} with the flag was set; its size is not enforced",
            dir.display(),
            seen.id,
            if seen.inherit { "with" } else { "without" }
        )));
    }
    let have = report(runner, fs)?.get(&id).copied().unwrap_or_default();
    if have.limit_bytes < limit {
        return Err(QuotaError::NotEnforced(format!(
            "the limit of project {id} on {} reads {} bytes, not {limit}; its size is not enforced",
            fs.mount_point.display(),
            have.limit_bytes
        )));
    }
    Ok(())
}

/// What [`enforce`] achieved for one volume directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Project `id` with a hard limit of `limit_bytes` is in force on the directory.
    Enforced {
        /// The project ID (as persisted in the record).
        id: u32,
        /// The limit in force, in bytes.
        limit_bytes: u64,
    },
    /// The size is not enforced; why, and what to do.
    NotEnforced(String),
}

/// Enforces `bytes` on the volume directory `dir` of PV `volume`, on a filesystem [`detect`]
/// found.
///
/// `known` is the project ID the directory's record already names (an earlier, maybe killed, pass
/// chose it): it is reused as is. Otherwise an ID is chosen ([`choose_id`]) among those not in the
/// filesystem's quota report nor in `taken` (the IDs other volumes' records name), and `persist`
/// must record it in the record durably before anything is applied; its error stops here.
/// `Err` is a failure to retry (a tool failed, the record could not be written); a filesystem
/// without quotas or an unusable path is `Ok(NotEnforced)`.
#[allow(clippy::too_many_arguments)]
pub fn enforce(
    runner: &dyn Runner,
    support: &Support,
    dir: &Path,
    volume: &str,
    known: Option<u32>,
    taken: &BTreeSet<u32>,
    bytes: u64,
    persist: impl FnOnce(u32) -> Result<(), QuotaError>,
) -> Result<Outcome, QuotaError> {
    let fs = match support {
        Support::Enforced(fs) => fs,
        Support::NotEnforced(why) => return Ok(Outcome::NotEnforced(why.clone())),
    };
    if let Err(why) = safe_path(dir) {
        return Ok(Outcome::NotEnforced(why.to_string()));
    }
    let id = match known {
        Some(id) => id,
        None => {
            let mut used: BTreeSet<u32> = report(runner, fs)?.into_keys().collect();
            used.extend(taken);
            let id = choose_id(volume, &used).ok_or_else(|| {
                format!(
                    "every project ID from {ID_FIRST} to {ID_LAST} is in use on {}",
                    fs.mount_point.display()
                )
            })?;
            persist(id)?;
            crate::sys::process::checkpoint("provisioner-quota-after-id");
            id
        }
    };
    let limit_bytes = apply(runner, fs, dir, id, bytes)?;
    Ok(Outcome::Enforced { id, limit_bytes })
}

/// Raises the limit of the volume directory `dir` carrying project `id` to at least `bytes`;
/// returns the limit in force. A block limit already at or above it stays (never lowered); the file limit is set too.
pub fn raise(
    runner: &dyn Runner,
    fs: &QuotaFs,
    dir: &Path,
    id: u32,
    bytes: u64,
) -> Result<u64, QuotaError> {
    let want = round_up(bytes, fs.block_size);
    let have = report(runner, fs)?.get(&id).copied().unwrap_or_default();
    // Set even when the size is reached already: a volume made before projects limited files
    // gets its file limit this way (never a lower block limit). Its files: the size's share,
    // never lowered; a volume without a file limit yet that holds more keeps room for 1,024 more
    // (its next file must not fail) — once only: a limit it has is never raised past the size's
    // share for what it holds, or growing by a block at a time would lift it without end.
    let limit = want.max(have.limit_bytes);
    let (held, had) = files_used(runner, fs)?.get(&id).copied().unwrap_or((0, 0));
    let files = if had == 0 {
        inode_limit(limit).max(held.saturating_add(1024))
    } else {
        inode_limit(limit).max(had)
    };
    set_limits(runner, fs, id, limit, files)?;
    verify(runner, fs, dir, id, limit)?;
    Ok(limit)
}

impl Outcome {
    /// The PV annotations that say what came of it ([`ANN_SIZE`], [`ANN_SIZE_ENFORCED`], and
    /// [`ANN_SIZE_NOTE`] or [`ANN_PROJECT`]). `requested` is the claim's size.
    pub fn annotations(&self, requested: u64) -> BTreeMap<String, String> {
        match self {
            Outcome::Enforced { id, limit_bytes } => BTreeMap::from([
                (ANN_SIZE.to_owned(), limit_bytes.max(&requested).to_string()),
                (ANN_SIZE_ENFORCED.to_owned(), "true".to_owned()),
                (ANN_PROJECT.to_owned(), id.to_string()),
            ]),
            Outcome::NotEnforced(why) => BTreeMap::from([
                (ANN_SIZE.to_owned(), requested.to_string()),
                (ANN_SIZE_ENFORCED.to_owned(), "false".to_owned()),
                (ANN_SIZE_NOTE.to_owned(), why.clone()),
            ]),
        }
    }
}

/// [`detect`] for a volume directory, and whether the tool is there: a filesystem with quotas but
/// no `xfs_quota` in the node's `toolDirs` cannot enforce anything.
pub(crate) fn detect_with_tool(runner: &dyn Runner, dir: &Path) -> Support {
    match detect(dir) {
        Support::Enforced(fs) if !runner.has_tool("xfs_quota") => Support::NotEnforced(format!(
            "{} enforces project quotas but xfs_quota is not installed in the node's toolDirs: install xfsprogs to enforce sizes",
            fs.mount_point.display()
        )),
        s => s,
    }
}

/// Enforces `bytes` on the marked volume directory `<root>/<rel>` just made (or found, made by an
/// earlier pass): the ID comes from its record, or is chosen and recorded in the record first.
/// IDs other volumes' records (or old markers) under `root` name count as taken, so two volumes never share one
/// even when a kill left one's ID recorded but not yet applied.
pub(crate) fn enforce_volume(
    runner: &dyn Runner,
    root: &Root,
    rel: &Path,
    bytes: u64,
    ids: &IdScope,
) -> Result<Outcome, QuotaError> {
    let dir = root.real.join(rel);
    let rec = match volumedir::inspect(root, rel) {
        DirState::Owned(rec) => rec,
        _ => {
            return Err(QuotaError::Failed(format!(
                "{} has no flexvol record after it was made",
                dir.display()
            )));
        }
    };
    let m = rec.marker.clone();
    let support = detect_with_tool(runner, &dir);
    let choosing = m.project_id.is_none() && matches!(support, Support::Enforced(_));
    // Choosing an ID: under the node-wide lock (the provisioner and the CSI plugin's ephemeral
    // volumes choose IDs on the same filesystems), counting every record on the node.
    let _held = if choosing { Some(ids.lock()?) } else { None };
    let taken: BTreeSet<u32> = if choosing {
        let mut roots = vec![root.clone()];
        roots.extend(volumedir::usable_roots(&ids.roots, false).0);
        // Old volumes' markers (found in place) and every record, also one whose directory is
        // gone: a delete a kill interrupted still holds its ID until its limit is cleared.
        volumedir::scan(&roots, SCAN_DEPTH)
            .into_iter()
            .filter(|f| f.marker.volume != m.volume)
            .filter_map(|f| f.marker.project_id)
            .chain(
                ids.recorded(root)
                    .into_iter()
                    .filter(|(v, _)| *v != m.volume)
                    .map(|(_, id)| id),
            )
            .collect()
    } else {
        BTreeSet::new()
    };
    enforce(
        runner,
        &support,
        &dir,
        &m.volume,
        m.project_id,
        &taken,
        bytes,
        |id| {
            // The root-only record is what counts; the marker in the directory is informational.
            volumedir::write_record(
                root,
                &Record {
                    marker: Marker {
                        project_id: Some(id),
                        ..m.clone()
                    },
                    ..rec.clone()
                },
            )?;
            let _ = volumedir::write_marker(
                &dir,
                &Marker {
                    project_id: Some(id),
                    ..m.clone()
                },
            );
            Ok(())
        },
    )
}

/// Where a new project ID is chosen from ([`enforce_volume`]): every root of the node whose
/// records name IDs (the provisioning roots and the ephemeral presets' roots), and the directory
/// of the node-wide lock that one choice at a time holds (a file under the config's `runDir`).
pub(crate) struct IdScope {
    /// The roots whose records count as taken IDs.
    pub(crate) roots: Vec<PathBuf>,
    /// The lock directory (`Config::lock_dir`).
    pub(crate) lock_dir: PathBuf,
}

/// The lock every choice of a project ID holds on a node.
const ID_LOCK: &str = "quota-project-ids";

impl IdScope {
    /// Every root of `cfg` that holds records, and its lock directory.
    pub(crate) fn of(cfg: &crate::node::config::Config) -> Self {
        let mut roots = cfg.local_path.all_roots();
        roots.extend(cfg.hostpath.ephemeral_roots());
        Self {
            roots,
            lock_dir: cfg.lock_dir(),
        }
    }

    /// Every (volume, project ID) the root-only records of `root` and of this scope's roots name,
    /// whatever state their directories are in (one a kill left recorded but not applied, one a
    /// delete has already taken away).
    fn recorded(&self, root: &Root) -> Vec<(String, u32)> {
        let mut roots = vec![root.clone()];
        roots.extend(volumedir::usable_roots(&self.roots, false).0);
        let mut out = Vec::new();
        for r in &roots {
            for rec in volumedir::read_records(r).unwrap_or_default() {
                if let Some(id) = rec.marker.project_id {
                    out.push((rec.marker.volume, id));
                }
            }
        }
        out
    }

    fn lock(&self) -> Result<crate::sys::lock::VolumeLock, QuotaError> {
        crate::sys::lock::VolumeLock::acquire(&self.lock_dir, ID_LOCK, TIMEOUT)
            .map_err(|e| QuotaError::Failed(format!("choosing a project ID: {e}")))
    }
}

/// Checks that the directory `dir` itself really carries project `id`: what the record or an old
/// marker names is acted on only when the filesystem agrees. An old volume's marker is
/// tenant-writable: without this, a tenant could make delete clear, or resize set, the limit of
/// another volume's project. The directory is opened by descriptor (no symlink anywhere in
/// `dir`, which is a root's canonical path and a volume's relative one) and its project read by
/// one ioctl on that inode ([`read_attrs`]). Nothing below it is looked at: `xfs_quota project
/// -c` would walk the tenant's tree by name (opening what a pod can swap for a symlink to a
/// device or a FIFO between the walk's `lstat` and its `open`) and print a line per inode that
/// differs (output the tenant sizes).
pub(crate) fn check_project(runner: &dyn Runner, dir: &Path, id: u32) -> Result<(), QuotaError> {
    let fd = dirfd::open_dir(dir).map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
    let seen = read_attrs(runner, &fd)?;
    if seen.id != id {
        return Err(QuotaError::NotOurs(format!(
            "{} does not carry project {id}, which its record or marker names (it carries {}); flexvol does not touch project quotas for it: check the directory's project (xfs_io -c lsproj)",
            dir.display(),
            seen.id
        )));
    }
    Ok(())
}

/// The project ID flexvol may act on for the volume directory `<root>/<rel>` of PV `volume`: the
/// one its record (or, for an old volume, its marker) names, cross-checked against the
/// directory's real project ([`check_project`]) where quotas are enforced; for a directory already
/// gone (a delete killed after its rename), the record's alone. `Ok(None)`: none, or nothing
/// enforces quotas there (so no quota command runs either).
pub(crate) fn project_of_volume(
    runner: &dyn Runner,
    root: &Root,
    rel: &Path,
    volume: &str,
) -> Result<Option<u32>, QuotaError> {
    let claimed = match volumedir::inspect(root, rel) {
        DirState::Owned(r) if r.marker.volume == volume => r.marker.project_id,
        DirState::Legacy(m) if m.volume == volume => m.project_id,
        // A delete killed after its rename: the directory is the tombstone now, and only the
        // root-only record still names its project (whose limit keeps the ID from being chosen
        // again until it is cleared).
        DirState::Missing => {
            return Ok(volumedir::read_record(root, volume)?
                .filter(|r| Path::new(&r.path) == rel)
                .and_then(|r| r.marker.project_id));
        }
        _ => None,
    };
    let Some(id) = claimed else {
        return Ok(None);
    };
    let dir = root.real.join(rel);
    checked_id(runner, &detect_with_tool(runner, &dir), &dir, id)
}

/// `id` when `support` enforces nothing or `dir` really carries it; an error otherwise.
pub(crate) fn checked_id(
    runner: &dyn Runner,
    support: &Support,
    dir: &Path,
    id: u32,
) -> Result<Option<u32>, QuotaError> {
    match support {
        Support::Enforced(_) => check_project(runner, dir, id).map(|()| Some(id)),
        Support::NotEnforced(_) => Ok(None),
    }
}

/// Grows the volume directory `<root>/<rel>` of PV `volume` (claim `claim_uid`) to `bytes`:
/// raises its project's limit when its size is enforced; returns the size in force. Without a
/// project (the size was never enforced) it returns `bytes` and changes nothing. A volume whose
/// size was enforced on a filesystem that no longer enforces quotas is an error: its old limit
/// would come back with the quotas. The project comes from the record (an old volume: its
/// marker) and is cross-checked against the directory's ([`check_project`]) first.
pub(crate) fn raise_volume(
    runner: &dyn Runner,
    root: &Root,
    rel: &Path,
    volume: &str,
    claim_uid: &str,
    bytes: u64,
) -> Result<u64, ProvisionError> {
    let dir = root.real.join(rel);
    let id = match volumedir::check_ours(root, rel, volume, claim_uid, "not grown")? {
        DirState::Owned(r) => r.marker.project_id,
        DirState::Legacy(m) => m.project_id,
        _ => None,
    };
    let Some(id) = id else {
        return Ok(bytes);
    };
    Ok(raise_checked(
        runner,
        &detect_with_tool(runner, &dir),
        &dir,
        id,
        bytes,
    )?)
}

/// [`raise`] on `support`, after checking that `dir` really carries project `id`
/// ([`check_project`]): a mismatch changes no limit.
pub(crate) fn raise_checked(
    runner: &dyn Runner,
    support: &Support,
    dir: &Path,
    id: u32,
    bytes: u64,
) -> Result<u64, QuotaError> {
    match support {
        Support::Enforced(fs) => {
            check_project(runner, dir, id)?;
            raise(runner, fs, dir, id, bytes)
        }
        Support::NotEnforced(why) => Err(QuotaError::Unsupported(format!(
            "{} has an enforced size (project {id}), but now {why}; its limit cannot be raised until then",
            dir.display()
        ))),
    }
}

/// After volume `volume`'s directory with project `id` was deleted: clears the project's limit,
/// so its quota record can go — under the node-wide project-ID lock, and only while no other
/// volume's record names `id` (a release repeated after the ID was freed and chosen again, by a
/// delete a kill interrupted and the recovery that finished it, must not clear the new owner's
/// limit). `Ok`: what was done, for the log; `Err` ([`QuotaError::Held`] when the project still
/// holds something, a tool's or the lock's error otherwise): the limit stays, and the caller
/// keeps the record naming it for a later try. `id` must come from [`project_of_volume`]
/// (cross-checked before the directory went, or the root-only record's).
pub(crate) fn release(
    runner: &dyn Runner,
    root: &Root,
    id: Option<u32>,
    volume: &str,
    ids: &IdScope,
) -> Result<String, QuotaError> {
    release_asking(runner, root, id, volume, ids, ASK_AFTER_DELETE)
}

/// [`release`] for a later pass over what a delete left (`finish_deletes`): the project is
/// asked once, not over half a second — it runs before every batch of the provisioner and every
/// sweep, and a project a tenant keeps a file of open would cost that wait each time.
pub(crate) fn release_later(
    runner: &dyn Runner,
    root: &Root,
    id: Option<u32>,
    volume: &str,
    ids: &IdScope,
) -> Result<String, QuotaError> {
    release_asking(runner, root, id, volume, ids, &[0])
}

/// How long [`still_held`] waits before each time it asks, right after a delete (XFS frees the
/// deleted inodes in the background).
const ASK_AFTER_DELETE: &[u64] = &[0, 50, 100, 150, 200];

fn release_asking(
    runner: &dyn Runner,
    root: &Root,
    id: Option<u32>,
    volume: &str,
    ids: &IdScope,
    asks: &[u64],
) -> Result<String, QuotaError> {
    let Some(id) = id else {
        return Ok(String::new());
    };
    let _held = ids
        .lock()
        .map_err(|e| QuotaError::Failed(format!("the limit of project {id} stays ({e})")))?;
    if let Some(other) = ids
        .recorded(root)
        .into_iter()
        .find(|(v, p)| *p == id && v != volume)
    {
        return Ok(format!(
            "; project {id} is volume {}'s now: its limit stays",
            other.0
        ));
    }
    release_asking_on(
        runner,
        &detect_with_tool(runner, &root.real),
        Some(id),
        asks,
    )
}

/// [`release`] on `support`: `Ok` with what was done (nothing, where no quota is enforced), `Err`
/// with why the limit stays — the project still holds something, or a tool failed — for the
/// caller to keep the record that names it and try again later.
#[cfg(test)]
pub(crate) fn release_on(
    runner: &dyn Runner,
    support: &Support,
    id: Option<u32>,
) -> Result<String, QuotaError> {
    release_asking_on(runner, support, id, ASK_AFTER_DELETE)
}

fn release_asking_on(
    runner: &dyn Runner,
    support: &Support,
    id: Option<u32>,
    asks: &[u64],
) -> Result<String, QuotaError> {
    let Some(id) = id else {
        return Ok(String::new());
    };
    let Support::Enforced(fs) = support else {
        return Ok(String::new());
    };
    match still_held(runner, fs, id, asks) {
        Ok(None) => {}
        Ok(Some((bytes, files))) => {
            return Err(QuotaError::Held(format!(
                "project {id} still holds {bytes} bytes in {files} files (a file of the deleted volume that a process still has open, or inodes the filesystem has not freed yet): its limit stays, so nothing written through it goes past the size, and so does the record naming it, for the next try"
            )));
        }
        Err(e) => {
            return Err(QuotaError::Tool(format!(
                "the limit of project {id} stays ({e})"
            )));
        }
    }
    run(
        runner,
        &xfs_quota(fs, format!("limit -p bhard=0 ihard=0 {id}")),
    )
    .map(|_| format!("; cleared the limit of project {id}"))
    .map_err(|e| QuotaError::Tool(format!("the limit of project {id} stays ({e})")))
}

/// What project `id` still holds after its directory was deleted: `None` when nothing (its
/// limit may go), else its bytes and files. A file of the deleted tree that a process still has
/// open (passed to another pod over a socket) keeps its blocks and inode charged to the project;
/// without its limit, writes through it would have no bound. XFS frees unlinked inodes in the
/// background, so a project that still holds something is asked again a few times over half a
/// second before it counts.
fn still_held(
    runner: &dyn Runner,
    fs: &QuotaFs,
    id: u32,
    asks: &[u64],
) -> Result<Option<(u64, u64)>, QuotaError> {
    let mut held = None;
    for wait_ms in asks {
        std::thread::sleep(Duration::from_millis(*wait_ms));
        let bytes = report(runner, fs)?.get(&id).map_or(0, |u| u.used_bytes);
        let files = files_used(runner, fs)?.get(&id).map_or(0, |f| f.0);
        held = (bytes != 0 || files != 0).then_some((bytes, files));
        if held.is_none() {
            break;
        }
    }
    Ok(held)
}

/// A directory's project as the filesystem has it: its project ID (`FS_IOC_FSGETXATTR`'s
/// `fsx_projid`) and whether it has the project-inherit flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ProjectAttrs {
    /// The project ID the directory is charged to.
    pub(crate) id: u32,
    /// Whether what is created in it gets its project (`FS_XFLAG_PROJINHERIT`).
    pub(crate) inherit: bool,
}

/// How a quota-enforced volume directory differs from its record: someone with `CAP_FOWNER`
/// in the initial user namespace (a root pod under Pod Security `baseline`) moved it to another
/// project (`chattr -p`, `xfs_io -c chproj`) or cleared its inherit flag (`chattr -P`), both
/// `FS_IOC_FSSETXATTR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Drift {
    /// The project its root-only record names.
    pub(crate) recorded: u32,
    /// What the directory carries.
    pub seen: ProjectAttrs,
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = (self.seen.id != self.recorded).then(|| {
            format!(
                "carries project {} instead of its recorded {}",
                self.seen.id, self.recorded
            )
        });
        let flag = (!self.seen.inherit).then_some("lacks the project-inherit flag");
        let what: Vec<String> = id.into_iter().chain(flag.map(str::to_owned)).collect();
        write!(
            f,
            "its directory {} (changed by a process with CAP_FOWNER: chattr -p/-P, FS_IOC_FSSETXATTR); its size was not enforced meanwhile",
            what.join(" and ")
        )
    }
}

/// Whether a volume directory whose record names project `recorded` has drifted from it: `seen`
/// is what the directory carries. Pure: the decision, for [`check_drift`] to act on.
pub(crate) fn drift(recorded: u32, seen: ProjectAttrs) -> Option<Drift> {
    (seen.id != recorded || !seen.inherit).then_some(Drift { recorded, seen })
}

/// Deadline of one `xfs_io` call (one ioctl on one inode).
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// `xfs_io -r -c <command> <dir>`, `dir` naming the inode `fd` holds
/// ([`dirfd::fd_path_for_child`]): the tool opens that very directory (read-only: the project
/// ioctls need no more) and does one ioctl on it, never walking below it. `command` is one of
/// our fixed strings.
fn xfs_io(fd: &impl std::os::fd::AsFd, command: String) -> Result<Cmd, QuotaError> {
    let target = dirfd::fd_path_for_child(fd)
        .map_err(|e| format!("cannot name the open directory for xfs_io: {e}"))?;
    Ok(Cmd::new("xfs_io")
        .args(["-r", "-c"])
        .arg(command)
        .arg(target)
        .timeout(IO_TIMEOUT))
}

/// Parses `xfs_io -c lsproj`: `projid = <n>`.
pub fn parse_lsproj(text: &str) -> Option<u32> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "projid").then(|| v.trim().parse().ok())?
    })
}

/// The project of the open directory `fd`: its inherit flag by `FS_IOC_GETFLAGS` here, its ID by
/// `xfs_io -c lsproj` (`FS_IOC_FSGETXATTR`, whose struct no safe binding flexvol uses exposes:
/// the tool does that one ioctl on this inode).
pub(crate) fn read_attrs(
    runner: &dyn Runner,
    fd: &impl std::os::fd::AsFd,
) -> Result<ProjectAttrs, QuotaError> {
    let inherit = dirfd::project_inherit(fd)
        .map_err(|e| format!("cannot read the directory's flags: {e}"))?;
    let out = run(runner, &xfs_io(fd, "lsproj".into())?)?;
    let id = parse_lsproj(&out).ok_or_else(|| {
        QuotaError::Tool(format!(
            "xfs_io lsproj printed no project ID: {:?}",
            out.trim()
        ))
    })?;
    Ok(ProjectAttrs { id, inherit })
}

/// Puts the open directory `fd` back in project `id` with the inherit flag (only what differs
/// in `seen`), then reads both back. The directory itself only: what a pod moved out deeper in
/// its tree stays where it is (see docs/security.md).
pub(crate) fn restore(
    runner: &dyn Runner,
    fd: &impl std::os::fd::AsFd,
    id: u32,
    seen: ProjectAttrs,
) -> Result<(), QuotaError> {
    if seen.id != id {
        run(runner, &xfs_io(fd, format!("chproj {id}"))?)?;
    }
    if !seen.inherit {
        dirfd::set_project_inherit(fd)
            .map_err(|e| format!("cannot set the project-inherit flag: {e}"))?;
    }
    let now = read_attrs(runner, fd)?;
    match drift(id, now) {
        None => Ok(()),
        Some(d) => Err(QuotaError::NotEnforced(format!("after restoring, {d}"))),
    }
}

/// What [`check_drift`] found for one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DriftCheck {
    /// Its directory carries its recorded project and the inherit flag (or it has no project to
    /// check: a volume without an enforced size, or without a record).
    Clean,
    /// It had drifted and was put back.
    Restored(Drift),
    /// It has drifted and could not be put back: why (retried on the next pass).
    NotRestored(Drift, String),
}

/// Checks the volume directory `<root>/<rel>` of PV `volume` against its root-only record and
/// puts back what drifted ([`drift`], [`restore`]). Only a record decides: the project is the
/// record's and the directory must be the very inode it names (opened by descriptor below the
/// root, no symlink, no mount crossed). A volume without a record (made before records: the next
/// pass's adoption gives it one) or whose record names no project is [`DriftCheck::Clean`].
/// `Err`: it could not be checked.
///
/// Cost: one small read of the record, one open and one `FS_IOC_GETFLAGS` of the directory, and
/// one `xfs_io lsproj` (a fork and exec doing one ioctl); a restore adds one `xfs_io chproj`, one
/// `FS_IOC_SETFLAGS` and the same reads again.
pub(crate) fn check_drift(
    runner: &dyn Runner,
    root: &Root,
    rel: &Path,
    volume: &str,
) -> Result<DriftCheck, QuotaError> {
    let rec = match volumedir::read_record(root, volume)? {
        Some(r) if r.marker.volume == volume => r,
        _ => return Ok(DriftCheck::Clean),
    };
    let Some(id) = rec.marker.project_id else {
        return Ok(DriftCheck::Clean);
    };
    if Path::new(&rec.path) != rel {
        return Err(QuotaError::NotOurs(format!(
            "its record names the directory {}, its PV {}; nothing was checked",
            rec.path,
            rel.display()
        )));
    }
    let top = dirfd::open_dir(&root.real)
        .map_err(|e| format!("cannot open {}: {e}", root.real.display()))?;
    let dir = dirfd::open_child_dir_as(&top, rel, (rec.dev, rec.ino))
        .map_err(|e| format!("cannot open {}: {e}", root.real.join(rel).display()))?;
    let seen = read_attrs(runner, &dir)?;
    let Some(d) = drift(id, seen) else {
        return Ok(DriftCheck::Clean);
    };
    Ok(match restore(runner, &dir, id, seen) {
        Ok(()) => DriftCheck::Restored(d),
        Err(why) => DriftCheck::NotRestored(d, why.to_string()),
    })
}

/// What `flexvol status` says about one provisioned directory's size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SizeStatus {
    /// Whether a project quota limits it now.
    pub enforced: bool,
    /// Its project ID, from its record (an old volume: its marker).
    pub project_id: Option<u32>,
    /// The hard limit in force, in bytes.
    pub limit_bytes: Option<u64>,
    /// Bytes used, as the quota counts them.
    pub used_bytes: Option<u64>,
    /// Why it is not enforced.
    pub note: Option<String>,
    /// Its directory no longer carries its recorded project or the inherit flag ([`Drift`]).
    pub drifted: bool,
}

/// The size status of each directory in `found` (one `xfs_quota report` per filesystem), as
/// the capacity record counts it (no per-volume command).
pub fn size_status(runner: &dyn Runner, found: &[volumedir::Found]) -> Vec<SizeStatus> {
    size_status_of(runner, found, false)
}

/// [`size_status`], and for each recorded directory with a project whether it still carries it
/// with the inherit flag ([`drift`]; one `xfs_io lsproj` each): what `flexvol status` shows.
pub fn size_status_checked(runner: &dyn Runner, found: &[volumedir::Found]) -> Vec<SizeStatus> {
    size_status_of(runner, found, true)
}

fn size_status_of(
    runner: &dyn Runner,
    found: &[volumedir::Found],
    check_drift: bool,
) -> Vec<SizeStatus> {
    let mut reports: BTreeMap<PathBuf, Result<BTreeMap<u32, Usage>, QuotaError>> = BTreeMap::new();
    found
        .iter()
        .map(|f| {
            let not = |note: String, id| SizeStatus {
                enforced: false,
                project_id: id,
                limit_bytes: None,
                used_bytes: None,
                note: Some(note),
                drifted: false,
            };
            let id = f.marker.project_id;
            let fs = match detect_with_tool(runner, &f.path) {
                Support::Enforced(fs) => fs,
                Support::NotEnforced(why) => return not(why, id),
            };
            let Some(id) = id else {
                return not(
                    "its filesystem enforces project quotas, but this directory has none (made before quotas were on, or by an older flexvol)".into(),
                    None,
                );
            };
            let rep = reports
                .entry(fs.mount_point.clone())
                .or_insert_with(|| report(runner, &fs));
            let usage = match rep {
                Ok(r) => r.get(&id).copied().unwrap_or_default(),
                Err(e) => return not(format!("cannot read its quota: {e}"), Some(id)),
            };
            // The directory's own project and flag, as the provisioner's passes check them (only
            // against a record: an old volume's marker is the pod's to rewrite).
            let seen = (check_drift && f.recorded).then(|| {
                dirfd::open_dir(&f.path)
                    .map_err(|e| QuotaError::Failed(e.to_string()))
                    .and_then(|fd| read_attrs(runner, &fd))
            });
            if let Some(d) = seen.and_then(Result::ok).and_then(|a| drift(id, a)) {
                return SizeStatus {
                    enforced: false,
                    project_id: Some(id),
                    limit_bytes: Some(usage.limit_bytes),
                    used_bytes: Some(usage.used_bytes),
                    note: Some(format!(
                        "drifted: {d}; the provisioner's next pass puts it back"
                    )),
                    drifted: true,
                };
            }
            let inherit = has_inherit_flag(&f.path).unwrap_or(false);
            if usage.limit_bytes == 0 || !inherit {
                return not(
                    format!(
                        "project {id} is recorded for it but {} (a provisioning pass that was interrupted finishes it)",
                        if inherit { "has no limit" } else { "the directory lacks the project-inherit flag" }
                    ),
                    Some(id),
                );
            }
            SizeStatus {
                enforced: true,
                project_id: Some(id),
                limit_bytes: Some(usage.limit_bytes),
                used_bytes: Some(usage.used_bytes),
                note: None,
                drifted: false,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::testing::FakeRunner;

    fn xfs() -> QuotaFs {
        QuotaFs {
            kind: FsKind::Xfs,
            mount_point: "/mnt/x".into(),
            block_size: 4096,
        }
    }

    /// Each failure is its kind, whatever its words: a tool that failed or timed out, a path
    /// never passed to the tool, a filesystem that stopped enforcing; only a directory not
    /// carrying its project is a refusal for the provisioners.
    #[test]
    fn quota_errors_are_typed_by_kind() {
        let r = FakeRunner::new();
        r.on(
            "xfs_quota",
            &["report"],
            1,
            "",
            "xfs_quota: cannot get quota",
        );
        let e = report(&r, &xfs()).unwrap_err();
        assert!(matches!(e, QuotaError::Tool(_)), "{e:?}");
        let r = FakeRunner::new();
        r.time_out("xfs_quota");
        let e = set_limit(&r, &xfs(), 7, 1).unwrap_err();
        assert!(matches!(e, QuotaError::Tool(_)), "{e:?}");
        assert_eq!(
            ProvisionError::from(e.clone()),
            ProvisionError::Failed(e.to_string())
        );
        let e = safe_path(Path::new("/a b")).unwrap_err();
        assert!(matches!(e, QuotaError::Unsupported(_)), "{e:?}");
        let gone = Support::NotEnforced("its filesystem is ext2".into());
        let e = raise_checked(&r, &gone, Path::new("/mnt/x/v"), 7, 1).unwrap_err();
        assert!(matches!(e, QuotaError::Unsupported(_)), "{e:?}");
        assert!(e.to_string().contains("cannot be raised"), "{e}");
        let e = QuotaError::from(VolumeDirError::Occupied("inside".into()));
        assert_eq!(
            ProvisionError::from(e),
            ProvisionError::Refused("inside".into())
        );
    }

    #[test]
    fn detection_reads_the_kind_and_the_superblock_options() {
        let c = |k, name, opts| {
            classify(
                Path::new("/srv/flexvol"),
                k,
                name,
                opts,
                Path::new("/srv"),
                4096,
            )
        };
        assert_eq!(
            c(
                Some(FsKind::Xfs),
                "xfs",
                "rw,attr2,inode64,logbufs=8,logbsize=32k,prjquota"
            ),
            Support::Enforced(QuotaFs {
                kind: FsKind::Xfs,
                mount_point: "/srv".into(),
                block_size: 4096
            })
        );
        assert!(matches!(
            c(Some(FsKind::Ext4), "ext4", "rw,prjquota"),
            Support::Enforced(QuotaFs {
                kind: FsKind::Ext4,
                ..
            })
        ));
        for (k, name, opts, want) in [
            (
                Some(FsKind::Xfs),
                "xfs",
                "rw,attr2,inode64,noquota",
                "filesystem xfs without prjquota on /srv/flexvol (mounted at /srv): mount it with -o prjquota to enforce sizes",
            ),
            (
                Some(FsKind::Xfs),
                "xfs",
                "rw,attr2,pqnoenforce",
                "without enforcing them (pqnoenforce)",
            ),
            (
                Some(FsKind::Xfs),
                "xfs",
                "rw,usrquota",
                "xfs without prjquota",
            ),
            (Some(FsKind::Ext4), "ext4", "rw", "tune2fs -O project,quota"),
            (None, "tmpfs", "rw,prjquota", "filesystem tmpfs on"),
        ] {
            match c(k, name, opts) {
                Support::NotEnforced(why) => assert!(why.contains(want), "{opts}: {why}"),
                s => panic!("{opts}: {s:?}"),
            }
        }
    }

    #[test]
    fn ids_are_stable_in_range_and_skip_used_ones() {
        let a = preferred_id("pvc-1b4e28ba-2fa1-11d2-883f-0016d3cca427");
        assert_eq!(a, preferred_id("pvc-1b4e28ba-2fa1-11d2-883f-0016d3cca427"));
        assert_ne!(a, preferred_id("pvc-1b4e28ba-2fa1-11d2-883f-0016d3cca428"));
        for i in 0..1000 {
            let id = preferred_id(&format!("pvc-{i}"));
            assert!((ID_FIRST..=ID_LAST).contains(&id), "{id}");
        }
        let v = "pvc-x";
        let p = preferred_id(v);
        assert_eq!(choose_id(v, &BTreeSet::new()), Some(p));
        let used: BTreeSet<u32> = [p, p + 1].into();
        assert_eq!(choose_id(v, &used), Some(p + 2));
        // Wraps at the end of the range, and says when nothing is free (a small range as a model).
        let used: BTreeSet<u32> = [18, 19, 20].into();
        assert_eq!(next_free(19, &used, 10, 20), Some(10));
        let all: BTreeSet<u32> = (10..=20).collect();
        assert_eq!(next_free(15, &all, 10, 20), None);
    }

    #[test]
    fn reports_are_parsed_in_kib() {
        let text = "#0                   0          0          0     00 [--------]\n\
                    #1073741999      20420          0      20480     00 [--------]\n\
                    \n\
                    garbage line\n\
                    #12 x y z\n";
        let r = parse_report(text);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[&1_073_741_999],
            Usage {
                used_bytes: 20420 * 1024,
                limit_bytes: 20 << 20
            }
        );
        assert_eq!(r[&0], Usage::default());
    }

    #[test]
    fn paths_outside_the_safe_set_are_refused() {
        for ok in ["/srv/flexvol/pvc-1_ns_c", "/a/b.c/d-e/f+g@h:i"] {
            assert_eq!(safe_path(Path::new(ok)).unwrap(), ok);
        }
        for bad in [
            "relative/x",
            "/srv/a b",
            "/srv/a'b",
            "/srv/a\"b",
            "/srv/a;limit",
            "/srv/a\tb",
            "/srv/ä",
            "/srv/$x",
        ] {
            assert!(safe_path(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_round_up_to_the_block() {
        assert_eq!(round_up(1, 4096), 4096);
        assert_eq!(round_up(4096, 4096), 4096);
        assert_eq!(round_up(4097, 4096), 8192);
        assert_eq!(round_up(0, 4096), 4096);
        assert_eq!(round_up(64 << 20, 4096), 64 << 20);
    }

    #[test]
    fn commands_are_argv_with_fixed_words_numbers_and_the_checked_path() {
        let r = FakeRunner::new();
        let fs = xfs();
        set_limit(&r, &fs, 1_073_741_999, 20 << 20).unwrap();
        assert_eq!(
            r.lines(),
            vec![
                "xfs_quota -x -D /dev/null -P /dev/null -c 'limit -p bhard=20971520 ihard=10240 1073741999' /mnt/x"
            ]
        );
        let calls = r.calls();
        assert_eq!(calls[0].timeout, TIMEOUT);
        // ext4 needs -f.
        let r = FakeRunner::new();
        let e4 = QuotaFs {
            kind: FsKind::Ext4,
            ..fs.clone()
        };
        report(&r, &e4).unwrap();
        assert_eq!(
            r.lines(),
            vec!["xfs_quota -x -f -D /dev/null -P /dev/null -c 'report -p -b -N -n' /mnt/x"]
        );
        // An unsafe path never reaches a command.
        let r = FakeRunner::new();
        assert!(apply(&r, &fs, Path::new("/mnt/x/a b"), 7, 1).is_err());
        assert!(r.calls().is_empty());
    }

    #[test]
    fn enforce_persists_a_new_id_before_applying_and_reuses_a_known_one() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("v");
        std::fs::create_dir(&dir).unwrap();
        let fs = xfs();
        let sup = Support::Enforced(fs.clone());
        let v = "pvc-abc";
        let p = preferred_id(v);
        // The preferred ID is in the report, the next one in another marker: p + 2.
        let r = FakeRunner::new();
        r.on(
            "xfs_quota",
            &["report -p -b -N -n"],
            0,
            &format!("#0 0 0 0 00 [--------]\n#{p} 4 0 1024 00 [--------]\n"),
            "",
        );
        r.on(
            "xfs_io",
            &["lsproj"],
            0,
            &format!("projid = {}\n", p + 2),
            "",
        );
        let taken: BTreeSet<u32> = [p + 1].into();
        let mut persisted = None;
        // The directory of this tempdir has no inherit flag (tmpfs or not a quota fs): verify
        // fails, so the outcome is an error to retry — after the ID was persisted.
        let e = enforce(&r, &sup, &dir, v, None, &taken, 10 << 20, |id| {
            persisted = Some(id);
            Ok(())
        });
        assert_eq!(persisted, Some(p + 2));
        let lines = r.lines();
        assert!(
            lines[1].contains(&format!("'project -s -p {} {}'", dir.display(), p + 2)),
            "{lines:?}"
        );
        assert!(
            lines[2].contains(&format!("'limit -p bhard=10485760 ihard=5120 {}'", p + 2)),
            "{lines:?}"
        );
        let e = e.unwrap_err();
        assert!(matches!(e, QuotaError::NotEnforced(_)), "{e:?}");
        assert!(
            e.to_string().contains("flag"),
            "only verified enforcement counts: {e}"
        );

        // A known ID: no report to choose, no persist, same commands.
        let r = FakeRunner::new();
        let _ = enforce(&r, &sup, &dir, v, Some(77), &taken, 1, |_| {
            panic!("must not persist a known id")
        });
        assert!(r.lines()[0].contains("'project -s -p"), "{:?}", r.lines());
        assert!(r.lines()[0].ends_with(" 77' /mnt/x"), "{:?}", r.lines());

        // A persist failure stops before anything is applied.
        let r = FakeRunner::new();
        let e = enforce(&r, &sup, &dir, v, None, &taken, 1, |_| {
            Err(QuotaError::Failed("disk full".into()))
        });
        assert_eq!(e.unwrap_err(), QuotaError::Failed("disk full".into()));
        assert_eq!(r.count("xfs_quota"), 1, "only the report ran");

        // No quota support: nothing runs.
        let r = FakeRunner::new();
        let out = enforce(
            &r,
            &Support::NotEnforced("tmpfs".into()),
            &dir,
            v,
            None,
            &taken,
            1,
            |_| panic!(),
        )
        .unwrap();
        assert_eq!(out, Outcome::NotEnforced("tmpfs".into()));
        assert!(r.calls().is_empty());
    }

    /// An old volume (made before records: a marker, no record) `<root>/old` of PV `pvc-1`
    /// (claim uid `u1`), its marker naming `project_id`.
    fn old_volume(project_id: Option<u32>) -> (tempfile::TempDir, Root, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let root = volumedir::prepare_root(d.path()).unwrap();
        let dir = root.real.join("old");
        std::fs::create_dir(&dir).unwrap();
        let m = Marker {
            provisioner: "flexvol/hostpath".into(),
            volume: "pvc-1".into(),
            namespace: "ns".into(),
            claim: "c".into(),
            claim_uid: "u1".into(),
            node: "n".into(),
            project_id,
        };
        volumedir::write_marker(&dir, &m).unwrap();
        (d, root, dir)
    }

    #[test]
    fn a_tampered_marker_cannot_steer_quota_commands() {
        // An old volume (marker, no record): its tenant rewrote projectId to another volume's
        // project (`victim`); the directory really carries `own`.
        let (own, victim) = (0x4000_0010_u32, 0x4000_0020_u32);
        let (_d, root, dir) = old_volume(Some(victim));
        assert!(matches!(
            volumedir::inspect(&root, Path::new("old")),
            DirState::Legacy(m) if m.project_id == Some(victim)
        ));
        let r = FakeRunner::new();
        // The directory's own project, read by one ioctl on its inode.
        r.on("xfs_io", &["lsproj"], 0, &format!("projid = {own}\n"), "");
        r.on(
            "xfs_quota",
            &["report"],
            0,
            &format!("#{victim} 4 0 4096 00 [--------]\n"),
            "",
        );
        let sup = Support::Enforced(xfs());
        // Delete: the project is not released.
        let e = checked_id(&r, &sup, &dir, victim).unwrap_err();
        assert!(matches!(e, QuotaError::NotOurs(_)), "{e:?}");
        assert!(
            e.to_string()
                .contains(&format!("does not carry project {victim}")),
            "{e}"
        );
        // Resize: no limit is set.
        let e = raise_checked(&r, &sup, &dir, victim, 1 << 30).unwrap_err();
        // A refusal, for the resize's event: never a step to retry blindly.
        assert!(
            matches!(ProvisionError::from(e.clone()), ProvisionError::Refused(_)),
            "{e:?}"
        );
        assert!(e.to_string().contains("does not carry"), "{e}");
        assert!(
            !r.lines().iter().any(|l| l.contains("limit")),
            "{:?}",
            r.lines()
        );
        // The real one passes the check (nothing printed about the directory itself).
        let r = FakeRunner::new();
        r.on("xfs_io", &["lsproj"], 0, &format!("projid = {own}\n"), "");
        assert_eq!(checked_id(&r, &sup, &dir, own).unwrap(), Some(own));
        // Nothing walks the tenant's tree: no `xfs_quota project -c`, one ioctl on the directory.
        assert!(
            r.lines().iter().all(|l| !l.contains("project -c")),
            "{:?}",
            r.lines()
        );
        assert!(release_on(&r, &sup, Some(own)).unwrap().contains("cleared"));
        // Where nothing enforces quotas, nothing runs at all.
        let r = FakeRunner::new();
        let none = Support::NotEnforced("tmpfs".into());
        assert_eq!(checked_id(&r, &none, &dir, victim).unwrap(), None);
        assert!(r.calls().is_empty());
    }

    #[test]
    fn an_old_volume_without_a_project_grows_without_quota_commands() {
        let (_d, root, _) = old_volume(None);
        let r = FakeRunner::new();
        assert_eq!(
            raise_volume(&r, &root, Path::new("old"), "pvc-1", "u1", 5 << 20).unwrap(),
            5 << 20
        );
        assert!(raise_volume(&r, &root, Path::new("old"), "pvc-1", "u9", 5 << 20).is_err());
        assert_eq!(
            project_of_volume(&r, &root, Path::new("old"), "pvc-1").unwrap(),
            None
        );
        assert!(r.calls().is_empty());
    }

    #[test]
    fn raise_never_lowers_and_gives_the_file_limit_to_a_limit_already_there() {
        let r = FakeRunner::new();
        r.on(
            "xfs_quota",
            &["report -p -b"],
            0,
            "#9 4 0 40960 00 [--------]\n",
            "",
        );
        let d = tempfile::tempdir().unwrap();
        // Fails at verification (no inherit flag here), but the decision is visible in the calls.
        // Asked for less than its 40 MiB: the block limit stays, and gets its file limit (a
        // volume made before projects limited files).
        let _ = raise(&r, &xfs(), d.path(), 9, 20 << 20);
        // One that holds more files than its size would allow keeps room for them.
        let many = FakeRunner::new();
        many.on(
            "xfs_quota",
            &["report -p -b"],
            0,
            "#9 4 0 40960 00 [--------]\n",
            "",
        );
        many.on(
            "xfs_quota",
            &["report -p -i"],
            0,
            "#9 90000 0 0 00 [--------]\n",
            "",
        );
        let _ = raise(&many, &xfs(), d.path(), 9, 20 << 20);
        assert!(
            many.lines()
                .iter()
                .any(|l| l.contains("'limit -p bhard=41943040 ihard=91024 9'")),
            "{:?}",
            many.lines()
        );
        // One that has a file limit and is full keeps it, never more: growing by a block at a
        // time lifts no file limit.
        let full = FakeRunner::new();
        full.on(
            "xfs_quota",
            &["report -p -b"],
            0,
            "#9 4 0 40960 00 [--------]\n",
            "",
        );
        full.on(
            "xfs_quota",
            &["report -p -i"],
            0,
            "#9 95000 0 95000 00 [--------]\n",
            "",
        );
        let _ = raise(&full, &xfs(), d.path(), 9, (40 << 20) + 4096);
        assert!(
            full.lines()
                .iter()
                .any(|l| l.contains("'limit -p bhard=41947136 ihard=95000 9'")),
            "{:?}",
            full.lines()
        );
        assert!(
            r.lines()
                .iter()
                .any(|l| l.contains("'limit -p bhard=41943040 ihard=20480 9'")),
            "{:?}",
            r.lines()
        );
        let _ = raise(&r, &xfs(), d.path(), 9, (60 << 20) + 1);
        assert!(
            r.lines().iter().any(|l| l.contains(&format!(
                "'limit -p bhard={} ihard=30722 9'",
                (60 << 20) + 4096
            ))),
            "{:?}",
            r.lines()
        );
    }

    #[test]
    fn a_directory_out_of_its_project_or_without_the_flag_has_drifted() {
        let a = |id, inherit| ProjectAttrs { id, inherit };
        assert_eq!(drift(7, a(7, true)), None, "as recorded");
        for seen in [a(5, true), a(7, false), a(5, false), a(0, false)] {
            assert_eq!(
                drift(7, seen),
                Some(Drift { recorded: 7, seen }),
                "{seen:?}"
            );
        }
        let both = drift(7, a(5, false)).unwrap().to_string();
        assert!(
            both.starts_with("its directory carries project 5 instead of its recorded 7 and lacks the project-inherit flag"),
            "{both}"
        );
        let flag = drift(7, a(7, false)).unwrap().to_string();
        assert!(
            flag.starts_with("its directory lacks the project-inherit flag"),
            "{flag}"
        );
        assert_eq!(parse_lsproj("projid = 1073741999\n"), Some(1_073_741_999));
        assert_eq!(parse_lsproj("xfs_io: foo\n"), None);
        assert_eq!(parse_lsproj("projid = x\n"), None);
    }

    /// A root with the recorded volume directory `<root>/v` of PV `pvc-d` (project `id`).
    fn recorded_volume(id: Option<u32>) -> (tempfile::TempDir, Root, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let root = volumedir::prepare_root(d.path()).unwrap();
        let m = Marker {
            provisioner: "flexvol/hostpath".into(),
            volume: "pvc-d".into(),
            namespace: "ns".into(),
            claim: "c".into(),
            claim_uid: "ud".into(),
            node: "n".into(),
            project_id: None,
        };
        let dir =
            volumedir::create_volume_dir(&root, Path::new("v"), Default::default(), &m).unwrap();
        let mut rec = volumedir::read_record(&root, "pvc-d").unwrap().unwrap();
        rec.marker.project_id = id;
        volumedir::write_record(&root, &rec).unwrap();
        (d, root, dir)
    }

    #[test]
    fn drift_is_checked_on_the_recorded_inode_and_put_back_through_it() {
        let (_d, root, dir) = recorded_volume(Some(7));
        let r = FakeRunner::new();
        // The directory carries project 5 (a pod's chattr -p 5); after chproj it reads 7.
        r.on("xfs_io", &["lsproj"], 0, "projid = 7\n", "");
        r.once("xfs_io", &["lsproj"], 0, "projid = 5\n", "");
        let got = check_drift(&r, &root, Path::new("v"), "pvc-d");
        let lines = r.lines();
        // The tool is pointed at the descriptor checked here, never at the path.
        let fd = format!("/proc/{}/fd/", std::process::id());
        assert!(
            lines[0].starts_with(&format!("xfs_io -r -c lsproj {fd}")),
            "{lines:?}"
        );
        assert!(
            lines[1].starts_with(&format!("xfs_io -r -c 'chproj 7' {fd}")),
            "{lines:?}"
        );
        assert!(
            !lines.iter().any(|l| l.contains(dir.to_str().unwrap())),
            "{lines:?}"
        );
        assert_eq!(r.calls()[0].timeout, IO_TIMEOUT);
        match got {
            // Where the filesystem takes the inherit flag (ext4, XFS): put back and read back.
            Ok(DriftCheck::Restored(d)) => {
                assert_eq!(d.recorded, 7);
                assert_eq!(d.seen.id, 5);
                assert!(has_inherit_flag(&dir).unwrap());
                // The next pass finds it clean and changes nothing.
                let r2 = FakeRunner::new();
                r2.on("xfs_io", &["lsproj"], 0, "projid = 7\n", "");
                assert_eq!(
                    check_drift(&r2, &root, Path::new("v"), "pvc-d"),
                    Ok(DriftCheck::Clean)
                );
                assert_eq!(r2.lines().len(), 1, "{:?}", r2.lines());
            }
            // Elsewhere (tmpfs): the drift is found all the same, and not hidden.
            Ok(DriftCheck::NotRestored(d, why)) => {
                assert_eq!(d.seen.id, 5);
                assert!(why.contains("inherit"), "{why}");
            }
            other => {
                // A filesystem without FS_IOC_GETFLAGS at all: said, nothing run after.
                let e = format!("{other:?}");
                assert!(e.contains("flags"), "{e}");
            }
        }
    }

    #[test]
    fn only_a_record_decides_what_is_checked_and_put_back() {
        // No record naming a project: nothing runs.
        let (_d, root, dir) = recorded_volume(None);
        let r = FakeRunner::new();
        assert_eq!(
            check_drift(&r, &root, Path::new("v"), "pvc-d"),
            Ok(DriftCheck::Clean)
        );
        assert_eq!(
            check_drift(&r, &root, Path::new("v"), "pvc-other"),
            Ok(DriftCheck::Clean)
        );
        assert!(r.calls().is_empty());
        // A PV whose path is not the record's directory: refused.
        let (_d, root, dir2) = recorded_volume(Some(7));
        std::fs::create_dir(root.real.join("w")).unwrap();
        let e = check_drift(&r, &root, Path::new("w"), "pvc-d").unwrap_err();
        assert!(matches!(e, QuotaError::NotOurs(_)), "{e:?}");
        assert!(
            e.to_string().contains("its record names the directory v"),
            "{e}"
        );
        // The directory replaced by another (a rename while flexvol was not looking): not the
        // recorded inode, nothing run on it.
        std::fs::rename(&dir2, root.real.join("old")).unwrap();
        std::fs::rename(root.real.join("w"), &dir2).unwrap();
        let e = check_drift(&r, &root, Path::new("v"), "pvc-d").unwrap_err();
        assert!(e.to_string().contains("replaced"), "{e}");
        assert!(r.calls().is_empty(), "{:?}", r.lines());
        drop(dir);
    }

    /// A release repeated after its ID was freed and chosen again (a delete a kill interrupted,
    /// finished by the recovery, then retried) must not clear the new owner's limit: while
    /// another volume's record names the ID, nothing is run. Fails without the check (the
    /// runner would be asked to clear the limit).
    #[test]
    fn a_limit_stays_while_its_project_still_holds_a_byte_or_a_file() {
        let sup = Support::Enforced(xfs());
        let id = ID_FIRST + 3;
        // A deleted volume's file still open elsewhere: 8 KiB charged, then an empty one (an
        // inode, no block) that the process could still write to.
        for (blocks, inodes) in [("8", "1"), ("0", "1")] {
            let r = FakeRunner::new();
            r.on(
                "xfs_quota",
                &["report -p -b"],
                0,
                &format!("#{id} {blocks} 0 1024 00 [--------]\n"),
                "",
            );
            r.on(
                "xfs_quota",
                &["report -p -i"],
                0,
                &format!("#{id} {inodes} 0 0 00 [--------]\n"),
                "",
            );
            let said = release_on(&r, &sup, Some(id)).unwrap_err();
            assert!(matches!(said, QuotaError::Held(_)), "{said:?}");
            assert!(said.to_string().contains("still holds"), "{said}");
            assert!(
                r.lines().iter().all(|l| !l.contains("bhard=0")),
                "{:?}",
                r.lines()
            );
        }
        // Nothing held (or freed while asked again): cleared.
        let r = FakeRunner::new();
        r.once(
            "xfs_quota",
            &["report -p -b"],
            0,
            &format!("#{id} 4 0 1024 00 [--------]\n"),
            "",
        );
        let said = release_on(&r, &sup, Some(id)).unwrap();
        assert!(said.contains("cleared"), "{said}");
        assert_eq!(r.count("xfs_quota"), 5, "{:?}", r.lines());
    }

    #[test]
    fn a_release_never_clears_an_id_another_volume_has_now() {
        use crate::provision::storage::volumedir::{Marker, create_volume_dir, prepare_root};
        let d = tempfile::tempdir().unwrap();
        let root = prepare_root(&d.path().join("root")).unwrap();
        let other = Marker {
            provisioner: "p".into(),
            volume: "pvc-new-owner".into(),
            namespace: "ns".into(),
            claim: "c".into(),
            claim_uid: "u".into(),
            node: "n".into(),
            project_id: Some(ID_FIRST + 7),
        };
        create_volume_dir(&root, Path::new("w"), Default::default(), &other).unwrap();
        let ids = IdScope {
            roots: Vec::new(),
            lock_dir: d.path().join("locks"),
        };
        let runner = FakeRunner::new();
        let said = release(&runner, &root, Some(ID_FIRST + 7), "pvc-old", &ids).unwrap();
        assert!(said.contains("pvc-new-owner"), "{said}");
        assert!(runner.calls().is_empty(), "{:?}", runner.calls());
        // Its own record naming it is no obstacle (the volume being deleted).
        let said = release(&runner, &root, Some(ID_FIRST + 7), "pvc-new-owner", &ids).unwrap();
        assert!(!said.contains("now"), "{said}");
    }
}
