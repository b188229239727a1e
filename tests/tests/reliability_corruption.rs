//! Reliability suite, torn and corrupt files: the real broker is stopped (cleanly or with
//! SIGKILL), its files are cut or have bytes flipped, and it is started again on them.
//!
//! What must hold each time: the broker starts; it logs what it repaired; every record it
//! serves decodes with both CRCs matching (the broker checks each record's framing and
//! whole-record CRC as it reads it, the test's pulls both CRCs) and is the message that was
//! sent at that place; what it keeps is exactly what the damage
//! allows (every record before a CommitLog cut or a damaged record, none after); sends go on
//! from there; and `shardmq-broker verify` finds the repaired directory clean.
//!
//! Positions and bytes are chosen by a seeded generator; each test prints its seed, and
//! `SHARDMQ_TEST_SEED=<seed>` replays it. Needs the binaries: `cargo build --workspace --bins`.

mod reliability_support;

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use reliability_support::{
    assert_verify_clean, create_topic, log_lines_with, pull_queue, pull_whole_queue, query_by_key,
    send_batch, temp_dir, verify, Rng, StoredRecord,
};
use std::time::{Duration, Instant};

use shardmq_client::{Error as ClientError, MessageExt, MessageQueue, PullConsumer, PullStatus};
use shardmq_tests::{commit_offset, committed_offset, BrokerProcess, NamesrvProcess, TestMessage};

const TOPIC: &str = "Damaged";
const QUEUES: u32 = 4;

/// Sync flush: every acknowledged message is on disk before the damage.
const BROKER_ARGS: [&str; 4] = ["--flush", "sync", "--offsets-persist-interval-ms", "100"];

/// The one storage shard's directory.
fn shard_dir(broker: &BrokerProcess) -> PathBuf {
    broker.data_dir().join("shard-0")
}

/// The CommitLog's first (and, at the default 1 GiB segment size, only) segment.
fn first_segment(broker: &BrokerProcess) -> PathBuf {
    shard_dir(broker)
        .join("commitlog")
        .join(format!("{:020}", 0))
}

/// Every file under `dir`, recursively, sorted.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(next) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Sends `count` messages with unique bodies of random length, each with a key equal to its
/// body's prefix up to `|`, spread over the queues in batches of 1 to 4.
fn send_messages(broker: &BrokerProcess, rng: &mut Rng, tag: &str, count: usize) {
    let mut client = broker.client();
    let mut sent = 0;
    while sent < count {
        let queue_id = i32::try_from(rng.below(QUEUES as usize)).unwrap();
        let batch: Vec<TestMessage> = (0..rng.in_range(1..=4).min((count - sent) as u64))
            .map(|part| {
                let key = format!("{tag}-{sent}-{part}");
                let mut body = format!("{key}|").into_bytes();
                let padding = usize::try_from(rng.in_range(0..=700)).unwrap();
                body.extend(rng.bytes(padding));
                TestMessage::new(body).keys(&[&key])
            })
            .collect();
        sent += batch.len();
        send_batch(&mut client, TOPIC, queue_id, &batch);
    }
}

/// Every record of every queue, by queue.
fn snapshot(broker: &BrokerProcess) -> BTreeMap<u32, Vec<StoredRecord>> {
    let mut client = broker.client();
    (0..QUEUES)
        .map(|queue_id| {
            (
                queue_id,
                pull_whole_queue(&mut client, TOPIC, i32::try_from(queue_id).unwrap()),
            )
        })
        .collect()
}

/// Where the records of `snapshot` end in the CommitLog.
fn data_end(snapshot: &BTreeMap<u32, Vec<StoredRecord>>) -> u64 {
    snapshot
        .values()
        .flatten()
        .map(StoredRecord::end)
        .max()
        .unwrap_or(0)
}

/// Stops the broker: cleanly on even rounds, with SIGKILL on odd ones.
fn stop(broker: &mut BrokerProcess, round: usize) -> &'static str {
    if round.is_multiple_of(2) {
        broker.stop();
        "a clean stop"
    } else {
        broker.kill9();
        "kill -9"
    }
}

