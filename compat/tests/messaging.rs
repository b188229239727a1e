//! Producing and consuming through ShardMQ with rocketmq-client-rust 1.0.0's public producer
//! and consumer APIs, JSON headers (the client's default): sync, batch, delayed, orderly and
//! transactional sends; push consumers with tag filters, shared queues, retries and orderly
//! listeners; and RocketMQ clients side by side with ShardMQ's own CLI.
//!
//! Each test starts a fresh name server and broker (`shardmq_compat::servers`), creates its
//! topic with the `shardmq` CLI first, and runs its RocketMQ clients on one `ClientHost`. Every
//! client call has a deadline and every wait polls a condition with one; no fixed sleeps.
//! Consumers start at their queues' first message, so a message is received whether it was sent
//! before or after its consumer got its queue; the tests that send to a running consumer wait
//! for its queues first anyway, so that the long-polling path is what delivers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rocketmq_client_rust::{LocalTransactionState, SendStatus, TransactionListener};
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::MessageTrait;
use shardmq_compat::client::{ClientHost, SerializeType};
use shardmq_compat::consumer::{
    describe, Answer, Delivery, PushConsumer, PushConsumerOptions, PROPERTY_RETRY_TOPIC,
};
use shardmq_compat::producer::{Message, Producer, SendResult, TransactionalProducer};
use shardmq_compat::servers::{wait_until, LocalCluster};

const SERIALIZE_TYPE: SerializeType = SerializeType::JSON;

/// The topic every test creates on its own broker.
const TOPIC: &str = "CompatMessagingTopic";

/// Read and write queues of [`TOPIC`].
const QUEUES: u32 = 4;

/// A user property every test message carries (the message's index).
const INDEX_PROPERTY: &str = "compatIndex";

/// The key every test message carries besides its own.
const SHARED_KEY: &str = "compat";

