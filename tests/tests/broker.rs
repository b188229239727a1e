//! The real `shardmq-broker` process over loopback: send and pull across queues and storage
//! shards, long polling, restarts (clean and kill -9), registration with a real namesrv, tag
//! filters, queries, stats and consumer groups. Each test starts its own broker on a free port
//! over its own temp dir, so tests run in parallel without sharing state.
//!
//! Needs the binaries: `cargo build --workspace --bins` first. Hostile input is in
//! `broker_bad_input.rs`.
//!
//! Size: a suite of real-process tests, one per behaviour, sharing this file's helpers; long by
//! the number of behaviours, not by any one test.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use shardmq_codec::decode_message;
use shardmq_schema::{wire, VerifiedFrame};
use shardmq_tests::{
    binary_path, commit_offset, committed_offset, pull_request_body, send_request_body,
    split_records, status_of, upsert_topic_body, wait_until, BrokerProcess, ClientError,
    NamesrvProcess, PullParams, TestClient, TestMessage, IO_TIMEOUT,
};
use tempfile::TempDir;

/// Two storage shards (cores 0 and 1) behind one network shard: queues of a topic alternate
/// between the shards, so every request path crosses cores.
const TWO_STORAGE_SHARDS: [&str; 4] = ["--storage-cores", "0,1", "--network-cores", "1"];

/// Read and write.
const PERM_READ_WRITE: u32 = 6;

// ---------------------------------------------------------------------------------------------
// Requests and what their answers say

fn temp_dir() -> TempDir {
    tempfile::tempdir().expect("a temp dir")
}

fn now_ms() -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    i64::try_from(since_epoch.as_millis()).expect("milliseconds fit an i64")
}

fn require_status(response: &VerifiedFrame, expected: wire::Status, what: &str) {
    let (status, message) = status_of(response);
    assert_eq!(
        status, expected,
        "{what}: answered {status:?} ({message:?})"
    );
}

fn create_topic(client: &mut TestClient, name: &str, queues: u32) {
    create_topic_with(client, name, (queues, queues, PERM_READ_WRITE));
}

fn create_topic_with(client: &mut TestClient, name: &str, queues_and_perm: (u32, u32, u32)) {
    let response = client
        .request(|builder| upsert_topic_body(builder, name, queues_and_perm, true))
        .expect("an answer to UpsertTopicRequest");
    require_status(
        &response,
        wire::Status::OK,
        &format!("creating topic {name}"),
    );
}

/// One `SendResult`, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SentMessage {
    unique_id: String,
    offset_msg_id: String,
    queue_offset: i64,
    commit_log_offset: i64,
}

/// A `SendResponse`, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sent {
    queue_id: i32,
    results: Vec<SentMessage>,
}

fn send_response(response: &VerifiedFrame) -> Sent {
    let body = response
        .frame()
        .body_as_send_response()
        .expect("a SendResponse body");
    let results = body
        .results()
        .expect("SendResponse.results")
        .iter()
        .map(|result| SentMessage {
            unique_id: result.unique_id().unwrap_or_default().to_owned(),
            offset_msg_id: result.offset_msg_id().unwrap_or_default().to_owned(),
            queue_offset: result.queue_offset(),
            commit_log_offset: result.commit_log_offset(),
        })
        .collect();
    Sent {
        queue_id: body.queue_id(),
        results,
    }
}

/// Sends `messages` to (`topic`, `queue_id`); the answer must be OK with one result each.
fn send(client: &mut TestClient, topic: &str, queue_id: i32, messages: &[TestMessage]) -> Sent {
    let response = client
        .request(|builder| send_request_body(builder, topic, queue_id, messages))
        .expect("an answer to SendRequest");
    require_status(
        &response,
        wire::Status::OK,
        &format!(
            "sending {} message(s) to {topic}/{queue_id}",
            messages.len()
        ),
    );
    let sent = send_response(&response);
    assert_eq!(
        sent.results.len(),
        messages.len(),
        "one SendResult per message"
    );
    sent
}

/// A stored record as a pull or query returns it, decoded and CRC-checked.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StoredMessage {
    topic: String,
    queue_id: u32,
    queue_offset: u64,
    physical_offset: u64,
    total_size: u32,
    body: Vec<u8>,
    tags: Option<String>,
    keys: Vec<String>,
    unique_id: Option<String>,
    properties: Vec<(String, String)>,
    store_timestamp_ms: i64,
}

fn decode_records(records: &[u8]) -> Vec<StoredMessage> {
    split_records(records)
        .into_iter()
        .map(|bytes| {
            let view = decode_message(bytes)
                .unwrap_or_else(|error| panic!("a returned record does not decode: {error}"));
            StoredMessage {
                topic: view.topic().to_owned(),
                queue_id: view.queue_id(),
                queue_offset: view.queue_offset(),
                physical_offset: view.physical_offset(),
                total_size: view.total_size(),
                body: view.body().to_vec(),
                tags: view.tags().map(str::to_owned),
                keys: view.keys().map(str::to_owned).collect(),
                unique_id: view.unique_key().map(str::to_owned),
                properties: view
                    .properties()
                    .map(|(name, value)| (name.to_owned(), value.to_owned()))
                    .collect(),
                store_timestamp_ms: view.store_timestamp_ms(),
            }
        })
        .collect()
}

/// A `PullResponse`, owned, with its records decoded.
#[derive(Debug)]
struct Pulled {
    status: wire::Status,
    next_begin_offset: i64,
    max_offset: i64,
    records: Vec<StoredMessage>,
}

fn pulled(response: &VerifiedFrame) -> Pulled {
    let body = response
        .frame()
        .body_as_pull_response()
        .unwrap_or_else(|| panic!("a PullResponse body, got {:?}", status_of(response)));
    Pulled {
        status: response.frame().status(),
        next_begin_offset: body.next_begin_offset(),
        max_offset: body.max_offset(),
        records: decode_records(body.records().map(|r| r.bytes()).unwrap_or_default()),
    }
}

fn pull(client: &mut TestClient, params: &PullParams) -> Pulled {
    let response = client
        .request(|builder| pull_request_body(builder, params))
        .expect("an answer to PullRequest");
    pulled(&response)
}

/// Every message of (`topic`, `queue_id`), pulled `batch` at a time from offset 0 until the
/// queue's end (PULL_NOT_FOUND), checking that each pull continues where the last one ended.
fn pull_all(client: &mut TestClient, topic: &str, queue_id: i32, batch: u32) -> Vec<StoredMessage> {
    let mut messages: Vec<StoredMessage> = Vec::new();
    let mut offset = 0;
    loop {
        let mut params = PullParams::new(topic, queue_id, offset);
        params.max_messages = batch;
        let answer = pull(client, &params);
        if answer.status == wire::Status::PULL_NOT_FOUND {
            assert_eq!(
                answer.next_begin_offset, offset,
                "{topic}/{queue_id}: an empty pull at the end moves next_begin_offset"
            );
            assert_eq!(
                answer.max_offset, offset,
                "{topic}/{queue_id}: PULL_NOT_FOUND before max_offset"
            );
            return messages;
        }
        assert_eq!(
            answer.status,
            wire::Status::OK,
            "{topic}/{queue_id}: pull at offset {offset} answered {:?}",
            answer.status
        );
        assert!(
            !answer.records.is_empty() && answer.records.len() <= batch as usize,
            "{topic}/{queue_id}: an OK pull of at most {batch} returned {} records",
            answer.records.len()
        );
        for record in &answer.records {
            assert_eq!(
                (record.topic.as_str(), record.queue_id),
                (topic, u32::try_from(queue_id).unwrap()),
                "a pull of {topic}/{queue_id} returned another queue's record"
            );
            assert_eq!(
                record.queue_offset,
                messages.len() as u64,
                "{topic}/{queue_id}: records out of queue order"
            );
            messages.push(record.clone());
        }
        assert_eq!(
            answer.next_begin_offset,
            i64::try_from(messages.len()).unwrap(),
            "{topic}/{queue_id}: next_begin_offset is not one past the last record returned"
        );
        offset = answer.next_begin_offset;
    }
}

fn queue_offsets(client: &mut TestClient, topic: &str, queue_id: i32) -> (i64, i64) {
    let response = client
        .request(|builder| {
            let topic = builder.create_string(topic);
            let request = wire::QueueOffsetsRequest::create(
                builder,
                &wire::QueueOffsetsRequestArgs {
                    topic: Some(topic),
                    queue_id,
                },
            );
            (wire::Body::QueueOffsetsRequest, request.as_union_value())
        })
        .expect("an answer to QueueOffsetsRequest");
    require_status(&response, wire::Status::OK, "QueueOffsetsRequest");
    let body = response
        .frame()
        .body_as_queue_offsets_response()
        .expect("a QueueOffsetsResponse");
    (body.min_offset(), body.max_offset())
}

/// (name, read queues, write queues, perm) of every user topic, sorted by name.
fn broker_topics(client: &mut TestClient) -> Vec<(String, u32, u32, u32)> {
    let response = client
        .request(|builder| {
            let request = wire::BrokerTopicsRequest::create(
                builder,
                &wire::BrokerTopicsRequestArgs {
                    include_system: false,
                },
            );
            (wire::Body::BrokerTopicsRequest, request.as_union_value())
        })
        .expect("an answer to BrokerTopicsRequest");
    require_status(&response, wire::Status::OK, "BrokerTopicsRequest");
    let mut topics: Vec<_> = response
        .frame()
        .body_as_broker_topics_response()
        .expect("a BrokerTopicsResponse")
        .topics()
        .expect("BrokerTopicsResponse.topics")
        .iter()
        .map(|topic| {
            (
                topic.name().unwrap_or_default().to_owned(),
                topic.read_queues(),
                topic.write_queues(),
                topic.perm(),
            )
        })
        .collect();
    topics.sort();
    topics
}

/// The records of a QueryResponse; `None` on QUERY_NOT_FOUND.
fn query_records(response: &VerifiedFrame, what: &str) -> Option<Vec<StoredMessage>> {
    if status_of(response).0 == wire::Status::QUERY_NOT_FOUND {
        return None;
    }
    require_status(response, wire::Status::OK, what);
    let body = response
        .frame()
        .body_as_query_response()
        .expect("a QueryResponse");
    Some(decode_records(
        body.records().map(|r| r.bytes()).unwrap_or_default(),
    ))
}

fn query_by_key(client: &mut TestClient, topic: &str, key: &str) -> Option<Vec<StoredMessage>> {
    let response = client
        .request(|builder| {
            let topic = builder.create_string(topic);
            let key = builder.create_string(key);
            let request = wire::QueryByKeyRequest::create(
                builder,
                &wire::QueryByKeyRequestArgs {
                    topic: Some(topic),
                    key: Some(key),
                    begin_ms: 0,
                    end_ms: 0,
                    max_results: 32,
                },
            );
            (wire::Body::QueryByKeyRequest, request.as_union_value())
        })
        .expect("an answer to QueryByKeyRequest");
    query_records(&response, &format!("query by key {key}"))
}

