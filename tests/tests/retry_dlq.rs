//! Retry and dead letters against a real namesrv and broker (short delay levels): a concurrent
//! listener's `ReconsumeLater`, a panic and a call past `consume_timeout` send the message back;
//! the broker redelivers it through `%RETRY%<group>` with its original topic, id and a growing
//! reconsume count, and after `max_reconsume_times` stores it once in `%DLQ%<group>`, which
//! nothing consumes; `shardmq dlq list` shows it and `shardmq dlq resend` sends it to its topic
//! again. An orderly listener never sends back: it retries locally, in order. The send path of
//! `shardmq send --delay-level / --delay-ms / --deliver-at` is checked here too.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

use std::collections::BTreeMap;
use std::future::Future;
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use shardmq_client::{
    ConsumeFrom, ConsumeResult, Message, MessageExt, Producer, PullConsumer, PushConsumer,
};
use shardmq_tests::LocalCluster;
use tempfile::TempDir;

const WAIT: Duration = Duration::from_secs(40);

/// Every retry level 200 ms, so a chain of retries takes about a second.
const LEVELS: &str = "200ms 200ms 200ms 200ms 200ms 200ms 200ms 200ms";

const GROUP: &str = "retry-group";

/// One delivery the listener saw.
#[derive(Debug, Clone)]
struct Delivery {
    topic: String,
    msg_id: String,
    body: String,
    reconsume_times: i32,
}

type Seen = Arc<Mutex<Vec<Delivery>>>;

async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    shardmq_tests::eventually_some(WAIT, what, check).await
}

fn shardmq(namesrv: &str, args: &[&str]) -> Output {
    shardmq_tests::run_cli(namesrv, args)
}

fn json_lines(output: &Output) -> Vec<Value> {
    assert!(
        output.status.success(),
        "shardmq failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect()
}

fn deliveries_of(seen: &Seen, body: &str) -> Vec<Delivery> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|d| d.body == body)
        .cloned()
        .collect()
}

