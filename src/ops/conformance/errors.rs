//! Error paths: a driver must refuse what it cannot or must not do, and a refusal must change
//! nothing. A refusal, by the protocol: status `"Failure"` with a message (any exit status: kubelet
//! returns the same error, docs/protocol.md §1.2), nothing mounted under the kubelet root, nothing created (no option path that did not exist,
//! nothing in the directories kubelet prepared). Checked:
//! - malformed options JSON (needs no options);
//! - `mount` on a pod directory that does not exist (needs no options): kubelet always creates it
//!   first, so a driver that creates it or mounts anyway writes where nobody asked;
//! - each `--bad-options` set: options this driver must refuse (a path that does not exist, a
//!   missing required option, a bad name), merged into kubelet's options like real ones.
//!
//! Each attempt walks the verbs kubelet and kube-controller-manager call for a new volume —
//! attach, waitforattach, mountdevice, mount for attachable drivers; mount otherwise — skipping
//! "Not supported" ones, until one answers something else; that one must be the refusal. Verbs
//! that answered Success on the way are undone with their counterparts (detach, unmountdevice,
//! unmount); a leftover mount is found by the final "nothing left mounted" check.

use super::ConformanceArgs;
use super::harness::{
    Driver, Outcome, base_options, global_dir, mkdir_0750, mounted_at_or_in, mounts_under, pod_dir,
    pod_options, text,
};
use crate::protocol::gojson::{Caps, GoStatus, go_json};
use crate::protocol::verb::Call;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Runs every error-path check on `d`.
pub(super) fn error_paths(
    a: &ConformanceArgs,
    d: &mut Driver,
    caps: Caps,
    vendor: &str,
    name: &str,
    bad: &[BTreeMap<String, String>],
    kubelet_root: &Path,
) {
    let place = |tag: &str| Place {
        vendor: vendor.to_string(),
        name: name.to_string(),
        volume: format!("{}-{tag}", a.volume_name),
        node: a.node.clone(),
        kubelet_root: kubelet_root.to_path_buf(),
    };

    // Malformed options JSON: the same bytes for every verb.
    let p = place("malformed");
    let r = attempt(d, caps, &p, "{not json", &|_| "{not json".into());
    judge(
        d,
        "malformed options JSON: Failure, nothing mounted or created",
        r,
        &[],
    );

    // mount on a pod directory that does not exist.
    let check = "mount on a pod directory that does not exist: Failure, nothing mounted or created";
    let p = place("nodir");
    // A pod uid of this run only, so a leftover of an earlier run cannot be taken for a creation.
    let uid = &format!("00000000-0000-4000-8000-{:012x}", std::process::id());
    let missing = pod_dir(kubelet_root, uid, vendor, name, &p.volume);
    let opts = go_json(&pod_options(
        &base_options(&a.fs_type, &p.volume, &user_options(a)),
        uid,
    ));
    let before = mounts_under(kubelet_root);
    match d.call_full(&Call::Mount {
        mount_dir: text(&missing),
        options: opts,
    }) {
        (Outcome::NotSupported, ..) => {
            d.skip(
                check,
                "not run: the driver answers \"Not supported\" to mount",
            );
        }
        (outcome, code, reply) => {
            let succeeded = matches!(outcome, Outcome::Success(_));
            let refused = (!succeeded).then(|| Refusal {
                verb: "mount",
                code,
                reply,
                error: match outcome {
                    Outcome::Error(e) => e,
                    _ => String::new(),
                },
            });
            let created = kubelet_root.join("pods").join(uid);
            let mut changed = Vec::new();
            if mounts_under(kubelet_root) != before {
                changed.push(format!(
                    "something was mounted under {}",
                    kubelet_root.display()
                ));
            }
            if created.exists() {
                changed.push(format!("{} was created", created.display()));
            }
            let r = Attempt {
                refused,
                accepted: if succeeded { vec!["mount"] } else { vec![] },
                changed,
            };
            let accepted = r.accepted.clone();
            judge(d, check, r, &[]);
            undo(d, &p, &accepted, &missing, None);
        }
    }

    // The driver's own bad options.
    if bad.is_empty() {
        d.skip(
            super::BAD_OPTIONS,
            "not run: no --bad-options given (e.g. a path that does not exist, a missing required option)",
        );
    }
    for (i, user) in bad.iter().enumerate() {
        let keys: Vec<&str> = user.keys().map(String::as_str).collect();
        let check = format!(
            "--bad-options #{} {{{}}}: Failure, nothing mounted or created",
            i + 1,
            keys.join(",")
        );
        let p = place(&format!("bad{}", i + 1));
        let base = base_options(&a.fs_type, &p.volume, user);
        // Paths the options name that do not exist now must not exist afterwards.
        let absent: Vec<PathBuf> = user
            .values()
            .filter(|v| v.starts_with('/'))
            .map(PathBuf::from)
            .filter(|p| std::fs::symlink_metadata(p).is_err())
            .collect();
        let r = attempt(d, caps, &p, &go_json(&base), &|uid| {
            go_json(&pod_options(&base, uid))
        });
        judge(d, &check, r, &absent);
    }
}

