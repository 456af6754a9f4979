//! System seams: starting other programs ([`exec`]), mounts and the mount table ([`mount`],
//! [`mountinfo`]), locks ([`lock`], [`names`]), symlink-safe paths ([`paths`]), our own process
//! (start-up, signals, deadlines: [`process`]) and the one file layer for names a tenant controls,
//! made through directory descriptors — opening beneath a root without symlinks, regular files
//! only through `O_PATH` and a checked non-blocking reopen, bounded reads, listings by descriptor,
//! renames that never replace, links, `statx`/`statfs`, the flags ioctl ([`dirfd`]), root-only
//! files written whole ([`paths::write_private`]: the NFS key, the node key, journals and
//! grants), entering the host's mount namespace ([`hostns`],
//! the provisioner's `--host-mount-namespace`), a pod's fsGroup applied to a tree ([`ownership`])
//! — live here, behind small traits
//! ([`exec::Runner`], [`mount::Mounter`]) that tests can replace, or small functions.
//!
//! Not here: plain `std::fs`/`std::net` use elsewhere, and a few one-line kernel reads and flags
//! made where they are needed — the effective uid (`geteuid`, to check who owns a file),
//! `O_NOFOLLOW` on std's `OpenOptions` when `node::capability` reads its keys, `access(2)` in
//! `ops::doctor`, and the provisioner daemon's signal thread (`provision::run`).

pub(crate) mod dirfd;
pub mod exec;
pub(crate) mod hostns;
pub(crate) mod lock;
pub(crate) mod mount;
pub mod mountinfo;
pub(crate) mod names;
pub(crate) mod ownership;
pub mod paths;
pub mod process;
pub(crate) mod progress;
#[cfg(test)]
pub mod testing;
