//! Automatic failover with real processes (docs/replication.md, "Automatic failover"): three
//! name servers each running a controller (`--controller`, one Raft group), and three brokers
//! of one group in `--broker-role auto`. The controller makes the first broker master; when
//! the master is killed (or paused past the broker timeout) it elects a new one from the
//! SyncStateSet, and the old master rejoins as a slave.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.
//!
//! Size: one real-process test per failover behaviour, sharing the `HaGroup` helper.

mod ha_support;
mod reliability_support;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ha_support::*;
use reliability_support::create_topic;
use shardmq_schema::wire;
use shardmq_tests::{free_port, wait_until, NamesrvProcess, TestClient};

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
    // Each member, a follower too, reports which brokers are alive as the leader sees them.
    let survivors: Vec<i64> = (1..=3).filter(|id| *id != before.master_id).collect();
    for address in &group.controller_addresses {
        let cli = shardmq_tests::run_cli(
            &group.namesrv_list,
            &["--json", "controller", "status", "--controller", address],
        );
        assert!(
            cli.status.success(),
            "{}",
            String::from_utf8_lossy(&cli.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&cli.stdout).unwrap();
        assert_ne!(json["alive_from"], 0, "controller {address}: {json}");
        let alive: Vec<i64> = serde_json::from_value(json["groups"][0]["alive"].clone()).unwrap();
        assert_eq!(alive, survivors, "controller {address}: {json}");
    }

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
    let answer = first_heartbeat_on(&mut again, "b").unwrap();
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
    assert_eq!(send_one(&mut master, "three in sync"), wire::Status::OK);
    let status = group.status().unwrap();
    let slaves: Vec<i64> = (1..=3).filter(|id| *id != status.master_id).collect();
    for id in &slaves {
        group.broker(*id).kill9();
    }
    // The master drops the dead slaves from its set; once it is alone, sends are refused.
    let _ = master.set_read_timeout(Duration::from_secs(10));
    wait_until(SETTLE, "sends to be answered SLAVE_NOT_AVAILABLE", || {
        (send_one(&mut master, "alone") == wire::Status::SLAVE_NOT_AVAILABLE).then_some(())
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
        (send_one(&mut master, "two in sync") == wire::Status::OK).then_some(())
    });
}

#[test]
fn the_controller_elects_by_progress_then_election_priority_not_by_lowest_id() {
    // Equal progress (both slaves hold the whole log, of the same term): the election
    // priority decides, and it prefers the higher id here (broker N has priority 4 - N), so a
    // lowest-id election would pick the other slave.
    let mut group = HaGroup::start_each(&[], |id| {
        vec!["--election-priority".into(), (4 - id).to_string()]
    });
    let mut master = group.master_client();
    create_topic(&mut master, TOPIC, 1);
    for i in 0..20 {
        let body = format!("before the election {i}");
        assert_eq!(send_one(&mut master, &body), wire::Status::OK);
    }
    let before = group.status().unwrap();
    assert_eq!(before.in_sync.len(), 3, "every member in sync: {before:?}");
    // The slaves' next heartbeats carry the progress the sends made.
    std::thread::sleep(Duration::from_millis(1_500));
    let slaves: Vec<i64> = (1..=3).filter(|id| *id != before.master_id).collect();
    let expected = *slaves.iter().max().unwrap();
    group.broker(before.master_id).kill9();
    let after = wait_until(SETTLE, "a new master", || {
        let status = group.status()?;
        (status.master_id != before.master_id && status.master_id > 0).then_some(status)
    });
    assert_eq!(
        after.master_id, expected,
        "of slaves {slaves:?} at equal progress the one with the lowest election priority value is elected"
    );
    assert_eq!(after.epoch, before.epoch + 1);
}

