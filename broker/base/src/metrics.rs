//! The broker's Prometheus metrics registry: what is counted, and its rendering in the
//! Prometheus text format. The `/metrics` endpoint that serves it is `control::metrics_http`.
//!
//! Counters and histograms are updated where things happen (network shards for requests,
//! storage shards for flushes) through one process-wide [`BrokerMetrics`]; its metrics are
//! atomics, so an update costs a few uncontended atomic adds and no message passing. Values that
//! are cheap to compute only on demand (consumer lag, disk usage) are set by the endpoint when a
//! scrape arrives. Every metric is described in `docs/operations.md`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabels {
    pub topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AccessDeniedLabels {
    /// The request kind refused (a native body type or a remoting request code's name).
    pub request: String,
    /// Why: `no_credentials`, `unknown_account`, `address`, `not_admin`, `permission`,
    /// `signature` or `proof`.
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabels {
    pub shard: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LagLabels {
    pub group: String,
    pub topic: String,
}

type GaugeU64 = Gauge<u64, AtomicU64>;

/// Latency buckets: the first upper bound and how many there are (each doubles the last).
const LATENCY_FIRST_BOUND_US: u64 = 50;
const LATENCY_BUCKETS: u16 = 18;

fn latency_histogram() -> Histogram {
    // 50 µs .. ~6.5 s, doubling.
    Histogram::new(exponential_buckets(
        LATENCY_FIRST_BOUND_US as f64 / 1e6,
        2.0,
        LATENCY_BUCKETS,
    ))
}

/// A latency histogram's buckets kept readable (the Prometheus histogram's are not), with the
/// same bounds as [`latency_histogram`], for `BrokerStatusRequest`.
pub struct LatencyBuckets {
    /// Upper bounds in µs, ascending.
    bounds_us: Vec<u64>,
    /// Per bucket, one more than the bounds (the last: slower than every bound).
    counts: Vec<AtomicU64>,
}

impl Default for LatencyBuckets {
    fn default() -> LatencyBuckets {
        let bounds_us: Vec<u64> = (0..LATENCY_BUCKETS)
            .map(|i| LATENCY_FIRST_BOUND_US << i)
            .collect();
        let counts = (0..=bounds_us.len()).map(|_| AtomicU64::new(0)).collect();
        LatencyBuckets { bounds_us, counts }
    }
}

impl LatencyBuckets {
    pub fn observe(&self, seconds: f64) {
        let micros = seconds * 1e6;
        let bucket = self
            .bounds_us
            .iter()
            .position(|&bound| micros <= bound as f64)
            .unwrap_or(self.bounds_us.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// (upper bounds in µs, count per bucket with the overflow bucket last).
    pub fn snapshot(&self) -> (Vec<u64>, Vec<u64>) {
        let counts = self
            .counts
            .iter()
            .map(|count| count.load(Ordering::Relaxed))
            .collect();
        (self.bounds_us.clone(), counts)
    }
}

/// Every metric the broker exports.
pub struct BrokerMetrics {
    registry: Registry,
    pub messages_in: Family<TopicLabels, Counter>,
    pub bytes_in: Family<TopicLabels, Counter>,
    pub messages_out: Family<TopicLabels, Counter>,
    pub bytes_out: Family<TopicLabels, Counter>,
    pub send_latency: Histogram,
    /// `send_latency`'s buckets again, readable.
    pub send_latency_buckets: LatencyBuckets,
    pub flush_latency: Histogram,
    pub sync_flush_timeouts: Counter,
    pub responses: Family<StatusLabels, Counter>,
    pub access_denied: Family<AccessDeniedLabels, Counter>,
    pub connections: Family<ShardLabels, Gauge>,
    pub parked_pulls: Family<ShardLabels, Gauge>,
    pub request_bytes_held: Family<ShardLabels, Gauge>,
    pub heartbeats_applied: Counter,
    pub heartbeats_refreshed: Counter,
    pub storage_requests_waiting: Family<ShardLabels, Gauge>,
    pub consumer_lag: Family<LagLabels, GaugeU64>,
    pub commitlog_bytes: Family<ShardLabels, GaugeU64>,
    pub replication_lag_bytes: Family<ShardLabels, Gauge>,
    pub replication_lag_ms: Family<ShardLabels, Gauge>,
    pub replication_connected: Family<ShardLabels, Gauge>,
    pub replication_epoch: Family<ShardLabels, GaugeU64>,
    pub disk_total_bytes: GaugeU64,
    pub disk_free_bytes: GaugeU64,
    pub scrapes: Counter,
    /// Sums over every label, for `BrokerStatusRequest` (the families cannot be iterated).
    pub totals: Totals,
    /// Which shards run on which core, set once at start.
    pub placement: OnceLock<String>,
    started: Instant,
}

/// Whole-broker sums of the labelled metrics.
#[derive(Default)]
pub struct Totals {
    pub messages_in: AtomicU64,
    pub bytes_in: AtomicU64,
    pub messages_out: AtomicU64,
    pub bytes_out: AtomicU64,
    pub connections: AtomicI64,
    pub parked_pulls: AtomicI64,
}

impl BrokerMetrics {
    fn new() -> BrokerMetrics {
        let metrics = BrokerMetrics {
            registry: Registry::with_prefix("shardmq"),
            messages_in: Family::default(),
            bytes_in: Family::default(),
            messages_out: Family::default(),
            bytes_out: Family::default(),
            send_latency: latency_histogram(),
            send_latency_buckets: LatencyBuckets::default(),
            flush_latency: latency_histogram(),
            sync_flush_timeouts: Counter::default(),
            responses: Family::default(),
            access_denied: Family::default(),
            connections: Family::default(),
            parked_pulls: Family::default(),
            request_bytes_held: Family::default(),
            heartbeats_applied: Counter::default(),
            heartbeats_refreshed: Counter::default(),
            storage_requests_waiting: Family::default(),
            consumer_lag: Family::default(),
            commitlog_bytes: Family::default(),
            replication_lag_bytes: Family::default(),
            replication_lag_ms: Family::default(),
            replication_connected: Family::default(),
            replication_epoch: Family::default(),
            disk_total_bytes: GaugeU64::default(),
            disk_free_bytes: GaugeU64::default(),
            scrapes: Counter::default(),
            totals: Totals::default(),
            placement: OnceLock::new(),
            started: Instant::now(),
        };
        metrics.register()
    }

    fn register(mut self) -> BrokerMetrics {
        let r = &mut self.registry;
        r.register(
            "messages_in",
            "Messages stored by sends, per topic",
            self.messages_in.clone(),
        );
        r.register(
            "bytes_in",
            "Message body bytes stored by sends, per topic",
            self.bytes_in.clone(),
        );
        r.register(
            "messages_out",
            "Messages returned by pulls, per topic",
            self.messages_out.clone(),
        );
        r.register(
            "bytes_out",
            "Record bytes returned by pulls, per topic",
            self.bytes_out.clone(),
        );
        r.register(
            "send_latency_seconds",
            "Time from a send request's arrival to its answer (includes the flush wait under sync flush)",
            self.send_latency.clone(),
        );
        r.register(
            "flush_latency_seconds",
            "Time of one CommitLog O_DIRECT write or fdatasync (each is observed on its own)",
            self.flush_latency.clone(),
        );
        r.register(
            "sync_flush_timeouts",
            "Sends answered FLUSH_DISK_TIMEOUT",
            self.sync_flush_timeouts.clone(),
        );
        r.register(
            "responses",
            "Answers sent, by status code (errors are every status but OK)",
            self.responses.clone(),
        );
        r.register(
            "access_denied",
            "Requests refused by access control (docs/acl.md), by request kind and reason",
            self.access_denied.clone(),
        );
        r.register(
            "connections",
            "Open client connections, per network shard",
            self.connections.clone(),
        );
        r.register(
            "parked_pulls",
            "Pulls waiting for messages (long polling), per network shard",
            self.parked_pulls.clone(),
        );
        r.register(
            "heartbeats_applied",
            "Client heartbeats applied in full on storage shard 0 (new or changed groups, or the periodic full one)",
            self.heartbeats_applied.clone(),
        );
        r.register(
            "heartbeats_refreshed",
            "Client heartbeats that repeated the last one and only refreshed liveness (batched once a second)",
            self.heartbeats_refreshed.clone(),
        );
        r.register(
            "request_bytes_held",
            "Bytes of received request frames charged to the shard's budget (max_request_bytes_per_shard), per network shard",
            self.request_bytes_held.clone(),
        );
        r.register(
            "storage_requests_waiting",
            "Requests sent to a storage shard and not yet answered, per storage shard",
            self.storage_requests_waiting.clone(),
        );
        r.register(
            "consumer_lag_messages",
            "Messages stored and not yet committed by a consumer group, per group and topic",
            self.consumer_lag.clone(),
        );
        r.register(
            "commitlog_bytes",
            "Bytes of CommitLog segments on disk, per storage shard",
            self.commitlog_bytes.clone(),
        );
        r.register(
            "replication_lag_bytes",
            "Master: CommitLog bytes its slave has not acknowledged; slave: bytes its master holds that it has not copied; -1 unknown; per storage shard",
            self.replication_lag_bytes.clone(),
        );
        r.register(
            "replication_lag_ms",
            "Age in ms of the oldest CommitLog byte the peer lacks (0 in sync); -1 unknown; per storage shard",
            self.replication_lag_ms.clone(),
        );
        r.register(
            "replication_connected",
            "1 when the replication peer was heard from in the last 3 s, per storage shard",
            self.replication_connected.clone(),
        );
        r.register(
            "replication_epoch",
            "The master term the storage shard writes (master) or copies (slave)",
            self.replication_epoch.clone(),
        );
        r.register(
            "disk_total_bytes",
            "Size of the file system holding the data directory",
            self.disk_total_bytes.clone(),
        );
        r.register(
            "disk_free_bytes",
            "Bytes available to the broker on the file system holding the data directory",
            self.disk_free_bytes.clone(),
        );
        r.register(
            "scrapes",
            "Scrapes of this endpoint served",
            self.scrapes.clone(),
        );
        self
    }

    /// A send of `messages` messages of `body_bytes` bytes to `topic` was stored.
    pub fn stored(&self, topic: &str, messages: usize, body_bytes: usize) {
        let labels = TopicLabels {
            topic: topic.to_owned(),
        };
        self.messages_in
            .get_or_create(&labels)
            .inc_by(messages as u64);
        self.bytes_in
            .get_or_create(&labels)
            .inc_by(body_bytes as u64);
        let totals = &self.totals;
        totals
            .messages_in
            .fetch_add(messages as u64, Ordering::Relaxed);
        totals
            .bytes_in
            .fetch_add(body_bytes as u64, Ordering::Relaxed);
    }

    /// Time since the broker started.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// A network shard's connection count changed by `delta` to `count`.
    pub fn connections_changed(&self, shard: usize, count: usize, delta: i64) {
        Self::shard_gauge(&self.connections, shard, count as i64);
        self.totals.connections.fetch_add(delta, Ordering::Relaxed);
    }

    /// A pull was parked (`delta` 1) or unparked (-1) on network shard `shard`.
    pub fn parked_changed(&self, shard: usize, delta: i64) {
        Self::shard_gauge_add(&self.parked_pulls, shard, delta);
        self.totals.parked_pulls.fetch_add(delta, Ordering::Relaxed);
    }

    /// A pull returned `messages` records of `bytes` bytes from `topic`.
    pub fn pulled(&self, topic: &str, messages: usize, bytes: usize) {
        if messages == 0 {
            return;
        }
        let labels = TopicLabels {
            topic: topic.to_owned(),
        };
        self.messages_out
            .get_or_create(&labels)
            .inc_by(messages as u64);
        self.bytes_out.get_or_create(&labels).inc_by(bytes as u64);
        self.totals
            .messages_out
            .fetch_add(messages as u64, Ordering::Relaxed);
        self.totals
            .bytes_out
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// An answer with `status` was sent.
    pub fn answered(&self, status: shardmq_schema::wire::Status) {
        let name = status.variant_name().unwrap_or("UNKNOWN");
        self.responses
            .get_or_create(&StatusLabels {
                status: name.to_owned(),
            })
            .inc();
    }

    /// Access control refused a request of kind `request` for `reason`.
    pub fn access_denied(&self, request: &str, reason: &str) {
        self.access_denied
            .get_or_create(&AccessDeniedLabels {
                request: request.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub fn shard_gauge(family: &Family<ShardLabels, Gauge>, shard: usize, value: i64) {
        family
            .get_or_create(&ShardLabels {
                shard: shard.to_string(),
            })
            .set(value);
    }

    pub fn shard_gauge_add(family: &Family<ShardLabels, Gauge>, shard: usize, delta: i64) {
        family
            .get_or_create(&ShardLabels {
                shard: shard.to_string(),
            })
            .inc_by(delta);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

/// The process's metrics.
pub fn broker() -> &'static BrokerMetrics {
    static METRICS: OnceLock<BrokerMetrics> = OnceLock::new();
    METRICS.get_or_init(BrokerMetrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendering_names_each_family_with_its_labels() {
        let metrics = BrokerMetrics::new();
        metrics.stored("Orders", 3, 300);
        metrics.pulled("Orders", 2, 250);
        metrics.answered(shardmq_schema::wire::Status::TOPIC_NOT_FOUND);
        metrics.send_latency.observe(0.001);
        let text = metrics.render();
        for expected in [
            "shardmq_messages_in_total{topic=\"Orders\"} 3",
            "shardmq_bytes_in_total{topic=\"Orders\"} 300",
            "shardmq_messages_out_total{topic=\"Orders\"} 2",
            "shardmq_bytes_out_total{topic=\"Orders\"} 250",
            "shardmq_responses_total{status=\"TOPIC_NOT_FOUND\"} 1",
            "shardmq_send_latency_seconds_count 1",
        ] {
            assert!(text.contains(expected), "{expected} missing from:\n{text}");
        }
    }
}
