//! Any message the client can build travels through a real broker and comes back as it was
//! sent (issue 22, items 1–3): the producer encodes runs of stored records itself
//! (`SendRecordsRequest`), or wire messages for delayed and timer sends, and a consumer decodes
//! the same body, tag, keys, properties, unique id and flag. Runs cross CommitLog segment ends
//! (the broker runs with 128 KiB segments), so the offsets the client derives from the answer's
//! segment starts are checked too, against what the consumer reads and what a query by the
//! derived offset id finds.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use shardmq_client::{
    Admin, BatchSendResult, Message, MessageExt, MessageId, MessageQueue, Producer, PullConsumer,
    PullStatus, SendResult, SendStatus,
};
use shardmq_tests::LocalCluster;
use tempfile::TempDir;

const TOPIC: &str = "RoundTrip";
const QUEUES: u32 = 4;

/// Small segments, so that runs cross segment ends; bodies up to 8 KiB.
const BROKER_ARGS: &[&str] = &[
    "--segment-bytes",
    "131072",
    "--max-message-bytes",
    "8192",
    "--delay-levels",
    "100ms 200ms 300ms",
];

/// Longest a delayed message may take to appear, and a pull to complete a batch.
const WAIT: Duration = Duration::from_secs(30);

/// One message as a test builds it.
#[derive(Debug, Clone)]
struct Spec {
    body: Vec<u8>,
    tags: Option<String>,
    keys: Vec<String>,
    properties: Vec<(String, String)>,
    flag: i32,
    /// An id given as text (not of the client's 16-byte form).
    text_id: Option<String>,
}

impl Spec {
    fn message(&self) -> Message {
        let mut message = Message::new(TOPIC, self.body.clone())
            .with_keys(self.keys.clone())
            .with_flag(self.flag);
        if let Some(tags) = &self.tags {
            message = message.with_tags(tags.clone());
        }
        for (name, value) in &self.properties {
            message = message.with_property(name.clone(), value.clone());
        }
        if let Some(id) = &self.text_id {
            message = message.with_unique_id(id.as_str());
        }
        message
    }
}

#[derive(Debug, Clone, Copy)]
enum DelaySpec {
    Level(u32),
    /// Delivery at now + this many ms.
    AtInMs(i64),
    AfterMs(u64),
}

/// How a case is sent.
#[derive(Debug, Clone)]
enum How {
    /// `send` or `send_batch`.
    Plain,
    /// `send_async` or `send_batch_async`.
    Async,
    /// `send_ordered` by this key (one message only).
    Ordered(String),
}

#[derive(Debug, Clone)]
struct Case {
    messages: Vec<Spec>,
    /// Only for a case of one message: the broker takes delayed messages alone.
    delay: Option<DelaySpec>,
    is_compressing: bool,
    how: How,
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // Small.
        proptest::collection::vec(any::<u8>(), 1..200),
        // Up to the broker's 8 KiB, noise: stays uncompressed even over the 4 KiB threshold.
        proptest::collection::vec(any::<u8>(), 1..7_000),
        // Repetitive: compressed over the threshold when the producer compresses.
        (1..7_000usize, any::<u8>()).prop_map(|(len, byte)| vec![byte; len]),
    ]
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        body(),
        proptest::option::of("\\PC{1,12}".prop_filter("no `||`", |t| !t.contains("||"))),
        proptest::collection::vec("[^ \\p{C}]{1,10}", 0..3),
        // Lower-case first letter: reserved names are upper case.
        proptest::collection::vec(("[a-z][a-z0-9_]{0,8}", "\\PC{0,16}"), 0..3),
        any::<i32>(),
        proptest::option::weighted(0.1, "[A-Za-z0-9_@:.-]{1,40}"),
    )
        .prop_map(|(body, tags, keys, properties, flag, text_id)| Spec {
            body,
            tags,
            keys,
            properties,
            flag,
            text_id,
        })
}

