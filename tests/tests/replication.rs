//! Master/slave replication with real processes (docs/replication.md): a slave started with
//! `--broker-role slave --ha-master` copies its master's CommitLog and topics, serves pulls of
//! every acknowledged message at the same queue offsets, copies consumer offsets, refuses
//! sends, and still serves them after the master is killed with SIGKILL; under `sync-master` a send is acknowledged only once
//! the slave holds it (so a SIGKILL of the master right after loses nothing on the slave), and
//! without a slave it answers SLAVE_NOT_AVAILABLE.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.
//!
//! Size: one real-process test per replication behaviour, sharing the `Group` helper.

mod reliability_support;

use std::time::Duration;

use reliability_support::{assert_verify_clean, create_topic, pull_queue, send_batch, QueueEnd};
use shardmq_schema::wire;
use shardmq_tests::{
    commit_offset, committed_offset, send_request_body, status_of, wait_until, BrokerProcess,
    NamesrvProcess, TestMessage,
};

const TOPIC: &str = "Replicated";
const QUEUES: u32 = 4;
/// Longest the slave may take to catch up here (loopback, a few hundred KiB).
const CATCH_UP: Duration = Duration::from_secs(20);

use shardmq_tests::free_port;

/// A name server and the directories and HA address of a master/slave pair.
struct Group {
    namesrv: NamesrvProcess,
    master_dir: tempfile::TempDir,
    slave_dir: tempfile::TempDir,
    ha: String,
}

impl Group {
    fn new() -> Group {
        Group {
            // A dead broker leaves the routes 2 s after its last registration (brokers here
            // register every 500 ms).
            namesrv: NamesrvProcess::start_with_args(&[
                "--broker-timeout-ms",
                "2000",
                "--scan-interval-ms",
                "100",
            ]),
            master_dir: tempfile::tempdir().unwrap(),
            slave_dir: tempfile::tempdir().unwrap(),
            ha: format!("127.0.0.1:{}", free_port()),
        }
    }

    fn master(&self, role: &str, extra: &[&str]) -> BrokerProcess {
        let namesrv = self.namesrv.addr().to_string();
        let mut args = vec![
            "--namesrv",
            &namesrv,
            "--broker-role",
            role,
            "--ha-listen",
            &self.ha,
            "--register-interval-ms",
            "500",
        ];
        args.extend_from_slice(extra);
        BrokerProcess::start(self.master_dir.path(), &args)
    }

    fn slave(&self, extra: &[&str]) -> BrokerProcess {
        let namesrv = self.namesrv.addr().to_string();
        let mut args = vec![
            "--namesrv",
            &namesrv,
            "--broker-role",
            "slave",
            "--broker-id",
            "1",
            "--ha-master",
            &self.ha,
            "--register-interval-ms",
            "500",
        ];
        args.extend_from_slice(extra);
        BrokerProcess::start(self.slave_dir.path(), &args)
    }
}

/// One storage shard's replication figures from `broker status`.
#[derive(Debug)]
struct ShardStatus {
    peer: String,
    epoch: u64,
    lag_bytes: i64,
    lag_ms: i64,
    connected: bool,
}

/// `(role, replica_lag_bytes, per shard)` from `broker status`.
fn replication_status(client: &mut shardmq_tests::TestClient) -> (String, i64, Vec<ShardStatus>) {
    let answer = shardmq_tests::broker_status(client).expect("an answer to BrokerStatusRequest");
    let r = answer
        .frame()
        .body_as_broker_status_response()
        .expect("a body");
    let shards = r
        .replication()
        .iter()
        .flat_map(|v| v.iter())
        .map(|s| ShardStatus {
            peer: s.peer().unwrap_or_default().to_owned(),
            epoch: s.epoch(),
            lag_bytes: s.lag_bytes(),
            lag_ms: s.lag_ms(),
            connected: s.connected(),
        })
        .collect();
    (
        r.role().unwrap_or_default().to_owned(),
        r.replica_lag_bytes(),
        shards,
    )
}

/// Small segments: the copy crosses segment rollovers.
const SMALL_SEGMENTS: [&str; 4] = ["--segment-bytes", "1048576", "--max-message-bytes", "65536"];

