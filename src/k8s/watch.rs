//! kube-runtime's watcher as the caches ([`crate::provision::cache`]) and the scheduler extender's view
//! (`controller::extender::watch`) consume it: one [`WatchEvent`] per change, and a whole list
//! (the first, or one after the watch lost its place) as one [`WatchEvent::Restarted`].

use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::watcher;

/// A change one watch saw, as the caches ([`crate::provision::cache`]) and the scheduler extender's view
/// (`controller::extender::watch`) apply it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent<K> {
    /// An object was added or changed.
    Applied(K),
    /// An object was deleted.
    Deleted(K),
    /// A complete list: every object there is (the first list, or a list again after the watch
    /// lost its place). The receiver replaces what it holds with it at once.
    Restarted(Vec<K>),
}

/// kube-runtime's watcher on `api`, its events as [`WatchEvent`]s.
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<WatchEvent<K>, watcher::Error>> + Send
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    relists(watcher::watcher(api, config))
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
