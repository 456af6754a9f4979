//! The FlexVolume protocol surface: kubelet's argv grammar ([`verb`]), its options JSON
//! ([`options`]) and the JSON reply ([`reply`]).

pub mod options;
pub mod reply;
pub mod verb;
