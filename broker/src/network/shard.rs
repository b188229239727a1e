//! The network shard's state: its ends of the mesh (`ask` a storage shard, `tell` one), its read-only
//! topic table snapshot, its connections and what their clients declared, the heartbeat
//! shortcut (a repeat only refreshes liveness), the request counters a stop waits on, and the
//! pooled frame encoders. It names no handler: handlers use it.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_channel::oneshot;
use glommio::channels::local_channel::LocalSender;
use glommio::channels::shared_channel::ConnectedSender;
use shardmq_schema::{wire, FrameEncoder};

use super::parking::Parking;
use super::{budget, client_calls, request};
use crate::config::BrokerConfig;
use crate::groups::ConnectionKey;
use crate::mesh::{Reply, StorageRequest};
use crate::meta::storage_shard_of;
use crate::store::notify::LocalNotify;
use crate::topics::TopicTable;

/// Why a storage shard could not be asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AskError {
    /// Its request channel is full: answer SYSTEM_BUSY.
    Busy,
    /// It has stopped: answer SERVICE_NOT_AVAILABLE.
    Gone,
}

/// Frames pushed to a connection by the shard (not answers to its requests).
pub type Outbound = Vec<bytes::Bytes>;

pub struct NetworkShard {
    pub id: usize,
    pub config: Rc<BrokerConfig>,
    pub(super) storage: Vec<ConnectedSender<StorageRequest>>,
    pub(super) topics: RefCell<Arc<TopicTable>>,
    pub parking: Parking,
    /// Connection id → (client id, consumer groups seen in its heartbeats, push channel).
    pub(super) connections: RefCell<HashMap<u64, ConnectionEntry>>,
    pub(super) next_connection_id: Cell<u64>,
    pub(super) round_robin: Cell<u32>,
    /// The address clients reach (also the record's store host).
    pub store_host: Cell<SocketAddr>,
    /// Network shard 0 of a master: the address its slaves replicate from.
    pub ha_host: Cell<Option<SocketAddr>>,
    pub stopping: Arc<AtomicBool>,
    pub(super) storage_ready: Cell<usize>,
    /// Signalled on readiness and topic table changes.
    pub changed: LocalNotify,
    pub(super) encoders: RefCell<Vec<FrameEncoder>>,
    pub(super) inflight_requests: Cell<usize>,
    /// The requests in flight by body type (zero counts kept), for the drain's report when
    /// its bound passes.
    pub(super) inflight_by_kind: RefCell<std::collections::BTreeMap<&'static str, usize>>,
    pub idle: LocalNotify,
    /// Requests this shard sent to clients, waiting for their answers.
    pub client_calls: client_calls::ClientCalls,
    /// Bytes of request frames received and not yet handled, bounded.
    pub request_bytes: Rc<budget::ByteBudget>,
    /// Per connection: the digest of its last heartbeat applied on storage shard 0, and when.
    pub(super) heartbeats: RefCell<HashMap<u64, (u64, std::time::Instant)>>,
    /// Connections whose heartbeats repeated their last applied one since the last
    /// `ClientsAlive` (connection id → client id).
    pub(super) alive: RefCell<HashMap<u64, String>>,
    /// SQL92 filter expressions compiled for pulls, by source: a subscription's expression is
    /// compiled once, not per pull (bounded: emptied when full).
    pub(super) sql_filters: RefCell<HashMap<String, Arc<shardmq_filter::Expression>>>,
}

/// Most compiled SQL92 expressions a network shard keeps.
const MAX_SQL_FILTERS: usize = 4096;

/// A heartbeat identical to the last one applied for its connection (same client, groups and
/// subscriptions) only refreshes the client's liveness, in one `ClientsAlive` a second per
/// network shard, instead of a request to storage shard 0 each: 5,000 clients heartbeating
/// every second cost the first storage core 13 µs each otherwise (docs/performance.md). Every
/// `FULL_HEARTBEAT_EVERY` the heartbeat is applied in full anyway, so a client shard 0 no longer
/// knows (expired, unregistered) is registered again within that time.
pub const FULL_HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
const ALIVE_FLUSH_INTERVAL: Duration = Duration::from_secs(1);

