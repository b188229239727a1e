//! A network shard: one listener (SO_REUSEPORT, shared by all network shards) and the
//! connections it accepts, decoding requests, validating them, routing each to the storage
//! shard that owns its queue, parking long-poll pulls, and writing answers.
//!
//! It knows nothing of file layout: everything stored is reached through `StorageRequest`s.
//! It keeps a read-only snapshot of the topic table (sent by storage shard 0) to validate
//! requests without a round trip. Module map: `connection` (framing, pipelining, writing),
//! `handlers` (one function per request kind), `parking` (long-poll waiters).

pub mod accept;
pub mod admin;
pub mod budget;
pub mod client_calls;
pub mod connection;
pub mod handlers;
pub mod parking;
pub mod queue_locks;
pub mod send_back;
pub mod transaction;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_channel::oneshot;
use futures_lite::future;
use glommio::channels::local_channel::LocalSender;
use glommio::channels::shared_channel::{ConnectedSender, SharedReceiver, SharedSender};
use glommio::net::TcpListener;
use shardmq_schema::FrameEncoder;
use tracing::{info, warn};

use crate::config::BrokerConfig;
use crate::groups::ConnectionKey;
use crate::mesh::{NetworkEvent, Reply, StorageRequest};
use crate::meta::storage_shard_of;
use crate::store::notify::LocalNotify;
use crate::topics::TopicTable;
use parking::Parking;

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
    storage: Vec<ConnectedSender<StorageRequest>>,
    topics: RefCell<Arc<TopicTable>>,
    pub parking: Parking,
    /// Connection id → (client id, consumer groups seen in its heartbeats, push channel).
    connections: RefCell<HashMap<u64, ConnectionEntry>>,
    next_connection_id: Cell<u64>,
    round_robin: Cell<u32>,
    /// The address clients reach (also the record's store host).
    pub store_host: Cell<SocketAddr>,
    /// Network shard 0 of a master: the address its slaves replicate from.
    pub ha_host: Cell<Option<SocketAddr>>,
    pub stopping: Arc<AtomicBool>,
    storage_ready: Cell<usize>,
    /// Signalled on readiness and topic table changes.
    pub changed: LocalNotify,
    encoders: RefCell<Vec<FrameEncoder>>,
    inflight_requests: Cell<usize>,
    pub idle: LocalNotify,
    /// Requests this shard sent to clients, waiting for their answers.
    pub client_calls: client_calls::ClientCalls,
    /// Bytes of request frames received and not yet handled, bounded.
    pub request_bytes: Rc<budget::ByteBudget>,
    /// Per connection: the digest of its last heartbeat applied on storage shard 0, and when.
    heartbeats: RefCell<HashMap<u64, (u64, std::time::Instant)>>,
    /// Connections whose heartbeats repeated their last applied one since the last
    /// `ClientsAlive` (connection id → client id).
    alive: RefCell<HashMap<u64, String>>,
}

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
    async fn flush_alive_loop(self: Rc<Self>) {
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

    pub fn request_started(&self) {
        self.inflight_requests.set(self.inflight_requests.get() + 1);
    }

    pub fn request_finished(&self) {
        self.inflight_requests.set(self.inflight_requests.get() - 1);
        if self.inflight_requests.get() == 0 {
            self.idle.notify_all();
        }
    }

    fn on_event(&self, event: NetworkEvent) {
        match event {
            NetworkEvent::StorageReady { shard } => {
                info!(
                    network_shard = self.id,
                    storage_shard = shard,
                    "storage shard ready"
                );
                self.storage_ready.set(self.storage_ready.get() + 1);
                self.changed.notify_all();
            }
            NetworkEvent::Topics(table) => {
                *self.topics.borrow_mut() = table;
                self.changed.notify_all();
            }
            NetworkEvent::Arrival { topic, queue_id } => self.parking.wake(&topic, queue_id),
            NetworkEvent::ConsumerIdsChanged { group } => self.push_consumer_ids_changed(&group),
            NetworkEvent::TransactionCheck(_) => {
                debug_assert!(false, "transaction checks are served by the event loop");
            }
        }
    }

    fn push_consumer_ids_changed(&self, group: &str) {
        let frame =
            self.with_encoder(|encoder| handlers::encode_consumer_ids_changed(encoder, group));
        let Ok(frame) = frame else { return };
        for entry in self.connections.borrow().values() {
            if entry.consumer_groups.iter().any(|g| g == group) {
                // A full push channel means the client is not reading: it will rebalance on its
                // own timer.
                let _ = entry.push.try_send(vec![frame.clone()]);
            }
        }
    }

    /// Tells every storage shard this network shard sends nothing more (they stop when all
    /// network shards have said so).
    fn close_storage_channels(&self) {
        for sender in &self.storage {
            sender.close();
        }
    }

    /// Every storage shard has recovered. Storage shard 0 sends its topic table before its
    /// readiness event on the same channel, so the table is here by then.
    fn is_ready(&self) -> bool {
        self.storage_ready.get() == self.storage.len()
    }
}

