//! The accept loop every listener of a network shard uses (client port, HA port, metrics).

use std::time::Duration;

/// Accepts connections on `listener` until `stopping` is set, giving each to `serve`. The
/// stop flag is checked every `poll`.
///
/// One accept stays in flight across those checks. glommio submits `accept` to io_uring; a
/// dropped accept future cancels the operation, and when the kernel had completed it just
/// before, the accepted socket is discarded: the client's connection is established (by the
/// kernel) and never served, so its first request times out. Racing a fresh accept against a
/// timer on every turn (as this code once did) lost a connection that way now and then.
pub async fn accept_until_stopped(
    listener: &glommio::net::TcpListener,
    stopping: &std::sync::atomic::AtomicBool,
    poll: Duration,
    mut serve: impl FnMut(glommio::Result<glommio::net::TcpStream, ()>) -> Option<Duration>,
) {
    let mut pending = Box::pin(listener.accept());
    loop {
        if stopping.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let accepted = futures_lite::future::or(async { Some((&mut pending).await) }, async {
            glommio::timer::sleep(poll).await;
            None
        })
        .await;
        let Some(accepted) = accepted else { continue };
        pending = Box::pin(listener.accept());
        if let Some(pause) = serve(accepted) {
            glommio::timer::sleep(pause).await;
        }
    }
}
