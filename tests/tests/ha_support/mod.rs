//! A controller group of real processes for the failover and fault-injection tests: three
//! name servers each running a controller (one Raft group), three brokers of one group in
//! `--broker-role auto`, producers through the client library, and what checks that nothing
//! acknowledged is lost.

#![allow(dead_code)] // each test file uses a part

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::reliability_support::pull_queue;
use shardmq_schema::wire;
use shardmq_tests::{free_port, wait_until, BrokerProcess, NamesrvProcess, TestClient};

pub const TOPIC: &str = "Failover";
pub const QUEUES: u32 = 4;
/// Longest anything here may take to settle.
pub const SETTLE: Duration = Duration::from_secs(30);

/// A broker group as one controller reports it.
#[derive(Debug, Clone, Default)]
pub struct GroupStatus {
    pub leader: u64,
    pub master_id: i64,
    pub master_address: String,
    pub epoch: u64,
    pub in_sync: Vec<i64>,
}

/// Three controllers (in name servers) and three brokers in `auto` role.
pub struct HaGroup {
    pub controllers: Vec<Option<NamesrvProcess>>,
    pub controller_addresses: Vec<String>,
    pub namesrv_list: String,
    pub brokers: Vec<BrokerProcess>,
    /// Per broker (index id - 1), the links to each controller when the group was started
    /// with [`start_partitionable`](HaGroup::start_partitionable); empty otherwise.
    pub controller_links: Vec<Vec<TcpProxy>>,
    /// Per broker (index id - 1), the links to each name server, as `controller_links`.
    pub namesrv_links: Vec<Vec<TcpProxy>>,
    /// Per broker (index id - 1), the link its slaves reach its HA listener through when it
    /// is master (its `--ha-advertise`), as `controller_links`.
    pub ha_links: Vec<TcpProxy>,
    pub _dirs: Vec<tempfile::TempDir>,
}

impl HaGroup {
    pub fn start() -> HaGroup {
        HaGroup::start_with(&[])
    }

    /// Starts the group with `extra` options on every broker.
    pub fn start_with(extra: &[&str]) -> HaGroup {
        HaGroup::start_each(extra, |_| Vec::new())
    }

    /// Starts the group with each broker reaching each controller and each name server through
    /// a [`TcpProxy`] of its own ([`cut_from_controllers`](HaGroup::cut_from_controllers),
    /// [`stall_to_controllers`](HaGroup::stall_to_controllers),
    /// [`cut_from_name_servers`](HaGroup::cut_from_name_servers)), and its slaves reaching
    /// its HA listener through one more ([`cut_from_slaves`](HaGroup::cut_from_slaves),
    /// [`stall_from_slaves`](HaGroup::stall_from_slaves)).
    pub fn start_partitionable() -> HaGroup {
        HaGroup::start_inner(&[], |_| Vec::new(), true)
    }

    /// Cuts (`true`) or restores (`false`) broker `id`'s links to every controller: it keeps
    /// running and serving clients and replicas, but reaches no controller.
    pub fn cut_from_controllers(&self, id: i64, cut: bool) {
        for link in &self.controller_links[(id - 1) as usize] {
            link.set_cut(cut);
        }
    }

    /// Holds (`true`) or lets through again (`false`) everything broker `id` sends to the
    /// controllers, on connections it holds and new ones: a one-way loss. Its connections stay
    /// open and what the controllers send still arrives; its requests wait in the proxy (as
    /// across a link that drops one direction until it heals, when TCP delivers them late).
    pub fn stall_to_controllers(&self, id: i64, stalled: bool) {
        for link in &self.controller_links[(id - 1) as usize] {
            link.set_stalled(Direction::ToTarget, stalled);
        }
    }

    /// Delays everything between broker `id` and every controller by `delay` each way (zero:
    /// none); its connections stay open.
    pub fn delay_controller_links(&self, id: i64, delay: Duration) {
        for link in &self.controller_links[(id - 1) as usize] {
            link.set_delay(delay);
        }
    }

    /// Cuts (`true`) or restores (`false`) broker `id`'s links to every name server: it keeps
    /// running, serving clients and replicas and reaching the controllers, but cannot register.
    pub fn cut_from_name_servers(&self, id: i64, cut: bool) {
        for link in &self.namesrv_links[(id - 1) as usize] {
            link.set_cut(cut);
        }
    }