/// Where an attempt happens: its own volume name, so attempts never share directories.
struct Place {
    vendor: String,
    name: String,
    volume: String,
    node: String,
    kubelet_root: PathBuf,
}

/// The verb that answered something other than Success or "Not supported".
struct Refusal {
    verb: &'static str,
    code: Option<i32>,
    reply: Option<GoStatus>,
    error: String,
}

/// What one attempt came to.
struct Attempt {
    /// `None`: every verb called answered Success (or "Not supported").
    refused: Option<Refusal>,
    /// Verbs that answered Success before the refusal (undone afterwards).
    accepted: Vec<&'static str>,
    /// What the attempt changed that a refusal must not.
    changed: Vec<String>,
}

/// Walks the verbs of a new volume with the given options until one refuses; checks what changed;
/// undoes what was accepted.
fn attempt(
    d: &mut Driver,
    caps: Caps,
    p: &Place,
    options: &str,
    mount_options: &dyn Fn(&str) -> String,
) -> Attempt {
    let uid = "00000000-0000-4000-8000-0000000000ee";
    let pod = pod_dir(&p.kubelet_root, uid, &p.vendor, &p.name, &p.volume);
    let global = global_dir(&p.kubelet_root, &p.vendor, &p.name, &p.volume);
    let before = mounts_under(&p.kubelet_root);
    let mut accepted = Vec::new();
    let mut device = String::new();
    let mut refused = None;
    let mut verbs: Vec<&'static str> = Vec::new();
    if caps.attach {
        verbs.extend(["attach", "waitforattach", "mountdevice"]);
    }
    verbs.push("mount");
    let mut prepared = Vec::new();
    for verb in verbs {
        let call = match verb {
            "attach" => Call::Attach {
                options: options.to_owned(),
                node: p.node.clone(),
            },
            "waitforattach" => Call::WaitForAttach {
                device: device.clone(),
                options: options.to_owned(),
            },
            "mountdevice" => {
                if let Err(e) = mkdir_0750(&global) {
                    refused = Some(Refusal {
                        verb,
                        code: None,
                        reply: None,
                        error: format!("the runner cannot create {}: {e}", global.display()),
                    });
                    break;
                }
                prepared.push(global.clone());
                Call::MountDevice {
                    mount_dir: text(&global),
                    device: device.clone(),
                    options: options.to_owned(),
                }
            }
            _ => {
                if let Err(e) = mkdir_0750(&pod) {
                    refused = Some(Refusal {
                        verb,
                        code: None,
                        reply: None,
                        error: format!("the runner cannot create {}: {e}", pod.display()),
                    });
                    break;
                }
                prepared.push(pod.clone());
                Call::Mount {
                    mount_dir: text(&pod),
                    options: mount_options(uid),
                }
            }
        };
        match d.call_full(&call) {
            (Outcome::NotSupported, ..) => {}
            (Outcome::Success(st), ..) => {
                if matches!(verb, "attach" | "waitforattach") && !st.device.is_empty() {
                    device = st.device;
                }
                accepted.push(verb);
            }
            (Outcome::Error(error), code, reply) => {
                refused = Some(Refusal {
                    verb,
                    code,
                    reply,
                    error,
                });
                break;
            }
        }
    }
    let mut changed = Vec::new();
    if mounts_under(&p.kubelet_root) != before {
        changed.push(format!(
            "something was mounted under {}",
            p.kubelet_root.display()
        ));
    }
    for dir in &prepared {
        let entries = std::fs::read_dir(dir).map(|r| r.count()).unwrap_or(0);
        if entries > 0 {
            changed.push(format!(
                "{} entries were created in {}",
                entries,
                dir.display()
            ));
        }
    }
    let r = Attempt {
        refused,
        accepted: accepted.clone(),
        changed,
    };
    undo(d, p, &accepted, &pod, Some(&global));
    r
}