/// Asserts that after the restart the queues hold exactly the records of `before` that end
/// at or below `cut` (the rest is gone), and that sends continue right after them. Returns the new
/// snapshot.
fn assert_kept_exactly_before(
    broker: &BrokerProcess,
    before: &BTreeMap<u32, Vec<StoredRecord>>,
    cut: u64,
    what: &str,
) -> BTreeMap<u32, Vec<StoredRecord>> {
    let after = snapshot(broker);
    for (queue_id, records) in before {
        let expected: Vec<&[u8]> = records
            .iter()
            .filter(|record| record.end() <= cut)
            .map(|record| record.body.as_slice())
            .collect();
        let kept: Vec<&[u8]> = after[queue_id]
            .iter()
            .map(|record| record.body.as_slice())
            .collect();
        assert!(
            kept == expected,
            "{what}: queue {queue_id} holds {} messages, expected exactly the {} stored wholly before CommitLog offset {cut}",
            kept.len(),
            expected.len()
        );
    }
    // Service goes on right after what was kept.
    let mut client = broker.client();
    for (queue_id, records) in &after {
        let offsets = send_batch(
            &mut client,
            TOPIC,
            i32::try_from(*queue_id).unwrap(),
            &[TestMessage::new(format!("after {what}"))],
        );
        assert_eq!(
            offsets,
            [records.len() as u64],
            "{what}: a send to queue {queue_id} did not continue right after the kept messages"
        );
    }
    snapshot(broker)
}

fn start_broker(dir: &Path) -> BrokerProcess {
    let broker = BrokerProcess::start(dir, &BROKER_ARGS);
    create_topic(&mut broker.client(), TOPIC, QUEUES);
    broker
}

#[test]
fn commitlog_cut_at_random_offsets_keeps_every_record_before_the_cut_and_none_after() {
    const ROUNDS: usize = 8;
    let mut rng = Rng::for_test("CommitLog tail truncation");
    let dir = temp_dir();
    let mut broker = start_broker(dir.path());
    let mut before = BTreeMap::new();
    for round in 0..ROUNDS {
        let start_of_round = data_end(&before);
        send_messages(&broker, &mut rng, &format!("r{round}"), 60);
        before = snapshot(&broker);
        let end = data_end(&before);
        let how = stop(&mut broker, round);
        // Mostly inside this round's data; sometimes further back.
        let cut = if rng.below(4) == 0 {
            rng.in_range(0..=end - 1)
        } else {
            rng.in_range(start_of_round..=end - 1)
        };
        let segment = first_segment(&broker);
        let bytes_before_cut = std::fs::read(&segment).expect("read the segment");
        // The disk lost its tail: the append journal (page cache) is gone with it, or it
        // would bring back what it held past the cut.
        let journal = segment
            .parent()
            .and_then(|commitlog| commitlog.parent())
            .map(|shard| shard.join("journal"))
            .expect("the shard directory");
        let _ = std::fs::remove_file(journal);
        OpenOptions::new()
            .write(true)
            .open(&segment)
            .and_then(|file| file.set_len(cut))
            .unwrap_or_else(|error| panic!("cutting {}: {error}", segment.display()));
        broker.restart();
        let what = format!("round {round}: after {how} and a cut of the CommitLog at {cut}");

        // A record the cut tore is where recovery cut the log, and it says so (unless what is
        // left of it is all zeros, which reads as the clean end of the data: nothing to cut).
        let torn = before
            .values()
            .flatten()
            .find(|record| record.physical_offset < cut && cut < record.end());
        if let Some(torn) = torn {
            let fragment = &bytes_before_cut
                [usize::try_from(torn.physical_offset).unwrap()..usize::try_from(cut).unwrap()];
            if fragment.iter().any(|&byte| byte != 0) {
                let offset = format!("offset={}", torn.physical_offset);
                assert!(
                    !log_lines_with(&broker, &["CommitLog", "cut", &offset]).is_empty(),
                    "{what}: the broker did not log that it cut the CommitLog at the torn record ({offset})"
                );
            }
        }
        before = assert_kept_exactly_before(&broker, &before, cut, &what);
    }
    broker.stop();
    assert_verify_clean(dir.path(), &format!("after {ROUNDS} CommitLog cuts"));
}