/// Queries by `unique_id` (when `is_offset_id` is false) or by offset message id.
fn query_by_id(
    client: &mut TestClient,
    id: &str,
    is_offset_id: bool,
) -> Option<Vec<StoredMessage>> {
    let response = client
        .request(|builder| {
            let id = builder.create_string(id);
            let (unique_id, offset_msg_id) = if is_offset_id {
                (None, Some(id))
            } else {
                (Some(id), None)
            };
            let request = wire::QueryByIdRequest::create(
                builder,
                &wire::QueryByIdRequestArgs {
                    unique_id,
                    offset_msg_id,
                    begin_ms: 0,
                    end_ms: 0,
                },
            );
            (wire::Body::QueryByIdRequest, request.as_union_value())
        })
        .expect("an answer to QueryByIdRequest");
    query_records(&response, &format!("query by id {id}"))
}

/// The broker's address as the first 16 hex characters of its offset message ids.
fn offset_id_host_prefix(broker: &BrokerProcess) -> String {
    let addr = broker.addr();
    let std::net::IpAddr::V4(ip) = addr.ip() else {
        panic!("the broker listens on IPv4 loopback")
    };
    let mut prefix: String = ip.octets().iter().map(|b| format!("{b:02X}")).collect();
    prefix.push_str(&format!("{:08X}", u32::from(addr.port())));
    prefix
}

fn heartbeat_body(
    builder: &mut flatbuffers::FlatBufferBuilder<'static>,
    client_id: &str,
    group: &str,
    topic: &str,
) -> shardmq_tests::RequestBody {
    heartbeat_holding(builder, client_id, group, topic, None)
}

/// A heartbeat whose group entry reports `held` as (topic, broker name, queue id).
fn heartbeat_holding(
    builder: &mut flatbuffers::FlatBufferBuilder<'static>,
    client_id: &str,
    group: &str,
    topic: &str,
    held: Option<&[(&str, &str, u32)]>,
) -> shardmq_tests::RequestBody {
    let held_queues = held.map(|held| {
        let queues: Vec<_> = held
            .iter()
            .map(|(topic, broker_name, queue_id)| {
                let topic = builder.create_string(topic);
                let broker_name = builder.create_string(broker_name);
                wire::HeldQueue::create(
                    builder,
                    &wire::HeldQueueArgs {
                        topic: Some(topic),
                        broker_name: Some(broker_name),
                        queue_id: *queue_id,
                    },
                )
            })
            .collect();
        builder.create_vector(&queues)
    });
    let subscription_topic = builder.create_string(topic);
    let expression = builder.create_string("*");
    let subscription = wire::Subscription::create(
        builder,
        &wire::SubscriptionArgs {
            topic: Some(subscription_topic),
            expression: Some(expression),
            expression_type: None,
        },
    );
    let subscriptions = builder.create_vector(&[subscription]);
    let group = builder.create_string(group);
    let info = wire::ConsumerGroupInfo::create(
        builder,
        &wire::ConsumerGroupInfoArgs {
            group: Some(group),
            message_model: wire::MessageModel::CLUSTERING,
            is_orderly: false,
            subscriptions: Some(subscriptions),
            held_queues,
        },
    );
    let consumer_groups = builder.create_vector(&[info]);
    let client_id = builder.create_string(client_id);
    let request = wire::HeartbeatRequest::create(
        builder,
        &wire::HeartbeatRequestArgs {
            client_id: Some(client_id),
            producer_groups: None,
            consumer_groups: Some(consumer_groups),
        },
    );
    (wire::Body::HeartbeatRequest, request.as_union_value())
}

fn consumer_list_body(
    builder: &mut flatbuffers::FlatBufferBuilder<'static>,
    group: &str,
) -> shardmq_tests::RequestBody {
    let group = builder.create_string(group);
    let request = wire::ConsumerListRequest::create(
        builder,
        &wire::ConsumerListRequestArgs {
            consumer_group: Some(group),
        },
    );
    (wire::Body::ConsumerListRequest, request.as_union_value())
}