#[test]
fn a_slave_copies_its_master_and_serves_every_acknowledged_message_after_the_master_dies() {
    let group = Group::new();
    let mut master = group.master("async-master", &SMALL_SEGMENTS);
    let slave = group.slave(&SMALL_SEGMENTS);
    let mut client = master.client();
    create_topic(&mut client, TOPIC, QUEUES);
    let mut sent: Vec<Vec<Vec<u8>>> = vec![Vec::new(); QUEUES as usize];
    for round in 0..60 {
        for queue in 0..QUEUES {
            let batch: Vec<TestMessage> = (0..5)
                .map(|i| {
                    let mut body = format!("r{round}-q{queue}-m{i}|").into_bytes();
                    body.resize(900 + (round * 37 + i * 11) % 700, b'a' + (i as u8));
                    TestMessage::new(body)
                })
                .collect();
            let offsets = send_batch(&mut client, TOPIC, queue as i32, &batch);
            assert_eq!(offsets[0], sent[queue as usize].len() as u64);
            sent[queue as usize].extend(batch.into_iter().map(|m| m.body));
        }
    }
    drop(client);

    // The slave refuses sends (its log is its master's copy).
    let mut on_slave = slave.client();
    let refused = on_slave
        .request(|b| send_request_body(b, TOPIC, 0, &[TestMessage::new("to the slave")]))
        .expect("an answer from the slave");
    assert_eq!(
        status_of(&refused).0,
        wire::Status::SERVICE_NOT_AVAILABLE,
        "{:?}",
        status_of(&refused)
    );

    // It catches up: every queue, every message, in order.
    let all_copied = |client: &mut shardmq_tests::TestClient| {
        (0..QUEUES).all(|queue| {
            let (records, end) = pull_queue(client, TOPIC, queue as i32);
            end == QueueEnd::End && records.len() == sent[queue as usize].len()
        })
    };
    wait_until(CATCH_UP, "the slave to hold every message", || {
        all_copied(&mut on_slave).then_some(())
    });

    // A consumer group's committed offset reaches the slave (copied every 10 s), so a group
    // that moves there resumes near its position instead of from the start.
    commit_offset(&mut master.client(), "Mover", TOPIC, 2, 123);
    wait_until(CATCH_UP, "the slave to hold the group's offset", || {
        (committed_offset(&mut on_slave, "Mover", TOPIC, 2) == Some(123)).then_some(())
    });
    // More offsets than one page of the copy (4,096 rows): those past the first page reach the
    // slave too.
    let mut on_master = master.client();
    for group in 0..5_000 {
        commit_offset(&mut on_master, &format!("Page-{group:04}"), TOPIC, 1, 7);
    }
    wait_until(CATCH_UP, "the slave to hold every page of offsets", || {
        ["Page-0000", "Page-4095", "Page-4096", "Page-4999"]
            .iter()
            .all(|group| committed_offset(&mut on_slave, group, TOPIC, 1) == Some(7))
            .then_some(())
    });

    // `broker status` says who is who, and that the slave has everything: per storage shard,
    // the same term on both sides, no lag in bytes or ms, the peer connected.
    wait_until(CATCH_UP, "the master to report no lag", || {
        let on_master = replication_status(&mut master.client());
        (on_master.0 == "async-master"
            && on_master.1 == 0
            && on_master
                .2
                .iter()
                .all(|s| s.lag_bytes == 0 && s.lag_ms == 0 && s.connected))
        .then_some(())
    });
    let on_master = replication_status(&mut master.client());
    wait_until(CATCH_UP, "the slave to report no lag", || {
        let on_slave_status = replication_status(&mut on_slave);
        (on_slave_status.0 == "slave"
            && on_slave_status
                .2
                .iter()
                .all(|s| s.lag_bytes == 0 && s.connected))
        .then_some(())
    });
    let on_slave_status = replication_status(&mut on_slave);
    assert_eq!(on_master.2.len(), on_slave_status.2.len());
    for (m, s) in on_master.2.iter().zip(&on_slave_status.2) {
        assert!(m.epoch >= 1, "a master begins a term as it starts: {m:?}");
        assert_eq!(m.epoch, s.epoch, "the slave copies the master's term");
        assert_eq!(s.peer, group.ha, "the slave names its master's HA address");
        assert!(!m.peer.is_empty(), "the master names its slave");
    }

    // The master dies; the slave still serves what was acknowledged, byte for byte.
    master.kill9();
    for queue in 0..QUEUES {
        let (records, end) = pull_queue(&mut on_slave, TOPIC, queue as i32);
        assert_eq!(end, QueueEnd::End);
        let bodies: Vec<&Vec<u8>> = records.iter().map(|r| &r.body).collect();
        assert_eq!(
            bodies,
            sent[queue as usize].iter().collect::<Vec<_>>(),
            "queue {queue} on the slave after the master died"
        );
        for (offset, record) in records.iter().enumerate() {
            assert_eq!(record.queue_offset, offset as u64, "queue {queue}");
        }
    }

    // Through the client library and the name server: once the dead master leaves the routes,
    // reads go to the slave, and the group resumes at the offset it committed on the master.
    let namesrv = group.namesrv.addr().to_string();
    let master_addr = master.addr().to_string();
    wait_until(
        CATCH_UP,
        "the name server to route reads to the slave only",
        || {
            let route = shardmq_tests::run_cli(&namesrv, &["--json", "topic", "route", TOPIC]);
            let text = String::from_utf8_lossy(&route.stdout).into_owned();
            (route.status.success()
                && !text.contains(&master_addr)
                && text.contains(&slave.addr().to_string()))
            .then_some(())
        },
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (resumed_at, bodies) = runtime.block_on(async {
        let consumer = shardmq_client::PullConsumer::builder()
            .namesrv(&namesrv)
            .group("Mover")
            .build()
            .await
            .expect("a pull consumer");
        let queue = consumer
            .queues(TOPIC)
            .await
            .expect("the topic's queues from the slave")
            .into_iter()
            .find(|q| q.queue_id == 2)
            .expect("queue 2");
        let resumed_at = consumer
            .committed_offset(&queue)
            .await
            .expect("the committed offset");
        let pulled = consumer
            .pull(&queue, resumed_at.unwrap_or(0), 32)
            .await
            .expect("a pull from the slave");
        let bodies: Vec<Vec<u8>> = pulled.messages.iter().map(|m| m.body.to_vec()).collect();
        consumer.shutdown().await;
        (resumed_at, bodies)
    });
    assert_eq!(
        resumed_at,
        Some(123),
        "the group's offset, copied from the master"
    );
    assert_eq!(
        bodies,
        sent[2][123..155].to_vec(),
        "the group continues on the slave where it was"
    );
}

#[test]
fn role_settings_that_cannot_work_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for (args, expected) in [
        (
            vec!["--broker-role", "slave", "--broker-id", "1"],
            "ha_master",
        ),
        (
            vec!["--broker-role", "slave", "--ha-master", "127.0.0.1:1"],
            "broker_id above 0",
        ),
        (vec!["--broker-id", "2"], "broker_id 0"),
        (
            vec!["--broker-role", "auto", "--broker-id", "1"],
            "controller addresses",
        ),
        (
            vec!["--broker-role", "auto", "--controller", "127.0.0.1:1"],
            "above 0",
        ),
        (vec!["--broker-role", "leader"], "not async-master"),
    ] {
        let mut all = vec!["--listen", "127.0.0.1:0", "--data-dir"];
        let data = dir.path().to_str().unwrap();
        all.push(data);
        all.extend(args.iter().copied());
        let output = std::process::Command::new(shardmq_tests::binary_path("shardmq-broker"))
            .args(&all)
            .output()
            .expect("run the broker");
        assert!(!output.status.success(), "{args:?} started");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn a_sync_master_acknowledges_only_what_its_slave_holds() {
    let group = Group::new();
    let mut master = group.master("sync-master", &[]);
    let mut client = master.client();
    create_topic(&mut client, TOPIC, 1);
    // No slave yet: stored, but not replicated.
    let alone = client
        .request(|b| send_request_body(b, TOPIC, 0, &[TestMessage::new("alone")]))
        .expect("an answer");
    assert_eq!(
        status_of(&alone).0,
        wire::Status::SLAVE_NOT_AVAILABLE,
        "{:?}",
        status_of(&alone)
    );

    let slave = group.slave(&[]);
    // Once the slave replicates, sends are acknowledged OK.
    wait_for_sync_replication(&mut client);
    let mut acknowledged = Vec::new();
    for i in 0..200 {
        let body = format!("sync-{i}").into_bytes();
        let response = client
            .request(|b| send_request_body(b, TOPIC, 0, &[TestMessage::new(body.clone())]))
            .expect("an answer");
        assert_eq!(status_of(&response).0, wire::Status::OK, "send {i}");
        acknowledged.push(body);
    }
    // Killed right after the last acknowledgement: the slave already holds every message.
    master.kill9();
    let (records, end) = pull_queue(&mut slave.client(), TOPIC, 0);
    assert_eq!(end, QueueEnd::End);
    let on_slave: Vec<&Vec<u8>> = records
        .iter()
        .map(|r| &r.body)
        .filter(|b| b.starts_with(b"sync-"))
        .collect();
    assert_eq!(on_slave, acknowledged.iter().collect::<Vec<_>>());
}

/// `answer` is INVALID_ARGUMENT with a message that contains `names`.
fn refused_naming(answer: &shardmq_schema::VerifiedFrame, what: &str, names: &str) {
    let (status, message) = status_of(answer);
    assert_eq!(
        status,
        wire::Status::INVALID_ARGUMENT,
        "{what}: {message:?}"
    );
    assert!(
        message.as_deref().unwrap_or_default().contains(names),
        "{what}: {message:?}"
    );
}

#[test]
fn replica_joins_and_pulls_that_cannot_be_served_are_refused_and_harm_nothing() {
    let group = Group::new();
    let master = group.master("async-master", &[]);
    let mut client = master.client();
    create_topic(&mut client, TOPIC, 1);
    send_batch(&mut client, TOPIC, 0, &[TestMessage::new("kept")]);
    let join = |client: &mut shardmq_tests::TestClient,
                cluster: &str,
                broker: &str,
                broker_id: i64,
                shards: u32,
                end: u64| {
        client
            .request(|b| {
                let (cluster, broker) = (b.create_string(cluster), b.create_string(broker));
                let body = wire::ReplicaJoinRequest::create(
                    b,
                    &wire::ReplicaJoinRequestArgs {
                        cluster_name: Some(cluster),
                        broker_name: Some(broker),
                        broker_id,
                        storage_shards: shards,
                        storage_shard: 0,
                        end,
                        ..Default::default()
                    },
                );
                (wire::Body::ReplicaJoinRequest, body.as_union_value())
            })
            .expect("an answer")
    };
    let replica_pull_as = |client: &mut shardmq_tests::TestClient,
                           broker_id: i64,
                           shard: u32,
                           from: u64,
                           epoch: u64| {
        client
            .request(|b| {
                let body = wire::ReplicaPullRequest::create(
                    b,
                    &wire::ReplicaPullRequestArgs {
                        storage_shard: shard,
                        from,
                        max_bytes: 1 << 20,
                        suspend_timeout_ms: 0,
                        epoch,
                        broker_id,
                        ..Default::default()
                    },
                );
                (wire::Body::ReplicaPullRequest, body.as_union_value())
            })
            .expect("an answer")
    };
    // Pulls as broker 1, which joins below.
    let replica_pull =
        |client: &mut shardmq_tests::TestClient, shard: u32, from: u64, epoch: u64| {
            replica_pull_as(client, 1, shard, from, epoch)
        };
    // On the HA address as on the client address: the ordinary protocol and its checks.
    let mut ha = shardmq_tests::TestClient::connect(group.ha.parse().unwrap()).unwrap();
    ha.handshake().unwrap();
    for (cluster, broker, id, shards, what, names) in [
        (
            "OtherCluster",
            "broker-a",
            1,
            1,
            "a slave of another cluster",
            "OtherCluster",
        ),
        (
            "DefaultCluster",
            "broker-b",
            1,
            1,
            "a slave of another broker name",
            "broker-b",
        ),
        (
            "DefaultCluster",
            "broker-a",
            0,
            1,
            "a master's broker id",
            "above 0",
        ),
        (
            "DefaultCluster",
            "broker-a",
            1,
            3,
            "another storage shard count",
            "3",
        ),
    ] {
        let answer = join(&mut ha, cluster, broker, id, shards, 0);
        let (status, message) = status_of(&answer);
        let message = message.unwrap_or_default();
        assert_eq!(status, wire::Status::INVALID_ARGUMENT, "{what}: {message}");
        assert!(message.contains(names), "{what}: {message}");
    }
    // A good join learns the term; a slave that claims more than the master holds (with no
    // term in common past the start) is told to cut everything.
    let answer = join(&mut ha, "DefaultCluster", "broker-a", 1, 1, 1 << 40);
    assert_eq!(status_of(&answer).0, wire::Status::OK);
    let joined = answer
        .frame()
        .body_as_replica_join_response()
        .expect("a body");
    let epoch = joined.epoch();
    assert!(epoch >= 1);
    assert!(joined.master_end() > 0);
    assert_eq!(joined.consistent_end(), 0);
    for (shard, from, epoch, what, names) in [
        (
            7,
            0,
            epoch,
            "a storage shard the master lacks",
            "storage shard",
        ),
        (
            0,
            1 << 40,
            epoch,
            "an offset past the master's end",
            "outside this CommitLog",
        ),
        (0, 0, epoch + 1, "another term", "term"),
    ] {
        refused_naming(&replica_pull(&mut ha, shard, from, epoch), what, names);
    }
    // Acknowledgements count only from the connection a slave joined on: a broker id that
    // did not join there, and the joined one on another connection (here the client port),
    // are refused and counted for nothing.
    for (client, broker_id, what) in [
        (
            &mut ha,
            2,
            "a broker id that did not join on this connection",
        ),
        (&mut client, 1, "the joined broker id on another connection"),
    ] {
        let answer = replica_pull_as(client, broker_id, 0, 0, epoch);
        refused_naming(&answer, what, "join first");
    }
    // Garbage on the HA port is answered or closed, as on the client port.
    let mut garbage = shardmq_tests::TestClient::connect(group.ha.parse().unwrap()).unwrap();
    let _ = garbage.send_bytes(&[0, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8]);
    drop(garbage);
    // A good pull from the start still gets the stored bytes.
    let answer = replica_pull(&mut ha, 0, 0, epoch);
    assert_eq!(status_of(&answer).0, wire::Status::OK);
    let body = answer
        .frame()
        .body_as_replica_pull_response()
        .expect("a body");
    assert_eq!(body.epoch(), epoch);
    assert!(
        body.data().is_some_and(|d| !d.is_empty()),
        "no bytes served"
    );
    let (records, _) = pull_queue(&mut master.client(), TOPIC, 0);
    assert_eq!(records.len(), 1, "the master keeps serving");

    // A slave refuses to be replicated from.
    let slave = group.slave(&[]);
    let answer = replica_pull(&mut slave.client(), 0, 0, epoch);
    assert_eq!(status_of(&answer).0, wire::Status::SERVICE_NOT_AVAILABLE);
}

/// Cuts `shard_dir`'s CommitLog at `offset`, as a master that lost its tail in a power loss
/// would find it: the append journal (page cache) is lost with it.
fn cut_commitlog(shard_dir: &std::path::Path, offset: u64) {
    match std::fs::remove_file(shard_dir.join("journal")) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => panic!("removing the journal: {e}"),
        _ => {}
    }
    let commitlog = shard_dir.join("commitlog");
    let mut segments: Vec<(u64, std::path::PathBuf)> = std::fs::read_dir(&commitlog)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let base = e.file_name().to_str()?.parse::<u64>().ok()?;
            Some((base, e.path()))
        })
        .collect();
    segments.sort();
    for (base, path) in segments {
        if base >= offset {
            std::fs::remove_file(&path).unwrap();
        } else {
            let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            if file.metadata().unwrap().len() > offset - base {
                file.set_len(offset - base).unwrap();
            }
        }
    }
}

