//! Automatic failover with real processes (docs/replication.md, "Automatic failover"): three
//! name servers each running a controller (`--controller`, one Raft group), and three brokers
//! of one group in `--broker-role auto`. The controller makes the first broker master; when
//! the master is killed (or paused past the broker timeout) it elects a new one from the
//! SyncStateSet, and the old master rejoins as a slave.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.
//!
//! Size: one real-process test per failover behaviour, sharing the `HaGroup` helper.

mod reliability_support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reliability_support::{create_topic, pull_queue};
use shardmq_schema::wire;
use shardmq_tests::{wait_until, BrokerProcess, NamesrvProcess, TestClient};

const TOPIC: &str = "Failover";
const QUEUES: u32 = 4;
/// Longest anything here may take to settle.
const SETTLE: Duration = Duration::from_secs(30);

use shardmq_tests::free_port;

/// A broker group as one controller reports it.
#[derive(Debug, Clone, Default)]
struct GroupStatus {
    leader: u64,
    master_id: i64,
    master_address: String,
    epoch: u64,
    in_sync: Vec<i64>,
}

/// Three controllers (in name servers) and three brokers in `auto` role.
struct HaGroup {
    controllers: Vec<Option<NamesrvProcess>>,
    controller_addresses: Vec<String>,
    namesrv_list: String,
    brokers: Vec<BrokerProcess>,
    _dirs: Vec<tempfile::TempDir>,
}

impl HaGroup {
    fn start() -> HaGroup {
        HaGroup::start_with(&[])
    }

