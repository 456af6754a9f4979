//! The protobuf messages `flexvol csi` speaks, written by hand from the specs (no protoc): CSI
//! v1.x (`csi.proto` of container-storage-interface/spec, package `csi.v1`) for the Identity and
//! Node calls served, and kubelet's plugin registration API
//! (`pkg/apis/pluginregistration/v1/api.proto` of kubernetes/kubelet, package
//! `pluginregistration`).
//!
//! **Field numbers and wire types are the contract**: each `tag` below is the spec's field number
//! (the unit tests pin at least one field of every message against a hand-computed encoding).
//! Only what the served calls use is modelled; a field a peer sends that is not here is skipped by
//! prost on decode, as protobuf requires. Enum fields are `int32` on the wire: they are plain
//! `i32` here with the spec's values as constants.
//!
//! Secrets: [`NodePublishVolumeRequest`] and [`NodeStageVolumeRequest`] carry `secrets` and
//! `volume_context` (whose values may be secret too), [`NodeExpandVolumeRequest`] `secrets`; their
//! `Debug` shows none of those values, so a log line or a panic message built from
//! it cannot echo one.

use std::collections::HashMap;

/// `google.protobuf.BoolValue` (wrappers.proto): a bool that can be absent.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BoolValue {
    #[prost(bool, tag = "1")]
    pub value: bool,
}

// ---- csi.v1 Identity ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginInfoRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginInfoResponse {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub vendor_version: String,
    #[prost(map = "string, string", tag = "3")]
    pub manifest: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginCapabilitiesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginCapabilitiesResponse {
    #[prost(message, repeated, tag = "1")]
    pub capabilities: Vec<PluginCapability>,
}

/// `PluginCapability`: only its `service` arm (field 1) is modelled.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginCapability {
    #[prost(message, optional, tag = "1")]
    pub service: Option<PluginCapabilityService>,
}

/// `PluginCapability.Service`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginCapabilityService {
    #[prost(int32, tag = "1")]
    pub r#type: i32,
}

/// `PluginCapability.Service.Type.VOLUME_ACCESSIBILITY_CONSTRAINTS`.
pub const VOLUME_ACCESSIBILITY_CONSTRAINTS: i32 = 2;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProbeRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProbeResponse {
    #[prost(message, optional, tag = "1")]
    pub ready: Option<BoolValue>,
}

// ---- csi.v1 Node ----

/// `NodePublishVolumeRequest`. `Debug` is written below: no secret or context value shows.
#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct NodePublishVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(map = "string, string", tag = "2")]
    pub publish_context: HashMap<String, String>,
    #[prost(string, tag = "3")]
    pub staging_target_path: String,
    #[prost(string, tag = "4")]
    pub target_path: String,
    #[prost(message, optional, tag = "5")]
    pub volume_capability: Option<VolumeCapability>,
    #[prost(bool, tag = "6")]
    pub readonly: bool,
    #[prost(map = "string, string", tag = "7")]
    pub secrets: HashMap<String, String>,
    #[prost(map = "string, string", tag = "8")]
    pub volume_context: HashMap<String, String>,
}

impl std::fmt::Debug for NodePublishVolumeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePublishVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field("target_path", &self.target_path)
            .field("staging_target_path", &self.staging_target_path)
            .field("readonly", &self.readonly)
            .field("volume_capability", &self.volume_capability)
            .field("volume_context_keys", &sorted_keys(&self.volume_context))
            .field("publish_context_keys", &sorted_keys(&self.publish_context))
            .field(
                "secrets",
                &format_args!("<{} redacted>", self.secrets.len()),
            )
            .finish()
    }
}

/// A map's keys, sorted: what a `Debug` shows of a map whose values may be secret.
fn sorted_keys(m: &HashMap<String, String>) -> Vec<&str> {
    let mut k: Vec<&str> = m.keys().map(String::as_str).collect();
    k.sort_unstable();
    k
}

