//! The push consumer against a real namesrv and broker: a clustering group of two members
//! splits 8 queues 4/4 and together consumes every message exactly once, committing its
//! offsets; broadcasting members each get everything and keep local offsets; an orderly
//! listener sees each key's messages in send order; `ReconsumeLater` redelivers (through the
//! group's retry topic) instead of losing; a backlogged queue's flow limits leave room for a pull
//! beside the answer being consumed, and no more. Each test starts its own namesrv and broker.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shardmq_client::{
    Admin, ConsumeFrom, ConsumeResult, FlowLimits, Message, MessageExt, MessageModel, Producer,
    PushConsumer, PushConsumerBuilder,
};
use shardmq_tests::LocalCluster;
use tempfile::TempDir;

/// How long a test waits for consumers to settle or messages to arrive.
const WAIT: Duration = Duration::from_secs(20);

/// What a listener saw: every message, in delivery order.
type Seen = Arc<Mutex<Vec<MessageExt>>>;

struct Setup {
    cluster: LocalCluster,
    data: TempDir,
}

fn cluster_with_topic(topic: &str, queues: u32) -> Setup {
    let data = TempDir::new().expect("temp dir");
    let cluster = LocalCluster::start(data.path());
    cluster.create_topic(topic, queues);
    Setup { cluster, data }
}

/// Polls `check` every 20 ms until it holds; panics naming `what` after [`WAIT`].
async fn eventually<F: FnMut() -> Fut, Fut: Future<Output = bool>>(what: &str, check: F) {
    shardmq_tests::eventually(WAIT, what, check).await;
}

fn seen_len(seen: &Seen) -> usize {
    seen.lock().unwrap().len()
}

fn consumer(setup: &Setup, group: &str, instance: &str, topic: &str) -> PushConsumerBuilder {
    PushConsumer::builder()
        .namesrv(setup.cluster.namesrv_addr())
        .group(group)
        .instance_name(instance)
        .subscribe(topic, "*")
        .consume_from(ConsumeFrom::FirstOffset)
}

/// A listener that records every message and succeeds.
fn recording(builder: PushConsumerBuilder) -> (PushConsumerBuilder, Seen) {
    let seen: Seen = Arc::default();
    let sink = Arc::clone(&seen);
    let builder = builder.listen_concurrently(move |messages| {
        let sink = Arc::clone(&sink);
        async move {
            sink.lock().unwrap().extend(messages);
            ConsumeResult::Success
        }
    });
    (builder, seen)
}