#[test]
fn a_slave_holding_bytes_its_master_lost_cuts_them_and_follows_the_new_term() {
    let group = Group::new();
    let mut master = group.master("async-master", &SMALL_SEGMENTS);
    let mut client = master.client();
    create_topic(&mut client, TOPIC, 1);
    let body = |phase: &str, i: usize| format!("{phase}-{i}-{}", "x".repeat(2000)).into_bytes();
    for i in 0..300 {
        send_batch(&mut client, TOPIC, 0, &[TestMessage::new(body("a", i))]);
    }
    let lost_from = {
        let (records, _) = pull_queue(&mut client, TOPIC, 0);
        records.last().unwrap().end()
    };
    for i in 0..200 {
        send_batch(&mut client, TOPIC, 0, &[TestMessage::new(body("b", i))]);
    }
    drop(client);
    let slave = group.slave(&SMALL_SEGMENTS);
    let slave_pid = slave.pid();
    let mut on_slave = slave.client();
    wait_until(CATCH_UP, "the slave to copy both phases", || {
        let (records, _) = pull_queue(&mut on_slave, TOPIC, 0);
        (records.len() == 500).then_some(())
    });
    let first_term = replication_status(&mut on_slave).2[0].epoch;

    // The master dies and comes back without the "b" messages (its disk lost them): it begins
    // a new term where its log now ends, and writes "c" messages over the same offsets.
    master.kill9();
    cut_commitlog(&master.data_dir().join("shard-0"), lost_from);
    master.restart();
    let mut client = master.client();
    let (records, _) = pull_queue(&mut client, TOPIC, 0);
    assert_eq!(records.len(), 300, "the master lost its tail");
    for i in 0..100 {
        send_batch(&mut client, TOPIC, 0, &[TestMessage::new(body("c", i))]);
    }

    // The slave finds that its term-1 bytes past the cut were never the master's, cuts them
    // (restarting in its own process, on the same address), and copies the new term.
    let expected = queue_contents(&mut client);
    assert_eq!(expected.len(), 400);
    wait_until_holds(
        &slave,
        &expected,
        "the slave to hold exactly the master's log",
    );
    assert_eq!(
        slave.pid(),
        slave_pid,
        "the slave restarted in its own process"
    );
    let status = replication_status(&mut slave.client());
    assert!(status.2[0].epoch > first_term, "{:?}", status.2);
    assert!(
        slave
            .log_lines()
            .iter()
            .any(|l| l.contains("holds CommitLog bytes its master does not")),
        "the slave says why it cut its log"
    );
    let mut slave = slave;
    slave.stop();
    assert_verify_clean(group.slave_dir.path(), "of the cut slave");
}

/// One message of a queue: (queue offset, physical offset, body).
type QueueEntry = (u64, u64, Vec<u8>);

/// Sends SIGSTOP or SIGCONT to `pid`.
fn pause_process(pid: u32, paused: bool) {
    let signal = if paused { "-STOP" } else { "-CONT" };
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {signal} {pid}");
}

/// A sync master and its slave with `phases` of acknowledged sends; the master then dies and
/// comes back without the last ones (a power loss under async flush cut its CommitLog where
/// the first phase ended) while its slave is paused. Returns the master, the paused slave,
/// what the slave holds (every acknowledged message) and where the master's log was cut.
fn sync_master_that_lost_acknowledged_messages(
    group: &Group,
    master_args: &[&str],
) -> (BrokerProcess, BrokerProcess, Vec<QueueEntry>, u64) {
    let mut master = group.master("sync-master", master_args);
    let slave = group.slave(&SMALL_SEGMENTS);
    let mut client = master.client();
    create_topic(&mut client, TOPIC, 1);
    wait_for_sync_replication(&mut client);
    let body = |phase: &str, i: usize| format!("{phase}-{i}-{}", "x".repeat(2000)).into_bytes();
    let mut send_ok = |body: Vec<u8>| {
        let answer = client
            .request(|b| send_request_body(b, TOPIC, 0, &[TestMessage::new(body.clone())]))
            .expect("an answer");
        assert_eq!(
            status_of(&answer).0,
            wire::Status::OK,
            "{:?}",
            status_of(&answer)
        );
    };
    for i in 0..200 {
        send_ok(body("a", i));
    }
    let lost_from = {
        let (records, _) = pull_queue(&mut master.client(), TOPIC, 0);
        records.last().unwrap().end()
    };
    for i in 0..300 {
        send_ok(body("b", i));
    }
    // (Every probe of `wait_for_sync_replication` is stored, acknowledged or not.)
    let held = queue_contents(&mut master.client());
    assert!(held.len() > 500);
    wait_until_holds(
        &slave,
        &held,
        "the slave to serve every acknowledged message",
    );
    pause_process(slave.pid(), true);
    master.kill9();
    cut_commitlog(&master.data_dir().join("shard-0"), lost_from);
    master.restart();
    (master, slave, held, lost_from)
}

