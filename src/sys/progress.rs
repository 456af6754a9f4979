//! Heartbeats of long work: the thread running a piece of work that a health check watches
//! (`csi::health`) carries its heartbeat, and the steps that may take long for good reasons —
//! a walk of a tenant's tree entry by entry, one tool after another — beat it as they go. A
//! piece of work is then judged stuck by how long it has gone without a beat, never by how long
//! it has run: a walk of millions of files is slow, not stuck; a syscall that never returns
//! beats no more.
//!
//! **Contract**: [`attach`] on the thread that runs the work, holding the returned guard for as
//! long as it runs there; [`beat`] anywhere below (a no-op on a thread with no heartbeat, so the
//! exec'd driver's verbs pay one thread-local read).

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

thread_local! {
    static HEART: RefCell<Option<Arc<AtomicU64>>> = const { RefCell::new(None) };
}

/// Milliseconds since this process's first call: what a heartbeat holds.
pub(crate) fn now_ms() -> u64 {
    u64::try_from(EPOCH.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A new heartbeat, beaten now.
pub(crate) fn heart() -> Arc<AtomicU64> {
    Arc::new(AtomicU64::new(now_ms()))
}

/// The work on this thread made progress.
pub(crate) fn beat() {
    HEART.with(|h| {
        if let Some(a) = &*h.borrow() {
            a.store(now_ms(), Ordering::Relaxed);
        }
    });
}

/// This thread's work beats `heart` until the guard drops.
pub(crate) fn attach(heart: Arc<AtomicU64>) -> Attached {
    heart.store(now_ms(), Ordering::Relaxed);
    HEART.with(|h| *h.borrow_mut() = Some(heart));
    Attached
}

/// [`attach`]'s guard.
pub(crate) struct Attached;

impl Drop for Attached {
    fn drop(&mut self) {
        HEART.with(|h| *h.borrow_mut() = None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_beat_reaches_only_the_attached_heart() {
        beat(); // no heart here: nothing
        let h = heart();
        h.store(0, Ordering::Relaxed);
        {
            let _a = attach(h.clone());
            h.store(0, Ordering::Relaxed);
            std::thread::sleep(std::time::Duration::from_millis(2));
            beat();
            assert!(h.load(Ordering::Relaxed) > 0);
        }
        h.store(0, Ordering::Relaxed);
        beat();
        assert_eq!(h.load(Ordering::Relaxed), 0);
        // Another thread's beat is its own.
        let _a = attach(h.clone());
        h.store(0, Ordering::Relaxed);
        std::thread::spawn(beat).join().unwrap();
        assert_eq!(h.load(Ordering::Relaxed), 0);
    }
}