async fn offsets_of(cluster: &LocalCluster, topic: &str) -> Option<(i64, i64)> {
    let consumer = PullConsumer::builder()
        .namesrv(cluster.namesrv_addr())
        .group("retry-test-reader")
        .build()
        .await
        .ok()?;
    let queues = consumer.queues(topic).await.ok()?;
    let queue = queues.first()?;
    let offsets = consumer.queue_offsets(queue).await.ok();
    consumer.shutdown().await;
    offsets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_messages_are_retried_then_dead_lettered_and_can_be_resent() {
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start_with_broker_args(data.path(), &["--delay-levels", LEVELS]);
    cluster.create_topic("Orders", 2);
    let namesrv = cluster.namesrv_addr();

    let seen: Seen = Arc::default();
    let accept_everything = Arc::new(AtomicBool::new(false));
    let listener_seen = Arc::clone(&seen);
    let listener_accepts = Arc::clone(&accept_everything);
    let consumer = PushConsumer::builder()
        .namesrv(&namesrv)
        .group(GROUP)
        .subscribe("Orders", "*")
        .consume_from(ConsumeFrom::FirstOffset)
        .max_reconsume_times(3)
        .consume_timeout(Duration::from_millis(700))
        .listen_concurrently(move |messages: Vec<MessageExt>| {
            let seen = Arc::clone(&listener_seen);
            let accepts = listener_accepts.load(Ordering::SeqCst);
            async move {
                let mut result = ConsumeResult::Success;
                for message in messages {
                    let body = String::from_utf8_lossy(&message.body).into_owned();
                    seen.lock().unwrap().push(Delivery {
                        topic: message.topic().to_owned(),
                        msg_id: message.msg_id(),
                        body: body.clone(),
                        reconsume_times: message.reconsume_times,
                    });
                    let is_first = message.reconsume_times == 0;
                    match body.as_str() {
                        "poison" if !accepts => result = ConsumeResult::ReconsumeLater,
                        "panic once" if is_first => panic!("listener failure on purpose"),
                        "slow once" if is_first => {
                            tokio::time::sleep(Duration::from_secs(3)).await;
                        }
                        _ => {}
                    }
                }
                result
            }
        })
        .start()
        .await
        .expect("consumer");

    let producer = Producer::builder().namesrv(&namesrv).build().await.unwrap();
    let mut ids = BTreeMap::new();
    for body in ["poison", "panic once", "slow once", "fine"] {
        let sent = producer.send(Message::new("Orders", body)).await.unwrap();
        ids.insert(body, sent.msg_id.to_string());
    }

    // The poison message: delivered with reconsume counts 0, 1, 2, 3, then dead-lettered.
    let poison = eventually("four deliveries of the poison message", || async {
        let deliveries = deliveries_of(&seen, "poison");
        (deliveries.len() >= 4).then_some(deliveries)
    })
    .await;
    let counts: Vec<i32> = poison.iter().map(|d| d.reconsume_times).collect();
    assert_eq!(counts, vec![0, 1, 2, 3]);
    for delivery in &poison {
        assert_eq!(delivery.topic, "Orders", "a retry shows its original topic");
        assert_eq!(
            delivery.msg_id, ids["poison"],
            "a retry keeps the message id"
        );
    }
    let dead = eventually("the dead letter", || async {
        let lines = json_lines(&shardmq(
            &namesrv,
            &["--json", "dlq", "list", "--group", GROUP],
        ));
        (!lines.is_empty()).then_some(lines)
    })
    .await;
    assert_eq!(dead.len(), 1, "exactly one dead letter: {dead:?}");
    assert_eq!(dead[0]["topic"], format!("%DLQ%{GROUP}"));
    assert_eq!(dead[0]["retry_topic"], "Orders");
    assert_eq!(dead[0]["origin_message_id"], ids["poison"].as_str());
    assert_eq!(dead[0]["reconsume_times"], 4);
    assert_eq!(dead[0]["body"], "poison");

    // The panicking and the slow listener calls count as ReconsumeLater: one retry each.
    for body in ["panic once", "slow once"] {
        let deliveries = eventually(body, || async {
            let deliveries = deliveries_of(&seen, body);
            (deliveries.len() >= 2).then_some(deliveries)
        })
        .await;
        let counts: Vec<i32> = deliveries.iter().map(|d| d.reconsume_times).collect();
        assert_eq!(counts, vec![0, 1], "{body}");
        assert_eq!(deliveries[1].topic, "Orders");
        assert_eq!(deliveries[1].msg_id, ids[body]);
    }
    assert_eq!(deliveries_of(&seen, "fine").len(), 1);

    // The dead letter stays put, unconsumed; resending puts it back into its topic.
    assert_eq!(
        offsets_of(&cluster, &format!("%DLQ%{GROUP}")).await,
        Some((0, 1))
    );
    accept_everything.store(true, Ordering::SeqCst);
    let resent = json_lines(&shardmq(
        &namesrv,
        &[
            "--json",
            "dlq",
            "resend",
            "--group",
            GROUP,
            "--id",
            &ids["poison"],
        ],
    ));
    assert_eq!(resent.len(), 1, "{resent:?}");
    assert_eq!(resent[0]["topic"], "Orders");
    let resent_delivery = eventually("the resent message", || async {
        let deliveries = deliveries_of(&seen, "poison");
        (deliveries.len() >= 5).then(|| deliveries[4].clone())
    })
    .await;
    assert_eq!(resent_delivery.msg_id, ids["poison"]);
    assert_eq!(resent_delivery.reconsume_times, 0, "a fresh message");
    assert_eq!(resent_delivery.topic, "Orders");

    let unknown = shardmq(
        &namesrv,
        &["dlq", "resend", "--group", GROUP, "--id", "no-such-id"],
    );
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no-such-id"));

    consumer.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orderly_listener_retries_locally_in_order_and_never_sends_back() {
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start_with_broker_args(data.path(), &["--delay-levels", LEVELS]);
    cluster.create_topic("Sequence", 1);
    let namesrv = cluster.namesrv_addr();
    let seen: Arc<Mutex<Vec<(String, i32)>>> = Arc::default();
    let listener_seen = Arc::clone(&seen);
    let consumer = PushConsumer::builder()
        .namesrv(&namesrv)
        .group("orderly-group")
        .subscribe("Sequence", "*")
        .consume_from(ConsumeFrom::FirstOffset)
        .orderly_suspend(Duration::from_millis(100))
        .listen_orderly(move |messages: Vec<MessageExt>| {
            let seen = Arc::clone(&listener_seen);
            async move {
                let mut result = ConsumeResult::Success;
                for message in messages {
                    let body = String::from_utf8_lossy(&message.body).into_owned();
                    if body == "m1" && message.reconsume_times < 2 {
                        result = ConsumeResult::ReconsumeLater;
                    }
                    seen.lock().unwrap().push((body, message.reconsume_times));
                }
                result
            }
        })
        .start()
        .await
        .unwrap();
    let producer = Producer::builder().namesrv(&namesrv).build().await.unwrap();
    for body in ["m0", "m1", "m2"] {
        // One queue: the send order is the queue order.
        producer.send(Message::new("Sequence", body)).await.unwrap();
    }
    let order = eventually("m2", || async {
        let seen = seen.lock().unwrap().clone();
        seen.iter().any(|(body, _)| body == "m2").then_some(seen)
    })
    .await;
    assert_eq!(
        order,
        vec![
            ("m0".to_owned(), 0),
            ("m1".to_owned(), 0),
            ("m1".to_owned(), 1),
            ("m1".to_owned(), 2),
            ("m2".to_owned(), 0)
        ],
        "in order, the failed message again and again before the next"
    );
    // Nothing went through the retry topic.
    if let Some((_, max)) = offsets_of(&cluster, "%RETRY%orderly-group").await {
        assert_eq!(max, 0, "an orderly consumer sent a message back");
    }
    consumer.shutdown().await;
    producer.shutdown().await;
}

#[test]
fn the_cli_sends_delayed_and_timed_messages() {
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start_with_broker_args(data.path(), &["--delay-levels", "1s 2s"]);
    cluster.create_topic("CliDelayed", 1);
    let namesrv = cluster.namesrv_addr();
    let sent_at = Instant::now();
    for (extra, is_scheduled) in [
        (vec!["--delay-level", "1"], true),
        (vec!["--delay-ms", "1500"], true),
        (vec!["--deliver-at", "2000-01-01T00:00:00Z"], false),
    ] {
        let mut args = vec!["--json", "send", "CliDelayed", "--body", "later"];
        args.extend(extra);
        let lines = json_lines(&shardmq(&namesrv, &args));
        assert_eq!(lines[0]["status"], "SEND_OK", "{lines:?}");
        assert_eq!(lines[0]["scheduled"], is_scheduled, "{lines:?}");
        if is_scheduled {
            assert_eq!(lines[0]["queue_offset"], -1, "{lines:?}");
        }
    }
    let text = shardmq(
        &namesrv,
        &[
            "send",
            "CliDelayed",
            "--body",
            "later",
            "--delay-level",
            "1",
        ],
    );
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.contains("queue=CliDelayed@") && text.contains(" offset=scheduled "),
        "{text}"
    );
    let bad = shardmq(
        &namesrv,
        &[
            "send",
            "CliDelayed",
            "--body",
            "x",
            "--deliver-at",
            "tomorrow",
        ],
    );
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("RFC 3339"));
    let refused = shardmq(
        &namesrv,
        &["send", "CliDelayed", "--body", "x", "--delay-level", "3"],
    );
    assert!(!refused.status.success(), "level 3 of 2 was accepted");
    let help = shardmq(&namesrv, &["send", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in ["--delay-level", "--delay-ms", "--deliver-at"] {
        assert!(help.contains(flag), "send --help lacks {flag}");
    }
    let help = shardmq(&namesrv, &["dlq", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("list") && help.contains("resend"), "{help}");

    // The one with a past time is there at once; the delayed ones follow after their delays.
    let consumed = |count: &str| {
        shardmq(
            &namesrv,
            &[
                "--json",
                "consume",
                "CliDelayed",
                "--group",
                "cli-reader",
                "--count",
                count,
                "--timeout-ms",
                "10000",
            ],
        )
    };
    assert_eq!(json_lines(&consumed("1")).len(), 1);
    assert_eq!(json_lines(&consumed("2")).len(), 2);
    assert!(
        sent_at.elapsed() >= Duration::from_millis(1_000),
        "the delayed messages came early"
    );
}

#[test]
fn a_repeated_dead_letter_send_back_is_kept_once() {
    // A consumer that dies after sending a message to the DLQ but before committing past it
    // sends it back again after the restart; the dead letter must not be stored twice.
    use shardmq_schema::wire;
    use shardmq_tests::{
        pull_request_body, require_ok, send_request_body, split_records, PullParams, TestMessage,
    };
    let data = TempDir::new().unwrap();
    let cluster = LocalCluster::start(data.path());
    cluster.create_topic("Doomed", 1);
    let mut client = cluster.broker.client();
    let sent = require_ok(
        client
            .request(|b| {
                send_request_body(
                    b,
                    "Doomed",
                    0,
                    &[TestMessage::new("poison").unique_id("0A0B0C0D0E0F00000000000000000001")],
                )
            })
            .unwrap(),
    )
    .expect("send");
    let result = sent
        .frame()
        .body_as_send_response()
        .and_then(|r| r.results())
        .expect("a result")
        .get(0);
    let (commit_log_offset, unique_id) = (
        result.commit_log_offset(),
        result.unique_id().unwrap_or_default().to_owned(),
    );
    for attempt in 0..3 {
        let answer = require_ok(
            client
                .request(|b| {
                    let group = b.create_string("doomed-group");
                    let topic = b.create_string("Doomed");
                    let unique_id = b.create_string(&unique_id);
                    let request = wire::ConsumerSendBackRequest::create(
                        b,
                        &wire::ConsumerSendBackRequestArgs {
                            consumer_group: Some(group),
                            topic: Some(topic),
                            queue_id: 0,
                            commit_log_offset,
                            unique_id: Some(unique_id),
                            delay_level: -1,
                            max_reconsume_times: 16,
                        },
                    );
                    (
                        wire::Body::ConsumerSendBackRequest,
                        request.as_union_value(),
                    )
                })
                .unwrap(),
        )
        .unwrap_or_else(|e| panic!("send-back {attempt}: {e}"));
        let body = answer
            .frame()
            .body_as_consumer_send_back_response()
            .expect("a ConsumerSendBackResponse");
        assert!(
            body.is_dead_letter(),
            "send-back {attempt} is a dead letter"
        );
    }
    let pulled = require_ok(
        client
            .request(|b| pull_request_body(b, &PullParams::new("%DLQ%doomed-group", 0, 0)))
            .unwrap(),
    )
    .expect("pull the DLQ");
    let records = pulled
        .frame()
        .body_as_pull_response()
        .and_then(|p| p.records())
        .map(|r| r.bytes().to_vec())
        .unwrap_or_default();
    assert_eq!(
        split_records(&records).len(),
        1,
        "three send-backs of one message left more than one dead letter"
    );
}