#[test]
fn a_sync_master_that_lost_acknowledged_messages_takes_them_back_from_its_slave_before_writing() {
    let group = Group::new();
    let mut master_args = SMALL_SEGMENTS.to_vec();
    master_args.extend(["--lost-tail-wait-ms", "60000"]);
    let (mut master, slave, held, _) =
        sync_master_that_lost_acknowledged_messages(&group, &master_args);
    let slave_pid = slave.pid();

    // Until a slave of its last term has joined, the master writes nothing (a write would
    // land where the lost messages were): sends are refused, not stored.
    let mut client = master.client();
    let refused = client
        .request(|b| send_request_body(b, TOPIC, 0, &[TestMessage::new("too-early")]))
        .expect("an answer");
    let (status, message) = status_of(&refused);
    let message = message.unwrap_or_default();
    assert_eq!(status, wire::Status::SERVICE_NOT_AVAILABLE, "{message}");
    assert!(
        message.contains("return"),
        "the refusal says why: {message}"
    );

    // The slave comes back: it returns the bytes the master lost instead of cutting them.
    pause_process(slave_pid, false);
    wait_until_holds(
        &master,
        &held,
        "the master to hold every acknowledged message again",
    );
    wait_for_sync_replication(&mut client);
    let after = client
        .request(|b| send_request_body(b, TOPIC, 0, &[TestMessage::new("after")]))
        .expect("an answer");
    assert_eq!(status_of(&after).0, wire::Status::OK);
    let expected = queue_contents(&mut client);
    assert_eq!(&expected[..held.len()], &held[..]);
    assert_eq!(expected.last().unwrap().2, b"after");
    wait_until_holds(&slave, &expected, "the slave to copy the new term");
    assert_eq!(slave.pid(), slave_pid, "the slave did not restart (no cut)");
    assert!(
        !slave
            .log_lines()
            .iter()
            .any(|l| l.contains("holds CommitLog bytes its master does not")),
        "the slave cut nothing"
    );
    assert!(
        master
            .log_lines()
            .iter()
            .any(|l| l.contains("returned this master's lost bytes")),
        "the master says what it took back"
    );
    let mut slave = slave;
    master.stop();
    slave.stop();
    assert_verify_clean(
        group.master_dir.path(),
        "of the master that took its tail back",
    );
    assert_verify_clean(group.slave_dir.path(), "of the slave that returned it");
}

#[test]
fn a_slave_keeps_acknowledged_messages_its_sync_master_lost_and_wrote_past() {
    let group = Group::new();
    let mut master_args = SMALL_SEGMENTS.to_vec();
    master_args.extend(["--lost-tail-wait-ms", "0"]);
    let (mut master, slave, held, lost_from) =
        sync_master_that_lost_acknowledged_messages(&group, &master_args);
    let slave_pid = slave.pid();
    // Told not to wait, the master writes at once where the lost messages were (stored, but
    // not acknowledged OK: no slave holds them).
    let mut client = master.client();
    let alone = client
        .request(|b| send_request_body(b, TOPIC, 0, &[TestMessage::new("alone")]))
        .expect("an answer");
    assert_eq!(status_of(&alone).0, wire::Status::SLAVE_NOT_AVAILABLE);
    let on_master = queue_contents(&mut client);
    assert!(on_master.last().unwrap().1 == lost_from, "{on_master:?}");

    // The slave must not cut acknowledged messages: it keeps them, stops replicating and says
    // why.
    pause_process(slave_pid, false);
    wait_until(CATCH_UP, "the slave to say why it keeps its bytes", || {
        slave
            .log_lines()
            .iter()
            .any(|l| l.contains("keeping them and not replicating"))
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(queue_contents(&mut slave.client()), held);
    assert_eq!(slave.pid(), slave_pid, "the slave did not restart");
    assert!(master
        .log_lines()
        .iter()
        .any(|l| l.contains("the slave keeps them and does not replicate")));
    let mut slave = slave;
    master.stop();
    slave.stop();
    assert_verify_clean(group.slave_dir.path(), "of the slave that kept its bytes");
}

/// The topic names a broker reports (user and system).
fn topic_names(client: &mut shardmq_tests::TestClient) -> Vec<String> {
    let answer = client
        .request(|b| {
            let body = wire::BrokerTopicsRequest::create(
                b,
                &wire::BrokerTopicsRequestArgs {
                    include_system: false,
                },
            );
            (wire::Body::BrokerTopicsRequest, body.as_union_value())
        })
        .expect("an answer to BrokerTopicsRequest");
    answer
        .frame()
        .body_as_broker_topics_response()
        .and_then(|r| r.topics())
        .map(|topics| {
            topics
                .iter()
                .map(|t| t.name().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_slave_follows_topic_deletion_and_copies_delivery_progress() {
    let group = Group::new();
    let fast = [
        "--replica-metadata-interval-ms",
        "500",
        "--schedule-persist-interval-ms",
        "200",
        "--delay-levels",
        "1s 2s",
    ];
    let master = group.master("async-master", &fast);
    let slave = group.slave(&fast);
    let mut client = master.client();
    create_topic(&mut client, "Doomed", 1);
    create_topic(&mut client, "Later", 1);
    let mut on_slave = slave.client();
    wait_until(CATCH_UP, "the slave to copy both topics", || {
        let names = topic_names(&mut on_slave);
        (names.contains(&"Doomed".to_owned()) && names.contains(&"Later".to_owned())).then_some(())
    });
    let deleted = client
        .request(|b| {
            let topic = b.create_string("Doomed");
            let body = wire::DeleteTopicRequest::create(
                b,
                &wire::DeleteTopicRequestArgs {
                    topic: Some(topic),
                    ..Default::default()
                },
            );
            (wire::Body::DeleteTopicRequest, body.as_union_value())
        })
        .expect("an answer");
    assert_eq!(status_of(&deleted).0, wire::Status::OK);
    wait_until(CATCH_UP, "the slave to delete the topic too", || {
        let names = topic_names(&mut on_slave);
        (!names.contains(&"Doomed".to_owned()) && names.contains(&"Later".to_owned())).then_some(())
    });

    // A delayed message is delivered by the master; the slave ends up with the master's
    // delivery progress, so a slave made master would not deliver it again.
    let namesrv = group.namesrv.addr().to_string();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let producer = shardmq_client::Producer::builder()
            .namesrv(&namesrv)
            .build()
            .await
            .expect("a producer");
        producer
            .send(shardmq_client::Message::new("Later", "in a second").with_delay_level(1))
            .await
            .expect("a delayed send");
        producer.shutdown().await;
    });
    wait_until(
        CATCH_UP,
        "the master to deliver the delayed message",
        || {
            let (records, _) = pull_queue(&mut client, "Later", 0);
            (records.len() == 1).then_some(())
        },
    );
    let progress = |dir: &std::path::Path| std::fs::read(dir.join("shard-0/delay-progress")).ok();
    wait_until(
        CATCH_UP,
        "the slave to hold the master's delivery progress",
        || {
            let on_master = progress(group.master_dir.path())?;
            (progress(group.slave_dir.path())? == on_master).then_some(())
        },
    );
    let text = String::from_utf8_lossy(&progress(group.slave_dir.path()).unwrap()).into_owned();
    assert!(text.contains("next_offsets"), "{text}");
    // The slave holds the delivered copy the progress counts as done.
    let (records, _) = pull_queue(&mut on_slave, "Later", 0);
    assert_eq!(records.len(), 1);
}

#[test]
fn a_sync_group_keeps_every_acknowledged_message_when_the_master_is_killed_mid_stream() {
    const PRODUCERS: usize = 4;
    let group = Group::new();
    let fast = ["--replica-metadata-interval-ms", "500"];
    let mut master = group.master("sync-master", &fast);
    let slave = group.slave(&fast);
    create_topic(&mut master.client(), TOPIC, QUEUES);
    let namesrv = group.namesrv.addr().to_string();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let acknowledged = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Vec<u8>>::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (namesrv, acknowledged, stop) =
                (namesrv.clone(), acknowledged.clone(), stop.clone());
            runtime.spawn(async move {
                let producer = shardmq_client::Producer::builder()
                    .namesrv(&namesrv)
                    .build()
                    .await
                    .expect("a producer");
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let body = format!("p{p}-{i}").into_bytes();
                    i += 1;
                    let sent = producer
                        .send(shardmq_client::Message::new(TOPIC, body.clone()))
                        .await;
                    match sent {
                        Ok(result) if result.status == shardmq_client::SendStatus::SendOk => {
                            acknowledged.lock().unwrap().push(body)
                        }
                        // Stored on the master only, or not at all: not acknowledged.
                        _ => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
                producer.shutdown().await;
            })
        })
        .collect();
    // A consumer group commits on the master; the slave copies its offsets.
    wait_until(CATCH_UP, "400 acknowledged sends", || {
        (acknowledged.lock().unwrap().len() >= 400).then_some(())
    });
    let mut on_master = master.client();
    for queue in 0..QUEUES as i32 {
        commit_offset(&mut on_master, "Continuer", TOPIC, queue, 40);
    }
    let mut on_slave = slave.client();
    wait_until(CATCH_UP, "the slave to copy the topic", || {
        topic_names(&mut on_slave)
            .contains(&TOPIC.to_owned())
            .then_some(())
    });
    wait_until(CATCH_UP, "the slave to copy the group's offsets", || {
        (0..QUEUES as i32)
            .all(|q| committed_offset(&mut on_slave, "Continuer", TOPIC, q) == Some(40))
            .then_some(())
    });
    // Killed while the producers keep sending.
    let before_kill = acknowledged.lock().unwrap().len();
    wait_until(CATCH_UP, "more sends", || {
        (acknowledged.lock().unwrap().len() >= before_kill + 100).then_some(())
    });
    master.kill9();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    runtime.block_on(async {
        for producer in producers {
            let _ = tokio::time::timeout(Duration::from_secs(30), producer).await;
        }
    });
    let acknowledged: Vec<Vec<u8>> = acknowledged.lock().unwrap().clone();
    let held = |client: &mut shardmq_tests::TestClient| {
        let mut bodies = std::collections::HashSet::new();
        for queue in 0..QUEUES as i32 {
            let (records, end) = pull_queue(client, TOPIC, queue);
            assert_eq!(end, QueueEnd::End);
            bodies.extend(records.into_iter().map(|r| r.body));
        }
        bodies
    };
    let on_slave_bodies = held(&mut on_slave);
    let missing: Vec<String> = acknowledged
        .iter()
        .filter(|b| !on_slave_bodies.contains(*b))
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged messages are not on the slave: {:?}",
        missing.len(),
        acknowledged.len(),
        &missing[..missing.len().min(10)]
    );

    // The group continues on the slave (through the name server's route) from its committed
    // offsets: nothing skipped.
    let master_addr = master.addr().to_string();
    wait_until(
        CATCH_UP,
        "the name server to route reads to the slave only",
        || {
            let route = shardmq_tests::run_cli(&namesrv, &["--json", "topic", "route", TOPIC]);
            let text = String::from_utf8_lossy(&route.stdout).into_owned();
            (route.status.success() && !text.contains(&master_addr)).then_some(())
        },
    );
    runtime.block_on(async {
        let consumer = shardmq_client::PullConsumer::builder()
            .namesrv(&namesrv)
            .group("Continuer")
            .build()
            .await
            .expect("a pull consumer");
        for queue in consumer.queues(TOPIC).await.expect("the queues") {
            let resumed = consumer.committed_offset(&queue).await.expect("an offset");
            assert_eq!(resumed, Some(40), "{queue:?} resumes where the group was");
            let pulled = consumer
                .pull(&queue, 40, 8)
                .await
                .expect("a pull from the slave");
            let offsets: Vec<i64> = pulled.messages.iter().map(|m| m.queue_offset).collect();
            assert_eq!(offsets, (40..48).collect::<Vec<i64>>(), "{queue:?}");
        }
        consumer.shutdown().await;
    });

    // The master returns; the slave catches up with what only the master held, and both hold
    // every acknowledged message.
    master.restart();
    wait_until(
        CATCH_UP,
        "the slave to catch up with the returned master",
        || {
            let status = replication_status(&mut master.client());
            status
                .2
                .iter()
                .all(|s| s.connected && s.lag_bytes == 0)
                .then_some(())
        },
    );
    for (side, bodies) in [
        ("master", held(&mut master.client())),
        ("slave", held(&mut slave.client())),
    ] {
        let lost = acknowledged.iter().filter(|b| !bodies.contains(*b)).count();
        assert_eq!(
            lost, 0,
            "acknowledged messages missing on the {side} after the return"
        );
    }
}

/// Sends batches of 4 to the queues in turn until `stop` or an error, recording each
/// acknowledged body.
fn load(
    addr: std::net::SocketAddr,
    acknowledged: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let Ok(mut client) = shardmq_tests::TestClient::connect(addr) else {
            return;
        };
        if client.handshake().is_err() {
            return;
        }
        let mut i = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let bodies: Vec<Vec<u8>> = (0..4)
                .map(|k| format!("load-{}-{}", i * 4 + k, "y".repeat(300)).into_bytes())
                .collect();
            let messages: Vec<TestMessage> =
                bodies.iter().map(|b| TestMessage::new(b.clone())).collect();
            let queue = (i % u64::from(QUEUES)) as i32;
            i += 1;
            match client.request(|b| send_request_body(b, TOPIC, queue, &messages)) {
                Ok(answer) if status_of(&answer).0 == wire::Status::OK => {
                    acknowledged.lock().unwrap().extend(bodies)
                }
                _ => return,
            }
        }
    })
}