/// Undoes the verbs that answered Success, newest first, then removes the directories the runner
/// created for the attempt if they are empty and unmounted (never recursively).
fn undo(d: &mut Driver, p: &Place, accepted: &[&str], pod: &Path, global: Option<&Path>) {
    for verb in accepted.iter().rev() {
        let _ = match *verb {
            "mount" => d.call(&Call::Unmount {
                mount_dir: text(pod),
            }),
            "mountdevice" => match global {
                Some(g) => d.call(&Call::UnmountDevice { mount_dir: text(g) }),
                None => continue,
            },
            "attach" => d.call(&Call::Detach {
                volume: p.volume.clone(),
                node: p.node.clone(),
            }),
            _ => continue,
        };
    }
    for dir in [Some(pod), global].into_iter().flatten() {
        if mounted_at_or_in(dir) == 0 {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Records the verdict of one attempt; `absent` are paths that must still not exist.
fn judge(d: &mut Driver, check: &str, r: Attempt, absent: &[PathBuf]) {
    let mut problems = r.changed;
    for path in absent {
        if std::fs::symlink_metadata(path).is_ok() {
            problems.push(format!(
                "{} did not exist and now does (left in place)",
                path.display()
            ));
        }
    }
    let detail = match &r.refused {
        None if r.accepted.is_empty() => {
            d.skip(
                check,
                "not run: the driver answers \"Not supported\" to every verb of a new volume",
            );
            return;
        }
        None => {
            problems.insert(
                0,
                format!("accepted: {} answered Success", r.accepted.join(", ")),
            );
            String::new()
        }
        Some(f) => {
            match &f.reply {
                Some(st) if st.status == "Failure" => {
                    if st.message.trim().is_empty() {
                        problems.push(format!(
                            "{}: Failure without a message: the operator cannot tell what to fix",
                            f.verb
                        ));
                    }
                }
                Some(st) => problems.push(format!(
                    "{}: status {:?} where the protocol says \"Failure\"",
                    f.verb, st.status
                )),
                None => problems.push(format!("{}: no Failure reply: {}", f.verb, f.error)),
            }
            match f.code {
                Some(_) => {}
                None if f.reply.is_some() => {
                    problems.push(format!("{}: killed by a signal", f.verb))
                }
                None => {}
            }
            let msg = f
                .reply
                .as_ref()
                .map(|st| st.message.clone())
                .unwrap_or_default();
            format!(
                "{} refused (exit {}): {}",
                f.verb,
                f.code.map_or("-".into(), |c| c.to_string()),
                shorten(&msg)
            )
        }
    };
    if problems.is_empty() {
        d.check(check, true, detail);
    } else {
        d.check(check, false, problems.join("; "));
    }
}

fn shorten(s: &str) -> String {
    if s.chars().count() > 200 {
        format!("{}...", s.chars().take(200).collect::<String>())
    } else {
        s.to_string()
    }
}

/// The user's `--options`, or none (error paths must not need them).
fn user_options(a: &ConformanceArgs) -> BTreeMap<String, String> {
    a.options
        .as_deref()
        .and_then(|o| serde_json::from_str(o).ok())
        .unwrap_or_default()
}
