//! Reliability suite, crashes: the real broker killed with SIGKILL while producers (the client
//! library's `Producer`, one per thread) send, over and over, then restarted on the same data
//! directory.
//!
//! - Sync flush, many rounds: every message a send acknowledged OK in any round is there after
//!   every later restart, at the queue offset its send result named, with its body intact and
//!   both CRCs matching (every pulled record goes through the broker's `decode_message`, which
//!   checks the body CRC and the `__CRC32#` whole-record CRC); nothing appears that was not
//!   sent, nothing appears twice, and only a batch whose send was cut by the kill may or may not
//!   be there. `verify` is clean at the end.
//! - Async flush: each queue keeps a prefix of what was acknowledged, and what is lost was
//!   acknowledged at most about one flush interval before the kill. The measured window is
//!   printed (`cargo test ... -- --nocapture`) and recorded in docs/operations.md.
//!
//! The kill moment is chosen by a seeded generator; each test prints its seed, and
//! `SHARDMQ_TEST_SEED=<seed>` replays it. Needs the binaries: `cargo build --workspace --bins`.

mod reliability_support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use reliability_support::{
    assert_verify_clean, pull_whole_queue, temp_dir, wait_until_routed, Rng, StoredRecord,
    TWO_STORAGE_SHARDS,
};
use shardmq_client::{Message, Producer, SendStatus};
use shardmq_tests::{wait_until, LocalCluster};

/// Queues of the topic under test: with two storage shards, two queues per CommitLog.
const QUEUES: u32 = 4;

/// Concurrent producers (threads, each with its own runtime and `Producer`).
const PRODUCERS: usize = 2;

/// Longest random padding added to a body, so records end at varied places in a block.
const MAX_PADDING_BYTES: u64 = 1500;

/// How long a round may take to reach its kill moment.
const ROUND_TIMEOUT: Duration = Duration::from_secs(30);

/// One message the test sent: its body and where its send said it went.
#[derive(Debug, Clone)]
struct Acked {
    queue_id: u32,
    queue_offset: u64,
    body: Vec<u8>,
    /// When the acknowledgement arrived.
    at: Instant,
}

/// What the producers of one round saw.
#[derive(Debug, Default)]
struct RoundLog {
    /// Sends answered SEND_OK: these must survive.
    acked: Vec<Acked>,
    /// Messages that may or may not be stored: a send cut by the kill, or answered
    /// FLUSH_DISK_TIMEOUT (stored, durability unconfirmed).
    in_doubt: Vec<Vec<u8>>,
    /// A send that failed before the kill: the broker was up, so that is a test failure.
    failure_before_kill: Option<String>,
}

/// Runs one producer thread: sends batches of 1 to 3 messages (bodies unique, padded to a
/// random length) until a send fails, logging every answer. A failure while `is_killed` is
/// still false is recorded as a failure.
fn spawn_producer(
    namesrv: String,
    topic: &'static str,
    name: String,
    mut rng: Rng,
    is_killed: Arc<AtomicBool>,
    log: Arc<Mutex<RoundLog>>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        runtime.block_on(async move {
            let producer = Producer::builder()
                .namesrv(&namesrv)
                .group("reliability-producers")
                .retries(0)
                .send_timeout(Duration::from_secs(20))
                .build()
                .await
                .expect("a producer");
            for sequence in 0.. {
                let batch: Vec<Vec<u8>> = (0..rng.in_range(1..=3))
                    .map(|part| {
                        let mut body = format!("{name}-m{sequence}-{part}|").into_bytes();
                        let padding = rng.in_range(0..=MAX_PADDING_BYTES);
                        body.extend(rng.bytes(usize::try_from(padding).unwrap()));
                        body
                    })
                    .collect();
                let messages = batch
                    .iter()
                    .map(|body| Message::new(topic, body.clone()))
                    .collect();
                let answer = producer.send_batch(messages).await;
                let mut log = log.lock().unwrap();
                match answer {
                    Ok(results) => {
                        for (result, body) in results.iter().zip(batch) {
                            if result.status == SendStatus::SendOk {
                                log.acked.push(Acked {
                                    queue_id: result.queue.queue_id,
                                    queue_offset: u64::try_from(result.queue_offset).unwrap(),
                                    body,
                                    at: Instant::now(),
                                });
                            } else {
                                log.in_doubt.push(body);
                            }
                        }
                    }
                    Err(error) => {
                        if !is_killed.load(Ordering::SeqCst) {
                            log.failure_before_kill =
                                Some(format!("{name}: a send failed before the kill: {error}"));
                        }
                        log.in_doubt.extend(batch);
                        break;
                    }
                }
            }
            producer.shutdown().await;
        });
    })
}

