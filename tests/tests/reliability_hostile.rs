//! Reliability suite, hostile and slow clients against the real broker:
//!
//! - garbage connections, slowloris connections (a byte at a time, before and after the
//!   handshake), 5,000 idle connections and a consumer that pulls but never commits, all at
//!   once: the broker stays up, its resident memory stays bounded, and a well-behaved client
//!   still sends and pulls correctly and promptly;
//! - connections that declare 16 MiB frames and send most of each, then a client pipelining
//!   72 MiB of sends: the broker holds at most its request byte budget (RSS bounded), small
//!   requests pass meanwhile, and every pipelined send is stored;
//! - a slow push consumer: producers finish their sends within a deadline while the
//!   consumer's listener is slow, the consumer's flow control bounds how many messages it holds
//!   (every held message is in a listener call here, so the calls in progress are the count),
//!   and every message is consumed exactly once.
//!
//! Needs the binaries: `cargo build --workspace --bins`. The 5,000 connections need an open
//! file limit of at least 12,000 for this process (the broker inherits it).

mod reliability_support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use reliability_support::{create_topic, pull_queue, rss_kib, send_batch, QueueEnd, Rng};
use shardmq_client::{ConsumeFrom, ConsumeResult, FlowLimits, Message, Producer, PushConsumer};
use shardmq_schema::wire;
use shardmq_tests::{
    pull_request_body, status_of, wait_until, BrokerProcess, LocalCluster, PullParams, TestClient,
    TestMessage,
};

/// Idle connections held open at once.
const IDLE_CONNECTIONS: usize = 5_000;

/// Most the broker's resident memory may grow while the hostile clients are connected.
const MAX_RSS_GROWTH_KIB: u64 = 512 * 1024;

/// Longest one request of the well-behaved client may take while the broker is under attack.
const MAX_GOOD_REQUEST: Duration = Duration::from_secs(3);

/// The soft open-file limit of this process (`/proc/self/limits`).
fn open_file_limit() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").expect("read /proc/self/limits");
    limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .and_then(|line| line.split_whitespace().nth(3))
        .and_then(|soft| soft.parse().ok())
        .unwrap_or(u64::MAX)
}

/// A connection that sends `bytes` one at a time, `pause` apart, until done, `stop` is set or
/// the broker closes it; returns whether the broker closed it.
fn trickle(mut client: TestClient, bytes: Vec<u8>, pause: Duration, stop: &AtomicBool) -> bool {
    for byte in bytes {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        if client.send_bytes(&[byte]).is_err() {
            return true;
        }
        // Pacing the attack, not waiting for a condition.
        thread::sleep(pause);
    }
    false
}

/// The bytes of a handshake request frame (with its length prefix).
fn handshake_frame(encoder: &mut TestClient) -> Vec<u8> {
    encoder
        .encode_request(1, |builder| {
            let client_id = builder.create_string("slowloris");
            let request = wire::HandshakeRequest::create(
                builder,
                &wire::HandshakeRequestArgs {
                    protocol_version: shardmq_schema::PROTOCOL_VERSION,
                    min_protocol_version: shardmq_schema::MIN_PROTOCOL_VERSION,
                    client_id: Some(client_id),
                    client_version: None,
                },
            );
            (wire::Body::HandshakeRequest, request.as_union_value())
        })
        .expect("encode a handshake")
        .to_vec()
}

