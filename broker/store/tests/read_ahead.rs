//! The read-ahead cache through the public `MessageStore` API: a consumer draining a backlog
//! from segment files finds its next pull's records read already (hits), a pull the cache
//! cannot serve reads for itself (misses), the cache never holds more than `readahead_bytes`
//! (spans held by answers still on their way out included), retention forgets the spans of
//! the segments it deletes, and a damaged record in a span read ahead is refused, never served.

mod common;

use bytes::Bytes;
use common::*;
use shardmq_store::commitlog::list_segments;
use shardmq_store::record::decode_message;
use shardmq_store::{FlushMode, GetStatus, MessageStore, StoreConfig, StoreError, TagFilter};

const TOPIC: &str = "backlog";
const BODY_BYTES: usize = 900;

/// A store with 64 KiB segments whose write ring keeps almost nothing after a restart.
fn config(dir: &std::path::Path, readahead_bytes: u64) -> StoreConfig {
    let mut config = small_config(dir, FlushMode::Async);
    config.readahead_bytes = readahead_bytes;
    config
}

/// Appends `count` messages to queue 0 of [`TOPIC`] and closes the store.
async fn fill(config: &StoreConfig, count: u64) {
    let (store, _) = MessageStore::open(config.clone()).await.unwrap();
    for first in (0..count).step_by(16) {
        let messages: Vec<Msg> = (first..(first + 16).min(count))
            .map(|seq| plain(TOPIC, 0, seq, BODY_BYTES))
            .collect();
        store.append(batch(TOPIC, 0, &messages)).await.unwrap();
    }
    store.close().await.unwrap();
}

/// One pull of up to `max_bytes` from `offset`; the records and where the next pull starts.
async fn pull(store: &MessageStore, offset: u64, max_bytes: u64) -> (Vec<Bytes>, u64) {
    let result = store
        .get_messages(TOPIC, 0, offset, 1024, max_bytes, &TagFilter::All)
        .await
        .expect("a pull");
    assert_eq!(result.status, GetStatus::Found, "at offset {offset}");
    (result.records, result.next_offset)
}

fn check_bodies(records: &[Bytes], first_seq: u64) {
    for (index, record) in records.iter().enumerate() {
        let view = decode_message(record).expect("a served record is valid");
        assert_eq!(
            view.body(),
            &body_for(TOPIC, 0, first_seq + index as u64, BODY_BYTES)[..],
            "message {}",
            first_seq + index as u64
        );
    }
}

#[test]
fn a_drained_backlog_is_read_ahead_so_pulls_after_the_first_hit() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 4 << 20);
    const COUNT: u64 = 2_000;
    run(|| async move {
        fill(&config, COUNT).await;
        // After a restart nothing is in the write ring: every byte comes from the segments.
        let (store, _) = MessageStore::open(config.clone()).await.unwrap();
        let (mut offset, mut pulls) = (0, 0u64);
        while offset < COUNT {
            // 16 KiB pulls: a 64 KiB span read ahead serves about three of them.
            let (records, next) = pull(&store, offset, 16 << 10).await;
            check_bodies(&records, offset);
            offset = next;
            pulls += 1;
        }
        let segments = list_segments(&dir.path().join("commitlog")).unwrap().len() as u64;
        let stats = store.read_ahead_stats();
        eprintln!("{pulls} pulls over {segments} segments: {stats:?}");
        // A span never crosses a segment's end, so a pull that does misses once; every other
        // pull finds its records read ahead (or waits for their read in flight).
        assert!(
            stats.misses <= segments + 1,
            "{} misses for {pulls} pulls over {segments} segments",
            stats.misses
        );
        assert!(stats.hits >= pulls - segments - 1, "{stats:?}");
        assert!(store.read_ahead_bytes() <= 4 << 20);
        store.close().await.unwrap();
    });
}