async fn producer(setup: &Setup) -> Producer {
    Producer::builder()
        .namesrv(setup.cluster.namesrv_addr())
        .build()
        .await
        .expect("producer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_split_eight_queues_and_consume_each_message_once() {
    let setup = cluster_with_topic("Shared", 8);
    let (builder, seen_a) = recording(consumer(&setup, "shared-group", "member-a", "Shared"));
    let member_a = builder.start().await.expect("member a");
    eventually("member a to own all 8 queues", || async {
        member_a.assigned_queues().len() == 8
    })
    .await;
    let (builder, seen_b) = recording(consumer(&setup, "shared-group", "member-b", "Shared"));
    let member_b = builder.start().await.expect("member b");
    // Member b's heartbeat makes the broker notify member a, which gives up half at once.
    eventually("a 4/4 split", || async {
        member_a.assigned_queues().len() == 4 && member_b.assigned_queues().len() == 4
    })
    .await;
    let queues_a: BTreeSet<u32> = member_a
        .assigned_queues()
        .iter()
        .map(|q| q.queue_id)
        .collect();
    let queues_b: BTreeSet<u32> = member_b
        .assigned_queues()
        .iter()
        .map(|q| q.queue_id)
        .collect();
    assert!(queues_a.is_disjoint(&queues_b));
    assert_eq!(queues_a.len() + queues_b.len(), 8);

    let producer = producer(&setup).await;
    let mut sent = BTreeSet::new();
    for index in 0..80 {
        let result = producer
            .send(Message::new("Shared", format!("message {index}")))
            .await
            .unwrap();
        sent.insert(result.msg_id.to_string());
    }
    eventually("all 80 messages", || async {
        seen_len(&seen_a) + seen_len(&seen_b) >= 80
    })
    .await;
    // A moment for any duplicate to show up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut received: BTreeMap<String, usize> = BTreeMap::new();
    for (seen, own_queues) in [(&seen_a, &queues_a), (&seen_b, &queues_b)] {
        for message in seen.lock().unwrap().iter() {
            assert!(
                own_queues.contains(&message.queue_id),
                "a member got a message of a queue it does not own"
            );
            *received.entry(message.msg_id()).or_default() += 1;
        }
    }
    assert_eq!(received.keys().cloned().collect::<BTreeSet<_>>(), sent);
    assert!(
        received.values().all(|count| *count == 1),
        "each message exactly once"
    );
    assert!(seen_len(&seen_a) > 0 && seen_len(&seen_b) > 0);

    // Shutdown commits every offset: the group has nothing left to consume.
    member_a.shutdown().await;
    member_b.shutdown().await;
    let admin = Admin::builder()
        .namesrv(setup.cluster.namesrv_addr())
        .build()
        .await
        .unwrap();
    let progress = admin
        .group_progress("shared-group", "Shared")
        .await
        .unwrap()
        .complete()
        .unwrap();
    assert_eq!(progress.len(), 8);
    for queue in &progress {
        assert_eq!(queue.committed_offset, Some(10), "{queue:?}");
        assert_eq!(queue.lag(), 0);
    }
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_leaves_hands_its_queues_over_where_it_stopped() {
    let setup = cluster_with_topic("Handover", 4);
    let producer = producer(&setup).await;
    for index in 0..20 {
        producer
            .send(Message::new("Handover", format!("first {index}")))
            .await
            .unwrap();
    }
    let (builder, seen_a) = recording(consumer(&setup, "handover-group", "leaving", "Handover"));
    let member_a = builder.start().await.unwrap();
    eventually("the first 20", || async { seen_len(&seen_a) == 20 }).await;
    member_a.shutdown().await;

    for index in 0..20 {
        producer
            .send(Message::new("Handover", format!("second {index}")))
            .await
            .unwrap();
    }
    let (builder, seen_b) = recording(consumer(&setup, "handover-group", "staying", "Handover"));
    let member_b = builder.start().await.unwrap();
    eventually("the second 20", || async { seen_len(&seen_b) >= 20 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bodies: Vec<String> = seen_b
        .lock()
        .unwrap()
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect();
    assert_eq!(bodies.len(), 20, "nothing consumed twice: {bodies:?}");
    assert!(bodies.iter().all(|b| b.starts_with("second")));
    member_b.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcasting_members_each_get_every_message() {
    let setup = cluster_with_topic("Broadcast", 4);
    let offsets_dir = setup.data.path().join("client-offsets");
    let start = |instance: &'static str| {
        let builder = consumer(&setup, "broadcast-group", instance, "Broadcast")
            .message_model(MessageModel::Broadcasting)
            .offset_store_dir(&offsets_dir);
        recording(builder)
    };
    let (builder, seen_a) = start("listener-a");
    let member_a = builder.start().await.unwrap();
    let (builder, seen_b) = start("listener-b");
    let member_b = builder.start().await.unwrap();
    assert_eq!(member_a.assigned_queues().len(), 4);
    assert_eq!(member_b.assigned_queues().len(), 4);

    let producer = producer(&setup).await;
    let mut sent = BTreeSet::new();
    for index in 0..30 {
        let result = producer
            .send(Message::new("Broadcast", format!("news {index}")))
            .await
            .unwrap();
        sent.insert(result.msg_id.to_string());
    }
    for seen in [&seen_a, &seen_b] {
        eventually("every message at each member", || async {
            seen_len(seen) >= 30
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for seen in [&seen_a, &seen_b] {
        let ids: Vec<String> = seen
            .lock()
            .unwrap()
            .iter()
            .map(MessageExt::msg_id)
            .collect();
        assert_eq!(ids.len(), 30);
        assert_eq!(ids.into_iter().collect::<BTreeSet<_>>(), sent);
    }

    // Each instance keeps its progress in its own file.
    member_a.shutdown().await;
    let file = offsets_dir
        .join("listener-a")
        .join("broadcast-group")
        .join("offsets.json");
    let stored: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("offsets file")).unwrap();
    let total: i64 = stored["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["offset"].as_i64().unwrap())
        .sum();
    assert_eq!(total, 30);

    // Restarted with the same instance name, it resumes after what it consumed.
    let (builder, seen_again) = start("listener-a");
    let member_a = builder.start().await.unwrap();
    producer
        .send(Message::new("Broadcast", "one more"))
        .await
        .unwrap();
    eventually("the new message", || async { seen_len(&seen_again) >= 1 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(seen_len(&seen_again), 1);
    member_a.shutdown().await;
    member_b.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orderly_listener_sees_each_key_in_send_order() {
    let setup = cluster_with_topic("Ordered", 4);
    let seen: Arc<Mutex<Vec<(String, u32, u32)>>> = Arc::default();
    let sink = Arc::clone(&seen);
    let refused_once = Arc::new(Mutex::new(false));
    let member = consumer(&setup, "ordered-group", "ordered", "Ordered")
        .orderly_suspend(Duration::from_millis(100))
        .listen_orderly(move |messages| {
            let sink = Arc::clone(&sink);
            let refused_once = Arc::clone(&refused_once);
            async move {
                assert_eq!(messages.len(), 1, "one message per call by default");
                let message = &messages[0];
                let text = String::from_utf8_lossy(&message.body).into_owned();
                let (key, sequence) = text.split_once(' ').unwrap();
                let sequence: u32 = sequence.parse().unwrap();
                // Refuse one message once: the queue pauses and it comes again, in place.
                if key == "key-1" && sequence == 5 {
                    let mut refused = refused_once.lock().unwrap();
                    if !*refused {
                        *refused = true;
                        return ConsumeResult::ReconsumeLater;
                    }
                }
                sink.lock()
                    .unwrap()
                    .push((key.to_owned(), sequence, message.queue_id));
                ConsumeResult::Success
            }
        })
        .start()
        .await
        .unwrap();

    let producer = producer(&setup).await;
    let keys = ["key-0", "key-1", "key-2", "key-3", "key-4"];
    for sequence in 0..20 {
        for key in keys {
            producer
                .send_ordered(Message::new("Ordered", format!("{key} {sequence}")), key)
                .await
                .unwrap();
        }
    }
    eventually("all 100 messages", || async {
        seen.lock().unwrap().len() >= 100
    })
    .await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 100);
    for key in keys {
        let of_key: Vec<&(String, u32, u32)> = seen.iter().filter(|(k, _, _)| k == key).collect();
        let sequences: Vec<u32> = of_key.iter().map(|(_, s, _)| *s).collect();
        assert_eq!(sequences, (0..20).collect::<Vec<_>>(), "{key} in order");
        let queues: BTreeSet<u32> = of_key.iter().map(|(_, _, q)| *q).collect();
        assert_eq!(queues.len(), 1, "{key} in one queue");
    }
    member.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconsume_later_redelivers_through_the_retry_topic() {
    // Short delay levels: a sent-back message returns after 200 ms, not RocketMQ's 10 s.
    let data = TempDir::new().expect("temp dir");
    let cluster = LocalCluster::start_with_broker_args(
        data.path(),
        &["--delay-levels", "200ms 200ms 200ms 200ms 200ms 200ms"],
    );
    cluster.create_topic("Retry", 1);
    let setup = Setup { cluster, data };
    let deliveries: Arc<Mutex<Vec<(String, i32)>>> = Arc::default();
    let sink = Arc::clone(&deliveries);
    let member = consumer(&setup, "retry-group", "retrying", "Retry")
        .reconsume_delay(Duration::from_millis(200))
        .persist_interval(Duration::from_millis(100))
        .listen_concurrently(move |messages| {
            let sink = Arc::clone(&sink);
            async move {
                let message = &messages[0];
                let body = String::from_utf8_lossy(&message.body).into_owned();
                sink.lock()
                    .unwrap()
                    .push((body.clone(), message.reconsume_times));
                if body == "fragile" && message.reconsume_times < 2 {
                    ConsumeResult::ReconsumeLater
                } else if body == "panics" && message.reconsume_times == 0 {
                    panic!("a listener bug");
                } else {
                    ConsumeResult::Success
                }
            }
        })
        .start()
        .await
        .unwrap();
    let producer = producer(&setup).await;
    for body in ["fragile", "panics", "steady"] {
        producer.send(Message::new("Retry", body)).await.unwrap();
    }
    let admin = Admin::builder()
        .namesrv(setup.cluster.namesrv_addr())
        .build()
        .await
        .unwrap();
    // A refused message is sent back to the broker (stored for %RETRY%retry-group), so the
    // offset of its own queue may pass it; it comes back through the retry topic.
    eventually("the offset to pass all three", || async {
        let progress = admin
            .group_progress("retry-group", "Retry")
            .await
            .unwrap()
            .complete()
            .unwrap();
        progress[0].committed_offset == Some(3)
    })
    .await;
    eventually(
        "the third delivery of the fragile message and the panic's retry",
        || async {
            let deliveries = deliveries.lock().unwrap();
            deliveries
                .iter()
                .any(|(b, times)| b == "fragile" && *times == 2)
                && deliveries
                    .iter()
                    .any(|(b, times)| b == "panics" && *times == 1)
        },
    )
    .await;
    let deliveries = deliveries.lock().unwrap().clone();
    let fragile: Vec<i32> = deliveries
        .iter()
        .filter(|(b, _)| b == "fragile")
        .map(|(_, times)| *times)
        .collect();
    assert_eq!(
        fragile,
        vec![0, 1, 2],
        "delivered again, counting the retries"
    );
    let panics = deliveries.iter().filter(|(b, _)| b == "panics").count();
    assert_eq!(panics, 2, "a panic counts as ReconsumeLater");
    member.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumption_resumes_after_the_broker_restarts() {
    let mut setup = cluster_with_topic("Restarts", 2);
    let (builder, seen) = recording(consumer(&setup, "restart-group", "survivor", "Restarts"));
    let member = builder.start().await.unwrap();
    let producer = producer(&setup).await;
    for index in 0..4 {
        producer
            .send(Message::new("Restarts", format!("before {index}")))
            .await
            .unwrap();
    }
    eventually("the first 4", || async { seen_len(&seen) == 4 }).await;

    // A clean restart (on a new port): the consumer finds the broker again through the name
    // server, reconnects, heartbeats there and goes on from where it was.
    setup.cluster.broker.stop();
    setup.cluster.broker.restart();
    let mut sent = 0;
    let deadline = Instant::now() + WAIT;
    while sent < 4 {
        assert!(Instant::now() < deadline, "sends never worked again");
        if producer
            .send(Message::new("Restarts", format!("after {sent}")))
            .await
            .is_ok()
        {
            sent += 1;
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    eventually("the 4 sent after the restart", || async {
        seen_len(&seen) >= 8
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bodies: BTreeSet<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect();
    assert_eq!(bodies.len(), 8, "every message: {bodies:?}");
    assert_eq!(seen_len(&seen), 8, "each once");
    assert_eq!(member.assigned_queues().len(), 2);
    member.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_match_exactly_even_when_the_broker_hash_collides() {
    let setup = cluster_with_topic("Tagged", 1);
    // "Aa" and "BB" have the same Java hash code (2112): the broker's hash filter lets both
    // through, and the client drops "BB".
    let (builder, seen) = recording(
        PushConsumer::builder()
            .namesrv(setup.cluster.namesrv_addr())
            .group("tag-group")
            .subscribe("Tagged", "Aa || TagC")
            .consume_from(ConsumeFrom::FirstOffset)
            .persist_interval(Duration::from_millis(100)),
    );
    let member = builder.start().await.unwrap();
    let producer = producer(&setup).await;
    for (index, tag) in ["Aa", "BB", "TagC", "TagD", "Aa", "BB"].iter().enumerate() {
        producer
            .send(Message::new("Tagged", format!("{tag} {index}")).with_tags(*tag))
            .await
            .unwrap();
    }
    eventually("the three wanted messages", || async {
        seen_len(&seen) >= 3
    })
    .await;
    let admin = Admin::builder()
        .namesrv(setup.cluster.namesrv_addr())
        .build()
        .await
        .unwrap();
    // The offset moves past the filtered-out messages too.
    eventually("the offset to reach the end", || async {
        let progress = admin
            .group_progress("tag-group", "Tagged")
            .await
            .unwrap()
            .complete()
            .unwrap();
        progress[0].committed_offset == Some(6)
    })
    .await;
    let tags: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|m| m.tags().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(tags, ["Aa", "TagC", "Aa"]);
    member.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_with_sigkill_leaves_its_group_within_a_second() {
    let setup = cluster_with_topic("Abandoned", 8);
    let (builder, _seen) = recording(consumer(&setup, "abandoned-group", "survivor", "Abandoned"));
    let survivor = builder.start().await.expect("the surviving member");
    eventually("the survivor to own all 8 queues", || async {
        survivor.assigned_queues().len() == 8
    })
    .await;
    // A second member in its own process (shardmq-perf's push consumer), killed with SIGKILL
    // while it holds half the queues and has pulls parked on the broker.
    let mut doomed = std::process::Command::new(shardmq_tests::binary_path("shardmq-perf"))
        .args([
            "consume",
            "--namesrv",
            &setup.cluster.namesrv_addr(),
            "--topic",
            "Abandoned",
            "--group",
            "abandoned-group",
            "--consumers",
            "1",
            "--from",
            "last",
            "--duration",
            "60",
            "--quiet",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the CLI consumer");
    eventually("the survivor to give up half the queues", || async {
        survivor.assigned_queues().len() == 4
    })
    .await;
    // Let the doomed member's pulls park (long polling holds them for up to 15 s).
    tokio::time::sleep(Duration::from_millis(500)).await;
    doomed.kill().expect("SIGKILL the CLI consumer");
    let killed_at = Instant::now();
    doomed.wait().expect("reap it");
    eventually("the survivor to own all 8 queues again", || async {
        survivor.assigned_queues().len() == 8
    })
    .await;
    let took = killed_at.elapsed();
    assert!(
        took < Duration::from_millis(2_000),
        "the killed member held its queues for {took:?} (its parked pulls kept it in the group)"
    );
    survivor.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_example_stops_cleanly_on_sigterm() {
    use std::io::{BufRead, BufReader};
    let setup = cluster_with_topic("ExampleTopic", 4);
    // Built by `cargo test --workspace` with the client crate's examples.
    let mut example = std::process::Command::new(shardmq_tests::binary_path("examples/consumer"))
        .env("SHARDMQ_NAMESRV", setup.cluster.namesrv_addr())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the consumer example");
    let stdout = example.stdout.take().expect("its stdout");
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let started = lines_rx
        .recv_timeout(WAIT)
        .expect("the example printed nothing");
    assert!(started.contains("consuming queues"), "{started}");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &example.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = example.try_wait().expect("wait for the example") {
            break exit;
        }
        assert!(Instant::now() < deadline, "the example ignored SIGTERM");
        // Polling a child process for its exit.
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "the example exited with {exit} on SIGTERM");
    let last = lines_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the example's closing line");
    assert!(last.starts_with("consumed "), "{last}");
}

/// A backlog raises a queue's message limit to `backlog_pulls` pulls (so one pull travels while
/// the previous answer is consumed), and the consumer still never holds more than that plus
/// the one pull a pipelined loop may have beyond it; every message arrives once. The listener
/// holds every call until the test lets go, so what is cached is what the listener holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlogged_queue_holds_two_pulls_beyond_a_smaller_limit_and_no_more() {
    const MESSAGES: usize = 400;
    const PULL_BATCH: u32 = 16;
    const MAX_CACHED: usize = 8;
    let setup = cluster_with_topic("Backlog", 1);
    let producer = producer(&setup).await;
    for first in (0..MESSAGES).step_by(50) {
        let batch = (first..first + 50)
            .map(|index| Message::new("Backlog", format!("backlog {index}")))
            .collect();
        producer.send_batch(batch).await.expect("a batch");
    }
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most_held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen: Seen = Arc::default();
    let consumer = {
        let (gate, held, most_held, seen) = (
            Arc::clone(&gate),
            Arc::clone(&held),
            Arc::clone(&most_held),
            Arc::clone(&seen),
        );
        consumer(&setup, "backlog-group", "backlog", "Backlog")
            // More listener calls than can be cached: every cached message is in a call.
            .consume_threads(MESSAGES)
            .consume_batch_max(1)
            .pull_batch(PULL_BATCH)
            .flow_limits(FlowLimits {
                max_cached_messages: MAX_CACHED,
                backlog_pulls: 2,
                ..FlowLimits::default()
            })
            .listen_concurrently(move |messages| {
                let (gate, held, most_held, seen) = (
                    Arc::clone(&gate),
                    Arc::clone(&held),
                    Arc::clone(&most_held),
                    Arc::clone(&seen),
                );
                async move {
                    use std::sync::atomic::Ordering::SeqCst;
                    let now = held.fetch_add(messages.len(), SeqCst) + messages.len();
                    most_held.fetch_max(now, SeqCst);
                    gate.acquire().await.expect("the gate stays open").forget();
                    seen.lock().unwrap().extend(messages.iter().cloned());
                    held.fetch_sub(messages.len(), SeqCst);
                    ConsumeResult::Success
                }
            })
            .start()
            .await
            .expect("a push consumer")
    };
    let raised = 2 * PULL_BATCH as usize;
    // More than the fixed limit plus one pull can only be held under the raised limit.
    eventually(
        "the consumer to hold more than its fixed limit allows",
        || async {
            held.load(std::sync::atomic::Ordering::SeqCst) > MAX_CACHED + PULL_BATCH as usize
        },
    )
    .await;
    gate.add_permits(MESSAGES);
    eventually("every message", || async { seen_len(&seen) >= MESSAGES }).await;
    consumer.shutdown().await;
    producer.shutdown().await;
    let most = most_held.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        most <= raised + PULL_BATCH as usize,
        "held {most} messages at once, over two pulls ({raised}) plus one pull in flight"
    );
    let bodies: BTreeSet<Vec<u8>> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|message| message.body.to_vec())
        .collect();
    assert_eq!(
        (seen_len(&seen), bodies.len()),
        (MESSAGES, MESSAGES),
        "every message exactly once"
    );
}