#[test]
fn flipped_commitlog_bytes_cut_the_log_at_the_damaged_record_and_nothing_damaged_is_served() {
    const ROUNDS: usize = 8;
    let mut rng = Rng::for_test("CommitLog byte flips");
    let dir = temp_dir();
    let mut broker = start_broker(dir.path());
    let mut before = BTreeMap::new();
    for round in 0..ROUNDS {
        let start_of_round = data_end(&before);
        send_messages(&broker, &mut rng, &format!("r{round}"), 60);
        before = snapshot(&broker);
        let end = data_end(&before);
        let how = stop(&mut broker, round);
        let segment = first_segment(&broker);
        let mut bytes = std::fs::read(&segment).expect("read the segment");
        let flips: Vec<u64> = (0..rng.in_range(1..=3))
            .map(|_| rng.in_range(start_of_round..=end - 1))
            .collect();
        for &at in &flips {
            bytes[usize::try_from(at).unwrap()] ^= u8::try_from(rng.in_range(1..=255)).unwrap();
        }
        std::fs::write(&segment, &bytes).expect("write the damaged segment");
        let first_damaged = before
            .values()
            .flatten()
            .filter(|record| {
                flips
                    .iter()
                    .any(|&at| record.physical_offset <= at && at < record.end())
            })
            .map(|record| record.physical_offset)
            .min()
            .expect("every flip lands in a record");
        broker.restart();
        let what =
            format!("round {round}: after {how} and flipped bytes at CommitLog offsets {flips:?}");
        let offset = format!("offset={first_damaged}");
        assert!(
            !log_lines_with(&broker, &["CommitLog", "cut", &offset]).is_empty(),
            "{what}: the broker did not log that it cut the CommitLog at the first damaged record ({offset})"
        );
        before = assert_kept_exactly_before(&broker, &before, first_damaged, &what);
    }
    broker.stop();
    assert_verify_clean(
        dir.path(),
        &format!("after {ROUNDS} rounds of CommitLog byte flips"),
    );
}

/// Flips one random byte in each of up to `count` random files of `files`, never at a position
/// `is_excluded` names; returns what it flipped (file, byte).
fn flip_in_files(
    rng: &mut Rng,
    files: &[PathBuf],
    count: usize,
    is_excluded: &dyn Fn(usize) -> bool,
) -> Vec<(PathBuf, u64)> {
    let mut flipped = Vec::new();
    for _ in 0..count {
        let file = &files[rng.below(files.len())];
        let mut bytes = std::fs::read(file).expect("read a file to damage");
        // Only where data is: derived files are zero-padded to 4 KiB blocks.
        let data_len = bytes
            .iter()
            .rposition(|&b| b != 0)
            .map_or(0, |last| last + 1);
        if data_len == 0 {
            continue;
        }
        let at = rng.below(data_len);
        if is_excluded(at) {
            continue;
        }
        bytes[at] ^= u8::try_from(rng.in_range(1..=255)).unwrap();
        std::fs::write(file, &bytes).expect("write the damaged file");
        flipped.push((file.clone(), at as u64));
    }
    flipped
}

