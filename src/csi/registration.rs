//! kubelet's plugin registration API (`pluginregistration.Registration`), served on
//! `<kubelet-root>/plugins_registry/<driver-name>-reg.sock`, so that no node-driver-registrar
//! sidecar is needed: kubelet's plugin watcher finds the socket, asks `GetInfo` (type `CSIPlugin`,
//! the driver name, the CSI endpoint as kubelet sees it, the CSI versions), then calls
//! NodeGetInfo on that endpoint and answers `NotifyRegistrationStatus`, which is logged. A
//! refusal is logged with kubelet's reason and the plugin keeps serving: kubelet retries when
//! the socket is recreated (a restart), and the CSI socket still answers whoever calls it.

use super::proto::*;
use super::settings::{LOG_TARGET, Settings};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The server code build.rs writes (tonic-build); its one `as` is tonic's `Code as i32`.
#[allow(clippy::as_conversions)]
mod generated {
    include!(concat!(
        env!("OUT_DIR"),
        "/pluginregistration.Registration.rs"
    ));
}
pub(crate) use generated::registration_server;

/// The plugin type kubelet's watcher dispatches CSI plugins by.
pub(crate) const CSI_PLUGIN: &str = "CSIPlugin";
/// The CSI versions offered; kubelet 1.20 and later accept 1.x.
pub(crate) const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

/// The Registration service over the plugin's [`Settings`].
pub(crate) struct RegistrationService {
    pub(crate) settings: Arc<Settings>,
}

#[tonic::async_trait]
impl registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<InfoRequest>,
    ) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: CSI_PLUGIN.to_owned(),
            name: self.settings.driver_name.clone(),
            endpoint: self
                .settings
                .kubelet_endpoint
                .to_string_lossy()
                .into_owned(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        if s.plugin_registered {
            tracing::info!(target: LOG_TARGET, "kubelet registered the CSI plugin {:?}", self.settings.driver_name);
        } else {
            tracing::error!(target: LOG_TARGET,
                "kubelet did not register the CSI plugin {:?}: {:?}; still serving (kubelet tries again when the plugin restarts)",
                self.settings.driver_name, s.error);
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
