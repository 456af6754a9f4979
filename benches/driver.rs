//! `cargo bench`: flexvol against floors measured in the same run, printed as ratios.
//!
//! - `init` vs exec of a minimal static C program that prints one JSON line (the process floor);
//!   every flexvol figure is timed alternately with its floor (`measure_against`);
//! - a hostPath mount+unmount pair vs two minimal static C programs doing the same raw syscalls
//!   (bind mount, then umount2), exec'd the same way;
//! - peak memory (max RSS) and page faults per verb, from `getrusage(RUSAGE_CHILDREN)` in a fresh
//!   sub-process;
//! - 64 hostPath mounts in parallel vs 64 sequential ones divided by the cores;
//! - the same hostPath volume published and unpublished through `flexvol csi` over its socket
//!   (NodePublishVolume + NodeUnpublishVolume, a new connection per call as kubelet 1.20 makes
//!   them), interleaved with the same floor pair; the plugin's memory idle and at its peak;
//! - the mount+unmount pair and its floor again with the node's mount table grown: in a private
//!   mount namespace (`unshare --mount`, so nothing leaks to the host and everything vanishes with
//!   the process) with 0, 1,000 and 4,000 unrelated bind mounts added (`FLEXVOL_BENCH_TABLE`, a
//!   comma list, overrides the sizes).
//!
//! Every floor is spawned exactly as flexvol is, environment included (`FLEXVOL_CONFIG`, which
//! the C programs ignore): a `Command` with an added variable builds a new environment block in
//! the parent for every spawn, and timing only one side with it would bill flexvol for it.
//!
//! Nothing here asserts a time: it prints the table and the targets, so a regression is seen, not
//! flaked on. Needs root (real mounts) and a C compiler for the floors.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used
)]
// Float statistics for display (MiB, ratios): u64 -> f64 has no `From`, and a rounded ratio is fine.
#![allow(clippy::as_conversions)]

#[path = "../tests/suite/shared/csi_client.rs"]
mod csi_client;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const FLOOR_JSON: &str = r#"#include <unistd.h>
int main(void) { static const char r[] = "{\"status\":\"Success\"}\n"; return write(1, r, sizeof r - 1) < 0; }
"#;
const FLOOR_MOUNT: &str = r#"#include <sys/mount.h>
#include <unistd.h>
int main(int c, char **v) { static const char r[] = "{\"status\":\"Success\"}\n";
  if (c < 3 || mount(v[1], v[2], 0, MS_BIND, 0) != 0) return 1; return write(1, r, sizeof r - 1) < 0; }
"#;
const FLOOR_UMOUNT: &str = r#"#include <sys/mount.h>
#include <unistd.h>
int main(int c, char **v) { static const char r[] = "{\"status\":\"Success\"}\n";
  if (c < 2 || umount2(v[1], 0) != 0) return 1; return write(1, r, sizeof r - 1) < 0; }
"#;

fn flexvol() -> PathBuf {
    // The release binary: benchmarks measure what is shipped.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new("cargo")
        .args(["build", "--release", "--quiet"])
        .current_dir(root)
        .status()
        .unwrap();
    assert!(status.success(), "cargo build --release failed");
    root.join("target/x86_64-unknown-linux-gnu/release/flexvol")
}

fn compile(dir: &Path, name: &str, src: &str) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    let out = dir.join(name);
    std::fs::write(&c, src).unwrap();
    let st = Command::new("cc")
        .args(["-O2", "-static", "-o"])
        .arg(&out)
        .arg(&c)
        .status()
        .expect("a C compiler (cc) for the floors");
    assert!(st.success(), "cc failed for {name}");
    out
}

fn run(cmd: &Path, args: &[&str], env: &[(&str, &Path)]) {
    let mut c = Command::new(cmd);
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let st = c.status().unwrap();
    assert!(st.success(), "{} {args:?} failed", cmd.display());
}