#[test]
fn flipped_consume_queue_and_index_bytes_never_make_the_broker_serve_a_wrong_or_corrupt_record() {
    const ROUNDS: usize = 6;
    let mut rng = Rng::for_test("ConsumeQueue and index byte flips");
    for round in 0..ROUNDS {
        let dir = temp_dir();
        let mut broker = start_broker(dir.path());
        send_messages(&broker, &mut rng, &format!("r{round}"), 120);
        let before = snapshot(&broker);
        // A clean stop writes the derived files (a kill -9 may leave none to damage).
        let how = stop(&mut broker, 0);
        let shard = shard_dir(&broker);
        let kind = if round % 2 == 0 {
            "consumequeue"
        } else {
            "index"
        };
        let files = files_under(&shard.join(kind));
        assert!(
            !files.is_empty(),
            "no {kind} files under {}",
            shard.display()
        );
        // Every byte may be hit, the size field of an entry included: a read through an
        // entry checks the record's own size against it, so a wrong size is refused, never
        // served with the next record's bytes.
        let flipped = flip_in_files(&mut rng, &files, 6, &|_| false);
        if kind == "consumequeue" {
            // verify checks every byte of a ConsumeQueue entry against the record it names.
            let (is_clean, _) = verify(dir.path());
            assert!(
                !is_clean,
                "round {round}: verify did not notice flipped bytes in {flipped:?}"
            );
        }
        broker.restart();
        let what = format!("round {round}: after {how} and flipped bytes in {flipped:?}");
        let mut client = broker.client();
        let mut served_total = 0;
        for (queue_id, records) in &before {
            // Each queue serves the messages stored at its offsets, from the first on, then
            // ends or refuses: never a wrong record, never a damaged one (pull_queue checks
            // every record's CRCs and queue offset).
            let (served, end) = pull_queue(&mut client, TOPIC, i32::try_from(*queue_id).unwrap());
            assert!(
                served.len() <= records.len(),
                "{what}: queue {queue_id} serves {} messages, {} were stored",
                served.len(),
                records.len()
            );
            for (served, stored) in served.iter().zip(records) {
                assert!(
                    served.body == stored.body,
                    "{what}: queue {queue_id} offset {} serves another message than the one stored there",
                    served.queue_offset
                );
            }
            if served.len() < records.len() {
                eprintln!(
                    "{what}: queue {queue_id} serves {} of its {} messages, then {end:?}",
                    served.len(),
                    records.len()
                );
            }
            served_total += served.len();
        }
        // A query by key returns the message with that key or nothing.
        let mut query_misses = 0;
        for record in before.values().flatten() {
            let key_end = record
                .body
                .iter()
                .position(|&b| b == b'|')
                .expect("a keyed body");
            let key = std::str::from_utf8(&record.body[..key_end]).expect("a UTF-8 key");
            let found = query_by_key(&mut client, TOPIC, key);
            for found in &found {
                assert!(
                    found.body == record.body,
                    "{what}: a query by key {key} returned another message"
                );
            }
            query_misses += usize::from(found.is_empty());
        }
        drop(client);
        broker.stop();
        let (is_clean, report) = verify(dir.path());
        eprintln!(
            "{what}: {served_total} of 120 messages served, {query_misses} key queries missed; verify after the restart clean: {is_clean}{}",
            if is_clean { String::new() } else { format!("\n{report}") }
        );
    }
}