    /// Cuts (`true`) or restores (`false`) the links between broker `id`, as master, and its
    /// slaves: their replication connections drop and new ones are closed, while every broker
    /// keeps reaching the controllers, the name servers and the clients.
    pub fn cut_from_slaves(&self, id: i64, cut: bool) {
        self.ha_links[(id - 1) as usize].set_cut(cut);
    }

    /// Holds (`true`) or lets through again (`false`) everything broker `id`'s slaves send it
    /// on their replication connections (their acknowledgements and requests): a one-way loss.
    /// The master's bytes still reach them; what they send arrives late, once let through.
    pub fn stall_from_slaves(&self, id: i64, stalled: bool) {
        self.ha_links[(id - 1) as usize].set_stalled(Direction::ToTarget, stalled);
    }

    /// Cuts (`true`) or restores (`false`) the replication links between master `master` and
    /// one of its slaves, `slave`, alone: its other slaves keep replicating, and every broker
    /// keeps reaching the controllers, the name servers and the clients.
    /// Returns how many live connections of the slave's the cut shut down.
    pub fn cut_slave_from_master(&mut self, master: i64, slave: i64, cut: bool) -> usize {
        let pid = self.broker(slave).pid();
        self.ha_links[(master - 1) as usize].set_cut_for_process(pid, cut)
    }

    /// Starts the group with `extra` options on every broker and `own(id)` on broker `id`.
    pub fn start_each(extra: &[&str], own: impl Fn(i64) -> Vec<String>) -> HaGroup {
        HaGroup::start_inner(extra, own, false)
    }

    fn start_inner(extra: &[&str], own: impl Fn(i64) -> Vec<String>, proxied: bool) -> HaGroup {
        let controller_addresses: Vec<String> = (0..3)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect();
        let peers: Vec<String> = controller_addresses
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect();
        let peers = peers.join(",");
        let mut dirs = Vec::new();
        let mut controllers = Vec::new();
        for (i, address) in controller_addresses.iter().enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let id = (i + 1).to_string();
            controllers.push(Some(NamesrvProcess::start_with_args(&[
                "--broker-timeout-ms",
                "2000",
                "--scan-interval-ms",
                "100",
                "--controller",
                "--controller-listen",
                address,
                "--controller-peers",
                &peers,
                "--controller-id",
                &id,
                "--controller-data-dir",
                dir.path().to_str().unwrap(),
                "--controller-broker-timeout-ms",
                "2000",
            ])));
            dirs.push(dir);
        }
        let namesrv_list = controllers
            .iter()
            .map(|c| c.as_ref().unwrap().addr().to_string())
            .collect::<Vec<_>>()
            .join(",");
        let mut brokers = Vec::new();
        let mut controller_links = Vec::new();
        let mut namesrv_links = Vec::new();
        let mut ha_links = Vec::new();
        for id in 1..=3 {
            let (broker_namesrv_list, controller_list) = if proxied {
                let namesrv_addresses: Vec<String> = controllers
                    .iter()
                    .map(|c| c.as_ref().unwrap().addr().to_string())
                    .collect();
                let (links, namesrvs) = proxies_to(&namesrv_addresses);
                namesrv_links.push(links);
                let (links, controllers) = proxies_to(&controller_addresses);
                controller_links.push(links);
                (namesrvs, controllers)
            } else {
                (namesrv_list.clone(), controller_addresses.join(","))
            };
            let dir = tempfile::tempdir().unwrap();
            let ha = format!("127.0.0.1:{}", free_port());
            let mut own_args = own(id);
            if proxied {
                let link = TcpProxy::start(&ha);
                own_args.extend(["--ha-advertise".to_owned(), link.address().to_owned()]);
                ha_links.push(link);
            }
            let id = id.to_string();
            let mut args = vec![
                "--namesrv",
                &broker_namesrv_list,
                "--broker-role",
                "auto",
                "--broker-id",
                &id,
                "--controller",
                &controller_list,
                "--controller-heartbeat-ms",
                "300",
                "--ha-listen",
                &ha,
                "--register-interval-ms",
                "500",
                "--sync-flush-timeout-ms",
                "3000",
            ];
            args.extend_from_slice(extra);
            args.extend(own_args.iter().map(String::as_str));
            brokers.push(BrokerProcess::start(dir.path(), &args));
            dirs.push(dir);
        }
        let group = HaGroup {
            controllers,
            controller_addresses,
            namesrv_list,
            brokers,
            controller_links,
            namesrv_links,
            ha_links,
            _dirs: dirs,
        };
        wait_until(SETTLE, "a master and all three brokers in sync", || {
            let status = group.status()?;
            (status.master_id > 0 && status.in_sync.len() == 3).then_some(())
        });
        group
    }

    /// The group as the first controller that answers reports it.
    pub fn status(&self) -> Option<GroupStatus> {
        for (i, address) in self.controller_addresses.iter().enumerate() {
            if self.controllers[i].is_none() {
                continue;
            }
            let Ok(mut client) = TestClient::connect(address.parse().unwrap()) else {
                continue;
            };
            if client.handshake().is_err() {
                continue;
            }
            let Some(answer) = status_request(&mut client) else {
                continue;
            };
            let Some(r) = answer.frame().body_as_controller_status_response() else {
                continue;
            };
            let group = r.groups().and_then(|g| g.iter().next());
            return Some(match group {
                Some(g) => GroupStatus {
                    leader: r.leader_id(),
                    master_id: g.master_id(),
                    master_address: g.master_address().unwrap_or_default().to_owned(),
                    epoch: g.epoch(),
                    in_sync: g.sync_state_set().iter().flat_map(|v| v.iter()).collect(),
                },
                None => GroupStatus {
                    leader: r.leader_id(),
                    ..GroupStatus::default()
                },
            });
        }
        None
    }

    pub fn broker(&mut self, id: i64) -> &mut BrokerProcess {
        &mut self.brokers[(id - 1) as usize]
    }

    pub fn master_client(&self) -> TestClient {
        let status = self.status().expect("a controller answers");
        let mut client = TestClient::connect(status.master_address.parse().unwrap()).unwrap();
        client.handshake().unwrap();
        client
    }
}

