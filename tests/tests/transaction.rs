//! Transactional messages against a real namesrv and broker: a committed transaction's message
//! is delivered exactly once and a rolled-back one never; a transaction left UNKNOWN is
//! committed by the broker's check-back to the producer group; one never resolved is discarded
//! after `transaction_check_max` checks; and a broker killed with SIGKILL between the half
//! messages and their resolution delivers every committed message exactly once after its
//! restart. The broker runs with short check settings so each test takes seconds.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shardmq_client::{
    Message, MessageExt, Producer, PullConsumer, PullStatus, TransactionSendResult,
    TransactionState,
};
use shardmq_tests::{wait_until, LocalCluster, ROUTE_TIMEOUT};
use tempfile::TempDir;

/// How long a test waits for a message to become visible or a check-back to happen.
const WAIT: Duration = Duration::from_secs(30);

/// Broker settings: first check-back after 1 s, a check round every 300 ms.
const TRANSACTION_TIMEOUT_MS: u64 = 1_000;
const CHECK_INTERVAL_MS: u64 = 300;

const TOPIC: &str = "Payments";

struct Setup {
    cluster: LocalCluster,
    _data: TempDir,
}

fn start(check_max: u32, extra: &[&str]) -> Setup {
    let data = TempDir::new().expect("temp dir");
    let timeout = TRANSACTION_TIMEOUT_MS.to_string();
    let interval = CHECK_INTERVAL_MS.to_string();
    let check_max = check_max.to_string();
    let mut args = vec![
        "--transaction-timeout-ms",
        timeout.as_str(),
        "--transaction-check-interval-ms",
        interval.as_str(),
        "--transaction-check-max",
        check_max.as_str(),
    ];
    args.extend_from_slice(extra);
    let cluster = LocalCluster::start_with_broker_args(data.path(), &args);
    cluster.create_topic(TOPIC, 4);
    Setup {
        cluster,
        _data: data,
    }
}

/// Polls `check` every 20 ms until it holds; panics naming `what` after [`WAIT`].
async fn eventually<F: FnMut() -> Fut, Fut: Future<Output = bool>>(what: &str, check: F) {
    shardmq_tests::eventually(WAIT, what, check).await;
}

/// Calls of a `check_local_transaction` callback: the messages it was asked about.
type Checks = Arc<Mutex<Vec<MessageExt>>>;

/// A producer of `group` whose check-back callback records its calls and answers `answer`.
async fn producer(setup: &Setup, group: &str, answer: TransactionState) -> (Producer, Checks) {
    let checks: Checks = Arc::default();
    let sink = Arc::clone(&checks);
    let producer = Producer::builder()
        .namesrv(setup.cluster.namesrv_addr())
        .group(group)
        .heartbeat_interval(Duration::from_millis(300))
        .check_local_transaction(move |message| {
            sink.lock().unwrap().push(message);
            async move { answer }
        })
        .build()
        .await
        .expect("producer");
    (producer, checks)
}

async fn send(producer: &Producer, body: &str, state: TransactionState) -> TransactionSendResult {
    producer
        .send_in_transaction(Message::new(TOPIC, body.to_owned()), move |_| async move {
            state
        })
        .await
        .unwrap_or_else(|error| panic!("transaction {body}: {error}"))
}

/// Every message stored in the topic now, by body; reads each queue from its first offset.
async fn visible(setup: &Setup) -> shardmq_client::Result<BTreeMap<String, Vec<MessageExt>>> {
    let reader = PullConsumer::builder()
        .namesrv(setup.cluster.namesrv_addr())
        .group("transaction-test-reader")
        .build()
        .await?;
    let mut found: BTreeMap<String, Vec<MessageExt>> = BTreeMap::new();
    let outcome = async {
        for queue in reader.queues(TOPIC).await? {
            let mut offset = 0;
            loop {
                let result = reader.pull(&queue, offset, 32).await?;
                if result.status != PullStatus::Found {
                    break;
                }
                offset = result.next_begin_offset;
                for message in result.messages {
                    let body = String::from_utf8_lossy(&message.body).into_owned();
                    found.entry(body).or_default().push(message);
                }
            }
        }
        Ok(())
    }
    .await;
    reader.shutdown().await;
    outcome.map(|()| found)
}

