//! SQL92 property filters (docs/sql-filter.md) against a real namesrv and broker: the broker
//! evaluates a consumer's expression on each stored message's properties at pull time, sends
//! only the matches and moves the consumer's offset past the rest; push consumers and the CLI
//! subscribe with one; a malformed expression is refused with its position (by the client
//! before it subscribes, and by the broker for a pull that carries one anyway); a broker run
//! without `--enable-property-filter` refuses SQL92 pulls and says why.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shardmq_client::{
    ConsumeResult, Error, Message, Producer, PullConsumer, PullOptions, PullStatus, PushConsumer,
    TagExpression,
};
use shardmq_remoting::codes::{request, response};
use shardmq_remoting::RemotingCommand;
use shardmq_schema::wire;
use shardmq_tests::{run_cli, LocalCluster, TestClient};
use tempfile::TempDir;

const TOPIC: &str = "SqlTopic";
const MESSAGES: usize = 40;

/// A cluster whose broker filters by SQL92 (or not), with [`TOPIC`] on one queue holding
/// [`MESSAGES`] messages: message i has tag `odd`/`even`, property `a` = i, property `region`
/// `eu` for i.is_multiple_of(4) and `us` otherwise; every tenth one has no `a` at all.
async fn cluster_with_messages(enable: bool) -> (LocalCluster, TempDir) {
    let data = TempDir::new().expect("temp dir");
    let args: &[&str] = if enable {
        &["--enable-property-filter"]
    } else {
        &[]
    };
    let cluster = LocalCluster::start_with_broker_args(data.path(), args);
    cluster.create_topic(TOPIC, 1);
    let producer = Producer::builder()
        .namesrv(cluster.namesrv_addr())
        .group("sql-producer")
        .build()
        .await
        .expect("producer");
    let batch: Vec<Message> = (0..MESSAGES).map(message).collect();
    producer.send_batch(batch).await.expect("batch sent");
    producer.shutdown().await;
    (cluster, data)
}

fn message(i: usize) -> Message {
    let mut message = Message::new(TOPIC, format!("message {i}"))
        .with_tags(if i % 2 == 1 { "odd" } else { "even" })
        .with_property("region", if i.is_multiple_of(4) { "eu" } else { "us" })
        .with_property("index", i.to_string());
    if i % 10 != 7 {
        message = message.with_property("a", i.to_string());
    }
    message
}

/// The indexes of the messages (by their `index` property) `expression` lets through, pulled
/// from offset 0 in pulls of 8; and the offset the last pull says to pull from next.
async fn pull_sql(consumer: &PullConsumer, expression: &str) -> (BTreeSet<usize>, i64) {
    let queue = consumer.queues(TOPIC).await.expect("queues")[0].clone();
    let options = PullOptions {
        max_messages: 8,
        tags: TagExpression::sql(expression).expect("compiles"),
        ..PullOptions::default()
    };
    let (mut matched, mut offset) = (BTreeSet::new(), 0);
    loop {
        let result = consumer
            .pull_with(&queue, offset, &options)
            .await
            .expect("pull");
        offset = result.next_begin_offset;
        matched.extend(
            result
                .messages
                .iter()
                .map(|m| m.property("index").unwrap().parse::<usize>().unwrap()),
        );
        if result.status == PullStatus::NoNewMessage || offset >= MESSAGES as i64 {
            return (matched, offset);
        }
    }
}