struct Stats {
    median: Duration,
    p90: Duration,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    Stats {
        median: v[v.len() / 2],
        p90: v[v.len() * 9 / 10],
    }
}

/// `floor` and `x` timed alternately, `iters` times each after a tenth as many warm-up rounds
/// (the page cache and the dentry cache): a machine that gets busier or quieter during the run
/// moves both alike, where timing one after the other billed the drift to one side.
fn measure_against(iters: usize, mut floor: impl FnMut(), mut x: impl FnMut()) -> (Stats, Stats) {
    let (mut f, mut v) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    for i in 0..iters + iters / 10 {
        let t0 = Instant::now();
        floor();
        let t1 = Instant::now();
        x();
        if i >= iters / 10 {
            f.push(t1 - t0);
            v.push(t1.elapsed());
        }
    }
    (stats(f), stats(v))
}

/// What [`csi_pair`] measured.
struct Csi {
    floor: Stats,
    pair: Stats,
    idle_kib: u64,
    peak_kib: u64,
}

/// A `VmRSS:`/`VmHWM:` figure (KiB) of process `pid`.
fn vm_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// One unary call on a new connection to the socket at `path`, as kubelet makes each call.
fn csi_call<Req, Resp>(rt: &tokio::runtime::Runtime, path: &Path, route: &'static str, req: Req)
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    csi_client::call_on::<Req, Resp>(rt, path, route, req).unwrap();
}

