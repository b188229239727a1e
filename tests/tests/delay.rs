//! Delay levels and timer messages against a real namesrv and broker (short delay levels via
//! `--delay-levels`): a delayed message is invisible in its topic until its level's delay has
//! passed and then appears once, with its tag, keys, properties and id; a timer message
//! (`deliver_at_ms`, `delay_ms`) likewise at its time; a time beyond the horizon is refused; and
//! messages scheduled when the broker is killed with SIGKILL (or stopped) are all delivered after
//! the restart — none lost, and none twice after a graceful stop.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use shardmq_client::{
    now_ms, wire, Admin, Message, MessageExt, Producer, PullConsumer, PullOptions, PullStatus,
    TagExpression,
};
use shardmq_tests::LocalCluster;
use tempfile::TempDir;

/// Longest any test waits for a condition.
const WAIT: Duration = Duration::from_secs(30);

/// The short levels the tests run with: level 1 = 1 s, level 2 = 2 s, level 3 = 3 s.
const LEVELS: &str = "1s 2s 3s";

/// Clock readings on one machine may differ by the ms truncation of each side.
const CLOCK_SLACK_MS: i64 = 5;

/// How late a scheduled message may be stored in its topic. The scheduler wakes at the due
/// time (no polling tick); this leaves room for a loaded 2-core CI machine, and a scheduler
/// that polled once a second or re-checked only on the next send would exceed it.
const MAX_LATE_MS: i64 = 1_000;

fn start_cluster(data: &TempDir, extra: &[&str]) -> LocalCluster {
    let mut args = vec![
        "--delay-levels",
        LEVELS,
        "--schedule-persist-interval-ms",
        "200",
    ];
    args.extend_from_slice(extra);
    LocalCluster::start_with_broker_args(data.path(), &args)
}

async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    shardmq_tests::eventually_some(WAIT, what, check).await
}

async fn new_producer(cluster: &LocalCluster) -> Producer {
    Producer::builder()
        .namesrv(cluster.namesrv_addr())
        .build()
        .await
        .expect("producer")
}

async fn reader(cluster: &LocalCluster) -> PullConsumer {
    PullConsumer::builder()
        .namesrv(cluster.namesrv_addr())
        .group("delay-test-reader")
        .build()
        .await
        .expect("pull consumer")
}

/// Every message stored in `topic` now (all queues, oldest first).
async fn read_topic(consumer: &PullConsumer, topic: &str) -> Vec<MessageExt> {
    let options = PullOptions {
        max_messages: 32,
        tags: TagExpression::parse("*").unwrap(),
        wait: Duration::ZERO,
        ..PullOptions::default()
    };
    let mut messages = Vec::new();
    for queue in consumer.queues(topic).await.expect("queues") {
        let (min, max) = consumer.queue_offsets(&queue).await.expect("offsets");
        let mut offset = min;
        while offset < max {
            let result = consumer
                .pull_with(&queue, offset, &options)
                .await
                .expect("pull");
            if result.status == PullStatus::Found {
                messages.extend(result.messages);
            }
            assert!(result.next_begin_offset > offset, "pull made no progress");
            offset = result.next_begin_offset;
        }
    }
    messages
}

fn count_by_id(messages: &[MessageExt]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for message in messages {
        *counts.entry(message.msg_id()).or_default() += 1;
    }
    counts
}

