//! The provisioner's side of the node config, as `flexvol doctor` checks it: the hostPath roots
//! (local-path's `nodePathMap`, `sharedFileSystemPath`, `storageClassConfigs`), the roots of the
//! CSI plugin's inline ephemeral presets (`hostpath.ephemeral`), the allowed volume groups, and
//! the NFS capability key.
//!
//! - A root is looked at, never into: `lstat` of the root itself (a symlink is reported, not
//!   followed for the type check), then `statfs` and the mount table for the directory it
//!   resolves to (the operator named it). Nothing below a root is listed, opened or followed, so
//!   a symlink a tenant planted in a volume directory cannot steer doctor anywhere.
//! - Volume groups are asked with one `lvm vgs` each, through the runner, capped by
//!   [`VG_TIMEOUT`] and `commandTimeoutSeconds`: a hung device makes a failed check, not a hung
//!   doctor.
//! - The NFS key is judged by the loader the driver and the provisioner use
//!   ([`crate::node::capability::Key::load`]: no symlink, a regular file, owned by root, no group
//!   or other bits, 16 to 64 bytes); its bytes are dropped at once and never printed.

use super::{Level, Report};
use crate::backend::Context;
use crate::backend::lvm::lvs::{LvService, LvmCommands, LvmError};
use crate::node::capability::Key;
use crate::node::config::Config;
use crate::protocol::quantity::format_human;
use crate::provision::storage::quota::{self, Support};
use crate::sys::exec::Runner;
use crate::sys::mountinfo::MountTable;
use crate::sys::process::Deadline;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

/// The longest one `vgs` may take here (a healthy one answers in well under a second).
pub(crate) const VG_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks every provisioning root named in the config.
pub(super) fn check_roots(r: &mut Report, c: &Config, runner: &dyn Runner) {
    let roots = c.local_path.all_roots();
    if roots.is_empty() {
        r.ok(
            "provisioner roots",
            "none configured (nodePathMap/sharedFileSystemPath): this node provisions no hostPath volumes",
        );
        return;
    }
    let table = MountTable::read().ok();
    for root in &roots {
        check_root(r, root, runner, table.as_ref());
    }
}

fn check_root(r: &mut Report, root: &Path, runner: &dyn Runner, table: Option<&MountTable>) {
    let name = format!("provisioner root {}", root.display());
    let meta = match std::fs::symlink_metadata(root) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            r.add(
                name,
                Level::Warn,
                "does not exist: the provisioner creates it (0755, root) when it starts; sizes cannot be judged until then",
                Some(format!(
                    "mkdir -p {} on the filesystem meant for volumes, then run flexvol doctor again",
                    root.display()
                )),
            );
            return;
        }
        Err(e) => {
            r.add(
                name,
                Level::Fail,
                format!("cannot be examined: {e}"),
                Some("fix its permissions or remove it from the node config".into()),
            );
            return;
        }
    };
    let real = if meta.file_type().is_symlink() {
        let target = std::fs::canonicalize(root);
        r.add(
            format!("{name} symlink"),
            Level::Warn,
            match &target {
                Ok(t) => format!(
                    "is a symlink to {}: the provisioner resolves it once at start, so volumes land there",
                    t.display()
                ),
                Err(e) => format!("is a dangling symlink ({e}): no volume can be made there"),
            },
            Some("name the real directory in the node config (nodePathMap)".into()),
        );
        match target {
            Ok(t) => t,
            Err(_) => return,
        }
    } else {
        root.to_path_buf()
    };
    let md = match std::fs::metadata(&real) {
        Ok(m) if m.is_dir() => m,
        Ok(_) => {
            r.add(
                name,
                Level::Fail,
                format!(
                    "{} is not a directory: no volume can be made there",
                    real.display()
                ),
                Some("make it a directory or change the root in the node config".into()),
            );
            return;
        }
        Err(e) => {
            r.add(
                name,
                Level::Fail,
                format!("cannot be examined: {e}"),
                Some("fix its permissions or remove it from the node config".into()),
            );
            return;
        }
    };
    let mode = md.permissions().mode();
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        r.add(
            format!("{name} mode"),
            Level::Fail,
            format!(
                "mode {:04o}: users other than root can create and rename entries beside the volume directories",
                mode & 0o7777
            ),
            Some(format!("chmod go-w {}", real.display())),
        );
    }
    let fs = table
        .and_then(|t| t.containing(&real))
        .map(|m| format!("{} (mounted at {})", m.fs_type, m.mount_point.display()))
        .unwrap_or_else(|| "an unknown filesystem".into());
    let free = nix::sys::statvfs::statvfs(&real)
        .map(|s| {
            let avail = s.blocks_available().saturating_mul(s.fragment_size());
            format!(", {} available", format_human(avail))
        })
        .unwrap_or_default();
    match quota::detect_with_tool(runner, &real) {
        Support::Enforced(q) => r.ok(
            name,
            format!(
                "a directory on {fs}{free}; sizes are enforced (project quotas on {})",
                q.mount_point.display()
            ),
        ),
        Support::NotEnforced(why) => r.add(
            name,
            Level::Warn,
            format!("a directory on {fs}{free}; sizes will NOT be enforced: {why}"),
            Some("volumes still work, but a claim can fill the filesystem; see docs/provisioning.md (sizes)".into()),
        ),
    }
}

