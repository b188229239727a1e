//! RocketMQ's remoting protocol on the real broker's client port, spoken with the
//! `shardmq-remoting` codec over a plain socket: the three send codes, heartbeats, pulls with
//! their four offsets and long polling, consumer offsets, queue offsets, refusals of what is not
//! supported, and a native consumer reading what a remoting producer sent. (The compatibility
//! suite in `compat/` drives the same through RocketMQ's own client.)

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use shardmq_codec::decode_message;
use shardmq_remoting::codes::{pull_sys_flag, request, response};
use shardmq_remoting::{
    encode_batch_record, encode_properties, OffsetMessageId, RemotingCommand, SerializeType,
};
use shardmq_tests::{LocalCluster, RemotingClient};
use tempfile::TempDir;

const READ_TIMEOUT: Duration = RemotingClient::READ_TIMEOUT;
const TOPIC: &str = "Orders";
const GROUP: &str = "OrdersGroup";

fn properties(pairs: &[(&str, &str)]) -> String {
    let mut bytes = BytesMut::new();
    encode_properties(pairs.iter().copied(), &mut bytes).expect("encodes");
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn heartbeat() -> RemotingCommand {
    let body = format!(
        r#"{{"clientID":"127.0.0.1@remoting-test","producerDataSet":[{{"groupName":"P"}}],
        "consumerDataSet":[{{"groupName":"{GROUP}","consumeType":"CONSUME_PASSIVELY",
        "messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_FIRST_OFFSET","unitMode":false,
        "subscriptionDataSet":[{{"topic":"{TOPIC}","subString":"a || b","tagsSet":["a","b"],
        "codeSet":[],"subVersion":1,"expressionType":"TAG","classFilterMode":false}}]}}]}}"#
    );
    RemotingCommand::request(request::HEART_BEAT, 0).with_body(Bytes::from(body))
}

fn pull(queue_id: i32, offset: i64, sys_flag: i32, suspend_ms: i64) -> RemotingCommand {
    RemotingCommand::request(request::PULL_MESSAGE, 0)
        .with_ext("consumerGroup", GROUP)
        .with_ext("topic", TOPIC)
        .with_ext("queueId", queue_id.to_string())
        .with_ext("queueOffset", offset.to_string())
        .with_ext("maxMsgNums", "32")
        .with_ext("sysFlag", sys_flag.to_string())
        .with_ext("commitOffset", "0")
        .with_ext("suspendTimeoutMillis", suspend_ms.to_string())
        .with_ext("subVersion", "1")
}

fn ext_i64(command: &RemotingCommand, field: &str) -> i64 {
    command
        .ext_i64(field)
        .unwrap_or_else(|e| panic!("answer lacks {field}: {e}"))
}

