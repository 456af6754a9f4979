//! Which distribution this node runs, from `/etc/os-release` (`ID`, then `ID_LIKE`), and the
//! command that installs a missing tool there: package names differ (`mount.nfs` is
//! `nfs-common` on Debian, `nfs-utils` on RHEL and Alpine, `nfs-client` on SUSE).
//!
//! The file is read with a size bound ([`MAX_OS_RELEASE`]); a missing, unreadable or unknown one
//! gives [`Family::Unknown`], whose fix names the tool and its package on each known family.

use std::io::Read;
use std::path::Path;

/// The most of os-release read (a real one is well under 1 KiB).
pub(crate) const MAX_OS_RELEASE: u64 = 64 * 1024;

/// A family of distributions that share a package manager and package names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    /// Debian, Ubuntu and derivatives: apt-get.
    Debian,
    /// RHEL, Fedora, CentOS, Rocky, Alma, Oracle, Amazon Linux: dnf.
    Rhel,
    /// SLES, openSUSE: zypper.
    Suse,
    /// Alpine: apk.
    Alpine,
    /// Anything else (or no os-release).
    Unknown,
}

const KNOWN: [Family; 4] = [Family::Debian, Family::Rhel, Family::Suse, Family::Alpine];

fn of_id(id: &str) -> Option<Family> {
    match id {
        "debian" | "ubuntu" | "raspbian" | "linuxmint" | "pop" => Some(Family::Debian),
        "rhel" | "fedora" | "centos" | "rocky" | "almalinux" | "ol" | "amzn" => Some(Family::Rhel),
        "sles" | "suse" | "opensuse" | "opensuse-leap" | "opensuse-tumbleweed" | "sle-micro" => {
            Some(Family::Suse)
        }
        "alpine" => Some(Family::Alpine),
        _ => None,
    }
}

/// The family an os-release text names: its `ID`, else the first known word of `ID_LIKE`.
pub(crate) fn family(os_release: &str) -> Family {
    let value = |key: &str| -> String {
        os_release
            .lines()
            .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
            .next_back()
            .unwrap_or("")
            .trim()
            .trim_matches(|c| c == '"' || c == '\'')
            .to_ascii_lowercase()
    };
    let id = value("ID");
    if let Some(f) = of_id(&id) {
        return f;
    }
    value("ID_LIKE")
        .split_whitespace()
        .find_map(of_id)
        .unwrap_or(Family::Unknown)
}

/// Reads `<sysroot>/etc/os-release`, else `<sysroot>/usr/lib/os-release`, at most
/// [`MAX_OS_RELEASE`] bytes; empty when neither can be read.
pub(crate) fn read_os_release(sysroot: &Path) -> String {
    for p in ["etc/os-release", "usr/lib/os-release"] {
        if let Ok(f) = std::fs::File::open(sysroot.join(p)) {
            let mut buf = Vec::new();
            if f.take(MAX_OS_RELEASE).read_to_end(&mut buf).is_ok() {
                return String::from_utf8_lossy(&buf).into_owned();
            }
        }
    }
    String::new()
}