/// Where a network shard listens: shard 0 binds the configured address and publishes the
/// actual one (port 0 picks a free port); the others bind that same address.
pub struct ListenPlan {
    pub configured: SocketAddr,
    pub actual: Arc<OnceLock<SocketAddr>>,
}

/// Starts network shard `id`: connects its ends of the mesh, waits until every storage shard
/// has recovered, binds its listener (and, on shard 0 of a master, the HA listener) and calls
/// `on_listening`. `None`: the broker stopped before the shard could serve. The runtime then
/// starts the control plane beside it (shard 0), and drives [`Serving`] to the end.
pub async fn start(
    id: usize,
    config: Rc<BrokerConfig>,
    requests: Vec<SharedSender<StorageRequest>>,
    events: Vec<SharedReceiver<NetworkEvent>>,
    listen: ListenPlan,
    stopping: Arc<AtomicBool>,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<Option<Serving>, String> {
    // Connect every channel end at once: a peer may connect its ends in any order.
    let request_tasks: Vec<_> = requests
        .into_iter()
        .map(|s| glommio::spawn_local(s.connect()))
        .collect();
    let event_tasks: Vec<_> = events
        .into_iter()
        .map(|r| glommio::spawn_local(r.connect()))
        .collect();
    let mut storage = Vec::with_capacity(request_tasks.len());
    for task in request_tasks {
        storage.push(task.await);
    }
    let mut event_receivers = Vec::with_capacity(event_tasks.len());
    for task in event_tasks {
        event_receivers.push(task.await);
    }
    let shard = Rc::new(NetworkShard {
        id,
        config: config.clone(),
        storage,
        topics: RefCell::new(Arc::new(TopicTable::default())),
        parking: Parking::default(),
        connections: RefCell::new(HashMap::new()),
        next_connection_id: Cell::new(0),
        round_robin: Cell::new(id as u32),
        store_host: Cell::new(listen.configured),
        ha_host: Cell::new(None),
        stopping: stopping.clone(),
        storage_ready: Cell::new(0),
        changed: LocalNotify::default(),
        encoders: RefCell::new(Vec::new()),
        inflight_requests: Cell::new(0),
        idle: LocalNotify::default(),
        client_calls: client_calls::ClientCalls::default(),
        request_bytes: Rc::new(budget::ByteBudget::new(
            id,
            config.max_request_bytes_per_shard,
        )),
        heartbeats: RefCell::new(HashMap::new()),
        alive: RefCell::new(HashMap::new()),
    });
    shard.parking.network_shard.set(id);
    // Every gauge of this shard is exported from the start, at zero.
    let metrics = crate::metrics::broker();
    metrics.parked_changed(id, 0);
    crate::metrics::BrokerMetrics::shard_gauge(&metrics.request_bytes_held, id, 0);
    metrics.connections_changed(id, 0, 0);
    for storage in 0..shard.storage_shards() {
        crate::metrics::BrokerMetrics::shard_gauge_add(
            &metrics.storage_requests_waiting,
            storage,
            0,
        );
    }
    let mut event_tasks = Vec::new();
    for receiver in event_receivers {
        let shard = shard.clone();
        event_tasks.push(
            glommio::spawn_local(async move {
                while let Some(event) = receiver.recv().await {
                    match event {
                        // Needs a task of its own (it waits for the client's answer).
                        NetworkEvent::TransactionCheck(check) => {
                            transaction::spawn_check_back(&shard, check)
                        }
                        event => shard.on_event(event),
                    }
                }
            })
            .detach(),
        );
    }
    // Serve nothing until every storage shard has recovered.
    while !shard.is_ready() {
        if stopping.load(Ordering::Relaxed) {
            shard.close_storage_channels();
            return Ok(None);
        }
        future::or(
            shard.changed.notified(),
            glommio::timer::sleep(Duration::from_millis(50)),
        )
        .await;
    }

    let bind_addr = if id == 0 {
        listen.configured
    } else {
        loop {
            if let Some(addr) = listen.actual.get() {
                break *addr;
            }
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
    };
    let listener = match TcpListener::bind(bind_addr) {
        Ok(listener) => listener,
        Err(e) => {
            shard.close_storage_channels();
            return Err(format!("cannot listen on {bind_addr}: {e}"));
        }
    };
    let actual = listener.local_addr().map_err(|e| e.to_string())?;
    if id == 0 {
        let _ = listen.actual.set(actual);
    }
    shard.store_host.set(actual);
    if id == 0 {
        crate::role::set_own_address(actual);
    }
    on_listening(actual);

    let alive_task = glommio::spawn_local(shard.clone().flush_alive_loop()).detach();
    // A master serves its slaves on the HA address with the same protocol; a slave copies its
    // master's topic table (replication.rs).
    let ha_task = match config.ha_listen_addr()? {
        Some(addr) if id == 0 => {
            let listener = TcpListener::bind(addr).map_err(|e| {
                shard.close_storage_channels();
                format!("cannot listen for slaves on {addr}: {e}")
            })?;
            let actual_ha = listener.local_addr().unwrap_or(addr);
            shard.ha_host.set(Some(actual_ha));
            info!(addr = %actual_ha, "serving slaves (HA)");
            let shard = shard.clone();
            Some(glommio::spawn_local(async move { accept_loop(&shard, &listener).await }).detach())
        }
        _ => None,
    };
    Ok(Some(Serving {
        shard,
        listener: Some(listener),
        event_tasks,
        alive_task,
        ha_task,
    }))
}

/// A network shard that serves: the runtime accepts connections until the broker stops,
/// drains, stops what runs beside the shard, then finishes it.
pub struct Serving {
    shard: Rc<NetworkShard>,
    listener: Option<TcpListener>,
    event_tasks: Vec<glommio::task::JoinHandle<()>>,
    alive_task: glommio::task::JoinHandle<()>,
    ha_task: Option<glommio::task::JoinHandle<()>>,
}

impl Serving {
    pub fn shard(&self) -> &Rc<NetworkShard> {
        &self.shard
    }

    /// Accepts connections until the broker stops.
    pub async fn accept_until_stopped(&self) {
        if let Some(listener) = &self.listener {
            accept_loop(&self.shard, listener).await;
        }
    }

    /// Stopping: no new connections; lets in-flight requests finish (bounded).
    pub async fn drain(&mut self) {
        drop(self.listener.take());
        let shard = &self.shard;
        // Parked pulls answer now rather than holding the stop for their whole suspend time.
        shard.parking.wake_all();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while shard.inflight_requests.get() > 0 && std::time::Instant::now() < deadline {
            future::or(
                shard.idle.notified(),
                glommio::timer::sleep(Duration::from_millis(20)),
            )
            .await;
        }
    }

    /// Stops the shard's own tasks and tells the storage shards it sends nothing more.
    pub async fn finish(self) {
        self.alive_task.cancel();
        if let Some(task) = self.ha_task {
            task.await;
        }
        self.shard.close_storage_channels();
        for task in self.event_tasks {
            task.cancel();
        }
        info!(network_shard = self.shard.id, "network shard stopped");
    }
}

async fn accept_loop(shard: &Rc<NetworkShard>, listener: &TcpListener) {
    let stopping = shard.stopping.clone();
    crate::network::accept::accept_until_stopped(
        listener,
        &stopping,
        Duration::from_millis(100),
        |accepted| match accepted {
            Ok(stream) => {
                if shard.connection_count() >= shard.config.max_connections {
                    warn!(
                        limit = shard.config.max_connections,
                        "refusing a connection: max_connections reached"
                    );
                    drop(stream);
                    return None;
                }
                let shard = shard.clone();
                glommio::spawn_local(async move { connection::serve(shard, stream).await })
                    .detach();
                None
            }
            Err(e) => {
                warn!(error = %e, "accept failed");
                Some(Duration::from_millis(10))
            }
        },
    )
    .await;
}