/// `VolumeCapability`: the `access_type` oneof (block = 1, mount = 2) as two optional fields,
/// which is the same on the wire.
#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeCapability {
    #[prost(message, optional, tag = "1")]
    pub block: Option<BlockVolume>,
    #[prost(message, optional, tag = "2")]
    pub mount: Option<MountVolume>,
    #[prost(message, optional, tag = "3")]
    pub access_mode: Option<AccessMode>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BlockVolume {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct MountVolume {
    #[prost(string, tag = "1")]
    pub fs_type: String,
    #[prost(string, repeated, tag = "2")]
    pub mount_flags: Vec<String>,
    #[prost(string, tag = "3")]
    pub volume_mount_group: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AccessMode {
    #[prost(int32, tag = "1")]
    pub mode: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePublishVolumeResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnpublishVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub target_path: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnpublishVolumeResponse {}

/// `NodeStageVolumeRequest`. `Debug` is written below: no secret or context value shows.
#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct NodeStageVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(map = "string, string", tag = "2")]
    pub publish_context: HashMap<String, String>,
    #[prost(string, tag = "3")]
    pub staging_target_path: String,
    #[prost(message, optional, tag = "4")]
    pub volume_capability: Option<VolumeCapability>,
    #[prost(map = "string, string", tag = "5")]
    pub secrets: HashMap<String, String>,
    #[prost(map = "string, string", tag = "6")]
    pub volume_context: HashMap<String, String>,
}

impl std::fmt::Debug for NodeStageVolumeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStageVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field("staging_target_path", &self.staging_target_path)
            .field("volume_capability", &self.volume_capability)
            .field("volume_context_keys", &sorted_keys(&self.volume_context))
            .field("publish_context_keys", &sorted_keys(&self.publish_context))
            .field(
                "secrets",
                &format_args!("<{} redacted>", self.secrets.len()),
            )
            .finish()
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeStageVolumeResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnstageVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub staging_target_path: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnstageVolumeResponse {}

/// `CapacityRange`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CapacityRange {
    #[prost(int64, tag = "1")]
    pub required_bytes: i64,
    #[prost(int64, tag = "2")]
    pub limit_bytes: i64,
}

/// `NodeExpandVolumeRequest`. `Debug` is written below: no secret shows.
#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct NodeExpandVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub volume_path: String,
    #[prost(message, optional, tag = "3")]
    pub capacity_range: Option<CapacityRange>,
    #[prost(string, tag = "4")]
    pub staging_target_path: String,
    #[prost(message, optional, tag = "5")]
    pub volume_capability: Option<VolumeCapability>,
    #[prost(map = "string, string", tag = "6")]
    pub secrets: HashMap<String, String>,
}