impl Family {
    /// For people: which distributions.
    pub fn name(self) -> &'static str {
        match self {
            Family::Debian => "Debian/Ubuntu",
            Family::Rhel => "RHEL/Fedora/Rocky/Alma",
            Family::Suse => "SUSE",
            Family::Alpine => "Alpine",
            Family::Unknown => "an unknown distribution",
        }
    }

    /// The package that holds `tool` on this family (`None` for a tool flexvol does not know,
    /// or [`Family::Unknown`]).
    pub(crate) fn package(self, tool: &str) -> Option<&'static str> {
        use Family::*;
        Some(match (tool, self) {
            (_, Unknown) => return None,
            ("mount.nfs", Debian) => "nfs-common",
            ("mount.nfs", Rhel | Alpine) => "nfs-utils",
            ("mount.nfs", Suse) => "nfs-client",
            ("lvm", _) => "lvm2",
            ("blkid", Alpine) => "blkid",
            ("blkid", _) => "util-linux",
            ("mkfs.ext4", _) => "e2fsprogs",
            ("resize2fs", Alpine) => "e2fsprogs-extra",
            ("resize2fs", _) => "e2fsprogs",
            ("mkfs.xfs", _) => "xfsprogs",
            ("xfs_growfs" | "xfs_quota", Alpine) => "xfsprogs-extra",
            ("xfs_growfs" | "xfs_quota", _) => "xfsprogs",
            _ => return None,
        })
    }

    /// The command that installs `package` here.
    fn install(self, package: &str) -> Option<String> {
        match self {
            Family::Debian => Some(format!("apt-get install -y {package}")),
            Family::Rhel => Some(format!("dnf install -y {package}")),
            Family::Suse => Some(format!("zypper install -y {package}")),
            Family::Alpine => Some(format!("apk add {package}")),
            Family::Unknown => None,
        }
    }

    /// What to do about a missing `tool`: the install command on a known family; on an unknown
    /// one, the tool and its package on each known family.
    pub(crate) fn install_fix(self, tool: &str) -> String {
        if let Some(cmd) = self.package(tool).and_then(|p| self.install(p)) {
            return cmd;
        }
        let each: Vec<String> = KNOWN
            .iter()
            .filter_map(|f| f.package(tool).map(|p| format!("{p} on {}", f.name())))
            .collect();
        if each.is_empty() {
            format!("install {tool} with this distribution's package manager")
        } else {
            format!(
                "install {tool} with this distribution's package manager (packaged as {})",
                each.join(", ")
            )
        }
    }

    /// What installs the kernel modules of the running kernel.
    pub(crate) fn kernel_modules_fix(self) -> &'static str {
        match self {
            Family::Debian => "apt-get install -y linux-modules-$(uname -r)",
            Family::Rhel => "dnf install -y kernel-modules-$(uname -r)",
            Family::Suse => "zypper install -y kernel-default",
            Family::Alpine => "apk add linux-lts (the kernel flavour this node boots)",
            Family::Unknown => "install the kernel modules package of the running kernel",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEBIAN: &str = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\nVERSION_ID=\"12\"\nID=debian\nHOME_URL=\"https://www.debian.org/\"\n";
    const UBUNTU: &str =
        "NAME=\"Ubuntu\"\nVERSION=\"22.04.4 LTS (Jammy Jellyfish)\"\nID=ubuntu\nID_LIKE=debian\n";
    const RHEL: &str = "NAME=\"Red Hat Enterprise Linux\"\nVERSION=\"9.3 (Plow)\"\nID=\"rhel\"\nID_LIKE=\"fedora\"\nVERSION_ID=\"9.3\"\n";
    const ROCKY: &str =
        "NAME=\"Rocky Linux\"\nID=\"rocky\"\nID_LIKE=\"rhel centos fedora\"\nVERSION_ID=\"9.3\"\n";
    const ALMA: &str = "NAME=\"AlmaLinux\"\nID=\"almalinux\"\nID_LIKE=\"rhel centos fedora\"\n";
    const FEDORA: &str = "NAME=\"Fedora Linux\"\nVERSION_ID=40\nID=fedora\n";
    const SLES: &str = "NAME=\"SLES\"\nVERSION=\"15-SP5\"\nID=\"sles\"\nID_LIKE=\"suse\"\n";
    const LEAP: &str = "NAME=\"openSUSE Leap\"\nID=\"opensuse-leap\"\nID_LIKE=\"suse opensuse\"\n";
    const ALPINE: &str = "NAME=\"Alpine Linux\"\nID=alpine\nVERSION_ID=3.19.1\n";
    /// A derivative known only through ID_LIKE.
    const DERIVED: &str = "NAME=\"Example OS\"\nID=exampleos\nID_LIKE=\"ubuntu debian\"\n";
    const OTHER: &str = "NAME=\"NixOS\"\nID=nixos\n";

    #[test]
    fn families_from_os_release() {
        for (text, want) in [
            (DEBIAN, Family::Debian),
            (UBUNTU, Family::Debian),
            (DERIVED, Family::Debian),
            (RHEL, Family::Rhel),
            (ROCKY, Family::Rhel),
            (ALMA, Family::Rhel),
            (FEDORA, Family::Rhel),
            (SLES, Family::Suse),
            (LEAP, Family::Suse),
            (ALPINE, Family::Alpine),
            (OTHER, Family::Unknown),
            ("", Family::Unknown),
            ("garbage\n=\nID\n", Family::Unknown),
        ] {
            assert_eq!(family(text), want, "{text}");
        }
    }

    #[test]
    fn each_family_gets_its_own_package_names() {
        let fix = |text: &str, tool: &str| family(text).install_fix(tool);
        assert_eq!(fix(UBUNTU, "mount.nfs"), "apt-get install -y nfs-common");
        assert_eq!(fix(DEBIAN, "lvm"), "apt-get install -y lvm2");
        assert_eq!(fix(DEBIAN, "xfs_quota"), "apt-get install -y xfsprogs");
        assert_eq!(fix(RHEL, "mount.nfs"), "dnf install -y nfs-utils");
        assert_eq!(fix(ROCKY, "lvm"), "dnf install -y lvm2");
        assert_eq!(fix(ALMA, "xfs_quota"), "dnf install -y xfsprogs");
        assert_eq!(fix(SLES, "mount.nfs"), "zypper install -y nfs-client");
        assert_eq!(fix(LEAP, "lvm"), "zypper install -y lvm2");
        assert_eq!(fix(SLES, "mkfs.xfs"), "zypper install -y xfsprogs");
        assert_eq!(fix(ALPINE, "mount.nfs"), "apk add nfs-utils");
        assert_eq!(fix(ALPINE, "lvm"), "apk add lvm2");
        assert_eq!(fix(ALPINE, "xfs_quota"), "apk add xfsprogs-extra");
        // No family installs nfs-common under dnf: the bug this module fixes.
        for t in [DEBIAN, RHEL, SLES, ALPINE] {
            let f = fix(t, "mount.nfs");
            assert!(!(f.starts_with("dnf") && f.contains("nfs-common")), "{f}");
        }
    }

    #[test]
    fn an_unknown_distribution_is_told_the_tool_and_its_packages() {
        let f = family(OTHER).install_fix("mount.nfs");
        for want in [
            "install mount.nfs",
            "nfs-common on Debian/Ubuntu",
            "nfs-utils on RHEL/Fedora/Rocky/Alma",
            "nfs-client on SUSE",
        ] {
            assert!(f.contains(want), "{want:?} not in {f}");
        }
        assert!(!f.contains("apt-get") && !f.contains("dnf"), "{f}");
        assert_eq!(
            Family::Debian.install_fix("no-such-tool"),
            "install no-such-tool with this distribution's package manager"
        );
    }

    #[test]
    fn os_release_is_read_with_a_bound_and_falls_back_to_usr_lib() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read_os_release(d.path()), "");
        std::fs::create_dir_all(d.path().join("usr/lib")).unwrap();
        std::fs::write(d.path().join("usr/lib/os-release"), ALPINE).unwrap();
        assert_eq!(family(&read_os_release(d.path())), Family::Alpine);
        std::fs::create_dir_all(d.path().join("etc")).unwrap();
        let mut big = String::from(RHEL);
        big.push_str(&"#".repeat(200 * 1024));
        std::fs::write(d.path().join("etc/os-release"), &big).unwrap();
        let got = read_os_release(d.path());
        assert_eq!(u64::try_from(got.len()).unwrap(), MAX_OS_RELEASE);
        assert_eq!(family(&got), Family::Rhel);
    }
}