/// Sends one message of `body` to queue 0 of [`TOPIC`] on `client`: the answer's status.
pub fn send_one(client: &mut TestClient, body: &str) -> wire::Status {
    let message = shardmq_tests::TestMessage::new(body.to_owned());
    let answer = client
        .request(|b| shardmq_tests::send_request_body(b, TOPIC, 0, std::slice::from_ref(&message)))
        .unwrap();
    shardmq_tests::status_of(&answer).0
}

/// A client of the master the controllers name, once that broker accepts connections.
pub fn connect_master(group: &HaGroup) -> TestClient {
    wait_until(SETTLE, "the master listening", || {
        let status = group.status()?;
        let mut client = TestClient::connect(status.master_address.parse().ok()?).ok()?;
        client.handshake().ok()?;
        Some(client)
    })
}

/// Producers through the client library, sending until stopped; records each SEND_OK body and
/// when the last one came.
/// Acknowledged bodies and when each was acknowledged.
pub type Acknowledged = Arc<Mutex<Vec<(Vec<u8>, Instant)>>>;

pub struct Load {
    acknowledged: Acknowledged,
    stop: Arc<AtomicBool>,
    runtime: tokio::runtime::Runtime,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    pub fn start(namesrv: &str, producers: usize) -> Load {
        Load::start_paced(namesrv, producers, Duration::ZERO)
    }

