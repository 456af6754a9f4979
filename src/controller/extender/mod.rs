//! `flexvol scheduler-extender` (issue #24, item 1; design: docs/scheduler-extender.md): a
//! kube-scheduler 1.20 extender that filters out nodes which cannot hold a pod's unbound flexvol
//! claims, all of them together, and scores the others by the room left, from the capacity each
//! node's provisioner publishes ([`crate::provision::capacity`]).
//!
//! - [`wire`]: the extender API's JSON (`ExtenderArgs`, `ExtenderFilterResult`,
//!   `HostPriorityList`), upstream field names exactly;
//! - [`claims`]: a pod → what its claims need; every claim → what is already headed to each node;
//! - [`decide`]: the decision, pure: [`decide::filter`] and [`decide::prioritize`].
//!
//! Caller contract: the extender is configured `ignorable: true`, and everything here keeps to
//! that direction: missing, stale or malformed data lets a node through (score 0), never filters
//! it; only fresh valid data that shows the claims cannot fit filters a node out.
//!
//! Status (say it plainly): the decision, the wire types and the claim mapping exist with unit
//! tests. Not built yet: the HTTP server, the watches that fill [`decide::Model`] and the claim
//! and class caches, the publisher on the nodes, the controller creating the per-node ConfigMaps,
//! the manifests, and the proof with the real 1.20 kube-scheduler (docs/scheduler-extender.md,
//! "Next steps").

pub mod claims;
pub mod decide;
pub mod wire;
