//! Several sends in flight on one connection (issue 22, item 4): ordered sends pipelined with
//! `send_ordered_async` and `send_to_queue_async` are stored in the order they were made, per
//! queue; and a window full of sends to a broker killed with SIGKILL ends each send as a single
//! send would end (stored, or failed after its retries with a single send's error), none
//! hanging and none reported twice, and every acknowledged one is there after the restart.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardmq_client::{
    Admin, Error, Message, MessageExt, MessageQueue, Producer, PullConsumer, PullStatus,
    SendFuture, SendResult,
};
use shardmq_tests::LocalCluster;
use tempfile::TempDir;

/// Longest a test waits for a condition (a route, every send to end).
const WAIT: Duration = Duration::from_secs(60);

/// Sends the dying-broker test makes (a window of 64 at a time).
const SENDS: usize = 3_000;

/// Every message of `queue` from offset 0.
async fn read_queue(consumer: &PullConsumer, queue: &MessageQueue) -> Vec<MessageExt> {
    let mut messages = Vec::new();
    let mut offset = 0;
    loop {
        let pulled = consumer.pull(queue, offset, 64).await.expect("pull");
        if pulled.status != PullStatus::Found {
            return messages;
        }
        offset = pulled.next_begin_offset;
        messages.extend(pulled.messages);
    }
}

async fn read_topic(consumer: &PullConsumer, topic: &str) -> Vec<MessageExt> {
    let mut all = Vec::new();
    for queue in consumer.queues(topic).await.expect("queues") {
        all.extend(read_queue(consumer, &queue).await);
    }
    all
}

/// A body of `len` bytes starting with `label` (sizes vary so that a later, smaller request
/// would be quicker to check than an earlier, larger one).
fn body(label: &str, len: usize) -> Vec<u8> {
    let mut body = label.as_bytes().to_vec();
    body.push(b'|');
    body.resize(len.max(body.len()), b'.');
    body
}

