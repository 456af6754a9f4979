//! The volume lifecycle, as kube-controller-manager and kubelet run it with the user's options:
//! getvolumename; for attachable drivers attach (twice), isattached, waitforattach and
//! mountdevice (twice); mount by one pod (twice), then by `--parallel` more pods at once; unmount
//! with kubelet's rmdir; unmount of a directory never mounted; unmountdevice and detach (twice).
//! kubelet's own steps are replayed around the calls: the 0750 directory before a mount, skipping
//! a call on what is already a mount point, its default when a verb is "Not supported".
//! What is not replayed is recorded as SKIP, never as a pass.

use super::ConformanceArgs;
use super::harness::{
    Driver, Outcome, base_options, global_dir, likely_mount_point, mkdir_0750, mounted_at_or_in,
    pod_dir, pod_options, text,
};
use crate::protocol::gojson::{Caps, go_json};
use crate::protocol::verb::Call;
use crate::sys::mount::{Mounter, SysMounter, UnmountMode};
use crate::sys::mountinfo::MountTable;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub(super) fn lifecycle(
    a: &ConformanceArgs,
    d: &mut Driver,
    caps: Caps,
    vendor: &str,
    name: &str,
    user: &BTreeMap<String, String>,
    kubelet_root: &Path,
) {
    let base = base_options(&a.fs_type, &a.volume_name, user);
    let j = go_json(&base);

    match d.call(&Call::GetVolumeName { options: j.clone() }) {
        Outcome::Error(e) => {
            d.check("getvolumename: Success or Not supported", false, e);
        }
        Outcome::Success(_) => {
            d.check(
                "getvolumename: Success or Not supported",
                true,
                "Success (kubelet ignores the name)",
            );
        }
        Outcome::NotSupported => {
            d.check(
                "getvolumename: Success or Not supported",
                true,
                "Not supported (cached)",
            );
        }
    }

    // Attach side (kube-controller-manager), then the node's device steps.
    let mut device = String::new();
    let global = global_dir(kubelet_root, vendor, name, &a.volume_name);
    let mut global_mounted = false;
    if caps.attach {
        let attach = Call::Attach {
            options: j.clone(),
            node: a.node.clone(),
        };
        match d.call(&attach) {
            Outcome::Success(st) => {
                device = st.device.clone();
                d.check("attach: Success", true, format!("device {:?}", st.device));
            }
            Outcome::NotSupported => {
                d.check(
                    "attach: Success",
                    true,
                    "Not supported: kubelet uses device \"\"",
                );
            }
            Outcome::Error(e) => {
                d.check("attach: Success", false, e);
                return;
            }
        }
        match d.call(&attach) {
            Outcome::Error(e) => {
                d.check("attach twice: Success with the same device", false, e);
            }
            Outcome::Success(st) => {
                d.check(
                    "attach twice: Success with the same device",
                    st.device == device,
                    format!("{:?} then {:?}", device, st.device),
                );
            }
            Outcome::NotSupported => {}
        }
        match d.call(&Call::IsAttached {
            options: j.clone(),
            node: a.node.clone(),
        }) {
            Outcome::Success(st) => {
                d.check(
                    "isattached: attached true (Success without it means detached)",
                    st.attached,
                    "",
                );
            }
            Outcome::NotSupported => {
                d.check(
                    "isattached: attached true (Success without it means detached)",
                    true,
                    "Not supported (cached)",
                );
            }
            Outcome::Error(e) => {
                d.check(
                    "isattached: attached true (Success without it means detached)",
                    false,
                    e,
                );
            }
        }
        match d.call(&Call::WaitForAttach {
            device: device.clone(),
            options: j.clone(),
        }) {
            Outcome::Success(st) => {
                let ok = !st.device.is_empty() || device.is_empty();
                d.check(
                    "waitforattach: Success echoing the device",
                    ok,
                    format!("device {:?}", st.device),
                );
                device = st.device;
            }
            Outcome::NotSupported => {
                d.check(
                    "waitforattach: Success echoing the device",
                    true,
                    "Not supported: kubelet keeps the device",
                );
            }
            Outcome::Error(e) => {
                d.check("waitforattach: Success echoing the device", false, e);
                return;
            }
        }
        if let Err(e) = mkdir_0750(&global) {
            d.check(
                "mountdevice",
                false,
                format!("cannot create {}: {e}", global.display()),
            );
            return;
        }
        if likely_mount_point(&global) {
            d.skip(
                "mountdevice",
                "not called: the global directory is already a mount point (kubelet would skip it too)",
            );
        } else {
            let mount_device = Call::MountDevice {
                mount_dir: text(&global),
                device: device.clone(),
                options: j.clone(),
            };
            match d.call(&mount_device) {
                Outcome::Success(_) => {
                    global_mounted = MountTable::read().is_ok_and(|t| t.is_mount_point(&global));
                    d.check("mountdevice: Success and a real mount point (else unmountdevice is never called)", global_mounted, global.display().to_string());
                }
                Outcome::NotSupported => {
                    d.skip(
                        "mountdevice",
                        "Not supported: kubelet formats and mounts the device itself; not replayed here",
                    );
                    return;
                }
                Outcome::Error(e) => {
                    d.check("mountdevice: Success and a real mount point (else unmountdevice is never called)", false, e);
                    return;
                }
            }
            if let Outcome::Success(_) | Outcome::NotSupported = d.call(&mount_device) {
                let n = MountTable::read()
                    .map(|t| t.all_at(&global).count())
                    .unwrap_or(0);
                d.check(
                    "mountdevice twice: Success, still one mount",
                    n == 1,
                    format!("{n} mounts"),
                );
            } else {
                d.check(
                    "mountdevice twice: Success, still one mount",
                    false,
                    "the repeated call failed",
                );
            }
        }
    }

    // Pods: mount, repeat, parallel mounts, unmount, kubelet's rmdir.
    let pods: Vec<(String, PathBuf)> = (0..=if caps.attach { 0 } else { a.parallel })
        .map(|i| {
            let uid = format!("00000000-0000-4000-8000-{:012}", i + 1);
            let dir = pod_dir(kubelet_root, &uid, vendor, name, &a.volume_name);
            (uid, dir)
        })
        .collect();
    let mount_one = |d: &mut Driver, uid: &str, dir: &Path| -> Result<&'static str, String> {
        mkdir_0750(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        if likely_mount_point(dir) {
            return Ok("skipped: already a mount point");
        }
        let jp = go_json(&pod_options(&base, uid));
        match d.call(&Call::Mount {
            mount_dir: text(dir),
            options: jp,
        }) {
            Outcome::Success(_) => Ok("Success"),
            Outcome::NotSupported if caps.attach => {
                // kubelet's default: bind the global mount onto the pod dir.
                SysMounter
                    .bind(&global, dir, false)
                    .map(|_| "Not supported: kubelet bind-mounted the global mount")
                    .map_err(|e| format!("kubelet's default bind failed: {e}"))
            }
            Outcome::NotSupported => Err("Not supported: kubelet would bind-mount an empty global directory (non-attachable drivers must implement mount)".into()),
            Outcome::Error(e) => {
                let _ = std::fs::remove_dir(dir);
                Err(e)
            }
        }
    };
    let (uid0, dir0) = pods[0].clone();
    match mount_one(d, &uid0, &dir0) {
        Ok(how) => {
            let n = mounted_at_or_in(&dir0);
            d.check(
                "mount: Success and the pod directory is mounted",
                n >= 1,
                format!("{how}; {n} mount(s)"),
            );
        }
        Err(e) => {
            d.check("mount: Success and the pod directory is mounted", false, e);
            teardown_global(a, d, &global, global_mounted);
            return;
        }
    }
    let before = mounted_at_or_in(&dir0);
    let jp = go_json(&pod_options(&base, &uid0));
    match d.call(&Call::Mount {
        mount_dir: text(&dir0),
        options: jp,
    }) {
        Outcome::Success(_) | Outcome::NotSupported => {
            let after = mounted_at_or_in(&dir0);
            d.check(
                "mount twice: Success, no second mount",
                after == before,
                format!("{before} then {after} mounts"),
            );
        }
        Outcome::Error(e) => {
            d.check("mount twice: Success, no second mount", false, e);
        }
    }
    if pods.len() > 1 {
        let results: Vec<Result<&'static str, String>> = std::thread::scope(|sc| {
            let handles: Vec<_> = pods[1..]
                .iter()
                .map(|(uid, dir)| {
                    let mut local = d.fork();
                    let mount_one = &mount_one;
                    sc.spawn(move || mount_one(&mut local, uid, dir))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
                .collect()
        });
        let bad: Vec<String> = results
            .iter()
            .filter_map(|r| r.as_ref().err().cloned())
            .collect();
        d.check(
            &format!("{} more pods mount the same volume at once", pods.len() - 1),
            bad.is_empty(),
            bad.join("; "),
        );
    }
    if caps.requires_fs_resize && caps.attach {
        d.skip(
            "expandfs",
            "not replayed: it needs a size change of the volume",
        );
    }

    let mut left = Vec::new();
    for (_, dir) in &pods {
        if !dir.exists() {
            continue;
        }
        match d.call(&Call::Unmount {
            mount_dir: text(dir),
        }) {
            Outcome::Success(_) => {}
            Outcome::NotSupported => {
                let _ = SysMounter.unmount(dir, UnmountMode::Normal);
            }
            Outcome::Error(e) => {
                left.push(format!("{}: {e}", dir.display()));
                continue;
            }
        }
        if mounted_at_or_in(dir) > 0 {
            left.push(format!("{} still mounted", dir.display()));
        } else if let Err(e) = std::fs::remove_dir(dir) {
            left.push(format!("kubelet's rmdir of {} fails: {e}", dir.display()));
        }
    }
    d.check(
        "unmount: Success, nothing left mounted, kubelet can remove the directory",
        left.is_empty(),
        left.join("; "),
    );

    // unmount of a directory that exists but was never mounted (kubelet calls it; it must succeed).
    let never = pod_dir(kubelet_root, "never-mounted", vendor, name, &a.volume_name);
    if mkdir_0750(&never).is_ok() {
        match d.call(&Call::Unmount {
            mount_dir: text(&never),
        }) {
            Outcome::Success(_) | Outcome::NotSupported => {
                d.check("unmount of a never-mounted directory: Success", true, "")
            }
            Outcome::Error(e) => d.check("unmount of a never-mounted directory: Success", false, e),
        };
        let _ = std::fs::remove_dir(&never);
    }
    teardown_global(a, d, &global, global_mounted);
}