#[test]
fn a_damaged_consumer_offsets_file_is_moved_aside_and_no_garbage_offset_is_served() {
    const ROUNDS: usize = 4;
    let mut rng = Rng::for_test("consumer offsets byte flips");
    let dir = temp_dir();
    let mut broker = start_broker(dir.path());
    for round in 0..ROUNDS {
        let group = format!("Group{round}");
        let mut client = broker.client();
        let commits: Vec<i64> = (0..QUEUES)
            .map(|_| i64::try_from(rng.in_range(0..=1_000_000)).unwrap())
            .collect();
        for (queue_id, &offset) in commits.iter().enumerate() {
            commit_offset(
                &mut client,
                &group,
                TOPIC,
                i32::try_from(queue_id).unwrap(),
                offset,
            );
        }
        drop(client);
        let how = stop(&mut broker, 0);
        let offsets_file = shard_dir(&broker).join("offsets");
        let flipped = flip_in_files(&mut rng, std::slice::from_ref(&offsets_file), 1, &|_| false);
        broker.restart();
        let what = format!("round {round}: after {how} and flipped bytes in {flipped:?}");
        assert!(
            !log_lines_with(&broker, &["consumer offsets file was damaged"]).is_empty(),
            "{what}: the broker did not log that it set the damaged offsets file aside"
        );
        let aside: Vec<PathBuf> = files_under(&shard_dir(&broker))
            .into_iter()
            .filter(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with("offsets.damaged-"))
            })
            .collect();
        assert!(
            !aside.is_empty(),
            "{what}: the damaged offsets file was not kept aside for the operator"
        );
        let mut client = broker.client();
        for queue_id in 0..QUEUES {
            let served =
                committed_offset(&mut client, &group, TOPIC, i32::try_from(queue_id).unwrap());
            assert_eq!(
                served, None,
                "{what}: queue {queue_id}: the broker served an offset from a damaged file"
            );
        }
        // Commits work again and survive a clean restart.
        commit_offset(&mut client, &group, TOPIC, 0, 42);
        drop(client);
        broker.stop();
        broker.restart();
        assert_eq!(
            committed_offset(&mut broker.client(), &group, TOPIC, 0),
            Some(42),
            "{what}: a commit after the repair did not survive a clean restart"
        );
    }
    broker.stop();
    assert_verify_clean(dir.path(), "after damaged consumer offsets files");
}

/// A stopped broker whose queue 0 holds three messages with bodies `body(0..3)`: the broker,
/// what it stored, and queue 0's first ConsumeQueue file.
fn three_messages_then_stopped(
    dir: &Path,
    body: impl Fn(usize) -> String,
) -> (BrokerProcess, BTreeMap<u32, Vec<StoredRecord>>, PathBuf) {
    let mut broker = start_broker(dir);
    let mut client = broker.client();
    let messages: Vec<TestMessage> = (0..3).map(|i| TestMessage::new(body(i))).collect();
    send_batch(&mut client, TOPIC, 0, &messages);
    drop(client);
    let before = snapshot(&broker);
    broker.stop();
    let file = shard_dir(&broker)
        .join("consumequeue")
        .join(TOPIC)
        .join("0")
        .join("00000000000000000000");
    (broker, before, file)
}

#[test]
fn a_consume_queue_entry_with_a_wrong_size_still_serves_exactly_its_record() {
    let dir = temp_dir();
    let (mut broker, before, file) = three_messages_then_stopped(dir.path(), |i| {
        format!("sized-{i}|{}", "x".repeat(200 + i * 50))
    });
    // Entry 1 of queue 0 claims 300 bytes more than its record, entry 2 claims 40 fewer.
    let mut bytes = std::fs::read(&file).expect("the queue file");
    for (entry, delta) in [(1usize, 300i64), (2, -40)] {
        let at = entry * 20 + 8;
        let size = i64::from(u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()));
        let wrong = u32::try_from(size + delta).unwrap();
        bytes[at..at + 4].copy_from_slice(&wrong.to_be_bytes());
    }
    std::fs::write(&file, &bytes).unwrap();

    broker.restart();
    let (served, end) = pull_queue(&mut broker.client(), TOPIC, 0);
    assert_eq!(end, reliability_support::QueueEnd::End);
    let bodies: Vec<&Vec<u8>> = served.iter().map(|r| &r.body).collect();
    let stored: Vec<&Vec<u8>> = before[&0].iter().map(|r| &r.body).collect();
    assert_eq!(
        bodies, stored,
        "entries with wrong sizes served other bytes than their records"
    );
    assert!(
        !log_lines_with(&broker, &["disagrees with its record"]).is_empty(),
        "the size mismatch is not logged"
    );
}

