//! Entry point: guards first (standard descriptors, signal mask, panic hook), then dispatch on the
//! name we run as.
//!
//! # Why `main` is the C entry point
//! kubelet starts a fresh process for every call, so what a process pays before `main` is paid by
//! every verb. std's own start-up (the `main` it generates) asks glibc for the main thread's stack
//! (`pthread_getattr_np`, which reads and parses `/proc/self/maps`), maps an alternate signal
//! stack and installs SIGSEGV/SIGBUS handlers to report a stack overflow, ignores SIGPIPE and
//! polls the standard descriptors: 0.07–0.11x of the hostPath mount+unmount pair, measured
//! against the floor (docs/performance.md). So `main` here is the C `main` (`#![no_main]`), and
//! [`flexvol::sys::process::start`] does the two parts a driver needs, in safe code: descriptors
//! 0–2 open, SIGPIPE blocked rather than ignored. What is given up is std's "stack overflow"
//! message: an overflow still ends the process (SIGSEGV) without a reply, as it did with it.
//!
//! Exporting the symbol is the crate's only `unsafe` (an attribute; there is no unsafe operation):
//! `unsafe_code` is denied crate-wide and allowed on this one item, and
//! `contract_unsafe_is_only_the_entry_point` (tests/suite/lints.rs) keeps it that way.
//!
//! Under `cargo test` the bin target gets the test harness's `main` instead.

#![allow(clippy::exit)]
#![cfg_attr(not(test), no_main)]

/// The process entry point, called by glibc's start-up code with the C `argc`/`argv` (std reads
/// the arguments itself, see `std::env::args_os`).
#[cfg(not(test))]
#[allow(unsafe_code)]
// SAFETY: `no_mangle` exports this function as the C symbol `main`, which glibc's `_start`
// calls. Nothing else in the program defines `main` (`no_main` stops rustc from generating its
// own), the signature is the C one, and the body does no unsafe operation.
#[unsafe(no_mangle)]
extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    // Before any thread exists, so that every thread inherits the mask (see sys::process).
    flexvol::sys::process::start();
    std::panic::set_hook(Box::new(|info| {
        flexvol::sys::process::fail_and_exit(
            &format!(
                "internal error in flexvol ({info}); please report it with the matching line of the flexvol log"
            ),
            false,
        )
    }));
    std::process::exit(flexvol::cli::main_os(std::env::args_os().collect()));
}