/// Runs `PRODUCERS` producer threads against the broker until `kill_when` says so, then kills
/// the broker with SIGKILL. Returns the log and the instant of the kill.
fn produce_then_kill(
    cluster: &mut LocalCluster,
    topic: &'static str,
    round: usize,
    rng: &mut Rng,
    kill_when: &dyn Fn(&RoundLog, Duration) -> bool,
) -> (RoundLog, Instant) {
    wait_until_routed(&cluster.namesrv, topic, &cluster.broker);
    let is_killed = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(RoundLog::default()));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|index| {
            spawn_producer(
                cluster.namesrv_addr(),
                topic,
                format!("r{round}-p{index}"),
                rng.fork(),
                Arc::clone(&is_killed),
                Arc::clone(&log),
            )
        })
        .collect();
    let started = Instant::now();
    wait_until(
        ROUND_TIMEOUT,
        &format!("round {round}: the kill moment"),
        || {
            let log = log.lock().unwrap();
            if let Some(failure) = &log.failure_before_kill {
                panic!("round {round}: {failure}");
            }
            kill_when(&log, started.elapsed()).then_some(())
        },
    );
    is_killed.store(true, Ordering::SeqCst);
    let killed_at = Instant::now();
    cluster.broker.kill9();
    for producer in producers {
        producer.join().expect("a producer thread");
    }
    let log = std::mem::take(&mut *log.lock().unwrap());
    if let Some(failure) = &log.failure_before_kill {
        panic!("round {round}: {failure}");
    }
    (log, killed_at)
}

/// Every record of every queue of `topic`, by queue id.
fn stored_queues(cluster: &LocalCluster, topic: &str) -> BTreeMap<u32, Vec<StoredRecord>> {
    let mut client = cluster.broker.client();
    (0..QUEUES)
        .map(|queue_id| {
            (
                queue_id,
                pull_whole_queue(&mut client, topic, i32::try_from(queue_id).unwrap()),
            )
        })
        .collect()
}