#[test]
fn a_consume_queue_entry_with_a_size_no_record_can_have_is_rebuilt_from_the_commitlog() {
    let dir = temp_dir();
    let (mut broker, before, file) = three_messages_then_stopped(dir.path(), |i| {
        format!("impossible-{i}|{}", "y".repeat(100))
    });
    // Entry 1 of queue 0 claims 2 GiB: more than any segment holds.
    let mut bytes = std::fs::read(&file).expect("the queue file");
    bytes[28..32].copy_from_slice(&0x7fff_ffffu32.to_be_bytes());
    std::fs::write(&file, &bytes).unwrap();

    broker.restart();
    assert!(
        !log_lines_with(&broker, &["ConsumeQueue is damaged", "no record can be"]).is_empty(),
        "the impossible size was not found when the queue was opened"
    );
    let (served, end) = pull_queue(&mut broker.client(), TOPIC, 0);
    assert_eq!(end, reliability_support::QueueEnd::End);
    let bodies: Vec<&Vec<u8>> = served.iter().map(|r| &r.body).collect();
    let stored: Vec<&Vec<u8>> = before[&0].iter().map(|r| &r.body).collect();
    assert_eq!(bodies, stored, "the rebuilt queue serves other records");
    broker.stop();
    assert_verify_clean(dir.path(), "after an impossible ConsumeQueue entry size");
}

/// Pulls `queue` with the real client from `from` until `until` (exclusive) or a pull fails;
/// the messages pulled, and the error that stopped it, if any.
async fn pull_with_client(
    consumer: &PullConsumer,
    queue: &MessageQueue,
    from: i64,
    until: i64,
) -> (Vec<MessageExt>, Option<ClientError>) {
    let mut messages = Vec::new();
    let mut offset = from;
    let deadline = Instant::now() + Duration::from_secs(30);
    while offset < until {
        match consumer.pull(queue, offset, 16).await {
            Ok(pulled) if pulled.status == PullStatus::Found => {
                offset = pulled.next_begin_offset;
                messages.extend(pulled.messages);
            }
            Ok(pulled) => panic!("{queue}: a pull at {offset} found nothing: {pulled:?}"),
            // The restarted broker's new address may not be routed yet.
            Err(
                ClientError::Connect { .. }
                | ClientError::Io { .. }
                | ClientError::ConnectionClosed { .. }
                | ClientError::Timeout { .. },
            ) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => return (messages, Some(error)),
        }
    }
    (messages, None)
}

