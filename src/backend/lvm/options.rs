//! The LVM options, validated before anything touches the node: names in LVM's charset, sizes as
//! Kubernetes quantities, the filesystem type, and mkfs/mount options through an allow-list so that
//! no value can smuggle an extra argument (`-f`, a second device) into a command line.

use crate::protocol::options::{Options, OptionsError, keys, shown_value};
use std::path::PathBuf;

/// Option keys the LVM backend reads (besides kubelet's own).
pub(crate) mod key {
    /// Volume group (required).
    pub(crate) const VOLUME_GROUP: &str = "volumegroup";
    /// LV name; derived from the PV name when absent.
    pub(crate) const VOLUME_ID: &str = "volumeID";
    /// Size to create the LV with, when it does not exist.
    pub(crate) const SIZE: &str = "size";
    /// Thin pool to create the LV in.
    pub(crate) const THIN_POOL: &str = "thinpool";
    /// Extra mkfs arguments (allow-listed).
    pub(crate) const MKFS_OPTIONS: &str = "mkfsOptions";
    /// Filesystem mount options (allow-listed).
    pub(crate) const MOUNT_OPTIONS: &str = "mountOptions";
    /// The provisioner's capability for the LV (never shown: the name is credential-like).
    pub(crate) const CAPABILITY_TOKEN: &str = crate::node::capability::OPTION;
    /// Every key a volume may set; any other key (except kubelet's own `kubernetes.io/...`) is
    /// an error, so a typo (`volumeid`, `sizee`) never falls back to a default.
    pub(crate) const ALL: &[&str] = &[
        VOLUME_GROUP,
        VOLUME_ID,
        SIZE,
        THIN_POOL,
        MKFS_OPTIONS,
        MOUNT_OPTIONS,
        CAPABILITY_TOKEN,
    ];
}

/// The filesystem a volume is formatted with and mounted as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FsType {
    /// `ext4`, the default.
    Ext4,
    /// `xfs`.
    Xfs,
    /// Any other type: usable only when `mkfs.<type>` exists on the node; no extra options.
    Other(String),
}

impl FsType {
    fn parse(s: &str) -> Result<Self, OptionsError> {
        match s {
            "" | "ext4" => Ok(FsType::Ext4),
            "xfs" => Ok(FsType::Xfs),
            t if !t.is_empty()
                && t.len() <= 16
                && t.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) =>
            {
                Ok(FsType::Other(t.to_owned()))
            }
            t => Err(OptionsError::invalid(
                keys::FS_TYPE,
                t,
                "expected ext4 (the default), xfs, or the name of another filesystem with a mkfs.<type> tool on the node",
            )),
        }
    }

    /// The name mount(2), blkid and mkfs use.
    pub fn name(&self) -> &str {
        match self {
            FsType::Ext4 => "ext4",
            FsType::Xfs => "xfs",
            FsType::Other(t) => t,
        }
    }

    /// The mkfs tool for this type.
    pub(crate) fn mkfs_tool(&self) -> String {
        format!("mkfs.{}", self.name())
    }
}

/// Typed, validated LVM options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LvmOptions {
    /// Volume group name.
    pub(crate) vg: String,
    /// Logical volume name.
    pub(crate) lv: String,
    /// Requested size in bytes (creation only).
    pub(crate) size: Option<u64>,
    /// Thin pool for creation.
    pub(crate) thin_pool: Option<String>,
    /// Filesystem type.
    pub(crate) fs: FsType,
    /// Extra mkfs arguments, each one argv element.
    pub(crate) mkfs_args: Vec<String>,
    /// mount(2) data options, comma-joined.
    pub(crate) mount_data: String,
    /// Mount read-only.
    pub(crate) read_only: bool,
    /// `kubernetes.io/pvOrVolumeName`, when sent.
    pub(crate) volume_name: Option<String>,
    /// `kubernetes.io/pod.namespace`, when sent (kubelet sends it to `mount` only, and there
    /// overrides whatever the options say; other verbs never read it).
    pub namespace: Option<String>,
    /// [`key::CAPABILITY_TOKEN`], when the PV carries one.
    pub(crate) token: Option<Token>,
}

