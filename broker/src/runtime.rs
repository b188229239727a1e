//! Placing and running the shards: one glommio executor per core named in `storage_cores` or
//! `network_cores`, pinned to it, hosting every shard assigned to that core (so a single core
//! runs both roles on one executor), joined by a full mesh of bounded channels.
//!
//! Owns startup (config validation, the data directory's meta, the mesh), the placement log
//! line, signal handling (SIGINT/SIGTERM start a graceful stop) and the exit status.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use glommio::channels::shared_channel::{self, SharedReceiver, SharedSender};
use glommio::{LocalExecutorBuilder, Placement};
use tracing::{error, info};

use crate::config::BrokerConfig;
use crate::mesh::{NetworkEvent, StorageRequest};
use crate::network::{self, ListenPlan};
use crate::{control, meta, storage};

/// Capacity of each storage → network event channel.
const EVENT_QUEUE_DEPTH: usize = 8192;

/// A storage shard's ends of the mesh: its id, request receivers and event senders.
type StorageEnds = (
    usize,
    Vec<SharedReceiver<StorageRequest>>,
    Vec<SharedSender<NetworkEvent>>,
);
/// A network shard's ends of the mesh: its id, request senders and event receivers.
type NetworkEnds = (
    usize,
    Vec<SharedSender<StorageRequest>>,
    Vec<SharedReceiver<NetworkEvent>>,
);

/// What one core's executor hosts.
#[derive(Default)]
struct CoreRoles {
    storage: Vec<StorageEnds>,
    network: Vec<NetworkEnds>,
}