#[test]
fn a_master_that_restarts_alone_stays_master_in_a_new_epoch_from_the_controller() {
    // A term's identity is its epoch, which only the controller hands out: a master that
    // starts again with no other member alive stays master, but in a new epoch, so that a
    // later election cannot make a term of the same epoch elsewhere.
    let mut group = HaGroup::start();
    let mut master = group.master_client();
    create_topic(&mut master, TOPIC, QUEUES);
    assert_eq!(send_one(&mut master, "first term"), wire::Status::OK);
    let before = group.status().unwrap();
    let slaves: Vec<i64> = (1..=3).filter(|id| *id != before.master_id).collect();
    for id in &slaves {
        group.broker(*id).kill9();
    }
    wait_until(SETTLE, "the dead slaves out of the SyncStateSet", || {
        let status = group.status()?;
        (status.in_sync == vec![before.master_id]).then_some(())
    });
    group.broker(before.master_id).kill9();
    group.broker(before.master_id).restart();
    let after = wait_until(SETTLE, "the master back", || {
        let status = group.status()?;
        (status.master_id == before.master_id && status.epoch != before.epoch).then_some(status)
    });
    assert_eq!(after.epoch, before.epoch + 1, "{after:?}");
    let mut master = connect_master(&group);
    let _ = master.set_read_timeout(Duration::from_secs(10));
    wait_until(SETTLE, "a send acknowledged in the new epoch", || {
        (send_one(&mut master, "second term") == wire::Status::OK).then_some(())
    });
    // The slaves come back as slaves of that epoch; the next election makes the one after.
    for id in &slaves {
        group.broker(*id).restart();
    }
    wait_until(SETTLE, "all three in sync again", || {
        let status = group.status()?;
        (status.in_sync.len() == 3).then_some(())
    });
    let whole = group.status().unwrap();
    assert_eq!(
        (whole.master_id, whole.epoch),
        (before.master_id, after.epoch)
    );
    group.broker(before.master_id).kill9();
    let elected = wait_until(SETTLE, "a new master", || {
        let status = group.status()?;
        (status.master_id != before.master_id && status.master_id > 0).then_some(status)
    });
    assert_eq!(elected.epoch, after.epoch + 1);
    let mut master = connect_master(&group);
    let bodies = stored(&mut master);
    for body in ["first term", "second term"] {
        assert!(
            bodies.contains(body.as_bytes()),
            "{body:?} is on the new master"
        );
    }
}

