//! The LVM and NFS verbs against the bare commands they wrap, measured in the same run, inside the
//! test guest (real device-mapper, a real kernel NFS server):
//!
//! ```sh
//! exe=$(cargo bench --bench guest --no-run --message-format=json | jq -r 'select(.executable) | .executable')
//! tests/vm/run --nfs-server "$exe"        # or simply: tests/bench
//! ```
//!
//! Floors: `lvm lvchange -ay` for waitforattach of an inactive LV, `mount` for mountdevice of an
//! existing filesystem, `umount` + `lvm lvchange -an` for unmountdevice, `mount.nfs` and `umount`
//! for the NFS pair. Each is exec'd exactly as the driver is, so the ratio is flexvol's own cost.
//! Prints medians, p90s, ratios and the processes each verb spawns; asserts nothing about time.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn sh(prog: &str, args: &[&str]) -> String {
    let out = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn call(drv: &Path, config: &Path, args: &[&str]) -> Duration {
    let t = Instant::now();
    let out = Command::new(drv)
        .args(args)
        .env("FLEXVOL_CONFIG", config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let el = t.elapsed();
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        drv.display(),
        String::from_utf8_lossy(&out.stdout)
    );
    el
}

fn timed(prog: &str, args: &[&str]) -> Duration {
    let t = Instant::now();
    sh(prog, args);
    t.elapsed()
}

#[derive(Default)]
struct Series(Vec<Duration>);

impl Series {
    fn push(&mut self, d: Duration) {
        self.0.push(d);
    }
    fn median(&self) -> Duration {
        let mut v = self.0.clone();
        v.sort();
        v[v.len() / 2]
    }
    fn p90(&self) -> Duration {
        let mut v = self.0.clone();
        v.sort();
        v[v.len() * 9 / 10]
    }
}

fn row(name: &str, x: &Series, floor: &Series, floor_name: &str, procs: &str) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name:<32} {:>8.1} ms (p90 {:>7.1})  floor {:>8.1} ms  {:>5.2}x  [{floor_name}]  spawns: {procs}",
        ms(x.median()),
        ms(x.p90()),
        ms(floor.median()),
        x.median().as_secs_f64() / floor.median().as_secs_f64()
    );
}

/// Counts the processes one call spawns, through wrapper scripts in a private tool directory.
fn spawned(drv: &Path, tools_cfg: &Path, count: &Path, args: &[&str]) -> String {
    let _ = std::fs::remove_file(count);
    call(drv, tools_cfg, args);
    let mut v: Vec<String> = std::fs::read_to_string(count)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    v.sort();
    if v.is_empty() {
        "none".into()
    } else {
        format!("{} ({})", v.len(), v.join(" "))
    }
}

