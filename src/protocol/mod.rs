//! The FlexVolume protocol surface: kubelet's argv grammar ([`verb`]), its options JSON
//! ([`options`]) and the JSON reply ([`reply`]); and kubelet's side of it, for the commands that
//! judge drivers: Go's decoding and encoding ([`gojson`]) and the `init` judge ([`init`]). Kubernetes
//! quantities ([`quantity`]) are here too: the LVM driver's `size` option and the provisioner's
//! claims and PVs use the same grammar.

pub(crate) mod gojson;
pub(crate) mod init;
pub(crate) mod options;
pub(crate) mod quantity;
pub(crate) mod reply;
pub(crate) mod verb;