#[test]
fn a_controller_leader_cut_off_from_its_majority_answers_no_heartbeat_from_its_own_state() {
    let group = HaGroup::start();
    let before = group.status().unwrap();
    let leader = before.leader as usize;
    assert!(leader >= 1);
    let leader_address = group.controller_addresses[leader - 1].clone();
    // The master's own heartbeat, exactly as the leader has it: answering it needs no write,
    // so a leader could answer it from its own state alone.
    let (cluster_name, broker_name, master_address, master_ha, set, set_epoch) = {
        let mut client = TestClient::connect(leader_address.parse().unwrap()).unwrap();
        client.handshake().unwrap();
        let answer = status_request(&mut client).unwrap();
        let r = answer.frame().body_as_controller_status_response().unwrap();
        let g = r.groups().unwrap().get(0);
        let set: Vec<i64> = g.sync_state_set().unwrap().iter().collect();
        (
            g.cluster_name().unwrap().to_owned(),
            g.broker_name().unwrap().to_owned(),
            g.master_address().unwrap().to_owned(),
            g.master_ha_address().unwrap().to_owned(),
            set,
            g.sync_state_epoch(),
        )
    };
    assert!(set_epoch >= 1, "the election made the first set");
    let heartbeat = |address: &str| -> Option<(wire::Status, String)> {
        let mut client = TestClient::connect(address.parse().unwrap()).ok()?;
        client.handshake().ok()?;
        let _ = client.set_read_timeout(Duration::from_secs(10));
        let answer = client
            .request(|b| {
                let (cluster, broker) = (
                    b.create_string(&cluster_name),
                    b.create_string(&broker_name),
                );
                let (address, ha) = (
                    b.create_string(&master_address),
                    b.create_string(&master_ha),
                );
                let others: Vec<i64> = set
                    .iter()
                    .copied()
                    .filter(|id| *id != before.master_id)
                    .collect();
                let in_sync = b.create_vector(&others);
                let judged = b.create_vector(&others);
                let body = wire::ControllerHeartbeatRequest::create(
                    b,
                    &wire::ControllerHeartbeatRequestArgs {
                        cluster_name: Some(cluster),
                        broker_name: Some(broker),
                        broker_id: before.master_id,
                        address: Some(address),
                        ha_address: Some(ha),
                        epoch: before.epoch,
                        in_sync: Some(in_sync),
                        is_master: true,
                        judged_against: Some(judged),
                        judged_against_set_epoch: set_epoch,
                        ..Default::default()
                    },
                );
                (
                    wire::Body::ControllerHeartbeatRequest,
                    body.as_union_value(),
                )
            })
            .ok()?;
        let (status, message) = shardmq_tests::status_of(&answer);
        Some((status, message.unwrap_or_default()))
    };
    let answered = heartbeat(&leader_address).expect("an answer");
    assert_eq!(answered.0, wire::Status::OK, "{answered:?}");

    // Both followers paused: the leader still believes it leads, but cannot confirm it.
    let followers: Vec<u32> = (0..3)
        .filter(|i| *i + 1 != leader)
        .map(|i| group.controllers[i].as_ref().unwrap().pid())
        .collect();
    for pid in &followers {
        shardmq_tests::signal(*pid, "STOP");
    }
    let cut_off = heartbeat(&leader_address).expect("an answer");
    for pid in &followers {
        shardmq_tests::signal(*pid, "CONT");
    }
    assert_ne!(cut_off.0, wire::Status::OK, "{cut_off:?}");
    assert!(
        cut_off.1.contains("cannot confirm it leads a majority"),
        "{cut_off:?}"
    );
    // With the majority back, heartbeats are answered again (by whichever node leads now).
    wait_until(SETTLE, "heartbeats answered again", || {
        heartbeat(&leader_address).filter(|(status, _)| *status == wire::Status::OK)
    });
}

