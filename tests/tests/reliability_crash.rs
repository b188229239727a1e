//! Reliability suite, crashes: the real broker killed with SIGKILL while producers (the client
//! library's `Producer`, one per thread) send, over and over, then restarted on the same data
//! directory.
//!
//! - Sync and async flush, 20 rounds each: every message a send acknowledged OK in any round is there after
//!   every later restart, at the queue offset its send result named, with its body intact and
//!   both CRCs matching (every pulled record goes through the broker's `decode_message`, which
//!   checks the body CRC and the `__CRC32#` whole-record CRC); nothing appears that was not
//!   sent, nothing appears twice, and only a batch whose send was cut by the kill may or may not
//!   be there. `verify` is clean at the end.
//!   Under async flush the broker acknowledges once the O_DIRECT write holding a message has
//!   completed, so a crash of the process loses nothing even though the `fdatasync` (every
//!   `flush_interval_ms`, 10 s here) has not happened yet.
//!
//! The kill moment is chosen by a seeded generator; each test prints its seed, and
//! `SHARDMQ_TEST_SEED=<seed>` replays it. Needs the binaries: `cargo build --workspace --bins`.

mod reliability_support;

use std::collections::{BTreeMap, HashSet};
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

/// Rounds of each kill -9 test; `SHARDMQ_CRASH_ROUNDS` raises it (`scripts/crash-rounds.sh`).
fn crash_rounds() -> usize {
    std::env::var("SHARDMQ_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

#[test]
fn every_message_acknowledged_in_20_kill_9_rounds_under_sync_flush_survives_intact() {
    kill_9_rounds_lose_no_acknowledged_message("SyncCrash", &["--flush", "sync"]);
}

/// Async flush acknowledges a send once its O_DIRECT write has completed; the `fdatasync` may
/// come up to `flush_interval_ms` later. With a long interval nearly every acknowledged message
/// is unsynced at the kill, and a crash of the process must still lose none of them.
#[test]
fn every_message_acknowledged_in_20_kill_9_rounds_under_async_flush_survives_intact() {
    kill_9_rounds_lose_no_acknowledged_message(
        "AsyncCrash",
        &["--flush", "async", "--flush-interval-ms", "10000"],
    );
}

fn kill_9_rounds_lose_no_acknowledged_message(topic: &'static str, flush_args: &[&str]) {
    let rounds = crash_rounds();
    let mut rng = Rng::for_test(topic);
    let dir = temp_dir();
    let mut broker_args = TWO_STORAGE_SHARDS.to_vec();
    broker_args.extend(flush_args);
    let mut cluster = LocalCluster::start_with_broker_args(dir.path(), &broker_args);
    cluster.create_topic(topic, QUEUES);

    // What must be in each queue from now on: (queue, offset) → body. Messages acknowledged
    // SEND_OK, and messages in doubt that a restart showed to be stored.
    let mut kept: BTreeMap<(u32, u64), Vec<u8>> = BTreeMap::new();
    let mut total_acked = 0usize;
    let mut total_in_doubt_kept = 0usize;
    let started = Instant::now();
    for round in 0..rounds {
        let kill_after_acks = usize::try_from(rng.in_range(1..=250)).unwrap();
        let (log, _) = produce_then_kill(&mut cluster, topic, round, &mut rng, &|log, _| {
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
        let stored = stored_queues(&cluster, topic);
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
                "round {round}: message {queue_id}/{queue_offset} ({:?}), acknowledged SEND_OK (or seen after an earlier restart), is missing after kill -9 and restart",
                String::from_utf8_lossy(&body[..body.len().min(40)])
            );
        }
    }
    eprintln!(
        "{flush_args:?}: {rounds} kill -9 rounds in {:.1} s, {total_acked} messages acknowledged and all kept, {total_in_doubt_kept} in-doubt messages found stored",
        started.elapsed().as_secs_f64()
    );

    cluster.broker.stop();
    assert_verify_clean(dir.path(), &format!("after {rounds} kill -9 rounds"));
}