/// The well-behaved client's round: sends a batch to each queue and pulls it back, every
/// request within [`MAX_GOOD_REQUEST`].
fn good_client_round(broker: &BrokerProcess, topic: &str, round: usize, sent: &mut Vec<Vec<u8>>) {
    let mut client = broker.client();
    let started = Instant::now();
    let bodies: Vec<TestMessage> = (0..4)
        .map(|part| TestMessage::new(format!("good-{round}-{part}")))
        .collect();
    let offsets = send_batch(&mut client, topic, 0, &bodies);
    assert!(
        started.elapsed() < MAX_GOOD_REQUEST,
        "round {round}: a send of the well-behaved client took {:?} under attack",
        started.elapsed()
    );
    sent.extend(bodies.into_iter().map(|message| message.body));
    assert_eq!(
        offsets.last().copied(),
        Some(sent.len() as u64 - 1),
        "round {round}: the well-behaved client's messages were not stored in order"
    );
    let started = Instant::now();
    let (records, end) = pull_queue(&mut client, topic, 0);
    assert!(
        started.elapsed() < MAX_GOOD_REQUEST * 4,
        "round {round}: pulling the queue took {:?} under attack",
        started.elapsed()
    );
    assert_eq!(end, QueueEnd::End);
    let bodies: Vec<&Vec<u8>> = records.iter().map(|record| &record.body).collect();
    assert_eq!(
        bodies,
        sent.iter().collect::<Vec<_>>(),
        "round {round}: the well-behaved client pulled something other than what it sent"
    );
}