/// How long a consumer may take to be given its queues by its first rebalance.
const ASSIGN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long sent messages may take to reach a consumer that holds their queues.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a group may take to commit what it consumed (the 1.0.0 client persists offsets
/// every 5 s, the first time 10 s after it starts).
const COMMIT_TIMEOUT: Duration = Duration::from_secs(40);

/// How long a message answered RECONSUME_LATER may take to come back: the broker's delay
/// level 3 (10 s, the level a first send-back gets), plus the client learning the route of
/// `%RETRY%<group>` (refreshed every 30 s) and rebalancing onto it (every 20 s).
const RETRY_TIMEOUT: Duration = Duration::from_secs(120);

/// The delay level the delayed message is sent with: RocketMQ's level 2.
const DELAY_LEVEL: i32 = 2;

/// What [`DELAY_LEVEL`] is on a broker with RocketMQ's levels (`1s 5s 10s …`, the default).
const DELAY_LEVEL_DURATION: Duration = Duration::from_secs(5);

/// How much sooner than its delay a delayed message may seem to arrive: the broker times the
/// delay on its clock from when it stored the message, the test on its own from just before the
/// send, and the two clocks' ticks differ by scheduling noise.
const DELAY_TOLERANCE: Duration = Duration::from_millis(500);

/// The broker's transaction timeout in the transaction test (`--transaction-timeout-ms`): the
/// age at which an unresolved transaction is first checked back.
const TRANSACTION_TIMEOUT_MS: &str = "2000";

/// The broker's transaction check interval in the transaction test
/// (`--transaction-check-interval-ms`): an unresolved transaction is checked back within about
/// the timeout and this interval together.
const TRANSACTION_CHECK_INTERVAL_MS: &str = "1000";

/// How long an unresolved transaction may take to be checked back, committed and delivered.
const CHECK_BACK_TIMEOUT: Duration = Duration::from_secs(40);

// ---------------------------------------------------------------------------------------------
// 1. Sync sends, a tag-filtered push consumer, and a second group taking everything

const TAG_A: &str = "TagA";
const TAG_B: &str = "TagB";

/// A producer sends 50 messages, alternately tagged `TagA` and `TagB`, each with two keys and a
/// user property, synchronously. A clustering push consumer subscribed to `TagA` receives
/// exactly the 25 `TagA` messages, each once (checked again after its group committed the end
/// of every queue, when nothing can be delivered again), with body, tag, keys, the user property
/// and the producer's message id intact. Then a second group, subscribed to `*`, receives all
/// 50 the same way.
#[test]
fn send_and_push_consume() {
    let cluster = start_cluster_with_topic(&[]);
    let host = ClientHost::start("send-and-push-consume", SERIALIZE_TYPE);
    let namesrv = cluster.namesrv_addr();

    let tag_a_group = "CompatTagAGroup";
    let tag_a_consumer = start_consumer(
        &host,
        &namesrv,
        PushConsumerOptions::new(tag_a_group, TOPIC, TAG_A),
    );
    wait_for_queues(&[&tag_a_consumer], QUEUES);

    let producer = start_producer(&host, &namesrv, "CompatProducer");
    let sent: Vec<SentMessage> = (0..50)
        .map(|index| {
            let tag = if index % 2 == 0 { TAG_A } else { TAG_B };
            send_indexed(&producer, index, tag)
        })
        .collect();

    let tag_a: Vec<&SentMessage> = sent.iter().filter(|message| message.tag == TAG_A).collect();
    let tag_a_deliveries = wait_for_bodies(&tag_a_consumer, &tag_a, "the 25 TagA messages");
    assert_delivered_once(&tag_a_deliveries, &tag_a);
    cluster.wait_until_group_caught_up(tag_a_group, TOPIC, COMMIT_TIMEOUT);
    assert_delivered_once(&tag_a_consumer.inbox().deliveries(), &tag_a);

    let all_consumer = start_consumer(
        &host,
        &namesrv,
        PushConsumerOptions::new("CompatEverythingGroup", TOPIC, "*"),
    );
    let everything: Vec<&SentMessage> = sent.iter().collect();
    let all_deliveries = wait_for_bodies(&all_consumer, &everything, "all 50 messages");
    assert_delivered_once(&all_deliveries, &everything);

    // The TagA group still has each of its messages once, and nothing else.
    assert_delivered_once(&tag_a_consumer.inbox().deliveries(), &tag_a);
}

/// A push consumer subscribed with a SQL92 selector (`MessageSelector::by_sql`, which makes the
/// client check its subscription with CHECK_CLIENT_CONFIG first) on a broker run with
/// `--enable-property-filter` receives exactly the messages whose properties match, each once;
/// the broker evaluates the expression, so nothing else crosses the wire.
#[test]
fn a_sql92_selector_receives_only_what_matches() {
    let cluster = start_cluster_with_topic(&["--enable-property-filter"]);
    let host = ClientHost::start("sql92-selector", SERIALIZE_TYPE);
    let namesrv = cluster.namesrv_addr();
    let expression = format!("{INDEX_PROPERTY} BETWEEN 10 AND 29 AND TAGS = '{TAG_B}'");
    let consumer = start_consumer(
        &host,
        &namesrv,
        PushConsumerOptions::new("CompatSqlGroup", TOPIC, &expression).sql(),
    );
    wait_for_queues(&[&consumer], QUEUES);
    let producer = start_producer(&host, &namesrv, "CompatSqlProducer");
    let sent: Vec<SentMessage> = (0..40)
        .map(|index| send_indexed(&producer, index, if index % 2 == 0 { TAG_A } else { TAG_B }))
        .collect();
    let wanted: Vec<&SentMessage> = sent
        .iter()
        .filter(|m| (10..=29).contains(&m.index) && m.tag == TAG_B)
        .collect();
    let deliveries = wait_for_bodies(&consumer, &wanted, "the 10 matching messages");
    cluster.wait_until_group_caught_up("CompatSqlGroup", TOPIC, COMMIT_TIMEOUT);
    assert_delivered_once(&deliveries, &wanted);
    assert_delivered_once(&consumer.inbox().deliveries(), &wanted);
}

// ---------------------------------------------------------------------------------------------
// 2. A batch, and a delayed message

/// A batch of 10 messages (SEND_BATCH_MESSAGE) is stored whole in one queue, in order, under
/// the ids the producer gave it, and a push consumer receives all 10, each once. A message sent
/// with delay level 2 (5 s) reaches the consumer no sooner than 4.5 s after it was sent (and
/// within the receive deadline after that), on its own topic with its body and tag.
#[test]
fn batch_and_delay() {
    let cluster = start_cluster_with_topic(&[]);
    let host = ClientHost::start("batch-and-delay", SERIALIZE_TYPE);
    let namesrv = cluster.namesrv_addr();

    let consumer = start_consumer(
        &host,
        &namesrv,
        PushConsumerOptions::new("CompatBatchGroup", TOPIC, "*"),
    );
    wait_for_queues(&[&consumer], QUEUES);
    let producer = start_producer(&host, &namesrv, "CompatBatchProducer");

    let batch: Vec<SentMessage> = (0..10)
        .map(|index| SentMessage::new(index, "Batch"))
        .collect();
    let result = producer
        .send_batch(batch.iter().map(SentMessage::message).collect())
        .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(result.send_status, SendStatus::SendOk, "{result:?}");
    let batch_ids: Vec<String> = result
        .msg_id
        .as_ref()
        .map(|ids| ids.as_str().split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    assert_eq!(
        batch_ids.len(),
        batch.len(),
        "one message id per batched message: {result:?}"
    );
    let batch: Vec<SentMessage> = batch
        .into_iter()
        .zip(batch_ids)
        .map(|(message, id)| SentMessage {
            unique_id: Some(id),
            ..message
        })
        .collect();
    let batch_refs: Vec<&SentMessage> = batch.iter().collect();
    let deliveries = wait_for_bodies(&consumer, &batch_refs, "the 10 batched messages");
    assert_delivered_once(&deliveries, &batch_refs);
    let batch_queue = result
        .message_queue
        .as_ref()
        .map(|queue| queue.queue_id())
        .expect("the batch's queue in its send result");
    for (position, message) in batch.iter().enumerate() {
        let delivery = deliveries
            .iter()
            .find(|delivery| delivery.body_text() == message.body)
            .expect("every batched message was delivered");
        let position = i64::try_from(position).expect("a small batch");
        let first_offset = i64::try_from(result.queue_offset).expect("an offset in i64");
        assert_eq!(
            (delivery.queue_id, delivery.queue_offset),
            (batch_queue, first_offset + position),
            "a batch is stored whole, in order, from the offset its send was answered with: {}",
            describe(&deliveries)
        );
    }

    let delayed = SentMessage::new(100, "Delayed");
    let sent_at = Instant::now();
    let result = producer
        .send(
            delayed
                .message_builder()
                .delay_level(DELAY_LEVEL)
                .build_unchecked(),
        )
        .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(result.send_status, SendStatus::SendOk, "{result:?}");
    let delayed = delayed.with_id(&result);
    let deliveries = wait_for_bodies(&consumer, &[&delayed], "the delayed message");
    let delivery = deliveries
        .iter()
        .find(|delivery| delivery.body_text() == delayed.body)
        .expect("the delayed message was delivered");
    let waited = delivery.received_at.duration_since(sent_at);
    assert!(
        waited >= DELAY_LEVEL_DURATION - DELAY_TOLERANCE,
        "a message of delay level {DELAY_LEVEL} ({} ms) arrived {} ms after it was sent",
        DELAY_LEVEL_DURATION.as_millis(),
        waited.as_millis()
    );
    assert_delivery_of(delivery, &delayed);
}

// ---------------------------------------------------------------------------------------------
// 3. RocketMQ clients and ShardMQ's own CLI on one topic

const FROM_ROCKETMQ_TAG: &str = "FromRocketMq";
const FROM_SHARDMQ_TAG: &str = "FromShardMq";

/// Messages a RocketMQ producer sent are consumed by ShardMQ's CLI (`shardmq consume`, its own
/// protocol) with body, tag, keys, user property and id; a message the CLI sent (`shardmq
/// send`) is received by a RocketMQ push consumer with its body, tag, keys and user property.
#[test]
fn mixed_with_native() {
    let cluster = start_cluster_with_topic(&[]);
    let host = ClientHost::start("mixed-with-native", SERIALIZE_TYPE);
    let namesrv = cluster.namesrv_addr();

    let producer = start_producer(&host, &namesrv, "CompatMixedProducer");
    let sent: Vec<SentMessage> = (0..10)
        .map(|index| send_indexed(&producer, index, FROM_ROCKETMQ_TAG))
        .collect();

    let count = sent.len().to_string();
    let consumed = cluster.cli_json_lines(&[
        "--json",
        "consume",
        TOPIC,
        "--group",
        "CompatNativeGroup",
        "--from",
        "first",
        "--count",
        &count,
        "--timeout-ms",
        "20000",
    ]);
    let consumed_by_body: BTreeMap<String, &serde_json::Value> = consumed
        .iter()
        .map(|message| {
            (
                message["body"].as_str().unwrap_or_default().to_owned(),
                message,
            )
        })
        .collect();
    assert_eq!(
        consumed.len(),
        sent.len(),
        "shardmq consume printed {consumed:#?}"
    );
    for message in &sent {
        let Some(native) = consumed_by_body.get(&message.body) else {
            panic!(
                "shardmq consume did not print {:?}: {consumed:#?}",
                message.body
            )
        };
        assert_eq!(native["topic"], TOPIC, "{native}");
        assert_eq!(native["tags"], message.tag, "{native}");
        assert_eq!(
            native["keys"],
            serde_json::json!(message.keys),
            "the RocketMQ keys, space separated, are ShardMQ's keys: {native}"
        );
        assert_eq!(
            native["properties"][INDEX_PROPERTY],
            message.index.to_string(),
            "the user property: {native}"
        );
        assert_eq!(
            native["msg_id"].as_str(),
            message.unique_id.as_deref(),
            "the id the RocketMQ producer gave the message (UNIQ_KEY) is its ShardMQ id: {native}"
        );
    }

    let sent_by_cli = cluster.cli_json_lines(&[
        "--json",
        "send",
        TOPIC,
        "--body",
        "sent by shardmq",
        "--tags",
        FROM_SHARDMQ_TAG,
        "--keys",
        "native-key compat",
        "--property",
        "origin=cli",
    ]);
    assert_eq!(sent_by_cli.len(), 1, "{sent_by_cli:#?}");
    assert_eq!(sent_by_cli[0]["status"], "SEND_OK", "{sent_by_cli:#?}");

    let consumer = start_consumer(
        &host,
        &namesrv,
        PushConsumerOptions::new("CompatRocketMqGroup", TOPIC, FROM_SHARDMQ_TAG),
    );
    let deliveries = consumer.inbox().wait_for(
        RECEIVE_TIMEOUT,
        "the message sent by the shardmq CLI",
        |deliveries| (!deliveries.is_empty()).then(|| deliveries.to_vec()),
    );
    assert_eq!(
        deliveries.len(),
        1,
        "only the CLI's message has tag {FROM_SHARDMQ_TAG}: {}",
        describe(&deliveries)
    );
    let delivery = &deliveries[0];
    assert_eq!(delivery.topic, TOPIC, "{delivery:?}");
    assert_eq!(delivery.body_text(), "sent by shardmq", "{delivery:?}");
    assert_eq!(
        delivery.tags.as_deref(),
        Some(FROM_SHARDMQ_TAG),
        "{delivery:?}"
    );
    assert_eq!(
        delivery.keys.as_deref(),
        Some("native-key compat"),
        "{delivery:?}"
    );
    assert_eq!(delivery.property("origin"), Some("cli"), "{delivery:?}");
}

// ---------------------------------------------------------------------------------------------
// 4. Two consumers of one group share the queues

/// Two push consumers of one group on a 4-queue topic split its queues between them (each holds
/// some, none holds a queue the other holds); messages sent to all four queues are received by
/// the two together, each message once (checked after the group committed the end of every
/// queue), each consumer receiving some, and only from its own queues.
#[test]
fn two_consumers_rebalance() {
    let cluster = start_cluster_with_topic(&[]);
    let host = ClientHost::start("two-consumers-rebalance", SERIALIZE_TYPE);
    let namesrv = cluster.namesrv_addr();

    let group = "CompatSharedGroup";
    let first = start_consumer(&host, &namesrv, PushConsumerOptions::new(group, TOPIC, "*"));
    let second = start_consumer(&host, &namesrv, PushConsumerOptions::new(group, TOPIC, "*"));
    let (first_queues, second_queues) = wait_until(
        ASSIGN_TIMEOUT,
        "the two consumers to split the topic's 4 queues between them",
        || {
            let first_queues = first.assigned_queues(TOPIC).ok()?;
            let second_queues = second.assigned_queues(TOPIC).ok()?;
            let is_split = !first_queues.is_empty()
                && !second_queues.is_empty()
                && first_queues.is_disjoint(&second_queues)
                && first_queues.len() + second_queues.len() == QUEUES as usize;
            is_split.then_some((first_queues, second_queues))
        },
    );

    let producer = start_producer(&host, &namesrv, "CompatSharedProducer");
    // The producer spreads its sends over the queues round-robin; send to each queue by name
    // anyway, so that every queue, and so both consumers, get messages whatever its choice.
    let sent: Vec<SentMessage> = (0..40)
        .map(|index| {
            let queue_id = i32::try_from(index % QUEUES).expect("a queue id");
            let message = SentMessage::new(index, "Shared");
            let result = producer
                .send_to_queue(message.message(), queue_id)
                .unwrap_or_else(|error| panic!("{error}"));
            assert_eq!(result.send_status, SendStatus::SendOk, "{result:?}");
            message.with_id(&result)
        })
        .collect();
    let expected: Vec<&SentMessage> = sent.iter().collect();
    let expected_bodies: BTreeSet<&str> =
        sent.iter().map(|message| message.body.as_str()).collect();
    wait_until(
        RECEIVE_TIMEOUT,
        "the 40 messages, across the two consumers",
        || {
            let mut received = bodies(&first.inbox().deliveries());
            received.extend(bodies(&second.inbox().deliveries()));
            expected_bodies
                .iter()
                .all(|body| received.contains(*body))
                .then_some(())
        },
    );
    cluster.wait_until_group_caught_up(group, TOPIC, COMMIT_TIMEOUT);

    let first_deliveries = first.inbox().deliveries();
    let second_deliveries = second.inbox().deliveries();
    for (deliveries, queues, which) in [
        (&first_deliveries, &first_queues, "first"),
        (&second_deliveries, &second_queues, "second"),
    ] {
        assert!(
            !deliveries.is_empty(),
            "the {which} consumer (queues {queues:?}) received nothing"
        );
        assert!(
            deliveries
                .iter()
                .all(|delivery| queues.contains(&delivery.queue_id)),
            "the {which} consumer received from queues it does not hold ({queues:?}): {}",
            describe(deliveries)
        );
    }
    let all: Vec<Delivery> = first_deliveries
        .into_iter()
        .chain(second_deliveries)
        .collect();
    assert_delivered_once(&all, &expected);
}

// ---------------------------------------------------------------------------------------------
// 5. RECONSUME_LATER, and the redelivery through the retry topic

/// A push consumer's listener answers RECONSUME_LATER the first time it sees a message. The
/// client sends it back (CONSUMER_SEND_MSG_BACK, 36); the broker stores a copy in
/// `%RETRY%<group>` after delay level 3, and the consumer, subscribed to that topic as every
/// clustering consumer is, receives the copy, once more, and consumes it: reconsume count 1,
/// `RETRY_TOPIC` naming the original topic, body and tag intact. (A copy without `RETRY_TOPIC`
/// would be the client re-running the message locally, which it does when both the send-back
/// and its fallback, a plain send to `%RETRY%<group>`, failed.)
#[test]
fn retry_after_reconsume_later() {
    let cluster = start_cluster_with_topic(&[]);
    let host = ClientHost::start("retry-after-reconsume-later", SERIALIZE_TYPE);
    let namesrv = cluster.namesrv_addr();

    let consumer = start_consumer(
        &host,
        &namesrv,
        PushConsumerOptions::new("CompatRetryGroup", TOPIC, "*").answer_later_when(
            |delivery, earlier| !earlier.iter().any(|seen| seen.body == delivery.body),
        ),
    );
    wait_for_queues(&[&consumer], QUEUES);
    let producer = start_producer(&host, &namesrv, "CompatRetryProducer");
    let message = send_indexed(&producer, 0, "Retried");

    let deliveries = consumer.inbox().wait_for(
        RETRY_TIMEOUT,
        "the message answered RECONSUME_LATER to be delivered again",
        |deliveries| (deliveries.len() >= 2).then(|| deliveries.to_vec()),
    );
    let [first, second] = &deliveries[..] else {
        panic!(
            "the message was delivered more than twice: {}",
            describe(&deliveries)
        )
    };
    assert_eq!(first.answer, Answer::Later, "{}", describe(&deliveries));
    assert_eq!(first.reconsume_times, 0, "{}", describe(&deliveries));
    assert_delivery_of(first, &message);
    assert_eq!(
        second.property(PROPERTY_RETRY_TOPIC),
        Some(TOPIC),
        "the redelivery came through the broker's retry topic, which sets RETRY_TOPIC; one \
         without it is the client re-running the message locally after CONSUMER_SEND_MSG_BACK \
         (36) and its fallback send to %RETRY%CompatRetryGroup both failed: {second:#?}"
    );
    assert_eq!(second.answer, Answer::Consumed, "{}", describe(&deliveries));
    assert_eq!(
        second.reconsume_times, 1,
        "the redelivery counts one reconsume: {second:#?}"
    );
    assert_eq!(second.topic, TOPIC, "{second:#?}");
    assert_eq!(second.body_text(), message.body, "{second:#?}");
    assert_eq!(second.tags.as_deref(), Some(message.tag), "{second:#?}");
}

// ---------------------------------------------------------------------------------------------
// 6. An orderly consumer

/// An orderly push consumer (which locks its queues at the broker, LOCK_BATCH_MQ 41) receives
/// the messages of each queue in the order they were sent to it: 10 messages to each of the 4
/// queues, sent through a queue selector, interleaved across the queues.
#[test]
fn orderly_consumer() {
    let cluster = start_cluster_with_topic(&[]);
    let host = ClientHost::start("orderly-consumer", SERIALIZE_TYPE);
    let namesrv = cluster.namesrv_addr();

    let consumer = start_consumer(
        &host,
        &namesrv,
        PushConsumerOptions::new("CompatOrderlyGroup", TOPIC, "*").orderly(),
    );
    wait_for_queues(&[&consumer], QUEUES);
    let producer = start_producer(&host, &namesrv, "CompatOrderlyProducer");

    let mut sent_by_queue: BTreeMap<i32, Vec<SentMessage>> = BTreeMap::new();
    for index in 0..40 {
        let queue_id = i32::try_from(index % QUEUES).expect("a queue id");
        let message = SentMessage::new(index, "Ordered");
        let result = producer
            .send_to_queue(message.message(), queue_id)
            .unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(result.send_status, SendStatus::SendOk, "{result:?}");
        assert_eq!(
            result.message_queue.as_ref().map(|queue| queue.queue_id()),
            Some(queue_id),
            "the selector's queue: {result:?}"
        );
        sent_by_queue
            .entry(queue_id)
            .or_default()
            .push(message.with_id(&result));
    }

    let expected: Vec<&SentMessage> = sent_by_queue.values().flatten().collect();
    let deliveries = wait_for_bodies(&consumer, &expected, "the 40 ordered messages");
    assert_delivered_once(&deliveries, &expected);
    for (queue_id, sent) in &sent_by_queue {
        let received: Vec<String> = deliveries
            .iter()
            .filter(|delivery| delivery.queue_id == *queue_id)
            .map(Delivery::body_text)
            .collect();
        let sent: Vec<&str> = sent.iter().map(|message| message.body.as_str()).collect();
        assert_eq!(
            received,
            sent,
            "queue {queue_id}'s messages in send order: {}",
            describe(&deliveries)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 7. Transactions: committed at once, and committed on the broker's check-back

/// A transactional producer whose local transaction commits: the half message is committed
/// (END_TRANSACTION 37) and the consumer receives it. A second one whose local transaction
/// answers UNKNOWN, and whose check listener commits: the broker, once the transaction is older
/// than its transaction timeout (2 s here), asks the producer (CHECK_TRANSACTION_STATE 39), the
/// listener commits, and only then does the consumer receive the message.
#[test]
fn transaction_commit_and_check_back() {
    let cluster = start_cluster_with_topic(&[
        "--transaction-timeout-ms",
        TRANSACTION_TIMEOUT_MS,
        "--transaction-check-interval-ms",
        TRANSACTION_CHECK_INTERVAL_MS,
    ]);
    let host = ClientHost::start("transactions", SERIALIZE_TYPE);
    let namesrv = cluster.namesrv_addr();

    let consumer = start_consumer(
        &host,
        &namesrv,
        PushConsumerOptions::new("CompatTransactionGroup", TOPIC, "*"),
    );
    wait_for_queues(&[&consumer], QUEUES);

    // Committed by the local transaction.
    let committing = TransactionRecorder::new(LocalTransactionState::CommitMessage);
    let (_committing_producer, committed) = send_in_transaction(
        &host,
        &namesrv,
        "CompatCommitTransactionGroup",
        &committing,
        SentMessage::new(0, "Committed"),
    );
    let deliveries = wait_for_bodies(&consumer, &[&committed], "the committed message");
    let delivery = deliveries
        .iter()
        .find(|delivery| delivery.body_text() == committed.body)
        .expect("the committed message was delivered");
    assert_delivery_of(delivery, &committed);

    // Unknown at first, committed when the broker checks back.
    let checked = TransactionRecorder::new(LocalTransactionState::Unknown);
    let (_checked_producer, pending) = send_in_transaction(
        &host,
        &namesrv,
        "CompatCheckBackTransactionGroup",
        &checked,
        SentMessage::new(1, "CheckedBack"),
    );
    let deliveries = consumer.inbox().wait_for(
        CHECK_BACK_TIMEOUT,
        &format!(
            "the transaction left UNKNOWN to be checked back, committed and delivered (check-backs \
             so far: {:?})",
            checked.checks()
        ),
        |deliveries| {
            deliveries
                .iter()
                .any(|delivery| delivery.body_text() == pending.body)
                .then(|| deliveries.to_vec())
        },
    );
    let delivery = deliveries
        .iter()
        .find(|delivery| delivery.body_text() == pending.body)
        .expect("the checked-back message was delivered");
    assert_delivery_of(delivery, &pending);
    let checks = checked.checks();
    let first_check = checks
        .iter()
        .find(|check| check.body == pending.body)
        .unwrap_or_else(|| {
            panic!("delivered without a check-back of its transaction: checks {checks:?}")
        });
    assert!(
        first_check.at <= delivery.received_at,
        "the message left UNKNOWN was delivered before its transaction was checked back"
    );
    for (recorder, which) in [(&committing, "committing"), (&checked, "checked-back")] {
        assert_eq!(
            recorder.executed.load(Ordering::SeqCst),
            1,
            "the {which} producer ran its local transaction once"
        );
    }
    assert_eq!(
        committing.checks().len(),
        0,
        "a transaction committed at once is never checked back: {:?}",
        committing.checks()
    );
    assert_eq!(
        deliveries.len(),
        2,
        "each transaction's message once: {}",
        describe(&deliveries)
    );
}

/// A transaction listener that answers its local transactions with one state, commits every
/// check-back, and counts the former and records the latter.
/// Starts a transactional producer of `group` whose local transaction answers as `recorder`
/// says, and sends `message` in a transaction: its half message stored (SEND_OK) and the local
/// transaction run with that answer. Returns the producer (alive, to answer check-backs) and
/// the message with its id.
fn send_in_transaction(
    host: &Arc<ClientHost>,
    namesrv: &str,
    group: &str,
    recorder: &TransactionRecorder,
    message: SentMessage,
) -> (TransactionalProducer, SentMessage) {
    let producer = TransactionalProducer::start(host, namesrv, group, recorder.clone())
        .unwrap_or_else(|error| panic!("{error}"));
    let result = producer
        .send_in_transaction(message.message())
        .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(
        result.local_transaction_state,
        Some(recorder.local_answer),
        "{result:?}"
    );
    let send_result = result
        .send_result
        .as_ref()
        .expect("the half message's send result");
    assert_eq!(send_result.send_status, SendStatus::SendOk, "{result:?}");
    let message = message.with_id(send_result);
    (producer, message)
}

#[derive(Clone)]
struct TransactionRecorder {
    local_answer: LocalTransactionState,
    checks: Arc<Mutex<Vec<CheckBack>>>,
    executed: Arc<AtomicUsize>,
}

/// One check-back the broker asked for.
#[derive(Debug, Clone)]
struct CheckBack {
    body: String,
    at: Instant,
}

impl TransactionRecorder {
    fn new(local_answer: LocalTransactionState) -> Self {
        Self {
            local_answer,
            checks: Arc::default(),
            executed: Arc::default(),
        }
    }

    fn checks(&self) -> Vec<CheckBack> {
        self.checks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl TransactionListener for TransactionRecorder {
    fn execute_local_transaction(
        &self,
        _message: &dyn MessageTrait,
        _argument: Option<&(dyn std::any::Any + Send + Sync)>,
    ) -> LocalTransactionState {
        self.executed.fetch_add(1, Ordering::SeqCst);
        self.local_answer
    }

    fn check_local_transaction(&self, message: &MessageExt) -> LocalTransactionState {
        let body = message
            .body()
            .map(|body| String::from_utf8_lossy(&body).into_owned())
            .unwrap_or_default();
        self.checks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(CheckBack {
                body,
                at: Instant::now(),
            });
        LocalTransactionState::CommitMessage
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// A test message as it was sent.
#[derive(Debug, Clone)]
struct SentMessage {
    index: u32,
    body: String,
    tag: &'static str,
    /// The message's keys: its own and [`SHARED_KEY`].
    keys: Vec<String>,
    /// The id the producer gave it (`UNIQ_KEY`), from its send result.
    unique_id: Option<String>,
}

impl SentMessage {
    fn new(index: u32, tag: &'static str) -> Self {
        Self {
            index,
            body: format!("compat message {index} ({tag})"),
            tag,
            keys: vec![format!("key-{index}"), SHARED_KEY.to_owned()],
            unique_id: None,
        }
    }

    fn message_builder(&self) -> rocketmq_model::common::message::message_builder::MessageBuilder {
        Message::builder()
            .topic(TOPIC)
            .tags(self.tag)
            .keys(self.keys.clone())
            .body_slice(self.body.as_bytes())
            .raw_property(INDEX_PROPERTY, self.index.to_string())
            .expect("a user property name the client does not reserve")
    }

    fn message(&self) -> Message {
        self.message_builder().build_unchecked()
    }

    fn with_id(self, result: &SendResult) -> Self {
        Self {
            unique_id: result.msg_id.as_ref().map(ToString::to_string),
            ..self
        }
    }
}

fn start_cluster_with_topic(broker_args: &[&str]) -> LocalCluster {
    shardmq_compat::client::select_serialize_type(SERIALIZE_TYPE);
    let cluster = LocalCluster::start_with_broker_args(broker_args);
    cluster.create_topic(TOPIC, QUEUES);
    cluster
}

fn start_producer(host: &Arc<ClientHost>, namesrv: &str, group: &str) -> Producer {
    Producer::start(host, namesrv, group).unwrap_or_else(|error| panic!("{error}"))
}

fn start_consumer(
    host: &Arc<ClientHost>,
    namesrv: &str,
    options: PushConsumerOptions,
) -> PushConsumer {
    PushConsumer::start(host, namesrv, options).unwrap_or_else(|error| panic!("{error}"))
}

/// Sends the message of `index` with `tag` synchronously and returns it with its id.
fn send_indexed(producer: &Producer, index: u32, tag: &'static str) -> SentMessage {
    let message = SentMessage::new(index, tag);
    let result = producer
        .send(message.message())
        .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(result.send_status, SendStatus::SendOk, "{result:?}");
    assert!(
        result.msg_id.is_some() && result.offset_msg_id.is_some(),
        "a send result names the message (msgId, offsetMsgId): {result:?}"
    );
    message.with_id(&result)
}

/// Waits until the consumers, together, hold all `queues` queues of [`TOPIC`].
fn wait_for_queues(consumers: &[&PushConsumer], queues: u32) {
    wait_until(
        ASSIGN_TIMEOUT,
        &format!("the consumers to be given the {queues} queues of {TOPIC}"),
        || {
            let mut held = BTreeSet::new();
            for consumer in consumers {
                held.extend(consumer.assigned_queues(TOPIC).ok()?);
            }
            (held.len() == queues as usize).then_some(())
        },
    );
}

/// Waits until `consumer` has received every message of `expected`, and returns its deliveries.
fn wait_for_bodies(
    consumer: &PushConsumer,
    expected: &[&SentMessage],
    what: &str,
) -> Vec<Delivery> {
    consumer
        .inbox()
        .wait_for(RECEIVE_TIMEOUT, what, |deliveries| {
            let received = bodies(deliveries);
            expected
                .iter()
                .all(|message| received.contains(message.body.as_str()))
                .then(|| deliveries.to_vec())
        })
}

fn bodies(deliveries: &[Delivery]) -> BTreeSet<String> {
    deliveries.iter().map(Delivery::body_text).collect()
}

/// `deliveries` are exactly `expected`, each once, each as it was sent.
fn assert_delivered_once(deliveries: &[Delivery], expected: &[&SentMessage]) {
    assert_eq!(
        deliveries.len(),
        expected.len(),
        "each of the {} expected messages once, nothing else: {}",
        expected.len(),
        describe(deliveries)
    );
    for message in expected {
        let matching: Vec<&Delivery> = deliveries
            .iter()
            .filter(|delivery| delivery.body_text() == message.body)
            .collect();
        assert_eq!(
            matching.len(),
            1,
            "{:?} delivered {} times: {}",
            message.body,
            matching.len(),
            describe(deliveries)
        );
        assert_delivery_of(matching[0], message);
    }
}

/// `delivery` is `message` as it was sent: topic, body, tag, keys, user property, id.
fn assert_delivery_of(delivery: &Delivery, message: &SentMessage) {
    assert_eq!(delivery.topic, TOPIC, "{delivery:#?}");
    assert_eq!(delivery.body_text(), message.body, "{delivery:#?}");
    assert_eq!(delivery.tags.as_deref(), Some(message.tag), "{delivery:#?}");
    assert_eq!(
        delivery.keys.as_deref(),
        Some(message.keys.join(" ").as_str()),
        "the keys, space separated: {delivery:#?}"
    );
    assert_eq!(
        delivery.property(INDEX_PROPERTY),
        Some(message.index.to_string().as_str()),
        "the user property: {delivery:#?}"
    );
    assert_eq!(
        delivery.unique_id(),
        message.unique_id.as_deref(),
        "the id the producer gave the message (UNIQ_KEY): {delivery:#?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 8. A lite pull consumer

/// A lite pull consumer (`DefaultLitePullConsumer`, whose pulls are LITE_PULL_MESSAGE, 361)
/// subscribed to the topic from its first offset polls every message sent, each once, with
/// body and tag.
#[test]
fn lite_pull_consumer_polls_every_message() {
    use rocketmq_client_rust::DefaultLitePullConsumer;
    use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;

    let cluster = start_cluster_with_topic(&[]);
    let host = ClientHost::start("lite-pull", SERIALIZE_TYPE);
    let namesrv = cluster.namesrv_addr();
    let producer = start_producer(&host, &namesrv, "CompatLitePullProducer");
    let sent: Vec<SentMessage> = (0..20)
        .map(|index| send_indexed(&producer, index, TAG_A))
        .collect();

    let consumer = DefaultLitePullConsumer::builder(host.client_runtime())
        .consumer_group("CompatLitePullGroup")
        .name_server_addr(namesrv.as_str())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .build()
        .unwrap_or_else(|error| panic!("building the lite pull consumer: {error}"));
    host.call(
        "subscribing the lite pull consumer",
        consumer.subscribe(TOPIC),
    )
    .unwrap_or_else(|error| panic!("{error}"));
    host.call("starting the lite pull consumer", consumer.start())
        .unwrap_or_else(|error| panic!("{error}"));

    let mut received: Vec<(String, Option<String>)> = Vec::new();
    let deadline = Instant::now() + RECEIVE_TIMEOUT;
    while received.len() < sent.len() {
        assert!(
            Instant::now() < deadline,
            "the lite pull consumer polled {} of {} messages within {RECEIVE_TIMEOUT:?}",
            received.len(),
            sent.len()
        );
        let polled = host
            .run_within(Duration::from_secs(5), consumer.poll_with_timeout(1_000))
            .unwrap_or_default();
        received.extend(polled.iter().map(|message| {
            (
                String::from_utf8_lossy(message.body_slice()).into_owned(),
                message.tags().map(|tags| tags.to_string()),
            )
        }));
    }
    host.shut_down("lite pull consumer", consumer.shutdown());
    received.sort();
    let mut expected: Vec<(String, Option<String>)> = sent
        .iter()
        .map(|message| (message.body.clone(), Some(message.tag.to_owned())))
        .collect();
    expected.sort();
    assert_eq!(
        received, expected,
        "each message once, with its body and tag"
    );
}
