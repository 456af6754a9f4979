//! The CSI Identity service: the plugin's name and version, its plugin capability
//! (VOLUME_ACCESSIBILITY_CONSTRAINTS, only with `--topology-key`: then NodeGetInfo says where
//! volumes are accessible; by default it reports no topology), and a
//! Probe that is ready as soon as the socket answers (nothing is loaded lazily).

use super::proto::*;
use super::settings::Settings;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The server code build.rs writes (tonic-build); its one `as` is tonic's `Code as i32`.
#[allow(clippy::as_conversions)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/csi.v1.Identity.rs"));
}
pub(crate) use generated::identity_server;

/// The Identity service over the plugin's [`Settings`].
pub(crate) struct IdentityService {
    pub(crate) settings: Arc<Settings>,
}

#[tonic::async_trait]
impl identity_server::Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.settings.driver_name.clone(),
            vendor_version: crate::version::VERSION.to_owned(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let topology = self.settings.topology_key.is_some();
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: topology
                .then_some(PluginCapability {
                    service: Some(PluginCapabilityService {
                        r#type: VOLUME_ACCESSIBILITY_CONSTRAINTS,
                    }),
                })
                .into_iter()
                .collect(),
        }))
    }

    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        // Not live while blocking work is stuck (`health`): kubelet's liveness probe restarts
        // the plugin on this answer.
        super::health::check().map_err(|s| Status::failed_precondition(s.to_string()))?;
        Ok(Response::new(ProbeResponse {
            ready: Some(BoolValue { value: true }),
        }))
    }
}
