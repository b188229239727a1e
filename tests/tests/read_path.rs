//! The read path against a real namesrv and broker: a pull answer is bounded by both of its
//! caps (messages and record bytes) and still carries a record larger than the byte cap, alone;
//! a push consumer with its default (large) pulls drains a backlog while producers append and
//! CommitLog segments roll over, and gets every message exactly once, in order per queue.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardmq_client::{
    ConsumeFrom, ConsumeResult, Message, MessageQueue, Producer, PullConsumer, PullOptions,
    PullStatus, PushConsumer,
};
use shardmq_tests::LocalCluster;
use tempfile::TempDir;

const WAIT: Duration = Duration::from_secs(60);

/// Queue id -> (queue offset, body number) of each delivery, in delivery order.
type Deliveries = Arc<Mutex<BTreeMap<u32, Vec<(i64, u32)>>>>;

async fn producer(cluster: &LocalCluster) -> Producer {
    Producer::builder()
        .namesrv(cluster.namesrv_addr())
        .build()
        .await
        .expect("producer")
}

/// `len` bytes of a xorshift sequence.
fn incompressible(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

async fn pull(
    consumer: &PullConsumer,
    queue: &MessageQueue,
    offset: i64,
    max_messages: u32,
    max_bytes: u32,
) -> shardmq_client::PullResult {
    let options = PullOptions {
        max_messages,
        max_bytes,
        ..PullOptions::default()
    };
    consumer
        .pull_with(queue, offset, &options)
        .await
        .expect("pull")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_is_bounded_by_messages_and_bytes_and_still_carries_one_oversized_record() {
    let data = TempDir::new().expect("temp dir");
    let cluster = LocalCluster::start(data.path());
    cluster.create_topic("Caps", 1);
    let producer = producer(&cluster).await;
    // 40 bodies of 1,000 bytes (offsets 0..40), then one of 20,000 bytes (offset 40), of
    // bytes that do not compress (the producer compresses large bodies that do).
    let small: Vec<Message> = (0..40)
        .map(|i| Message::new("Caps", vec![b'a' + (i % 26) as u8; 1000]))
        .collect();
    producer.send_batch(small).await.expect("send small");
    producer
        .send(Message::new("Caps", incompressible(20_000)))
        .await
        .expect("send large");

    let consumer = PullConsumer::builder()
        .namesrv(cluster.namesrv_addr())
        .group("caps-group")
        .build()
        .await
        .expect("pull consumer");
    let queue = consumer.queues("Caps").await.expect("queues").remove(0);

    // The message cap alone.
    let by_count = pull(&consumer, &queue, 0, 10, 0).await;
    assert_eq!(by_count.status, PullStatus::Found);
    assert_eq!(by_count.messages.len(), 10);
    assert_eq!(by_count.next_begin_offset, 10);

    // The byte cap: every stored record of a 1,000-byte body is over 1,000 bytes, so 5,000
    // bytes hold at most four of them, and at least one always comes.
    let by_bytes = pull(&consumer, &queue, 0, 1000, 5000).await;
    let count = by_bytes.messages.len();
    assert!(
        (1..=4).contains(&count),
        "{count} records within 5,000 bytes"
    );
    assert_eq!(
        by_bytes.next_begin_offset, count as i64,
        "the next pull goes on from there"
    );
    let offsets: Vec<i64> = by_bytes.messages.iter().map(|m| m.queue_offset).collect();
    assert_eq!(offsets, (0..count as i64).collect::<Vec<_>>());

    // A byte cap that reaches the large record stops before it...
    let before_large = pull(&consumer, &queue, 39, 1000, 3000).await;
    assert_eq!(before_large.messages.len(), 1);
    assert_eq!(before_large.messages[0].queue_offset, 39);
    assert_eq!(before_large.next_begin_offset, 40);
    // ...and a pull starting at it gets it, alone, although it is larger than the cap.
    let large = pull(&consumer, &queue, 40, 1000, 1000).await;
    assert_eq!(large.status, PullStatus::Found);
    assert_eq!(large.messages.len(), 1);
    assert_eq!(large.messages[0].body, incompressible(20_000));
    assert_eq!(large.next_begin_offset, 41);

    consumer.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_drains_exactly_once_in_order_while_producers_append_and_segments_roll() {
    let data = TempDir::new().expect("temp dir");
    // 1 MiB segments: the 4,800 KiB written below spans five of them.
    let cluster = LocalCluster::start_with_broker_args(
        data.path(),
        &["--segment-bytes", "1048576", "--max-message-bytes", "65536"],
    );
    cluster.create_topic("Drain", 2);
    let producer = producer(&cluster).await;
    let body = |n: u32| {
        let mut body = format!("{n:08}").into_bytes();
        body.resize(1000, b'.');
        body
    };
    // The backlog: 2,400 messages in batches of 100.
    for first in (0..2400).step_by(100) {
        let batch = (first..first + 100)
            .map(|n| Message::new("Drain", body(n)))
            .collect();
        producer.send_batch(batch).await.expect("backlog batch");
    }

    let seen: Deliveries = Arc::default();
    let sink = Arc::clone(&seen);
    let consumer = PushConsumer::builder()
        .namesrv(cluster.namesrv_addr())
        .group("drain-group")
        .subscribe("Drain", "*")
        .consume_from(ConsumeFrom::FirstOffset)
        .consume_batch_max(16)
        .listen_orderly(move |messages| {
            let sink = Arc::clone(&sink);
            async move {
                let mut seen = sink.lock().unwrap();
                for message in &messages {
                    let number: u32 = std::str::from_utf8(&message.body[..8])
                        .unwrap()
                        .parse()
                        .unwrap();
                    seen.entry(message.queue_id)
                        .or_default()
                        .push((message.queue_offset, number));
                }
                ConsumeResult::Success
            }
        })
        .start()
        .await
        .expect("push consumer");

    // More while the backlog drains: another 2,400 in batches of 50.
    for first in (2400..4800).step_by(50) {
        let batch = (first..first + 50)
            .map(|n| Message::new("Drain", body(n)))
            .collect();
        producer.send_batch(batch).await.expect("live batch");
    }

    shardmq_tests::eventually(WAIT, "every message consumed", || {
        let count: usize = seen.lock().unwrap().values().map(Vec::len).sum();
        async move { count >= 4800 }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    consumer.shutdown().await;
    producer.shutdown().await;

    let seen = seen.lock().unwrap();
    let mut numbers: Vec<u32> = seen.values().flatten().map(|(_, n)| *n).collect();
    assert_eq!(numbers.len(), 4800, "no message delivered twice");
    numbers.sort_unstable();
    assert_eq!(
        numbers,
        (0..4800).collect::<Vec<_>>(),
        "every message delivered"
    );
    for (queue_id, deliveries) in seen.iter() {
        let offsets: Vec<i64> = deliveries.iter().map(|(offset, _)| *offset).collect();
        let expected: Vec<i64> = (0..offsets.len() as i64).collect();
        assert_eq!(
            offsets, expected,
            "queue {queue_id} delivered in offset order"
        );
    }
    let segments = std::fs::read_dir(data.path())
        .expect("data dir")
        .flatten()
        .flat_map(|shard| std::fs::read_dir(shard.path().join("commitlog")).into_iter())
        .flatten()
        .count();
    assert!(
        segments >= 4,
        "the CommitLog rolled over ({segments} segments)"
    );
}
