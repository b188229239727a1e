//! Orderly consumption under broker-side queue locks, against a real namesrv and broker: a
//! group consumes a topic of ordered sends (per key) while members are added and one is
//! killed without a clean shutdown. Every listener call is recorded as (queue, offset,
//! member, start, end); afterwards no two calls on one queue overlap in time, each member
//! consumes its queues in offset order without gaps, a queue moved by a clean hand-over
//! resumes exactly after the last message consumed, only the killed member's queues may be
//! consumed again from its last committed offset, and each key's messages are first consumed
//! in send order. The broker's lock expiry is shortened to 3 s so the killed member's queues
//! move on quickly.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shardmq_client::{ConsumeFrom, ConsumeResult, Message, MessageExt, Producer, PushConsumer};
use shardmq_tests::LocalCluster;
use tempfile::TempDir;

const TOPIC: &str = "OrderedLocks";
const GROUP: &str = "ordered-locks";
const QUEUES: u32 = 4;
const KEYS: usize = 8;
const PER_KEY: usize = 60;

/// How long the test waits for one phase.
const WAIT: Duration = Duration::from_secs(60);

/// One listener call.
#[derive(Debug, Clone)]
struct Call {
    queue_id: u32,
    offset: i64,
    member: &'static str,
    started: Instant,
    ended: Instant,
    body: String,
}

type Calls = Arc<Mutex<Vec<Call>>>;

async fn eventually<F: FnMut() -> Fut, Fut: Future<Output = bool>>(what: &str, check: F) {
    shardmq_tests::eventually(WAIT, what, check).await;
}

async fn member(cluster: &LocalCluster, name: &'static str, calls: &Calls) -> PushConsumer {
    let sink = Arc::clone(calls);
    PushConsumer::builder()
        .namesrv(cluster.namesrv_addr())
        .group(GROUP)
        .instance_name(name)
        .subscribe(TOPIC, "*")
        .consume_from(ConsumeFrom::FirstOffset)
        .rebalance_interval(Duration::from_millis(500))
        .persist_interval(Duration::from_millis(200))
        .orderly_lock_interval(Duration::from_millis(500))
        // Below the broker's 3 s expiry, as the default 30 s is below its 60 s.
        .orderly_lock_ttl(Duration::from_millis(2_000))
        .listen_orderly(move |messages: Vec<MessageExt>| {
            let sink = Arc::clone(&sink);
            async move {
                let started = Instant::now();
                tokio::time::sleep(Duration::from_millis(25)).await;
                let ended = Instant::now();
                let mut calls = sink.lock().unwrap();
                for message in messages.iter().filter(|m| m.topic() == TOPIC) {
                    calls.push(Call {
                        queue_id: message.queue_id,
                        offset: message.queue_offset,
                        member: name,
                        started,
                        ended,
                        body: String::from_utf8_lossy(&message.body).into_owned(),
                    });
                }
                ConsumeResult::Success
            }
        })
        .start()
        .await
        .unwrap_or_else(|error| panic!("starting {name}: {error}"))
}