/// A capability token from the options: its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Token(pub String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl LvmOptions {
    /// Validates every option; touches nothing. Keys are case-sensitive; a key that is neither
    /// one of [`key::ALL`] nor kubelet's (`kubernetes.io/...`, the same rule as the NFS backend)
    /// is refused, naming the key but never echoing its value.
    pub fn parse(o: &Options) -> Result<Self, OptionsError> {
        if let Some(k) = o
            .plain()
            .keys()
            .find(|k| !k.starts_with("kubernetes.io/") && !key::ALL.contains(&k.as_str()))
        {
            return Err(OptionsError::invalid(
                k,
                "<not shown>",
                format!(
                    "unknown LVM option (keys are case-sensitive); the options are {} (see drivers/lvm/README.md)",
                    key::ALL.join(", ")
                ),
            ));
        }
        let vg = o
            .require(
                key::VOLUME_GROUP,
                "set options.volumegroup to the name of an LVM volume group on the node",
            )?
            .to_owned();
        check_name(key::VOLUME_GROUP, &vg, false)?;
        let lv = match o.get(key::VOLUME_ID) {
            Some(id) => {
                check_name(key::VOLUME_ID, id, true)?;
                id.to_owned()
            }
            None => {
                let name = o.volume_name().ok_or_else(|| OptionsError::Missing {
                    key: key::VOLUME_ID.into(),
                    hint: "set options.volumeID to the logical volume name (kubelet did not send kubernetes.io/pvOrVolumeName to derive it from)".into(),
                })?;
                let lv = derive_lv_name(name);
                check_name(key::VOLUME_ID, &lv, true).map_err(|_| {
                    OptionsError::invalid(
                        keys::PV_OR_VOLUME_NAME,
                        name,
                        format!("cannot derive a valid LV name from it (got {lv:?}); set options.volumeID explicitly"),
                    )
                })?;
                lv
            }
        };
        let size = match o.get(key::SIZE) {
            None => None,
            Some(s) => Some(parse_size(s).map_err(|r| OptionsError::invalid(key::SIZE, s, r))?),
        };
        let thin_pool = match o.get(key::THIN_POOL) {
            None | Some("") => None,
            Some(p) => {
                check_name(key::THIN_POOL, p, true)?;
                Some(p.to_owned())
            }
        };
        let fs = FsType::parse(o.get(keys::FS_TYPE).unwrap_or(""))?;
        let mkfs_args = parse_mkfs_options(&fs, o.get(key::MKFS_OPTIONS).unwrap_or(""))?;
        let mount_data = parse_mount_options(&fs, o.get(key::MOUNT_OPTIONS).unwrap_or(""))?;
        Ok(Self {
            vg,
            lv,
            size,
            thin_pool,
            fs,
            mkfs_args,
            mount_data,
            read_only: o.read_only()?,
            volume_name: o.volume_name().map(str::to_owned),
            namespace: o.non_empty(keys::POD_NAMESPACE).map(str::to_owned),
            token: o
                .non_empty(key::CAPABILITY_TOKEN)
                .map(|t| Token(t.to_owned())),
        })
    }

    /// The options of a volume already staged (CSI NodeExpandVolume, `csi.rs`): names and
    /// filesystem type from the state record `mountdevice` wrote, checked again, nothing else.
    pub(crate) fn for_staged(vg: String, lv: String, fs_type: &str) -> Result<Self, OptionsError> {
        check_name(key::VOLUME_GROUP, &vg, false)?;
        check_name(key::VOLUME_ID, &lv, true)?;
        Ok(Self::named(vg, lv, FsType::parse(fs_type)?))
    }

    /// The options that name an LV (already checked with [`check_name`]) and its filesystem,
    /// and nothing else: no size, no token, read-write.
    pub(crate) fn named(vg: String, lv: String, fs: FsType) -> Self {
        Self {
            vg,
            lv,
            size: None,
            thin_pool: None,
            fs,
            mkfs_args: Vec::new(),
            mount_data: String::new(),
            read_only: false,
            volume_name: None,
            namespace: None,
            token: None,
        }
    }

    /// `/dev/<vg>/<lv>`: what attach returns and every node verb uses.
    pub(crate) fn device(&self) -> PathBuf {
        PathBuf::from(format!("/dev/{}/{}", self.vg, self.lv))
    }

    /// `<vg>/<lv>`: the LVM name and the lock key.
    pub(crate) fn key(&self) -> String {
        format!("{}/{}", self.vg, self.lv)
    }
}

/// LVM reserves these substrings inside LV names for its hidden sub-volumes.
const RESERVED_LV_PARTS: &[&str] = &[
    "_cdata", "_cmeta", "_corig", "_cpool", "_cvol", "_imeta", "_iorig", "_mimage", "_mlog",
    "_pmspare", "_rimage", "_rmeta", "_tdata", "_tmeta", "_vdata", "_vorigin", "_wcorig",
];