pub struct ConnectionEntry {
    pub client_id: Option<String>,
    pub consumer_groups: Vec<String>,
    pub push: Rc<LocalSender<Outbound>>,
}

impl NetworkShard {
    /// The compiled form of SQL92 `expression` for a pull: refused unless the broker serves
    /// property filters (`enable_property_filter`), and when it does not compile (the error
    /// names the position).
    pub(super) fn sql_filter(
        &self,
        expression: &str,
    ) -> Result<Arc<shardmq_filter::Expression>, request::Refusal> {
        if !self.config.enable_property_filter {
            return Err(request::refuse(
                wire::Status::INVALID_TAG_EXPRESSION,
                "this broker does not filter by SQL92 expressions (enable_property_filter is off)",
            ));
        }
        if let Some(compiled) = self.sql_filters.borrow().get(expression) {
            return Ok(compiled.clone());
        }
        let compiled = shardmq_filter::Expression::compile(expression).map_err(|error| {
            request::refuse(
                wire::Status::INVALID_TAG_EXPRESSION,
                format!("SQL92 expression `{expression}`: {error}"),
            )
        })?;
        let compiled = Arc::new(compiled);
        let mut cache = self.sql_filters.borrow_mut();
        if cache.len() >= MAX_SQL_FILTERS {
            cache.clear();
        }
        cache.insert(expression.to_owned(), compiled.clone());
        Ok(compiled)
    }

    pub fn topics(&self) -> Arc<TopicTable> {
        self.topics.borrow().clone()
    }

    pub fn storage_shards(&self) -> usize {
        self.storage.len()
    }

    pub fn shard_of(&self, topic: &str, queue_id: u32) -> usize {
        storage_shard_of(topic, queue_id, self.storage.len())
    }

    /// Sends a request to storage shard `shard` and waits for its answer.
    pub async fn ask<T>(
        &self,
        shard: usize,
        make: impl FnOnce(Reply<T>) -> StorageRequest,
    ) -> Result<T, AskError> {
        let (reply, answer) = oneshot::channel();
        self.storage[shard]
            .try_send(make(reply))
            .map_err(|e| match e {
                glommio::GlommioError::Closed(_) => AskError::Gone,
                _ => AskError::Busy,
            })?;
        let waiting = &crate::metrics::broker().storage_requests_waiting;
        crate::metrics::BrokerMetrics::shard_gauge_add(waiting, shard, 1);
        let answer = answer.await.map_err(|_| AskError::Gone);
        crate::metrics::BrokerMetrics::shard_gauge_add(waiting, shard, -1);
        answer
    }

    /// Sends a request that has no answer (best effort).
    pub fn tell(&self, shard: usize, request: StorageRequest) {
        let _ = self.storage[shard].try_send(request);
    }

    pub fn next_queue(&self, write_queues: u32) -> u32 {
        let n = self.round_robin.get();
        self.round_robin.set(n.wrapping_add(1));
        n % write_queues.max(1)
    }

