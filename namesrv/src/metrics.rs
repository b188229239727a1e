//! The name server's Prometheus metrics and the `/metrics` endpoint (`--metrics-listen ADDR`).
//!
//! Counters are atomics updated where requests are answered; the broker and topic counts are
//! read from the route table when a scrape arrives. The endpoint is a minimal HTTP/1.1 server
//! on the namesrv's own runtime: one request per connection, at most 8 KiB, 5 s to send it.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

use crate::registry::RouteTable;

/// Largest scrape request read.
const MAX_REQUEST_BYTES: usize = 8 << 10;

/// Time a scraper has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `found` or `not_found`.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AccessDeniedLabels {
    /// The request's kind (`GetRouteRequest`, `REGISTER_BROKER`, `ControllerRaftRequest`, …).
    pub request: String,
    /// `no_credentials`, `unknown_account`, `address`, `not_admin`, `permission`,
    /// `signature` or `proof`.
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub status: String,
}

/// Every metric the name server exports.
pub struct NamesrvMetrics {
    registry: Registry,
    pub brokers: Gauge,
    pub topics: Gauge,
    pub routes_served: Family<OutcomeLabels, Counter>,
    pub registrations: Counter,
    pub brokers_expired: Counter,
    pub responses: Family<StatusLabels, Counter>,
    pub access_denied: Family<AccessDeniedLabels, Counter>,
}

impl NamesrvMetrics {
    fn new() -> Self {
        let mut metrics = NamesrvMetrics {
            registry: Registry::with_prefix("shardmq_namesrv"),
            brokers: Gauge::default(),
            topics: Gauge::default(),
            routes_served: Family::default(),
            registrations: Counter::default(),
            brokers_expired: Counter::default(),
            responses: Family::default(),
            access_denied: Family::default(),
        };
        let r = &mut metrics.registry;
        r.register(
            "brokers",
            "Broker instances registered and not expired",
            metrics.brokers.clone(),
        );
        r.register(
            "topics",
            "Topics hosted by the registered brokers",
            metrics.topics.clone(),
        );
        r.register(
            "routes_served",
            "Topic route requests answered, found or not",
            metrics.routes_served.clone(),
        );
        r.register(
            "registrations",
            "Broker registrations accepted",
            metrics.registrations.clone(),
        );
        r.register(
            "brokers_expired",
            "Brokers dropped for silence",
            metrics.brokers_expired.clone(),
        );
        r.register(
            "responses",
            "Answers sent, by status code",
            metrics.responses.clone(),
        );
        r.register(
            "access_denied",
            "Requests refused by access control (docs/acl.md), by request kind and reason",
            metrics.access_denied.clone(),
        );
        metrics
    }

    /// A route request was answered.
    pub fn route_served(&self, is_found: bool) {
        let outcome = if is_found { "found" } else { "not_found" };
        self.routes_served
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// An answer with `status` was sent.
    pub fn answered(&self, status: shardmq_schema::wire::Status) {
        self.responses
            .get_or_create(&StatusLabels {
                status: status.variant_name().unwrap_or("UNKNOWN").to_owned(),
            })
            .inc();
    }

    /// Access control refused a request of `kind` for `reason`.
    pub fn access_denied(&self, kind: &str, reason: &str) {
        self.access_denied
            .get_or_create(&AccessDeniedLabels {
                request: kind.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// The text exposition, with the table's current counts.
    pub fn render(&self, table: &RouteTable) -> String {
        self.brokers.set(table.broker_instances() as i64);
        self.topics.set(table.topic_names(None).len() as i64);
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

/// The process's metrics.
pub fn namesrv() -> &'static NamesrvMetrics {
    static METRICS: OnceLock<NamesrvMetrics> = OnceLock::new();
    METRICS.get_or_init(NamesrvMetrics::new)
}

/// Serves `/metrics` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, registry: Arc<Mutex<RouteTable>>) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "metrics served at http://{addr}/metrics");
    }
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let registry = Arc::clone(&registry);
                tokio::spawn(async move {
                    if let Err(e) = answer(stream, &registry).await {
                        debug!(%peer, error = %e, "metrics scrape failed");
                    }
                });
            }
            Err(e) => {
                warn!(error = %e, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn answer(mut stream: TcpStream, registry: &Mutex<RouteTable>) -> std::io::Result<()> {
    let mut request = Vec::with_capacity(1024);
    let read = tokio::time::timeout(REQUEST_TIMEOUT, async {
        let mut chunk = [0u8; 1024];
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
    })
    .await;
    let (status, body) = match read {
        Ok(Ok(true)) => {
            let line =
                String::from_utf8_lossy(request.split(|&b| b == b'\r').next().unwrap_or(&[]))
                    .into_owned();
            let mut parts = line.split(' ');
            match (parts.next(), parts.next()) {
                (Some("GET"), Some(path))
                    if path == "/metrics" || path.starts_with("/metrics?") =>
                {
                    let table = registry.lock().unwrap_or_else(PoisonError::into_inner);
                    ("200 OK", namesrv().render(&table))
                }
                (Some("GET"), _) => ("404 Not Found", "metrics are at /metrics\n".to_owned()),
                _ => ("405 Method Not Allowed", "only GET\n".to_owned()),
            }
        }
        _ => ("400 Bad Request", "bad request\n".to_owned()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