fn main() {
    if std::env::args().any(|a| a == "--bench") && !Path::new("/dev/mapper/control").exists() {
        // `cargo bench` on the host: this benchmark only makes sense in the guest.
        println!(
            "guest benchmark: needs device-mapper and an NFS server; run it with tests/bench (inside tests/vm/run --nfs-server)"
        );
        return;
    }
    assert!(
        Path::new("/dev/mapper/control").exists(),
        "run inside the test guest: tests/vm/run --nfs-server <this binary>"
    );
    let iters: usize = std::env::var("FLEXVOL_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = repo.join("target/x86_64-unknown-linux-gnu/release/flexvol");
    assert!(
        bin.exists(),
        "build the release binary first (cargo build --release)"
    );
    let t = tempfile::Builder::new()
        .prefix("flexvol-gbench.")
        .tempdir()
        .unwrap();
    let root = std::fs::canonicalize(t.path()).unwrap();
    let plugins = root.join("plugins");
    sh(
        bin.to_str().unwrap(),
        &[
            "install",
            "--plugin-dir",
            plugins.to_str().unwrap(),
            "--drivers",
            "lvm,nfs",
        ],
    );
    let lvm = plugins.join("flexvol~lvm/lvm");
    let nfs = plugins.join("flexvol~nfs/nfs");
    // The bench's own volume group, the one the LVM driver may use (lvm.allowedVolumeGroups).
    let vg = format!("fvb{}", std::process::id());
    let cfg = root.join("config.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"stateDir":"{0}/state","runDir":"{0}/run","logFile":"{0}/log","lvm":{{"allowedVolumeGroups":["{vg}"]}}}}"#,
            root.display()
        ),
    )
    .unwrap();

    // Wrapper tools that record each run, for the process counts.
    let tools = root.join("tools");
    let count = root.join("count");
    std::fs::create_dir_all(&tools).unwrap();
    for name in [
        "lvm",
        "blkid",
        "mkfs.ext4",
        "mount.nfs",
        "umount",
        "getent",
        "resize2fs",
    ] {
        let real = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
            .iter()
            .map(|d| format!("{d}/{name}"))
            .find(|p| Path::new(p).exists());
        if let Some(real) = real {
            let w = tools.join(name);
            std::fs::write(
                &w,
                format!(
                    "#!/bin/sh\necho {name} >> {}\nexec {real} \"$@\"\n",
                    count.display()
                ),
            )
            .unwrap();
            sh("chmod", &["755", w.to_str().unwrap()]);
        }
    }
    let tools_cfg = root.join("tools.json");
    std::fs::write(
        &tools_cfg,
        format!(
            r#"{{"stateDir":"{0}/state","runDir":"{0}/run","logFile":"","toolDirs":["{1}"],"lvm":{{"allowedVolumeGroups":["{vg}"]}}}}"#,
            root.display(),
            tools.display()
        ),
    )
    .unwrap();

    // LVM: a loop-backed VG and one LV, created and formatted by the driver.
    let img = root.join("pv.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(512 << 20)
        .unwrap();
    let loop_dev = sh("losetup", &["-f", "--show", img.to_str().unwrap()])
        .trim()
        .to_owned();
    sh("lvm", &["vgcreate", "-y", &vg, &loop_dev]);
    let dev = format!("/dev/{vg}/bench");
    let j = format!(
        r#"{{"kubernetes.io/fsType":"ext4","kubernetes.io/pvOrVolumeName":"pv-bench","kubernetes.io/readwrite":"rw","size":"64Mi","volumeID":"bench","volumegroup":"{vg}"}}"#
    );
    let global = root.join("kubelet/plugins/kubernetes.io/flexvolume/flexvol/lvm/mounts/pv-bench");
    let g = global.to_str().unwrap();
    std::fs::create_dir_all(&global).unwrap();
    let create = call(&lvm, &cfg, &["waitforattach", &dev, &j]);
    let mkfs = call(&lvm, &cfg, &["mountdevice", g, &dev, &j]);
    call(&lvm, &cfg, &["unmountdevice", g]);
    let lvpath = format!("{vg}/bench");
    let (mut wfa, mut wfa_f, mut md, mut md_f, mut umd, mut umd_f, mut active, mut mounted) = (
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
    );
    for _ in 0..iters {
        wfa.push(call(&lvm, &cfg, &["waitforattach", &dev, &j]));
        active.push(call(&lvm, &cfg, &["waitforattach", &dev, &j]));
        md.push(call(&lvm, &cfg, &["mountdevice", g, &dev, &j]));
        mounted.push(call(&lvm, &cfg, &["mountdevice", g, &dev, &j]));
        umd.push(call(&lvm, &cfg, &["unmountdevice", g]));
        // The floor: the bare commands for the same work.
        wfa_f.push(timed("lvm", &["lvchange", "-ay", &lvpath]));
        md_f.push(timed("mount", &[&dev, g]));
        umd_f.push(timed("umount", &[g]) + timed("lvm", &["lvchange", "-an", &lvpath]));
    }
    let p_wfa = spawned(&lvm, &tools_cfg, &count, &["waitforattach", &dev, &j]);
    let p_active = spawned(&lvm, &tools_cfg, &count, &["waitforattach", &dev, &j]);
    let p_md = spawned(&lvm, &tools_cfg, &count, &["mountdevice", g, &dev, &j]);
    let p_mounted = spawned(&lvm, &tools_cfg, &count, &["mountdevice", g, &dev, &j]);
    let p_umd = spawned(&lvm, &tools_cfg, &count, &["unmountdevice", g]);

    // NFS: one export, mount and unmount of a pod directory.
    let export = Path::new("/srv/nfs/bench");
    std::fs::create_dir_all(export).unwrap();
    let pod = root.join("kubelet/pods/u/volumes/flexvol~nfs/v");
    std::fs::create_dir_all(&pod).unwrap();
    let p = pod.to_str().unwrap();
    let nj = r#"{"kubernetes.io/pvOrVolumeName":"v","kubernetes.io/readwrite":"rw","server":"127.0.0.1","share":"/srv/nfs/bench"}"#;
    let (mut nm, mut nm_f, mut nu, mut nu_f) = (
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
    );
    for _ in 0..iters {
        nm.push(call(&nfs, &cfg, &["mount", p, nj]));
        nu.push(call(&nfs, &cfg, &["unmount", p]));
        nm_f.push(timed(
            "mount.nfs",
            &[
                "127.0.0.1:/srv/nfs/bench",
                p,
                "-o",
                "nosuid,nodev,hard,timeo=600,retrans=2",
            ],
        ));
        nu_f.push(timed("umount", &[p]));
    }
    let p_nm = spawned(&nfs, &tools_cfg, &count, &["mount", p, nj]);
    let p_nu = spawned(&nfs, &tools_cfg, &count, &["unmount", p]);

    println!(
        "flexvol guest benchmarks: {iters} iterations, medians; floors are the bare commands, run in the same loop\n"
    );
    println!(
        "LVM (one-off: waitforattach creating the LV {:.0} ms, first mountdevice with mkfs {:.0} ms)",
        create.as_secs_f64() * 1e3,
        mkfs.as_secs_f64() * 1e3
    );
    row(
        "waitforattach (inactive LV)",
        &wfa,
        &wfa_f,
        "lvm lvchange -ay",
        &p_wfa,
    );
    row(
        "waitforattach (already active)",
        &active,
        &wfa_f,
        "lvm lvchange -ay",
        &p_active,
    );
    row("mountdevice (existing ext4)", &md, &md_f, "mount", &p_md);
    row(
        "mountdevice (already mounted)",
        &mounted,
        &md_f,
        "mount",
        &p_mounted,
    );
    row(
        "unmountdevice",
        &umd,
        &umd_f,
        "umount + lvm lvchange -an",
        &p_umd,
    );
    println!("\nNFS (v4.2 negotiated, 127.0.0.1)");
    row("mount", &nm, &nm_f, "mount.nfs", &p_nm);
    row("unmount", &nu, &nu_f, "umount", &p_nu);

    let _ = Command::new("lvm")
        .args(["vgremove", "-y", "-ff", &vg])
        .output();
    let _ = Command::new("losetup").args(["-d", &loop_dev]).output();
}
