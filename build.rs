//! Link layout of the flexvol executable.
//!
//! kubelet execs the driver for every call, so what a call pays to start matters: every 64 KiB
//! window of code it touches costs a page fault. `src/hot-symbols.txt` lists the functions the
//! driver verbs run (made by `tests/perf/hot-symbols`); the linker places them together at the
//! start of `.text`, which took a hostPath mount from 86 page faults to 45.
//!
//! The linker is rustc's default on x86_64 Linux since 1.90, rust-lld (`--symbol-ordering-file`
//! is an lld option). Names it cannot find (the list is older than the toolchain, Cargo.lock or
//! profile) are skipped silently: the binary is the same program, only slower to start.

// Cargo reads a build script's instructions from its stdout.
#![allow(clippy::print_stdout)]

fn main() {
    let list = concat!(env!("CARGO_MANIFEST_DIR"), "/src/hot-symbols.txt");
    println!("cargo:rerun-if-changed=src/hot-symbols.txt");
    println!("cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={list}");
    println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    // tests/perf/hot-symbols reads the symbols' addresses from the linker's map: building with
    // debug symbols instead would change the profile, and with it every hashed name.
    println!("cargo:rerun-if-env-changed=FLEXVOL_LINK_MAP");
    if let Some(map) = std::env::var_os("FLEXVOL_LINK_MAP") {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,-Map={}",
            map.to_string_lossy()
        );
        // The names the ordering file needs, not their demangled forms.
        println!("cargo:rustc-link-arg-bins=-Wl,--no-demangle");
    }
}