#[test]
fn garbage_slowloris_5000_idle_and_never_committing_clients_leave_the_broker_serving_in_bounded_memory(
) {
    let limit = open_file_limit();
    assert!(
        limit >= 12_000,
        "this test holds {IDLE_CONNECTIONS} connections and needs an open file limit of at least 12000 (ulimit -n), not {limit}"
    );
    let dir = tempfile::tempdir().expect("a temp dir");
    let broker = BrokerProcess::start(dir.path(), &["--handshake-timeout-ms", "1000"]);
    let mut client = broker.client();
    create_topic(&mut client, "Good", 1);
    create_topic(&mut client, "Pulled", 1);
    send_batch(
        &mut client,
        "Pulled",
        0,
        &(0..64)
            .map(|index| TestMessage::new(format!("pulled-{index}")))
            .collect::<Vec<_>>(),
    );
    drop(client);
    let mut sent = Vec::new();
    good_client_round(&broker, "Good", 0, &mut sent);
    let rss_before = rss_kib(broker.pid());

    let stop = Arc::new(AtomicBool::new(false));
    let mut attackers = Vec::new();
    let mut rng = Rng::for_test("hostile clients");

    // Garbage: random bytes, then close; the broker answers or closes, and goes on.
    {
        let (stop, addr, mut rng) = (Arc::clone(&stop), broker.addr(), rng.fork());
        attackers.push(thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut garbage) = TestClient::connect(addr) else {
                    continue;
                };
                let length = 1 + rng.below(2048);
                let _ = garbage.send_bytes(&rng.bytes(length));
                let _ = garbage.shutdown_write();
                let _ = garbage.read_until_closed();
            }
        }));
    }
    // Slowloris before the handshake: must be closed by the handshake timeout.
    let closed_before_handshake = Arc::new(AtomicUsize::new(0));
    for _ in 0..16 {
        let (stop, addr, closed) = (
            Arc::clone(&stop),
            broker.addr(),
            Arc::clone(&closed_before_handshake),
        );
        attackers.push(thread::spawn(move || {
            let mut client = TestClient::connect(addr).expect("connect a slowloris");
            let frame = handshake_frame(&mut client);
            if trickle(client, frame, Duration::from_millis(200), &stop) {
                closed.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // Slowloris after the handshake: a send request a byte at a time.
    for index in 0..16 {
        let (stop, addr) = (Arc::clone(&stop), broker.addr());
        attackers.push(thread::spawn(move || {
            let mut client = TestClient::connect(addr).expect("connect a slowloris");
            client.handshake().expect("a slowloris handshake");
            let frame = client
                .encode_request(2, |builder| {
                    shardmq_tests::send_request_body(
                        builder,
                        "Good",
                        0,
                        &[TestMessage::new(vec![b's'; 4096 + index])],
                    )
                })
                .expect("encode a send");
            trickle(client, frame.to_vec(), Duration::from_millis(20), &stop);
        }));
    }
    // A consumer that pulls the same messages again and again and never commits.
    {
        let (stop, addr) = (Arc::clone(&stop), broker.addr());
        attackers.push(thread::spawn(move || {
            let mut client = TestClient::connect(addr).expect("connect a puller");
            client.handshake().expect("a puller handshake");
            while !stop.load(Ordering::Relaxed) {
                let mut params = PullParams::new("Pulled", 0, 0);
                params.consumer_group = Some("NeverCommits".to_owned());
                let response = client
                    .request(|builder| pull_request_body(builder, &params))
                    .expect("an answer to a pull that never commits");
                assert_eq!(status_of(&response).0, wire::Status::OK);
            }
        }));
    }

    // 5,000 idle connections, each past its handshake, then silent.
    let mut idle = Vec::with_capacity(IDLE_CONNECTIONS);
    for index in 0..IDLE_CONNECTIONS {
        let mut connection = TestClient::connect(broker.addr())
            .unwrap_or_else(|error| panic!("idle connection {index}: {error}"));
        connection
            .handshake()
            .unwrap_or_else(|error| panic!("idle connection {index}: handshake: {error}"));
        idle.push(connection);
        if index % 1000 == 999 {
            good_client_round(&broker, "Good", index / 1000 + 1, &mut sent);
        }
    }
    for round in 10..20 {
        good_client_round(&broker, "Good", round, &mut sent);
    }
    let rss_under_attack = rss_kib(broker.pid());
    eprintln!(
        "broker RSS: {rss_before} KiB before, {rss_under_attack} KiB with {IDLE_CONNECTIONS} idle connections and the attackers ({} KiB per idle connection)",
        rss_under_attack.saturating_sub(rss_before) / IDLE_CONNECTIONS as u64
    );
    assert!(
        rss_under_attack.saturating_sub(rss_before) < MAX_RSS_GROWTH_KIB,
        "the broker's RSS grew from {rss_before} KiB to {rss_under_attack} KiB under {IDLE_CONNECTIONS} idle and hostile connections, over the {MAX_RSS_GROWTH_KIB} KiB bound"
    );

    // The idle connections are still served.
    for (index, connection) in idle.iter_mut().enumerate().step_by(500) {
        let response = connection
            .request(|builder| {
                let request =
                    wire::TopicListRequest::create(builder, &wire::TopicListRequestArgs::default());
                (wire::Body::TopicListRequest, request.as_union_value())
            })
            .unwrap_or_else(|error| panic!("idle connection {index} is no longer served: {error}"));
        assert_eq!(status_of(&response).0, wire::Status::OK);
    }
    // The slow handshakes were cut off by the handshake timeout.
    wait_until(
        Duration::from_secs(20),
        "the broker to close the slowloris connections that never finished a handshake",
        || (closed_before_handshake.load(Ordering::Relaxed) == 16).then_some(()),
    );

    stop.store(true, Ordering::Relaxed);
    for attacker in attackers {
        attacker.join().expect("an attacker thread");
    }
    drop(idle);
    let mut broker = broker;
    assert!(broker.is_running(), "the broker died under hostile clients");
    good_client_round(&broker, "Good", 99, &mut sent);
    broker.stop();
}

#[test]
fn a_slow_push_consumer_is_held_to_its_flow_limit_while_producers_keep_sending() {
    const TOPIC: &str = "SlowConsumer";
    const MESSAGES: usize = 2_000;
    const MAX_CACHED: usize = 64;
    const PULL_BATCH: u32 = 16;
    let dir = tempfile::tempdir().expect("a temp dir");
    let cluster = LocalCluster::start(dir.path());
    cluster.create_topic(TOPIC, 1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let most_in_flight = Arc::new(AtomicUsize::new(0));
        let consumed = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
        let consumer = {
            let (in_flight, most_in_flight, consumed) = (
                Arc::clone(&in_flight),
                Arc::clone(&most_in_flight),
                Arc::clone(&consumed),
            );
            PushConsumer::builder()
                .namesrv(cluster.namesrv_addr())
                .group("SlowGroup")
                .subscribe(TOPIC, "*")
                .consume_from(ConsumeFrom::FirstOffset)
                // More listener calls than the flow limit: every cached message is in a call.
                .consume_threads(MAX_CACHED * 4)
                .consume_batch_max(1)
                .pull_batch(PULL_BATCH)
                .flow_limits(FlowLimits {
                    max_cached_messages: MAX_CACHED,
                    ..FlowLimits::default()
                })
                .listen_concurrently(move |messages| {
                    let (in_flight, most_in_flight, consumed) = (
                        Arc::clone(&in_flight),
                        Arc::clone(&most_in_flight),
                        Arc::clone(&consumed),
                    );
                    async move {
                        let now = in_flight.fetch_add(messages.len(), Ordering::SeqCst)
                            + messages.len();
                        most_in_flight.fetch_max(now, Ordering::SeqCst);
                        // The slow part of the listener.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        consumed
                            .lock()
                            .unwrap()
                            .extend(messages.iter().map(|message| message.body.to_vec()));
                        in_flight.fetch_sub(messages.len(), Ordering::SeqCst);
                        ConsumeResult::Success
                    }
                })
                .start()
                .await
                .expect("a push consumer")
        };

        let producer = Producer::builder()
            .namesrv(cluster.namesrv_addr())
            .group("FastProducers")
            .build()
            .await
            .expect("a producer");
        let started = Instant::now();
        for batch in 0..MESSAGES / 10 {
            let messages = (0..10)
                .map(|index| Message::new(TOPIC, format!("slow-{}", batch * 10 + index)))
                .collect();
            producer
                .send_batch(messages)
                .await
                .expect("a send while the consumer lags");
        }
        let send_time = started.elapsed();
        let consumed_when_sent = consumed.lock().unwrap().len();
        eprintln!(
            "slow consumer: {MESSAGES} messages sent in {send_time:?}; {consumed_when_sent} consumed by then"
        );
        assert!(
            send_time < Duration::from_secs(60),
            "producers took {send_time:?} for {MESSAGES} messages while a consumer lagged"
        );

        let deadline = Instant::now() + Duration::from_secs(120);
        while consumed.lock().unwrap().len() < MESSAGES {
            assert!(
                Instant::now() < deadline,
                "the slow consumer consumed only {} of {MESSAGES} messages in time",
                consumed.lock().unwrap().len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        consumer.shutdown().await;
        producer.shutdown().await;

        let most = most_in_flight.load(Ordering::SeqCst);
        eprintln!("slow consumer: at most {most} messages held at once (limit {MAX_CACHED} + one pull of {PULL_BATCH})");
        assert!(
            most <= MAX_CACHED + PULL_BATCH as usize,
            "the consumer held {most} messages at once, over its flow limit of {MAX_CACHED} plus one pull of {PULL_BATCH}"
        );
        assert!(
            most >= MAX_CACHED / 2,
            "the consumer never held more than {most} messages: it did not lag, so flow control was not exercised"
        );
        let consumed = consumed.lock().unwrap();
        let distinct: HashSet<&Vec<u8>> = consumed.iter().collect();
        assert_eq!(
            (consumed.len(), distinct.len()),
            (MESSAGES, MESSAGES),
            "every message is consumed exactly once"
        );
    });
}

/// The request byte budget the budget test runs with (32 MiB; frames up to 16 MiB).
const BUDGET_BYTES: usize = 32 << 20;

/// Connections that each declare a 16 MiB frame and send most of it.
const DECLARING_CONNECTIONS: usize = 24;

/// The broker's RSS high-water mark while `during` runs, sampled every 100 ms, in KiB.
fn max_rss_while(pid: u32, during: impl FnOnce() + Send) -> u64 {
    let done = AtomicBool::new(false);
    thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut peak = 0;
            while !done.load(Ordering::Relaxed) {
                peak = peak.max(rss_kib(pid));
                // Sampling period, not a wait for a condition.
                thread::sleep(Duration::from_millis(100));
            }
            peak.max(rss_kib(pid))
        });
        during();
        done.store(true, Ordering::Relaxed);
        sampler.join().expect("the RSS sampler")
    })
}

#[test]
fn declared_and_pipelined_large_frames_are_held_to_the_request_byte_budget() {
    let dir = tempfile::tempdir().unwrap();
    let budget = BUDGET_BYTES.to_string();
    let broker = BrokerProcess::start(
        dir.path(),
        &[
            "--max-request-bytes-per-shard",
            &budget,
            "--frame-read-timeout-ms",
            "2000",
        ],
    );
    let topic = "Budget";
    create_topic(&mut broker.client(), topic, 1);
    let rss_before = rss_kib(broker.pid());

    // 1. Connections declare 16 MiB frames and send 15 MiB of each: without a budget the broker
    //    would buffer all of it (360 MiB); with it, two frames are admitted at a time, the rest
    //    wait unread (their bytes stay in the kernel), and each admitted frame that does not
    //    complete is dropped after the frame read timeout.
    let declared = 16usize << 20;
    let sent_part = 15usize << 20;
    let good_requests_ok = AtomicUsize::new(0);
    let peak_declared = max_rss_while(broker.pid(), || {
        thread::scope(|scope| {
            for _ in 0..DECLARING_CONNECTIONS {
                scope.spawn(|| {
                    let mut client = broker.client();
                    client
                        .set_write_timeout(Duration::from_secs(3))
                        .expect("write timeout");
                    let mut bytes = u32::try_from(declared).unwrap().to_be_bytes().to_vec();
                    bytes.resize(4 + sent_part, 0x5a);
                    for chunk in bytes.chunks(1 << 20) {
                        if client.send_bytes(chunk).is_err() {
                            break;
                        }
                    }
                });
            }
            // Meanwhile small requests (a send and a pull) still get through promptly: small
            // frames have an allowance over the budget.
            scope.spawn(|| {
                let mut sent = Vec::new();
                for round in 0..3 {
                    good_client_round(&broker, topic, round, &mut sent);
                    good_requests_ok.fetch_add(1, Ordering::Relaxed);
                }
            });
        });
    });
    assert_eq!(good_requests_ok.load(Ordering::Relaxed), 3);
    let growth_kib = peak_declared.saturating_sub(rss_before);
    let bound_kib = (BUDGET_BYTES as u64 * 9 / 8) / 1024 + 64 * 1024;
    assert!(
        growth_kib < bound_kib,
        "declared frames: broker RSS grew by {growth_kib} KiB, over the budget's bound of {bound_kib} KiB ({rss_before} KiB before)"
    );

    // 2. One client pipelines 24 sends of 3 MiB (72 MiB, over twice the budget) before reading
    //    any answer: reading pauses while the budget is spent, every send is stored.
    let bodies: Vec<TestMessage> = (0..24)
        .map(|i| {
            let mut body = format!("big-{i}|").into_bytes();
            body.resize(3 << 20, b'0' + (i % 10) as u8);
            TestMessage::new(body)
        })
        .collect();
    let mut answers = Vec::new();
    let peak_pipelined = max_rss_while(broker.pid(), || {
        let mut client = broker.client();
        client
            .set_read_timeout(Duration::from_secs(30))
            .expect("read timeout");
        client
            .set_write_timeout(Duration::from_secs(30))
            .expect("write timeout");
        for body in &bodies {
            client
                .send_request(|builder| {
                    shardmq_tests::send_request_body(builder, topic, 0, std::slice::from_ref(body))
                })
                .expect("pipelined send");
        }
        for _ in &bodies {
            answers.push(status_of(&client.read_frame().expect("an answer")).0);
        }
    });
    assert!(
        answers.iter().all(|s| *s == wire::Status::OK),
        "{answers:?}"
    );
    let growth_kib = peak_pipelined.saturating_sub(rss_before);
    assert!(
        growth_kib < bound_kib + 72 * 1024,
        "pipelined frames: broker RSS grew by {growth_kib} KiB ({rss_before} KiB before)"
    );
    let (records, end) = pull_queue(&mut broker.client(), topic, 0);
    assert_eq!(end, QueueEnd::End);
    let big: Vec<&TestMessage> = bodies.iter().collect();
    let stored: Vec<&Vec<u8>> = records
        .iter()
        .map(|record| &record.body)
        .filter(|body| body.starts_with(b"big-"))
        .collect();
    assert_eq!(
        stored,
        big.iter().map(|message| &message.body).collect::<Vec<_>>(),
        "the pipelined sends were not all stored in order"
    );
}
