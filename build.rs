//! Link layout of the flexvol executable, the commit it is built from, and the gRPC service code
//! of `flexvol csi`.
//!
//! The gRPC services (CSI Identity and Node, kubelet's plugin Registration): tonic-build's
//! `manual` builder writes their server code into `OUT_DIR` from the method list in
//! [`grpc_services`]; the messages are hand-written prost structs in `src/csi/proto.rs`. No
//! protoc, no `.proto` file, nothing fetched: a fresh machine builds with `cargo build` alone.
//!
//! The commit (`FLEXVOL_COMMIT` for the crate, read by `src/version.rs`): the environment's
//! `FLEXVOL_COMMIT` when set (the release script, or a build from a tarball that knows it), else
//! `git rev-parse` of the checkout with `-dirty` when tracked files differ from it, else `unknown`
//! (a build outside any git checkout still builds).
//!
//! kubelet execs the driver for every call, so what a call pays to start matters: every 64 KiB
//! window of code it touches costs a page fault. `tests/perf/hot-symbols.txt` (a build input
//! kept beside `tests/perf/hot-symbols`, the script that regenerates it) lists the functions the
//! driver verbs run and the statics they touch; the linker places them together at the start of
//! `.text` and of each data section, which took a hostPath mount from 86 page faults to 47 (code)
//! and then 52 to 49 (data, docs/performance.md "Seventh pass").
//!
//! `--symbol-ordering-file` is an lld option, and rust-lld is rustc's default linker on x86_64
//! Linux since 1.90: with an older rustc (which links with the system's `ld`) nothing is added.
//! Names lld cannot find (the list is older than the toolchain, Cargo.lock or release profile, or
//! names a function that moved) are skipped silently: the binary is the same program, only slower
//! to start. Names are v0-mangled (`.cargo/config.toml`), so editing a function keeps its name;
//! `tests/suite/hot_symbols.rs` fails when the list was made for another Cargo.lock or names a
//! flexvol function that is gone, which is how a stale list is caught before a benchmark.

// Cargo reads a build script's instructions from its stdout.
#![allow(clippy::print_stdout)]

fn main() {
    commit();
    grpc_services();
    println!("cargo:rerun-if-changed=tests/perf/hot-symbols.txt");
    println!("cargo:rerun-if-env-changed=FLEXVOL_LINK_MAP");
    if !links_with_lld() {
        return;
    }
    let list = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/perf/hot-symbols.txt");
    println!("cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={list}");
    println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    // tests/perf/hot-symbols reads the symbols' addresses from the linker's map: building with
    // debug symbols instead would change the profile, and with it every hashed name.
    if let Some(map) = std::env::var_os("FLEXVOL_LINK_MAP") {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,-Map={}",
            map.to_string_lossy()
        );
        // The names the ordering file needs, not their demangled forms.
        println!("cargo:rustc-link-arg-bins=-Wl,--no-demangle");
    }
}

/// Whether rustc links this target with rust-lld: x86_64 Linux, rustc 1.90 or later.
fn links_with_lld() -> bool {
    let target = std::env::var("TARGET").unwrap_or_default();
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let minor = std::process::Command::new(rustc)
        .arg("-V")
        .output()
        .ok()
        .and_then(|o| {
            let v = String::from_utf8_lossy(&o.stdout).into_owned();
            // "rustc 1.95.0 (59807616e 2026-04-14)"
            v.split_whitespace()
                .nth(1)
                .and_then(|ver| ver.split('.').nth(1).map(str::to_owned))
        })
        .and_then(|m| m.parse::<u32>().ok());
    target == "x86_64-unknown-linux-gnu" && minor.is_some_and(|m| m >= 90)
}

/// Sets `FLEXVOL_COMMIT` for the crate (see the module doc).
fn commit() {
    println!("cargo:rerun-if-env-changed=FLEXVOL_COMMIT");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let commit = match std::env::var("FLEXVOL_COMMIT") {
        Ok(c) if !c.is_empty() => c,
        _ => match git(&["rev-parse", "--short=12", "HEAD"]) {
            Some(c) if !c.is_empty() => {
                // A new commit or checkout moves HEAD's reflog; an edit of a tracked file is seen
                // through the crate's own sources (cargo rebuilds, and this runs again).
                if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
                    println!("cargo:rerun-if-changed={dir}/HEAD");
                    println!("cargo:rerun-if-changed={dir}/logs/HEAD");
                }
                let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                    .is_some_and(|s| !s.is_empty());
                if dirty { format!("{c}-dirty") } else { c }
            }
            _ => "unknown".to_owned(),
        },
    };
    println!("cargo:rustc-env=FLEXVOL_COMMIT={commit}");
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".to_owned());
    println!("cargo:rustc-env=FLEXVOL_TARGET={target}");
}

/// Writes the server code of the three gRPC services `flexvol csi` serves (module doc). Only the
/// methods listed are served; any other method of the service answers UNIMPLEMENTED. Route names
/// are the spec's (`/csi.v1.Node/NodePublishVolume`): kubelet calls them by these names.
fn grpc_services() {
    use tonic_build::manual::{Builder, Method, Service};
    let method = |name: &str, route: &str, input: &str, output: &str| {
        Method::builder()
            .name(name)
            .route_name(route)
            .input_type(format!("crate::csi::proto::{input}"))
            .output_type(format!("crate::csi::proto::{output}"))
            .codec_path("tonic_prost::ProstCodec")
            .build()
    };
    let service = |package: &str, name: &str, methods: &[(&str, &str)]| {
        let mut b = Service::builder().name(name).package(package);
        for (snake, route) in methods {
            let (input, output) = match *route {
                // kubelet's registration API names its messages its own way.
                "GetInfo" => ("InfoRequest".to_owned(), "PluginInfo".to_owned()),
                "NotifyRegistrationStatus" => (
                    "RegistrationStatus".to_owned(),
                    "RegistrationStatusResponse".to_owned(),
                ),
                r => (format!("{r}Request"), format!("{r}Response")),
            };
            b = b.method(method(snake, route, &input, &output));
        }
        b.build()
    };
    let services = [
        service(
            "csi.v1",
            "Identity",
            &[
                ("get_plugin_info", "GetPluginInfo"),
                ("get_plugin_capabilities", "GetPluginCapabilities"),
                ("probe", "Probe"),
            ],
        ),
        service(
            "csi.v1",
            "Node",
            &[
                ("node_stage_volume", "NodeStageVolume"),
                ("node_unstage_volume", "NodeUnstageVolume"),
                ("node_publish_volume", "NodePublishVolume"),
                ("node_unpublish_volume", "NodeUnpublishVolume"),
                ("node_get_volume_stats", "NodeGetVolumeStats"),
                ("node_expand_volume", "NodeExpandVolume"),
                ("node_get_capabilities", "NodeGetCapabilities"),
                ("node_get_info", "NodeGetInfo"),
            ],
        ),
        service(
            "pluginregistration",
            "Registration",
            &[
                ("get_info", "GetInfo"),
                ("notify_registration_status", "NotifyRegistrationStatus"),
            ],
        ),
    ];
    Builder::new()
        .build_client(false)
        .build_server(true)
        .build_transport(false)
        .compile(&services);
}