    /// Like [`Load::start`], each producer pausing `pause` after each acknowledged send (a
    /// load the slaves can catch up with after a fault).
    pub fn start_paced(namesrv: &str, producers: usize, pause: Duration) -> Load {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let acknowledged = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..producers)
            .map(|p| {
                let (namesrv, acknowledged, stop) =
                    (namesrv.to_owned(), acknowledged.clone(), stop.clone());
                runtime.spawn(async move {
                    let producer = shardmq_client::Producer::builder()
                        .namesrv(&namesrv)
                        .send_timeout(Duration::from_secs(4))
                        .build()
                        .await
                        .expect("a producer");
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let body = format!("p{p}-{i}").into_bytes();
                        i += 1;
                        match producer
                            .send(shardmq_client::Message::new(TOPIC, body.clone()))
                            .await
                        {
                            Ok(r) if r.status == shardmq_client::SendStatus::SendOk => {
                                if std::env::var_os("SHARDMQ_CHAOS_TRACE_ACKS").is_some() {
                                    eprintln!(
                                        "ack {} queue {} offset {} at {}",
                                        String::from_utf8_lossy(&body),
                                        r.queue.queue_id,
                                        r.queue_offset,
                                        r.offset_msg_id()
                                    );
                                }
                                acknowledged.lock().unwrap().push((body, Instant::now()));
                                if !pause.is_zero() {
                                    tokio::time::sleep(pause).await;
                                }
                            }
                            _ => tokio::time::sleep(Duration::from_millis(20)).await,
                        }
                    }
                    producer.shutdown().await;
                })
            })
            .collect();
        Load {
            acknowledged,
            stop,
            runtime,
            tasks,
        }
    }

    pub fn count(&self) -> usize {
        self.acknowledged.lock().unwrap().len()
    }

    /// When the first send after `since` was acknowledged.
    pub fn first_ack_after(&self, since: Instant) -> Option<Instant> {
        self.acknowledged
            .lock()
            .unwrap()
            .iter()
            .map(|(_, at)| *at)
            .find(|at| *at > since)
    }

    pub fn finish(self) -> Vec<Vec<u8>> {
        self.stop.store(true, Ordering::Relaxed);
        let tasks = self.tasks;
        self.runtime.block_on(async {
            for task in tasks {
                let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
            }
        });
        let acknowledged = self.acknowledged.lock().unwrap();
        acknowledged.iter().map(|(b, _)| b.clone()).collect()
    }
}

/// Every body stored in the topic on the broker `client` talks to.
pub fn stored(client: &mut TestClient) -> HashSet<Vec<u8>> {
    let mut bodies = HashSet::new();
    for queue in 0..QUEUES as i32 {
        bodies.extend(
            pull_queue(client, TOPIC, queue)
                .0
                .into_iter()
                .map(|r| r.body),
        );
    }
    bodies
}

pub fn assert_all_stored(acknowledged: &[Vec<u8>], bodies: &HashSet<Vec<u8>>, where_: &str) {
    let missing: Vec<String> = acknowledged
        .iter()
        .filter(|b| !bodies.contains(*b))
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged messages missing on {where_}: {:?}",
        missing.len(),
        acknowledged.len(),
        &missing[..missing.len().min(10)]
    );
}

/// `role` from a broker's `broker status`, if it answers.
pub fn role_of(address: std::net::SocketAddr) -> Option<String> {
    let mut client = TestClient::connect(address).ok()?;
    client.handshake().ok()?;
    let answer = shardmq_tests::broker_status(&mut client).ok()?;
    answer
        .frame()
        .body_as_broker_status_response()
        .and_then(|r| r.role())
        .map(str::to_owned)
}

pub fn signal(process: &shardmq_tests::ServerProcess, name: &str) {
    shardmq_tests::signal(process.pid(), name);
}

/// The first group one controller reports.
pub fn controller_group(address: &str) -> Option<GroupStatus> {
    let mut client = TestClient::connect(address.parse().unwrap()).ok()?;
    client.handshake().ok()?;
    let answer = status_request(&mut client)?;
    let r = answer.frame().body_as_controller_status_response()?;
    let g = r.groups()?.iter().next()?;
    Some(GroupStatus {
        leader: r.leader_id(),
        master_id: g.master_id(),
        master_address: g.master_address().unwrap_or_default().to_owned(),
        epoch: g.epoch(),
        in_sync: g.sync_state_set().iter().flat_map(|v| v.iter()).collect(),
    })
}

pub fn status_request(client: &mut TestClient) -> Option<shardmq_schema::VerifiedFrame> {
    client
        .request(|b| {
            let body =
                wire::ControllerStatusRequest::create(b, &wire::ControllerStatusRequestArgs {});
            (wire::Body::ControllerStatusRequest, body.as_union_value())
        })
        .ok()
}

