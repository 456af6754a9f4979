//! The work queue of one lane ([`crate::provision::lanes`]): which objects to look at next, keyed by object,
//! with per-object exponential backoff, and a breaker per fault domain (an NFS server).
//!
//! As in client-go's rate-limited work queue (and kube-runtime's controller):
//! - a key is in the queue at most once, however many watch events named it ([`WorkQueue::add`]);
//! - a key whose work failed comes back after a delay that doubles per consecutive failure,
//!   from [`Backoff::base`] to [`Backoff::max`] ([`WorkQueue::done`]), so one broken claim costs
//!   a few attempts an hour, not one per change anywhere;
//! - a change of the object itself (a watch event) makes it due at once: the change may be the fix;
//! - a periodic resync adds every key the lane holds, except those waiting out a backoff
//!   ([`WorkQueue::add_unless_backing_off`]).
//!
//! [`Breakers`]: a fault domain (an NFS server) that failed opens its breaker: work for it fails
//! fast, without touching the server, until the breaker's delay (doubling like the backoff) has
//! passed; then one attempt is let through (half-open), and its outcome closes or reopens it. A
//! tar-pitting server (TCP accepted, never answered) so costs one attempt's deadline per delay,
//! not one per claim per pass.
//!
//! Pure data structures: the caller passes the time, so the tests need no clock.

use std::collections::{BTreeSet, HashMap};

/// Which lane works on a kind: the node-local kinds' or the shared kinds'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Lane {
    /// hostPath, LVM: this node's volumes.
    Local,
    /// NFS: volumes any node may make, made by the one instance that leads them.
    Shared,
}

impl Lane {
    /// The lane's name in logs, metrics and health answers.
    pub fn name(self) -> &'static str {
        match self {
            Lane::Local => "node-local",
            Lane::Shared => "shared",
        }
    }
}
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Delays after consecutive failures: `base`, `2 base`, `4 base`, ... up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// After the first failure.
    pub(crate) base: Duration,
    /// Never longer than this.
    pub(crate) max: Duration,
}

impl Backoff {
    /// The provisioner's: 1 s doubling to 5 minutes (sig-storage's external-provisioner uses 1 s
    /// to 5 min too).
    pub(crate) const DEFAULT: Backoff = Backoff {
        base: Duration::from_secs(1),
        max: Duration::from_secs(300),
    };

    /// The delay after `failures` consecutive failures (`failures >= 1`).
    pub(crate) fn delay(&self, failures: u32) -> Duration {
        let shift = failures.saturating_sub(1).min(20);
        self.base.saturating_mul(1u32 << shift).min(self.max)
    }
}

/// The keys to work on, each once, and the keys waiting out a backoff.
#[derive(Debug)]
pub(crate) struct WorkQueue<K: Ord + Hash + Clone> {
    backoff: Backoff,
    /// Due now (ordered: stable, testable batches).
    due: BTreeSet<K>,
    /// Failed: consecutive failures and when to try again.
    failing: HashMap<K, (u32, Instant)>,
    /// Retries handed out (a metric).
    retries: u64,
}

impl<K: Ord + Hash + Clone> WorkQueue<K> {
    /// An empty queue with `backoff`.
    pub fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            due: BTreeSet::new(),
            failing: HashMap::new(),
            retries: 0,
        }
    }

    /// `key` changed: due now, backoff or not (the change may be the fix).
    pub(crate) fn add(&mut self, key: K) {
        self.due.insert(key);
    }

    /// A resync: `key` is due now unless it is waiting out a backoff.
    pub(crate) fn add_unless_backing_off(&mut self, key: K) {
        if !self.failing.contains_key(&key) {
            self.due.insert(key);
        }
    }

    /// Takes every key due at `now`: the changed ones and the failed ones whose delay is over.
    pub(crate) fn take(&mut self, now: Instant) -> Vec<K> {
        for (k, (_, at)) in &self.failing {
            if *at <= now && self.due.insert(k.clone()) {
                self.retries += 1;
            }
        }
        std::mem::take(&mut self.due).into_iter().collect()
    }

    /// The work on `key` ended at `now`: on success its failures are forgotten; on failure it
    /// comes back after the next delay (unless a change makes it due sooner).
    pub(crate) fn done(&mut self, key: &K, ok: bool, now: Instant) {
        if ok {
            self.failing.remove(key);
            return;
        }
        let n = self.failing.get(key).map_or(0, |(n, _)| *n) + 1;
        self.failing
            .insert(key.clone(), (n, now + self.backoff.delay(n)));
    }

    /// Forgets `key` (its object is gone).
    pub(crate) fn forget(&mut self, key: &K) {
        self.failing.remove(key);
        self.due.remove(key);
    }

    /// When the next failed key is due (`None`: none failed).
    pub(crate) fn next_retry(&self) -> Option<Instant> {
        self.failing.values().map(|(_, at)| *at).min()
    }

    /// Keys due now plus keys waiting out a backoff (the queue depth metric).
    pub(crate) fn depth(&self) -> usize {
        self.due.len()
            + self
                .failing
                .keys()
                .filter(|k| !self.due.contains(*k))
                .count()
    }

    /// Keys waiting out a backoff.
    #[cfg(test)]
    pub(crate) fn failing(&self) -> usize {
        self.failing.len()
    }

    /// Retries handed out so far.
    pub(crate) fn retries(&self) -> u64 {
        self.retries
    }
}

