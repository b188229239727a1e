//! The `/metrics` endpoint (`--metrics-listen ADDR`): serves the registry of `crate::metrics` in
//! the Prometheus text format, after refreshing the on-demand gauges (consumer lag, CommitLog
//! size, replication, disk space) by asking the storage shards over the mesh like any other
//! request. It runs as a task on network shard 0: one scrape at a time, a request of at most
//! 8 KiB, a 5 s read deadline, so a slow or hostile scraper cannot starve the shard.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

use crate::metrics::{broker, LagLabels, ShardLabels};
use crate::network::admin::storage_snapshots;
use crate::network::NetworkShard;
use crate::store::message_store::disk_space;

/// Largest scrape request read; anything longer is answered 431 and closed.
const MAX_REQUEST_BYTES: usize = 8 << 10;

/// Time a scraper has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `/metrics` on `addr` from network shard `shard` until the broker stops.
pub async fn serve(shard: Rc<NetworkShard>, addr: SocketAddr) {
    let listener = match TcpListener::bind(addr) {
        Ok(listener) => listener,
        Err(e) => {
            warn!(%addr, error = %e, "cannot serve metrics");
            return;
        }
    };
    let actual = listener.local_addr().unwrap_or(addr);
    info!(addr = %actual, "metrics served at http://{actual}/metrics");
    let stopping = shard.stopping.clone();
    crate::network::accept::accept_until_stopped(
        &listener,
        &stopping,
        Duration::from_millis(200),
        |accepted| match accepted {
            Ok(stream) => {
                let shard = shard.clone();
                glommio::spawn_local(async move {
                    if let Err(e) = answer_scrape(&shard, stream).await {
                        debug!(error = %e, "metrics scrape failed");
                    }
                })
                .detach();
                None
            }
            Err(e) => {
                warn!(error = %e, "metrics accept failed");
                Some(Duration::from_millis(50))
            }
        },
    )
    .await;
}

async fn answer_scrape(shard: &NetworkShard, mut stream: TcpStream) -> std::io::Result<()> {
    let mut request = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let is_complete = futures_lite::future::or(
        async {
            loop {
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    return Ok::<bool, std::io::Error>(false);
                }
                request.extend_from_slice(&chunk[..n]);
                if request.windows(4).any(|w| w == b"\r\n\r\n") {
                    return Ok(true);
                }
                if request.len() > MAX_REQUEST_BYTES {
                    return Ok(false);
                }
            }
        },
        async {
            glommio::timer::sleep(REQUEST_TIMEOUT).await;
            Ok(false)
        },
    )
    .await?;
    if !is_complete {
        return respond(
            &mut stream,
            "400 Bad Request",
            "text/plain",
            "bad request\n",
        )
        .await;
    }
    let line = request
        .split(|&b| b == b'\r')
        .next()
        .map(String::from_utf8_lossy)
        .unwrap_or_default();
    let mut parts = line.split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        return respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n",
        )
        .await;
    }
    if path != "/metrics" && !path.starts_with("/metrics?") {
        return respond(
            &mut stream,
            "404 Not Found",
            "text/plain",
            "metrics are at /metrics\n",
        )
        .await;
    }
    gather(shard).await;
    let metrics = broker();
    metrics.scrapes.inc();
    let body = metrics.render();
    respond(
        &mut stream,
        "200 OK",
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
        &body,
    )
    .await
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let mut head = String::new();
    let _ = write!(
        head,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.close().await
}

/// Refreshes the on-demand gauges: consumer lag and CommitLog size from every storage shard,
/// disk space from the file system.
async fn gather(shard: &NetworkShard) {
    let metrics = broker();
    metrics.consumer_lag.clear();
    for (storage, snapshot) in storage_snapshots(shard).await.into_iter().enumerate() {
        for (group, topic, lag) in snapshot.consumer_lag {
            metrics
                .consumer_lag
                .get_or_create(&LagLabels { group, topic })
                .inc_by(lag);
        }
        metrics
            .commitlog_bytes
            .get_or_create(&ShardLabels {
                shard: storage.to_string(),
            })
            .set(snapshot.commitlog_bytes);
        let labels = ShardLabels {
            shard: storage.to_string(),
        };
        let replication = &snapshot.replication;
        let known = |value: Option<u64>| value.map_or(-1, |v| v as i64);
        metrics
            .replication_lag_bytes
            .get_or_create(&labels)
            .set(known(replication.lag_bytes));
        metrics
            .replication_lag_ms
            .get_or_create(&labels)
            .set(known(replication.lag_ms));
        metrics
            .replication_connected
            .get_or_create(&labels)
            .set(i64::from(replication.connected));
        metrics
            .replication_epoch
            .get_or_create(&labels)
            .set(replication.epoch);
    }
    if let Ok((total, free)) = disk_space(&shard.config.data_dir) {
        metrics.disk_total_bytes.set(total);
        metrics.disk_free_bytes.set(free);
    }
}