/// A proxy to each of `targets`, and their addresses as a comma-separated list.
fn proxies_to(targets: &[String]) -> (Vec<TcpProxy>, String) {
    let links: Vec<TcpProxy> = targets.iter().map(|t| TcpProxy::start(t)).collect();
    let list = links
        .iter()
        .map(|link| link.address().to_owned())
        .collect::<Vec<_>>()
        .join(",");
    (links, list)
}

/// A TCP forwarder on a free loopback port to one target, which the test can cut
/// ([`set_cut`](Self::set_cut)): while cut, connections it holds are shut down and new ones
/// are closed as soon as they are accepted (the peer sees a reset or an end of stream, as
/// across a network partition that drops the connection). It can also cut only the
/// connections one process makes ([`set_cut_for_process`](Self::set_cut_for_process)).
/// Threads end when the proxy drops.
pub struct TcpProxy {
    address: String,
    cut: Arc<AtomicBool>,
    /// Processes whose connections are cut (the rest pass).
    cut_processes: Arc<Mutex<HashSet<u32>>>,
    /// Per direction ([`Direction`] as index): bytes are held, not forwarded.
    stalled: Arc<[AtomicBool; 2]>,
    /// Milliseconds each chunk waits before it is forwarded, both directions.
    delay_ms: Arc<AtomicU64>,
    /// Each connection held: the client's side, then the target's.
    live: Arc<Mutex<Vec<(std::net::TcpStream, std::net::TcpStream)>>>,
    stop: Arc<AtomicBool>,
}