/// Checks the root of each inline ephemeral preset (`hostpath.ephemeral`), looked at and never
/// into, as a provisioning root is: whether its size can be enforced there (a preset without
/// `allowUnenforced` refuses every volume where it cannot: a failure), whether it has room for
/// one volume (new ones are refused below that), and whether it shares the node's root
/// filesystem (a pod outside a user namespace can escape a project quota: docs/security.md).
pub(super) fn check_presets(r: &mut Report, c: &Config, runner: &dyn Runner) {
    let root_dev = std::fs::metadata("/").ok().map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.dev()
    });
    for (name, p) in &c.hostpath.ephemeral {
        let check = format!("ephemeral preset {name} ({})", p.root.display());
        // The operator named it (the plugin resolves a symlink there once, as here).
        let md = match std::fs::metadata(&p.root) {
            Ok(m) if m.is_dir() => m,
            Ok(_) => {
                r.add(
                    check,
                    Level::Fail,
                    "is not a directory: every volume of the preset is refused",
                    Some(
                        "make the root a directory of its own, or change it in hostpath.ephemeral"
                            .into(),
                    ),
                );
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                r.add(
                    check,
                    Level::Warn,
                    "does not exist: the plugin makes it (0755, root) at the first volume, on whatever filesystem holds its parent; sizes cannot be judged until then",
                    Some(format!(
                        "mkdir -p {} on a filesystem of its own with project quotas, then run flexvol doctor again",
                        p.root.display()
                    )),
                );
                continue;
            }
            Err(e) => {
                r.add(
                    check,
                    Level::Fail,
                    format!("cannot be examined: {e}"),
                    Some("fix its permissions or change it in hostpath.ephemeral".into()),
                );
                continue;
            }
        };
        let free = crate::sys::dirfd::free_bytes(&p.root).unwrap_or(0);
        let size = format_human(p.size);
        match quota::detect_with_tool(runner, &p.root) {
            Support::Enforced(_) => r.ok(
                check.clone(),
                format!(
                    "sizes of {size} are enforced (project quotas), {} free",
                    format_human(free)
                ),
            ),
            Support::NotEnforced(why) if p.allow_unenforced => r.add(
                check.clone(),
                Level::Warn,
                format!("sizes of {size} are NOT enforced ({why}); served anyway (allowUnenforced)"),
                Some("give the root a filesystem with project quotas (docs/csi.md, \"Inline ephemeral volumes\")".into()),
            ),
            Support::NotEnforced(why) => r.add(
                check.clone(),
                Level::Fail,
                format!("sizes cannot be enforced here ({why}): every volume of the preset is refused"),
                Some("give the root a filesystem with project quotas, or set allowUnenforced in the preset".into()),
            ),
        }
        if free < p.size {
            r.add(
                format!("{check} free space"),
                Level::Warn,
                format!(
                    "{} free, less than one volume of {size}: new volumes are refused (RESOURCE_EXHAUSTED) until there is room",
                    format_human(free)
                ),
                Some("free space there, or give the preset a larger filesystem".into()),
            );
        }
        let own_fs = {
            use std::os::unix::fs::MetadataExt;
            root_dev != Some(md.dev())
        };
        if !own_fs {
            r.add(
                format!("{check} filesystem"),
                Level::Warn,
                "is on the node's root filesystem: a pod outside a user namespace can move its files out of its project and fill the node's disk (docs/security.md, \"Size enforcement\")",
                Some("give the preset root a filesystem of its own".into()),
            );
        }
    }
}