fn label(message: &MessageExt) -> String {
    let body = String::from_utf8_lossy(&message.body);
    body.split('|').next().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_ordered_sends_are_stored_in_the_order_they_were_made() {
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start(data.path());
    cluster.create_topic("InOrder", 8);
    let producer = Producer::builder()
        .namesrv(cluster.namesrv_addr())
        .max_sends_in_flight(256)
        .build()
        .await
        .unwrap();
    let queues = producer.write_queues("InOrder").await.unwrap();

    // 12 keys, 40 messages each, interleaved; every call returns once the send is on its way.
    const KEYS: usize = 12;
    const PER_KEY: usize = 40;
    let mut in_flight: Vec<(String, usize, SendFuture<SendResult>)> = Vec::new();
    for round in 0..PER_KEY {
        for key in 0..KEYS {
            let key = format!("key-{key}");
            let len = [1, 6_000, 20, 3_000][(round + key.len()) % 4];
            let message = Message::new("InOrder", body(&format!("{key}#{round}"), len));
            let sent = producer.send_ordered_async(message, &key).await.unwrap();
            in_flight.push((key, round, sent));
        }
        // And to one queue named outright, with batches of varied size between them.
        let queue = &queues[round % 2];
        let message = Message::new(
            "InOrder",
            body(
                &format!("fixed-{}#{round}", queue.queue_id),
                [4_000, 10][round % 2],
            ),
        );
        let sent = producer.send_to_queue_async(message, queue).await.unwrap();
        in_flight.push((format!("fixed-{}", queue.queue_id), round, sent));
    }
    let mut queue_of: BTreeMap<String, MessageQueue> = BTreeMap::new();
    for (key, _, sent) in in_flight {
        let result = sent.await.expect("stored");
        let known = queue_of.entry(key.clone()).or_insert(result.queue.clone());
        assert_eq!(known, &result.queue, "every message of {key} in one queue");
    }

    let consumer = PullConsumer::builder()
        .namesrv(cluster.namesrv_addr())
        .group("in-order-readers")
        .build()
        .await
        .unwrap();
    let mut seen = 0;
    for queue in &queues {
        // Per key (a queue holds several keys), the rounds in the order they were sent.
        let mut rounds: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for message in read_queue(&consumer, queue).await {
            let label = label(&message);
            let (key, round) = label.split_once('#').expect("key#round");
            assert_eq!(&queue_of[key], queue, "{key} stored in its queue");
            rounds
                .entry(key.to_owned())
                .or_default()
                .push(round.parse().unwrap());
            seen += 1;
        }
        for (key, rounds) in rounds {
            let expected: Vec<usize> = (0..PER_KEY)
                .filter(|round| !key.starts_with("fixed-") || queues[round % 2] == *queue)
                .collect();
            assert_eq!(rounds, expected, "{key} in {queue}");
        }
    }
    assert_eq!(seen, KEYS * PER_KEY + PER_KEY);
    producer.shutdown().await;
    consumer.shutdown().await;
}

/// Whether `error` is what a send to a dead broker ends with: the send failed after its
/// attempts, the last one on a retriable error (the connection refused or closed, or no answer
/// in time).
fn is_single_send_failure(error: &Error) -> bool {
    match error {
        Error::SendFailed { attempts, last, .. } => *attempts >= 1 && last.is_retriable(),
        _ => false,
    }
}

/// How a failed send ended: its attempts and the kind of its last error.
fn failure_shape(error: &Error) -> Option<(u32, std::mem::Discriminant<Error>)> {
    match error {
        Error::SendFailed { attempts, last, .. } => {
            Some((*attempts, std::mem::discriminant(&**last)))
        }
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_of_sends_to_a_broker_that_dies_ends_each_as_a_single_send_would() {
    let data = TempDir::new().unwrap();
    let mut cluster = LocalCluster::start(data.path());
    cluster.create_topic("Dying", 4);
    let producer = Producer::builder()
        .namesrv(cluster.namesrv_addr())
        .max_sends_in_flight(64)
        .send_timeout(Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    producer
        .send(Message::new("Dying", "warm-up"))
        .await
        .expect("the broker is up");

    // Sends go out in a loop, the window full, while the broker is killed under them; each
    // send's answer is awaited on a task of its own and recorded.
    type Outcome = (String, shardmq_client::Result<SendResult>);
    let outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let answered = Arc::new(AtomicUsize::new(0));
    let sender = {
        let producer = producer.clone();
        let outcomes = Arc::clone(&outcomes);
        let answered = Arc::clone(&answered);
        tokio::spawn(async move {
            let mut waiters = Vec::new();
            for index in 0..SENDS {
                let message = Message::new("Dying", body(&format!("m{index}"), 2_000));
                let id = message.unique_id().to_string();
                let sent = producer
                    .send_async(message)
                    .await
                    .unwrap_or_else(|error| panic!("admission failed: {error}"));
                let outcomes = Arc::clone(&outcomes);
                let answered = Arc::clone(&answered);
                waiters.push(tokio::spawn(async move {
                    let outcome = sent.await;
                    outcomes.lock().unwrap().push((id, outcome));
                    answered.fetch_add(1, Ordering::Relaxed);
                }));
            }
            waiters
        })
    };
    // Killed once a few hundred sends have been answered: the window is full then, and sends
    // are on the wire.
    shardmq_tests::eventually(WAIT, "some sends answered", || {
        let answered = Arc::clone(&answered);
        async move { answered.load(Ordering::Relaxed) >= 300 }
    })
    .await;
    cluster.broker.kill9();

    let waiters = tokio::time::timeout(WAIT, sender)
        .await
        .expect("every send was admitted: none holds the window for ever")
        .expect("the sender ran");
    for waiter in waiters {
        tokio::time::timeout(WAIT, waiter)
            .await
            .expect("a send hangs")
            .expect("the waiter ran");
    }
    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    let total = outcomes.len();
    // What a single send to the dead broker gets, to compare the window's failures with.
    let single = producer
        .send(Message::new("Dying", "alone"))
        .await
        .expect_err("the broker is dead");
    // The name server drops a killed broker from the routes at once (its registration
    // connection closed), so a send after the window may find no route at all; one that still
    // had the broker in its route fails as the window's sends did.
    assert!(
        is_single_send_failure(&single) || matches!(single, Error::TopicNotFound { .. }),
        "{single:?}"
    );
    let mut window_shape = None;
    let mut stored: BTreeSet<String> = BTreeSet::new();
    let mut failed = 0;
    for (id, outcome) in outcomes {
        match outcome {
            Ok(result) => {
                assert_eq!(result.msg_id.to_string(), id);
                assert!(stored.insert(id.clone()), "{id} reported stored twice");
            }
            Err(error) => {
                // Retried as a single send is, and failed as it does (sends on the wire when
                // the broker died saw the connection close first, then were refused too).
                // Or, retried once the name server had dropped the broker, found no route.
                assert!(
                    is_single_send_failure(&error) || matches!(error, Error::TopicNotFound { .. }),
                    "send {id}: {error:?}"
                );
                if let Some(shape) = failure_shape(&error) {
                    let first = *window_shape.get_or_insert(shape);
                    assert_eq!(
                        shape, first,
                        "send {id}: {error:?} ended unlike the window's other failed sends"
                    );
                }
                failed += 1;
            }
        }
    }
    // Each send ended once, stored or failed.
    assert_eq!(total, SENDS);
    assert_eq!(stored.len() + failed, SENDS);
    assert!(
        failed > 0,
        "the kill came after every send had been answered"
    );

    // Every acknowledged send survived the kill (async flush acknowledges after the write).
    cluster.broker.restart();
    let admin = Admin::builder()
        .namesrv(cluster.namesrv_addr())
        .build()
        .await
        .unwrap();
    let address = cluster.broker_addr();
    shardmq_tests::eventually(WAIT, "the route to the restarted broker", || async {
        admin.route("Dying").await.is_ok_and(|route| {
            route
                .brokers
                .values()
                .any(|broker| broker.addresses.values().any(|a| *a == address))
        })
    })
    .await;
    let consumer = PullConsumer::builder()
        .namesrv(cluster.namesrv_addr())
        .group("dying-readers")
        .build()
        .await
        .unwrap();
    let found: BTreeSet<String> = read_topic(&consumer, "Dying")
        .await
        .iter()
        .map(MessageExt::msg_id)
        .collect();
    let missing: Vec<&String> = stored.difference(&found).collect();
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
    producer.shutdown().await;
    consumer.shutdown().await;
    admin.shutdown().await;
}