fn delay() -> impl Strategy<Value = DelaySpec> {
    prop_oneof![
        (1..=3u32).prop_map(DelaySpec::Level),
        (50..400i64).prop_map(DelaySpec::AtInMs),
        (50..400u64).prop_map(DelaySpec::AfterMs),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let batch = (
        proptest::collection::vec(spec(), 1..=24),
        any::<bool>(),
        prop_oneof![Just(How::Plain), Just(How::Async)],
    )
        .prop_map(|(messages, is_compressing, how)| Case {
            messages,
            delay: None,
            is_compressing,
            how,
        });
    let single = (
        spec(),
        proptest::option::weighted(0.6, delay()),
        any::<bool>(),
        prop_oneof![
            Just(How::Plain),
            Just(How::Async),
            "[a-z]{1,6}".prop_map(How::Ordered)
        ],
    )
        .prop_map(|(message, delay, is_compressing, how)| Case {
            messages: vec![message],
            delay,
            is_compressing,
            how,
        });
    prop_oneof![3 => batch, 2 => single]
}

/// What every case uses: the cluster and clients, made once.
struct Fixture {
    compressing: Producer,
    plain: Producer,
    consumer: PullConsumer,
    admin: Admin,
    /// The IPv4 address this client's ids and born hosts carry.
    client_ip: String,
}

impl Fixture {
    async fn start(cluster: &LocalCluster) -> Fixture {
        let build = |compress_over_bytes| {
            Producer::builder()
                .namesrv(cluster.namesrv_addr())
                .group("roundtrip-producer")
                .compress_over_bytes(compress_over_bytes)
                .build()
        };
        let compressing = build(shardmq_client::DEFAULT_COMPRESS_OVER_BYTES)
            .await
            .expect("producer");
        let plain = build(0).await.expect("producer");
        let client_ip = compressing
            .client_id()
            .split('@')
            .next()
            .unwrap_or_default()
            .to_owned();
        Fixture {
            compressing,
            plain,
            consumer: PullConsumer::builder()
                .namesrv(cluster.namesrv_addr())
                .group("roundtrip-readers")
                .build()
                .await
                .expect("consumer"),
            admin: Admin::builder()
                .namesrv(cluster.namesrv_addr())
                .build()
                .await
                .expect("admin"),
            client_ip,
        }
    }
}

/// Sends `case` the way it asks; one result per message.
async fn send(fixture: &Fixture, case: &Case) -> shardmq_client::Result<Vec<SendResult>> {
    let producer = if case.is_compressing {
        &fixture.compressing
    } else {
        &fixture.plain
    };
    let mut messages: Vec<Message> = case.messages.iter().map(Spec::message).collect();
    if let Some(delay) = case.delay {
        let message = messages.pop().expect("one message");
        messages.push(match delay {
            DelaySpec::Level(level) => message.with_delay_level(level),
            DelaySpec::AtInMs(ms) => message.with_deliver_at_ms(shardmq_client::now_ms() + ms),
            DelaySpec::AfterMs(ms) => message.with_delay(Duration::from_millis(ms)),
        });
    }
    if messages.len() > 1 {
        let sent: BatchSendResult = match case.how {
            How::Async => producer.send_batch_async(messages).await?.await?,
            _ => producer.send_batch(messages).await?,
        };
        return Ok(sent.iter().collect());
    }
    let message = messages.pop().expect("one message");
    let sent = match &case.how {
        How::Plain => producer.send(message).await?,
        How::Async => producer.send_async(message).await?.await?,
        How::Ordered(key) => producer.send_ordered(message, key).await?,
    };
    Ok(vec![sent])
}

/// Every message of `queue` from `from` to its end now.
async fn read_from(
    consumer: &PullConsumer,
    queue: &MessageQueue,
    from: i64,
) -> Result<Vec<MessageExt>, TestCaseError> {
    let mut messages = Vec::new();
    let mut offset = from;
    loop {
        let pulled = consumer
            .pull(queue, offset, 32)
            .await
            .map_err(|e| TestCaseError::fail(format!("pull {queue} at {offset}: {e}")))?;
        if pulled.status != PullStatus::Found {
            return Ok(messages);
        }
        offset = pulled.next_begin_offset;
        messages.extend(pulled.messages);
    }
}

/// Checks that `received` is the message `spec` built, sent with id `id`, born at `born_ip`.
fn check_same(
    spec: &Spec,
    id: &MessageId,
    received: &MessageExt,
    born_ip: &str,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(&received.body[..], &spec.body[..], "body of {}", id);
    prop_assert!(!received.is_compressed(), "the consumer inflates the body");
    prop_assert_eq!(received.topic(), TOPIC);
    prop_assert_eq!(received.tags(), spec.tags.as_deref());
    let keys: Vec<&str> = spec.keys.iter().map(String::as_str).collect();
    prop_assert_eq!(received.keys(), keys);
    let expected_properties: Vec<(String, String)> = spec.message().properties().to_vec();
    let properties: Vec<(String, String)> = received
        .user_properties()
        .filter(|(name, _)| *name != "__CRC32#")
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    prop_assert_eq!(properties, expected_properties);
    prop_assert_eq!(received.msg_id(), id.to_string());
    prop_assert_eq!(received.flag, spec.flag);
    prop_assert_eq!(received.born_host.ip().to_string(), born_ip);
    prop_assert!(received.born_host.port() != 0);
    Ok(())
}

async fn check_case(fixture: &Fixture, case: Case) -> Result<(), TestCaseError> {
    let fail =
        |what: &str, error: shardmq_client::Error| TestCaseError::fail(format!("{what}: {error}"));
    // Where the queues end before the send: a delayed message is looked for after this.
    let mut ends = BTreeMap::new();
    if case.delay.is_some() {
        for queue in fixture
            .consumer
            .queues(TOPIC)
            .await
            .map_err(|e| fail("queues", e))?
        {
            let (_, end) = fixture
                .consumer
                .queue_offsets(&queue)
                .await
                .map_err(|e| fail("offsets", e))?;
            ends.insert(queue, end);
        }
    }
    let sent = send(fixture, &case).await.map_err(|e| fail("send", e))?;
    prop_assert_eq!(sent.len(), case.messages.len());
    let queue = sent[0].queue.clone();
    for (spec, result) in case.messages.iter().zip(&sent) {
        prop_assert_eq!(result.status, SendStatus::SendOk);
        prop_assert_eq!(&result.queue, &queue);
        match &spec.text_id {
            Some(text) => prop_assert_eq!(&result.msg_id, text),
            None => prop_assert_eq!(result.msg_id.to_string().len(), 32),
        }
    }

    if case.delay.is_some() {
        // Scheduled: no queue offset yet; it appears in its queue once due.
        prop_assert!(sent[0].is_scheduled());
        let id = sent[0].msg_id.to_string();
        let from = ends.get(&queue).copied().unwrap_or(0);
        let delivered = shardmq_tests::eventually_some(WAIT, "the delayed message", || async {
            let messages = read_from(&fixture.consumer, &queue, from).await.ok()?;
            messages.into_iter().find(|m| m.msg_id() == id)
        })
        .await;
        // A delayed message goes as a wire message: the broker writes the born host, the
        // connection's address as it sees it (loopback here).
        check_same(&case.messages[0], &sent[0].msg_id, &delivered, "127.0.0.1")?;
    } else {
        let first = sent[0].queue_offset;
        let received = read_from(&fixture.consumer, &queue, first).await?;
        prop_assert!(
            received.len() >= sent.len(),
            "{} of {} read back",
            received.len(),
            sent.len()
        );
        for (index, ((spec, result), message)) in
            case.messages.iter().zip(&sent).zip(&received).enumerate()
        {
            // In a run the producer writes its own address as the born host: the client id's.
            check_same(spec, &result.msg_id, message, &fixture.client_ip)?;
            prop_assert_eq!(result.queue_offset, first + index as i64);
            prop_assert_eq!(message.queue_id, queue.queue_id);
            prop_assert_eq!(message.queue_offset, result.queue_offset);
            prop_assert_eq!(message.broker_name(), queue.broker_name.as_str());
            // The physical offsets the client derived (across segment ends) are where the
            // records are.
            prop_assert_eq!(message.commit_log_offset, result.commit_log_offset());
            prop_assert_eq!(message.store_host, result.store_host());
        }
    }

    // The derived offset id is the broker's own: a query by it finds the record (the first and
    // the last of a batch; for a scheduled message, its scheduled copy).
    for result in [&sent[0], &sent[sent.len() - 1]] {
        let offset_id = result.offset_msg_id();
        let found = fixture
            .admin
            .query_by_any_id(&offset_id, 0, 0)
            .await
            .map_err(|e| fail("query by offset id", e))?
            .value;
        let id = result.msg_id.to_string();
        prop_assert!(
            found
                .iter()
                .any(|m| m.msg_id() == id && m.commit_log_offset == result.commit_log_offset()),
            "offset id {} finds {:?}",
            offset_id,
            found.iter().map(MessageExt::msg_id).collect::<Vec<_>>()
        );
    }
    Ok(())
}

#[test]
fn any_message_the_client_can_build_comes_back_as_sent() {
    let data = TempDir::new().expect("temp dir");
    let cluster = LocalCluster::start_with_broker_args(data.path(), BROKER_ARGS);
    cluster.create_topic(TOPIC, QUEUES);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let fixture = runtime.block_on(Fixture::start(&cluster));
    let mut runner = TestRunner::new(Config {
        cases: 40,
        failure_persistence: None,
        ..Config::default()
    });
    let outcome = runner.run(&case(), |case| runtime.block_on(check_case(&fixture, case)));
    runtime.block_on(async {
        fixture.compressing.shutdown().await;
        fixture.plain.shutdown().await;
        fixture.consumer.shutdown().await;
        fixture.admin.shutdown().await;
    });
    if let Err(error) = outcome {
        panic!("{error}");
    }
}

/// Runs of incompressible 6,000-byte bodies until the CommitLog has crossed several segment
/// ends: every record's derived physical offset is where the consumer finds it, and a run that
/// straddles a segment end was sent (the property test above may not draw one).
#[test]
fn runs_across_segment_ends_are_placed_where_the_client_says() {
    let data = TempDir::new().expect("temp dir");
    let cluster = LocalCluster::start_with_broker_args(data.path(), BROKER_ARGS);
    cluster.create_topic("Segments", 1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let producer = Producer::builder()
            .namesrv(cluster.namesrv_addr())
            .compress_over_bytes(0)
            .build()
            .await
            .expect("producer");
        let consumer = PullConsumer::builder()
            .namesrv(cluster.namesrv_addr())
            .group("segment-readers")
            .build()
            .await
            .expect("consumer");
        const SEGMENT_BYTES: i64 = 131_072;
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut straddled = 0;
        let mut results = Vec::new();
        for batch in 0..24 {
            let messages: Vec<Message> = (0..10)
                .map(|i| {
                    let body: Vec<u8> = (0..6_000)
                        .map(|_| {
                            state ^= state << 13;
                            state ^= state >> 7;
                            state ^= state << 17;
                            state as u8
                        })
                        .collect();
                    Message::new("Segments", body).with_keys([format!("b{batch}-{i}")])
                })
                .collect();
            let sent = producer.send_batch(messages).await.expect("send");
            let first = sent.commit_log_offset(0).unwrap();
            let last = sent.commit_log_offset(sent.len() - 1).unwrap();
            if first / SEGMENT_BYTES != last / SEGMENT_BYTES {
                straddled += 1;
            }
            results.push(sent);
        }
        assert!(
            straddled >= 5,
            "only {straddled} runs crossed a segment end"
        );
        let queue = results[0].queue.clone();
        let received = read_from(&consumer, &queue, 0)
            .await
            .unwrap_or_else(|error| panic!("read back: {error}"));
        let expected: Vec<(String, i64)> = results
            .iter()
            .flat_map(|sent| sent.iter())
            .map(|result| (result.msg_id.to_string(), result.commit_log_offset()))
            .collect();
        let actual: Vec<(String, i64)> = received
            .iter()
            .map(|message| (message.msg_id(), message.commit_log_offset))
            .collect();
        assert_eq!(actual, expected);
        producer.shutdown().await;
        consumer.shutdown().await;
    });
}