#[test]
fn every_message_acknowledged_in_20_kill_9_rounds_under_sync_flush_survives_intact() {
    const TOPIC: &str = "SyncCrash";
    const ROUNDS: usize = 20;
    let mut rng = Rng::for_test("sync flush kill -9 rounds");
    let dir = temp_dir();
    let mut broker_args = TWO_STORAGE_SHARDS.to_vec();
    broker_args.extend(["--flush", "sync"]);
    let mut cluster = LocalCluster::start_with_broker_args(dir.path(), &broker_args);
    cluster.create_topic(TOPIC, QUEUES);

    // What must be in each queue from now on: (queue, offset) → body. Messages acknowledged
    // SEND_OK, and messages in doubt that a restart showed to be stored.
    let mut kept: BTreeMap<(u32, u64), Vec<u8>> = BTreeMap::new();
    let mut total_acked = 0usize;
    let mut total_in_doubt_kept = 0usize;
    let started = Instant::now();
    for round in 0..ROUNDS {
        let kill_after_acks = usize::try_from(rng.in_range(1..=250)).unwrap();
        let (log, _) = produce_then_kill(&mut cluster, TOPIC, round, &mut rng, &|log, _| {
            log.acked.len() >= kill_after_acks
        });
        total_acked += log.acked.len();
        for acked in &log.acked {
            let previous = kept.insert((acked.queue_id, acked.queue_offset), acked.body.clone());
            assert!(
                previous.is_none(),
                "round {round}: a send was acknowledged at {}/{}, where an earlier message is",
                acked.queue_id,
                acked.queue_offset
            );
        }

        cluster.broker.restart();
        let stored = stored_queues(&cluster, TOPIC);
        let in_doubt: HashSet<&[u8]> = log.in_doubt.iter().map(Vec::as_slice).collect();
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        for (&queue_id, records) in &stored {
            for record in records {
                let place = (queue_id, record.queue_offset);
                assert!(
                    seen.insert(record.body.clone()),
                    "round {round}: after kill -9 and restart, a message is stored twice (again at {queue_id}/{})",
                    record.queue_offset
                );
                match kept.get(&place) {
                    Some(body) => assert!(
                        *body == record.body,
                        "round {round}: after kill -9 and restart, {queue_id}/{} holds another message than the one acknowledged there",
                        record.queue_offset
                    ),
                    None => {
                        assert!(
                            in_doubt.contains(record.body.as_slice()),
                            "round {round}: after kill -9 and restart, {queue_id}/{} holds a message that was never sent or was refused or lost earlier: {:?}",
                            record.queue_offset,
                            String::from_utf8_lossy(&record.body[..record.body.len().min(40)])
                        );
                        kept.insert(place, record.body.clone());
                        total_in_doubt_kept += 1;
                    }
                }
            }
        }
        for ((queue_id, queue_offset), body) in &kept {
            let is_there = stored[queue_id]
                .get(usize::try_from(*queue_offset).unwrap())
                .is_some_and(|record| record.body == *body);
            assert!(
                is_there,
                "round {round}: message {queue_id}/{queue_offset} ({:?}), acknowledged SEND_OK under sync flush (or seen after an earlier restart), is missing after kill -9 and restart",
                String::from_utf8_lossy(&body[..body.len().min(40)])
            );
        }
    }
    eprintln!(
        "sync flush: {ROUNDS} kill -9 rounds in {:.1} s, {total_acked} messages acknowledged and all kept, {total_in_doubt_kept} in-doubt messages found stored",
        started.elapsed().as_secs_f64()
    );

    cluster.broker.stop();
    assert_verify_clean(dir.path(), &format!("after {ROUNDS} kill -9 rounds"));
}

/// Flush intervals the loss window is measured at, and rounds at each.
const ASYNC_FLUSH_INTERVALS_MS: [u64; 2] = [100, 400];
const ASYNC_ROUNDS_PER_INTERVAL: usize = 3;

/// How far past the flush interval a lost acknowledgement may be: one flush's write and
/// fdatasync, and scheduling on a loaded machine.
const ASYNC_WINDOW_SLACK: Duration = Duration::from_millis(1000);

