//! A network shard: one listener (SO_REUSEPORT, shared by all network shards) and the
//! connections it accepts, decoding requests, validating them, routing each to the storage
//! shard that owns its queue, parking long-poll pulls, and writing answers.
//!
//! It knows nothing of file layout: everything stored is reached through `StorageRequest`s.
//! It keeps a read-only snapshot of the topic table (sent by storage shard 0) to validate
//! requests without a round trip. It never names the storage shard's modules nor the control
//! plane: storage is reached through the mesh, and the runtime starts the control plane beside
//! network shard 0.
//!
//! Module map:
//! - the shard: `shard` (state, mesh ends, connections), `events` (what storage shards tell
//!   it), `accept` and this file (start, serve, drain, finish), `connection` (framing,
//!   pipelining, vectored writes), `tls` (TLS and plain told apart, the TLS pump), `budget`
//!   (bytes of requests held), `parking` (long-poll waiters), `client_calls` (requests the
//!   broker sends to clients);
//! - the requests: `dispatch` (the table), `request` (the handler kit), and one file per
//!   family: `produce`, `consume`, `query`, `clients`, `topics`, `replica`, `admin`,
//!   `transaction`, `queue_locks`, `send_back`.

pub mod accept;
pub mod access;
pub mod admin;
pub mod budget;
pub mod client_calls;
pub mod clients;
pub mod connection;
pub mod consume;
pub mod dispatch;
pub mod events;
pub mod parking;
pub mod produce;
pub mod query;
pub mod queue_locks;
pub mod remoting;
pub mod replica;
pub mod request;
pub mod send_back;
pub mod shard;
pub mod tls;
pub mod topics;
pub mod transaction;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_lite::future;
use glommio::channels::shared_channel::{SharedReceiver, SharedSender};
use glommio::net::TcpListener;
use tracing::{info, warn};

use crate::config::BrokerConfig;
use crate::mesh::{NetworkEvent, StorageRequest};
use crate::store::notify::LocalNotify;
use crate::topics::TopicTable;
use parking::Parking;
pub use shard::{AskError, ConnectionEntry, NetworkShard, Outbound, FULL_HEARTBEAT_EVERY};

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
        inflight_by_kind: RefCell::default(),
        idle: LocalNotify::default(),
        client_calls: client_calls::ClientCalls::default(),
        request_bytes: Rc::new(budget::ByteBudget::new(
            id,
            config.max_request_bytes_per_shard,
        )),
        heartbeats: RefCell::new(HashMap::new()),
        alive: RefCell::new(HashMap::new()),
        sql_filters: RefCell::new(HashMap::new()),
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
    // master's topic table (control/metadata_copy.rs).
    let ha_task = match config.ha_listen_addr()? {
        Some(addr) if id == 0 => {
            let listener = TcpListener::bind(addr).map_err(|e| {
                shard.close_storage_channels();
                format!("cannot listen for slaves on {addr}: {e}")
            })?;
            let actual_ha = listener.local_addr().unwrap_or(addr);
            let advertised = config.ha_advertised_addr(actual_ha)?;
            shard.ha_host.set(Some(advertised));
            info!(addr = %actual_ha, %advertised, "serving slaves (HA)");
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

/// How long a stopping network shard waits for the requests in flight.
const DRAIN_BOUND: Duration = Duration::from_secs(5);

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
        let deadline = std::time::Instant::now() + DRAIN_BOUND;
        while shard.inflight_requests.get() > 0 && std::time::Instant::now() < deadline {
            future::or(
                shard.idle.notified(),
                glommio::timer::sleep(Duration::from_millis(20)),
            )
            .await;
        }
        if shard.inflight_requests.get() > 0 {
            warn!(
                network_shard = shard.id,
                in_flight = ?shard
                    .inflight_by_kind
                    .borrow()
                    .iter()
                    .filter(|(_, count)| **count > 0)
                    .collect::<Vec<_>>(),
                "requests still in flight after the drain's bound: stopping without their answers"
            );
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
                glommio::spawn_local(async move { tls::serve(shard, stream).await }).detach();
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