    /// Starts the group with `extra` options on every broker.
    fn start_with(extra: &[&str]) -> HaGroup {
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
        let controller_list = controller_addresses.join(",");
        let mut brokers = Vec::new();
        for id in 1..=3 {
            let dir = tempfile::tempdir().unwrap();
            let ha = format!("127.0.0.1:{}", free_port());
            let id = id.to_string();
            let mut args = vec![
                "--namesrv",
                &namesrv_list,
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
            brokers.push(BrokerProcess::start(dir.path(), &args));
            dirs.push(dir);
        }
        let group = HaGroup {
            controllers,
            controller_addresses,
            namesrv_list,
            brokers,
            _dirs: dirs,
        };
        wait_until(SETTLE, "a master and all three brokers in sync", || {
            let status = group.status()?;
            (status.master_id > 0 && status.in_sync.len() == 3).then_some(())
        });
        group
    }

    /// The group as the first controller that answers reports it.
    fn status(&self) -> Option<GroupStatus> {
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

    fn broker(&mut self, id: i64) -> &mut BrokerProcess {
        &mut self.brokers[(id - 1) as usize]
    }

    fn master_client(&self) -> TestClient {
        let status = self.status().expect("a controller answers");
        let mut client = TestClient::connect(status.master_address.parse().unwrap()).unwrap();
        client.handshake().unwrap();
        client
    }
}

/// Producers through the client library, sending until stopped; records each SEND_OK body and
/// when the last one came.
/// Acknowledged bodies and when each was acknowledged.
type Acknowledged = Arc<Mutex<Vec<(Vec<u8>, Instant)>>>;

struct Load {
    acknowledged: Acknowledged,
    stop: Arc<AtomicBool>,
    runtime: tokio::runtime::Runtime,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(namesrv: &str, producers: usize) -> Load {
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
                                acknowledged.lock().unwrap().push((body, Instant::now()));
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

    fn count(&self) -> usize {
        self.acknowledged.lock().unwrap().len()
    }

    /// When the first send after `since` was acknowledged.
    fn first_ack_after(&self, since: Instant) -> Option<Instant> {
        self.acknowledged
            .lock()
            .unwrap()
            .iter()
            .map(|(_, at)| *at)
            .find(|at| *at > since)
    }

    fn finish(self) -> Vec<Vec<u8>> {
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
fn stored(client: &mut TestClient) -> HashSet<Vec<u8>> {
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

fn assert_all_stored(acknowledged: &[Vec<u8>], bodies: &HashSet<Vec<u8>>, where_: &str) {
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

#[test]
fn a_killed_master_is_replaced_from_the_sync_state_set_and_nothing_acknowledged_is_lost() {
    let mut group = HaGroup::start();
    create_topic(&mut group.master_client(), TOPIC, QUEUES);
    let before = group.status().unwrap();
    // A push consumer group reads across the failover, without a restart.
    let consumer_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let seen: Arc<Mutex<HashSet<Vec<u8>>>> = Arc::default();
    let consumer = {
        let sink = seen.clone();
        consumer_runtime
            .block_on(
                shardmq_client::PushConsumer::builder()
                    .namesrv(&group.namesrv_list)
                    .group("Survivor")
                    .subscribe(TOPIC, "*")
                    .consume_from(shardmq_client::ConsumeFrom::FirstOffset)
                    .listen_concurrently(move |messages| {
                        let sink = sink.clone();
                        async move {
                            sink.lock()
                                .unwrap()
                                .extend(messages.iter().map(|m| m.body.to_vec()));
                            shardmq_client::ConsumeResult::Success
                        }
                    })
                    .start(),
            )
            .expect("a push consumer")
    };
    let load = Load::start(&group.namesrv_list, 2);
    wait_until(SETTLE, "300 acknowledged sends", || {
        (load.count() >= 300).then_some(())
    });
    group.broker(before.master_id).kill9();
    // Dead from here on: the next acknowledgement comes from another master.
    let killed_at = Instant::now();
    let at_kill = load.count();
    wait_until(SETTLE, "writes to resume on a new master", || {
        (load.count() > at_kill + 50).then_some(())
    });
    let after = group.status().unwrap();
    let took = load.first_ack_after(killed_at).unwrap() - killed_at;
    let acknowledged = load.finish();
    assert_ne!(after.master_id, before.master_id);
    assert!(before.in_sync.contains(&after.master_id));
    assert_eq!(after.epoch, before.epoch + 1);
    eprintln!(
        "failover: master {} killed; master {} (epoch {}) acknowledged the next send {} ms later",
        before.master_id,
        after.master_id,
        after.epoch,
        took.as_millis()
    );
    assert!(
        took < Duration::from_secs(10),
        "writes resumed only after {took:?}"
    );
    assert_all_stored(
        &acknowledged,
        &stored(&mut group.master_client()),
        "the new master",
    );
    let deadline = Instant::now() + SETTLE;
    loop {
        let missing: Vec<String> = {
            let seen = seen.lock().unwrap();
            acknowledged
                .iter()
                .filter(|b| !seen.contains(*b))
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .collect()
        };
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the consumer lacks {} of {} acknowledged messages, e.g. {:?}",
            missing.len(),
            acknowledged.len(),
            &missing[..missing.len().min(5)]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    consumer_runtime.block_on(consumer.shutdown());
    // `shardmq controller status` says the same, from any member.
    let cli = shardmq_tests::run_cli(
        &group.namesrv_list,
        &[
            "--json",
            "controller",
            "status",
            "--controller",
            &group.controller_addresses.join(","),
        ],
    );
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(json["groups"][0]["master_id"], after.master_id);
    assert_eq!(json["groups"][0]["epoch"], after.epoch);

    // The old master returns as a slave of the new one and catches up.
    group.broker(before.master_id).restart();
    wait_until(SETTLE, "the old master back in the SyncStateSet", || {
        let status = group.status()?;
        (status.master_id == after.master_id && status.in_sync.contains(&before.master_id))
            .then_some(())
    });
    let mut returned = group.broker(before.master_id).client();
    assert_all_stored(
        &acknowledged,
        &stored(&mut returned),
        "the old master, now a slave",
    );
}

/// `role` from a broker's `broker status`, if it answers.
fn role_of(address: std::net::SocketAddr) -> Option<String> {
    let mut client = TestClient::connect(address).ok()?;
    client.handshake().ok()?;
    let answer = shardmq_tests::broker_status(&mut client).ok()?;
    answer
        .frame()
        .body_as_broker_status_response()
        .and_then(|r| r.role())
        .map(str::to_owned)
}

fn signal(process: &shardmq_tests::ServerProcess, name: &str) {
    shardmq_tests::signal(process.pid(), name);
}

#[test]
fn a_paused_master_is_fenced_and_rejoins_as_a_slave() {
    let mut group = HaGroup::start();
    create_topic(&mut group.master_client(), TOPIC, QUEUES);
    let before = group.status().unwrap();
    let old_address = group.broker(before.master_id).addr();
    let load = Load::start(&group.namesrv_list, 2);
    wait_until(SETTLE, "200 acknowledged sends", || {
        (load.count() >= 200).then_some(())
    });
    signal(group.broker(before.master_id), "STOP");
    wait_until(SETTLE, "a new master while the old one is paused", || {
        let status = group.status()?;
        (status.master_id != before.master_id && status.epoch > before.epoch).then_some(())
    });
    let paused_at = load.count();
    wait_until(SETTLE, "writes on the new master", || {
        (load.count() > paused_at + 50).then_some(())
    });
    signal(group.broker(before.master_id), "CONT");
    // The old master wakes up believing it is master: whatever it is sent now is not
    // acknowledged (its in-sync slaves follow the new master), and it soon learns its place.
    let fenced_until = Instant::now() + Duration::from_secs(4);
    let mut refused = 0;
    let mut answers = Vec::new();
    while Instant::now() < fenced_until {
        if let Ok(mut client) = TestClient::connect(old_address) {
            if client.handshake().is_ok() {
                let _ = client.set_read_timeout(Duration::from_secs(6));
                let body = shardmq_tests::TestMessage::new(format!("fenced-{refused}"));
                if let Ok(answer) = client.request(|b| {
                    shardmq_tests::send_request_body(b, TOPIC, 0, std::slice::from_ref(&body))
                }) {
                    let status = shardmq_tests::status_of(&answer).0;
                    assert_ne!(
                        status,
                        wire::Status::OK,
                        "the deposed master acknowledged a send"
                    );
                    answers.push(status);
                }
            }
        }
        refused += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("the deposed master answered: {answers:?}");
    assert!(
        !answers.is_empty(),
        "the deposed master answered nothing: the check proved nothing"
    );
    wait_until(SETTLE, "the old master to rejoin as a slave", || {
        (role_of(old_address)? == "slave").then_some(())
    });
    wait_until(SETTLE, "the old master back in the SyncStateSet", || {
        group
            .status()?
            .in_sync
            .contains(&before.master_id)
            .then_some(())
    });
    let acknowledged = load.finish();
    assert_all_stored(
        &acknowledged,
        &stored(&mut group.master_client()),
        "the new master",
    );
    let mut old = TestClient::connect(old_address).unwrap();
    old.handshake().unwrap();
    wait_until(
        SETTLE,
        "the old master to hold every acknowledged message",
        || {
            let bodies = stored(&mut old);
            acknowledged
                .iter()
                .all(|b| bodies.contains(b))
                .then_some(())
        },
    );
}

#[test]
fn losing_the_controller_leader_mid_failover_delays_it_and_losing_the_majority_stops_only_elections(
) {
    let mut group = HaGroup::start();
    create_topic(&mut group.master_client(), TOPIC, QUEUES);
    let before = group.status().unwrap();
    let load = Load::start(&group.namesrv_list, 2);
    wait_until(SETTLE, "200 acknowledged sends", || {
        (load.count() >= 200).then_some(())
    });
    // The master and the controller leader die together.
    let leader = before.leader as usize;
    assert!(leader >= 1);
    group.broker(before.master_id).kill9();
    let mut dead = group.controllers[leader - 1].take().unwrap();
    assert!(dead
        .signal_and_wait("KILL", shardmq_tests::STOP_TIMEOUT)
        .is_some());
    let killed_at = Instant::now();
    wait_until(
        SETTLE,
        "a new controller leader to elect a new master",
        || {
            let status = group.status()?;
            (status.leader != before.leader && status.master_id != before.master_id).then_some(())
        },
    );
    let at_election = load.count();
    wait_until(SETTLE, "writes on the new master", || {
        (load.count() > at_election + 50).then_some(())
    });
    let took = load.first_ack_after(killed_at).unwrap() - killed_at;
    eprintln!(
        "failover with the controller leader killed too: writes resumed after {} ms",
        took.as_millis()
    );
    let after = group.status().unwrap();

    // A second controller dies: no majority is left, no election can happen, and the master
    // keeps serving with the replicas it has.
    let second = (0..3)
        .find(|i| group.controllers[*i].is_some() && *i + 1 != after.leader as usize)
        .unwrap_or_else(|| (0..3).find(|i| group.controllers[*i].is_some()).unwrap());
    let mut dead_too = group.controllers[second].take().unwrap();
    assert!(dead_too
        .signal_and_wait("KILL", shardmq_tests::STOP_TIMEOUT)
        .is_some());
    let at_minority = load.count();
    wait_until(
        SETTLE,
        "writes to go on without a controller majority",
        || (load.count() > at_minority + 200).then_some(()),
    );
    let acknowledged = load.finish();
    let mut master = TestClient::connect(after.master_address.parse().unwrap()).unwrap();
    master.handshake().unwrap();
    assert_all_stored(&acknowledged, &stored(&mut master), "the master");

    // The dead controllers come back on their directories and recover the group from their
    // Raft logs and the others.
    let _revived: Vec<NamesrvProcess> = [dead, dead_too]
        .into_iter()
        .map(|mut process| {
            process.restart();
            process
        })
        .collect();
    for address in &group.controller_addresses {
        wait_until(SETTLE, "every controller to report the new master", || {
            let status = controller_group(address)?;
            (status.master_id == after.master_id && status.epoch == after.epoch).then_some(())
        });
    }
}

/// The first group one controller reports.
fn controller_group(address: &str) -> Option<GroupStatus> {
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

fn status_request(client: &mut TestClient) -> Option<shardmq_schema::VerifiedFrame> {
    client
        .request(|b| {
            let body =
                wire::ControllerStatusRequest::create(b, &wire::ControllerStatusRequestArgs {});
            (wire::Body::ControllerStatusRequest, body.as_union_value())
        })
        .ok()
}

#[test]
fn controllers_refuse_bad_settings_and_bad_requests() {
    // Settings that cannot work are refused at start.
    let port = free_port();
    for (args, expected) in [
        (
            vec![
                "--controller",
                "--controller-listen",
                "127.0.0.1:1",
                "--controller-peers",
                "1=127.0.0.1:2",
            ],
            "is 127.0.0.1:1",
        ),
        (
            vec![
                "--controller",
                "--controller-id",
                "4",
                "--controller-peers",
                "1=127.0.0.1:9878",
            ],
            "not among",
        ),
        (
            vec!["--controller", "--controller-peers", "1=nowhere"],
            "address",
        ),
    ] {
        let output = std::process::Command::new(shardmq_tests::binary_path("shardmq-namesrv"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(&args)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?} started");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    // One controller alone is a group of one: it leads itself.
    let dir = tempfile::tempdir().unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let _single = NamesrvProcess::start_with_args(&[
        "--controller",
        "--controller-listen",
        &address,
        "--controller-peers",
        &format!("1={address}"),
        "--controller-data-dir",
        dir.path().to_str().unwrap(),
    ]);
    wait_until(SETTLE, "the single controller to lead", || {
        let mut client = TestClient::connect(address.parse().unwrap()).ok()?;
        client.handshake().ok()?;
        let answer = status_request(&mut client)?;
        (answer
            .frame()
            .body_as_controller_status_response()?
            .leader_id()
            == 1)
            .then_some(())
    });
    let mut client = TestClient::connect(address.parse().unwrap()).unwrap();
    client.handshake().unwrap();
    // A heartbeat without names, or with id 0, is refused.
    for (broker, id) in [("", 1), ("broker-a", 0)] {
        let answer = client
            .request(|b| {
                let (cluster, broker) = (b.create_string("c"), b.create_string(broker));
                let body = wire::ControllerHeartbeatRequest::create(
                    b,
                    &wire::ControllerHeartbeatRequestArgs {
                        cluster_name: Some(cluster),
                        broker_name: Some(broker),
                        broker_id: id,
                        ..Default::default()
                    },
                );
                (
                    wire::Body::ControllerHeartbeatRequest,
                    body.as_union_value(),
                )
            })
            .unwrap();
        assert_eq!(
            shardmq_tests::status_of(&answer).0,
            wire::Status::INVALID_ARGUMENT
        );
    }
    // Requests a controller does not serve, and a Raft RPC it cannot parse.
    let answer = client
        .request(|b| {
            let body = wire::TopicListRequest::create(b, &wire::TopicListRequestArgs::default());
            (wire::Body::TopicListRequest, body.as_union_value())
        })
        .unwrap();
    assert_eq!(
        shardmq_tests::status_of(&answer).0,
        wire::Status::INVALID_ARGUMENT
    );
    let answer = client
        .request(|b| {
            let rpc = b.create_string("append");
            let payload = b.create_vector(b"{not json");
            let body = wire::ControllerRaftRequest::create(
                b,
                &wire::ControllerRaftRequestArgs {
                    rpc: Some(rpc),
                    payload: Some(payload),
                },
            );
            (wire::Body::ControllerRaftRequest, body.as_union_value())
        })
        .unwrap();
    assert_eq!(
        shardmq_tests::status_of(&answer).0,
        wire::Status::INVALID_ARGUMENT
    );
    // Garbage closes the connection; the controller goes on serving.
    let mut garbage = TestClient::connect(address.parse().unwrap()).unwrap();
    let _ = garbage.send_bytes(&[0, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8]);
    drop(garbage);
    let mut again = TestClient::connect(address.parse().unwrap()).unwrap();
    again.handshake().unwrap();
    // A broker's first heartbeat makes it the group's master, epoch 1.
    let answer = again
        .request(|b| {
            let (cluster, broker) = (b.create_string("c"), b.create_string("b"));
            let address = b.create_string("127.0.0.1:1");
            let ha = b.create_string("127.0.0.1:2");
            let body = wire::ControllerHeartbeatRequest::create(
                b,
                &wire::ControllerHeartbeatRequestArgs {
                    cluster_name: Some(cluster),
                    broker_name: Some(broker),
                    broker_id: 7,
                    address: Some(address),
                    ha_address: Some(ha),
                    ..Default::default()
                },
            );
            (
                wire::Body::ControllerHeartbeatRequest,
                body.as_union_value(),
            )
        })
        .unwrap();
    let group = answer
        .frame()
        .body_as_controller_heartbeat_response()
        .and_then(|r| r.group())
        .expect("a group");
    assert_eq!((group.master_id(), group.epoch()), (7, 1));
    assert_eq!(group.master_ha_address(), Some("127.0.0.1:2"));
}

#[test]
fn below_min_in_sync_replicas_a_master_stores_but_does_not_acknowledge() {
    let mut group = HaGroup::start_with(&["--min-in-sync-replicas", "2"]);
    let mut master = group.master_client();
    create_topic(&mut master, TOPIC, 1);
    let send = |client: &mut TestClient, body: &str| {
        let message = shardmq_tests::TestMessage::new(body.to_owned());
        let answer = client
            .request(|b| {
                shardmq_tests::send_request_body(b, TOPIC, 0, std::slice::from_ref(&message))
            })
            .unwrap();
        shardmq_tests::status_of(&answer).0
    };
    assert_eq!(send(&mut master, "three in sync"), wire::Status::OK);
    let status = group.status().unwrap();
    let slaves: Vec<i64> = (1..=3).filter(|id| *id != status.master_id).collect();
    for id in &slaves {
        group.broker(*id).kill9();
    }
    // The master drops the dead slaves from its set; once it is alone, sends are refused.
    let _ = master.set_read_timeout(Duration::from_secs(10));
    wait_until(SETTLE, "sends to be answered SLAVE_NOT_AVAILABLE", || {
        (send(&mut master, "alone") == wire::Status::SLAVE_NOT_AVAILABLE).then_some(())
    });
    let alone = group.status().unwrap();
    assert_eq!(
        alone.master_id, status.master_id,
        "a live master is not replaced"
    );
    assert_eq!(alone.in_sync, vec![status.master_id]);
    // One slave back in sync: two members again, sends acknowledged.
    group.broker(slaves[0]).restart();
    wait_until(SETTLE, "a send acknowledged again", || {
        (send(&mut master, "two in sync") == wire::Status::OK).then_some(())
    });
}