impl TcpProxy {
    pub fn start(target: &str) -> TcpProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a proxy port");
        let address = listener.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let stalled: Arc<[AtomicBool; 2]> =
            Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
        let live: Arc<Mutex<Vec<(std::net::TcpStream, std::net::TcpStream)>>> = Arc::default();
        let cut_processes: Arc<Mutex<HashSet<u32>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        listener.set_nonblocking(true).unwrap();
        let target = target.to_owned();
        let (cut_, cut_processes_, stalled_, delay_ms_, live_, stop_) = (
            cut.clone(),
            cut_processes.clone(),
            stalled.clone(),
            delay_ms.clone(),
            live.clone(),
            stop.clone(),
        );
        std::thread::spawn(move || {
            while !stop_.load(Ordering::Relaxed) {
                let incoming = match listener.accept() {
                    Ok((stream, _)) => stream,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    Err(_) => continue,
                };
                if cut_.load(Ordering::Relaxed) || is_from_any(&incoming, &cut_processes_) {
                    drop(incoming);
                    continue;
                }
                let _ = incoming.set_nonblocking(false);
                let Ok(outgoing) = std::net::TcpStream::connect(&target) else {
                    continue;
                };
                let _ = incoming.set_nodelay(true);
                let _ = outgoing.set_nodelay(true);
                {
                    let mut held = live_.lock().unwrap();
                    held.retain(|(s, _)| s.peer_addr().is_ok());
                    held.push((incoming.try_clone().unwrap(), outgoing.try_clone().unwrap()));
                }
                for (direction, mut from, mut to) in [
                    (
                        Direction::ToTarget,
                        incoming.try_clone().unwrap(),
                        outgoing.try_clone().unwrap(),
                    ),
                    (Direction::FromTarget, outgoing, incoming),
                ] {
                    let (stalled, delay_ms, stop) =
                        (stalled_.clone(), delay_ms_.clone(), stop_.clone());
                    std::thread::spawn(move || {
                        forward(
                            &mut from,
                            &mut to,
                            &stalled[direction as usize],
                            &delay_ms,
                            &stop,
                        );
                        let _ = to.shutdown(std::net::Shutdown::Both);
                        let _ = from.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        TcpProxy {
            address,
            cut,
            cut_processes,
            stalled,
            delay_ms,
            live,
            stop,
        }
    }

    /// `host:port` to give the clients instead of the target's.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Holds (`true`) or lets through again (`false`) the bytes of one direction, on every
    /// connection: while held, the forwarder reads no more of them (TCP's own backpressure
    /// reaches the sender); once let through, what was held arrives, late.
    pub fn set_stalled(&self, direction: Direction, stalled: bool) {
        self.stalled[direction as usize].store(stalled, Ordering::Relaxed);
    }

    /// Delays every chunk by `delay` before it is forwarded, both directions (zero: none). A
    /// chunk is what one read of the sender's bytes returned, so a request and its answer each
    /// arrive `delay` late, and what follows a chunk waits behind it (a slow, not a lossy link).
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Cuts (`true`) or restores (`false`) the link.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::Relaxed);
        if cut {
            for (incoming, outgoing) in self.live.lock().unwrap().drain(..) {
                let _ = incoming.shutdown(std::net::Shutdown::Both);
                let _ = outgoing.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    /// Cuts (`true`) or restores (`false`) the link for the connections process `pid` makes
    /// alone, as [`set_cut`](Self::set_cut) does for all: those it holds are shut down, new
    /// ones closed once accepted. A connection's process is found through `/proc` (the socket
    /// of the client's address, and which of the process's descriptors holds it).
    /// Returns how many live connections it shut down.
    pub fn set_cut_for_process(&self, pid: u32, cut: bool) -> usize {
        let mut processes = self.cut_processes.lock().unwrap();
        if !cut {
            processes.remove(&pid);
            return 0;
        }
        processes.insert(pid);
        drop(processes);
        let only = Mutex::new(HashSet::from([pid]));
        let mut shut = 0;
        self.live.lock().unwrap().retain(|(incoming, outgoing)| {
            if !is_from_any(incoming, &only) {
                return true;
            }
            let _ = incoming.shutdown(std::net::Shutdown::Both);
            let _ = outgoing.shutdown(std::net::Shutdown::Both);
            shut += 1;
            false
        });
        shut
    }
}

/// Whether the client end of `incoming` (a loopback connection accepted by a proxy) belongs to
/// one of `processes`.
fn is_from_any(incoming: &std::net::TcpStream, processes: &Mutex<HashSet<u32>>) -> bool {
    let processes = processes.lock().unwrap();
    if processes.is_empty() {
        return false;
    }
    let (Ok(std::net::SocketAddr::V4(client)), Ok(std::net::SocketAddr::V4(proxy))) =
        (incoming.peer_addr(), incoming.local_addr())
    else {
        return false;
    };
    let Some(inode) = socket_inode(client, proxy) else {
        return false;
    };
    let wanted = format!("socket:[{inode}]");
    processes.iter().any(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|link| link.as_os_str() == wanted.as_str())
            })
    })
}

/// The inode of the live IPv4 TCP socket from `local` to `remote` (`/proc/net/tcp`: each
/// address as hex of its bytes in memory order, then the port in hex; the inode is the tenth
/// column). Both ends are matched and inode 0 is skipped: an earlier connection from the same
/// local port may linger in TIME_WAIT (with no inode) beside the live one.
fn socket_inode(local: std::net::SocketAddrV4, remote: std::net::SocketAddrV4) -> Option<u64> {
    let hex = |address: std::net::SocketAddrV4| {
        format!(
            "{:08X}:{:04X}",
            u32::from_ne_bytes(address.ip().octets()),
            address.port()
        )
    };
    let (local, remote) = (hex(local), hex(remote));
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let columns: Vec<&str> = line.split_whitespace().collect();
        let inode: u64 = columns.get(9)?.parse().ok()?;
        (columns.get(1) == Some(&local.as_str())
            && columns.get(2) == Some(&remote.as_str())
            && inode != 0)
            .then_some(inode)
    })
}

/// One direction of a [`TcpProxy`]'s connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the proxy's clients to its target.
    ToTarget = 0,
    /// From the target back to the clients.
    FromTarget = 1,
}

/// Copies `from` to `to` until either ends (or the proxy stops), holding each chunk while
/// `stalled` is set and for `delay_ms` first.
fn forward(
    from: &mut std::net::TcpStream,
    to: &mut std::net::TcpStream,
    stalled: &AtomicBool,
    delay_ms: &AtomicU64,
    stop: &AtomicBool,
) {
    use std::io::{Read, Write};
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        let delay = delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(Duration::from_millis(delay));
        }
        while stalled.load(Ordering::Relaxed) {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if to.write_all(&buffer[..read]).is_err() {
            return;
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.set_cut(true);
    }
}
