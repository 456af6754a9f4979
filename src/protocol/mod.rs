//! The FlexVolume protocol surface: kubelet's argv grammar ([`verb`]), its options JSON
//! ([`options`]) and the JSON reply ([`reply`]); and kubelet's side of it, for the commands that
//! judge drivers: Go's decoding and encoding ([`gojson`]) and the `init` judge ([`init`]). Kubernetes
//! quantities ([`quantity`]) are here too: the LVM driver's `size` option and the provisioner's
//! claims and PVs use the same grammar.

pub mod gojson;
pub mod init;
pub mod options;
pub mod quantity;
pub mod reply;
pub mod verb;
