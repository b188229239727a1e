//! Volume and membership changes through the client library against a real namesrv and broker:
//! 100,000 messages produced while a clustering group of three members (8 queues split 3/3/2)
//! loses a member without a clean shutdown and gains one back. Every message sent is consumed
//! (none lost); repeats (at-least-once: the killed member could not commit its last offsets,
//! and a hand-over may repeat a batch in flight) are counted, reported and bounded.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardmq_client::{
    ConsumeFrom, ConsumeResult, Message, MessageExt, Producer, PushConsumer, PushConsumerBuilder,
};
use shardmq_tests::LocalCluster;
use tempfile::TempDir;

const TOPIC: &str = "Volume";
const GROUP: &str = "volume-group";
const MESSAGES: usize = 100_000;
const BATCH: usize = 250;
const WAIT: Duration = Duration::from_secs(120);

/// (queue, body) of every message a member's listener saw.
type Seen = Arc<Mutex<Vec<(u32, String)>>>;

fn member(cluster: &LocalCluster, instance: &str) -> (PushConsumerBuilder, Seen) {
    let seen: Seen = Arc::default();
    let sink = Arc::clone(&seen);
    let builder = PushConsumer::builder()
        .namesrv(cluster.namesrv_addr())
        .group(GROUP)
        .instance_name(instance)
        .subscribe(TOPIC, "*")
        .consume_from(ConsumeFrom::FirstOffset)
        .persist_interval(Duration::from_millis(200))
        .listen_concurrently(move |messages: Vec<MessageExt>| {
            let sink = Arc::clone(&sink);
            async move {
                sink.lock().unwrap().extend(
                    messages
                        .into_iter()
                        .map(|m| (m.queue_id, String::from_utf8_lossy(&m.body).into_owned())),
                );
                ConsumeResult::Success
            }
        });
    (builder, seen)
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let check = || std::future::ready(check().then_some(()));
    shardmq_tests::eventually_some(WAIT, what, check).await;
}

fn queue_counts(members: &[&PushConsumer]) -> Vec<usize> {
    let mut counts: Vec<usize> = members.iter().map(|m| m.assigned_queues().len()).collect();
    counts.sort_unstable();
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_messages_survive_a_killed_and_an_added_member() {
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start(data.path());
    cluster.create_topic(TOPIC, 8);

    let (builder, seen_a) = member(&cluster, "member-a");
    let member_a = builder.start().await.unwrap();
    let (builder, seen_b) = member(&cluster, "member-b");
    let member_b = builder.start().await.unwrap();
    let (builder, seen_c) = member(&cluster, "member-c");
    let member_c = builder.start().await.unwrap();
    eventually("a 3/3/2 split of 8 queues", || {
        queue_counts(&[&member_a, &member_b, &member_c]) == [2, 3, 3]
    })
    .await;
    let queues_of_c: BTreeSet<u32> = member_c
        .assigned_queues()
        .iter()
        .map(|q| q.queue_id)
        .collect();

    let producer = Producer::builder()
        .namesrv(cluster.namesrv_addr())
        .build()
        .await
        .unwrap();
    let send_range = |from: usize, to: usize| {
        let producer = &producer;
        async move {
            for start in (from..to).step_by(BATCH) {
                let batch: Vec<Message> = (start..(start + BATCH).min(to))
                    .map(|i| Message::new(TOPIC, format!("m{i}")))
                    .collect();
                producer
                    .send_batch(batch)
                    .await
                    .expect("a batch is acknowledged");
            }
        }
    };
    send_range(0, MESSAGES / 2).await;
    // Member c dies without a clean shutdown: no final offset commit, no unregistration (its
    // connections close, so the broker drops it from the group).
    drop(member_c);
    eventually(
        "the remaining two members to take over all 8 queues",
        || queue_counts(&[&member_a, &member_b]) == [4, 4],
    )
    .await;
    send_range(MESSAGES / 2, MESSAGES * 3 / 4).await;
    let (builder, seen_d) = member(&cluster, "member-d");
    let member_d = builder.start().await.unwrap();
    eventually("a 3/3/2 split again with the new member", || {
        queue_counts(&[&member_a, &member_b, &member_d]) == [2, 3, 3]
    })
    .await;
    send_range(MESSAGES * 3 / 4, MESSAGES).await;

    let all = [&seen_a, &seen_b, &seen_c, &seen_d];
    let distinct = |all: &[&Seen]| {
        all.iter()
            .flat_map(|seen| {
                seen.lock()
                    .unwrap()
                    .iter()
                    .map(|(_, b)| b.clone())
                    .collect::<Vec<_>>()
            })
            .collect::<BTreeSet<String>>()
            .len()
    };
    eventually("every message to be consumed", || {
        distinct(&all) == MESSAGES
    })
    .await;

    let mut deliveries: BTreeMap<String, (u32, usize)> = BTreeMap::new();
    for seen in all {
        for (queue, body) in seen.lock().unwrap().iter() {
            deliveries.entry(body.clone()).or_insert((*queue, 0)).1 += 1;
        }
    }
    let expected: BTreeSet<String> = (0..MESSAGES).map(|i| format!("m{i}")).collect();
    assert_eq!(
        deliveries.keys().cloned().collect::<BTreeSet<_>>(),
        expected,
        "a message was lost or one never sent was consumed"
    );
    // At-least-once: the killed member could not commit its last offsets, so its queues may
    // repeat what it consumed after its last commit; a rebalance hand-over may repeat a batch
    // that was in flight. Both are counted; neither may be large.
    let (on_killed, elsewhere) = deliveries.values().filter(|(_, count)| *count > 1).fold(
        (0usize, 0usize),
        |(k, e), (queue, _)| {
            if queues_of_c.contains(queue) {
                (k + 1, e)
            } else {
                (k, e + 1)
            }
        },
    );
    eprintln!(
        "{MESSAGES} messages consumed; repeated: {on_killed} on the killed member's queues {queues_of_c:?}, {elsewhere} on queues handed over cleanly"
    );
    assert!(
        on_killed + elsewhere <= MESSAGES / 10,
        "{on_killed} + {elsewhere} repeated deliveries: far more than in-flight batches explain"
    );
    member_a.shutdown().await;
    member_b.shutdown().await;
    member_d.shutdown().await;
    producer.shutdown().await;
}