/// Runs the broker until SIGINT/SIGTERM (or until `stopping` is set), then stops gracefully.
/// `is_restart`: the same process ran the broker before (see `role::request_restart`).
/// `on_listening` receives the address clients connect to, once the broker serves.
pub fn run(
    config: BrokerConfig,
    stopping: Arc<AtomicBool>,
    is_restart: bool,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), String> {
    config.validate()?;
    let storage_count = config.storage_cores.len();
    let network_count = config.network_cores.len();
    meta::open_or_create(
        &config.data_dir,
        storage_count,
        &config.cluster_name,
        &config.broker_name,
    )?;

    // The mesh: requests[n][s] from network shard n to storage shard s; events[s][n] back.
    let mut per_core: BTreeMap<usize, CoreRoles> = BTreeMap::new();
    let mut request_receivers: Vec<Vec<SharedReceiver<StorageRequest>>> =
        (0..storage_count).map(|_| Vec::new()).collect();
    let mut event_senders: Vec<Vec<SharedSender<NetworkEvent>>> =
        (0..storage_count).map(|_| Vec::new()).collect();
    let mut network_sides = Vec::new();
    for _ in 0..network_count {
        let mut senders = Vec::new();
        let mut receivers = Vec::new();
        for storage in 0..storage_count {
            let (tx, rx) = shared_channel::new_bounded(config.storage_queue_depth);
            senders.push(tx);
            request_receivers[storage].push(rx);
            let (event_tx, event_rx) = shared_channel::new_bounded(EVENT_QUEUE_DEPTH);
            event_senders[storage].push(event_tx);
            receivers.push(event_rx);
        }
        network_sides.push((senders, receivers));
    }
    for (storage, (receivers, senders)) in
        request_receivers.into_iter().zip(event_senders).enumerate()
    {
        per_core
            .entry(config.storage_cores[storage])
            .or_default()
            .storage
            .push((storage, receivers, senders));
    }
    for (network, (senders, receivers)) in network_sides.into_iter().enumerate() {
        per_core
            .entry(config.network_cores[network])
            .or_default()
            .network
            .push((network, senders, receivers));
    }
    let placement: Vec<String> = per_core
        .iter()
        .map(|(core, roles)| {
            let storage: Vec<String> = roles
                .storage
                .iter()
                .map(|(id, _, _)| format!("storage-{id}"))
                .collect();
            let network: Vec<String> = roles
                .network
                .iter()
                .map(|(id, _, _)| format!("network-{id}"))
                .collect();
            format!("core {core}: {}", [storage, network].concat().join(" + "))
        })
        .collect();
    let _ = crate::metrics::broker().placement.set(placement.join("; "));
    info!(
        placement = %placement.join("; "),
        storage_shards = storage_count,
        network_shards = network_count,
        data_dir = %config.data_dir.display(),
        flush = %config.flush,
        "starting shardmq-broker"
    );

    let listen = Arc::new(OnceLock::new());
    let configured_listen = if is_restart {
        // The address is this process's from the previous run; its accepted connections may
        // linger (FIN-WAIT) and would make the probe's plain bind fail, while the shards'
        // SO_REUSEPORT listeners bind beside them.
        config.listen_addr()?
    } else {
        claim_listen_address(config.listen_addr()?)?
    };
    let (listening_tx, listening_rx) = mpsc::channel::<SocketAddr>();
    let (done_tx, done_rx) = mpsc::channel::<(usize, Result<(), String>)>();
    let shared_config = Arc::new(config);
    let mut handles = Vec::new();
    for (core, roles) in per_core {
        let config = shared_config.clone();
        let stopping = stopping.clone();
        let listen = listen.clone();
        let listening_tx = listening_tx.clone();
        let done_tx = done_tx.clone();
        // glommio's default I/O memory (10 MiB) for a network core; a storage core's also holds
        // its stores' write rings and read-ahead caches, so that they are registered buffers.
        let io_memory = (10 << 20)
            + roles
                .storage
                .iter()
                .map(|(id, _, _)| shared_config.store_config(*id).io_memory_bytes())
                .sum::<usize>();
        let handle = LocalExecutorBuilder::new(Placement::Fixed(core))
            .name(&format!("shardmq-core-{core}"))
            .io_memory(io_memory)
            .spin_before_park(Duration::from_micros(shared_config.spin_before_park_us))
            .spawn(move || async move {
                let config = Rc::new((*config).clone());
                glommio::spawn_local(park_guard()).detach();
                let mut tasks = Vec::new();
                for (id, receivers, senders) in roles.storage {
                    let config = config.clone();
                    tasks.push(
                        glommio::spawn_local(storage::run(id, config, receivers, senders)).detach(),
                    );
                }
                for (id, senders, receivers) in roles.network {
                    let plan = ListenPlan {
                        configured: configured_listen,
                        actual: listen.clone(),
                    };
                    let listening_tx = listening_tx.clone();
                    let on_listening = move |addr: SocketAddr| {
                        if id == 0 {
                            let _ = listening_tx.send(addr);
                        }
                    };
                    tasks.push(
                        glommio::spawn_local(run_network_shard(
                            id,
                            config.clone(),
                            senders,
                            receivers,
                            plan,
                            stopping.clone(),
                            on_listening,
                        ))
                        .detach(),
                    );
                }
                let mut outcome = Ok(());
                for task in tasks {
                    if let Some(Err(e)) = task.await {
                        error!(core, error = %e, "shard failed");
                        stopping.store(true, Ordering::Relaxed);
                        outcome = Err(e);
                    }
                }
                let _ = done_tx.send((core, outcome));
            })
            .map_err(|e| format!("cannot start an executor on core {core}: {e}"))?;
        handles.push(handle);
    }
    drop(listening_tx);
    drop(done_tx);

    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stopping.clone())
            .map_err(|e| format!("cannot install a signal handler: {e}"))?;
    }
    let mut announced = false;
    let mut on_listening = Some(on_listening);
    let mut failure = None;
    let mut finished = 0;
    while finished < handles.len() {
        if !announced {
            if let Ok(addr) = listening_rx.try_recv() {
                announced = true;
                info!(%addr, "serving");
                if let Some(callback) = on_listening.take() {
                    callback(addr);
                }
            }
        }
        match done_rx.recv_timeout(Duration::from_millis(50)) {
            Ok((_, Err(e))) => {
                failure.get_or_insert(e);
                finished += 1;
                stopping.store(true, Ordering::Relaxed);
            }
            Ok((_, Ok(()))) => finished += 1,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if crate::role::is_restart_requested() && !stopping.load(Ordering::Relaxed) {
            info!("restarting the broker (a fresh image of this program, same pid and address)");
            stopping.store(true, Ordering::Relaxed);
        }
        if stopping.load(Ordering::Relaxed) && !announced {
            // Stopped before serving (a failed start): the executors end on their own.
            announced = true;
        }
    }
    for handle in handles {
        let _ = handle.join();
    }
    match failure {
        Some(e) => Err(e),
        None => {
            info!("shardmq-broker stopped");
            Ok(())
        }
    }
}