    /// Borrows a frame encoder from the shard's pool (one builder reused across requests).
    pub fn with_encoder<R>(&self, f: impl FnOnce(&mut FrameEncoder) -> R) -> R {
        let mut encoder = self
            .encoders
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| FrameEncoder::with_max_frame_bytes(self.config.max_frame_bytes));
        let result = f(&mut encoder);
        self.encoders.borrow_mut().push(encoder);
        result
    }

    pub fn register_connection(&self, push: Rc<LocalSender<Outbound>>) -> u64 {
        let id = self.next_connection_id.get();
        self.next_connection_id.set(id + 1);
        self.connections.borrow_mut().insert(
            id,
            ConnectionEntry {
                client_id: None,
                consumer_groups: Vec::new(),
                push,
            },
        );
        crate::metrics::broker().connections_changed(self.id, self.connection_count(), 1);
        id
    }

    /// Names a connection of this shard across the broker.
    pub fn connection_key(&self, connection_id: u64) -> ConnectionKey {
        ConnectionKey {
            network_shard: self.id,
            connection_id,
        }
    }

    /// The writer channel of this shard's connection `connection_id`, while it is open.
    pub fn connection_push(&self, connection_id: u64) -> Option<Rc<LocalSender<Outbound>>> {
        self.connections
            .borrow()
            .get(&connection_id)
            .map(|entry| entry.push.clone())
    }

    pub fn connection_count(&self) -> usize {
        self.connections.borrow().len()
    }

    pub fn set_client(&self, connection: u64, client_id: String) {
        if let Some(entry) = self.connections.borrow_mut().get_mut(&connection) {
            entry.client_id = Some(client_id);
        }
    }

    pub fn set_consumer_groups(&self, connection: u64, groups: Vec<String>) {
        if let Some(entry) = self.connections.borrow_mut().get_mut(&connection) {
            entry.consumer_groups = groups;
        }
    }

    /// Whether a heartbeat with `digest` on `connection` repeats the last one applied there
    /// recently enough to count only as a sign of life; if so it is queued for `ClientsAlive`.
    pub fn heartbeat_is_repeat(&self, connection: u64, digest: u64, client_id: &str) -> bool {
        let is_repeat = self
            .heartbeats
            .borrow()
            .get(&connection)
            .is_some_and(|(last, at)| *last == digest && at.elapsed() < FULL_HEARTBEAT_EVERY);
        if is_repeat {
            self.alive
                .borrow_mut()
                .insert(connection, client_id.to_owned());
        }
        is_repeat
    }

    /// Records the heartbeat just applied in full on `connection`.
    pub fn heartbeat_applied(&self, connection: u64, digest: u64) {
        self.heartbeats
            .borrow_mut()
            .insert(connection, (digest, std::time::Instant::now()));
    }

    /// The next heartbeat on `connection` is applied in full (its client changed its groups).
    pub fn forget_heartbeat(&self, connection: u64) {
        self.heartbeats.borrow_mut().remove(&connection);
        self.alive.borrow_mut().remove(&connection);
    }

    /// Sends the liveness of clients whose heartbeats repeated, once a second.
    pub(super) async fn flush_alive_loop(self: Rc<Self>) {
        while !self.stopping.load(Ordering::Relaxed) {
            glommio::timer::sleep(ALIVE_FLUSH_INTERVAL).await;
            let alive = std::mem::take(&mut *self.alive.borrow_mut());
            if !alive.is_empty() {
                let clients = alive
                    .into_iter()
                    .map(|(connection, client_id)| (client_id, self.connection_key(connection)))
                    .collect();
                self.tell(0, StorageRequest::ClientsAlive { clients });
            }
        }
    }

    /// Forgets a closed connection; its client leaves its groups.
    pub fn unregister_connection(&self, connection: u64) {
        self.forget_heartbeat(connection);
        let entry = self.connections.borrow_mut().remove(&connection);
        if entry.is_some() {
            crate::metrics::broker().connections_changed(self.id, self.connection_count(), -1);
        }
        if let Some(ConnectionEntry {
            client_id: Some(client_id),
            ..
        }) = entry
        {
            self.tell(
                0,
                StorageRequest::ClientGone {
                    client_id,
                    connection: self.connection_key(connection),
                },
            );
        }
    }

    pub fn request_started(&self, kind: &'static str) {
        self.inflight_requests.set(self.inflight_requests.get() + 1);
        *self.inflight_by_kind.borrow_mut().entry(kind).or_default() += 1;
    }

    pub fn request_finished(&self, kind: &'static str) {
        self.inflight_requests.set(self.inflight_requests.get() - 1);
        // Counts stay at zero rather than leave the map: a request costs no allocation.
        if let Some(count) = self.inflight_by_kind.borrow_mut().get_mut(kind) {
            *count -= 1;
        }
        if self.inflight_requests.get() == 0 {
            self.idle.notify_all();
        }
    }

    /// Tells every storage shard this network shard sends nothing more (they stop when all
    /// network shards have said so).
    pub(super) fn close_storage_channels(&self) {
        for sender in &self.storage {
            sender.close();
        }
    }

    /// Every storage shard has recovered. Storage shard 0 sends its topic table before its
    /// readiness event on the same channel, so the table is here by then.
    pub(super) fn is_ready(&self) -> bool {
        self.storage_ready.get() == self.storage.len()
    }
}