fn consumed(calls: &Calls) -> BTreeSet<(u32, i64)> {
    calls
        .lock()
        .unwrap()
        .iter()
        .map(|call| (call.queue_id, call.offset))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queues_are_consumed_in_order_by_one_member_at_a_time() {
    let data = TempDir::new().expect("temp dir");
    let cluster =
        LocalCluster::start_with_broker_args(data.path(), &["--queue-lock-expiry-ms", "3000"]);
    cluster.create_topic(TOPIC, QUEUES);
    let calls: Calls = Arc::default();

    // Ordered sends: key k's messages all go to one queue, in sequence, spread over time so
    // that the membership changes below happen mid-stream.
    let producer = Producer::builder()
        .namesrv(cluster.namesrv_addr())
        .build()
        .await
        .expect("producer");
    let sending = {
        let producer = producer.clone();
        tokio::spawn(async move {
            let mut sent = BTreeSet::new();
            for sequence in 0..PER_KEY {
                for key in 0..KEYS {
                    let key = format!("key-{key}");
                    let result = producer
                        .send_ordered(Message::new(TOPIC, format!("{key}:{sequence}")), &key)
                        .await
                        .expect("ordered send");
                    sent.insert((result.queue.queue_id, result.queue_offset));
                }
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
            sent
        })
    };

    let member_a = member(&cluster, "member-a", &calls).await;
    eventually("member a to consume", || async {
        consumed(&calls).len() >= 60
    })
    .await;
    let member_b = member(&cluster, "member-b", &calls).await;
    eventually("a and b to share the queues", || async {
        !member_a.assigned_queues().is_empty()
            && member_b.assigned_queues().len() == 2
            && calls.lock().unwrap().iter().any(|c| c.member == "member-b")
    })
    .await;
    let member_c = member(&cluster, "member-c", &calls).await;
    eventually("c to consume", || async {
        calls.lock().unwrap().iter().any(|c| c.member == "member-c")
    })
    .await;
    assert!(
        !member_a.assigned_queues().is_empty(),
        "member a owns queues when it is killed"
    );
    let a_queues: BTreeSet<u32> = member_a
        .assigned_queues()
        .iter()
        .filter(|queue| queue.topic == TOPIC)
        .map(|queue| queue.queue_id)
        .collect();
    // Killed: no final commit, no unlock; its locks must expire at the broker.
    drop(member_a);
    let killed_at = Instant::now();

    let sent = sending.await.expect("sending task");
    assert_eq!(sent.len(), KEYS * PER_KEY);
    eventually("every message to be consumed", || async {
        consumed(&calls).is_superset(&sent)
    })
    .await;
    member_b.shutdown().await;
    member_c.shutdown().await;
    producer.shutdown().await;

    let calls = calls.lock().unwrap().clone();
    let mut by_queue: BTreeMap<u32, Vec<&Call>> = BTreeMap::new();
    for call in &calls {
        by_queue.entry(call.queue_id).or_default().push(call);
    }
    let mut rewinds = 0;
    for (queue_id, queue_calls) in &mut by_queue {
        queue_calls.sort_by_key(|call| (call.started, call.offset));
        for pair in queue_calls.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            assert!(
                after.started >= before.ended,
                "queue {queue_id}: {} consumed offset {} while {} was still consuming offset {}",
                after.member,
                after.offset,
                before.member,
                before.offset
            );
            if after.member == before.member {
                assert_eq!(
                    after.offset,
                    before.offset + 1,
                    "queue {queue_id}: {} went from offset {} to {}",
                    after.member,
                    before.offset,
                    after.offset
                );
            } else if after.offset != before.offset + 1 {
                // Only the killed member's queues may be consumed again, from its last
                // committed offset, and only after it died.
                assert!(
                    before.member == "member-a"
                        && a_queues.contains(queue_id)
                        && after.offset <= before.offset
                        && after.started >= killed_at,
                    "queue {queue_id}: moved from {} at offset {} to {} at offset {}",
                    before.member,
                    before.offset,
                    after.member,
                    after.offset
                );
                rewinds += 1;
            }
        }
    }
    assert!(
        rewinds <= a_queues.len(),
        "at most one rewind per killed queue"
    );
    let members: BTreeSet<&str> = calls.iter().map(|call| call.member).collect();
    assert_eq!(members.len(), 3, "every member consumed: {members:?}");

    // Each key's messages were first consumed in send order.
    let mut in_order = calls.clone();
    in_order.sort_by_key(|call| call.started);
    let mut next_per_key: BTreeMap<String, usize> = BTreeMap::new();
    for call in &in_order {
        let (key, sequence) = call.body.split_once(':').expect("key:sequence");
        let sequence: usize = sequence.parse().expect("sequence");
        let next = next_per_key.entry(key.to_owned()).or_default();
        assert!(
            sequence <= *next,
            "{key}: message {sequence} consumed before message {next}"
        );
        if sequence == *next {
            *next += 1;
        }
    }
    assert!(next_per_key.values().all(|next| *next == PER_KEY));
}