/// Checks a VG or LV name against LVM's rules (lvm(8) "VALID NAMES"), so a bad name fails here
/// with our message instead of reaching a command line.
pub(crate) fn check_name(key: &str, name: &str, is_lv: bool) -> Result<(), OptionsError> {
    let bad = |reason: &str| OptionsError::invalid(key, name, reason);
    if name.is_empty() {
        return Err(bad("must not be empty"));
    }
    if name.len() > 127 {
        return Err(bad("must be at most 127 characters"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "+_.-".contains(*c)))
    {
        return Err(bad(&format!(
            "contains {c:?}; LVM names may only use letters, digits and + _ . -"
        )));
    }
    if name.starts_with('-') {
        return Err(bad("must not start with '-'"));
    }
    if name == "." || name == ".." {
        return Err(bad("must not be \".\" or \"..\""));
    }
    if is_lv {
        if name.starts_with("snapshot") || name.starts_with("pvmove") {
            return Err(bad("LVM reserves names starting with snapshot or pvmove"));
        }
        if let Some(p) = RESERVED_LV_PARTS.iter().find(|p| name.contains(*p)) {
            return Err(bad(&format!("LVM reserves names containing {p}")));
        }
    }
    Ok(())
}

/// The LV name for a volume without `volumeID`: the PV (or inline volume) name itself when it is
/// already a valid LV name, which every Kubernetes object name is; otherwise `fv_` + the name with
/// characters outside `[A-Za-z0-9+_.-]` turned into `_` + `_` + 8 hex digits of a hash of the
/// original. The prefix keeps it from starting with `-` or a reserved word; the hash keeps two names
/// that differ only in replaced characters apart. Deterministic: the same name gives the same LV
/// on every node and every release.
pub(crate) fn derive_lv_name(name: &str) -> String {
    if check_name("", name, true).is_ok() {
        return name.to_owned();
    }
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "+_.-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    let mut h: u32 = 0x811c9dc5; // FNV-1a, stable across versions
    for b in name.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x01000193);
    }
    format!("fv_{clean}_{h:08x}")
}

/// Kubernetes quantities are parsed in one place for the driver and the provisioner.
pub(crate) use crate::protocol::quantity::parse_size;

/// One mkfs flag the allow-list accepts, and what its value may be.
struct MkfsFlag {
    flag: &'static str,
    value: Value,
    what: &'static str,
}

/// The grammar of a flag's value. No grammar admits `/`, `.` runs or any other path syntax: the
/// only path on a mkfs command line is the device, which the driver appends itself. (mkfs.xfs
/// takes path-valued sub-options such as `-l logdev=`, `-d name=`, `-r rtdev=`, and mke2fs has
/// `-d root-dir`, `-J device=`; a relative one would resolve against mkfs's working directory.)
#[derive(Clone, Copy)]
enum Value {
    /// A plain check on the whole value.
    Check(fn(&str) -> bool),
    /// A comma-separated list of `name[=value]` sub-options, each from this table.
    Subs(&'static [Sub]),
    /// A comma-separated list of `[^]feature` names from this table.
    Features(&'static [&'static str]),
}

/// One sub-option (`-l size=4m`, `-E stride=16`) and the type of its value.
struct Sub {
    name: &'static str,
    kind: Kind,
}

#[derive(Clone, Copy)]
enum Kind {
    /// A decimal number.
    Num,
    /// A number with an optional unit letter (`4096`, `64k`, `1g`, `8s`, `2b`).
    Size,
    /// `0` or `1`.
    Bool,
    /// Bare (`noalign`) or `=0`/`=1`.
    Flag,
    /// Bare only.
    Bare,
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// `usrquota`, `grpquota`, `prjquota` joined by `:` (mke2fs `-E quotatype=`).
    QuotaTypes,
}

impl Kind {
    fn accepts(self, value: Option<&str>) -> bool {
        match (self, value) {
            (Kind::Bare, v) => v.is_none(),
            (Kind::Flag, None) => true,
            (Kind::Flag | Kind::Bool, Some(v)) => v == "0" || v == "1",
            (_, None) => false,
            (Kind::Num, Some(v)) => digits(v),
            (Kind::Size, Some(v)) => {
                let n = v.strip_suffix(['k', 'm', 'g', 't', 's', 'b']).unwrap_or(v);
                digits(n)
            }
            (Kind::OneOf(words), Some(v)) => words.contains(&v),
            (Kind::QuotaTypes, Some(v)) => v
                .split(':')
                .all(|t| matches!(t, "usrquota" | "grpquota" | "prjquota")),
        }
    }
}

const fn sub(name: &'static str, kind: Kind) -> Sub {
    Sub { name, kind }
}

fn digits(v: &str) -> bool {
    !v.is_empty() && v.len() <= 12 && v.bytes().all(|b| b.is_ascii_digit())
}
fn label16(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 16
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        && !v.starts_with('-')
}
fn label12(v: &str) -> bool {
    label16(v) && v.len() <= 12
}
fn word(v: &str) -> bool {
    !v.is_empty() && v.len() <= 32 && v.bytes().all(|b| b.is_ascii_lowercase())
}