fn expected(wanted: impl Fn(usize) -> bool) -> BTreeSet<usize> {
    (0..MESSAGES).filter(|&i| wanted(i)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_sends_only_the_messages_an_expression_matches() {
    let (cluster, _data) = cluster_with_messages(true).await;
    let consumer = PullConsumer::builder()
        .namesrv(cluster.namesrv_addr())
        .group("sql-readers")
        .build()
        .await
        .expect("pull consumer");

    let has_a = |i: usize| i % 10 != 7;
    for (expression, wanted) in [
        (
            "a BETWEEN 3 AND 20 AND region = 'eu'",
            expected(|i| has_a(i) && (3..=20).contains(&i) && i.is_multiple_of(4)),
        ),
        // Tags are a property too; a message without `a` never matches a comparison with it.
        (
            "TAGS = 'odd' AND a > 30",
            expected(|i| has_a(i) && i % 2 == 1 && i > 30),
        ),
        ("a IS NULL", expected(|i| !has_a(i))),
        (
            "region IN ('eu') OR NOT (a < 35)",
            expected(|i| i.is_multiple_of(4) || (has_a(i) && i >= 35)),
        ),
        ("a > 1000", BTreeSet::new()),
    ] {
        let (matched, next) = pull_sql(&consumer, expression).await;
        assert_eq!(matched, wanted, "{expression}");
        assert_eq!(
            next, MESSAGES as i64,
            "{expression}: the consumer's offset moves past what does not match"
        );
    }

    // A malformed expression: the client refuses it before anything is sent, naming where.
    match TagExpression::sql("a BETWEEN 3 AND") {
        Err(Error::InvalidArgument(message)) => assert!(message.contains("position"), "{message}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // A pull that carries one anyway is refused by the broker, which names the position too.
    let answer = raw_sql_pull(&cluster, "a > AND");
    assert_eq!(answer.0, wire::Status::INVALID_TAG_EXPRESSION);
    assert!(answer.1.contains("position"), "{}", answer.1);
    consumer.shutdown().await;

    // A RocketMQ client checks its SQL92 subscription first (CHECK_CLIENT_CONFIG): accepted
    // when it compiles, refused with the position when it does not, and a body that is not
    // the check's JSON is refused as such; the connection goes on after each.
    let mut remoting = shardmq_tests::RemotingClient::connect(&cluster.broker_addr());
    let check = |expression: &str, expression_type: &str| {
        RemotingCommand::request(request::CHECK_CLIENT_CONFIG, 0).with_body(bytes::Bytes::from(
            serde_json::json!({
                "clientId": "c@1",
                "group": "sql-readers",
                "subscriptionData": {
                    "topic": TOPIC,
                    "subString": expression,
                    "expressionType": expression_type,
                },
            })
            .to_string(),
        ))
    };
    assert_eq!(
        remoting.call(check("a BETWEEN 1 AND 2", "SQL92")).code,
        response::SUCCESS
    );
    assert_eq!(
        remoting.call(check("TagA || TagB", "TAG")).code,
        response::SUCCESS
    );
    let refused = remoting.call(check("a BETWEEN 1 AND", "SQL92"));
    assert_eq!(refused.code, response::SUBSCRIPTION_PARSE_FAILED);
    assert!(refused.remark.unwrap_or_default().contains("position"));
    let garbage = remoting.call(
        RemotingCommand::request(request::CHECK_CLIENT_CONFIG, 0)
            .with_body(bytes::Bytes::from_static(b"not json")),
    );
    assert_eq!(garbage.code, response::MESSAGE_ILLEGAL);
    assert_eq!(
        remoting.call(check("a > 1", "SQL92")).code,
        response::SUCCESS,
        "the connection still answers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_without_the_property_filter_refuses_sql_pulls() {
    let (cluster, _data) = cluster_with_messages(false).await;
    let (status, message) = raw_sql_pull(&cluster, "a > 1");
    assert_eq!(status, wire::Status::INVALID_TAG_EXPRESSION);
    assert!(message.contains("enable_property_filter"), "{message}");
    // A RocketMQ client's subscription check says so too.
    let mut remoting = shardmq_tests::RemotingClient::connect(&cluster.broker_addr());
    let refused = remoting.call(
        RemotingCommand::request(request::CHECK_CLIENT_CONFIG, 0).with_body(bytes::Bytes::from(
            serde_json::json!({
                "clientId": "c@1",
                "group": "g",
                "subscriptionData": {"topic": TOPIC, "subString": "a > 1", "expressionType": "SQL92"},
            })
            .to_string()),
        ),
    );
    assert_eq!(refused.code, response::SUBSCRIPTION_PARSE_FAILED);
    assert!(refused
        .remark
        .unwrap_or_default()
        .contains("enable_property_filter"));
    // Tag pulls are served as before.
    let (status, _) = raw_pull(&cluster, "odd", None);
    assert_eq!(status, wire::Status::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_consumer_and_the_cli_subscribe_with_sql() {
    let (cluster, _data) = cluster_with_messages(true).await;
    let received = Arc::new(Mutex::new(BTreeSet::new()));
    let seen = received.clone();
    let consumer = PushConsumer::builder()
        .namesrv(cluster.namesrv_addr())
        .group("sql-push")
        .consume_from(shardmq_client::ConsumeFrom::FirstOffset)
        .subscribe_sql(TOPIC, "region = 'eu' AND TAGS <> 'odd'")
        .listen_concurrently(move |messages| {
            let seen = Arc::clone(&seen);
            async move {
                let mut seen = seen.lock().unwrap();
                for message in messages {
                    seen.insert(message.property("index").unwrap().parse::<usize>().unwrap());
                }
                ConsumeResult::Success
            }
        })
        .start()
        .await
        .expect("push consumer");
    let wanted = expected(|i| i.is_multiple_of(4));
    let deadline = Instant::now() + Duration::from_secs(30);
    while *received.lock().unwrap() != wanted {
        assert!(
            Instant::now() < deadline,
            "received {:?}, wanted {wanted:?}",
            received.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Admin tools see the subscription as SQL92 (RocketMQ's GET_CONSUMER_CONNECTION_LIST).
    let mut remoting = shardmq_tests::RemotingClient::connect(&cluster.broker_addr());
    let connections = remoting.call(
        RemotingCommand::request(request::GET_CONSUMER_CONNECTION_LIST, 0)
            .with_ext("consumerGroup", "sql-push"),
    );
    assert_eq!(
        connections.code,
        response::SUCCESS,
        "{:?}",
        connections.remark
    );
    let connections: serde_json::Value = serde_json::from_slice(&connections.body).unwrap();
    let subscription = &connections["subscriptionTable"][TOPIC];
    assert_eq!(subscription["expressionType"], "SQL92");
    assert_eq!(subscription["subString"], "region = 'eu' AND TAGS <> 'odd'");
    consumer.shutdown().await;

    let output = run_cli(
        &cluster.namesrv_addr(),
        &[
            "--json",
            "consume",
            TOPIC,
            "--group",
            "sql-cli",
            "--sql",
            "a >= 36",
            "--timeout-ms",
            "3000",
        ],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let bodies: Vec<String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let json: serde_json::Value = serde_json::from_str(line).unwrap();
            json["body"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(
        bodies,
        ["message 36", "message 38", "message 39"],
        "message 37 has no `a`"
    );
    let refused = run_cli(
        &cluster.namesrv_addr(),
        &["consume", TOPIC, "--group", "sql-cli", "--sql", "a >"],
    );
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("position"), "{stderr}");
}

/// A pull of queue 0 of [`TOPIC`] with a SQL92 `expression` sent as is (not checked by the
/// client library first): the answer's status and message.
fn raw_sql_pull(cluster: &LocalCluster, expression: &str) -> (wire::Status, String) {
    raw_pull(cluster, expression, Some("SQL92"))
}

fn raw_pull(
    cluster: &LocalCluster,
    expression: &str,
    expression_type: Option<&str>,
) -> (wire::Status, String) {
    let mut client = TestClient::connect(cluster.broker_addr().parse().unwrap()).expect("connect");
    client.handshake().expect("handshake");
    let answer = client
        .request(|b| {
            let group = b.create_string("raw-readers");
            let topic = b.create_string(TOPIC);
            let expression = b.create_string(expression);
            let expression_type = expression_type.map(|kind| b.create_string(kind));
            let body = wire::PullRequest::create(
                b,
                &wire::PullRequestArgs {
                    consumer_group: Some(group),
                    topic: Some(topic),
                    queue_id: 0,
                    queue_offset: 0,
                    max_messages: 4,
                    max_bytes: 0,
                    tag_expression: Some(expression),
                    suspend_timeout_ms: 0,
                    commit_offset: -1,
                    expression_type,
                },
            );
            (wire::Body::PullRequest, body.as_union_value())
        })
        .expect("an answer");
    let frame = answer.frame();
    (
        frame.status(),
        frame.message().unwrap_or_default().to_owned(),
    )
}