/// Every queue's records (offset, body) on a broker.
fn queues_of(client: &mut shardmq_tests::TestClient) -> Vec<Vec<(u64, Vec<u8>)>> {
    (0..QUEUES as i32)
        .map(|q| {
            pull_queue(client, TOPIC, q)
                .0
                .into_iter()
                .map(|r| (r.queue_offset, r.body))
                .collect()
        })
        .collect()
}

#[test]
fn a_slave_killed_under_load_catches_up_and_an_async_master_s_loss_window_is_measured() {
    use std::sync::atomic::Ordering;
    let group = Group::new();
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut master = group.master("async-master", &["--metrics-listen", &metrics]);
    let mut slave = group.slave(&[]);
    create_topic(&mut master.client(), TOPIC, QUEUES);
    let acknowledged = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Vec<u8>>::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acks = || acknowledged.lock().unwrap().len();
    let producer = load(master.addr(), acknowledged.clone(), stop.clone());
    wait_until(CATCH_UP, "load", || (acks() >= 1000).then_some(()));
    slave.kill9();
    let at_kill = acks();
    wait_until(CATCH_UP, "load without the slave", || {
        (acks() >= at_kill + 2000).then_some(())
    });
    slave.restart();
    // Catches up while the load goes on: the lag in ms (age of the oldest byte the slave lacks)
    // comes down from the time it was away.
    let lag = |name: &str| {
        let text = shardmq_tests::http_get_body(metrics.parse().unwrap(), "/metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("shardmq_replication_{name}{{shard=\"0\"}} ")))
            .and_then(|v| v.trim().parse::<i64>().ok())
    };
    wait_until(CATCH_UP, "the slave to catch up under load", || {
        let ms = lag("lag_ms")?;
        (0..300).contains(&ms).then_some(())
    });
    stop.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    wait_until(CATCH_UP, "the lag metric to reach zero", || {
        (lag("lag_bytes")? == 0 && lag("lag_ms")? == 0).then_some(())
    });
    // The topic table is copied apart from the log (every 2 s): a slave killed before its first
    // copy learns the topic only after its restart.
    wait_until(CATCH_UP, "the slave to know the topic", || {
        topic_names(&mut slave.client())
            .contains(&TOPIC.to_owned())
            .then_some(())
    });
    assert_eq!(
        queues_of(&mut slave.client()),
        queues_of(&mut master.client())
    );

    // Async master killed under load: what it acknowledged and the slave had not pulled yet is
    // the loss window; measured here against the master's own copy (async kill -9 loses nothing
    // on the master itself).
    stop.store(false, Ordering::Relaxed);
    let before = acks();
    let producer = load(master.addr(), acknowledged.clone(), stop.clone());
    wait_until(CATCH_UP, "load", || (acks() >= before + 2000).then_some(()));
    master.kill9();
    producer.join().unwrap();
    let on_slave = queues_of(&mut slave.client());
    let slave_status = replication_status(&mut slave.client());
    master.restart();
    let on_master = queues_of(&mut master.client());
    let acknowledged = acknowledged.lock().unwrap().clone();
    let master_bodies: std::collections::HashSet<&Vec<u8>> =
        on_master.iter().flatten().map(|(_, b)| b).collect();
    assert!(
        acknowledged.iter().all(|b| master_bodies.contains(b)),
        "the async master kept everything it acknowledged"
    );
    let mut lost = 0;
    for (queue, (slave_queue, master_queue)) in on_slave.iter().zip(&on_master).enumerate() {
        assert!(
            master_queue.starts_with(slave_queue),
            "queue {queue}: the slave holds a prefix of the master's queue"
        );
        lost += master_queue.len() - slave_queue.len();
    }
    eprintln!(
        "async loss window: {lost} of {} acknowledged messages were on the master only when it was killed; the slave reported lag {:?} bytes",
        acknowledged.len(),
        slave_status.2.iter().map(|s| s.lag_bytes).collect::<Vec<_>>()
    );
    assert!(slave_status
        .2
        .iter()
        .all(|s| !s.connected && s.lag_bytes >= 0));
}