/// Waits until the namesrv routes `topic` to the broker's current address (after a restart the
/// broker listens on a new port and registers again).
async fn wait_routed_to_current_broker(cluster: &LocalCluster, topic: &str) {
    let admin = Admin::builder()
        .namesrv(cluster.namesrv_addr())
        .build()
        .await
        .expect("admin");
    let address = cluster.broker_addr();
    eventually("the route to the restarted broker", || async {
        let route = admin.route(topic).await.ok()?;
        route
            .brokers
            .values()
            .any(|broker| broker.addresses.values().any(|a| *a == address))
            .then_some(())
    })
    .await;
    admin.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_stays_invisible_until_its_level_has_passed() {
    let data = TempDir::new().unwrap();
    let cluster = start_cluster(&data, &[]);
    cluster.create_topic("Delayed", 1);
    let producer = new_producer(&cluster).await;
    let consumer = reader(&cluster).await;

    let sent_at_ms = now_ms();
    let sent = producer
        .send(
            Message::new("Delayed", "later")
                .with_tags("TagA")
                .with_keys(["order-7"])
                .with_property("region", "eu")
                .with_delay_level(2),
        )
        .await
        .expect("a delayed send is accepted");
    assert!(
        sent.is_scheduled() && sent.queue_offset == -1,
        "a scheduled message has no queue offset until delivered, got {}",
        sent.queue_offset
    );
    assert_eq!(sent.queue.topic, "Delayed");
    assert!(
        read_topic(&consumer, "Delayed").await.is_empty(),
        "visible right after the send"
    );
    let delivered = eventually("the delayed message", || async {
        let messages = read_topic(&consumer, "Delayed").await;
        if !messages.is_empty() {
            // Whenever it shows up, its level (2 s) must have passed.
            assert!(
                now_ms() >= sent_at_ms + 2_000 - CLOCK_SLACK_MS,
                "visible {} ms after the send, before its 2 s delay",
                now_ms() - sent_at_ms
            );
        }
        messages.into_iter().next()
    })
    .await;
    assert_eq!(delivered.msg_id(), sent.msg_id);
    assert_eq!(delivered.topic(), "Delayed");
    assert_eq!(delivered.queue_id, 0);
    assert_eq!(delivered.tags(), Some("TagA"));
    assert_eq!(delivered.keys(), vec!["order-7"]);
    assert_eq!(delivered.property("region"), Some("eu"));
    assert_eq!(&delivered.body[..], b"later");
    for scheduling in ["DELAY", "REAL_TOPIC", "REAL_QID"] {
        assert_eq!(delivered.property(scheduling), None, "{scheduling} kept");
    }
    assert!(
        delivered.store_timestamp_ms >= delivered.born_timestamp_ms + 2_000 - CLOCK_SLACK_MS,
        "stored in the topic {} ms after it was sent",
        delivered.store_timestamp_ms - delivered.born_timestamp_ms
    );
    let late_ms = delivered.store_timestamp_ms - (delivered.born_timestamp_ms + 2_000);
    assert!(
        late_ms <= MAX_LATE_MS,
        "stored {late_ms} ms after its 2 s level had passed"
    );
    assert_eq!(
        delivered.queue_offset, 0,
        "delivered as the queue's first message"
    );
    // A message sent without a delay gets its real position at once.
    let now = producer.send(Message::new("Delayed", "now")).await.unwrap();
    assert!(!now.is_scheduled());
    assert_eq!(now.queue_offset, 1, "after the delivered delayed message");

    // A later message of the same level comes after it, once.
    producer
        .send(Message::new("Delayed", "marker").with_delay_level(2))
        .await
        .unwrap();
    eventually("the marker", || async {
        (read_topic(&consumer, "Delayed").await.len() >= 3).then_some(())
    })
    .await;
    let bodies: Vec<Vec<u8>> = read_topic(&consumer, "Delayed")
        .await
        .iter()
        .map(|m| m.body.to_vec())
        .collect();
    assert_eq!(
        bodies,
        vec![b"later".to_vec(), b"now".to_vec(), b"marker".to_vec()]
    );

    producer.shutdown().await;
    consumer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_messages_arrive_at_their_time_and_beyond_the_horizon_is_refused() {
    let data = TempDir::new().unwrap();
    let cluster = start_cluster(&data, &["--timer-max-delay-ms", "60000"]);
    cluster.create_topic("Timed", 2);
    let producer = new_producer(&cluster).await;
    let consumer = reader(&cluster).await;

    let start_ms = now_ms();
    let at = producer
        .send(Message::new("Timed", "at").with_deliver_at_ms(start_ms + 1_500))
        .await
        .expect("deliver_at accepted");
    let after = producer
        .send(Message::new("Timed", "after").with_delay(Duration::from_millis(700)))
        .await
        .expect("delay_ms accepted");
    let past = producer
        .send(Message::new("Timed", "past").with_deliver_at_ms(start_ms - 10_000))
        .await
        .expect("a time already past is accepted");

    let refused = producer
        .send(Message::new("Timed", "too late").with_deliver_at_ms(start_ms + 120_000))
        .await
        .expect_err("beyond timer_max_delay_ms");
    assert_eq!(
        refused.status(),
        Some(wire::Status::INVALID_ARGUMENT),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("timer_max_delay_ms"),
        "{refused}"
    );
    let refused = producer
        .send(Message::new("Timed", "no such level").with_delay_level(4))
        .await
        .expect_err("level 4 of 3");
    assert_eq!(refused.status(), Some(wire::Status::INVALID_ARGUMENT));

    let due: BTreeMap<String, i64> = [
        (at.msg_id.to_string(), start_ms + 1_500),
        (after.msg_id.to_string(), start_ms + 700),
        (past.msg_id.to_string(), 0),
    ]
    .into_iter()
    .collect();
    let delivered = eventually("all three timer messages", || async {
        let messages = read_topic(&consumer, "Timed").await;
        for message in &messages {
            let due_ms = due[&message.msg_id()];
            assert!(
                now_ms() >= due_ms - CLOCK_SLACK_MS,
                "{} visible {} ms before its time",
                String::from_utf8_lossy(&message.body),
                due_ms - now_ms()
            );
        }
        (messages.len() >= 3).then_some(messages)
    })
    .await;
    let counts = count_by_id(&delivered);
    assert_eq!(counts.len(), 3);
    assert!(counts.values().all(|&n| n == 1), "{counts:?}");
    for result in [&at, &after] {
        assert!(result.is_scheduled(), "{result:?}");
    }
    assert!(
        !past.is_scheduled(),
        "a time already past goes straight to its queue: {past:?}"
    );
    for message in &delivered {
        let due_ms = due[&message.msg_id()];
        assert!(
            message.store_timestamp_ms >= due_ms - CLOCK_SLACK_MS,
            "stored before its time"
        );
        // A time already past is due at once, counted from the send.
        let late_ms = message.store_timestamp_ms - due_ms.max(start_ms);
        assert!(
            late_ms <= MAX_LATE_MS,
            "{} stored {late_ms} ms after its time",
            String::from_utf8_lossy(&message.body)
        );
        assert_eq!(message.property("TIMER_DELIVER_MS"), None);
    }
    producer.shutdown().await;
    consumer.shutdown().await;
}

/// Messages scheduled (delay levels and timers) when the broker dies with SIGKILL are all
/// delivered after the restart; after a graceful stop they are delivered exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_messages_survive_kill9_and_restart() {
    const EACH: usize = 15;
    let data = TempDir::new().unwrap();
    // Sync flush: an acknowledged send is on disk, so SIGKILL cannot take it.
    let mut cluster = start_cluster(&data, &["--flush", "sync"]);
    cluster.create_topic("Survive", 4);
    let producer = new_producer(&cluster).await;
    let mut sent = Vec::new();
    // Half are delivered before the kill (level 1), half are still waiting (level 3, timers).
    for index in 0..EACH {
        for message in [
            Message::new("Survive", format!("level1 {index}")).with_delay_level(1),
            Message::new("Survive", format!("level3 {index}")).with_delay_level(3),
            Message::new("Survive", format!("timer {index}"))
                .with_delay(Duration::from_millis(2_500)),
        ] {
            sent.push(
                producer
                    .send(message)
                    .await
                    .expect("send")
                    .msg_id
                    .to_string(),
            );
        }
    }
    producer.shutdown().await;
    let consumer = reader(&cluster).await;
    eventually("the level-1 messages", || async {
        (read_topic(&consumer, "Survive").await.len() >= EACH).then_some(())
    })
    .await;
    consumer.shutdown().await;
    cluster.broker.kill9();
    cluster.broker.restart();
    wait_routed_to_current_broker(&cluster, "Survive").await;

    let consumer = reader(&cluster).await;
    let delivered = eventually("every scheduled message after the restart", || async {
        let messages = read_topic(&consumer, "Survive").await;
        let counts = count_by_id(&messages);
        sent.iter()
            .all(|id| counts.contains_key(id))
            .then_some(messages)
    })
    .await;
    // At least once: none lost. (A redelivery of what was delivered in the last persist
    // interval before the kill is allowed.)
    let counts = count_by_id(&delivered);
    assert_eq!(counts.len(), sent.len(), "only what was sent");
    // Each schedule queue is delivered in order (timers in due order), so once the last
    // message is in, any redelivery is in too.
    let before = read_topic(&consumer, "Survive").await.len();
    consumer.shutdown().await;

    // A graceful stop persists the progress: nothing is delivered again after it.
    cluster.broker.stop();
    cluster.broker.restart();
    wait_routed_to_current_broker(&cluster, "Survive").await;
    let producer = new_producer(&cluster).await;
    let consumer = reader(&cluster).await;
    // Markers queue behind anything redelivered: once they are in, a redelivery would be too.
    for message in [
        Message::new("Survive", "marker level 1").with_delay_level(1),
        Message::new("Survive", "marker level 3").with_delay_level(3),
        Message::new("Survive", "marker timer").with_delay(Duration::from_millis(3_000)),
    ] {
        producer.send(message).await.expect("marker");
    }
    let after = eventually("the three markers", || async {
        let messages = read_topic(&consumer, "Survive").await;
        let markers = messages
            .iter()
            .filter(|m| m.body.starts_with(b"marker"))
            .count();
        (markers == 3).then_some(messages)
    })
    .await;
    assert_eq!(
        after.len(),
        before + 3,
        "something was delivered again after a graceful restart"
    );
    producer.shutdown().await;
    consumer.shutdown().await;
}