#[test]
fn kill_9_under_async_flush_loses_only_messages_acknowledged_within_about_one_flush_interval() {
    const TOPIC: &str = "AsyncCrash";
    let mut rng = Rng::for_test("async flush loss window");
    let mut report = Vec::new();
    for interval_ms in ASYNC_FLUSH_INTERVALS_MS {
        let dir = temp_dir();
        let interval = interval_ms.to_string();
        let mut broker_args = TWO_STORAGE_SHARDS.to_vec();
        broker_args.extend(["--flush", "async", "--flush-interval-ms", interval.as_str()]);
        let mut cluster = LocalCluster::start_with_broker_args(dir.path(), &broker_args);
        cluster.create_topic(TOPIC, QUEUES);
        let (mut acked_total, mut lost_total, mut oldest_lost) = (0, 0, Duration::ZERO);
        // The bodies each queue held after the last restart.
        let mut before: BTreeMap<u32, Vec<Vec<u8>>> =
            (0..QUEUES).map(|queue_id| (queue_id, Vec::new())).collect();
        for round in 0..ASYNC_ROUNDS_PER_INTERVAL {
            // Long enough that a broker that never flushed would lose acknowledgements older
            // than the window allows.
            let kill_after = Duration::from_millis(rng.in_range(
                (interval_ms + ASYNC_WINDOW_SLACK.as_millis() as u64 + 300)
                    ..=(interval_ms + ASYNC_WINDOW_SLACK.as_millis() as u64 + 1000),
            ));
            let (log, killed_at) =
                produce_then_kill(&mut cluster, TOPIC, round, &mut rng, &|_, elapsed| {
                    elapsed >= kill_after
                });
            cluster.broker.restart();
            let stored = stored_queues(&cluster, TOPIC);
            let what =
                format!("interval {interval_ms} ms, round {round}, after kill -9 and restart");
            let acked_at: HashMap<(u32, u64), &Acked> = log
                .acked
                .iter()
                .map(|acked| ((acked.queue_id, acked.queue_offset), acked))
                .collect();
            let in_doubt: HashSet<&[u8]> = log.in_doubt.iter().map(Vec::as_slice).collect();
            for (&queue_id, records) in &stored {
                // What earlier rounds left (recovered, hence on disk) is all still there.
                let earlier = &before[&queue_id];
                assert!(
                    records.len() >= earlier.len()
                        && records
                            .iter()
                            .zip(earlier)
                            .all(|(record, body)| record.body == *body),
                    "{what}: queue {queue_id} lost or changed messages kept by an earlier restart"
                );
                // Past them, each message is the one acknowledged at its place, or was in doubt.
                for record in &records[earlier.len()..] {
                    match acked_at.get(&(queue_id, record.queue_offset)) {
                        Some(acked) => assert!(
                            record.body == acked.body,
                            "{what}: {queue_id}/{} holds another message than the one acknowledged there",
                            record.queue_offset
                        ),
                        None => assert!(
                            in_doubt.contains(record.body.as_slice()),
                            "{what}: {queue_id}/{} holds a message that was never sent",
                            record.queue_offset
                        ),
                    }
                }
            }
            // Queue offsets are dense, so what is lost is each queue's acknowledged suffix.
            let lost: Vec<&Acked> = log
                .acked
                .iter()
                .filter(|acked| acked.queue_offset >= stored[&acked.queue_id].len() as u64)
                .collect();
            for (&queue_id, records) in &stored {
                before.insert(
                    queue_id,
                    records.iter().map(|record| record.body.clone()).collect(),
                );
            }
            for acked in &lost {
                oldest_lost = oldest_lost.max(killed_at.saturating_duration_since(acked.at));
            }
            acked_total += log.acked.len();
            lost_total += lost.len();
        }
        let bound = Duration::from_millis(interval_ms) + ASYNC_WINDOW_SLACK;
        eprintln!(
            "async flush, flush_interval_ms {interval_ms}: {ASYNC_ROUNDS_PER_INTERVAL} kill -9 rounds, {acked_total} acknowledged, {lost_total} lost, oldest lost acknowledgement {} ms before the kill",
            oldest_lost.as_millis()
        );
        report.push((interval_ms, acked_total, lost_total, oldest_lost));
        assert!(
            oldest_lost <= bound,
            "async flush with flush_interval_ms {interval_ms}: a message acknowledged {} ms before the kill was lost, more than the flush interval plus {} ms",
            oldest_lost.as_millis(),
            ASYNC_WINDOW_SLACK.as_millis()
        );
        cluster.broker.stop();
        assert_verify_clean(
            dir.path(),
            &format!("after async kill -9 rounds at {interval_ms} ms"),
        );
    }
    eprintln!("async flush loss window (interval ms, acknowledged, lost, oldest lost): {report:?}");
}