/// Bytes damaged on disk after recovery has passed them (a clean stop's checkpoint means the
/// restart does not rescan them) reach no application: the broker checks the framing of every
/// record it reads from disk and refuses a pull that meets a damaged one, naming its offset; a
/// damaged header or body it leaves to the client, whose end-to-end check of both CRCs refuses
/// it (storage-format.md §4.8). Everything around the three damaged records is served.
#[test]
fn a_record_damaged_on_disk_reaches_no_application_its_framing_refused_by_the_broker_the_rest_by_the_client(
) {
    let mut rng = Rng::for_test("damage met by the read path");
    let dir = temp_dir();
    let namesrv = NamesrvProcess::start();
    let namesrv_addr = namesrv.addr().to_string();
    // Small segments: recovery validates whole segments from the one holding the checkpoint,
    // so only damage in an earlier segment is left for the read path to meet.
    const SEGMENT_BYTES: u64 = 128 << 10;
    let segment_bytes = SEGMENT_BYTES.to_string();
    let mut args = BROKER_ARGS.to_vec();
    args.extend([
        "--namesrv",
        &namesrv_addr,
        "--segment-bytes",
        &segment_bytes,
        "--max-message-bytes",
        "8192",
    ]);
    let mut broker = BrokerProcess::start(dir.path(), &args);
    create_topic(&mut broker.client(), TOPIC, QUEUES);
    send_messages(&broker, &mut rng, "d", 1200);
    let records = pull_whole_queue(&mut broker.client(), TOPIC, 0);
    let in_first_segment = records
        .iter()
        .take_while(|record| record.end() <= SEGMENT_BYTES)
        .count();
    assert!(
        in_first_segment >= 20 && records.last().unwrap().end() > 2 * SEGMENT_BYTES,
        "{in_first_segment} of queue 0's {} records in the first of 3 segments or more",
        records.len()
    );
    broker.stop();

    let framing_victim = &records[in_first_segment / 4];
    let header_victim = &records[2 * in_first_segment / 4];
    let body_victim = &records[3 * in_first_segment / 4];
    let segment = first_segment(&broker);
    let mut bytes = std::fs::read(&segment).expect("read the segment");
    // A byte of the magic code (record offset 4..8): not a record any more.
    bytes[usize::try_from(framing_victim.physical_offset + 6).unwrap()] ^= 0x01;
    // The born timestamp's lowest byte (record offset 47): a plausible value, a wrong CRC.
    bytes[usize::try_from(header_victim.physical_offset + 47).unwrap()] ^= 0x01;
    // A byte in the middle of the body (which starts at record offset 88, IPv4 hosts).
    let body_at = body_victim.physical_offset + 88 + body_victim.body.len() as u64 / 2;
    bytes[usize::try_from(body_at).unwrap()] ^= 0x40;
    std::fs::write(&segment, &bytes).expect("write the damaged segment");
    broker.restart();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let consumer = PullConsumer::builder()
            .namesrv(namesrv_addr.as_str())
            .group("damage-readers")
            .build()
            .await
            .expect("a pull consumer");
        let queue = consumer
            .queues(TOPIC)
            .await
            .expect("queues")
            .into_iter()
            .find(|queue| queue.queue_id == 0)
            .expect("queue 0");
        let expect_bodies = |messages: &[MessageExt], from: u64| {
            for message in messages {
                let offset = u64::try_from(message.queue_offset).unwrap();
                let index = usize::try_from(offset).unwrap();
                assert_eq!(
                    (offset >= from, &message.body[..]),
                    (true, &records[index].body[..]),
                    "message {} as sent",
                    message.queue_offset
                );
            }
        };
        let to_i64 = |n: u64| i64::try_from(n).unwrap();

        let (served, error) = pull_with_client(
            &consumer,
            &queue,
            0,
            to_i64(framing_victim.queue_offset + 1),
        )
        .await;
        expect_bodies(&served, 0);
        assert!(
            served
                .iter()
                .all(|m| m.queue_offset < to_i64(framing_victim.queue_offset)),
            "the record with the damaged framing was delivered"
        );
        let error = error.expect("the pull of the damaged framing fails");
        assert!(
            !matches!(error, ClientError::CorruptRecord { .. })
                && error
                    .to_string()
                    .contains(&framing_victim.physical_offset.to_string()),
            "the broker refuses the damaged framing, naming its offset: {error}"
        );

        for (victim, from, check) in [
            (header_victim, framing_victim.queue_offset + 1, "record CRC"),
            (body_victim, header_victim.queue_offset + 1, "body CRC"),
        ] {
            let (served, error) = pull_with_client(
                &consumer,
                &queue,
                to_i64(from),
                to_i64(victim.queue_offset + 1),
            )
            .await;
            expect_bodies(&served, from);
            assert!(
                served
                    .iter()
                    .all(|m| m.queue_offset < to_i64(victim.queue_offset)),
                "the record with the damaged {check} was delivered"
            );
            match error.expect("the pull of the damaged record fails") {
                ClientError::CorruptRecord { reason, .. } => {
                    assert!(reason.contains(check), "{reason}");
                }
                other => panic!("the client refuses the damaged {check}, not the broker: {other}"),
            }
        }

        let from = body_victim.queue_offset + 1;
        let end = to_i64(records.len() as u64);
        let (served, error) = pull_with_client(&consumer, &queue, to_i64(from), end).await;
        assert!(error.is_none(), "after the damage: {error:?}");
        expect_bodies(&served, from);
        assert_eq!(served.len() as u64, records.len() as u64 - from);
    });
    drop(namesrv);
}