/// A broker's first heartbeat for group `c/broker` as broker 7 (client address 127.0.0.1:1, HA
/// 127.0.0.1:2): it registers the group and makes 7 its master (Raft writes).
fn first_heartbeat_on(
    client: &mut TestClient,
    broker: &str,
) -> Result<shardmq_schema::VerifiedFrame, shardmq_tests::ClientError> {
    client.request(|b| {
        let (cluster, broker) = (b.create_string("c"), b.create_string(broker));
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
}

/// [`first_heartbeat_on`] a new connection to `controller`: the answer's status.
fn first_heartbeat(controller: &str, broker: &str) -> Option<wire::Status> {
    let mut client = TestClient::connect(controller.parse().ok()?).ok()?;
    client.handshake().ok()?;
    let _ = client.set_read_timeout(Duration::from_secs(10));
    let answer = first_heartbeat_on(&mut client, broker).ok()?;
    Some(shardmq_tests::status_of(&answer).0)
}

#[test]
fn controller_members_are_added_and_removed_at_run_time() {
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let addresses: Vec<String> = (0..4)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let peers = (0..3)
        .map(|i| format!("{}={}", i + 1, addresses[i]))
        .collect::<Vec<_>>()
        .join(",");
    let start = |i: usize, join: bool| {
        let id = (i + 1).to_string();
        let mut args = vec![
            "--controller",
            "--controller-id",
            &id,
            "--controller-listen",
            &addresses[i],
            "--controller-data-dir",
            dirs[i].path().to_str().unwrap(),
        ];
        if join {
            args.push("--controller-join");
        } else {
            args.extend(["--controller-peers", &peers]);
        }
        NamesrvProcess::start_with_args(&args)
    };
    let mut nodes: Vec<Option<NamesrvProcess>> = (0..3).map(|i| Some(start(i, false))).collect();
    let status_at = |address: &str| -> Option<(u64, Vec<String>, Vec<String>)> {
        let mut client = TestClient::connect(address.parse().unwrap()).ok()?;
        client.handshake().ok()?;
        let answer = status_request(&mut client)?;
        let r = answer.frame().body_as_controller_status_response()?;
        let members = r.members()?.iter().map(str::to_owned).collect();
        let groups = r
            .groups()?
            .iter()
            .map(|g| g.broker_name().unwrap_or_default().to_owned())
            .collect();
        Some((r.leader_id(), members, groups))
    };
    wait_until(SETTLE, "a controller leader", || {
        status_at(&addresses[0]).filter(|(leader, _, _)| *leader > 0)
    });
    wait_until(SETTLE, "the first group to be registered", || {
        (first_heartbeat(&addresses[0], "b1")? == wire::Status::OK).then_some(())
    });

    // Node 4 starts to join, and an operator adds it through a follower or the leader alike.
    nodes.push(Some(start(3, true)));
    let cli = |args: &[&str]| {
        let output = shardmq_tests::run_cli("127.0.0.1:1", args);
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (ok, stdout, stderr) = cli(&[
        "controller",
        "add-member",
        "--id",
        "4",
        "--address",
        &addresses[3],
        "--controller",
        &addresses[1],
    ]);
    assert!(ok, "add-member: {stdout} {stderr}");
    assert!(stdout.contains(&format!("4={}", addresses[3])), "{stdout}");
    assert!(
        !stdout.contains("learner"),
        "a voter, not a learner: {stdout}"
    );
    // The new member holds the group's state, and sees itself a member.
    wait_until(
        SETTLE,
        "node 4 to hold the group and the membership",
        || {
            let (_, members, groups) = status_at(&addresses[3])?;
            (members.len() == 4 && groups.contains(&"b1".to_owned())).then_some(())
        },
    );

    // Refusals: a bad id, another address for a member, a node that is not a voter.
    let (ok, _, stderr) = cli(&[
        "controller",
        "add-member",
        "--id",
        "2",
        "--address",
        "127.0.0.1:1",
        "--controller",
        &addresses[0],
    ]);
    assert!(!ok && stderr.contains("already a member"), "{stderr}");
    let (ok, _, stderr) = cli(&[
        "controller",
        "remove-member",
        "--id",
        "9",
        "--controller",
        &addresses[0],
    ]);
    assert!(!ok && stderr.contains("not a voter"), "{stderr}");

    // Node 1 leaves the group; then node 2 dies: 3 and 4 are a majority of {2, 3, 4} and still
    // commit a new group, which needs node 4's vote.
    let (ok, stdout, stderr) = cli(&[
        "controller",
        "remove-member",
        "--id",
        "1",
        "--controller",
        &addresses[2],
    ]);
    assert!(ok, "remove-member: {stdout} {stderr}");
    assert!(!stdout.contains(&format!("1={}", addresses[0])), "{stdout}");
    wait_until(SETTLE, "the membership without node 1", || {
        let (leader, members, _) = status_at(&addresses[2])?;
        (members.len() == 3 && leader != 1 && leader > 0).then_some(())
    });
    for i in [0, 1] {
        let mut node = nodes[i].take().unwrap();
        assert!(node
            .signal_and_wait("KILL", shardmq_tests::STOP_TIMEOUT)
            .is_some());
    }
    wait_until(SETTLE, "a group registered by nodes 3 and 4 alone", || {
        [&addresses[2], &addresses[3]]
            .iter()
            .find_map(|a| (first_heartbeat(a, "b2")? == wire::Status::OK).then_some(()))
    });
}