#[test]
fn the_cache_holds_no_more_than_readahead_bytes_even_while_answers_hold_its_spans() {
    let dir = tempfile::tempdir().unwrap();
    const LIMIT: u64 = 2 << 20;
    let config = config(dir.path(), LIMIT);
    const COUNT: u64 = 4_000;
    run(|| async move {
        fill(&config, COUNT).await;
        let (store, _) = MessageStore::open(config.clone()).await.unwrap();
        // Every answer is kept, as if all were still on their way out: their spans stay
        // pinned, so the cache fills, and pulls then read for themselves.
        let mut answers = Vec::new();
        let mut offset = 0;
        while offset < COUNT {
            let (records, next) = pull(&store, offset, 1 << 20).await;
            check_bodies(&records, offset);
            assert!(
                store.read_ahead_bytes() <= LIMIT,
                "{} bytes cached, over readahead_bytes ({LIMIT})",
                store.read_ahead_bytes()
            );
            answers.push(records);
            offset = next;
        }
        let stats = store.read_ahead_stats();
        assert!(stats.refused > 0, "the bound was reached: {stats:?}");
        drop(answers);
        // Once the answers are gone, their spans' memory is given back.
        let (records, _) = pull(&store, 0, 1 << 20).await;
        drop(records);
        assert!(store.read_ahead_bytes() <= LIMIT);
        store.close().await.unwrap();
    });
}

#[test]
fn no_read_ahead_when_readahead_bytes_is_zero() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 0);
    run(|| async move {
        fill(&config, 500).await;
        let (store, _) = MessageStore::open(config.clone()).await.unwrap();
        let mut offset = 0;
        while offset < 500 {
            let (records, next) = pull(&store, offset, 16 << 10).await;
            check_bodies(&records, offset);
            offset = next;
        }
        let stats = store.read_ahead_stats();
        assert_eq!((stats.hits, stats.reads), (0, 0), "{stats:?}");
        assert_eq!(store.read_ahead_bytes(), 0);
        store.close().await.unwrap();
    });
}

#[test]
fn retention_forgets_the_spans_of_the_segments_it_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), 4 << 20);
    config.file_reserved_hours = 0;
    config.retention_interval_ms = 3_600_000; // only when asked
    const COUNT: u64 = 1_000;
    run(|| async move {
        fill(&config, COUNT).await;
        let (store, _) = MessageStore::open(config.clone()).await.unwrap();
        // Read the oldest part: its spans (and one read ahead) are cached.
        let (records, next) = pull(&store, 0, 64 << 10).await;
        check_bodies(&records, 0);
        drop(records);
        let (records, _) = pull(&store, next, 64 << 10).await;
        drop(records);
        assert!(store.read_ahead_bytes() > 0);
        // A segment whose file a read ahead is opening is kept until the next pass.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut deleted = store.run_retention().await.unwrap();
        while deleted < 4 {
            assert!(
                std::time::Instant::now() < deadline,
                "sealed segments are deleted (got {deleted})"
            );
            glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
            deleted += store.run_retention().await.unwrap();
        }
        let (min_physical, _, _) = store.commitlog_offsets();
        assert!(min_physical > 128 << 10, "more than the cached spans went");
        assert_eq!(
            store.read_ahead_bytes(),
            0,
            "every span lay in a deleted segment"
        );
        // What is left reads correctly, from the new start.
        let (min, max) = store.queue_offsets(TOPIC, 0).unwrap();
        let (records, _) = pull(&store, min, 64 << 10).await;
        check_bodies(&records, min);
        assert_eq!(max, COUNT);
        store.close().await.unwrap();
    });
}

const DAMAGED_COUNT: u64 = 300;
const VICTIM_SEQ: u64 = 150;

/// Where a byte of the victim is flipped.
#[derive(Debug, Clone, Copy)]
enum Damage {
    /// In the middle of its body: its body CRC fails.
    Body,
    /// Its born timestamp's lowest byte (record offset 47): a plausible value, its framing
    /// intact, its whole-record CRC fails.
    Header,
    /// Its topic's length byte, past the body: its head intact, its field lengths no longer
    /// add up to its total size.
    TopicLength,
}

