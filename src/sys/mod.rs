//! System seams: everything that touches the kernel or starts another program lives here, behind
//! small traits ([`exec::Runner`], [`mount::Mounter`]) that tests can replace.

pub mod exec;
pub mod lock;
pub mod mount;
pub mod mountinfo;
pub mod names;
pub mod paths;
pub mod process;
pub mod testing;