/// Why work for a fault domain was not attempted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Open {
    /// When the next attempt is let through.
    pub(crate) until: Instant,
    /// What the last attempt failed with.
    pub(crate) last: String,
}

#[derive(Debug, Clone)]
struct BreakerState {
    failures: u32,
    until: Instant,
    last: String,
    /// An attempt is under way after the delay (half-open): others still fail fast.
    probing: bool,
}

/// One breaker per fault domain (an NFS server's name).
#[derive(Debug)]
pub(crate) struct Breakers {
    backoff: Backoff,
    open: HashMap<String, BreakerState>,
}

impl Breakers {
    /// Breakers that stay open `backoff.delay(failures)` after `failures` consecutive failures.
    pub fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            open: HashMap::new(),
        }
    }

    /// Whether work for `domain` may go ahead at `now`: yes when closed; when open, no until its
    /// delay is over, then yes for one attempt (half-open; the caller reports its outcome with
    /// [`Breakers::record`]).
    pub(crate) fn admit(&mut self, domain: &str, now: Instant) -> Result<(), Open> {
        let Some(s) = self.open.get_mut(domain) else {
            return Ok(());
        };
        if now >= s.until && !s.probing {
            s.probing = true;
            return Ok(());
        }
        Err(Open {
            until: s.until,
            last: s.last.clone(),
        })
    }

    /// The outcome of an attempt for `domain` at `now`: success closes its breaker; a failure
    /// (one that says the server is unreachable or did not answer) opens it, for longer each time.
    pub(crate) fn record(&mut self, domain: &str, failure: Option<&str>, now: Instant) {
        match failure {
            None => {
                self.open.remove(domain);
            }
            Some(why) => {
                let failures = self.open.get(domain).map_or(0, |s| s.failures) + 1;
                self.open.insert(
                    domain.to_owned(),
                    BreakerState {
                        failures,
                        until: now + self.backoff.delay(failures),
                        last: why.to_owned(),
                        probing: false,
                    },
                );
            }
        }
    }

    /// Domains whose breaker is open (a metric).
    pub(crate) fn open_count(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Backoff = Backoff {
        base: Duration::from_secs(1),
        max: Duration::from_secs(8),
    };

    #[test]
    fn backoff_doubles_up_to_its_max() {
        let d: Vec<u64> = (1..=6).map(|n| B.delay(n).as_secs()).collect();
        assert_eq!(d, [1, 2, 4, 8, 8, 8]);
        assert_eq!(Backoff::DEFAULT.delay(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn a_key_is_queued_once_and_a_failed_one_waits_its_delay() {
        let t0 = Instant::now();
        let mut q = WorkQueue::new(B);
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.take(t0), ["a", "b"]);
        assert!(q.take(t0).is_empty());
        q.done(&"a", false, t0);
        q.done(&"b", true, t0);
        assert_eq!(q.next_retry(), Some(t0 + Duration::from_secs(1)));
        assert!(q.take(t0 + Duration::from_millis(999)).is_empty());
        assert_eq!(q.take(t0 + Duration::from_secs(1)), ["a"]);
        assert_eq!(q.retries(), 1);
        // A second failure: twice as long; a resync does not bring it back sooner.
        let t1 = t0 + Duration::from_secs(1);
        q.done(&"a", false, t1);
        q.add_unless_backing_off("a");
        q.add_unless_backing_off("b");
        assert_eq!(q.take(t1), ["b"]);
        assert!(q.take(t1 + Duration::from_millis(1999)).is_empty());
        assert_eq!(q.depth(), 1);
        // A change to the object does.
        q.add("a");
        assert_eq!(q.take(t1), ["a"]);
        // Success forgets the failures.
        q.done(&"a", true, t1);
        assert_eq!(q.next_retry(), None);
        assert_eq!(q.failing(), 0);
    }

    #[test]
    fn a_forgotten_key_does_not_come_back() {
        let t0 = Instant::now();
        let mut q = WorkQueue::new(B);
        q.add(1);
        let _ = q.take(t0);
        q.done(&1, false, t0);
        q.forget(&1);
        assert!(q.take(t0 + Duration::from_secs(60)).is_empty());
    }

    #[test]
    fn an_open_breaker_fails_fast_then_lets_one_attempt_through() {
        let t0 = Instant::now();
        let mut b = Breakers::new(B);
        assert_eq!(b.admit("srv", t0), Ok(()));
        b.record("srv", Some("no answer"), t0);
        let open = b.admit("srv", t0).unwrap_err();
        assert_eq!(open.until, t0 + Duration::from_secs(1));
        assert_eq!(open.last, "no answer");
        // Other servers are not affected.
        assert_eq!(b.admit("other", t0), Ok(()));
        // After the delay: one attempt (half-open), the rest still fail fast.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(b.admit("srv", t1), Ok(()));
        assert!(b.admit("srv", t1).is_err());
        // It failed again: open twice as long.
        b.record("srv", Some("no answer"), t1);
        assert_eq!(
            b.admit("srv", t1).unwrap_err().until,
            t1 + Duration::from_secs(2)
        );
        assert_eq!(b.open_count(), 1);
        // A success closes it.
        let t2 = t1 + Duration::from_secs(2);
        assert_eq!(b.admit("srv", t2), Ok(()));
        b.record("srv", None, t2);
        assert_eq!(b.admit("srv", t2), Ok(()));
        assert_eq!(b.open_count(), 0);
    }
}