/// Fills a store of [`DAMAGED_COUNT`] messages and flips a byte in the middle of message
/// [`VICTIM_SEQ`]'s body on disk; the victim's (physical offset, size).
fn store_with_a_damaged_body(config: &StoreConfig) -> (u64, u32) {
    store_with_damage(config, Damage::Body)
}

/// Fills a store of [`DAMAGED_COUNT`] messages and flips a byte of message [`VICTIM_SEQ`] on
/// disk where `damage` says; the victim's (physical offset, size).
fn store_with_damage(config: &StoreConfig, damage: Damage) -> (u64, u32) {
    let victim_seq = VICTIM_SEQ;
    // Where message 150 lies, found before damaging it.
    let victim = {
        let config = config.clone();
        run(|| async move {
            fill(&config, DAMAGED_COUNT).await;
            let (store, _) = MessageStore::open(config).await.unwrap();
            let result = store
                .get_messages(TOPIC, 0, victim_seq, 1, 1 << 20, &TagFilter::All)
                .await
                .unwrap();
            let view = decode_message(&result.records[0]).unwrap();
            let topic_length_at =
                view.topic_bytes().as_ptr() as u64 - result.records[0].as_ptr() as u64 - 1;
            let at = (view.physical_offset(), view.total_size(), topic_length_at);
            drop(result);
            store.close().await.unwrap();
            at
        })
    };
    let segments = list_segments(&config.shard_dir.join("commitlog")).unwrap();
    let (segment_base, segment_path) = segments
        .iter()
        .rev()
        .find(|(base, _)| *base <= victim.0)
        .cloned()
        .unwrap();
    let mut bytes = std::fs::read(&segment_path).unwrap();
    let in_record = match damage {
        Damage::Body => u64::from(victim.1) / 2,
        Damage::Header => 47,
        Damage::TopicLength => victim.2,
    };
    bytes[(victim.0 - segment_base + in_record) as usize] ^= 0x01;
    std::fs::write(&segment_path, &bytes).unwrap();
    (victim.0, victim.1)
}

#[test]
fn a_damaged_record_in_a_span_read_ahead_is_refused_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 4 << 20);
    let victim_seq = VICTIM_SEQ;
    let victim = store_with_a_damaged_body(&config);

    run(|| async move {
        let (store, _) = MessageStore::open(config).await.unwrap();
        let mut offset = 0;
        let error = loop {
            // 8 KiB pulls: the damaged record's span was read ahead by an earlier pull.
            match store
                .get_messages(TOPIC, 0, offset, 1024, 8 << 10, &TagFilter::All)
                .await
            {
                Ok(result) => {
                    assert!(
                        result.next_offset <= victim_seq,
                        "the damaged message {victim_seq} was served"
                    );
                    check_bodies(&result.records, offset);
                    offset = result.next_offset;
                }
                Err(error) => break error,
            }
        };
        assert!(matches!(error, StoreError::Corrupt(_)), "{error}");
        assert!(error.to_string().contains(&victim.0.to_string()), "{error}");
        assert!(store.read_ahead_stats().hits > 0, "spans were read ahead");
        store.close().await.unwrap();
    });
}