/// ext4(5) features mke2fs `-O` may set or (with `^`) clear. Not `journal_dev`: it turns the LV
/// into an external journal for another filesystem.
const EXT4_FEATURES: &[&str] = &[
    "64bit",
    "bigalloc",
    "casefold",
    "dir_index",
    "dir_nlink",
    "ea_inode",
    "encrypt",
    "ext_attr",
    "extent",
    "extents",
    "extra_isize",
    "filetype",
    "flex_bg",
    "has_journal",
    "huge_file",
    "inline_data",
    "large_dir",
    "large_file",
    "meta_bg",
    "metadata_csum",
    "metadata_csum_seed",
    "mmp",
    "orphan_file",
    "project",
    "quota",
    "resize_inode",
    "sparse_super",
    "sparse_super2",
    "stable_inodes",
    "uninit_bg",
    "verity",
];

/// mke2fs `-E`. Not `root_owner` (kubelet applies fsGroup; the root directory stays root's),
/// `offset`, `android_sparse` or `test_fs`.
const EXT4_EXTENDED: &[Sub] = &[
    sub("stride", Kind::Num),
    sub("stripe_width", Kind::Num),
    sub("stripe-width", Kind::Num),
    sub("resize", Kind::Num),
    sub("lazy_itable_init", Kind::Flag),
    sub("lazy_journal_init", Kind::Flag),
    sub("packed_meta_blocks", Kind::Flag),
    sub("assume_storage_prezeroed", Kind::Flag),
    sub("discard", Kind::Bare),
    sub("nodiscard", Kind::Bare),
    sub("num_backup_sb", Kind::OneOf(&["0", "1", "2"])),
    sub("mmp_update_interval", Kind::Num),
    sub("quotatype", Kind::QuotaTypes),
    sub("encoding", Kind::OneOf(&["utf8", "utf8-12.1"])),
    sub("encoding_flags", Kind::OneOf(&["strict"])),
    sub("orphan_file_size", Kind::Num),
];

const EXT4_MKFS: &[MkfsFlag] = &[
    MkfsFlag {
        flag: "-b",
        value: Value::Check(|v| matches!(v, "1024" | "2048" | "4096")),
        what: "a block size of 1024, 2048 or 4096",
    },
    MkfsFlag {
        flag: "-i",
        value: Value::Check(digits),
        what: "bytes per inode",
    },
    MkfsFlag {
        flag: "-I",
        value: Value::Check(digits),
        what: "an inode size",
    },
    MkfsFlag {
        flag: "-N",
        value: Value::Check(digits),
        what: "a number of inodes",
    },
    MkfsFlag {
        flag: "-m",
        value: Value::Check(|v| digits(v) && v.parse::<u32>().is_ok_and(|p| p <= 50)),
        what: "a reserved-blocks percentage (0-50)",
    },
    MkfsFlag {
        flag: "-L",
        value: Value::Check(label16),
        what: "a label of up to 16 characters [A-Za-z0-9_.-]",
    },
    MkfsFlag {
        flag: "-O",
        value: Value::Features(EXT4_FEATURES),
        what: "a feature list such as ^has_journal,quota",
    },
    MkfsFlag {
        flag: "-E",
        value: Value::Subs(EXT4_EXTENDED),
        what: "extended options such as lazy_itable_init=0,stride=16",
    },
    MkfsFlag {
        flag: "-T",
        value: Value::Check(word),
        what: "a usage type such as largefile",
    },
];

/// mkfs.xfs sections, value-typed sub-options only: no `file=`, `name=`, `logdev=`, `rtdev=`
/// (paths), no `-r` (realtime device), `-p` (protofile) or `-c` (config file).
const XFS_BLOCK: &[Sub] = &[sub("size", Kind::Size)];
const XFS_DATA: &[Sub] = &[
    sub("agcount", Kind::Num),
    sub("agsize", Kind::Size),
    sub("size", Kind::Size),
    sub("su", Kind::Size),
    sub("sunit", Kind::Num),
    sub("sw", Kind::Num),
    sub("swidth", Kind::Num),
    sub("noalign", Kind::Flag),
    sub("cowextsize", Kind::Num),
    sub("extszinherit", Kind::Num),
    sub("projinherit", Kind::Num),
    sub("rtinherit", Kind::Bool),
    sub("daxinherit", Kind::Bool),
];
const XFS_INODE: &[Sub] = &[
    sub("size", Kind::Size),
    sub("maxpct", Kind::Num),
    sub("align", Kind::Bool),
    sub("attr", Kind::OneOf(&["1", "2"])),
    sub("projid32bit", Kind::Bool),
    sub("sparse", Kind::Bool),
    sub("nrext64", Kind::Bool),
];
const XFS_LOG: &[Sub] = &[
    sub("size", Kind::Size),
    sub("version", Kind::OneOf(&["1", "2"])),
    sub("su", Kind::Size),
    sub("sunit", Kind::Num),
    sub("lazy-count", Kind::Bool),
    sub("agnum", Kind::Num),
];
const XFS_META: &[Sub] = &[
    sub("crc", Kind::Bool),
    sub("finobt", Kind::Bool),
    sub("rmapbt", Kind::Bool),
    sub("reflink", Kind::Bool),
    sub("inobtcount", Kind::Bool),
    sub("bigtime", Kind::Bool),
];
const XFS_NAMING: &[Sub] = &[
    sub("size", Kind::Size),
    sub("version", Kind::OneOf(&["2", "ci"])),
    sub("ftype", Kind::Bool),
];