fn consumer_ids(response: &VerifiedFrame) -> Vec<String> {
    require_status(response, wire::Status::OK, "ConsumerListRequest");
    response
        .frame()
        .body_as_consumer_list_response()
        .expect("a ConsumerListResponse")
        .client_ids()
        .map(|ids| ids.iter().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The group named by each `ConsumerIdsChangedNotice` among `frames` (which must all be such
/// notices).
fn notice_groups(frames: &[VerifiedFrame]) -> Vec<String> {
    frames
        .iter()
        .map(|frame| {
            let notice = frame
                .frame()
                .body_as_consumer_ids_changed_notice()
                .unwrap_or_else(|| panic!("a pushed frame is not a notice: {frame:?}"));
            notice.consumer_group().unwrap_or_default().to_owned()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Send and pull

/// A message whose every field names it, with body bytes of every value a byte can take.
fn numbered_message(name: &str, number: usize) -> TestMessage {
    let mut body = format!("body of {name}:").into_bytes();
    body.extend(
        (0..=255u8)
            .cycle()
            .skip(number % 256)
            .take(64 + number % 64),
    );
    TestMessage::new(body)
        .tag(&format!("Tag{}", number % 3))
        .keys(&[&format!("key-{name}"), &format!("n{number}")])
        .unique_id(name)
        .property("origin", "broker-test")
}

fn assert_same_message(stored: &StoredMessage, sent: &TestMessage, place: &str) {
    assert_eq!(stored.body, sent.body, "{place}: body changed");
    assert_eq!(stored.tags, sent.tags, "{place}: tags changed");
    assert_eq!(stored.keys, sent.keys, "{place}: keys changed");
    assert_eq!(
        stored.unique_id, sent.unique_id,
        "{place}: unique id changed"
    );
    for (name, value) in &sent.properties {
        assert!(
            stored
                .properties
                .iter()
                .any(|(stored_name, stored_value)| stored_name == name && stored_value == value),
            "{place}: property {name}={value} lost"
        );
    }
}

#[test]
fn every_message_sent_over_eight_queues_on_two_storage_shards_is_pulled_once_in_queue_order() {
    const TOPIC: &str = "Orders";
    const QUEUES: usize = 8;
    let dir = temp_dir();
    let broker = BrokerProcess::start(dir.path(), &TWO_STORAGE_SHARDS);
    let mut client = broker.client();
    create_topic(&mut client, TOPIC, QUEUES as u32);

    // What each queue must hold, in queue-offset order, and what each send answered.
    let mut expected: Vec<Vec<TestMessage>> = vec![Vec::new(); QUEUES];
    let mut results: BTreeMap<String, SentMessage> = BTreeMap::new();
    let mut number = 0;
    let mut record =
        |expected: &mut Vec<Vec<TestMessage>>, sent: &Sent, messages: &[TestMessage]| {
            let queue = usize::try_from(sent.queue_id).expect("a queue id");
            assert!(queue < QUEUES, "the broker chose queue {queue} of {QUEUES}");
            for (result, message) in sent.results.iter().zip(messages) {
                assert_eq!(
                    result.queue_offset,
                    i64::try_from(expected[queue].len()).unwrap(),
                    "queue {queue}: a send was not given the next queue offset"
                );
                assert_eq!(Some(&result.unique_id), message.unique_id.as_ref());
                expected[queue].push(message.clone());
                results.insert(result.unique_id.clone(), result.clone());
            }
        };

    // One message a send, to each queue in turn.
    for round in 0..3 {
        for queue in 0..QUEUES {
            let message = numbered_message(&format!("q{queue}-r{round}"), number);
            number += 1;
            let queue_id = i32::try_from(queue).unwrap();
            let sent = send(&mut client, TOPIC, queue_id, std::slice::from_ref(&message));
            assert_eq!(
                sent.queue_id, queue_id,
                "the broker stored into another queue"
            );
            record(&mut expected, &sent, &[message]);
        }
    }

    // Batches: stored contiguously in their queue and in the CommitLog.
    let mut batches = Vec::new();
    for queue in [2, 5] {
        let batch: Vec<TestMessage> = (0..6)
            .map(|index| {
                number += 1;
                numbered_message(&format!("batch-q{queue}-{index}"), number)
            })
            .collect();
        let sent = send(&mut client, TOPIC, queue, &batch);
        assert_eq!(sent.queue_id, queue);
        record(&mut expected, &sent, &batch);
        batches.push(sent);
    }

    // The broker chooses the queue: sends spread over every write queue.
    let mut chosen_queues = BTreeSet::new();
    for index in 0..2 * QUEUES {
        let message = numbered_message(&format!("any-{index}"), number);
        number += 1;
        let sent = send(&mut client, TOPIC, -1, std::slice::from_ref(&message));
        chosen_queues.insert(sent.queue_id);
        record(&mut expected, &sent, &[message]);
    }
    assert_eq!(
        chosen_queues.len(),
        QUEUES,
        "{} sends with queue_id -1 used only queues {chosen_queues:?}",
        2 * QUEUES
    );

    // Offset message ids name this broker and both storage shards.
    let host_prefix = offset_id_host_prefix(&broker);
    let mut shards_used = BTreeSet::new();
    for result in results.values() {
        assert_eq!(result.offset_msg_id.len(), 32, "{result:?}");
        assert!(
            result.offset_msg_id.starts_with(&host_prefix),
            "offset id {} does not name the broker {}",
            result.offset_msg_id,
            broker.addr()
        );
        shards_used.insert(result.offset_msg_id[16..18].to_owned());
    }
    assert_eq!(
        shards_used,
        BTreeSet::from(["00".to_owned(), "01".to_owned()]),
        "eight queues should spread over both storage shards"
    );

    // Pull every queue, in batches of 4, and compare.
    let mut pulled_ids = BTreeSet::new();
    let mut stored_by_id = BTreeMap::new();
    for (queue, expected_messages) in expected.iter().enumerate() {
        let stored = pull_all(&mut client, TOPIC, i32::try_from(queue).unwrap(), 4);
        assert_eq!(
            stored.len(),
            expected_messages.len(),
            "queue {queue}: pulled {} messages, sent {}",
            stored.len(),
            expected_messages.len()
        );
        for (offset, (stored, sent)) in stored.iter().zip(expected_messages).enumerate() {
            let place = format!("{TOPIC}/{queue} offset {offset}");
            assert_same_message(stored, sent, &place);
            let unique_id = stored.unique_id.clone().expect("a unique id");
            let result = &results[&unique_id];
            assert_eq!(
                i64::try_from(stored.physical_offset).unwrap(),
                result.commit_log_offset,
                "{place}: stored at another CommitLog offset than the send answered"
            );
            assert!(
                pulled_ids.insert(unique_id.clone()),
                "{unique_id} was pulled twice"
            );
            stored_by_id.insert(unique_id, stored.clone());
        }
        let (min_offset, max_offset) =
            queue_offsets(&mut client, TOPIC, i32::try_from(queue).unwrap());
        assert_eq!(
            (min_offset, max_offset),
            (0, i64::try_from(expected_messages.len()).unwrap()),
            "queue {queue}: QueueOffsets disagrees with what was pulled"
        );
    }
    assert_eq!(
        pulled_ids.len(),
        number,
        "every message sent is pulled once"
    );

    // A batch's records are adjacent in the CommitLog.
    for batch in &batches {
        for pair in batch.results.windows(2) {
            let first = &stored_by_id[&pair[0].unique_id];
            assert_eq!(
                pair[0].commit_log_offset + i64::from(first.total_size),
                pair[1].commit_log_offset,
                "a batch of queue {} is not contiguous in the CommitLog",
                batch.queue_id
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Long polling

fn is_read_timeout(error: &ClientError) -> bool {
    matches!(error, ClientError::Io(io_error)
        if matches!(io_error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
}

#[test]
fn parked_pull_answers_promptly_when_another_connection_sends() {
    const TOPIC: &str = "Polled";
    const SUSPEND_MS: u32 = 5_000;
    let dir = temp_dir();
    let broker = BrokerProcess::start(dir.path(), &TWO_STORAGE_SHARDS);
    let mut producer = broker.client();
    create_topic(&mut producer, TOPIC, 2);

    // Queues 0 and 1 live on different storage shards.
    for queue_id in 0..2 {
        let mut consumer = broker.client();
        let mut params = PullParams::new(TOPIC, queue_id, 0);
        params.suspend_timeout_ms = SUSPEND_MS;
        let request_id = consumer
            .send_request(|builder| pull_request_body(builder, &params))
            .expect("send the pull");

        // The pull is parked: no answer while nothing is sent.
        consumer
            .set_read_timeout(Duration::from_millis(300))
            .unwrap();
        match consumer.read_frame() {
            Err(error) if is_read_timeout(&error) => {}
            other => {
                panic!("queue {queue_id}: a pull of an empty queue answered at once: {other:?}")
            }
        }
        consumer.set_read_timeout(IO_TIMEOUT).unwrap();

        let message = TestMessage::new(format!("wake-up {queue_id}"));
        let sent_at = Instant::now();
        send(
            &mut producer,
            TOPIC,
            queue_id,
            std::slice::from_ref(&message),
        );
        let response = consumer
            .read_response(request_id)
            .expect("the parked pull's answer");
        let waited = sent_at.elapsed();
        assert!(
            waited < Duration::from_millis(1_500),
            "queue {queue_id}: the parked pull answered {} ms after the send (suspend {SUSPEND_MS} ms)",
            waited.as_millis()
        );
        let answer = pulled(&response);
        assert_eq!(answer.status, wire::Status::OK, "queue {queue_id}");
        assert_eq!(answer.records.len(), 1, "queue {queue_id}");
        assert_eq!(answer.records[0].body, message.body);
        assert_eq!(answer.next_begin_offset, 1);
    }
}

#[test]
fn empty_long_poll_answers_pull_not_found_after_its_suspend_timeout() {
    const TOPIC: &str = "Quiet";
    const SUSPEND_MS: u32 = 300;
    let dir = temp_dir();
    let broker = BrokerProcess::start(dir.path(), &TWO_STORAGE_SHARDS);
    let mut client = broker.client();
    create_topic(&mut client, TOPIC, 2);
    send(
        &mut client,
        TOPIC,
        1,
        &[TestMessage::new("one"), TestMessage::new("two")],
    );

    // Queue 0 never had a message; queue 1 is read to its end.
    for (queue_id, offset) in [(0, 0), (1, 2)] {
        let mut params = PullParams::new(TOPIC, queue_id, offset);
        params.suspend_timeout_ms = SUSPEND_MS;
        let started = Instant::now();
        let answer = pull(&mut client, &params);
        let waited = started.elapsed();
        assert_eq!(
            answer.status,
            wire::Status::PULL_NOT_FOUND,
            "queue {queue_id} at its end"
        );
        assert_eq!(answer.next_begin_offset, offset, "queue {queue_id}");
        assert!(answer.records.is_empty());
        assert!(
            waited >= Duration::from_millis(u64::from(SUSPEND_MS) - 20),
            "queue {queue_id}: answered after {} ms, before its {SUSPEND_MS} ms suspend",
            waited.as_millis()
        );
        assert!(
            waited < Duration::from_millis(3_000),
            "queue {queue_id}: answered after {} ms, long past its {SUSPEND_MS} ms suspend",
            waited.as_millis()
        );

        // Without a suspend time the same pull answers at once.
        params.suspend_timeout_ms = 0;
        let started = Instant::now();
        let answer = pull(&mut client, &params);
        assert_eq!(answer.status, wire::Status::PULL_NOT_FOUND);
        assert!(
            started.elapsed() < Duration::from_millis(u64::from(SUSPEND_MS)),
            "a pull without suspend took {} ms",
            started.elapsed().as_millis()
        );
    }
}

#[test]
fn pulls_over_max_parked_pulls_are_answered_at_once_and_the_parked_ones_still_wake() {
    const TOPIC: &str = "Crowded";
    let dir = temp_dir();
    let config_path = dir.path().join("broker.toml");
    std::fs::write(&config_path, "max_parked_pulls = 2\n").expect("write the config file");
    let data_dir = dir.path().join("data");
    let broker = BrokerProcess::start(&data_dir, &["--config", config_path.to_str().unwrap()]);
    let mut producer = broker.client();
    create_topic(&mut producer, TOPIC, 1);
    let mut long_poll = PullParams::new(TOPIC, 0, 0);
    long_poll.suspend_timeout_ms = 5_000;

    // Two pulls park (the limit)...
    let mut parked = Vec::new();
    for index in 0..2 {
        let mut consumer = broker.client();
        let request_id = consumer
            .send_request(|builder| pull_request_body(builder, &long_poll))
            .expect("send a long poll");
        consumer
            .set_read_timeout(Duration::from_millis(200))
            .unwrap();
        match consumer.read_frame() {
            Err(error) if is_read_timeout(&error) => {}
            other => panic!("long poll {index} within the limit answered at once: {other:?}"),
        }
        consumer.set_read_timeout(IO_TIMEOUT).unwrap();
        parked.push((consumer, request_id));
    }
    // ...the third is answered at once instead of waiting its 5 s.
    let mut third = broker.client();
    let started = Instant::now();
    let answer = pull(&mut third, &long_poll);
    assert_eq!(answer.status, wire::Status::PULL_NOT_FOUND);
    assert!(
        started.elapsed() < Duration::from_millis(2_000),
        "a pull over max_parked_pulls waited {} ms",
        started.elapsed().as_millis()
    );

    send(
        &mut producer,
        TOPIC,
        0,
        &[TestMessage::new("for the parked")],
    );
    for (index, (mut consumer, request_id)) in parked.into_iter().enumerate() {
        let response = consumer
            .read_response(request_id)
            .expect("the parked pull's answer");
        let answer = pulled(&response);
        assert_eq!(answer.status, wire::Status::OK, "parked pull {index}");
        assert_eq!(answer.records.len(), 1, "parked pull {index}");
    }
}

#[test]
fn pipelined_sends_beyond_the_in_flight_limit_are_each_answered_once() {
    const TOPIC: &str = "Pipelined";
    // More than max_inflight_per_connection (256): the broker pauses reading, not refusing.
    const SENDS: usize = 300;
    let dir = temp_dir();
    let broker = BrokerProcess::start(dir.path(), &TWO_STORAGE_SHARDS);
    let mut client = broker.client();
    create_topic(&mut client, TOPIC, 2);

    let mut bytes = Vec::new();
    let mut bodies = BTreeMap::new();
    for index in 0..SENDS {
        let request_id = client.take_request_id();
        let queue_id = i32::try_from(index % 2).unwrap();
        let body = format!("pipelined {index}");
        let frame = client
            .encode_request(request_id, |builder| {
                send_request_body(builder, TOPIC, queue_id, &[TestMessage::new(body.clone())])
            })
            .unwrap();
        bytes.extend_from_slice(&frame);
        bodies.insert(request_id, (queue_id, body));
    }
    client.send_bytes(&bytes).unwrap();

    let mut stored_at = BTreeMap::new();
    for _ in 0..SENDS {
        let response = client.read_frame().expect("an answer to a pipelined send");
        let request_id = response.frame().request_id();
        require_status(&response, wire::Status::OK, "a pipelined send");
        let (queue_id, body) = bodies
            .get(&request_id)
            .unwrap_or_else(|| panic!("an answer to unknown request {request_id}"));
        let sent = send_response(&response);
        assert_eq!(sent.queue_id, *queue_id);
        assert!(
            stored_at
                .insert(
                    request_id,
                    (*queue_id, sent.results[0].queue_offset, body.clone())
                )
                .is_none(),
            "request {request_id} was answered twice"
        );
    }
    for queue_id in 0..2 {
        let stored = pull_all(&mut client, TOPIC, queue_id, 64);
        assert_eq!(stored.len(), SENDS / 2, "queue {queue_id}");
        for (_, (_, queue_offset, body)) in stored_at.iter().filter(|(_, (q, _, _))| *q == queue_id)
        {
            let message = &stored[usize::try_from(*queue_offset).unwrap()];
            assert_eq!(
                message.body,
                body.as_bytes(),
                "queue {queue_id} offset {queue_offset}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Restarts

#[test]
fn topics_messages_and_committed_offsets_survive_a_clean_restart() {
    const TOPIC: &str = "Durable";
    let dir = temp_dir();
    let mut broker = BrokerProcess::start(dir.path(), &TWO_STORAGE_SHARDS);
    let mut client = broker.client();
    create_topic(&mut client, TOPIC, 4);
    create_topic_with(&mut client, "ReadOnly", (2, 1, 4));
    let topics_before = broker_topics(&mut client);

    let mut expected: Vec<Vec<TestMessage>> = vec![Vec::new(); 4];
    for (queue, messages) in expected.iter_mut().enumerate() {
        let batch: Vec<TestMessage> = (0..5)
            .map(|index| numbered_message(&format!("durable-{queue}-{index}"), index))
            .collect();
        let queue_id = i32::try_from(queue).unwrap();
        send(&mut client, TOPIC, queue_id, &batch);
        send(&mut client, TOPIC, queue_id, &batch[..2]);
        messages.extend(batch.iter().cloned());
        messages.extend(batch[..2].iter().cloned());
    }
    commit_offset(&mut client, "G", TOPIC, 0, 3);
    commit_offset(&mut client, "G", TOPIC, 1, 7);
    let mut params = PullParams::new(TOPIC, 2, 0);
    params.consumer_group = Some("G".to_owned());
    params.commit_offset = 5;
    assert_eq!(pull(&mut client, &params).status, wire::Status::OK);

    // Stop while a connection is idle and another holds a parked pull: the broker still exits
    // with status 0 (`stop` checks), and the parked pull is answered or closed, not left hanging.
    let mut parked = broker.client();
    let mut long_poll = PullParams::new(TOPIC, 3, 7);
    long_poll.suspend_timeout_ms = 30_000;
    parked
        .send_request(|builder| pull_request_body(builder, &long_poll))
        .expect("send the long poll");
    let stop_started = Instant::now();
    broker.stop();
    let stop_took = stop_started.elapsed();
    match parked.read_frame() {
        Ok(frame) => assert_eq!(
            frame.frame().kind(),
            wire::FrameKind::RESPONSE,
            "the parked pull got {frame:?}"
        ),
        Err(ClientError::Closed) => {}
        Err(error) => panic!("the parked pull neither answered nor closed on stop: {error}"),
    }
    assert!(
        stop_took < Duration::from_secs(8),
        "a graceful stop with a parked pull took {} ms",
        stop_took.as_millis()
    );
    drop((client, parked));

    broker.restart();
    let mut client = broker.client();

    assert_eq!(
        broker_topics(&mut client),
        topics_before,
        "the topic table changed across a restart"
    );
    for (queue, messages) in expected.iter().enumerate() {
        let stored = pull_all(&mut client, TOPIC, i32::try_from(queue).unwrap(), 32);
        assert_eq!(
            stored.len(),
            messages.len(),
            "queue {queue}: messages lost or added by the restart"
        );
        for (offset, (stored, sent)) in stored.iter().zip(messages).enumerate() {
            assert_same_message(stored, sent, &format!("after restart, {queue}/{offset}"));
        }
    }
    assert_eq!(committed_offset(&mut client, "G", TOPIC, 0), Some(3));
    assert_eq!(committed_offset(&mut client, "G", TOPIC, 1), Some(7));
    assert_eq!(
        committed_offset(&mut client, "G", TOPIC, 2),
        Some(5),
        "the offset committed with a pull was lost"
    );
    assert_eq!(committed_offset(&mut client, "G", TOPIC, 3), None);

    // Appends continue where they stopped.
    let sent = send(
        &mut client,
        TOPIC,
        0,
        &[TestMessage::new("after the restart")],
    );
    assert_eq!(sent.results[0].queue_offset, 7);
}

/// A message whose send the broker answered, as the sender thread of a kill -9 test saw it.
#[derive(Debug, Clone)]
struct Acknowledged {
    queue_id: i32,
    queue_offset: i64,
    body: Vec<u8>,
    /// Answered OK, not FLUSH_DISK_TIMEOUT (stored, durability unconfirmed).
    is_ok: bool,
}

/// What the sender thread of a kill -9 test saw.
#[derive(Debug, Default)]
struct SendLog {
    /// Every message whose send was answered, in the order of the answers.
    acknowledged: Vec<Acknowledged>,
    /// The batch that was in flight when the broker died: (queue, bodies).
    unanswered: Option<(i32, Vec<Vec<u8>>)>,
}

impl SendLog {
    /// The acknowledged messages of queue `queue_id`, in queue order.
    fn of_queue(&self, queue_id: i32) -> Vec<&Acknowledged> {
        self.acknowledged
            .iter()
            .filter(|message| message.queue_id == queue_id)
            .collect()
    }
}

/// Sends batches of 1 or 3 messages round-robin to `queues` queues until the broker stops
/// answering (or `max_sends` is reached), logging every acknowledged message.
fn send_until_the_broker_dies(
    mut client: TestClient,
    topic: &'static str,
    queues: i32,
    max_sends: usize,
    log: &Mutex<SendLog>,
) {
    for index in 0..max_sends {
        let queue_id = i32::try_from(index).unwrap() % queues;
        let batch: Vec<TestMessage> = (0..1 + 2 * (index % 2))
            .map(|part| TestMessage::new(format!("crash-{index}-{part}")))
            .collect();
        let answer = client.request(|builder| send_request_body(builder, topic, queue_id, &batch));
        let mut log = log.lock().unwrap();
        match answer {
            Ok(response)
                if [wire::Status::OK, wire::Status::FLUSH_DISK_TIMEOUT]
                    .contains(&status_of(&response).0) =>
            {
                let is_ok = status_of(&response).0 == wire::Status::OK;
                let sent = send_response(&response);
                assert_eq!(sent.queue_id, queue_id);
                for (result, message) in sent.results.iter().zip(&batch) {
                    log.acknowledged.push(Acknowledged {
                        queue_id,
                        queue_offset: result.queue_offset,
                        body: message.body.clone(),
                        is_ok,
                    });
                }
            }
            Ok(response) => panic!(
                "a send during the crash test answered {:?}",
                status_of(&response)
            ),
            Err(_) => {
                log.unanswered = Some((
                    queue_id,
                    batch.into_iter().map(|message| message.body).collect(),
                ));
                return;
            }
        }
    }
}

/// The rows of each storage shard's consumer offsets file (`crc32=...` line, then JSON):
/// (group, topic, queue, offset).
fn persisted_offsets(
    data_dir: &std::path::Path,
    shards: usize,
) -> BTreeSet<(String, String, u64, u64)> {
    let mut rows = BTreeSet::new();
    for shard in 0..shards {
        let path = data_dir.join(format!("shard-{shard}")).join("offsets");
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let Some(newline) = bytes.iter().position(|&b| b == b'\n') else {
            continue;
        };
        let Ok(serde_json::Value::Array(items)) = serde_json::from_slice(&bytes[newline + 1..])
        else {
            continue;
        };
        for item in items {
            rows.insert((
                item["group"].as_str().unwrap_or_default().to_owned(),
                item["topic"].as_str().unwrap_or_default().to_owned(),
                item["queue_id"].as_u64().unwrap_or(u64::MAX),
                item["offset"].as_u64().unwrap_or(u64::MAX),
            ));
        }
    }
    rows
}

#[test]
fn every_acknowledged_send_and_persisted_offset_survives_kill_9_under_sync_flush() {
    const TOPIC: &str = "Crash";
    const QUEUES: i32 = 4;
    let dir = temp_dir();
    let mut broker = BrokerProcess::start(
        dir.path(),
        &[
            "--storage-cores",
            "0,1",
            "--network-cores",
            "1",
            "--flush",
            "sync",
            "--offsets-persist-interval-ms",
            "100",
        ],
    );
    let mut client = broker.client();
    create_topic(&mut client, TOPIC, u32::try_from(QUEUES).unwrap());

    // Offsets are persisted every 100 ms, not with each commit: wait until both shards' files
    // hold the commits before killing (a kill -9 loses at most the last interval's commits).
    let commits: Vec<(i32, i64)> = (0..QUEUES)
        .map(|queue| (queue, 10 + i64::from(queue)))
        .collect();
    for &(queue, offset) in &commits {
        commit_offset(&mut client, "CrashGroup", TOPIC, queue, offset);
    }
    let wanted: BTreeSet<_> = commits
        .iter()
        .map(|&(queue, offset)| {
            (
                "CrashGroup".to_owned(),
                TOPIC.to_owned(),
                u64::try_from(queue).unwrap(),
                u64::try_from(offset).unwrap(),
            )
        })
        .collect();
    wait_until(
        Duration::from_secs(5),
        "the offsets files to hold the commits",
        || {
            persisted_offsets(broker.data_dir(), 2)
                .is_superset(&wanted)
                .then_some(())
        },
    );

    // Kill the broker while a producer is sending.
    let log = Arc::new(Mutex::new(SendLog::default()));
    let sender = {
        let client = broker.client();
        let log = Arc::clone(&log);
        thread::spawn(move || send_until_the_broker_dies(client, TOPIC, QUEUES, 20_000, &log))
    };
    wait_until(Duration::from_secs(20), "200 acknowledged messages", || {
        (log.lock().unwrap().acknowledged.len() >= 200).then_some(())
    });
    broker.kill9();
    sender.join().expect("the sender thread");
    let log = std::mem::take(&mut *log.lock().unwrap());
    assert!(
        log.unanswered.is_some(),
        "the sender stopped before the kill"
    );

    broker.restart();
    let mut client = broker.client();
    let mut stored: BTreeMap<i32, Vec<StoredMessage>> = BTreeMap::new();
    for queue in 0..QUEUES {
        stored.insert(queue, pull_all(&mut client, TOPIC, queue, 64));
    }
    for acknowledged in &log.acknowledged {
        let place = format!("{}/{}", acknowledged.queue_id, acknowledged.queue_offset);
        match stored[&acknowledged.queue_id]
            .get(usize::try_from(acknowledged.queue_offset).unwrap())
        {
            Some(message) => assert_eq!(
                message.body, acknowledged.body,
                "after kill -9, {place} holds another message than the one acknowledged there"
            ),
            // FLUSH_DISK_TIMEOUT promised nothing.
            None => assert!(
                !acknowledged.is_ok,
                "message {place} ({}), acknowledged OK, is not there after kill -9",
                String::from_utf8_lossy(&acknowledged.body)
            ),
        }
    }
    // Beyond the acknowledged messages there is at most the batch in flight, whole.
    let mut extra: Vec<(i32, Vec<u8>)> = Vec::new();
    for (queue, messages) in &stored {
        let acknowledged = log.of_queue(*queue).len();
        extra.extend(
            messages[acknowledged.min(messages.len())..]
                .iter()
                .map(|message| (*queue, message.body.clone())),
        );
    }
    if !extra.is_empty() {
        let (queue, bodies) = log.unanswered.clone().expect("a batch in flight");
        let in_flight: Vec<(i32, Vec<u8>)> = bodies.into_iter().map(|body| (queue, body)).collect();
        assert_eq!(
            extra, in_flight,
            "after kill -9 the queues hold more than the acknowledged messages and the whole batch in flight"
        );
    }
    for &(queue, offset) in &commits {
        assert_eq!(
            committed_offset(&mut client, "CrashGroup", TOPIC, queue),
            Some(offset),
            "a persisted consumer offset of queue {queue} is lost after kill -9"
        );
    }

    // The recovered directory is consistent: the broker's own checker agrees after a clean stop.
    drop(client);
    broker.stop();
    let verify = Command::new(binary_path(BrokerProcess::BINARY))
        .args(["verify", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("run shardmq-broker verify");
    assert!(
        verify.status.success(),
        "verify after recovery from kill -9 found problems:\n{}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
}

#[test]
fn kill_9_under_async_flush_keeps_every_acknowledged_message_in_order() {
    const TOPIC: &str = "AsyncCrash";
    const QUEUES: i32 = 4;
    let dir = temp_dir();
    let mut broker = BrokerProcess::start(
        dir.path(),
        &[
            "--storage-cores",
            "0,1",
            "--network-cores",
            "1",
            "--flush",
            "async",
            "--flush-interval-ms",
            "20",
        ],
    );
    let mut client = broker.client();
    create_topic(&mut client, TOPIC, u32::try_from(QUEUES).unwrap());
    drop(client);

    let log = Arc::new(Mutex::new(SendLog::default()));
    let sender = {
        let client = broker.client();
        let log = Arc::clone(&log);
        thread::spawn(move || send_until_the_broker_dies(client, TOPIC, QUEUES, 50_000, &log))
    };
    wait_until(Duration::from_secs(20), "500 acknowledged messages", || {
        (log.lock().unwrap().acknowledged.len() >= 500).then_some(())
    });
    broker.kill9();
    sender.join().expect("the sender thread");
    let log = std::mem::take(&mut *log.lock().unwrap());

    // Async flush acknowledges a send once its O_DIRECT write has completed: a kill -9 of the
    // process loses none of them (only a power loss could lose the unsynced ones). Each queue
    // holds every acknowledged message in order, then at most the batch in flight.
    broker.restart();
    let mut client = broker.client();
    let mut kept = 0;
    for queue in 0..QUEUES {
        let stored = pull_all(&mut client, TOPIC, queue, 64);
        let acknowledged: Vec<&Vec<u8>> = log
            .of_queue(queue)
            .into_iter()
            .map(|message| &message.body)
            .collect();
        for (offset, message) in stored.iter().enumerate() {
            match acknowledged.get(offset) {
                Some(body) => assert_eq!(
                    &message.body,
                    *body,
                    "queue {queue} offset {offset} after kill -9 is not the message acknowledged there"
                ),
                None => {
                    let (in_flight_queue, bodies) =
                        log.unanswered.as_ref().expect("a batch in flight");
                    assert_eq!(
                        *in_flight_queue, queue,
                        "queue {queue} holds unacknowledged messages"
                    );
                    assert_eq!(
                        stored[acknowledged.len()..]
                            .iter()
                            .map(|message| &message.body)
                            .collect::<Vec<_>>(),
                        bodies.iter().collect::<Vec<_>>(),
                        "queue {queue}: beyond the acknowledged messages is not the whole batch in flight"
                    );
                    break;
                }
            }
        }
        assert!(
            stored.len() >= acknowledged.len(),
            "queue {queue}: {} of {} acknowledged messages survived kill -9 under async flush",
            stored.len(),
            acknowledged.len()
        );
        kept += acknowledged.len();
    }
    assert_eq!(kept, log.acknowledged.len());
    eprintln!("async kill -9: all {kept} acknowledged messages kept");
    drop(client);
    broker.stop();
    let verify = Command::new(binary_path(BrokerProcess::BINARY))
        .args(["verify", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("run shardmq-broker verify");
    assert!(
        verify.status.success(),
        "verify after recovery from kill -9 found problems:\n{}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
}

#[test]
fn broker_refuses_a_data_dir_made_with_another_storage_shard_count() {
    let dir = temp_dir();
    let mut broker = BrokerProcess::start(dir.path(), &TWO_STORAGE_SHARDS);
    let mut client = broker.client();
    create_topic(&mut client, "Sharded", 4);
    send(&mut client, "Sharded", 1, &[TestMessage::new("on shard 1")]);
    drop(client);
    broker.stop();

    let mut one_shard = Command::new(binary_path(BrokerProcess::BINARY))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--storage-cores",
            "0",
            "--network-cores",
            "1",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the broker");
    let status = wait_until(
        Duration::from_secs(10),
        "the one-shard broker to exit",
        || one_shard.try_wait().expect("wait for the broker"),
    );
    let output = one_shard.wait_with_output().expect("the broker's output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        !status.success() && !stdout.contains("listening on"),
        "a broker with 1 storage shard served a 2-shard data dir (status {status}, stdout {stdout})"
    );

    // The directory is untouched: the two-shard broker still has the message.
    broker.restart();
    let mut client = broker.client();
    let stored = pull_all(&mut client, "Sharded", 1, 32);
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].body, b"on shard 1");
}

// ---------------------------------------------------------------------------------------------
// Name server registration

/// The route of `topic` at the namesrv as (brokers, queues); `None` on TOPIC_NOT_FOUND.
type RouteSummary = (
    Vec<(String, String, Vec<(i64, String)>)>,
    Vec<(String, u32, u32, u32)>,
);

fn route_at(namesrv: &NamesrvProcess, topic: &str) -> Option<RouteSummary> {
    let mut client = namesrv.client();
    let response = client
        .request(|builder| {
            let topic = builder.create_string(topic);
            let request = wire::GetRouteRequest::create(
                builder,
                &wire::GetRouteRequestArgs { topic: Some(topic) },
            );
            (wire::Body::GetRouteRequest, request.as_union_value())
        })
        .expect("an answer to GetRouteRequest");
    if status_of(&response).0 == wire::Status::TOPIC_NOT_FOUND {
        return None;
    }
    require_status(&response, wire::Status::OK, "GetRouteRequest");
    let route = response
        .frame()
        .body_as_route_response()
        .expect("a RouteResponse");
    let brokers = route
        .brokers()
        .expect("RouteResponse.brokers")
        .iter()
        .map(|broker| {
            (
                broker.cluster_name().unwrap_or_default().to_owned(),
                broker.broker_name().unwrap_or_default().to_owned(),
                broker
                    .addresses()
                    .expect("BrokerData.addresses")
                    .iter()
                    .map(|address| {
                        (
                            address.broker_id(),
                            address.address().unwrap_or_default().to_owned(),
                        )
                    })
                    .collect(),
            )
        })
        .collect();
    let queues = route
        .queues()
        .expect("RouteResponse.queues")
        .iter()
        .map(|queue| {
            (
                queue.broker_name().unwrap_or_default().to_owned(),
                queue.read_queues(),
                queue.write_queues(),
                queue.perm(),
            )
        })
        .collect();
    Some((brokers, queues))
}

fn expected_route(broker: &BrokerProcess, read_queues: u32, write_queues: u32) -> RouteSummary {
    (
        vec![(
            "DefaultCluster".to_owned(),
            "broker-a".to_owned(),
            vec![(0, broker.addr().to_string())],
        )],
        vec![(
            "broker-a".to_owned(),
            read_queues,
            write_queues,
            PERM_READ_WRITE,
        )],
    )
}

#[test]
fn created_topic_is_routed_by_the_namesrv_until_the_broker_stops_gracefully() {
    let namesrv = NamesrvProcess::start();
    let dir = temp_dir();
    let namesrv_addr = namesrv.addr().to_string();
    let mut broker = BrokerProcess::start(
        dir.path(),
        &["--namesrv", &namesrv_addr, "--register-interval-ms", "200"],
    );
    assert_eq!(
        route_at(&namesrv, "Routed"),
        None,
        "a route before the topic exists"
    );

    let mut client = broker.client();
    create_topic_with(&mut client, "Routed", (4, 3, PERM_READ_WRITE));
    let expected = expected_route(&broker, 4, 3);
    let route = wait_until(
        Duration::from_secs(5),
        "the route of Routed at the namesrv",
        || route_at(&namesrv, "Routed"),
    );
    assert_eq!(
        route, expected,
        "the namesrv's route disagrees with the broker"
    );

    // A deleted topic leaves the route table at the next registration; the others stay.
    create_topic(&mut client, "Doomed", 2);
    wait_until(Duration::from_secs(5), "the route of Doomed", || {
        route_at(&namesrv, "Doomed")
    });
    let response = client
        .request(|builder| delete_topic_body(builder, "Doomed"))
        .expect("an answer to DeleteTopicRequest");
    require_status(&response, wire::Status::OK, "deleting Doomed");
    wait_until(Duration::from_secs(5), "the route of Doomed to go", || {
        route_at(&namesrv, "Doomed").is_none().then_some(())
    });
    assert_eq!(route_at(&namesrv, "Routed"), Some(expected));
    let response = client
        .request(|builder| delete_topic_body(builder, "Doomed"))
        .expect("an answer to DeleteTopicRequest");
    require_status(
        &response,
        wire::Status::TOPIC_NOT_FOUND,
        "deleting Doomed twice",
    );
    // System topics are the broker's own: deleting one is refused, as creating one is.
    for system in [
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "%RETRY%some-group",
        "%DLQ%some-group",
    ] {
        let response = client
            .request(|builder| delete_topic_body(builder, system))
            .expect("an answer to DeleteTopicRequest");
        require_status(
            &response,
            wire::Status::NO_PERMISSION,
            &format!("deleting the system topic {system}"),
        );
    }
    // Forced: never the broker's machinery; a group's retry topic only once the group has no
    // live member.
    let response = client
        .request(|builder| delete_topic_body_forced(builder, "SCHEDULE_TOPIC_XXXX", true))
        .expect("an answer to DeleteTopicRequest");
    require_status(
        &response,
        wire::Status::NO_PERMISSION,
        "forced delete of the schedule topic",
    );
    let mut member = broker.client();
    let (response, _) = member
        .request_collecting_one_way(|builder| {
            heartbeat_body(builder, "leaver", "Leaving", "Doomed2")
        })
        .expect("an answer to the heartbeat");
    require_status(&response, wire::Status::OK, "heartbeat");
    let response = client
        .request(|builder| delete_topic_body_forced(builder, "%RETRY%Leaving", true))
        .expect("an answer to DeleteTopicRequest");
    require_status(
        &response,
        wire::Status::NO_PERMISSION,
        "forced delete under a live member",
    );
    drop(member);
    let response = wait_until(Duration::from_secs(5), "the member to leave", || {
        let response = client
            .request(|builder| delete_topic_body_forced(builder, "%RETRY%Leaving", true))
            .expect("an answer to DeleteTopicRequest");
        (response.frame().status() == wire::Status::OK).then_some(response)
    });
    require_status(
        &response,
        wire::Status::OK,
        "forced delete of a dead group's retry topic",
    );
    let response = client
        .request(|builder| send_request_body(builder, "Doomed", 0, &[TestMessage::new("late")]))
        .expect("an answer to SendRequest");
    require_status(
        &response,
        wire::Status::TOPIC_NOT_FOUND,
        "a send to a deleted topic",
    );
    drop(client);

    // A graceful stop unregisters: the route is gone as soon as the broker has exited (the
    // namesrv's own expiry is 120 s away).
    broker.stop();
    assert_eq!(
        route_at(&namesrv, "Routed"),
        None,
        "the route outlived the broker's graceful stop"
    );
}

fn delete_topic_body(
    builder: &mut flatbuffers::FlatBufferBuilder<'static>,
    topic: &str,
) -> shardmq_tests::RequestBody {
    delete_topic_body_forced(builder, topic, false)
}

fn delete_topic_body_forced(
    builder: &mut flatbuffers::FlatBufferBuilder<'static>,
    topic: &str,
    force: bool,
) -> shardmq_tests::RequestBody {
    let topic = builder.create_string(topic);
    let request = wire::DeleteTopicRequest::create(
        builder,
        &wire::DeleteTopicRequestArgs {
            topic: Some(topic),
            force,
        },
    );
    (wire::Body::DeleteTopicRequest, request.as_union_value())
}

#[test]
fn a_silent_broker_expires_at_the_namesrv_and_a_killed_one_leaves_at_once() {
    const BROKER_TIMEOUT_MS: u64 = 3_000;
    let namesrv = NamesrvProcess::start_with_args(&[
        "--broker-timeout-ms",
        &BROKER_TIMEOUT_MS.to_string(),
        "--scan-interval-ms",
        "100",
    ]);
    let dir = temp_dir();
    let namesrv_addr = namesrv.addr().to_string();
    let mut broker = BrokerProcess::start(
        dir.path(),
        &["--namesrv", &namesrv_addr, "--register-interval-ms", "200"],
    );
    let mut client = broker.client();
    create_topic(&mut client, "Expiring", 2);
    drop(client);
    let expected = expected_route(&broker, 2, 2);
    wait_until(Duration::from_secs(5), "the route of Expiring", || {
        route_at(&namesrv, "Expiring")
    });

    // Re-registration keeps the route alive well past the broker timeout.
    let watch_until = Instant::now() + Duration::from_millis(BROKER_TIMEOUT_MS * 3 / 2);
    while Instant::now() < watch_until {
        assert_eq!(
            route_at(&namesrv, "Expiring").as_ref(),
            Some(&expected),
            "the route of a live, re-registering broker went away"
        );
        thread::sleep(Duration::from_millis(100));
    }

    // Paused, the broker's connection stays open but it stops registering: it expires after
    // the broker timeout, not before.
    shardmq_tests::signal(broker.pid(), "STOP");
    let paused_at = Instant::now();
    wait_until(
        Duration::from_secs(15),
        "the paused broker's route to expire",
        || route_at(&namesrv, "Expiring").is_none().then_some(()),
    );
    let silent_for = paused_at.elapsed();
    shardmq_tests::signal(broker.pid(), "CONT");
    assert!(
        silent_for >= Duration::from_millis(BROKER_TIMEOUT_MS / 2),
        "the route went away after {} ms, before the broker timeout could pass",
        silent_for.as_millis()
    );
    // Resumed, it registers again on the same connection.
    wait_until(Duration::from_secs(5), "the resumed broker's route", || {
        route_at(&namesrv, "Expiring")
    });

    // Killed, its registration connection closes and the name server drops it at once,
    // without waiting for the broker timeout.
    broker.kill9();
    let killed_at = Instant::now();
    wait_until(
        Duration::from_secs(10),
        "the killed broker's route to go",
        || route_at(&namesrv, "Expiring").is_none().then_some(()),
    );
    assert!(
        killed_at.elapsed() < Duration::from_millis(BROKER_TIMEOUT_MS),
        "the killed broker's route went away only after {} ms: the broker timeout, not its closed connection",
        killed_at.elapsed().as_millis()
    );
}

// ---------------------------------------------------------------------------------------------
// Tags, queries, stats, offsets by time, consumer groups

#[test]
fn pull_with_a_tag_expression_returns_only_the_named_tags_in_order() {
    const TOPIC: &str = "Tagged";
    let dir = temp_dir();
    let broker = BrokerProcess::start(dir.path(), &[]);
    let mut client = broker.client();
    create_topic(&mut client, TOPIC, 1);
    let tags = [
        Some("TagA"),
        Some("TagB"),
        Some("TagC"),
        None,
        Some("TagA"),
        Some("TagC"),
        Some("TagB"),
    ];
    let messages: Vec<TestMessage> = tags
        .iter()
        .enumerate()
        .map(|(index, tag)| {
            let message = TestMessage::new(format!("tagged {index}"));
            match tag {
                Some(tag) => message.tag(tag),
                None => message,
            }
        })
        .collect();
    send(&mut client, TOPIC, 0, &messages[..3]);
    send(&mut client, TOPIC, 0, &messages[3..]);

    let pull_tags = |client: &mut TestClient, expression: &str, offset: i64| {
        let mut params = PullParams::new(TOPIC, 0, offset);
        params.tag_expression = Some(expression.to_owned());
        pull(client, &params)
    };
    for (expression, wanted_offsets) in [
        ("TagA || TagB", vec![0, 1, 4, 6]),
        ("TagC", vec![2, 5]),
        ("TagB||TagC", vec![1, 2, 5, 6]),
        ("*", (0..7).collect()),
        ("", (0..7).collect()),
    ] {
        let answer = pull_tags(&mut client, expression, 0);
        assert_eq!(answer.status, wire::Status::OK, "{expression:?}");
        let offsets: Vec<u64> = answer.records.iter().map(|r| r.queue_offset).collect();
        assert_eq!(offsets, wanted_offsets, "pull with {expression:?}");
        for record in &answer.records {
            let index = usize::try_from(record.queue_offset).unwrap();
            assert_eq!(record.body, messages[index].body);
            assert_eq!(record.tags.as_deref(), tags[index]);
        }
        assert_eq!(
            answer.next_begin_offset, 7,
            "{expression:?} scans the whole queue"
        );
    }

    // Only non-matching messages left: retry at once from past them.
    send(
        &mut client,
        TOPIC,
        0,
        &[
            TestMessage::new("c1").tag("TagC"),
            TestMessage::new("c2").tag("TagC"),
        ],
    );
    let answer = pull_tags(&mut client, "TagA", 7);
    assert_eq!(answer.status, wire::Status::PULL_RETRY_IMMEDIATELY);
    assert!(answer.records.is_empty());
    assert_eq!(answer.next_begin_offset, 9);
}

#[test]
fn queries_by_key_unique_id_and_offset_id_find_messages_on_every_shard() {
    const TOPIC: &str = "Indexed";
    let dir = temp_dir();
    let broker = BrokerProcess::start(dir.path(), &TWO_STORAGE_SHARDS);
    let mut client = broker.client();
    create_topic(&mut client, TOPIC, 4);
    create_topic(&mut client, "Elsewhere", 1);
    let mut sent = Vec::new();
    for queue in 0..4 {
        let message = TestMessage::new(format!("indexed {queue}"))
            .keys(&[&format!("order-{queue}"), "shared"])
            .unique_id(&format!("UID-{queue}"));
        let result = send(&mut client, TOPIC, queue, std::slice::from_ref(&message));
        sent.push((message, result.results[0].clone()));
    }
    send(
        &mut client,
        "Elsewhere",
        0,
        &[TestMessage::new("elsewhere").keys(&["order-1"])],
    );

    for (message, result) in &sent {
        let key = &message.keys[0];
        let found =
            query_by_key(&mut client, TOPIC, key).unwrap_or_else(|| panic!("key {key} not found"));
        assert_eq!(found.len(), 1, "key {key} is on one message of {TOPIC}");
        assert_eq!(found[0].body, message.body, "key {key}");

        let unique_id = message.unique_id.as_deref().unwrap();
        let found = query_by_id(&mut client, unique_id, false)
            .unwrap_or_else(|| panic!("unique id {unique_id} not found"));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].body, message.body, "unique id {unique_id}");

        let found = query_by_id(&mut client, &result.offset_msg_id, true)
            .unwrap_or_else(|| panic!("offset id {} not found", result.offset_msg_id));
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].body, message.body,
            "offset id {}",
            result.offset_msg_id
        );
    }
    let shared = query_by_key(&mut client, TOPIC, "shared").expect("key shared");
    let mut bodies: Vec<Vec<u8>> = shared.into_iter().map(|message| message.body).collect();
    bodies.sort();
    let mut wanted: Vec<Vec<u8>> = sent
        .iter()
        .map(|(message, _)| message.body.clone())
        .collect();
    wanted.sort();
    assert_eq!(
        bodies, wanted,
        "a key on messages of both shards finds all of them"
    );

    assert!(query_by_key(&mut client, TOPIC, "no-such-key").is_none());
    assert!(
        query_by_key(&mut client, "Elsewhere", "shared").is_none(),
        "keys are per topic"
    );
    assert!(query_by_id(&mut client, "UID-none", false).is_none());
}

#[test]
fn topic_stats_and_queue_offsets_report_each_queues_range() {
    const TOPIC: &str = "Counted";
    let dir = temp_dir();
    let broker = BrokerProcess::start(dir.path(), &TWO_STORAGE_SHARDS);
    let mut client = broker.client();
    create_topic(&mut client, TOPIC, 4);
    let before_ms = now_ms();
    for queue in 0..3 {
        let messages: Vec<TestMessage> = (0..=queue)
            .map(|i| TestMessage::new(format!("{queue}/{i}")))
            .collect();
        send(&mut client, TOPIC, queue, &messages);
    }

    let response = client
        .request(|builder| {
            let topic = builder.create_string(TOPIC);
            let request = wire::TopicStatsRequest::create(
                builder,
                &wire::TopicStatsRequestArgs { topic: Some(topic) },
            );
            (wire::Body::TopicStatsRequest, request.as_union_value())
        })
        .expect("an answer to TopicStatsRequest");
    require_status(&response, wire::Status::OK, "TopicStatsRequest");
    let stats = response
        .frame()
        .body_as_topic_stats_response()
        .expect("a TopicStatsResponse");
    assert_eq!(stats.topic(), Some(TOPIC));
    let queues: Vec<(i32, i64, i64)> = stats
        .queues()
        .expect("TopicStatsResponse.queues")
        .iter()
        .map(|queue| (queue.queue_id(), queue.min_offset(), queue.max_offset()))
        .collect();
    assert_eq!(
        queues,
        [(0, 0, 1), (1, 0, 2), (2, 0, 3), (3, 0, 0)],
        "(queue, min, max) of each queue"
    );
    for queue in stats
        .queues()
        .unwrap()
        .iter()
        .filter(|queue| queue.max_offset() > 0)
    {
        assert!(
            queue.last_update_ms() >= before_ms - 1_000,
            "queue {}: last update {} is before the sends ({before_ms})",
            queue.queue_id(),
            queue.last_update_ms()
        );
    }
    for (queue, min_offset, max_offset) in queues {
        assert_eq!(
            queue_offsets(&mut client, TOPIC, queue),
            (min_offset, max_offset)
        );
    }

    let response = client
        .request(|builder| {
            let topic = builder.create_string("NoSuchTopic");
            let request = wire::TopicStatsRequest::create(
                builder,
                &wire::TopicStatsRequestArgs { topic: Some(topic) },
            );
            (wire::Body::TopicStatsRequest, request.as_union_value())
        })
        .expect("an answer to TopicStatsRequest");
    require_status(
        &response,
        wire::Status::TOPIC_NOT_FOUND,
        "stats of an unknown topic",
    );
}

fn offset_by_time(client: &mut TestClient, topic: &str, queue_id: i32, timestamp_ms: i64) -> i64 {
    let response = client
        .request(|builder| {
            let topic = builder.create_string(topic);
            let request = wire::OffsetByTimeRequest::create(
                builder,
                &wire::OffsetByTimeRequestArgs {
                    topic: Some(topic),
                    queue_id,
                    timestamp_ms,
                },
            );
            (wire::Body::OffsetByTimeRequest, request.as_union_value())
        })
        .expect("an answer to OffsetByTimeRequest");
    require_status(&response, wire::Status::OK, "OffsetByTimeRequest");
    response
        .frame()
        .body_as_offset_response()
        .expect("an OffsetResponse")
        .offset()
}

#[test]
fn offset_by_time_is_the_first_message_stored_at_or_after_the_time() {
    const TOPIC: &str = "Timed";
    let dir = temp_dir();
    let broker = BrokerProcess::start(dir.path(), &[]);
    let mut client = broker.client();
    create_topic(&mut client, TOPIC, 1);
    assert_eq!(
        offset_by_time(&mut client, TOPIC, 0, now_ms()),
        0,
        "an empty queue"
    );

    let first: Vec<TestMessage> = (0..3)
        .map(|i| TestMessage::new(format!("early {i}")))
        .collect();
    send(&mut client, TOPIC, 0, &first);
    let early_stored_ms = pull_all(&mut client, TOPIC, 0, 32)
        .last()
        .expect("the first batch")
        .store_timestamp_ms;
    // Store times have millisecond resolution: let the clock move on before the second batch.
    wait_until(
        Duration::from_secs(2),
        "the clock to pass the first batch's store time",
        || (now_ms() > early_stored_ms + 2).then_some(()),
    );
    let second: Vec<TestMessage> = (0..3)
        .map(|i| TestMessage::new(format!("late {i}")))
        .collect();
    send(&mut client, TOPIC, 0, &second);
    let stored = pull_all(&mut client, TOPIC, 0, 32);
    let times: Vec<i64> = stored
        .iter()
        .map(|message| message.store_timestamp_ms)
        .collect();
    assert!(
        times[2] < times[3],
        "the batches share a store time: {times:?}"
    );

    assert_eq!(offset_by_time(&mut client, TOPIC, 0, 0), 0);
    assert_eq!(offset_by_time(&mut client, TOPIC, 0, times[0]), 0);
    assert_eq!(
        offset_by_time(&mut client, TOPIC, 0, times[2] + 1),
        3,
        "the first message at or after a time between the batches (store times {times:?})"
    );
    assert_eq!(offset_by_time(&mut client, TOPIC, 0, times[3]), 3);
    assert_eq!(
        offset_by_time(&mut client, TOPIC, 0, times[5] + 60_000),
        6,
        "a time after every message is the queue's end"
    );
}

#[test]
fn consumer_list_holds_heartbeating_clients_and_members_are_told_when_it_changes() {
    const GROUP: &str = "Watchers";
    const TOPIC: &str = "Watched";
    let dir = temp_dir();
    let broker = BrokerProcess::start(dir.path(), &TWO_STORAGE_SHARDS);
    let mut first = broker.client();
    create_topic(&mut first, TOPIC, 2);

    // Every notice `first` has been pushed, whenever it arrived.
    let mut first_notices: Vec<VerifiedFrame> = Vec::new();
    let (response, pushed) = first
        .request_collecting_one_way(|builder| heartbeat_body(builder, "client-A", GROUP, TOPIC))
        .expect("an answer to the first heartbeat");
    require_status(&response, wire::Status::OK, "first heartbeat");
    first_notices.extend(pushed);

    let mut second = broker.client();
    let response = second
        .request_collecting_one_way(|builder| heartbeat_body(builder, "client-B", GROUP, TOPIC))
        .expect("an answer to the second heartbeat")
        .0;
    require_status(&response, wire::Status::OK, "second heartbeat");

    let (response, pushed) = first
        .request_collecting_one_way(|builder| consumer_list_body(builder, GROUP))
        .expect("an answer to ConsumerListRequest");
    first_notices.extend(pushed);
    assert_eq!(consumer_ids(&response), ["client-A", "client-B"]);

    // `first` is told twice: when it joined, and when `second` joined.
    let read_notice =
        |client: &mut TestClient, notices: &mut Vec<VerifiedFrame>, count: usize, what: &str| {
            while notices.len() < count {
                let frame = client
                    .read_frame()
                    .unwrap_or_else(|error| panic!("no ConsumerIdsChangedNotice {what}: {error}"));
                assert_eq!(frame.frame().kind(), wire::FrameKind::ONE_WAY, "{frame:?}");
                notices.push(frame);
            }
        };
    read_notice(
        &mut first,
        &mut first_notices,
        2,
        "when the second client joined",
    );
    assert_eq!(notice_groups(&first_notices), [GROUP, GROUP]);

    // The second client's connection closes: it leaves, and `first` is told again.
    drop(second);
    read_notice(
        &mut first,
        &mut first_notices,
        3,
        "when the second client left",
    );
    assert_eq!(notice_groups(&first_notices[2..]), [GROUP]);
    let response = wait_until(
        Duration::from_secs(5),
        "the group to list only client-A",
        || {
            let (response, pushed) = first
                .request_collecting_one_way(|builder| consumer_list_body(builder, GROUP))
                .expect("an answer to ConsumerListRequest");
            assert!(pushed.is_empty(), "an extra notice: {pushed:?}");
            (consumer_ids(&response) == ["client-A"]).then_some(response)
        },
    );
    assert_eq!(consumer_ids(&response), ["client-A"]);

    // The group got its retry topic, a system topic hidden from the user topic list.
    let response = first
        .request(|builder| {
            let request = wire::BrokerTopicsRequest::create(
                builder,
                &wire::BrokerTopicsRequestArgs {
                    include_system: true,
                },
            );
            (wire::Body::BrokerTopicsRequest, request.as_union_value())
        })
        .expect("an answer to BrokerTopicsRequest");
    require_status(&response, wire::Status::OK, "BrokerTopicsRequest");
    let all_topics: Vec<String> = response
        .frame()
        .body_as_broker_topics_response()
        .expect("a BrokerTopicsResponse")
        .topics()
        .expect("topics")
        .iter()
        .map(|topic| topic.name().unwrap_or_default().to_owned())
        .collect();
    assert!(
        all_topics.contains(&format!("%RETRY%{GROUP}")),
        "no retry topic for {GROUP} in {all_topics:?}"
    );
    assert_eq!(
        broker_topics(&mut first),
        [(TOPIC.to_owned(), 2, 2, PERM_READ_WRITE)],
        "system topics listed as user topics"
    );

    // Leaving the group explicitly empties it.
    let (response, _) = first
        .request_collecting_one_way(|builder| {
            let client_id = builder.create_string("client-A");
            let group = builder.create_string(GROUP);
            let request = wire::UnregisterClientRequest::create(
                builder,
                &wire::UnregisterClientRequestArgs {
                    client_id: Some(client_id),
                    producer_group: None,
                    consumer_group: Some(group),
                },
            );
            (
                wire::Body::UnregisterClientRequest,
                request.as_union_value(),
            )
        })
        .expect("an answer to UnregisterClientRequest");
    require_status(&response, wire::Status::OK, "UnregisterClientRequest");
    let (response, _) = first
        .request_collecting_one_way(|builder| consumer_list_body(builder, GROUP))
        .expect("an answer to ConsumerListRequest");
    assert!(
        consumer_ids(&response).is_empty(),
        "client-A is still listed after leaving"
    );
}

#[test]
fn a_client_stays_in_its_group_until_its_last_connection_closes() {
    const GROUP: &str = "TwoLines";
    const TOPIC: &str = "Lines";
    let dir = temp_dir();
    // Two network shards, so the two connections may land on different shards.
    let broker = BrokerProcess::start(dir.path(), &TWO_STORAGE_SHARDS);
    let mut observer = broker.client();
    create_topic(&mut observer, TOPIC, 2);
    let mut first = broker.client();
    let mut second = broker.client();
    for (connection, what) in [(&mut first, "first"), (&mut second, "second")] {
        let (response, _) = connection
            .request_collecting_one_way(|builder| heartbeat_body(builder, "client-C", GROUP, TOPIC))
            .unwrap_or_else(|error| panic!("heartbeat on the {what} connection: {error}"));
        require_status(&response, wire::Status::OK, "heartbeat");
    }
    let list = |observer: &mut TestClient| {
        let (response, _) = observer
            .request_collecting_one_way(|builder| consumer_list_body(builder, GROUP))
            .expect("an answer to ConsumerListRequest");
        consumer_ids(&response)
    };
    assert_eq!(list(&mut observer), ["client-C"]);

    // One connection closes; the client still has the other, so it stays. Nothing signals
    // "the close was processed", so the group is watched for half a second (the broker sees a
    // close within milliseconds; the old bug showed within that window every time).
    drop(first);
    let deadline = std::time::Instant::now() + Duration::from_millis(500);
    while std::time::Instant::now() < deadline {
        assert_eq!(
            list(&mut observer),
            ["client-C"],
            "closing one of the client's two connections removed it from its group"
        );
    }

    // Its last connection closes: now it leaves.
    drop(second);
    wait_until(
        Duration::from_secs(5),
        "client-C to leave once its last connection closed",
        || list(&mut observer).is_empty().then_some(()),
    );
}

#[test]
fn silent_consumer_expires_after_the_client_timeout() {
    const GROUP: &str = "Forgetful";
    let dir = temp_dir();
    let broker = BrokerProcess::start(dir.path(), &["--client-timeout-ms", "300"]);
    let mut member = broker.client();
    create_topic(&mut member, "Ticking", 1);
    let (response, _) = member
        .request_collecting_one_way(|builder| heartbeat_body(builder, "client-S", GROUP, "Ticking"))
        .expect("an answer to the heartbeat");
    require_status(&response, wire::Status::OK, "heartbeat");

    // The member's connection stays open but it sends no more heartbeats.
    let mut observer = broker.client();
    let response = observer
        .request(|builder| consumer_list_body(builder, GROUP))
        .expect("an answer to ConsumerListRequest");
    assert_eq!(consumer_ids(&response), ["client-S"]);
    let started = Instant::now();
    wait_until(
        Duration::from_secs(5),
        "the silent member to expire",
        || {
            let response = observer
                .request(|builder| consumer_list_body(builder, GROUP))
                .expect("an answer to ConsumerListRequest");
            consumer_ids(&response).is_empty().then_some(())
        },
    );
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "the member expired after {} ms, before its 300 ms timeout",
        started.elapsed().as_millis()
    );
    drop(member);
}

/// A client id may have several connections (handshake and heartbeat both name it). Closing
/// one of them must not drop the client from its groups while another is still open and
/// heartbeating (RocketMQ keys group membership by channel). The broker sends `ClientGone` for
/// the client id whenever any of its connections closes
/// (`NetworkShard::unregister_connection` in broker/src/network/mod.rs).

#[test]
fn auto_create_makes_unknown_topics_on_first_send_but_not_invalid_or_system_ones() {
    let dir = temp_dir();
    let broker = BrokerProcess::start(dir.path(), &["--auto-create-topics"]);
    let mut client = broker.client();
    let sent = send(&mut client, "Fresh", -1, &[TestMessage::new("first ever")]);
    assert_eq!(sent.results[0].queue_offset, 0);
    assert_eq!(
        broker_topics(&mut client),
        [("Fresh".to_owned(), 8, 8, PERM_READ_WRITE)],
        "the auto-created topic's config"
    );
    let stored = pull_all(&mut client, "Fresh", sent.queue_id, 32);
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].body, b"first ever");

    for (topic, expected) in [
        ("bad/name", wire::Status::INVALID_ARGUMENT),
        ("%DLQ%g", wire::Status::NO_PERMISSION),
    ] {
        let response = client
            .request(|builder| send_request_body(builder, topic, -1, &[TestMessage::new("x")]))
            .expect("an answer to SendRequest");
        require_status(&response, expected, &format!("auto-create of {topic}"));
    }
    assert_eq!(
        broker_topics(&mut client).len(),
        1,
        "a refused send created a topic"
    );
}

#[test]
fn a_second_broker_on_a_taken_address_refuses_to_start() {
    // The network shards share their port with SO_REUSEPORT, which would also let a second
    // broker join the first one's socket: connections would alternate between the two.
    let first_dir = temp_dir();
    let first = BrokerProcess::start(first_dir.path(), &[]);
    let taken = first.addr().to_string();
    let second_dir = temp_dir();
    let mut second = Command::new(shardmq_tests::binary_path(BrokerProcess::BINARY))
        .args(["--listen", taken.as_str(), "--data-dir"])
        .arg(second_dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start a second broker");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = second.try_wait().expect("wait for the second broker") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = second.kill();
            panic!("a second broker on {taken} kept running instead of refusing the address");
        }
        thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    io::Read::read_to_string(&mut second.stderr.take().expect("stderr"), &mut stderr)
        .expect("read stderr");
    assert!(!status.success(), "the second broker exited successfully");
    assert!(
        stderr.contains("another process is listening there"),
        "the error names the cause: {stderr}"
    );
    // The first broker still answers alone.
    let mut client = first.client();
    create_topic(&mut client, "StillMine", 1);
}

#[test]
fn a_broker_killed_with_open_connections_starts_again_on_the_same_address() {
    // Connections the killed broker had accepted linger (FIN-WAIT) on its port for a while;
    // they block a plain bind but are no listener: the broker must start there again.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let address = format!("127.0.0.1:{port}");
    let dir = temp_dir();
    let start = |dir: &std::path::Path| {
        Command::new(shardmq_tests::binary_path(BrokerProcess::BINARY))
            // The HA port would default to the listen port + 1, which another test's
            // outgoing connection may hold: this test is about the listen port alone.
            .args(["--listen", address.as_str(), "--ha-listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start the broker")
    };
    let wait_listening = |child: &mut std::process::Child| {
        let mut line = String::new();
        let stdout = child.stdout.as_mut().expect("stdout");
        io::BufRead::read_line(&mut io::BufReader::new(stdout), &mut line).expect("read");
        if !line.contains("listening on") {
            let mut stderr = String::new();
            let _ = io::Read::read_to_string(child.stderr.as_mut().expect("stderr"), &mut stderr);
            panic!("the broker said {line:?}; its log: {stderr}");
        }
    };
    let mut first = start(dir.path());
    wait_listening(&mut first);
    // Clients stay connected (and never close) while the broker dies.
    let held: Vec<_> = (0..3)
        .map(|_| {
            let mut client = shardmq_tests::TestClient::connect(address.parse().unwrap()).unwrap();
            client.handshake().unwrap();
            client
        })
        .collect();
    first.kill().unwrap();
    first.wait().unwrap();
    let mut second = start(dir.path());
    wait_listening(&mut second);
    let mut client = shardmq_tests::TestClient::connect(address.parse().unwrap()).unwrap();
    client.handshake().unwrap();
    create_topic(&mut client, "Again", 1);
    drop(held);
    second.kill().unwrap();
    second.wait().unwrap();
}

#[test]
fn repeated_heartbeats_keep_a_client_alive_without_reaching_storage_each_time() {
    const GROUP: &str = "Steady";
    const TOPIC: &str = "SteadyTopic";
    let dir = temp_dir();
    let broker = BrokerProcess::start(dir.path(), &["--client-timeout-ms", "2000"]);
    let mut client = broker.client();
    create_topic(&mut client, TOPIC, 1);
    let mut observer = broker.client();
    let members = |observer: &mut TestClient| {
        let (response, _) = observer
            .request_collecting_one_way(|builder| consumer_list_body(builder, GROUP))
            .expect("an answer to ConsumerListRequest");
        consumer_ids(&response)
    };

    // Identical heartbeats every 250 ms for 4 s, twice the client timeout: the repeats only
    // refresh liveness (batched once a second), and that must keep the client a member.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        let (response, _) = client
            .request_collecting_one_way(|builder| heartbeat_body(builder, "steady-1", GROUP, TOPIC))
            .expect("an answer to the heartbeat");
        require_status(&response, wire::Status::OK, "heartbeat");
        assert_eq!(
            members(&mut observer),
            ["steady-1"],
            "a client heartbeating every 250 ms left its group after {:?}",
            started.elapsed()
        );
        // The heartbeat period under test.
        thread::sleep(Duration::from_millis(250));
    }
    // A change of subscription is applied at once, not batched.
    let (response, _) = client
        .request_collecting_one_way(|builder| heartbeat_body(builder, "steady-1", "Other", TOPIC))
        .expect("an answer to the heartbeat");
    require_status(&response, wire::Status::OK, "heartbeat");
    assert!(
        members(&mut observer).is_empty(),
        "the group change was not applied"
    );
    let (response, _) = observer
        .request_collecting_one_way(|builder| consumer_list_body(builder, "Other"))
        .expect("an answer to ConsumerListRequest");
    assert_eq!(consumer_ids(&response), ["steady-1"]);

    // Silent (connection open, no heartbeats): it expires after the timeout.
    wait_until(
        Duration::from_secs(10),
        "the silent client to expire",
        || {
            let (response, _) = observer
                .request_collecting_one_way(|builder| consumer_list_body(builder, "Other"))
                .expect("an answer to ConsumerListRequest");
            consumer_ids(&response).is_empty().then_some(())
        },
    );
    drop(client);
}

/// The queues a heartbeat says its client holds are bounded and checked: more than
/// `MAX_HELD_QUEUES`, an invalid topic name or an empty broker name refuse the heartbeat with
/// INVALID_ARGUMENT and leave the group as it was; a valid list comes back in the member list.
#[test]
fn held_queues_in_a_heartbeat_are_bounded_and_checked() {
    const GROUP: &str = "Holders";
    const TOPIC: &str = "Held";
    let dir = temp_dir();
    let broker = BrokerProcess::start(dir.path(), &[]);
    let mut client = broker.client();
    create_topic(&mut client, TOPIC, 2);

    let too_many: Vec<(&str, &str, u32)> = (0..=shardmq_schema::MAX_HELD_QUEUES as u32)
        .map(|queue_id| (TOPIC, "broker-a", queue_id))
        .collect();
    let bad_topic = [("no spaces allowed", "broker-a", 0)];
    let no_broker = [(TOPIC, "", 0)];
    for (what, held) in [
        ("too many", &too_many[..]),
        ("a bad topic", &bad_topic[..]),
        ("no broker name", &no_broker[..]),
    ] {
        let response = client
            .request(|builder| heartbeat_holding(builder, "holder", GROUP, TOPIC, Some(held)))
            .expect("an answer to the heartbeat");
        require_status(&response, wire::Status::INVALID_ARGUMENT, what);
    }
    let response = client
        .request(|builder| consumer_list_body(builder, GROUP))
        .expect("an answer to ConsumerListRequest");
    assert!(
        consumer_ids(&response).is_empty(),
        "a refused heartbeat joined"
    );

    let held = [(TOPIC, "broker-a", 1), (TOPIC, "broker-a", 0)];
    let (response, _notices) = client
        .request_collecting_one_way(|builder| {
            heartbeat_holding(builder, "holder", GROUP, TOPIC, Some(&held))
        })
        .expect("an answer to the heartbeat");
    require_status(&response, wire::Status::OK, "a valid list");
    let (response, _notices) = client
        .request_collecting_one_way(|builder| consumer_list_body(builder, GROUP))
        .expect("an answer to ConsumerListRequest");
    let list = response
        .frame()
        .body_as_consumer_list_response()
        .expect("a ConsumerListResponse");
    let members = list.members().expect("members");
    assert_eq!(members.len(), 1);
    let reported: Vec<(String, String, u32)> = members
        .get(0)
        .held_queues()
        .expect("held queues")
        .iter()
        .map(|q| {
            (
                q.topic().unwrap_or_default().to_owned(),
                q.broker_name().unwrap_or_default().to_owned(),
                q.queue_id(),
            )
        })
        .collect();
    assert_eq!(reported.len(), 2, "{reported:?}");
    assert!(reported.contains(&(TOPIC.to_owned(), "broker-a".to_owned(), 0)));
    assert!(reported.contains(&(TOPIC.to_owned(), "broker-a".to_owned(), 1)));
}