/// Checks that each allowed volume group exists, with one bounded `vgs` each.
pub(super) fn check_vgs(r: &mut Report, c: &Config, runner: &dyn Runner) {
    if c.lvm.allowed_volume_groups.is_empty() {
        return;
    }
    if !runner.has_tool("lvm") {
        r.add(
            "lvm volume groups",
            Level::Warn,
            format!(
                "lvm.allowedVolumeGroups lists {} but lvm is not installed, so they cannot be checked",
                c.lvm.allowed_volume_groups.join(", ")
            ),
            Some("install lvm2 (see the tool lvm check)".into()),
        );
        return;
    }
    let mounter = crate::sys::mount::SysMounter;
    for vg in &c.lvm.allowed_volume_groups {
        let name = format!("lvm volume group {vg}");
        let ctx = Context::new(
            c,
            runner,
            &mounter,
            Deadline::after(VG_TIMEOUT),
            "flexvol/lvm",
        );
        match LvmCommands.vg(&ctx, vg) {
            Ok(row) => r.ok(
                name,
                format!(
                    "exists: {} free of {}",
                    format_human(row.vg_free),
                    format_human(row.vg_size)
                ),
            ),
            Err(LvmError::VgNotFound { .. }) => r.add(
                name,
                Level::Warn,
                "is listed in lvm.allowedVolumeGroups but does not exist on this node: LVM claims naming it are not placed here",
                Some(format!(
                    "vgcreate {vg} <device>, or remove it from lvm.allowedVolumeGroups on this node"
                )),
            ),
            Err(e) => r.add(
                name,
                Level::Fail,
                format!("vgs failed: {e}"),
                Some("run `lvm vgs` by hand: a hung or missing device blocks every LVM call on this node".into()),
            ),
        }
    }
}