/// A pull for a client reads each record's head only (that it is the record its ConsumeQueue
/// entry names) and leaves the rest to the client: a record damaged past its head is served,
/// and fails the client's check of its framing and both CRCs; a reader inside the broker
/// (`get_messages`) is refused it, also from the span the client's pull read ahead.
#[test]
fn a_pull_for_a_client_leaves_a_record_damaged_past_its_head_to_the_clients_check() {
    for (damage, expected) in [
        (Damage::Body, "body CRC"),
        (Damage::Header, "record CRC"),
        (Damage::TopicLength, "add up"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path(), 4 << 20);
        let victim = store_with_damage(&config, damage);

        run(|| async move {
            let (store, _) = MessageStore::open(config).await.unwrap();
            let mut offset = 0;
            let mut served = None;
            while offset <= VICTIM_SEQ {
                let result = store
                    .get_messages_for_client(TOPIC, 0, offset, 1024, 8 << 10, &TagFilter::All)
                    .await
                    .expect("a client's pull meets no damaged head");
                if (offset..result.next_offset).contains(&VICTIM_SEQ) {
                    served = Some(result.records[(VICTIM_SEQ - offset) as usize].clone());
                }
                offset = result.next_offset;
            }
            let served = served.expect("the victim was served");
            assert_eq!(served.len(), victim.1 as usize);
            let head = shardmq_store::record::read_head(&served).unwrap();
            assert_eq!(head.physical_offset, victim.0, "the head is intact");
            let error = decode_message(&served).expect_err("the client's check fails");
            assert!(
                error.to_string().contains(expected),
                "{damage:?}: the client's check finds the damage: {error}"
            );
            assert!(store.read_ahead_stats().hits > 0, "spans were read ahead");
            // The victim's span is in the cache now, its head read for a client only.
            let error = store
                .get_messages(TOPIC, 0, VICTIM_SEQ, 1, 1 << 20, &TagFilter::All)
                .await
                .expect_err("a reader inside the broker is refused the damaged record");
            assert!(matches!(error, StoreError::Corrupt(_)), "{error}");
            assert!(error.to_string().contains(&victim.0.to_string()), "{error}");
            store.close().await.unwrap();
        });
    }
}

/// A ConsumeQueue entry that names another record (queue 0's entry 5 changed on disk to name
/// queue 1's message 5, which lies between queue 0's messages 5 and 6, so the queue's offsets
/// still rise and recovery keeps the entry) is refused by the record's head, for a client's
/// pull as for a reader inside the broker: never served as queue 0's message 5.
#[test]
fn a_queue_entry_naming_another_record_is_refused_by_the_record_s_head() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 0);
    {
        let config = config.clone();
        run(|| async move {
            let (store, _) = MessageStore::open(config).await.unwrap();
            for seq in 0..64 {
                for queue in 0..2 {
                    let message = [plain(TOPIC, queue, seq, BODY_BYTES)];
                    store.append(batch(TOPIC, queue, &message)).await.unwrap();
                }
            }
            store.close().await.unwrap();
        });
    }
    let queue_file = |queue: u32| {
        config
            .shard_dir
            .join("consumequeue")
            .join(TOPIC)
            .join(queue.to_string())
            .join(format!("{:020}", 0))
    };
    // Entries are 20 bytes, their CommitLog offset first.
    let fifth = 5 * 20..5 * 20 + 8;
    let other = std::fs::read(queue_file(1)).unwrap()[fifth.clone()].to_vec();
    let mut bytes = std::fs::read(queue_file(0)).unwrap();
    bytes[fifth].copy_from_slice(&other);
    std::fs::write(queue_file(0), &bytes).unwrap();

    run(|| async move {
        let (store, report) = MessageStore::open(config).await.unwrap();
        assert!(
            !report.rebuilt_derived,
            "recovery kept the entry: {report:?}"
        );
        let filter = TagFilter::All;
        for (reader, result) in [
            (
                "a client's pull",
                store
                    .get_messages_for_client(TOPIC, 0, 5, 1, 1 << 20, &filter)
                    .await,
            ),
            (
                "a reader inside the broker",
                store.get_messages(TOPIC, 0, 5, 1, 1 << 20, &filter).await,
            ),
        ] {
            let error = result.expect_err(reader);
            assert!(matches!(error, StoreError::Corrupt(_)), "{reader}: {error}");
            assert!(
                error.to_string().contains("holds another record"),
                "{reader}: {error}"
            );
        }
        // The entries before it still serve their own messages.
        let result = store
            .get_messages_for_client(TOPIC, 0, 0, 5, 1 << 20, &filter)
            .await
            .unwrap();
        assert_eq!(result.records.len(), 5);
        check_bodies(&result.records, 0);
        store.close().await.unwrap();
    });
}