#[test]
fn a_rocketmq_producer_and_consumer_are_served_by_the_broker_s_own_port() {
    let started_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let dir = TempDir::new().unwrap();
    let cluster = LocalCluster::start(dir.path());
    cluster.create_topic(TOPIC, 4);
    let broker = cluster.broker_addr();
    let mut client = RemotingClient::connect(&broker);
    assert_eq!(client.call(heartbeat()).code, response::SUCCESS);

    // SEND_MESSAGE (long names), JSON header.
    let first = client.call(
        RemotingCommand::request(request::SEND_MESSAGE, 0)
            .with_ext("producerGroup", "P")
            .with_ext("topic", TOPIC)
            .with_ext("defaultTopic", "TBW102")
            .with_ext("defaultTopicQueueNums", "4")
            .with_ext("queueId", "1")
            .with_ext("sysFlag", "0")
            .with_ext("bornTimestamp", "1700000000000")
            .with_ext("flag", "7")
            .with_ext(
                "properties",
                properties(&[
                    ("TAGS", "a"),
                    ("KEYS", "k1 k2"),
                    ("UNIQ_KEY", "AC11000100002A9F0000000000000001"),
                    ("WAIT", "true"),
                    ("color", "blue"),
                ]),
            )
            .with_body(Bytes::from_static(b"first body")),
    );
    assert_eq!(first.code, response::SUCCESS, "{:?}", first.remark);
    let msg_id = first.ext("msgId").expect("msgId").to_owned();
    assert_eq!(
        msg_id.len(),
        32,
        "an IPv4 offset message id is 32 hex characters"
    );
    let located = OffsetMessageId::decode(&msg_id).expect("a RocketMQ offset message id");
    assert_eq!(located.store_host.to_string(), broker);
    assert_eq!(ext_i64(&first, "queueId"), 1);
    assert_eq!(ext_i64(&first, "queueOffset"), 0);

    // SEND_MESSAGE_V2 (letters), binary header.
    let second = client.call(
        RemotingCommand::request(request::SEND_MESSAGE_V2, 0)
            .with_ext("a", "P")
            .with_ext("b", TOPIC)
            .with_ext("c", "TBW102")
            .with_ext("d", "4")
            .with_ext("e", "1")
            .with_ext("f", "0")
            .with_ext("g", "1700000000001")
            .with_ext("h", "0")
            .with_ext("i", properties(&[("TAGS", "b"), ("UNIQ_KEY", "U2")]))
            .with_body(Bytes::from_static(b"second body"))
            .with_serialize_type(SerializeType::RocketMq),
    );
    assert_eq!(second.code, response::SUCCESS, "{:?}", second.remark);
    assert_eq!(second.serialize_type, SerializeType::RocketMq);
    assert_eq!(ext_i64(&second, "queueOffset"), 1);

    // SEND_BATCH_MESSAGE: three messages of tags c, a, b.
    let mut batch = BytesMut::new();
    for (index, tag) in ["c", "a", "b"].iter().enumerate() {
        let unique = format!("B{index}");
        let props = properties(&[("TAGS", tag), ("UNIQ_KEY", &unique)]);
        let body = format!("batch body {index}");
        encode_batch_record(0, body.as_bytes(), props.as_bytes(), &mut batch).expect("encodes");
    }
    let batched = client.call(
        RemotingCommand::request(request::SEND_BATCH_MESSAGE, 0)
            .with_ext("a", "P")
            .with_ext("b", TOPIC)
            .with_ext("e", "1")
            .with_ext("f", "0")
            .with_ext("g", "1700000000002")
            .with_ext("m", "true")
            .with_body(batch.freeze()),
    );
    assert_eq!(batched.code, response::SUCCESS, "{:?}", batched.remark);
    assert_eq!(batched.ext("msgId").unwrap().split(',').count(), 3);
    assert_eq!(ext_i64(&batched, "queueOffset"), 2);

    // A pull without its own subscription filters by the heartbeat's (a || b): offsets 0, 1,
    // 3, 4 come back, 2 (tag c) does not.
    let pulled = client.call(pull(1, 0, pull_sys_flag::SUSPEND, 1000));
    assert_eq!(pulled.code, response::SUCCESS, "{:?}", pulled.remark);
    assert_eq!(ext_i64(&pulled, "nextBeginOffset"), 5);
    assert_eq!(ext_i64(&pulled, "minOffset"), 0);
    assert_eq!(ext_i64(&pulled, "maxOffset"), 5);
    assert_eq!(ext_i64(&pulled, "suggestWhichBrokerId"), 0);
    let mut records = Vec::new();
    let mut rest = &pulled.body[..];
    while !rest.is_empty() {
        let size = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        let view = decode_message(&rest[..size]).expect("a RocketMQ MessageExt record");
        records.push((
            view.queue_offset(),
            view.tags().map(str::to_owned),
            view.body().to_vec(),
            view.flag(),
        ));
        rest = &rest[size..];
    }
    let offsets: Vec<u64> = records.iter().map(|r| r.0).collect();
    assert_eq!(offsets, vec![0, 1, 3, 4]);
    assert_eq!(records[0].2, b"first body");
    assert_eq!(records[0].3, 7);
    assert_eq!(records[2].1.as_deref(), Some("a"));
    assert_eq!(records[3].2, b"batch body 2");

    // The pull's own subscription wins when its flag says so.
    let only_c =
        client.call(pull(1, 0, pull_sys_flag::SUBSCRIPTION, 0).with_ext("subscription", "c"));
    assert_eq!(only_c.code, response::SUCCESS);
    let view = decode_message(&only_c.body).expect("one record");
    assert_eq!(view.queue_offset(), 2);

    // Long polling: nothing past the end answers PULL_NOT_FOUND after the suspend time.
    let asked = Instant::now();
    let empty = client.call(pull(1, 5, pull_sys_flag::SUSPEND, 600));
    assert_eq!(empty.code, response::PULL_NOT_FOUND);
    assert!(
        asked.elapsed() >= Duration::from_millis(500),
        "the pull was held"
    );
    assert_eq!(ext_i64(&empty, "nextBeginOffset"), 5);
    // An offset past the end moves.
    let moved = client.call(pull(1, 50, 0, 0));
    assert_eq!(moved.code, response::PULL_OFFSET_MOVED);

    // Consumer offsets: none yet, then committed (oneway, as RocketMQ's clients send it).
    let query = || {
        RemotingCommand::request(request::QUERY_CONSUMER_OFFSET, 0)
            .with_ext("consumerGroup", GROUP)
            .with_ext("topic", TOPIC)
            .with_ext("queueId", "1")
    };
    assert_eq!(client.call(query()).code, response::QUERY_NOT_FOUND);
    client.send(
        &RemotingCommand::request(request::UPDATE_CONSUMER_OFFSET, 999)
            .with_ext("consumerGroup", GROUP)
            .with_ext("topic", TOPIC)
            .with_ext("queueId", "1")
            .with_ext("commitOffset", "4")
            .with_oneway(),
    );
    let deadline = Instant::now() + READ_TIMEOUT;
    loop {
        let answer = client.call(query());
        if answer.code == response::SUCCESS {
            assert_eq!(ext_i64(&answer, "offset"), 4);
            break;
        }
        assert!(Instant::now() < deadline, "the oneway commit never landed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let max = client.call(
        RemotingCommand::request(request::GET_MAX_OFFSET, 0)
            .with_ext("topic", TOPIC)
            .with_ext("queueId", "1"),
    );
    assert_eq!(ext_i64(&max, "offset"), 5);
    let min = client.call(
        RemotingCommand::request(request::GET_MIN_OFFSET, 0)
            .with_ext("topic", TOPIC)
            .with_ext("queueId", "1"),
    );
    assert_eq!(ext_i64(&min, "offset"), 0);
    let members = client.call(
        RemotingCommand::request(request::GET_CONSUMER_LIST_BY_GROUP, 0)
            .with_ext("consumerGroup", GROUP),
    );
    let members: serde_json::Value = serde_json::from_slice(&members.body).expect("json");
    assert_eq!(
        members["consumerIdList"],
        serde_json::json!(["127.0.0.1@remoting-test"])
    );

    // The oldest message's store time: queue 1's first message was stored during this test;
    // an empty queue answers -1.
    let mut earliest = |queue_id: &str| {
        let answer = client.call(
            RemotingCommand::request(request::GET_EARLIEST_MSG_STORETIME, 0)
                .with_ext("topic", TOPIC)
                .with_ext("queueId", queue_id),
        );
        assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
        ext_i64(&answer, "timestamp")
    };
    let stored_at = earliest("1");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        (started_ms..=now_ms).contains(&stored_at),
        "{stored_at} outside [{started_ms}, {now_ms}]"
    );
    assert_eq!(earliest("3"), -1);

    // What is not supported says so, and the connection goes on.
    let unsupported = client.call(RemotingCommand::request(
        request::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        0,
    ));
    assert_eq!(unsupported.code, response::REQUEST_CODE_NOT_SUPPORTED);
    assert!(unsupported.remark.unwrap_or_default().contains("200"));

    // Queries: by key, by unique id, and by the offset of an offset message id.
    let bodies_of = |answer: &RemotingCommand| -> Vec<Vec<u8>> {
        assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
        let mut bodies = Vec::new();
        let mut rest = &answer.body[..];
        while !rest.is_empty() {
            let size = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
            bodies.push(decode_message(&rest[..size]).unwrap().body().to_vec());
            rest = &rest[size..];
        }
        bodies
    };
    let query = |key: &str| {
        RemotingCommand::request(request::QUERY_MESSAGE, 0)
            .with_ext("topic", TOPIC)
            .with_ext("key", key)
            .with_ext("maxNum", "32")
            .with_ext("beginTimestamp", "0")
            .with_ext("endTimestamp", i64::MAX.to_string())
    };
    assert_eq!(
        bodies_of(&client.call(query("k2"))),
        vec![b"first body".to_vec()]
    );
    assert_eq!(
        bodies_of(&client.call(query("U2").with_ext("_UNIQUE_KEY_QUERY", "true"))),
        vec![b"second body".to_vec()]
    );
    assert_eq!(
        client.call(query("no-such-key")).code,
        response::QUERY_NOT_FOUND
    );
    let viewed = client.call(
        RemotingCommand::request(request::VIEW_MESSAGE_BY_ID, 0)
            .with_ext("offset", located.physical_offset.to_string()),
    );
    assert_eq!(bodies_of(&viewed), vec![b"first body".to_vec()]);

    // Topic creation, as admin tools send it: the name server routes the new topic.
    let created = client.call(
        RemotingCommand::request(request::UPDATE_AND_CREATE_TOPIC, 0)
            .with_ext("topic", "Created")
            .with_ext("readQueueNums", "3")
            .with_ext("writeQueueNums", "3")
            .with_ext("perm", "6"),
    );
    assert_eq!(created.code, response::SUCCESS, "{:?}", created.remark);
    let mut names = RemotingClient::connect(&cluster.namesrv_addr());
    let deadline = Instant::now() + READ_TIMEOUT;
    loop {
        let route = names.call(
            RemotingCommand::request(request::GET_ROUTEINFO_BY_TOPIC, 0)
                .with_ext("topic", "Created"),
        );
        if route.code == response::SUCCESS {
            let route = shardmq_remoting::decode_route_body(&route.body).unwrap();
            assert_eq!(route.queue_datas[0].write_queue_nums, 3);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the created topic was never routed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let half = client.call(
        RemotingCommand::request(request::SEND_MESSAGE, 0)
            .with_ext("producerGroup", "P")
            .with_ext("topic", TOPIC)
            .with_ext("queueId", "0")
            .with_ext("sysFlag", "4")
            .with_ext("properties", properties(&[("TRAN_MSG", "true")]))
            .with_body(Bytes::from_static(b"half")),
    );
    // A half message must carry its unique id (commits are de-duplicated by it).
    assert_eq!(half.code, response::MESSAGE_ILLEGAL);
    assert!(half.remark.unwrap_or_default().contains("unique_id"));
    let missing_topic = client.call(
        RemotingCommand::request(request::SEND_MESSAGE, 0)
            .with_ext("producerGroup", "P")
            .with_ext("topic", "NoSuchTopic")
            .with_ext("queueId", "0")
            .with_body(Bytes::from_static(b"x")),
    );
    assert_eq!(missing_topic.code, response::TOPIC_NOT_EXIST);
    let reserved = client.call(
        RemotingCommand::request(request::SEND_MESSAGE, 0)
            .with_ext("producerGroup", "P")
            .with_ext("topic", TOPIC)
            .with_ext("queueId", "0")
            .with_ext("properties", properties(&[("REAL_TOPIC", "elsewhere")]))
            .with_body(Bytes::from_static(b"x")),
    );
    assert_eq!(reserved.code, response::MESSAGE_ILLEGAL);
    assert!(reserved.remark.unwrap_or_default().contains("REAL_TOPIC"));

    // A native consumer reads what the remoting producer sent, properties and all.
    let output = shardmq_tests::run_cli(
        &cluster.namesrv_addr(),
        &[
            "--json", "consume", TOPIC, "--group", "native", "--from", "first", "--count", "5",
        ],
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    for body in ["first body", "second body", "batch body 0", "batch body 2"] {
        assert!(text.contains(body), "{body} missing from {text}");
    }
    assert!(
        text.contains("blue"),
        "the user property reaches the native consumer: {text}"
    );
}

#[test]
fn malformed_remoting_frames_close_the_broker_connection_and_store_nothing() {
    let dir = TempDir::new().unwrap();
    let cluster = LocalCluster::start(dir.path());
    cluster.create_topic(TOPIC, 1);
    let broker = cluster.broker_addr();

    let mut oversized = RemotingClient::connect(&broker);
    let mut frame = Vec::new();
    frame.extend_from_slice(&(1u32 << 30).to_be_bytes());
    frame.extend_from_slice(&[0, 0, 0, 2]);
    frame.extend_from_slice(b"{}");
    oversized.send_bytes(&frame);
    assert!(oversized.receive().is_none(), "closed after a lying length");

    let mut garbled = RemotingClient::connect(&broker);
    let header = br#"{"code":10,"extFields":{"topic":5}}"#;
    let mut frame = Vec::new();
    frame.extend_from_slice(&((4 + header.len() + 4) as u32).to_be_bytes());
    frame.extend_from_slice(&(header.len() as u32).to_be_bytes());
    frame.extend_from_slice(header);
    frame.extend_from_slice(b"body");
    garbled.send_bytes(&frame);
    assert!(
        garbled.receive().is_none(),
        "closed after an unreadable header"
    );

    // A batch whose record lies about its length is refused whole.
    let mut client = RemotingClient::connect(&broker);
    let mut batch = BytesMut::new();
    encode_batch_record(0, b"good", b"", &mut batch).unwrap();
    let mut lying = batch.to_vec();
    lying.extend_from_slice(&1000u32.to_be_bytes());
    lying.extend_from_slice(&[0; 12]);
    let refused = client.call(
        RemotingCommand::request(request::SEND_BATCH_MESSAGE, 0)
            .with_ext("a", "P")
            .with_ext("b", TOPIC)
            .with_ext("e", "0")
            .with_body(Bytes::from(lying)),
    );
    assert_eq!(
        refused.code,
        response::MESSAGE_ILLEGAL,
        "{:?}",
        refused.remark
    );
    let max = client.call(
        RemotingCommand::request(request::GET_MAX_OFFSET, 0)
            .with_ext("topic", TOPIC)
            .with_ext("queueId", "0"),
    );
    assert_eq!(
        ext_i64(&max, "offset"),
        0,
        "nothing of the refused batch is stored"
    );

    // A oneway request gets no answer: the next answer is the next request's.
    client.send(&RemotingCommand::request(request::VIEW_MESSAGE_BY_ID, 77).with_oneway());
    let answer = client.call(
        RemotingCommand::request(request::GET_MIN_OFFSET, 0)
            .with_ext("topic", TOPIC)
            .with_ext("queueId", "0"),
    );
    assert_eq!(answer.code, response::SUCCESS);
}

/// Pulls every record of `queue_id` from offset 0 (waiting up to 5 s for one), returning
/// (queue offset, CommitLog offset the record carries, tags, body).
fn pull_all(
    client: &mut RemotingClient,
    topic: &str,
    group: &str,
    queue_id: i32,
) -> Vec<(u64, i64, Option<String>, Vec<u8>)> {
    pull_all_records(client, topic, group, queue_id)
        .iter()
        .map(|record| {
            let located = i64::from_be_bytes(record[28..36].try_into().unwrap());
            // The record's own CRC does not cover the located offset; read it unchecked.
            let view = shardmq_codec::RecordView::parse_unchecked(record).expect("a record");
            (
                view.queue_offset(),
                located,
                view.tags().map(str::to_owned),
                view.body().to_vec(),
            )
        })
        .collect()
}

/// The stored records of `queue_id` from offset 0 (waiting up to 5 s for one), as served.
fn pull_all_records(
    client: &mut RemotingClient,
    topic: &str,
    group: &str,
    queue_id: i32,
) -> Vec<Vec<u8>> {
    let answer = client.call(
        RemotingCommand::request(request::PULL_MESSAGE, 0)
            .with_ext("consumerGroup", group)
            .with_ext("topic", topic)
            .with_ext("queueId", queue_id.to_string())
            .with_ext("queueOffset", "0")
            .with_ext("maxMsgNums", "32")
            .with_ext("sysFlag", pull_sys_flag::SUSPEND.to_string())
            .with_ext("commitOffset", "0")
            .with_ext("suspendTimeoutMillis", "5000"),
    );
    if answer.code != response::SUCCESS {
        assert_eq!(answer.code, response::PULL_NOT_FOUND, "{:?}", answer.remark);
        return Vec::new();
    }
    let mut records = Vec::new();
    let mut rest = &answer.body[..];
    while !rest.is_empty() {
        let size = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        records.push(rest[..size].to_vec());
        rest = &rest[size..];
    }
    records
}

#[test]
fn a_rocketmq_consumer_s_send_back_reaches_the_retry_topic_from_any_storage_shard() {
    let dir = TempDir::new().unwrap();
    let cluster = LocalCluster::start_with_broker_args(
        dir.path(),
        &["--storage-cores", "0,1", "--network-cores", "1"],
    );
    cluster.create_topic(TOPIC, 2);
    let broker = cluster.broker_addr();
    let mut client = RemotingClient::connect(&broker);
    assert_eq!(client.call(heartbeat()).code, response::SUCCESS);
    // One message in each queue: the two queues live on different storage shards.
    let mut sent = Vec::new();
    for queue_id in 0..2 {
        let answer = client.call(
            RemotingCommand::request(request::SEND_MESSAGE, 0)
                .with_ext("producerGroup", "P")
                .with_ext("topic", TOPIC)
                .with_ext("queueId", queue_id.to_string())
                .with_ext("properties", properties(&[("TAGS", "a")]))
                .with_body(Bytes::from(format!("body of queue {queue_id}"))),
        );
        assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
        sent.push(answer.ext("msgId").unwrap().to_owned());
    }
    for queue_id in 0..2 {
        let records = pull_all(&mut client, TOPIC, GROUP, queue_id);
        assert_eq!(records.len(), 1);
        let (_, located, _, _) = &records[0];
        // The offset a RocketMQ client reads names the record exactly: its offset message id
        // (which the client computes from it) is the one the send answered with.
        let id = OffsetMessageId::new(broker.parse().unwrap(), *located).encode();
        assert_eq!(id, sent[queue_id as usize]);
        let back = client.call(
            RemotingCommand::request(request::CONSUMER_SEND_MSG_BACK, 0)
                .with_ext("offset", located.to_string())
                .with_ext("group", GROUP)
                .with_ext("delayLevel", "-1")
                .with_ext("originMsgId", id)
                .with_ext("originTopic", TOPIC)
                .with_ext("maxReconsumeTimes", "16"),
        );
        assert_eq!(back.code, response::SUCCESS, "{:?}", back.remark);
    }
    // The located offset also finds the record of a shard other than 0 by VIEW_MESSAGE_BY_ID.
    let (_, located, _, _) = &pull_all(&mut client, TOPIC, GROUP, 1)[0];
    let viewed = client.call(
        RemotingCommand::request(request::VIEW_MESSAGE_BY_ID, 0)
            .with_ext("offset", located.to_string()),
    );
    assert_eq!(viewed.code, response::SUCCESS, "{:?}", viewed.remark);
    let view = shardmq_codec::RecordView::parse_unchecked(&viewed.body).unwrap();
    assert_eq!(view.body(), b"body of queue 1");
    // Both went straight to the dead letters (delay level below 0), each once.
    let dead_letters = format!("%DLQ%{GROUP}");
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut bodies: Vec<Vec<u8>> = Vec::new();
    while bodies.len() < 2 {
        assert!(Instant::now() < deadline, "the dead letters never arrived");
        bodies = (0..1)
            .flat_map(|queue_id| {
                let max = client.call(
                    RemotingCommand::request(request::GET_MAX_OFFSET, 0)
                        .with_ext("topic", &dead_letters)
                        .with_ext("queueId", queue_id.to_string()),
                );
                if max.code == response::SUCCESS && ext_i64(&max, "offset") > 0 {
                    pull_all(&mut client, &dead_letters, "dlq-reader", queue_id)
                } else {
                    Vec::new()
                }
            })
            .map(|record| record.3)
            .collect();
    }
    bodies.sort();
    assert_eq!(
        bodies,
        vec![b"body of queue 0".to_vec(), b"body of queue 1".to_vec()]
    );

    // A send-back naming a storage shard the broker does not have is refused.
    let bad = client.call(
        RemotingCommand::request(request::CONSUMER_SEND_MSG_BACK, 0)
            .with_ext("offset", ((9u64 << 56) | 1).to_string())
            .with_ext("group", GROUP)
            .with_ext("delayLevel", "0")
            .with_ext("originMsgId", "00"),
    );
    assert_eq!(bad.code, response::MESSAGE_ILLEGAL, "{:?}", bad.remark);
}

/// When its CONSUMER_SEND_MSG_BACK fails, a RocketMQ consumer sends the message to
/// `%RETRY%<group>` itself, with RETRY_TOPIC, ORIGIN_MESSAGE_ID, RECONSUME_TIME (one above its
/// deliveries), MAX_RECONSUME_TIMES and DELAY set: the broker stores it as its own send-back
/// would, through the delay level to the retry topic, or to the dead letters once the
/// redeliveries are used up. Without RETRY_TOPIC a send to a retry topic is refused.
#[test]
fn a_rocketmq_consumer_s_own_retry_send_is_stored_as_a_send_back() {
    let dir = TempDir::new().unwrap();
    let cluster = LocalCluster::start_with_broker_args(
        dir.path(),
        &["--delay-levels", "100ms 100ms 100ms 100ms 100ms"],
    );
    cluster.create_topic(TOPIC, 1);
    let mut client = RemotingClient::connect(&cluster.broker_addr());
    let retry_topic = format!("%RETRY%{GROUP}");
    let retry_send = |reconsume_time: &str, body: &'static str| {
        RemotingCommand::request(request::SEND_MESSAGE_V2, 0)
            .with_ext("a", "CID_RMQ_SYS")
            .with_ext("b", &retry_topic)
            .with_ext("e", "0")
            .with_ext("f", "0")
            .with_ext("g", "1700000000000")
            .with_ext("h", "0")
            .with_ext(
                "i",
                properties(&[
                    ("TAGS", "t"),
                    ("UNIQ_KEY", body),
                    ("RETRY_TOPIC", TOPIC),
                    ("ORIGIN_MESSAGE_ID", "ORIGIN"),
                    ("RECONSUME_TIME", reconsume_time),
                    ("MAX_RECONSUME_TIMES", "2"),
                    ("DELAY", "3"),
                    ("color", "blue"),
                ]),
            )
            .with_body(Bytes::from_static(body.as_bytes()))
            .with_serialize_type(SerializeType::RocketMq)
    };
    // First failed delivery (RECONSUME_TIME 1): to the retry topic after delay level 3.
    let answer = client.call(retry_send("1", "retried"));
    assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
    assert_eq!(answer.ext("msgId").map(str::len), Some(32));
    // Past MAX_RECONSUME_TIMES (two deliveries already retried): to the dead letters.
    let answer = client.call(retry_send("3", "dead"));
    assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);

    let deadline = Instant::now() + READ_TIMEOUT;
    let read = |client: &mut RemotingClient, topic: &str| loop {
        let records = pull_all_records(client, topic, "retry-reader", 0);
        if !records.is_empty() {
            return records;
        }
        assert!(Instant::now() < deadline, "nothing arrived in {topic}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let retried = read(&mut client, &retry_topic);
    let view = shardmq_codec::RecordView::parse_unchecked(&retried[0]).unwrap();
    assert_eq!(view.body(), b"retried");
    assert_eq!(view.reconsume_times(), 1);
    assert_eq!(view.property("RETRY_TOPIC"), Some(TOPIC));
    assert_eq!(view.property("ORIGIN_MESSAGE_ID"), Some("ORIGIN"));
    assert_eq!(view.property("RECONSUME_TIME"), Some("1"));
    assert_eq!(view.property("color"), Some("blue"));
    assert_eq!(view.tags(), Some("t"));
    let dead = read(&mut client, &format!("%DLQ%{GROUP}"));
    let view = shardmq_codec::RecordView::parse_unchecked(&dead[0]).unwrap();
    assert_eq!(view.body(), b"dead");
    assert_eq!(view.reconsume_times(), 3);

    // A send to a retry topic that is not a retry is refused, and nothing is stored.
    let plain = client.call(
        RemotingCommand::request(request::SEND_MESSAGE, 0)
            .with_ext("producerGroup", "P")
            .with_ext("topic", &retry_topic)
            .with_ext("properties", properties(&[("TAGS", "x")]))
            .with_body(Bytes::from_static(b"not a retry")),
    );
    assert_eq!(plain.code, response::NO_PERMISSION, "{:?}", plain.remark);
    assert!(plain.remark.unwrap_or_default().contains("RETRY_TOPIC"));
    assert_eq!(
        pull_all_records(&mut client, &retry_topic, "retry-reader-2", 0).len(),
        1
    );
}

#[test]
fn an_orderly_rocketmq_consumer_locks_queues_one_client_at_a_time() {
    let dir = TempDir::new().unwrap();
    let cluster = LocalCluster::start(dir.path());
    cluster.create_topic(TOPIC, 2);
    let broker = cluster.broker_addr();
    let lock = |client_id: &str, queues: &[i32]| {
        let set: Vec<String> = queues
            .iter()
            .map(|q| format!(r#"{{"topic":"{TOPIC}","brokerName":"broker-a","queueId":{q}}}"#))
            .collect();
        RemotingCommand::request(request::LOCK_BATCH_MQ, 0).with_body(Bytes::from(format!(
            r#"{{"consumerGroup":"{GROUP}","clientId":"{client_id}","onlyThisBroker":false,"mqSet":[{}]}}"#,
            set.join(",")
        )))
    };
    let locked = |answer: &RemotingCommand| -> Vec<i64> {
        let body: serde_json::Value = serde_json::from_slice(&answer.body).expect("json");
        let mut ids: Vec<i64> = body["lockOKMQSet"]
            .as_array()
            .expect("a lock set")
            .iter()
            .map(|queue| {
                assert_eq!(queue["brokerName"], "broker-a");
                queue["queueId"].as_i64().unwrap()
            })
            .collect();
        ids.sort_unstable();
        ids
    };
    let mut first = RemotingClient::connect(&broker);
    let mut second = RemotingClient::connect(&broker);
    let answer = first.call(lock("client-1", &[0]));
    assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
    assert_eq!(locked(&answer), vec![0]);
    assert_eq!(locked(&second.call(lock("client-2", &[0, 1]))), vec![1]);
    let mut unlock = lock("client-1", &[0]);
    unlock.code = request::UNLOCK_BATCH_MQ;
    assert_eq!(first.call(unlock).code, response::SUCCESS);
    assert_eq!(locked(&second.call(lock("client-2", &[0, 1]))), vec![0, 1]);
}

#[test]
fn a_rocketmq_producer_s_new_topic_is_created_through_the_default_topic_route() {
    let dir = TempDir::new().unwrap();
    let cluster = LocalCluster::start_with_broker_args(dir.path(), &["--auto-create-topics"]);
    let namesrv = cluster.namesrv_addr();
    let broker = cluster.broker_addr();
    let mut names = RemotingClient::connect(&namesrv);
    let route_of = |topic: &str| {
        RemotingCommand::request(request::GET_ROUTEINFO_BY_TOPIC, 0).with_ext("topic", topic)
    };
    // A broker that creates topics on first send registers RocketMQ's default topic.
    let deadline = Instant::now() + READ_TIMEOUT;
    let default_route = loop {
        let answer = names.call(route_of("TBW102"));
        if answer.code == response::SUCCESS {
            break shardmq_remoting::decode_route_body(&answer.body).expect("route");
        }
        assert!(Instant::now() < deadline, "TBW102 never routed");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        default_route.broker_datas[0].broker_addrs.get(&0),
        Some(&broker)
    );
    assert_eq!(default_route.queue_datas[0].perm, 7);
    assert_eq!(
        names.call(route_of("Fresh")).code,
        response::TOPIC_NOT_EXIST
    );

    // The producer sends there, naming its own topic: the broker creates it.
    let mut client = RemotingClient::connect(&broker);
    let sent = client.call(
        RemotingCommand::request(request::SEND_MESSAGE, 0)
            .with_ext("producerGroup", "P")
            .with_ext("topic", "Fresh")
            .with_ext("defaultTopic", "TBW102")
            .with_ext("defaultTopicQueueNums", "4")
            .with_ext("queueId", "0")
            .with_body(Bytes::from_static(b"first of a new topic")),
    );
    assert_eq!(sent.code, response::SUCCESS, "{:?}", sent.remark);
    let deadline = Instant::now() + READ_TIMEOUT;
    while names.call(route_of("Fresh")).code != response::SUCCESS {
        assert!(Instant::now() < deadline, "the new topic was never routed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_rocketmq_transaction_commits_rolls_back_and_answers_the_broker_s_check_back() {
    const TX_GROUP: &str = "TxGroup";
    let dir = TempDir::new().unwrap();
    let cluster = LocalCluster::start_with_broker_args(
        dir.path(),
        &[
            "--transaction-timeout-ms",
            "500",
            "--transaction-check-interval-ms",
            "200",
        ],
    );
    cluster.create_topic(TOPIC, 1);
    let broker = cluster.broker_addr();
    let mut producer = RemotingClient::connect(&broker);
    let heartbeat = RemotingCommand::request(request::HEART_BEAT, 0).with_body(Bytes::from(
        format!(r#"{{"clientID":"127.0.0.1@tx","producerDataSet":[{{"groupName":"{TX_GROUP}"}}],"consumerDataSet":[]}}"#),
    ));
    assert_eq!(producer.call(heartbeat).code, response::SUCCESS);
    let half = |producer: &mut RemotingClient, unique: &str| {
        let answer = producer.call(
            RemotingCommand::request(request::SEND_MESSAGE, 0)
                .with_ext("producerGroup", TX_GROUP)
                .with_ext("topic", TOPIC)
                .with_ext("queueId", "0")
                .with_ext("sysFlag", "4")
                .with_ext(
                    "properties",
                    properties(&[
                        ("TRAN_MSG", "true"),
                        ("PGROUP", TX_GROUP),
                        ("UNIQ_KEY", unique),
                    ]),
                )
                .with_body(Bytes::from(format!("body of {unique}"))),
        );
        assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
        assert_eq!(answer.ext("transactionId"), Some(unique));
        let located = OffsetMessageId::decode(answer.ext("msgId").unwrap())
            .unwrap()
            .physical_offset;
        (ext_i64(&answer, "queueOffset"), located)
    };
    let end = |queue_offset: i64, located: i64, unique: &str, resolution: i32, from_check: bool| {
        RemotingCommand::request(request::END_TRANSACTION, 0)
            .with_ext("producerGroup", TX_GROUP)
            .with_ext("tranStateTableOffset", queue_offset.to_string())
            .with_ext("commitLogOffset", located.to_string())
            .with_ext("commitOrRollback", resolution.to_string())
            .with_ext("msgId", unique)
            .with_ext("fromTransactionCheck", from_check.to_string())
            .with_oneway()
    };
    let max_offset = |client: &mut RemotingClient| {
        ext_i64(
            &client.call(
                RemotingCommand::request(request::GET_MAX_OFFSET, 0)
                    .with_ext("topic", TOPIC)
                    .with_ext("queueId", "0"),
            ),
            "offset",
        )
    };
    let wait_for_max = |client: &mut RemotingClient, want: i64| {
        let deadline = Instant::now() + READ_TIMEOUT;
        while max_offset(client) != want {
            assert!(
                Instant::now() < deadline,
                "the real queue never reached {want}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    // Committed by the producer: the message reaches its real queue.
    let (offset, located) = half(&mut producer, "TX-COMMIT");
    assert_eq!(
        max_offset(&mut producer),
        0,
        "a half message is not visible"
    );
    producer.send(&end(offset, located, "TX-COMMIT", 8, false));
    wait_for_max(&mut producer, 1);

    // Rolled back by the producer: nothing more arrives.
    let (offset, located) = half(&mut producer, "TX-ROLLBACK");
    producer.send(&end(offset, located, "TX-ROLLBACK", 12, false));

    // Left unknown: the broker checks back with CHECK_TRANSACTION_STATE, oneway, carrying the
    // half message under its real topic; the producer's END_TRANSACTION from the check commits.
    let (offset, located) = half(&mut producer, "TX-CHECKED");
    producer.send(&end(offset, located, "TX-CHECKED", 0, false));
    let check = loop {
        let pushed = producer
            .receive()
            .expect("a check-back before the connection closed");
        if pushed.code == request::CHECK_TRANSACTION_STATE {
            break pushed;
        }
    };
    assert!(check.is_oneway() && !check.is_response());
    assert_eq!(ext_i64(&check, "tranStateTableOffset"), offset);
    assert_eq!(ext_i64(&check, "commitLogOffset"), located);
    assert_eq!(check.ext("transactionId"), Some("TX-CHECKED"));
    assert_eq!(check.ext("topic"), Some(TOPIC));
    // The record is rewritten for the check (RocketMQ's clients check no CRC): read unchecked.
    let checked = shardmq_codec::RecordView::parse_unchecked(&check.body)
        .expect("the half message as a record");
    assert_eq!(checked.topic(), TOPIC);
    assert_eq!(checked.body(), b"body of TX-CHECKED");
    assert_eq!(checked.property("PGROUP"), Some(TX_GROUP));
    producer.send(&end(offset, located, "TX-CHECKED", 8, true));
    wait_for_max(&mut producer, 2);

    let pulled = producer.call(pull(0, 0, 0, 0).with_ext("subscription", "*"));
    let mut bodies = Vec::new();
    let mut rest = &pulled.body[..];
    while !rest.is_empty() {
        let size = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        bodies.push(decode_message(&rest[..size]).unwrap().body().to_vec());
        rest = &rest[size..];
    }
    assert_eq!(
        bodies,
        vec![
            b"body of TX-COMMIT".to_vec(),
            b"body of TX-CHECKED".to_vec()
        ]
    );
}