/// The hostPath volume `src` published and unpublished through `flexvol csi --no-registration`
/// (started here, under `config`, kubelet root `t/csi-kubelet`), interleaved with `floor`.
fn csi_pair(
    iters: usize,
    bin: &Path,
    t: &Path,
    config: &Path,
    src: &Path,
    floor: impl FnMut(),
) -> Csi {
    use flexvol::csi::proto::*;
    let root = t.join("csi-kubelet");
    let sock = t.join("csi/csi.sock");
    std::fs::create_dir_all(root.join("pods/uid/volumes/kubernetes.io~csi/pv")).unwrap();
    let mut child = Command::new(bin)
        .args([
            "csi",
            "--no-registration",
            "--driver-name",
            "hostpath.csi.flexvol.io",
        ])
        .args(["--node-name", "bench", "--endpoint"])
        .arg(format!("unix://{}", sock.display()))
        .arg("--kubelet-root")
        .arg(&root)
        .env("FLEXVOL_CONFIG", config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < until, "flexvol csi did not listen in 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    let idle_kib = vm_kib(child.id(), "VmRSS:");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let target = root.join("pods/uid/volumes/kubernetes.io~csi/pv/mount");
    let target_s = target.to_string_lossy().into_owned();
    let publish = NodePublishVolumeRequest {
        volume_id: "pv".into(),
        target_path: target_s.clone(),
        volume_capability: Some(VolumeCapability {
            block: None,
            mount: Some(MountVolume::default()),
            access_mode: Some(AccessMode { mode: 1 }),
        }),
        volume_context: [
            ("path".to_owned(), src.to_string_lossy().into_owned()),
            ("type".to_owned(), "Directory".to_owned()),
            (
                "csi.storage.k8s.io/pod.namespace".to_owned(),
                "ns".to_owned(),
            ),
            ("csi.storage.k8s.io/pod.name".to_owned(), "p".to_owned()),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    let unpublish = NodeUnpublishVolumeRequest {
        volume_id: "pv".into(),
        target_path: target_s,
    };
    let (floor, pair) = measure_against(iters, floor, || {
        csi_call::<_, NodePublishVolumeResponse>(
            &rt,
            &sock,
            "/csi.v1.Node/NodePublishVolume",
            publish.clone(),
        );
        csi_call::<_, NodeUnpublishVolumeResponse>(
            &rt,
            &sock,
            "/csi.v1.Node/NodeUnpublishVolume",
            unpublish.clone(),
        );
    });
    assert!(
        !target.exists(),
        "NodeUnpublishVolume left {}",
        target.display()
    );
    let peak_kib = vm_kib(child.id(), "VmHWM:");
    let _ = child.kill();
    let _ = child.wait();
    Csi {
        floor,
        pair,
        idle_kib,
        peak_kib,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// Sub-process mode: run one verb `n` times and print the children's max RSS in KiB and their
/// page faults (minor and major) per run.
fn rss_mode(args: &[String]) {
    let (bin, n, rest) = (&args[2], args[3].parse::<usize>().unwrap(), &args[4..]);
    for _ in 0..n {
        let _ = Command::new(bin)
            .args(rest)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    let ru = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).unwrap();
    println!(
        "{} {}",
        ru.max_rss(),
        (ru.minor_page_faults() + ru.major_page_faults()) / i64::try_from(n).unwrap()
    );
}

/// Max RSS in KiB and page faults per call of `bin args` (5 calls in a fresh sub-process).
fn rss_and_faults(bin: &Path, args: &[&str], config: &Path) -> (u64, u64) {
    let out = Command::new(std::env::current_exe().unwrap())
        .arg("--rss")
        .arg(bin)
        .arg("5")
        .args(args)
        .env("FLEXVOL_CONFIG", config)
        .output()
        .unwrap();
    let v: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (
        v.first().copied().unwrap_or(0),
        v.get(1).copied().unwrap_or(0),
    )
}

/// Sub-process mode, run inside a private mount namespace: add `n` unrelated bind mounts, then
/// measure the pair and its floor and print `n <entries> <pair ns> <floor ns>`.
fn table_mode(args: &[String]) {
    // Make every mount private first, so nothing below propagates anywhere.
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .unwrap();
    let [
        _,
        _,
        n,
        iters,
        t,
        hostpath,
        floor_mount,
        floor_umount,
        config,
    ] = args
    else {
        panic!("bad --table arguments: {args:?}");
    };
    let (n, iters): (usize, usize) = (n.parse().unwrap(), iters.parse().unwrap());
    let t = Path::new(t);
    let filler = t.join(format!("filler-{n}"));
    let src = filler.join("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..n {
        let d = filler.join(i.to_string());
        std::fs::create_dir(&d).unwrap();
        nix::mount::mount(
            Some(&src),
            &d,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
    }
    let entries = std::fs::read("/proc/self/mountinfo")
        .unwrap()
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    let env = [("FLEXVOL_CONFIG", Path::new(config))];
    let data = t.join("src");
    let pod = t.join("kubelet/pods/uid/volumes/flexvol~hostpath/v");
    let pod_s = pod.to_str().unwrap();
    let opts = format!(
        r#"{{"kubernetes.io/pvOrVolumeName":"v","kubernetes.io/readwrite":"rw","path":"{}"}}"#,
        data.display()
    );
    let (hostpath, floor_mount, floor_umount) = (
        Path::new(hostpath),
        Path::new(floor_mount),
        Path::new(floor_umount),
    );
    let (f, x) = measure_against(
        iters,
        || {
            run(floor_mount, &[data.to_str().unwrap(), pod_s], &env);
            run(floor_umount, &[pod_s], &env);
        },
        || {
            run(hostpath, &["mount", pod_s, &opts], &env);
            run(hostpath, &["unmount", pod_s], &env);
        },
    );
    println!(
        "{n} {entries} {} {} {} {}",
        x.median.as_nanos(),
        x.p90.as_nanos(),
        f.median.as_nanos(),
        f.p90.as_nanos()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--rss") {
        return rss_mode(&args);
    }
    if args.get(1).map(String::as_str) == Some("--table") {
        return table_mode(&args);
    }
    if !nix::unistd::geteuid().is_root() {
        println!("benchmarks need root (real mounts); skipped");
        return;
    }
    let iters: usize = std::env::var("FLEXVOL_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let bin = flexvol();
    let tmp = tempfile::Builder::new()
        .prefix("flexvol-bench.")
        .tempdir()
        .unwrap();
    let t = std::fs::canonicalize(tmp.path()).unwrap();
    let floor_json = compile(&t, "floor-json", FLOOR_JSON);
    let floor_mount = compile(&t, "floor-mount", FLOOR_MOUNT);
    let floor_umount = compile(&t, "floor-umount", FLOOR_UMOUNT);
    // Installed as kubelet sees it, with logging on (production default) into the temp dir.
    let plugins = t.join("plugins");
    run(
        &bin,
        &[
            "install",
            "--plugin-dir",
            plugins.to_str().unwrap(),
            "--drivers",
            "hostpath",
        ],
        &[],
    );
    let hostpath = plugins.join("flexvol~hostpath/hostpath");
    let config = t.join("config.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"stateDir":"{0}/state","runDir":"{0}/run","logFile":"{0}/flexvol.log","hostpath":{{"allowedRoots":["{0}/src"]}}}}"#,
            t.display()
        ),
    )
    .unwrap();
    let env = [("FLEXVOL_CONFIG", config.as_path())];
    let src = t.join("src");
    let pod = t.join("kubelet/pods/uid/volumes/flexvol~hostpath/v");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&pod).unwrap();
    let opts = format!(
        r#"{{"kubernetes.io/pvOrVolumeName":"v","kubernetes.io/readwrite":"rw","path":"{}"}}"#,
        src.display()
    );
    let pod_s = pod.to_str().unwrap();

    println!(
        "flexvol benchmarks: {iters} iterations each, medians (p90); floors measured in this run\n"
    );
    let (f_init, x_init) = measure_against(
        iters,
        || run(&floor_json, &[], &env),
        || run(&hostpath, &["init"], &env),
    );
    let (f_pair, x_pair) = measure_against(
        iters,
        || {
            run(&floor_mount, &[src.to_str().unwrap(), pod_s], &env);
            run(&floor_umount, &[pod_s], &env);
        },
        || {
            run(&hostpath, &["mount", pod_s, &opts], &env);
            run(&hostpath, &["unmount", pod_s], &env);
        },
    );

    let csi = csi_pair(iters, &bin, &t, &config, &src, || {
        run(&floor_mount, &[src.to_str().unwrap(), pod_s], &env);
        run(&floor_umount, &[pod_s], &env);
    });

    // 64 mounts: sequential, then all at once.
    let pods: Vec<PathBuf> = (0..64)
        .map(|i| t.join(format!("kubelet/pods/p{i}/volumes/flexvol~hostpath/v")))
        .collect();
    for p in &pods {
        std::fs::create_dir_all(p).unwrap();
    }
    let unmount_all = || {
        for p in &pods {
            run(&hostpath, &["unmount", p.to_str().unwrap()], &env);
        }
    };
    let t0 = Instant::now();
    for p in &pods {
        run(&hostpath, &["mount", p.to_str().unwrap(), &opts], &env);
    }
    let seq = t0.elapsed();
    unmount_all();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for p in &pods {
            let (hostpath, opts, env) = (&hostpath, &opts, &env);
            s.spawn(move || run(hostpath, &["mount", p.to_str().unwrap(), opts], env));
        }
    });
    let par = t0.elapsed();
    unmount_all();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as f64;

    let (rss_init, pf_init) = rss_and_faults(&hostpath, &["init"], &config);
    let (rss_mount, pf_mount) = rss_and_faults(&hostpath, &["mount", pod_s, &opts], &config);
    let (rss_unmount, pf_unmount) = rss_and_faults(&hostpath, &["unmount", pod_s], &config);
    let (rss_floor, pf_floor) = rss_and_faults(&floor_json, &[], &config);
    let size = std::fs::metadata(&bin).unwrap().len();

    // The pair against the size of the mount table, each size in its own private namespace.
    let sizes: Vec<usize> = std::env::var("FLEXVOL_BENCH_TABLE")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![0, 1000, 4000]);
    let table_iters = (iters / 3).max(20);
    let mut table_rows = Vec::new();
    for n in &sizes {
        let out = Command::new("/usr/bin/unshare")
            .args(["--mount", "--propagation", "private", "--"])
            .arg(std::env::current_exe().unwrap())
            .args(["--table", &n.to_string(), &table_iters.to_string()])
            .arg(&t)
            .args([&hostpath, &floor_mount, &floor_umount, &config])
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .expect("unshare (util-linux) for the mount-table benchmark");
        assert!(
            out.status.success(),
            "mount-table benchmark with {n} mounts failed"
        );
        let v: Vec<u128> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect();
        table_rows.push(v);
    }

    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    let row = |name: &str, x: &Stats, f: &Stats, target: &str| {
        println!(
            "{name:<28} {:>10} ({:>9})  floor {:>10} ({:>9})  ratio {:>5.2}x  target {target}",
            ms(x.median),
            ms(x.p90),
            ms(f.median),
            ms(f.p90),
            ratio(x.median, f.median)
        );
    };
    row("init", &x_init, &f_init, "<= 1.5x");
    row("hostPath mount+unmount pair", &x_pair, &f_pair, "<= 1.5x");
    row(
        "CSI publish+unpublish pair",
        &csi.pair,
        &csi.floor,
        "(none yet)",
    );
    println!(
        "{:<28} {:.2}x the exec'd driver's pair above (measured apart, in this run)",
        "",
        ratio(csi.pair.median, x_pair.median)
    );
    println!(
        "{:<28} idle {:.1} MiB after start, peak {:.1} MiB after {iters} pairs (VmRSS, VmHWM)",
        "flexvol csi memory",
        csi.idle_kib as f64 / 1024.0,
        csi.peak_kib as f64 / 1024.0
    );
    let par_ratio = par.as_secs_f64() / (seq.as_secs_f64() / cores);
    println!(
        "{:<28} parallel {:>8} vs sequential {} / {cores} cores = {}  ratio {par_ratio:>5.2}x  target <= 3x",
        "64 hostPath mounts",
        ms(par),
        ms(seq),
        ms(seq.div_f64(cores))
    );
    println!(
        "{:<28} init {:.1} MiB, mount {:.1} MiB, unmount {:.1} MiB (C floor {:.1} MiB)  target < 8 MiB",
        "max RSS",
        rss_init as f64 / 1024.0,
        rss_mount as f64 / 1024.0,
        rss_unmount as f64 / 1024.0,
        rss_floor as f64 / 1024.0
    );
    // Each 64 KiB window of code a call touches is a fault: a jump here with no change in the
    // verbs means tests/perf/hot-symbols.txt no longer matches the build (tests/perf/hot-symbols).
    println!(
        "{:<28} init {pf_init}, mount {pf_mount}, unmount {pf_unmount} (C floor {pf_floor})",
        "page faults per call"
    );
    println!(
        "\nhostPath mount+unmount pair against the mount table (private namespace, {table_iters} pairs each, interleaved with the floor):"
    );
    for v in &table_rows {
        let d = |ns: u128| Duration::from_nanos(u64::try_from(ns).unwrap());
        row(
            &format!("+{} mounts ({} entries)", v[0], v[1]),
            &Stats {
                median: d(v[2]),
                p90: d(v[3]),
            },
            &Stats {
                median: d(v[4]),
                p90: d(v[5]),
            },
            "<= 1.5x",
        );
    }
    println!(
        "{:<28} {:.2} MiB (static, stripped)",
        "binary size",
        size as f64 / 1048576.0
    );
    let left = flexvol::sys::mountinfo::MountTable::read()
        .unwrap()
        .entries
        .iter()
        .filter(|e| e.mount_point.starts_with(&t))
        .count();
    assert_eq!(left, 0, "benchmarks left mounts behind");
}
