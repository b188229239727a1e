//! The client library against a real namesrv and broker: producer → pull consumer round trips
//! (single, batch, ordered, one-way), offsets, the admin API, and the errors a user meets
//! (unknown topic, oversized body, bad names, a broker that is gone). Each test starts its own
//! namesrv and broker, so tests run in parallel.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use shardmq_client::{
    Admin, Error, Message, MessageExt, MessageQueue, Producer, PullConsumer, PullOptions,
    PullStatus, SendStatus, TagExpression, TopicConfig,
};
use shardmq_tests::LocalCluster;
use tempfile::TempDir;

struct Setup {
    cluster: LocalCluster,
    _data: TempDir,
}

fn cluster_with_topic(topic: &str, queues: u32) -> Setup {
    let data = TempDir::new().expect("temp dir");
    let cluster = LocalCluster::start(data.path());
    cluster.create_topic(topic, queues);
    Setup {
        cluster,
        _data: data,
    }
}

async fn producer(cluster: &LocalCluster) -> Producer {
    Producer::builder()
        .namesrv(cluster.namesrv_addr())
        .group("test-producer")
        .build()
        .await
        .expect("producer")
}

async fn pull_consumer(cluster: &LocalCluster, group: &str) -> PullConsumer {
    PullConsumer::builder()
        .namesrv(cluster.namesrv_addr())
        .group(group)
        .build()
        .await
        .expect("pull consumer")
}