/// Checks the NFS capability key, never showing any of its bytes.
pub(super) fn check_nfs_key(r: &mut Report, c: &Config) {
    let provisioned = !c.nfs.provisioned_exports.is_empty();
    match &c.nfs.capability_key_file {
        None if provisioned => r.add(
            "nfs capability key",
            Level::Fail,
            "nfs.provisionedExports is set but nfs.capabilityKeyFile is not: provisioned NFS volumes cannot be verified, so the driver refuses to mount them",
            Some(crate::backend::nfs::SHARED_KEY_FIX.into()),
        ),
        None => {}
        Some(p) => match Key::load(p, crate::backend::nfs::SHARED_KEY_FIX) {
            Ok(_) => r.ok(
                format!("nfs capability key {}", p.display()),
                "present, a regular file owned by root, no group or other access, a key's length",
            ),
            Err(e) => r.add(
                format!("nfs capability key {}", p.display()),
                Level::Fail,
                e.to_string(),
                Some(
                    "the same key on every node: a regular file owned by root, mode 0400 or 0600, 16 to 64 bytes (drivers/nfs/README.md)".into(),
                ),
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::testing::FakeRunner;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::fs::symlink;

    fn config(json: &str) -> Config {
        Config::parse(Path::new("/test/config.json"), json.as_bytes()).unwrap()
    }

    fn run(f: impl FnOnce(&mut Report)) -> Vec<super::super::Check> {
        let mut r = Report::default();
        f(&mut r);
        r.0
    }

    /// Presets: a root where sizes cannot be enforced fails for a strict preset and warns for
    /// one that allows it; a root without room for one volume, or on the node's root
    /// filesystem, warns; a missing root warns, a file there fails.
    #[test]
    fn ephemeral_presets_roots_are_judged() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        for n in ["strict", "loose", "huge"] {
            std::fs::create_dir(p.join(n)).unwrap();
        }
        std::fs::write(p.join("file"), "x").unwrap();
        let c = config(&format!(
            r#"{{"hostpath":{{"allowedRoots":["{0}/data"],"ephemeral":{{
                "strict":{{"root":"{0}/strict","size":"1Mi"}},
                "loose":{{"root":"{0}/loose","size":"1Mi","allowUnenforced":true}},
                "huge":{{"root":"{0}/huge","size":"1Ei","allowUnenforced":true}},
                "gone":{{"root":"{0}/gone","size":"1Mi"}},
                "file":{{"root":"{0}/file","size":"1Mi"}}}}}}}}"#,
            p.display()
        ));
        let runner = FakeRunner::new();
        let checks = run(|r| check_presets(r, &c, &runner));
        let by = |name: &str, suffix: &str| {
            checks
                .iter()
                .find(|c| {
                    c.check.starts_with(&format!("ephemeral preset {name} ("))
                        && c.check.ends_with(suffix)
                })
                .unwrap_or_else(|| panic!("{name}{suffix} in {checks:#?}"))
                .clone()
        };
        // This test's directory has no project quotas.
        assert_eq!(by("strict", ")").status, Level::Fail);
        assert!(
            by("strict", ")")
                .detail
                .contains("every volume of the preset is refused")
        );
        assert_eq!(by("loose", ")").status, Level::Warn);
        assert_eq!(by("huge", "free space").status, Level::Warn);
        assert!(
            !checks
                .iter()
                .any(|c| c.check.starts_with("ephemeral preset loose")
                    && c.check.ends_with("free space"))
        );
        assert_eq!(by("gone", ")").status, Level::Warn);
        assert_eq!(by("file", ")").status, Level::Fail);
        let same_fs = std::fs::metadata("/").unwrap().dev() == std::fs::metadata(p).unwrap().dev();
        assert_eq!(
            checks.iter().any(|c| c.check.ends_with("filesystem")),
            same_fs,
            "{checks:#?}"
        );
    }

    #[test]
    fn roots_missing_symlinked_not_a_directory_and_fine() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::create_dir(p.join("ok")).unwrap();
        std::fs::set_permissions(p.join("ok"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(p.join("file"), "x").unwrap();
        std::fs::create_dir(p.join("real")).unwrap();
        std::fs::set_permissions(p.join("real"), std::fs::Permissions::from_mode(0o755)).unwrap();
        symlink(p.join("real"), p.join("link")).unwrap();
        std::fs::create_dir(p.join("open")).unwrap();
        std::fs::set_permissions(p.join("open"), std::fs::Permissions::from_mode(0o777)).unwrap();
        let c = config(&format!(
            r#"{{"nodePathMap":[{{"node":"DEFAULT_PATH_FOR_NON_LISTED_NODES","paths":["{0}/ok","{0}/missing","{0}/file","{0}/link","{0}/open"]}}]}}"#,
            p.display()
        ));
        assert_eq!(c.local_path.all_roots().len(), 5);
        let runner = FakeRunner::new();
        let checks = run(|r| check_roots(r, &c, &runner));
        let by = |suffix: &str| {
            checks
                .iter()
                .find(|c| c.check == format!("provisioner root {}{suffix}", p.display()))
                .unwrap_or_else(|| panic!("{suffix} in {checks:#?}"))
                .clone()
        };
        let ok = by("/ok");
        // tmpfs or ext4 without prjquota here: sizes are not enforced, and doctor says so.
        assert!(ok.detail.contains("a directory on"), "{}", ok.detail);
        assert!(
            ok.detail.contains("sizes are enforced")
                || ok.detail.contains("sizes will NOT be enforced"),
            "{}",
            ok.detail
        );
        let missing = by("/missing");
        assert_eq!(missing.status, Level::Warn);
        assert!(
            missing.detail.contains("does not exist"),
            "{}",
            missing.detail
        );
        assert_eq!(by("/file").status, Level::Fail);
        assert!(by("/file").detail.contains("is not a directory"));
        let link = by("/link symlink");
        assert_eq!(link.status, Level::Warn);
        assert!(
            link.detail.contains(&format!("{}/real", p.display())),
            "{}",
            link.detail
        );
        let open = by("/open mode");
        assert_eq!(open.status, Level::Fail);
        assert!(open.fix.as_deref().unwrap().starts_with("chmod go-w"));
    }

    /// A tenant owns what is inside a root: symlinks planted there (to /etc, to a dangling
    /// target, to a FIFO) must neither be followed nor even reported: doctor looks at the root
    /// only.
    #[test]
    fn symlinks_planted_in_a_root_are_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(root.join("pvc-1")).unwrap();
        symlink("/etc", root.join("pvc-1/escape")).unwrap();
        symlink("/etc", root.join("pvc-2")).unwrap();
        symlink("/nonexistent/target", root.join("pvc-3")).unwrap();
        nix::unistd::mkfifo(
            &root.join("pvc-4"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let c = config(&format!(
            r#"{{"sharedFileSystemPath":"{}"}}"#,
            root.display()
        ));
        let runner = FakeRunner::new();
        let checks = run(|r| check_roots(r, &c, &runner));
        assert_eq!(checks.len(), 1, "{checks:#?}");
        let text = format!("{checks:?}");
        for leaked in ["/etc", "pvc-", "nonexistent"] {
            assert!(!text.contains(leaked), "{leaked} in {text}");
        }
        // Nothing was run inside the root either (a FIFO would have blocked a reader).
        assert!(runner.lines().is_empty(), "{:?}", runner.lines());
    }

    fn vgs_json(vg: &str, free: u64, size: u64) -> String {
        format!(
            r#"{{"report":[{{"vg":[{{"vg_name":"{vg}","vg_extent_size":"4194304","vg_free":"{free}","vg_size":"{size}"}}]}}]}}"#
        )
    }

    #[test]
    fn volume_groups_found_missing_and_hung_each_bounded() {
        let c = config(r#"{"lvm":{"allowedVolumeGroups":["vg0","gone","hung"]}}"#);
        let runner = FakeRunner::new();
        // Later scripts win: vg0 answers, gone is not found, anything else (hung) times out.
        runner.time_out("lvm");
        runner.on("lvm", &["vg0"], 0, &vgs_json("vg0", 3 << 30, 10 << 30), "");
        runner.on(
            "lvm",
            &["gone"],
            5,
            "",
            "  Volume group \"gone\" not found\n",
        );
        let checks = run(|r| check_vgs(r, &c, &runner));
        let by = |vg: &str| {
            checks
                .iter()
                .find(|c| c.check == format!("lvm volume group {vg}"))
                .unwrap()
                .clone()
        };
        assert_eq!(by("vg0").status, Level::Ok);
        assert_eq!(by("vg0").detail, "exists: 3.0 GiB free of 10.0 GiB");
        assert_eq!(by("gone").status, Level::Warn);
        assert!(by("gone").fix.unwrap().contains("vgcreate gone"));
        assert_eq!(by("hung").status, Level::Fail);
        for cmd in runner.calls() {
            assert_eq!(cmd.tool, "lvm");
            assert!(cmd.timeout <= VG_TIMEOUT, "{:?}", cmd.timeout);
            assert!(cmd.display().contains("vgs"), "{}", cmd.display());
        }
        assert_eq!(runner.count("lvm"), 3);
        let none = FakeRunner::new();
        none.without("lvm");
        let checks = run(|r| check_vgs(r, &c, &none));
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].status, Level::Warn);
        assert!(none.calls().is_empty());
    }

    #[test]
    fn the_nfs_key_is_judged_and_never_shown() {
        let d = tempfile::tempdir().unwrap();
        let key = d.path().join("nfs.key");
        // Printable bytes, so that a leak would be visible in the text.
        let secret = "SECRETKEYSECRETKEYSECRETKEY12345";
        std::fs::write(&key, secret).unwrap();
        let cfg = |k: &Path| {
            config(&format!(
                r#"{{"nfs":{{"capabilityKeyFile":"{}","provisionedExports":["10.0.0.5:/exports/k8s"]}}}}"#,
                k.display()
            ))
        };
        let check = |k: &Path| {
            let c = cfg(k);
            let checks = run(|r| check_nfs_key(r, &c));
            assert_eq!(checks.len(), 1);
            let text = format!("{checks:?}");
            for part in ["SECRET", "KEY12345", "12345"] {
                assert!(!text.contains(part), "key material in {text}");
            }
            checks[0].clone()
        };
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let open = check(&key);
        assert_eq!(open.status, Level::Fail);
        assert!(open.detail.contains("0644"), "{}", open.detail);
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert_eq!(check(&key).status, Level::Ok, "{:?}", check(&key));
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(check(&key).status, Level::Ok);
        let short = d.path().join("short.key");
        std::fs::write(&short, "SECRET").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o400)).unwrap();
        let s = check(&short);
        assert_eq!(s.status, Level::Fail);
        assert!(s.detail.contains("6 bytes"), "{}", s.detail);
        let link = d.path().join("link.key");
        symlink(&key, &link).unwrap();
        let l = check(&link);
        assert_eq!(l.status, Level::Fail);
        assert!(l.detail.contains("symlink"), "{}", l.detail);
        let m = check(&d.path().join("missing.key"));
        assert_eq!(m.status, Level::Fail);
        assert!(m.detail.contains("does not exist"), "{}", m.detail);
        // Exports to provision without a key: a failure that says how to make one.
        let c = config(r#"{"nfs":{"provisionedExports":["10.0.0.5:/exports/k8s"]}}"#);
        let checks = run(|r| check_nfs_key(r, &c));
        assert_eq!(checks[0].status, Level::Fail);
        assert!(
            checks[0]
                .fix
                .as_deref()
                .unwrap()
                .contains("capabilityKeyFile")
        );
    }
}