const XFS_MKFS: &[MkfsFlag] = &[
    MkfsFlag {
        flag: "-b",
        value: Value::Subs(XFS_BLOCK),
        what: "block options such as size=4096",
    },
    MkfsFlag {
        flag: "-d",
        value: Value::Subs(XFS_DATA),
        what: "data options such as su=64k,sw=4",
    },
    MkfsFlag {
        flag: "-i",
        value: Value::Subs(XFS_INODE),
        what: "inode options such as size=512",
    },
    MkfsFlag {
        flag: "-l",
        value: Value::Subs(XFS_LOG),
        what: "internal-log options such as size=64m",
    },
    MkfsFlag {
        flag: "-m",
        value: Value::Subs(XFS_META),
        what: "metadata options such as crc=1,reflink=1",
    },
    MkfsFlag {
        flag: "-n",
        value: Value::Subs(XFS_NAMING),
        what: "naming options such as size=8192",
    },
    MkfsFlag {
        flag: "-L",
        value: Value::Check(label12),
        what: "a label of up to 12 characters [A-Za-z0-9_.-]",
    },
];

/// Checks one flag's value; the error says which part is wrong.
fn check_value(spec: &MkfsFlag, value: &str) -> Result<(), String> {
    let expected = || format!("expected {}", spec.what);
    if value.len() > 200 {
        return Err(format!("{} value is too long; {}", spec.flag, expected()));
    }
    match spec.value {
        Value::Check(ok) => ok(value).then_some(()).ok_or_else(expected),
        Value::Features(names) => {
            for item in value.split(',') {
                if !names.contains(&item.strip_prefix('^').unwrap_or(item)) {
                    return Err(format!(
                        "feature {} is not allowed with {}; allowed: {}",
                        shown_value(key::MKFS_OPTIONS, item),
                        spec.flag,
                        names.join(" ")
                    ));
                }
            }
            Ok(())
        }
        Value::Subs(subs) => {
            for item in value.split(',') {
                let (name, v) = match item.split_once('=') {
                    Some((n, v)) => (n, Some(v)),
                    None => (item, None),
                };
                let Some(s) = subs.iter().find(|s| s.name == name) else {
                    return Err(format!(
                        "{} sub-option {name:?} is not allowed (only value-typed sub-options are: no paths or devices); allowed: {}",
                        spec.flag,
                        subs.iter().map(|s| s.name).collect::<Vec<_>>().join(" ")
                    ));
                };
                if !s.kind.accepts(v) {
                    return Err(format!(
                        "{} sub-option {} has a bad value; {}",
                        spec.flag,
                        shown_value(key::MKFS_OPTIONS, item),
                        expected()
                    ));
                }
            }
            Ok(())
        }
    }
}

/// `mkfsOptions`: whitespace-separated `-flag value` pairs, each flag from the allow-list of the
/// filesystem type, each value matching that flag's grammar. Nothing else (no force flags, no
/// positional arguments, no path anywhere) gets through.
fn parse_mkfs_options(fs: &FsType, s: &str) -> Result<Vec<String>, OptionsError> {
    let allowed: &[MkfsFlag] = match fs {
        FsType::Ext4 => EXT4_MKFS,
        FsType::Xfs => XFS_MKFS,
        FsType::Other(_) => &[],
    };
    let list = || allowed.iter().map(|f| f.flag).collect::<Vec<_>>().join(" ");
    let bad = |reason: String| OptionsError::invalid(key::MKFS_OPTIONS, s, reason);
    let mut out = Vec::new();
    let mut tokens = s.split_ascii_whitespace();
    while let Some(flag) = tokens.next() {
        let Some(spec) = allowed.iter().find(|f| f.flag == flag) else {
            return Err(bad(if allowed.is_empty() {
                format!("mkfsOptions are not supported for fsType {}", fs.name())
            } else {
                format!(
                    "{flag:?} is not allowed for {}; allowed flags: {}",
                    fs.name(),
                    list()
                )
            }));
        };
        let value = tokens
            .next()
            .ok_or_else(|| bad(format!("{flag} needs a value ({})", spec.what)))?;
        check_value(spec, value).map_err(bad)?;
        out.push(flag.to_owned());
        out.push(value.to_owned());
    }
    Ok(out)
}

