//! The FlexVolume protocol surface: kubelet's argv grammar ([`verb`]), its options JSON
//! ([`options`]) and the JSON reply ([`reply`]); and kubelet's side of it, for the commands that
//! judge drivers: Go's decoding and encoding ([`gojson`]) and the `init` judge ([`init`]).

pub mod gojson;
pub mod init;
pub mod options;
pub mod quantity;
pub mod reply;
pub mod verb;