/// Every message of every queue of `topic` from offset 0, by queue.
async fn pull_all(consumer: &PullConsumer, topic: &str) -> BTreeMap<MessageQueue, Vec<MessageExt>> {
    let mut all = BTreeMap::new();
    for queue in consumer.queues(topic).await.expect("queues") {
        let mut offset = 0;
        let mut messages = Vec::new();
        loop {
            let result = consumer.pull(&queue, offset, 32).await.expect("pull");
            if result.status != PullStatus::Found {
                break;
            }
            offset = result.next_begin_offset;
            messages.extend(result.messages);
        }
        all.insert(queue, messages);
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sent_messages_come_back_whole_from_every_queue() {
    let setup = cluster_with_topic("RoundTrip", 4);
    let producer = producer(&setup.cluster).await;
    let mut sent = BTreeMap::new();
    let mut first_odd_queue = None;
    for index in 0..16 {
        let message = Message::new("RoundTrip", format!("body {index}"))
            .with_tags(if index % 2 == 0 { "even" } else { "odd" })
            .with_keys([format!("key-{index}"), "common".to_owned()])
            .with_property("index", index.to_string());
        let result = producer.send(message.clone()).await.expect("send");
        assert_eq!(result.status, SendStatus::SendOk);
        assert_eq!(&result.msg_id, message.unique_id());
        assert_eq!(result.offset_msg_id().len(), 32);
        if index == 1 {
            first_odd_queue = Some(result.queue.clone());
        }
        sent.insert(result.msg_id.to_string(), (message, result));
    }
    // Round-robin over 4 queues: 4 messages each, offsets 0..4.
    let per_queue: BTreeMap<u32, BTreeSet<i64>> =
        sent.values().fold(BTreeMap::new(), |mut map, (_, result)| {
            map.entry(result.queue.queue_id)
                .or_default()
                .insert(result.queue_offset);
            map
        });
    assert_eq!(per_queue.len(), 4);
    for offsets in per_queue.values() {
        assert_eq!(offsets, &(0..4).collect::<BTreeSet<_>>());
    }

    let consumer = pull_consumer(&setup.cluster, "round-trip-readers").await;
    let all = pull_all(&consumer, "RoundTrip").await;
    let received: Vec<&MessageExt> = all.values().flatten().collect();
    assert_eq!(received.len(), 16);
    for message in received {
        let (original, result) = &sent[&message.msg_id()];
        assert_eq!(&message.body, original.body());
        assert_eq!(message.topic(), "RoundTrip");
        assert_eq!(message.tags(), original.tags());
        assert_eq!(message.keys(), original.keys());
        assert_eq!(message.queue_id, result.queue.queue_id);
        assert_eq!(message.queue_offset, result.queue_offset);
        assert_eq!(message.broker_name(), result.queue.broker_name);
        let properties: Vec<(&str, &str)> = message.user_properties().collect();
        assert_eq!(properties.len(), 1);
        assert_eq!(properties[0].0, "index");
        assert!(message.store_timestamp_ms >= message.born_timestamp_ms - 1000);
        assert_eq!(message.reconsume_times, 0);
    }

    // The broker filters by tag and the client confirms it. Round-robin (from a random first
    // queue) put messages 1, 5, 9 and 13 (all odd) into the queue message 1 went to.
    let queue = first_odd_queue.expect("message 1 was sent");
    let pull_tagged = |expression: &str| PullOptions {
        tags: TagExpression::parse(expression).unwrap(),
        ..PullOptions::default()
    };
    let odd = consumer
        .pull_with(&queue, 0, &pull_tagged("odd || other"))
        .await
        .unwrap();
    assert_eq!(odd.messages.len(), 4);
    assert!(odd.messages.iter().all(|m| m.tags() == Some("odd")));
    let even = consumer
        .pull_with(&queue, 0, &pull_tagged("even"))
        .await
        .unwrap();
    assert!(even.messages.is_empty());
    assert_eq!(
        even.next_begin_offset, 4,
        "the filtered messages are passed over"
    );
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_ordered_and_concurrent_sends() {
    let setup = cluster_with_topic("Batches", 4);
    let producer = producer(&setup.cluster).await;

    let batch: Vec<Message> = (0..10)
        .map(|i| Message::new("Batches", format!("batch {i}")))
        .collect();
    let results = producer.send_batch(batch).await.expect("batch");
    assert_eq!(results.len(), 10);
    let queue = results.queue.clone();
    assert!(results.iter().all(|r| r.queue == queue), "one queue");
    let offsets: Vec<i64> = results.iter().map(|r| r.queue_offset).collect();
    assert_eq!(offsets, (0..10).collect::<Vec<_>>(), "contiguous");

    // Every message of one key to one queue; the same key picks the same queue again.
    let mut queues_of_key: BTreeMap<String, BTreeSet<MessageQueue>> = BTreeMap::new();
    for round in 0..3 {
        for key in ["alpha", "beta", "gamma", "delta"] {
            let message = Message::new("Batches", format!("{key} {round}"));
            let result = producer.send_ordered(message, key).await.expect("ordered");
            queues_of_key
                .entry(key.to_owned())
                .or_default()
                .insert(result.queue);
        }
    }
    assert!(queues_of_key.values().all(|queues| queues.len() == 1));

    // Many sends in flight at once over the one connection.
    let sends: Vec<_> = (0..50)
        .map(|i| {
            let producer = producer.clone();
            tokio::spawn(async move {
                producer
                    .send(Message::new("Batches", format!("concurrent {i}")))
                    .await
            })
        })
        .collect();
    let mut ids = BTreeSet::new();
    for send in sends {
        ids.insert(send.await.unwrap().expect("concurrent send").msg_id);
    }
    assert_eq!(ids.len(), 50);

    producer
        .send_oneway(Message::new("Batches", "one way"))
        .await
        .expect("one-way");
    let consumer = pull_consumer(&setup.cluster, "batch-readers").await;
    let total_expected = 10 + 12 + 50 + 1;
    let mut total = 0;
    for _ in 0..100 {
        total = pull_all(&consumer, "Batches")
            .await
            .values()
            .map(Vec::len)
            .sum();
        if total == total_expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(total, total_expected, "the one-way message arrives too");
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_commit_query_and_long_poll() {
    let setup = cluster_with_topic("Offsets", 2);
    let producer = producer(&setup.cluster).await;
    let consumer = pull_consumer(&setup.cluster, "offset-group").await;
    let queue = MessageQueue::new("Offsets", "broker-a", 1);

    assert_eq!(consumer.committed_offset(&queue).await.unwrap(), None);
    consumer.commit_offset(&queue, 0).await.unwrap();
    assert_eq!(consumer.committed_offset(&queue).await.unwrap(), Some(0));
    assert!(consumer.commit_offset(&queue, -1).await.is_err());

    // A pull that waits is answered when a message arrives.
    let waiting = {
        let queue = queue.clone();
        let namesrv = setup.cluster.namesrv_addr();
        tokio::spawn(async move {
            let consumer = PullConsumer::builder()
                .namesrv(namesrv)
                .group("offset-group")
                .build()
                .await
                .unwrap();
            let options = PullOptions {
                wait: Duration::from_secs(10),
                ..PullOptions::default()
            };
            let started = std::time::Instant::now();
            let result = consumer.pull_with(&queue, 0, &options).await.unwrap();
            (result, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    producer
        .send_to_queue(Message::new("Offsets", "late"), &queue)
        .await
        .unwrap();
    let (result, waited) = waiting.await.unwrap();
    assert_eq!(result.status, PullStatus::Found);
    assert_eq!(&result.messages[0].body[..], b"late");
    assert!(
        waited < Duration::from_secs(5),
        "answered on arrival, not at the timeout"
    );

    consumer.commit_offset(&queue, 1).await.unwrap();
    assert_eq!(consumer.committed_offset(&queue).await.unwrap(), Some(1));
    assert_eq!(consumer.queue_offsets(&queue).await.unwrap(), (0, 1));
    let beyond = consumer.pull(&queue, 5, 32).await.unwrap();
    assert_eq!(beyond.status, PullStatus::OffsetIllegal);
    assert_eq!(beyond.next_begin_offset, 1);
    let by_time = consumer.offset_by_time(&queue, 0).await.unwrap();
    assert_eq!(by_time, 0);
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_manages_topics_and_reads_stats() {
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start(data.path());
    let admin = Admin::builder()
        .namesrv(cluster.namesrv_addr())
        .build()
        .await
        .unwrap();
    let broker = cluster.broker_addr();
    admin
        .create_topic(&broker, &TopicConfig::new("AdminTopic", 3))
        .await
        .expect("create");
    let again = admin
        .create_topic(&broker, &TopicConfig::new("AdminTopic", 3))
        .await
        .unwrap_err();
    assert_eq!(
        again.status(),
        Some(shardmq_client::wire::Status::TOPIC_ALREADY_EXISTS)
    );
    let mut route = None;
    for _ in 0..200 {
        if let Ok(found) = admin.route("AdminTopic").await {
            route = Some(found);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let route = route.expect("the topic gets a route");
    assert_eq!(route.write_queues().len(), 3);
    assert!(admin
        .topic_list()
        .await
        .unwrap()
        .contains(&"AdminTopic".to_owned()));

    let producer = producer(&cluster).await;
    for i in 0..6 {
        let message = Message::new("AdminTopic", format!("m{i}")).with_keys([format!("k{i}")]);
        producer.send(message).await.unwrap();
    }
    let stats = admin.topic_stats("AdminTopic").await.unwrap();
    assert_eq!(stats.len(), 3);
    assert_eq!(stats.iter().map(|s| s.max_offset).sum::<i64>(), 6);
    assert!(stats.iter().all(|s| s.last_update_ms > 0));

    let found = admin
        .query_by_key("AdminTopic", "k3", 0, 0, 10)
        .await
        .unwrap()
        .complete()
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(&found[0].body[..], b"m3");
    let by_id = admin
        .query_by_id("AdminTopic", &found[0].msg_id())
        .await
        .unwrap()
        .expect("found by id");
    assert_eq!(by_id.body, found[0].body);

    let progress = admin
        .group_progress("nobody", "AdminTopic")
        .await
        .unwrap()
        .complete()
        .unwrap();
    assert_eq!(progress.iter().map(|p| p.lag()).sum::<i64>(), 6);

    let configs = admin.broker_topics(&broker, false).await.unwrap();
    assert!(configs
        .iter()
        .any(|c| c.name == "AdminTopic" && c.read_queues == 3));
    let deleted = admin.delete_topic_everywhere("AdminTopic").await.unwrap();
    assert_eq!(deleted, vec![broker]);
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_errors_are_clear_and_nothing_is_sent() {
    let setup = cluster_with_topic("Errors", 1);
    let producer = producer(&setup.cluster).await;

    let missing = producer
        .send(Message::new("NoSuchTopic", "x"))
        .await
        .unwrap_err();
    assert!(matches!(missing, Error::TopicNotFound { .. }), "{missing}");
    assert!(missing.to_string().contains("create it first"));

    let too_big = producer
        .send(Message::new("Errors", vec![b'x'; 4 * 1024 * 1024 + 1]))
        .await
        .unwrap_err();
    assert!(
        too_big
            .to_string()
            .contains("over max_message_bytes (4194304)"),
        "{too_big}"
    );
    let bad_topic = producer
        .send(Message::new("bad topic", "x"))
        .await
        .unwrap_err();
    assert!(
        matches!(bad_topic, Error::InvalidArgument(_)),
        "{bad_topic}"
    );
    let reserved = producer
        .send(Message::new("Errors", "x").with_property("UNIQ_KEY", "mine"))
        .await
        .unwrap_err();
    assert!(reserved.to_string().contains("reserved"), "{reserved}");

    let consumer = pull_consumer(&setup.cluster, "error-readers").await;
    let all = pull_all(&consumer, "Errors").await;
    assert!(all.values().all(Vec::is_empty), "nothing was stored");

    let no_namesrv = Producer::builder().build().await.unwrap_err();
    assert!(no_namesrv.to_string().contains(".namesrv("), "{no_namesrv}");

    producer.shutdown().await;
    let after = producer
        .send(Message::new("Errors", "x"))
        .await
        .unwrap_err();
    assert!(matches!(after, Error::ShutDown));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_broker_fails_sends_and_a_restarted_one_is_found_again() {
    let mut setup = cluster_with_topic("Restart", 2);
    let producer = Producer::builder()
        .namesrv(setup.cluster.namesrv_addr())
        .send_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    producer
        .send(Message::new("Restart", "before"))
        .await
        .unwrap();
    setup.cluster.broker.stop();
    // The stopped broker unregistered: either the route is gone, or the send found the broker
    // unreachable on every attempt.
    let error = producer
        .send(Message::new("Restart", "while down"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            Error::TopicNotFound { .. } | Error::SendFailed { .. }
        ),
        "{error}"
    );
    // The broker comes back on a new port; the producer finds it through the name server and
    // connects there.
    setup.cluster.broker.restart();
    let mut sent = None;
    for _ in 0..200 {
        match producer.send(Message::new("Restart", "after")).await {
            Ok(result) => {
                sent = Some(result);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let sent = sent.expect("sends work again after the restart");
    assert_eq!(sent.status, SendStatus::SendOk);
    let consumer = pull_consumer(&setup.cluster, "restart-readers").await;
    let bodies: BTreeSet<Vec<u8>> = pull_all(&consumer, "Restart")
        .await
        .values()
        .flatten()
        .map(|m| m.body.to_vec())
        .collect();
    assert_eq!(
        bodies,
        BTreeSet::from([b"before".to_vec(), b"after".to_vec()]),
        "what was acknowledged before the stop is still there"
    );
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_creates_topics_on_first_send_gets_the_first_message() {
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start_with_broker_args(data.path(), &["--auto-create-topics"]);
    let producer = producer(&cluster).await;
    // No route yet: the producer sends to a master broker of the cluster, which creates it.
    let first = producer
        .send(Message::new("AutoCreated", "first"))
        .await
        .expect("first send creates the topic");
    assert_eq!(first.status, SendStatus::SendOk);
    assert_eq!(first.queue.broker_name, "broker-a");
    // Then the broker registers the topic and sends go by its route.
    let mut queues = Vec::new();
    for _ in 0..200 {
        if let Ok(found) = producer.write_queues("AutoCreated").await {
            queues = found;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(queues.len(), 8, "the broker's default queue count");
    for i in 0..8 {
        producer
            .send(Message::new("AutoCreated", format!("next {i}")))
            .await
            .unwrap();
    }
    let consumer = pull_consumer(&cluster, "auto-readers").await;
    let total: usize = pull_all(&consumer, "AutoCreated")
        .await
        .values()
        .map(Vec::len)
        .sum();
    assert_eq!(total, 9);
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_name_server_is_skipped() {
    let setup = cluster_with_topic("TwoNamesrvs", 1);
    // Nothing listens on port 1: the client moves on to the next name server.
    let producer = Producer::builder()
        .namesrv(format!("127.0.0.1:1,{}", setup.cluster.namesrv_addr()))
        .build()
        .await
        .unwrap();
    let result = producer
        .send(Message::new("TwoNamesrvs", "via the second"))
        .await
        .expect("the second name server answers");
    assert_eq!(result.status, SendStatus::SendOk);
    producer.shutdown().await;

    let nobody = Producer::builder()
        .namesrv("127.0.0.1:1")
        .build()
        .await
        .unwrap();
    let error = nobody
        .send(Message::new("TwoNamesrvs", "x"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::NameServerUnavailable { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("127.0.0.1:1"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_travel_compressed_and_arrive_as_sent() {
    let setup = cluster_with_topic("Squeezed", 1);
    let cluster = &setup.cluster;
    let producer = producer(cluster).await;
    let large = "a compressible line of text\n".repeat(4000);
    let small = "under the threshold";
    producer
        .send(Message::new("Squeezed", large.clone()))
        .await
        .expect("send the large body");
    producer
        .send(Message::new("Squeezed", small))
        .await
        .expect("send the small body");
    let uncompressed = Producer::builder()
        .namesrv(cluster.namesrv_addr())
        .compress_over_bytes(0)
        .build()
        .await
        .unwrap();
    uncompressed
        .send(Message::new("Squeezed", large.clone()))
        .await
        .expect("send the large body uncompressed");

    // The consumer sees every body as it was sent, flag cleared.
    let consumer = pull_consumer(cluster, "squeeze-readers").await;
    let messages: Vec<MessageExt> = pull_all(&consumer, "Squeezed")
        .await
        .into_values()
        .flatten()
        .collect();
    let bodies: Vec<&[u8]> = messages.iter().map(|m| &m.body[..]).collect();
    assert_eq!(
        bodies,
        [large.as_bytes(), small.as_bytes(), large.as_bytes()]
    );
    assert!(messages.iter().all(|m| !m.is_compressed()));

    // On the broker the first large body is stored compressed (sys flag bit 0x1, far fewer
    // bytes), the one sent with compression off is not.
    let mut raw = cluster.broker.client();
    let response = raw
        .request(|b| {
            shardmq_tests::pull_request_body(b, &shardmq_tests::PullParams::new("Squeezed", 0, 0))
        })
        .expect("raw pull");
    let records = response
        .frame()
        .body_as_pull_response()
        .and_then(|p| p.records())
        .map(|r| r.bytes().to_vec())
        .unwrap_or_default();
    let stored: Vec<(u32, usize)> = shardmq_tests::split_records(&records)
        .into_iter()
        .map(|record| {
            let view = shardmq_codec::decode_message(record).expect("a valid record");
            (view.sys_flag() & 0x1, view.body().len())
        })
        .collect();
    assert_eq!(stored.len(), 3);
    assert_eq!(stored[0].0, 1, "the large body is flagged compressed");
    assert!(
        stored[0].1 < large.len() / 10,
        "stored {} bytes",
        stored[0].1
    );
    assert_eq!(stored[1], (0, small.len()));
    assert_eq!(stored[2], (0, large.len()));
}