impl std::fmt::Debug for NodeExpandVolumeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeExpandVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field("volume_path", &self.volume_path)
            .field("staging_target_path", &self.staging_target_path)
            .field("capacity_range", &self.capacity_range)
            .field("volume_capability", &self.volume_capability)
            .field(
                "secrets",
                &format_args!("<{} redacted>", self.secrets.len()),
            )
            .finish()
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeExpandVolumeResponse {
    #[prost(int64, tag = "1")]
    pub capacity_bytes: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetVolumeStatsRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub volume_path: String,
    #[prost(string, tag = "3")]
    pub staging_target_path: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetVolumeStatsResponse {
    #[prost(message, repeated, tag = "1")]
    pub usage: Vec<VolumeUsage>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeUsage {
    #[prost(int64, tag = "1")]
    pub available: i64,
    #[prost(int64, tag = "2")]
    pub total: i64,
    #[prost(int64, tag = "3")]
    pub used: i64,
    #[prost(int32, tag = "4")]
    pub unit: i32,
}

/// `VolumeUsage.Unit.BYTES`.
pub const UNIT_BYTES: i32 = 1;
/// `VolumeUsage.Unit.INODES`.
pub const UNIT_INODES: i32 = 2;

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetCapabilitiesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetCapabilitiesResponse {
    #[prost(message, repeated, tag = "1")]
    pub capabilities: Vec<NodeServiceCapability>,
}

/// `NodeServiceCapability`: its one oneof arm, `rpc` (field 1).
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeServiceCapability {
    #[prost(message, optional, tag = "1")]
    pub rpc: Option<NodeServiceCapabilityRpc>,
}

/// `NodeServiceCapability.RPC`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeServiceCapabilityRpc {
    #[prost(int32, tag = "1")]
    pub r#type: i32,
}

/// `NodeServiceCapability.RPC.Type.STAGE_UNSTAGE_VOLUME`.
pub const STAGE_UNSTAGE_VOLUME: i32 = 1;
/// `NodeServiceCapability.RPC.Type.GET_VOLUME_STATS`.
pub const GET_VOLUME_STATS: i32 = 2;
/// `NodeServiceCapability.RPC.Type.EXPAND_VOLUME`.
pub const EXPAND_VOLUME: i32 = 3;
/// `NodeServiceCapability.RPC.Type.VOLUME_MOUNT_GROUP` (CSI 1.5): the plugin applies
/// `MountVolume.volume_mount_group` itself, and kubelet (1.22+, `DelegateFSGroupToCSIDriver`)
/// then passes the pod's fsGroup there instead of applying it.
pub const VOLUME_MOUNT_GROUP: i32 = 6;

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetInfoRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetInfoResponse {
    #[prost(string, tag = "1")]
    pub node_id: String,
    #[prost(int64, tag = "2")]
    pub max_volumes_per_node: i64,
    #[prost(message, optional, tag = "3")]
    pub accessible_topology: Option<Topology>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Topology {
    #[prost(map = "string, string", tag = "1")]
    pub segments: HashMap<String, String>,
}

// ---- pluginregistration (kubelet) ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct InfoRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginInfo {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub endpoint: String,
    #[prost(string, repeated, tag = "4")]
    pub supported_versions: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegistrationStatus {
    #[prost(bool, tag = "1")]
    pub plugin_registered: bool,
    #[prost(string, tag = "2")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegistrationStatusResponse {}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn bytes(m: &impl Message) -> Vec<u8> {
        m.encode_to_vec()
    }

    /// A length-delimited field: key (field << 3 | 2), length, payload.
    fn ld(field: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![field << 3 | 2, u8::try_from(payload.len()).unwrap()];
        v.extend_from_slice(payload);
        v
    }

    /// A varint field (values below 128): key (field << 3 | 0), value.
    fn vi(field: u8, value: u8) -> Vec<u8> {
        vec![field << 3, value]
    }

    fn map_entry(field: u8, k: &str, v: &str) -> Vec<u8> {
        let mut e = ld(1, k.as_bytes());
        e.extend(ld(2, v.as_bytes()));
        ld(field, &e)
    }

    #[test]
    fn empty_requests_encode_to_nothing() {
        assert!(bytes(&GetPluginInfoRequest {}).is_empty());
        assert!(bytes(&GetPluginCapabilitiesRequest {}).is_empty());
        assert!(bytes(&ProbeRequest {}).is_empty());
        assert!(bytes(&NodeGetCapabilitiesRequest {}).is_empty());
        assert!(bytes(&NodeGetInfoRequest {}).is_empty());
        assert!(bytes(&NodePublishVolumeResponse {}).is_empty());
        assert!(bytes(&NodeUnpublishVolumeResponse {}).is_empty());
        assert!(bytes(&NodeStageVolumeResponse {}).is_empty());
        assert!(bytes(&NodeUnstageVolumeResponse {}).is_empty());
        assert!(bytes(&InfoRequest {}).is_empty());
        assert!(bytes(&RegistrationStatusResponse {}).is_empty());
        assert!(bytes(&BlockVolume {}).is_empty());
    }

    #[test]
    fn identity_messages_use_the_spec_field_numbers() {
        let info = GetPluginInfoResponse {
            name: "a".into(),
            vendor_version: "v".into(),
            manifest: HashMap::from([("k".into(), "x".into())]),
        };
        let mut want = ld(1, b"a");
        want.extend(ld(2, b"v"));
        want.extend(map_entry(3, "k", "x"));
        assert_eq!(bytes(&info), want);

        let caps = GetPluginCapabilitiesResponse {
            capabilities: vec![PluginCapability {
                service: Some(PluginCapabilityService {
                    r#type: VOLUME_ACCESSIBILITY_CONSTRAINTS,
                }),
            }],
        };
        assert_eq!(bytes(&caps), ld(1, &ld(1, &vi(1, 2))));

        let probe = ProbeResponse {
            ready: Some(BoolValue { value: true }),
        };
        assert_eq!(bytes(&probe), ld(1, &vi(1, 1)));
    }

    #[test]
    fn node_messages_use_the_spec_field_numbers() {
        let publish = NodePublishVolumeRequest {
            volume_id: "v".into(),
            publish_context: HashMap::from([("p".into(), "q".into())]),
            staging_target_path: "s".into(),
            target_path: "t".into(),
            volume_capability: Some(VolumeCapability {
                block: None,
                mount: Some(MountVolume {
                    fs_type: "e".into(),
                    mount_flags: vec!["f".into()],
                    volume_mount_group: "g".into(),
                }),
                access_mode: Some(AccessMode { mode: 1 }),
            }),
            readonly: true,
            secrets: HashMap::from([("k".into(), "z".into())]),
            volume_context: HashMap::from([("c".into(), "d".into())]),
        };
        let mut mount = ld(1, b"e");
        mount.extend(ld(2, b"f"));
        mount.extend(ld(3, b"g"));
        let mut cap = ld(2, &mount);
        cap.extend(ld(3, &vi(1, 1)));
        let mut want = ld(1, b"v");
        want.extend(map_entry(2, "p", "q"));
        want.extend(ld(3, b"s"));
        want.extend(ld(4, b"t"));
        want.extend(ld(5, &cap));
        want.extend(vi(6, 1));
        want.extend(map_entry(7, "k", "z"));
        want.extend(map_entry(8, "c", "d"));
        assert_eq!(bytes(&publish), want);
        assert_eq!(
            NodePublishVolumeRequest::decode(want.as_slice()).unwrap(),
            publish
        );
        let block = VolumeCapability {
            block: Some(BlockVolume {}),
            mount: None,
            access_mode: None,
        };
        assert_eq!(bytes(&block), ld(1, b""));

        let unpublish = NodeUnpublishVolumeRequest {
            volume_id: "v".into(),
            target_path: "t".into(),
        };
        let mut want = ld(1, b"v");
        want.extend(ld(2, b"t"));
        assert_eq!(bytes(&unpublish), want);

        let stats = NodeGetVolumeStatsRequest {
            volume_id: "v".into(),
            volume_path: "p".into(),
            staging_target_path: "s".into(),
        };
        let mut want = ld(1, b"v");
        want.extend(ld(2, b"p"));
        want.extend(ld(3, b"s"));
        assert_eq!(bytes(&stats), want);

        let usage = NodeGetVolumeStatsResponse {
            usage: vec![VolumeUsage {
                available: 1,
                total: 2,
                used: 3,
                unit: UNIT_BYTES,
            }],
        };
        let mut u = vi(1, 1);
        u.extend(vi(2, 2));
        u.extend(vi(3, 3));
        u.extend(vi(4, 1));
        assert_eq!(bytes(&usage), ld(1, &u));

        let caps = NodeGetCapabilitiesResponse {
            capabilities: vec![NodeServiceCapability {
                rpc: Some(NodeServiceCapabilityRpc {
                    r#type: GET_VOLUME_STATS,
                }),
            }],
        };
        assert_eq!(bytes(&caps), ld(1, &ld(1, &vi(1, 2))));

        let info = NodeGetInfoResponse {
            node_id: "n".into(),
            max_volumes_per_node: 5,
            accessible_topology: Some(Topology {
                segments: HashMap::from([("k".into(), "v".into())]),
            }),
        };
        let mut want = ld(1, b"n");
        want.extend(vi(2, 5));
        want.extend(ld(3, &map_entry(1, "k", "v")));
        assert_eq!(bytes(&info), want);
    }

    #[test]
    fn registration_messages_use_the_spec_field_numbers() {
        let info = PluginInfo {
            r#type: "CSIPlugin".into(),
            name: "n".into(),
            endpoint: "/e".into(),
            supported_versions: vec!["1.0.0".into()],
        };
        let mut want = ld(1, b"CSIPlugin");
        want.extend(ld(2, b"n"));
        want.extend(ld(3, b"/e"));
        want.extend(ld(4, b"1.0.0"));
        assert_eq!(bytes(&info), want);

        let status = RegistrationStatus {
            plugin_registered: true,
            error: "e".into(),
        };
        let mut want = vi(1, 1);
        want.extend(ld(2, b"e"));
        assert_eq!(bytes(&status), want);
    }

    #[test]
    fn unknown_fields_are_skipped_on_decode() {
        // A NodeUnpublishVolumeRequest from a newer peer: field 9 (unknown) between known ones.
        let mut wire = ld(1, b"v");
        wire.extend(ld(9, b"new"));
        wire.extend(ld(2, b"t"));
        let r = NodeUnpublishVolumeRequest::decode(wire.as_slice()).unwrap();
        assert_eq!((r.volume_id.as_str(), r.target_path.as_str()), ("v", "t"));
    }

    #[test]
    fn publish_request_debug_shows_no_secret_or_context_value() {
        let r = NodePublishVolumeRequest {
            volume_id: "vol".into(),
            secrets: HashMap::from([("password".into(), "hunter2-secret".into())]),
            volume_context: HashMap::from([("path".into(), "/srv/ctx-value".into())]),
            ..Default::default()
        };
        let shown = format!("{r:?}");
        assert!(!shown.contains("hunter2-secret"), "{shown}");
        assert!(!shown.contains("/srv/ctx-value"), "{shown}");
        assert!(
            shown.contains("vol") && shown.contains("\"path\""),
            "{shown}"
        );
    }

    #[test]
    fn stage_and_expand_messages_use_the_spec_field_numbers() {
        let stage = NodeStageVolumeRequest {
            volume_id: "v".into(),
            publish_context: HashMap::from([("p".into(), "q".into())]),
            staging_target_path: "s".into(),
            volume_capability: Some(VolumeCapability {
                block: None,
                mount: Some(MountVolume {
                    fs_type: "x".into(),
                    ..Default::default()
                }),
                access_mode: Some(AccessMode { mode: 1 }),
            }),
            secrets: HashMap::from([("k".into(), "z".into())]),
            volume_context: HashMap::from([("c".into(), "d".into())]),
        };
        let mut mount = ld(1, b"x");
        mount = ld(2, &mount);
        mount.extend(ld(3, &vi(1, 1)));
        let mut want = ld(1, b"v");
        want.extend(map_entry(2, "p", "q"));
        want.extend(ld(3, b"s"));
        want.extend(ld(4, &mount));
        want.extend(map_entry(5, "k", "z"));
        want.extend(map_entry(6, "c", "d"));
        assert_eq!(bytes(&stage), want);

        let unstage = NodeUnstageVolumeRequest {
            volume_id: "v".into(),
            staging_target_path: "s".into(),
        };
        let mut want = ld(1, b"v");
        want.extend(ld(2, b"s"));
        assert_eq!(bytes(&unstage), want);

        let expand = NodeExpandVolumeRequest {
            volume_id: "v".into(),
            volume_path: "p".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 5,
                limit_bytes: 6,
            }),
            staging_target_path: "s".into(),
            volume_capability: None,
            secrets: HashMap::from([("k".into(), "z".into())]),
        };
        let mut range = vi(1, 5);
        range.extend(vi(2, 6));
        let mut want = ld(1, b"v");
        want.extend(ld(2, b"p"));
        want.extend(ld(3, &range));
        want.extend(ld(4, b"s"));
        want.extend(map_entry(6, "k", "z"));
        assert_eq!(bytes(&expand), want);
        assert_eq!(
            bytes(&NodeExpandVolumeResponse { capacity_bytes: 7 }),
            vi(1, 7)
        );
        assert_eq!(
            (STAGE_UNSTAGE_VOLUME, GET_VOLUME_STATS, EXPAND_VOLUME),
            (1, 2, 3)
        );
    }

    #[test]
    fn stage_and_expand_request_debug_show_no_secret_or_context_value() {
        let stage = NodeStageVolumeRequest {
            volume_id: "vol".into(),
            secrets: HashMap::from([("password".into(), "hunter2-secret".into())]),
            volume_context: HashMap::from([("volumegroup".into(), "ctx-value".into())]),
            ..Default::default()
        };
        let expand = NodeExpandVolumeRequest {
            volume_id: "vol".into(),
            secrets: HashMap::from([("password".into(), "hunter2-secret".into())]),
            ..Default::default()
        };
        for shown in [format!("{stage:?}"), format!("{expand:?}")] {
            assert!(!shown.contains("hunter2-secret"), "{shown}");
            assert!(!shown.contains("ctx-value"), "{shown}");
            assert!(shown.contains("vol"), "{shown}");
        }
    }
}
