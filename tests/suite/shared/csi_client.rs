//! A CSI client for tests and benchmarks: one unary gRPC call on a new connection to a Unix
//! socket, as kubelet makes each call. Shared by the suite (`root_csi`, the guest tests) and
//! `benches/driver.rs` (which includes this file by path: a bench cannot import a test crate).

use std::path::Path;

/// Calls `route` with `req` on the socket at `path`, on `rt`.
pub(crate) fn call_on<Req, Resp>(
    rt: &tokio::runtime::Runtime,
    path: &Path,
    route: &'static str,
    req: Req,
) -> Result<Resp, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let path = path.to_owned();
    rt.block_on(async move {
        let channel = tonic::transport::Endpoint::from_static("http://localhost")
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let p = path.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tokio::net::UnixStream::connect(p).await?,
                    ))
                }
            }))
            .await
            .map_err(|e| tonic::Status::unavailable(format!("connect: {e}")))?;
        let mut g = tonic::client::Grpc::new(channel);
        g.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("not ready: {e}")))?;
        g.unary(
            tonic::Request::new(req),
            tonic::codegen::http::uri::PathAndQuery::from_static(route),
            tonic_prost::ProstCodec::<Req, Resp>::default(),
        )
        .await
        .map(tonic::Response::into_inner)
    })
}