/// Filesystem mount options passed to mount(2) as data. Flags of the mount itself (noatime, nodev,
/// ro, ...) are not data options; they are refused with a pointer to what to use instead.
const EXT4_MOUNT: &[&str] = &[
    "acl",
    "noacl",
    "user_xattr",
    "nouser_xattr",
    "barrier",
    "nobarrier",
    "discard",
    "nodiscard",
    "delalloc",
    "nodelalloc",
    "auto_da_alloc",
    "noauto_da_alloc",
    "journal_checksum",
    "nojournal_checksum",
    "lazytime",
    "nolazytime",
    "sync",
    "dirsync",
    "data=ordered",
    "data=journal",
    "data=writeback",
    "errors=continue",
    "errors=remount-ro",
    "init_itable",
    "noinit_itable",
    "block_validity",
    "noblock_validity",
    "quota",
    "noquota",
    "usrquota",
    "grpquota",
    "prjquota",
];
const EXT4_MOUNT_NUM: &[&str] = &["commit", "stripe", "max_batch_time", "min_batch_time"];
const XFS_MOUNT: &[&str] = &[
    "discard",
    "nodiscard",
    "noquota",
    "quota",
    "uquota",
    "usrquota",
    "gquota",
    "grpquota",
    "pquota",
    "prjquota",
    "uqnoenforce",
    "gqnoenforce",
    "pqnoenforce",
    "inode32",
    "inode64",
    "largeio",
    "nolargeio",
    "swalloc",
    "wsync",
    "lazytime",
    "nolazytime",
    "sync",
    "dirsync",
    "nouuid",
];
const XFS_MOUNT_SIZE: &[&str] = &["logbufs", "logbsize", "allocsize", "sunit", "swidth"];
/// Filesystem options refused on purpose, with the reason (the allow-lists above leave them out;
/// this only makes the message precise).
const DANGEROUS_MOUNT: &[(&str, &str)] = &[
    (
        "errors=panic",
        "a filesystem error on this volume would panic (crash) the whole node",
    ),
    (
        "norecovery",
        "it mounts without replaying the journal, so the volume shows an inconsistent filesystem",
    ),
    (
        "noload",
        "it mounts without replaying the journal, so the volume shows an inconsistent filesystem",
    ),
    (
        "resuid",
        "reserved blocks belong to the node's users and groups, not the pod's",
    ),
    (
        "resgid",
        "reserved blocks belong to the node's users and groups, not the pod's",
    ),
    (
        "grpid",
        "it changes group-ownership semantics for every new file",
    ),
    (
        "bsdgroups",
        "it changes group-ownership semantics for every new file",
    ),
    (
        "dax",
        "it bypasses the page cache with direct device access",
    ),
];

const MOUNT_FLAGS: &[&str] = &[
    "ro",
    "rw",
    "noatime",
    "atime",
    "relatime",
    "strictatime",
    "nodiratime",
    "nodev",
    "dev",
    "nosuid",
    "suid",
    "noexec",
    "exec",
    "bind",
    "remount",
];