/// Runs network shard `id` until the broker stops; on shard 0, with the control plane beside it
/// (started once the shard serves, stopped after it has drained).
async fn run_network_shard(
    id: usize,
    config: Rc<BrokerConfig>,
    requests: Vec<SharedSender<StorageRequest>>,
    events: Vec<SharedReceiver<NetworkEvent>>,
    listen: ListenPlan,
    stopping: Arc<AtomicBool>,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), String> {
    let started =
        network::start(id, config, requests, events, listen, stopping, on_listening).await?;
    let Some(mut serving) = started else {
        return Ok(());
    };
    if id == 0 {
        let stopping = serving.shard().stopping.clone();
        glommio::spawn_local(network::access::reload_until_stopped(stopping)).detach();
    }
    let control = if id == 0 {
        match control::start(serving.shard()).await {
            Ok(control) => Some(control),
            Err(e) => {
                serving.finish().await;
                return Err(e);
            }
        }
    } else {
        None
    };
    serving.accept_until_stopped().await;
    serving.drain().await;
    if let Some(control) = control {
        control.stop().await;
    }
    serving.finish().await;
    Ok(())
}

/// Refuses an address another process listens on, and resolves port 0 to a free port.
///
/// The network shards listen with `SO_REUSEPORT` (glommio's listener) so that they share one
/// port; the same option would let this broker silently join a socket that another broker of
/// the same user already listens on, and connections would alternate between the two. A plain
/// bind without `SO_REUSEPORT` fails while anyone listens on the address, so it is tried first
/// (and closed again before the shards bind).
fn claim_listen_address(addr: SocketAddr) -> Result<SocketAddr, String> {
    // A broker killed a moment ago can leave its listener open for a little while (its
    // io_uring is torn down after the process is gone): give that time to go before refusing.
    let deadline = std::time::Instant::now() + LISTENER_GONE_WAIT;
    loop {
        match std::net::TcpListener::bind(addr) {
            Ok(probe) => {
                return probe
                    .local_addr()
                    .map_err(|e| format!("cannot listen on {addr}: {e}"))
            }
            // The port is taken by a listener, or only by connections a previous broker left
            // (they linger in FIN-WAIT and block a plain bind, not the shards' SO_REUSEPORT
            // listeners). Only a listener accepts a connection.
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                let someone_listens =
                    std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok();
                if !someone_listens {
                    return Ok(addr);
                }
                if std::time::Instant::now() >= deadline {
                    return Err(format!(
                        "cannot listen on {addr}: another process is listening there (another broker?); stop it or pick another --listen address"
                    ));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(format!("cannot listen on {addr}: {e}")),
        }
    }
}

/// How long a start waits for a listener on its address to go away before refusing it.
const LISTENER_GONE_WAIT: Duration = Duration::from_secs(3);

/// How long an executor may sleep at most; see [`park_guard`].
const PARK_GUARD_TICK: Duration = Duration::from_millis(5);

/// Keeps a timer pending on the executor at all times, so that it never parks without a
/// deadline.
///
/// glommio 0.9.0's run loop parks when `run_task_queues` returns false, and that function
/// returns false not only when no task is runnable but also when the preemption flag is
/// already set before it runs its first task queue: the executor then sleeps with runnable
/// tasks until some I/O completes, a channel wakes it, or a timer fires. Rarely (a few full
/// test-suite runs in ten, never alone) a broker's shard slept that way for more than ten
/// seconds and a client's handshake timed out. With a timer always pending the sleep lasts
/// at most one tick; the cost is one wake-up per tick on an idle core.
async fn park_guard() {
    loop {
        glommio::timer::sleep(PARK_GUARD_TICK).await;
    }
}