/// Every message of the topic, by body, once each of `bodies` is there at least once.
async fn wait_visible(setup: &Setup, bodies: &[String]) -> BTreeMap<String, Vec<MessageExt>> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(found) = visible(setup).await {
            if bodies.iter().all(|body| found.contains_key(body)) {
                return found;
            }
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {} committed message(s) to be visible",
            bodies.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Lets a check round or two run, so that a message that should not appear (or appear
/// twice) has had the chance to.
async fn a_few_check_rounds() {
    tokio::time::sleep(Duration::from_millis(3 * CHECK_INTERVAL_MS)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_is_delivered_once_and_rollback_never() {
    let setup = start(15, &[]);
    let (producer, checks) = producer(&setup, "txn-basic", TransactionState::Unknown).await;
    let rolled_back = send(&producer, "rolled back", TransactionState::Rollback).await;
    assert!(rolled_back.is_end_confirmed);
    let committed = send(&producer, "committed", TransactionState::Commit).await;
    assert!(committed.is_end_confirmed);
    assert_eq!(committed.state, TransactionState::Commit);
    assert_eq!(committed.send_result.queue.topic, TOPIC);

    let found = wait_visible(&setup, &["committed".to_owned()]).await;
    let copies = &found["committed"];
    assert_eq!(copies.len(), 1, "a committed message is delivered once");
    let message = &copies[0];
    assert_eq!(message.msg_id(), committed.send_result.msg_id);
    assert_eq!(message.topic(), TOPIC);
    assert_eq!(message.queue_id, committed.send_result.queue.queue_id);
    assert_eq!(message.property("TRAN_MSG"), Some("true"));
    assert_eq!(message.property("REAL_TOPIC"), None);
    assert!(!found.contains_key("rolled back"));

    // Past the check immunity: neither is checked back (both are resolved), and nothing new
    // shows up.
    tokio::time::sleep(Duration::from_millis(TRANSACTION_TIMEOUT_MS)).await;
    a_few_check_rounds().await;
    let found = visible(&setup).await.expect("read the topic");
    assert_eq!(found["committed"].len(), 1);
    assert!(
        !found.contains_key("rolled back"),
        "a rollback is never delivered"
    );
    assert!(
        checks.lock().unwrap().is_empty(),
        "resolved transactions are not checked back"
    );
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_transactions_are_resolved_by_check_back() {
    let setup = start(15, &[]);
    let (producer, checks) = producer(&setup, "txn-check", TransactionState::Commit).await;
    let started = Instant::now();
    let unknown = send(&producer, "resolved later", TransactionState::Unknown).await;
    assert!(unknown.is_end_confirmed);
    let found = wait_visible(&setup, &["resolved later".to_owned()]).await;
    assert!(
        started.elapsed() >= Duration::from_millis(TRANSACTION_TIMEOUT_MS),
        "an unresolved transaction is only checked after transaction_timeout_ms"
    );
    assert_eq!(found["resolved later"].len(), 1);
    assert_eq!(
        found["resolved later"][0].msg_id(),
        unknown.send_result.msg_id
    );
    let asked = checks.lock().unwrap().clone();
    assert!(!asked.is_empty());
    assert_eq!(asked[0].topic(), TOPIC, "the callback sees the real topic");
    assert_eq!(asked[0].queue_id, unknown.send_result.queue.queue_id);
    assert_eq!(&asked[0].body[..], b"resolved later");
    assert_eq!(asked[0].msg_id(), unknown.send_result.msg_id);

    // A check-back that answers ROLLBACK drops the message.
    let (rollback_producer, rollback_checks) =
        self::producer(&setup, "txn-check-rollback", TransactionState::Rollback).await;
    send(
        &rollback_producer,
        "rolled back later",
        TransactionState::Unknown,
    )
    .await;
    eventually("the rollback check-back", || async {
        !rollback_checks.lock().unwrap().is_empty()
    })
    .await;
    a_few_check_rounds().await;
    let found = visible(&setup).await.expect("read the topic");
    assert!(!found.contains_key("rolled back later"));
    assert_eq!(found["resolved later"].len(), 1, "still exactly once");
    assert_eq!(
        rollback_checks.lock().unwrap().len(),
        1,
        "a resolved transaction is not checked again"
    );
    producer.shutdown().await;
    rollback_producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_never_resolved_is_discarded_after_check_max() {
    const CHECK_MAX: usize = 3;
    let setup = start(CHECK_MAX as u32, &[]);
    let (producer, checks) = producer(&setup, "txn-discard", TransactionState::Unknown).await;
    send(&producer, "never resolved", TransactionState::Unknown).await;
    eventually("the discard log line", || {
        let lines = setup.cluster.broker.log_lines();
        async move {
            lines
                .iter()
                .any(|line| line.contains("transaction half message discarded"))
        }
    })
    .await;
    assert_eq!(
        checks.lock().unwrap().len(),
        CHECK_MAX,
        "checked exactly transaction_check_max times before the discard"
    );
    a_few_check_rounds().await;
    assert_eq!(
        checks.lock().unwrap().len(),
        CHECK_MAX,
        "not checked after the discard"
    );
    let found = visible(&setup).await.expect("read the topic");
    assert!(!found.contains_key("never resolved"));
    producer.shutdown().await;
}

/// Waits until the namesrv routes `TOPIC` to the broker's current address.
fn wait_for_route_to_broker(cluster: &LocalCluster) {
    let broker = cluster.broker_addr();
    let mut namesrv = cluster.namesrv.client();
    wait_until(ROUTE_TIMEOUT, "the route to the restarted broker", || {
        let frame = namesrv
            .request(|builder| {
                let topic = builder.create_string(TOPIC);
                let request = shardmq_client::wire::GetRouteRequest::create(
                    builder,
                    &shardmq_client::wire::GetRouteRequestArgs { topic: Some(topic) },
                );
                (
                    shardmq_client::wire::Body::GetRouteRequest,
                    request.as_union_value(),
                )
            })
            .ok()?;
        let route = frame.frame().body_as_route_response()?;
        let is_routed = route.brokers()?.iter().any(|data| {
            data.addresses().is_some_and(|addresses| {
                addresses
                    .iter()
                    .any(|address| address.address() == Some(broker.as_str()))
            })
        });
        is_routed.then_some(())
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_between_half_and_commit_delivers_each_commit_exactly_once() {
    // Sync flush: every acknowledged half message survives the kill.
    let mut setup = start(1_000, &["--flush", "sync"]);
    let group = "txn-restart";
    // The first producer cannot answer check-backs: before the kill nothing is resolved by one.
    let first = Producer::builder()
        .namesrv(setup.cluster.namesrv_addr())
        .group(group)
        .build()
        .await
        .expect("producer");
    let mut must_appear: Vec<String> = Vec::new();
    for index in 0..8 {
        let body = format!("unresolved {index}");
        let result = first
            .send_in_transaction(Message::new(TOPIC, body.clone()), |_| async {
                TransactionState::Unknown
            })
            .await
            .expect("half message");
        assert!(result.is_end_confirmed);
        must_appear.push(body);
    }
    for index in 0..4 {
        let body = format!("committed before {index}");
        let result = first
            .send_in_transaction(Message::new(TOPIC, body.clone()), |_| async {
                TransactionState::Commit
            })
            .await
            .expect("transaction");
        assert!(result.is_end_confirmed);
        must_appear.push(body);
    }
    // Commits racing the kill: each half that was acknowledged must end up delivered exactly
    // once; one whose send failed may be delivered at most once.
    let done = Arc::new(AtomicUsize::new(0));
    let racing = {
        let first = first.clone();
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for index in 0..40 {
                let body = format!("racing {index}");
                let outcome = first
                    .send_in_transaction(Message::new(TOPIC, body.clone()), |_| async {
                        TransactionState::Commit
                    })
                    .await;
                done.fetch_add(1, Ordering::SeqCst);
                outcomes.push((body, outcome.is_ok()));
            }
            outcomes
        })
    };
    eventually("some racing transactions", || async {
        done.load(Ordering::SeqCst) >= 5
    })
    .await;
    tokio::task::block_in_place(|| setup.cluster.broker.kill9());
    let outcomes = racing.await.expect("racing task");
    first.shutdown().await;
    let mut may_appear = Vec::new();
    for (body, is_half_stored) in outcomes {
        if is_half_stored {
            must_appear.push(body);
        } else {
            may_appear.push(body);
        }
    }

    tokio::task::block_in_place(|| {
        setup.cluster.broker.restart();
        wait_for_route_to_broker(&setup.cluster);
    });
    // A member of the group that answers check-backs with COMMIT.
    let (second, checks) = producer(&setup, group, TransactionState::Commit).await;
    second.write_queues(TOPIC).await.expect("route");

    wait_visible(&setup, &must_appear).await;
    assert!(
        !checks.lock().unwrap().is_empty(),
        "the unresolved transactions were committed by check-backs"
    );
    a_few_check_rounds().await;
    // A racing transaction whose half send failed may still have been stored, and then be
    // committed by a later check-back: at most once.
    let found_later = visible(&setup).await.expect("read the topic");
    for body in &must_appear {
        assert_eq!(
            found_later.get(body).map_or(0, Vec::len),
            1,
            "{body} must be delivered exactly once"
        );
    }
    for body in &may_appear {
        assert!(
            found_later.get(body).map_or(0, Vec::len) <= 1,
            "{body} must be delivered at most once"
        );
    }
    for (body, copies) in &found_later {
        assert!(
            must_appear.contains(body) || may_appear.contains(body),
            "{body} was never sent"
        );
        assert_eq!(
            copies.len(),
            1,
            "{body} is delivered {} times",
            copies.len()
        );
    }
    second.shutdown().await;
}

/// A sync master answers a half message only once its replicas hold it. Without a slave the
/// half message is answered SLAVE_NOT_AVAILABLE (it used to be SEND_OK without any wait): the
/// producer then rolls it back without running its local transaction, as RocketMQ's does, and
/// the message is never delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_message_a_sync_master_cannot_replicate_is_rolled_back() {
    let setup = start(15, &["--broker-role", "sync-master"]);
    let (producer, checks) = producer(&setup, "txn-sync", TransactionState::Commit).await;
    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ran_inside = Arc::clone(&ran);
    let outcome = producer
        .send_in_transaction(Message::new(TOPIC, "unreplicated".to_owned()), move |_| {
            ran_inside.store(true, std::sync::atomic::Ordering::SeqCst);
            async { TransactionState::Commit }
        })
        .await
        .expect("the half message is answered");
    assert_eq!(
        outcome.send_result.status,
        shardmq_client::SendStatus::SlaveNotAvailable
    );
    assert_eq!(outcome.state, TransactionState::Rollback);
    assert!(outcome.is_end_confirmed);
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "the local transaction ran for a half message that is not replicated"
    );
    tokio::time::sleep(Duration::from_millis(TRANSACTION_TIMEOUT_MS)).await;
    a_few_check_rounds().await;
    let found = visible(&setup).await.expect("read the topic");
    assert!(!found.contains_key("unreplicated"), "{found:?}");
    assert!(checks.lock().unwrap().is_empty());
    producer.shutdown().await;
}