fn parse_mount_options(fs: &FsType, s: &str) -> Result<String, OptionsError> {
    let bad = |reason: String| OptionsError::invalid(key::MOUNT_OPTIONS, s, reason);
    let mut out = Vec::new();
    for opt in s.split(',').map(str::trim).filter(|o| !o.is_empty()) {
        let (name, value) = opt.split_once('=').unwrap_or((opt, ""));
        let ok = match fs {
            FsType::Ext4 => {
                EXT4_MOUNT.contains(&opt) || (EXT4_MOUNT_NUM.contains(&name) && digits(value))
            }
            FsType::Xfs => {
                XFS_MOUNT.contains(&opt)
                    || (XFS_MOUNT_SIZE.contains(&name)
                        && value.len() <= 12
                        && value
                            .trim_end_matches(['k', 'm', 'g'])
                            .bytes()
                            .all(|b| b.is_ascii_digit())
                        && value.bytes().next().is_some_and(|b| b.is_ascii_digit()))
            }
            FsType::Other(_) => false,
        };
        if !ok {
            return Err(bad(
                if let Some((_, why)) = DANGEROUS_MOUNT
                    .iter()
                    .find(|(o, _)| *o == opt || *o == name)
                {
                    format!("{} is refused: {why}", shown_value(key::MOUNT_OPTIONS, opt))
                } else if MOUNT_FLAGS.contains(&name) {
                    format!(
                        "{} is a mount flag, not a filesystem option; read-only comes from the claim's readOnly, the others are not supported",
                        shown_value(key::MOUNT_OPTIONS, opt)
                    )
                } else if matches!(fs, FsType::Other(_)) {
                    format!("mountOptions are not supported for fsType {}", fs.name())
                } else {
                    format!(
                        "{} is not an allowed {} mount option",
                        shown_value(key::MOUNT_OPTIONS, opt),
                        fs.name()
                    )
                },
            ));
        }
        out.push(opt);
    }
    Ok(out.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_mount_and_mkfs_items_never_echo_a_credential() {
        for (fs, mount, mkfs) in [
            ("ext4", "noatime,password=S3CRETpwL", "-E token=S3CRETpwL"),
            ("xfs", "secret=S3CRETpwL", "-d auth=S3CRETpwL"),
        ] {
            let m = parse(&format!(
                r#"{{"volumegroup":"vg0","volumeID":"lv1","kubernetes.io/fsType":"{fs}","mountOptions":"{mount}"}}"#
            ))
            .unwrap_err()
            .to_string();
            let k = parse(&format!(
                r#"{{"volumegroup":"vg0","volumeID":"lv1","kubernetes.io/fsType":"{fs}","mkfsOptions":"{mkfs}"}}"#
            ))
            .unwrap_err()
            .to_string();
            for (msg, key) in [(m, "mountOptions"), (k, "mkfsOptions")] {
                assert!(msg.contains(key) && msg.contains("<redacted>"), "{msg}");
                assert!(!msg.contains("S3CRETpwL"), "{msg}");
            }
        }
    }

    fn parse(json: &str) -> Result<LvmOptions, OptionsError> {
        LvmOptions::parse(&Options::parse(json).unwrap())
    }

    #[test]
    fn names() {
        for ok in ["vg0", "a", "A+b_c.d-e", "x".repeat(127).as_str()] {
            check_name("k", ok, true).unwrap();
        }
        for bad in [
            "",
            "-vg",
            "a/b",
            "a b",
            "a\tb",
            "a\nb",
            "a\u{7f}",
            ".",
            "..",
            "vg$",
            "é",
            "x".repeat(128).as_str(),
            "snapshot1",
            "pvmove0",
            "lv_tdata",
            "a_rimage_0",
        ] {
            assert!(
                check_name("k", bad, true).is_err(),
                "{bad:?} should be refused"
            );
        }
        assert!(check_name("k", "snapshot1", false).is_ok(), "VGs may");
    }

    #[test]
    fn derived_lv_names() {
        assert_eq!(derive_lv_name("pv-lvm-1"), "pv-lvm-1");
        let d = derive_lv_name("-my vol/../x");
        assert!(d.starts_with("fv_-my_vol_.._x_"), "{d}");
        check_name("k", &d, true).unwrap();
        assert_eq!(d, derive_lv_name("-my vol/../x"), "deterministic");
        assert_ne!(derive_lv_name("a b"), derive_lv_name("a/b"));
        assert!(derive_lv_name("snapshot-7").starts_with("fv_snapshot-7_"));
        let o = parse(r#"{"volumegroup":"vg0","kubernetes.io/pvOrVolumeName":"pv-1"}"#).unwrap();
        assert_eq!(o.device(), PathBuf::from("/dev/vg0/pv-1"));
    }

    #[test]
    fn options() {
        let o = parse(r#"{"volumegroup":"vg0","volumeID":"lv1","size":"1Gi","thinpool":"pool","kubernetes.io/fsType":"xfs","mkfsOptions":"-m crc=1 -L data","mountOptions":"noquota,logbufs=8","kubernetes.io/readwrite":"ro"}"#).unwrap();
        assert_eq!(o.key(), "vg0/lv1");
        assert_eq!(o.size, Some(1 << 30));
        assert_eq!(o.thin_pool.as_deref(), Some("pool"));
        assert_eq!(o.fs, FsType::Xfs);
        assert_eq!(o.mkfs_args, ["-m", "crc=1", "-L", "data"]);
        assert_eq!(o.mount_data, "noquota,logbufs=8");
        assert!(o.read_only);
        let d =
            parse(r#"{"volumegroup":"vg0","volumeID":"lv1","kubernetes.io/fsType":""}"#).unwrap();
        assert_eq!(
            (d.fs, d.size, d.mount_data.as_str()),
            (FsType::Ext4, None, "")
        );
        for bad in [
            r#"{}"#,
            r#"{"volumeID":"lv1"}"#,
            r#"{"volumegroup":"vg0"}"#,
            r#"{"volumegroup":"","volumeID":"lv1"}"#,
            r#"{"volumegroup":"vg0","volumeID":""}"#,
            r#"{"volumegroup":"vg/0","volumeID":"lv1"}"#,
            r#"{"volumegroup":"vg0","volumeID":"-lv"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","size":"0"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","size":"-1Gi"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","thinpool":"../p"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","kubernetes.io/fsType":"ext4; rm"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","kubernetes.io/fsType":"NTFS"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","mkfsOptions":"-F"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","mkfsOptions":"-m"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","mkfsOptions":"-m 0 /dev/sda"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","mkfsOptions":"-L -F"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","mkfsOptions":"-E root_owner=0:0"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","kubernetes.io/fsType":"xfs","mkfsOptions":"-f"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","kubernetes.io/fsType":"btrfs","mkfsOptions":"-L x"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","mountOptions":"noatime"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","mountOptions":"ro"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","mountOptions":"commit=5s"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","mountOptions":"data=ordered,x-foo"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","kubernetes.io/fsType":"xfs","mountOptions":"logbsize=-1"}"#,
            r#"{"volumegroup":"vg0","volumeID":"lv1","kubernetes.io/readwrite":"yes"}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn mkfs_allow_lists_take_values_never_paths() {
        let ok = |fs: FsType, v: &str| parse_mkfs_options(&fs, v).is_ok();
        for v in [
            "-b size=4096 -d agcount=4,su=64k,sw=4,noalign -i size=512,sparse=1",
            "-l size=64m,version=2,lazy-count=1,sunit=8 -m crc=1,reflink=1,bigtime=1",
            "-n size=8192,ftype=1 -L data",
        ] {
            assert!(ok(FsType::Xfs, v), "{v}");
        }
        for v in [
            "-m 0 -L web -b 4096 -i 16384 -I 256 -N 1000 -T largefile",
            "-O ^has_journal,metadata_csum,64bit",
            "-E lazy_itable_init=0,lazy_journal_init,stride=16,stripe_width=64,discard",
            "-E quotatype=usrquota:prjquota,encoding=utf8,num_backup_sb=1",
        ] {
            assert!(ok(FsType::Ext4, v), "{v}");
        }
        for v in [
            "-l file=1,logdev=vmlinuz,size=4m",
            "-l logdev=/dev/sda",
            "-l size=4m,name=x",
            "-l internal=0",
            "-d file=1,name=img",
            "-d size=1g,name=../../etc/passwd",
            "-r rtdev=sda",
            "-r extsize=4k",
            "-p proto",
            "-c options=cfg",
            "-s size=4096",
            "-d su=64k,",
            "-d =1",
            "-i size=",
            "-m crc=2",
            "-n version=3",
            "-l size=4m -f",
            "-L /etc/x",
            "-b size=4k /dev/sda",
        ] {
            assert!(!ok(FsType::Xfs, v), "xfs {v} should be refused");
        }
        for v in [
            "-E root_owner",
            "-E root_owner=0:0",
            "-E offset=1",
            "-E android_sparse",
            "-E test_fs",
            "-E stride=",
            "-E discard=1",
            "-E quotatype=usrquota:/x",
            "-O journal_dev",
            "-O ^journal_dev",
            "-O has_journal,",
            "-O none",
            "-d etc",
            "-d /etc",
            "-J device=/dev/sda",
            "-J size=4",
            "-e panic",
            "-U clear",
            "-T ../x",
            "-m 51",
            "-F",
        ] {
            assert!(!ok(FsType::Ext4, v), "ext4 {v} should be refused");
        }
        // The message names the offending sub-option.
        let e = parse_mkfs_options(&FsType::Xfs, "-l file=1,logdev=vmlinuz,size=4m").unwrap_err();
        assert!(
            e.to_string().contains("sub-option \"file\" is not allowed"),
            "{e}"
        );
    }

    #[test]
    fn mount_allow_lists_leave_out_what_harms_the_node() {
        for (fs, v) in [
            (FsType::Ext4, "errors=panic"),
            (FsType::Ext4, "noload"),
            (FsType::Ext4, "norecovery"),
            (FsType::Ext4, "resuid=0"),
            (FsType::Ext4, "resgid=0"),
            (FsType::Ext4, "grpid"),
            (FsType::Ext4, "bsdgroups"),
            (FsType::Ext4, "dax"),
            (FsType::Ext4, "journal_path=/dev/sda"),
            (FsType::Ext4, "journal_dev=1"),
            (FsType::Ext4, "usrjquota=aquota.user"),
            (FsType::Ext4, "debug"),
            (FsType::Ext4, "abort"),
            (FsType::Xfs, "norecovery"),
            (FsType::Xfs, "logdev=/dev/sda"),
            (FsType::Xfs, "rtdev=/dev/sda"),
            (FsType::Xfs, "grpid"),
            (FsType::Xfs, "dax=always"),
        ] {
            let e = parse_mount_options(&fs, v).unwrap_err().to_string();
            assert!(e.contains("mountOptions"), "{e}");
        }
        let e = parse_mount_options(&FsType::Ext4, "errors=panic").unwrap_err();
        assert!(
            e.to_string().contains("panic (crash) the whole node"),
            "{e}"
        );
        assert_eq!(
            parse_mount_options(&FsType::Ext4, "errors=remount-ro,noacl").unwrap(),
            "errors=remount-ro,noacl"
        );
    }
}