pub(super) fn teardown_global(a: &ConformanceArgs, d: &mut Driver, global: &Path, mounted: bool) {
    if !mounted {
        return;
    }
    // kubelet calls unmountdevice only for a real mount point, then removes the directory.
    if likely_mount_point(global) || MountTable::read().is_ok_and(|t| t.is_mount_point(global)) {
        match d.call(&Call::UnmountDevice {
            mount_dir: text(global),
        }) {
            Outcome::Success(_) => {
                let still = MountTable::read().is_ok_and(|t| t.is_mount_point(global));
                let rm = if still {
                    Ok(())
                } else {
                    std::fs::remove_dir(global)
                };
                d.check(
                    "unmountdevice: Success, unmounted, directory removable",
                    !still && rm.is_ok(),
                    format!("{rm:?}"),
                );
            }
            Outcome::NotSupported => {
                let _ = SysMounter.unmount(global, UnmountMode::Normal);
                let _ = std::fs::remove_dir(global);
                d.check(
                    "unmountdevice",
                    true,
                    "Not supported: kubelet unmounted itself",
                );
            }
            Outcome::Error(e) => {
                d.check(
                    "unmountdevice: Success, unmounted, directory removable",
                    false,
                    e,
                );
            }
        }
    }
    let detach = Call::Detach {
        volume: a.volume_name.clone(),
        node: a.node.clone(),
    };
    match d.call(&detach) {
        Outcome::Success(_) | Outcome::NotSupported => d.check("detach: Success", true, ""),
        Outcome::Error(e) => d.check("detach: Success", false, e),
    };
    match d.call(&detach) {
        Outcome::Success(_) | Outcome::NotSupported => d.check("detach twice: Success", true, ""),
        Outcome::Error(e) => d.check("detach twice: Success", false, e),
    };
}
