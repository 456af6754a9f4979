//! kube-runtime's watcher as the caches ([`crate::provision::cache`]) and the scheduler extender's view
//! (`controller::extender::watch`) consume it: one [`WatchEvent`] per change, and a whole list
//! (the first, or one after the watch lost its place) as one [`WatchEvent::Restarted`].
//!
//! **Backoff.** After a failed list or watch, the watcher is polled again only after
//! kube-runtime's [`DefaultBackoff`] (client-go's reflector: 0.8 s doubling to 30 s with jitter,
//! reset after 120 s without a failure), so a consumer logs each error and goes on reading: it
//! never sleeps itself, and a struggling API server is not asked again every 2 s by every node.

use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::utils::{Backoff, StreamBackoff};
use kube::runtime::watcher::{self, DefaultBackoff};

/// A change one watch saw, as the caches ([`crate::provision::cache`]) and the scheduler extender's view
/// (`controller::extender::watch`) apply it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WatchEvent<K> {
    /// An object was added or changed.
    Applied(K),
    /// An object was deleted.
    Deleted(K),
    /// A complete list: every object there is (the first list, or a list again after the watch
    /// lost its place). The receiver replaces what it holds with it at once.
    Restarted(Vec<K>),
}

/// `events`, polled again after an error only once `backoff` says so.
fn backed_off<S, B>(events: S, backoff: B) -> StreamBackoff<S, B>
where
    S: futures::TryStream,
    B: Backoff,
{
    StreamBackoff::new(events, backoff)
}

/// kube-runtime's watcher on `api`, after each failure paused by [`DefaultBackoff`], its events
/// as [`WatchEvent`]s.
pub(crate) fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<WatchEvent<K>, watcher::Error>> + Send
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    relists(backed_off(
        watcher::watcher(api, config),
        DefaultBackoff::default(),
    ))
}

/// kube-runtime (0.92 and later) streams a list page by page (`Init`, one `InitApply` per object,
/// `InitDone`); this gathers it into one [`WatchEvent::Restarted`], so a receiver never sees half
/// a list and never takes an object missing from the pages read so far for deleted. An `Init`
/// starts the gathering afresh (kube-runtime 5 lists again from the start after a page failed);
/// an error passes through and changes nothing gathered.
fn relists<K, E>(
    events: impl Stream<Item = Result<watcher::Event<K>, E>>,
) -> impl Stream<Item = Result<WatchEvent<K>, E>> {
    events
        .scan(None::<Vec<K>>, |listing, ev| {
            let out = match ev {
                Err(e) => Some(Err(e)),
                Ok(watcher::Event::Init) => {
                    *listing = Some(Vec::new());
                    None
                }
                Ok(watcher::Event::InitApply(o)) => {
                    listing.get_or_insert_with(Vec::new).push(o);
                    None
                }
                Ok(watcher::Event::InitDone) => Some(Ok(WatchEvent::Restarted(
                    listing.take().unwrap_or_default(),
                ))),
                Ok(watcher::Event::Apply(o)) => Some(Ok(WatchEvent::Applied(o))),
                Ok(watcher::Event::Delete(o)) => Some(Ok(WatchEvent::Deleted(o))),
            };
            futures::future::ready(Some(out))
        })
        .filter_map(futures::future::ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Errors in a row are spaced by the backoff (not read back to back), and a success in
    /// between goes through at once: the consumer never has to sleep.
    #[test]
    fn failures_are_spaced_by_the_backoff() {
        struct Steps(Vec<std::time::Duration>);
        impl Iterator for Steps {
            type Item = std::time::Duration;
            fn next(&mut self) -> Option<std::time::Duration> {
                if self.0.is_empty() {
                    None
                } else {
                    Some(self.0.remove(0))
                }
            }
        }
        impl Backoff for Steps {
            fn reset(&mut self) {}
        }
        let ms = std::time::Duration::from_millis;
        let items: Vec<Result<u8, &str>> = vec![Err("a"), Err("b"), Ok(1), Err("c")];
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let start = std::time::Instant::now();
        let got: Vec<(Result<u8, &str>, std::time::Duration)> = rt.block_on(
            backed_off(
                futures::stream::iter(items),
                Steps(vec![ms(150), ms(150), ms(150)]),
            )
            .map(|r| (r, start.elapsed()))
            .collect(),
        );
        let results: Vec<_> = got.iter().map(|(r, _)| *r).collect();
        assert_eq!(results, [Err("a"), Err("b"), Ok(1), Err("c")]);
        assert!(got[0].1 < ms(100), "{got:?}");
        assert!(got[1].1 >= ms(150), "the second error waited: {got:?}");
        assert!(got[2].1 >= ms(300), "{got:?}");
    }

    /// A list that arrives page by page, with an error between two pages, is one `Restarted`
    /// with every object of it; a list again (`Init`) starts afresh; changes pass one by one.
    #[test]
    fn a_paged_list_is_one_restart_and_a_relist_starts_afresh() {
        use watcher::Event as E;
        let input: Vec<Result<E<&str>, &str>> = vec![
            Ok(E::Init),
            Ok(E::InitApply("a")),
            Err("timeout"),
            Ok(E::InitApply("b")),
            Ok(E::InitDone),
            Ok(E::Apply("c")),
            Ok(E::Delete("a")),
            Ok(E::Init),
            Ok(E::InitApply("x")),
            Ok(E::Init),
            Ok(E::InitApply("c")),
            Ok(E::InitDone),
            Ok(E::Init),
            Ok(E::InitDone),
        ];
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let out: Vec<_> = rt.block_on(relists(futures::stream::iter(input)).collect());
        assert_eq!(
            out,
            vec![
                Err("timeout"),
                Ok(WatchEvent::Restarted(vec!["a", "b"])),
                Ok(WatchEvent::Applied("c")),
                Ok(WatchEvent::Deleted("a")),
                Ok(WatchEvent::Restarted(vec!["c"])),
                Ok(WatchEvent::Restarted(vec![])),
            ]
        );
    }
}