#[test]
fn brokers_register_with_two_name_servers_and_clients_keep_working_when_one_stops() {
    let args = ["--broker-timeout-ms", "2000", "--scan-interval-ms", "100"];
    let mut first = NamesrvProcess::start_with_args(&args);
    let second = NamesrvProcess::start_with_args(&args);
    let both = format!("{},{}", first.addr(), second.addr());
    let (master_dir, slave_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ha = format!("127.0.0.1:{}", free_port());
    let master = BrokerProcess::start(
        master_dir.path(),
        &[
            "--namesrv",
            &both,
            "--ha-listen",
            &ha,
            "--register-interval-ms",
            "500",
        ],
    );
    // No --ha-master: the slave learns its master's HA address from the name servers.
    let slave = BrokerProcess::start(
        slave_dir.path(),
        &[
            "--namesrv",
            &both,
            "--broker-role",
            "slave",
            "--broker-id",
            "1",
            "--register-interval-ms",
            "500",
        ],
    );
    create_topic(&mut master.client(), TOPIC, QUEUES);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let send = |count: usize, tag: &str| {
        runtime.block_on(async {
            let producer = shardmq_client::Producer::builder()
                .namesrv(&both)
                .build()
                .await
                .expect("a producer");
            for i in 0..count {
                let result = producer
                    .send(shardmq_client::Message::new(TOPIC, format!("{tag}-{i}")))
                    .await
                    .expect("a send");
                assert_eq!(result.status, shardmq_client::SendStatus::SendOk);
            }
            producer.shutdown().await;
        })
    };
    let total = |client: &mut shardmq_tests::TestClient| -> usize {
        queues_of(client).iter().map(Vec::len).sum()
    };
    send(50, "both");
    let mut on_slave = slave.client();
    wait_until(
        CATCH_UP,
        "the slave to replicate from the master it was told of",
        || (total(&mut on_slave) == 50).then_some(()),
    );
    let status = replication_status(&mut on_slave);
    assert!(status.2.iter().all(|s| s.peer == ha), "{:?}", status.2);
    for namesrv in [&first, &second] {
        let route = shardmq_tests::run_cli(
            &namesrv.addr().to_string(),
            &["--json", "topic", "route", TOPIC],
        );
        let text = String::from_utf8_lossy(&route.stdout).into_owned();
        assert!(
            text.contains(&master.addr().to_string()) && text.contains(&slave.addr().to_string()),
            "both brokers registered with {}: {text}",
            namesrv.addr()
        );
    }

    // One name server stops: new clients given both still find the routes.
    assert!(first
        .signal_and_wait("KILL", shardmq_tests::STOP_TIMEOUT)
        .is_some());
    send(50, "one");
    let mut on_master = master.client();
    assert_eq!(total(&mut on_master), 100);
    wait_until(CATCH_UP, "the slave to keep replicating", || {
        (total(&mut on_slave) == 100).then_some(())
    });
}

/// `messages_out` from `broker status`.
fn messages_out(client: &mut shardmq_tests::TestClient) -> u64 {
    let answer = shardmq_tests::broker_status(client).expect("an answer to BrokerStatusRequest");
    answer
        .frame()
        .body_as_broker_status_response()
        .expect("a body")
        .messages_out()
}

#[test]
fn with_slave_read_enable_a_consumer_far_behind_reads_from_the_slave_and_returns_when_caught_up() {
    let group = Group::new();
    let mut master = group.master(
        "async-master",
        &["--slave-read-enable", "--slave-read-lag-bytes", "16384"],
    );
    let slave = group.slave(&["--slave-read-enable", "--slave-read-lag-bytes", "16384"]);
    let mut client = master.client();
    create_topic(&mut client, TOPIC, 1);
    for i in 0..100 {
        send_batch(
            &mut client,
            TOPIC,
            0,
            &[TestMessage::new(format!("{i:04}-{}", "z".repeat(1000)))],
        );
    }
    let mut on_slave = slave.client();
    wait_until(CATCH_UP, "the slave to catch up", || {
        (pull_queue(&mut on_slave, TOPIC, 0).0.len() == 100).then_some(())
    });
    let namesrv = group.namesrv.addr().to_string();
    wait_until(CATCH_UP, "the route to list the slave", || {
        let route = shardmq_tests::run_cli(&namesrv, &["--json", "topic", "route", TOPIC]);
        String::from_utf8_lossy(&route.stdout)
            .contains(&slave.addr().to_string())
            .then_some(())
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let consumer = shardmq_client::PullConsumer::builder()
            .namesrv(&namesrv)
            .group("Slow")
            .build()
            .await
            .expect("a pull consumer");
        let queue = consumer.queues(TOPIC).await.unwrap().remove(0);
        let (master_out, slave_out) = (
            messages_out(&mut master.client()),
            messages_out(&mut on_slave),
        );
        // Far behind: the master answers and points at the slave.
        let first = consumer.pull(&queue, 0, 4).await.unwrap();
        assert_eq!(first.messages.len(), 4);
        assert_eq!(first.suggest_which_broker_id, 1);
        assert_eq!(messages_out(&mut master.client()), master_out + 4);
        // The next pulls go to the slave, which keeps the consumer while it is far behind.
        let second = consumer.pull(&queue, 4, 4).await.unwrap();
        assert_eq!(second.messages[0].queue_offset, 4);
        assert_eq!(second.suggest_which_broker_id, 1);
        assert_eq!(messages_out(&mut on_slave), slave_out + 4);
        assert_eq!(messages_out(&mut master.client()), master_out + 4);
        // Caught up: the slave sends it back to the master.
        let near_end = consumer.pull(&queue, 96, 4).await.unwrap();
        assert_eq!(near_end.suggest_which_broker_id, 0);
        assert_eq!(messages_out(&mut on_slave), slave_out + 8);
        let _ = consumer.pull(&queue, 99, 1).await.unwrap();
        assert_eq!(messages_out(&mut master.client()), master_out + 5);
        consumer.shutdown().await;
    });
    // Without a live slave the master suggests nothing.
    drop(slave);
    let mut on_master = master.client();
    std::thread::sleep(Duration::from_secs(4));
    let response = on_master
        .request(|b| {
            shardmq_tests::pull_request_body(b, &shardmq_tests::PullParams::new(TOPIC, 0, 0))
        })
        .expect("a pull");
    let suggested = response
        .frame()
        .body_as_pull_response()
        .expect("a body")
        .suggest_which_broker_id();
    assert_eq!(suggested, 0);
    master.stop();
}

#[test]
fn a_pull_parked_on_a_slave_wakes_when_replicated_messages_arrive() {
    let group = Group::new();
    let master = group.master("async-master", &[]);
    let slave = group.slave(&[]);
    let mut client = master.client();
    create_topic(&mut client, TOPIC, 1);
    send_batch(&mut client, TOPIC, 0, &[TestMessage::new("first")]);
    let mut on_slave = slave.client();
    wait_until(CATCH_UP, "the slave to hold the first message", || {
        (pull_queue(&mut on_slave, TOPIC, 0).0.len() == 1).then_some(())
    });
    // Parked at the queue's end on the slave for up to 20 s; the next message reaches the
    // slave by replication, and the pull answers with it long before its hold ends.
    let _ = on_slave.set_read_timeout(Duration::from_secs(30));
    let parked = std::thread::spawn(move || {
        let started = std::time::Instant::now();
        let mut params = shardmq_tests::PullParams::new(TOPIC, 0, 1);
        params.suspend_timeout_ms = 20_000;
        let answer = on_slave
            .request(|b| shardmq_tests::pull_request_body(b, &params))
            .expect("a pull answer");
        (status_of(&answer).0, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(500));
    send_batch(&mut client, TOPIC, 0, &[TestMessage::new("second")]);
    let (status, took) = parked.join().unwrap();
    assert_eq!(status, wire::Status::OK);
    assert!(
        took < Duration::from_secs(10),
        "the parked pull answered only after {took:?} (its hold, not the arrival)"
    );
}

/// A producer that looked up its topic's route while the group had no master (the old one had
/// left the routes and none had joined yet) sends to the new master as soon as the name server
/// names it, not at the next periodic route refresh (30 s): a cached route without a writable
/// queue is fetched again before a send gives up.
#[test]
fn a_producer_whose_cached_route_has_no_master_finds_the_next_one_at_once() {
    let group = Group::new();
    let mut master = group.master("async-master", &[]);
    let slave = group.slave(&[]);
    create_topic(&mut master.client(), TOPIC, QUEUES);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let namesrv = group.namesrv.addr().to_string();
    let producer = runtime.block_on(async {
        shardmq_client::Producer::builder()
            .namesrv(&namesrv)
            .send_timeout(Duration::from_secs(2))
            .build()
            .await
            .expect("a producer")
    });
    let send = |body: &str| {
        runtime.block_on(producer.send(shardmq_client::Message::new(TOPIC, body.to_owned())))
    };
    wait_until(CATCH_UP, "a send to the master", || send("first").ok());
    // The slave has copied the topic (every 2 s), so it keeps the topic in the route.
    wait_until(CATCH_UP, "the slave to copy the topic", || {
        topic_names(&mut slave.client())
            .contains(&TOPIC.to_owned())
            .then_some(())
    });
    master.kill9();
    // The slave alone stays in the route, read-only: the producer caches a route without a
    // writable queue.
    wait_until(CATCH_UP, "the route to lose its master", || {
        match send("while no master") {
            Err(shardmq_client::Error::NoQueue { .. }) => Some(()),
            _ => None,
        }
    });
    master.restart();
    // Well inside the 30 s route refresh: the name server names the restarted master within
    // its 500 ms registration interval.
    let result = wait_until(
        Duration::from_secs(8),
        "a send to the restarted master",
        || send("after").ok(),
    );
    assert_eq!(result.status, shardmq_client::SendStatus::SendOk);
}

/// RocketMQ drops a broker from its routes the moment its connection to the name server closes.
/// Here the name server keeps its default broker timeout (120 s), so only the closed
/// registration connection can take the killed master out of the routes: consumers through the
/// name server then read every acknowledged message from the slave within seconds.
#[test]
fn a_killed_master_leaves_the_routes_at_once_and_consumers_read_from_the_slave() {
    let group = Group {
        namesrv: NamesrvProcess::start(),
        ..Group::new()
    };
    let mut master = group.master("sync-master", &[]);
    let slave = group.slave(&[]);
    let mut client = master.client();
    create_topic(&mut client, TOPIC, 1);
    wait_for_sync_replication(&mut client);
    let mut acknowledged = 1;
    for i in 0..300 {
        let response = client
            .request(|b| send_request_body(b, TOPIC, 0, &[TestMessage::new(format!("m-{i}"))]))
            .expect("an answer");
        assert_eq!(status_of(&response).0, wire::Status::OK, "send {i}");
        acknowledged += 1;
    }
    // The slave copies the topic table every 2 s and registers it at once.
    wait_until(CATCH_UP, "the slave to copy the topic", || {
        topic_names(&mut slave.client())
            .contains(&TOPIC.to_owned())
            .then_some(())
    });
    let namesrv = group.namesrv.addr().to_string();
    master.kill9();
    let killed = std::time::Instant::now();
    let mut attempt = 0;
    let consumed = wait_until(
        Duration::from_secs(10),
        "a consumer through the name server to read every message from the slave",
        || {
            attempt += 1;
            let group_name = format!("after-kill-{attempt}");
            let output = shardmq_tests::run_cli(
                &namesrv,
                &[
                    "--json",
                    "consume",
                    TOPIC,
                    "--group",
                    &group_name,
                    "--count",
                    &acknowledged.to_string(),
                    "--timeout-ms",
                    "2000",
                ],
            );
            let printed = String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter(|line| line.starts_with('{'))
                .count();
            (output.status.success() && printed == acknowledged).then_some(printed)
        },
    );
    assert_eq!(consumed, acknowledged);
    println!(
        "every acknowledged message read through the name server {} ms after the master's kill",
        killed.elapsed().as_millis()
    );
}

/// RocketMQ 5's confirmed offset: a sync master serves consumers only the records its slave
/// holds. With the slave paused, a send is stored on the master but answered
/// FLUSH_SLAVE_TIMEOUT, and a consumer at the tail does not see it (were the master to die
/// now, a new master could lack it and take new messages at that queue offset, which the
/// consumer would skip). Once the slave resumes and acknowledges it, the consumer sees it.
#[test]
fn a_sync_master_serves_consumers_only_what_its_slave_holds() {
    let group = Group::new();
    let master = group.master("sync-master", &["--sync-flush-timeout-ms", "1000"]);
    let slave = group.slave(&[]);
    let mut client = master.client();
    create_topic(&mut client, TOPIC, 1);
    wait_for_sync_replication(&mut client);
    let confirmed_before = wait_until(CATCH_UP, "the probes to be served", || {
        let (records, end) = pull_queue(&mut client, TOPIC, 0);
        (end == QueueEnd::End && !records.is_empty()).then_some(records.len())
    });
    shardmq_tests::signal(slave.pid(), "STOP");
    let unreplicated = client
        .request(|b| send_request_body(b, TOPIC, 0, &[TestMessage::new("not-on-the-slave")]))
        .expect("an answer");
    assert_eq!(
        status_of(&unreplicated).0,
        wire::Status::FLUSH_SLAVE_TIMEOUT,
        "{:?}",
        status_of(&unreplicated)
    );
    // The slave was heard from under 3 s ago, so it still counts: the record stays hidden.
    let (records, end) = pull_queue(&mut client, TOPIC, 0);
    assert_eq!(end, QueueEnd::End);
    assert_eq!(
        records.len(),
        confirmed_before,
        "a consumer was served a record the slave does not hold"
    );
    shardmq_tests::signal(slave.pid(), "CONT");
    let records = wait_until(
        CATCH_UP,
        "the record to be served once the slave holds it",
        || {
            let (records, _) = pull_queue(&mut client, TOPIC, 0);
            (records.len() > confirmed_before).then_some(records)
        },
    );
    assert_eq!(records.last().unwrap().body, b"not-on-the-slave");
}

/// Sends "probe" messages to queue 0 of `TOPIC` through a sync master until one is answered OK
/// (its slave replicates).
fn wait_for_sync_replication(client: &mut shardmq_tests::TestClient) {
    wait_until(CATCH_UP, "the slave to start replicating", || {
        let probe = client
            .request(|b| send_request_body(b, TOPIC, 0, &[TestMessage::new("probe")]))
            .expect("an answer");
        (status_of(&probe).0 == wire::Status::OK).then_some(())
    });
}

#[test]
fn two_masters_that_begin_the_same_epoch_at_the_same_offset_do_not_pass_for_one_term() {
    // Manual mode, no controller: the master and its slave both hold term 1. The slave is
    // promoted by hand and writes; the old master also restarts as master. Both begin epoch 2
    // at the same offset and write different messages there: only their incarnation ids tell
    // the two terms apart.
    let group = Group::new();
    let mut master = group.master("async-master", &SMALL_SEGMENTS);
    let mut client = master.client();
    create_topic(&mut client, TOPIC, 1);
    let body = |phase: &str, i: usize| format!("{phase}-{i}-{}", "y".repeat(1500)).into_bytes();
    for i in 0..200 {
        send_batch(&mut client, TOPIC, 0, &[TestMessage::new(body("a", i))]);
    }
    drop(client);
    let mut slave = group.slave(&SMALL_SEGMENTS);
    let mut on_slave = slave.client();
    wait_until(CATCH_UP, "the slave to copy term 1", || {
        let (records, _) = pull_queue(&mut on_slave, TOPIC, 0);
        (records.len() == 200).then_some(())
    });
    drop(on_slave);
    master.kill9();
    slave.stop();

    // The slave's directory started as a master by hand (its own name server, so that the two
    // masters never share routes): epoch 2 at the end of term 1, 50 messages.
    let other_namesrv = NamesrvProcess::start();
    let other_addr = other_namesrv.addr().to_string();
    let other_ha = format!("127.0.0.1:{}", free_port());
    let mut args: Vec<&str> = vec![
        "--namesrv",
        &other_addr,
        "--broker-role",
        "async-master",
        "--ha-listen",
        &other_ha,
    ];
    args.extend_from_slice(&SMALL_SEGMENTS);
    let mut promoted = BrokerProcess::start(group.slave_dir.path(), &args);
    let mut client = promoted.client();
    for i in 0..50 {
        send_batch(
            &mut client,
            TOPIC,
            0,
            &[TestMessage::new(body("promoted", i))],
        );
    }
    let promoted_term = replication_status(&mut client).2[0].epoch;
    drop(client);
    promoted.stop();

    // The old master restarts in place: it also begins epoch 2 at the end of term 1, and
    // writes 80 other messages over the same offsets.
    master.restart();
    let mut client = master.client();
    for i in 0..80 {
        send_batch(
            &mut client,
            TOPIC,
            0,
            &[TestMessage::new(body("master", i))],
        );
    }
    assert_eq!(replication_status(&mut client).2[0].epoch, promoted_term);
    let expected = queue_contents(&mut client);
    assert_eq!(expected.len(), 280);

    // The promoted broker rejoins as the master's slave: it must cut its own epoch-2 bytes
    // (never the master's) and copy the master's, not keep them as if the terms were one.
    let slave = group.slave(&SMALL_SEGMENTS);
    wait_until_holds(
        &slave,
        &expected,
        "the slave to hold exactly the master's log",
    );
    assert!(
        slave
            .log_lines()
            .iter()
            .any(|l| l.contains("holds CommitLog bytes its master does not")),
        "the slave says why it cut its log"
    );
    drop(other_namesrv);
}

#[test]
fn a_new_slave_of_a_master_whose_retention_has_run_begins_at_its_oldest_byte() {
    let group = Group::new();
    let mut master_args = SMALL_SEGMENTS.to_vec();
    master_args.extend([
        "--file-reserved-hours",
        "0",
        "--retention-interval-ms",
        "200",
    ]);
    let master = group.master("async-master", &master_args);
    let mut client = master.client();
    create_topic(&mut client, TOPIC, 1);
    let body = |phase: &str, i: usize| format!("{phase}-{i}-{}", "r".repeat(2000)).into_bytes();
    // About 3 MiB: the first segments of 1 MiB are sealed, and retention (0 hours) deletes them.
    for i in 0..1500 {
        send_batch(&mut client, TOPIC, 0, &[TestMessage::new(body("a", i))]);
    }
    // Retention deletes every sealed segment: wait until only the one being written is left,
    // so what the master holds stays put while the slave copies it.
    wait_until(CATCH_UP, "retention to delete every sealed segment", || {
        let (records, _) = pull_queue(&mut client, TOPIC, 0);
        let (first, last) = (records.first()?, records.last()?);
        let active_base = last.end() - last.end() % (1 << 20);
        (first.queue_offset > 0 && first.physical_offset >= active_base).then_some(())
    });
    let expected = queue_contents(&mut client);
    assert!(expected[0].1 >= 1 << 20, "the master's log begins past 0");

    // A new, empty slave (its own retention the default): it cannot copy from 0, so it begins
    // its log at the master's oldest byte and holds what the master holds, at the same offsets.
    let slave = group.slave(&SMALL_SEGMENTS);
    wait_until_holds(
        &slave,
        &expected,
        "the slave to hold the master's retained log",
    );
    assert!(
        slave
            .log_lines()
            .iter()
            .any(|l| l.contains("ends before the master's oldest byte")),
        "the slave says why it began its log again"
    );
    // And it goes on copying what the master takes next.
    for i in 0..100 {
        send_batch(&mut client, TOPIC, 0, &[TestMessage::new(body("b", i))]);
    }
    let expected = queue_contents(&mut client);
    wait_until_holds(&slave, &expected, "the slave to copy the new messages");
    let mut slave = slave;
    slave.stop();
    assert_verify_clean(
        group.slave_dir.path(),
        "of the slave begun at the master's oldest byte",
    );
}

/// Queue 0 of [`TOPIC`] as (queue offset, physical offset, body), from the queue's first
/// message.
fn queue_contents(client: &mut shardmq_tests::TestClient) -> Vec<(u64, u64, Vec<u8>)> {
    pull_queue(client, TOPIC, 0)
        .0
        .into_iter()
        .map(|r| (r.queue_offset, r.physical_offset, r.body))
        .collect()
}

/// Waits until `broker` holds exactly `expected` in queue 0 of [`TOPIC`] (a broker that
/// refuses or closes the connection, restarting, is asked again).
fn wait_until_holds(broker: &BrokerProcess, expected: &[(u64, u64, Vec<u8>)], what: &str) {
    wait_until(CATCH_UP, what, || {
        let mut client = shardmq_tests::TestClient::connect(broker.addr()).ok()?;
        client.handshake().ok()?;
        let held =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| queue_contents(&mut client)))
                .ok()?;
        (held == expected).then_some(())
    });
}

/// A request that arrives while the broker stops (a shutdown or a role change) is refused at
/// once with SERVICE_NOT_AVAILABLE instead of being served: a long poll admitted after the
/// stop woke the parked pulls would otherwise park for its whole suspend time and hold the
/// stop to the drain's 5 s bound (what made a role change, and so a failover, take 7 s in
/// rare chaos rounds). Here a send waiting for a paused slave keeps the drain open for about
/// 1.5 s (the sync-flush timeout); a long poll sent meanwhile is answered at once and the stop
/// ends with that send, well inside the bound.
#[test]
fn a_request_that_arrives_while_the_broker_stops_is_refused_and_does_not_hold_the_stop() {
    use shardmq_tests::{pull_request_body, ClientError, PullParams};
    use std::time::Instant;

    let group = Group::new();
    let mut master = group.master("sync-master", &["--sync-flush-timeout-ms", "1500"]);
    let slave = group.slave(&[]);
    let mut client = master.client();
    create_topic(&mut client, TOPIC, 1);
    wait_for_sync_replication(&mut client);
    let (visible, _) = pull_queue(&mut client, TOPIC, 0);
    let mut late = master.client();

    shardmq_tests::signal(slave.pid(), "STOP");
    client
        .send_request(|b| send_request_body(b, TOPIC, 0, &[TestMessage::new("waits")]))
        .expect("send the waiting send");
    std::thread::sleep(Duration::from_millis(100));
    let stopping = std::thread::spawn(move || {
        let started = Instant::now();
        master.stop();
        started.elapsed()
    });
    // The stop has begun (SIGTERM is handled at once) and its drain waits for the send.
    std::thread::sleep(Duration::from_millis(400));
    let mut long_poll = PullParams::new(TOPIC, 0, visible.len() as i64);
    long_poll.suspend_timeout_ms = 30_000;
    let sent = Instant::now();
    late.send_request(|b| pull_request_body(b, &long_poll))
        .expect("send the long poll");
    match late.read_frame() {
        Ok(frame) => assert_eq!(
            status_of(&frame).0,
            wire::Status::SERVICE_NOT_AVAILABLE,
            "{:?}",
            status_of(&frame)
        ),
        Err(ClientError::Closed) => {}
        Err(error) => panic!("the long poll neither answered nor closed: {error}"),
    }
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "the long poll was held {} ms",
        sent.elapsed().as_millis()
    );
    let stop_took = stopping.join().expect("the stop");
    shardmq_tests::signal(slave.pid(), "CONT");
    assert!(
        stop_took < Duration::from_millis(4500),
        "the stop took {} ms: held to the drain's bound",
        stop_took.as_millis()
    );
}
