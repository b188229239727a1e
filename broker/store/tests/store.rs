//! Storage engine behaviour through the public `MessageStore` API on a real glommio executor
//! and real files: append/read round trips, rollover, filters, lookups, restart, retention,
//! back-pressure and derived-file rebuilds.

mod common;

use common::*;
use shardmq_store::record::{decode_message, MESSAGE_MAGIC_CODE};
use shardmq_store::verify::verify_data_dir;
use shardmq_store::{AppendStatus, FlushMode, GetStatus, MessageStore, StoreError, TagFilter};

const TOPICS: [&str; 3] = ["orders", "payments", "%RETRY%group-a"];

async fn fill(store: &MessageStore, per_queue: u64) {
    for seq in 0..per_queue {
        for topic in TOPICS {
            for queue_id in 0..4u32 {
                let len = 50 + ((seq * 37 + u64::from(queue_id) * 11) % 900) as usize;
                let outcome = store
                    .append(batch(topic, queue_id, &[plain(topic, queue_id, seq, len)]))
                    .await
                    .unwrap();
                assert_eq!(outcome.status, AppendStatus::Ok);
                assert_eq!(
                    outcome.records[0].queue_offset, seq,
                    "queue offsets are dense per queue"
                );
            }
        }
    }
}

async fn check_all(store: &MessageStore, per_queue: u64) {
    for topic in TOPICS {
        for queue_id in 0..4u32 {
            let bodies = read_all(store, topic, queue_id, 0).await;
            assert_eq!(
                bodies.len() as u64,
                per_queue,
                "{topic}/{queue_id} message count"
            );
            for (seq, body) in bodies.iter().enumerate() {
                let len = 50 + ((seq as u64 * 37 + u64::from(queue_id) * 11) % 900) as usize;
                assert_eq!(
                    body,
                    &body_for(topic, queue_id, seq as u64, len),
                    "{topic}/{queue_id} message {seq}"
                );
            }
        }
    }
}

fn round_trip(flush_mode: FlushMode) {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path(), flush_mode);
    run(|| async move {
        let (store, _) = MessageStore::open(config.clone()).await.unwrap();
        fill(&store, 60).await;
        check_all(&store, 60).await;
        let (_, write, _) = store.commitlog_offsets();
        assert!(
            write > 4 * config.segment_bytes,
            "the test must span several segments"
        );
        store.close().await.unwrap();

        let (store, report) = MessageStore::open(config).await.unwrap();
        assert!(
            report.commitlog.truncated_at.is_none(),
            "clean shutdown leaves nothing to cut"
        );
        check_all(&store, 60).await;
        // Writable again after reopen, continuing the queue offsets.
        let outcome = store
            .append(batch("orders", 0, &[plain("orders", 0, 60, 100)]))
            .await
            .unwrap();
        assert_eq!(outcome.records[0].queue_offset, 60);
        store.close().await.unwrap();
    });
    let report = verify_data_dir(dir.path()).unwrap();
    assert!(
        report.is_clean(),
        "verify after a clean run: {:?}",
        report.problems
    );
    assert_eq!(report.shards[0].records, 60 * 12 + 1);
}

#[test]
fn round_trip_sync_flush_survives_reopen_across_segments() {
    round_trip(FlushMode::Sync);
}

#[test]
fn round_trip_async_flush_survives_reopen_across_segments() {
    round_trip(FlushMode::Async);
}

#[test]
fn batch_appends_are_contiguous_in_their_queue() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path(), FlushMode::Sync);
    run(|| async move {
        let (store, _) = MessageStore::open(config).await.unwrap();
        let messages: Vec<Msg> = (0..40).map(|seq| plain("batchy", 2, seq, 3000)).collect();
        let outcome = store.append(batch("batchy", 2, &messages)).await.unwrap();
        let offsets: Vec<u64> = outcome.records.iter().map(|r| r.queue_offset).collect();
        assert_eq!(offsets, (0..40).collect::<Vec<_>>());
        // 40 × 3 KiB spans two 64 KiB segments: physical offsets jump at the rollover.
        let segments: std::collections::BTreeSet<u64> = outcome
            .records
            .iter()
            .map(|r| r.physical_offset / (64 << 10))
            .collect();
        assert!(segments.len() >= 2, "batch should roll over: {segments:?}");
        let bodies = read_all(&store, "batchy", 2, 0).await;
        assert_eq!(bodies.len(), 40);
        store.close().await.unwrap();
    });
}

#[test]
fn tag_filter_skips_by_hash_and_advances_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path(), FlushMode::Async);
    run(|| async move {
        let (store, _) = MessageStore::open(config).await.unwrap();
        let tags = ["TagA", "TagB", "TagC"];
        let messages: Vec<Msg> = (0..30)
            .map(|seq| Msg {
                body: body_for("tagged", 0, seq, 64),
                tags: Some(tags[seq as usize % 3].to_string()),
                keys: None,
                unique_id: None,
            })
            .collect();
        store.append(batch("tagged", 0, &messages)).await.unwrap();
        let filter = TagFilter::parse("TagA || TagC");
        let result = store
            .get_messages("tagged", 0, 0, 100, 1 << 20, &filter)
            .await
            .unwrap();
        assert_eq!(result.status, GetStatus::Found);
        assert_eq!(result.records.len(), 20);
        assert!(result
            .records
            .iter()
            .all(|r| decode_message(r).unwrap().tags() != Some("TagB")));
        assert_eq!(result.next_offset, 30);
        let none = store
            .get_messages("tagged", 0, 0, 100, 1 << 20, &TagFilter::parse("TagZ"))
            .await
            .unwrap();
        assert_eq!(none.status, GetStatus::NoMatchedMessage);
        assert_eq!(
            none.next_offset, 30,
            "a fully filtered read still moves the offset on"
        );
        store.close().await.unwrap();
    });
}

#[test]
fn read_statuses_for_offsets_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path(), FlushMode::Async);
    run(|| async move {
        let (store, _) = MessageStore::open(config).await.unwrap();
        let none = store
            .get_messages("nosuch", 0, 0, 10, 1 << 20, &TagFilter::All)
            .await
            .unwrap();
        assert_eq!(none.status, GetStatus::NoMatchedQueue);
        store
            .append(batch("t", 1, &[plain("t", 1, 0, 10), plain("t", 1, 1, 10)]))
            .await
            .unwrap();
        let at_end = store
            .get_messages("t", 1, 2, 10, 1 << 20, &TagFilter::All)
            .await
            .unwrap();
        assert_eq!(at_end.status, GetStatus::NoNewMessage);
        let past = store
            .get_messages("t", 1, 9, 10, 1 << 20, &TagFilter::All)
            .await
            .unwrap();
        assert_eq!(past.status, GetStatus::OffsetOverflow);
        assert_eq!(past.next_offset, 2);
        // max_bytes bounds the answer but always yields at least one message.
        let one = store
            .get_messages("t", 1, 0, 10, 1, &TagFilter::All)
            .await
            .unwrap();
        assert_eq!(one.records.len(), 1);
        assert_eq!(one.next_offset, 1);
        store.close().await.unwrap();
    });
}

#[test]
fn offset_by_time_finds_the_first_message_at_or_after() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path(), FlushMode::Async);
    run(|| async move {
        let (store, _) = MessageStore::open(config).await.unwrap();
        let mut stamps = Vec::new();
        for seq in 0..20 {
            let outcome = store
                .append(batch("timed", 0, &[plain("timed", 0, seq, 30)]))
                .await
                .unwrap();
            stamps.push(outcome.records[0].store_timestamp_ms);
            glommio::timer::sleep(std::time::Duration::from_millis(3)).await;
        }
        for (i, &ts) in stamps.iter().enumerate() {
            let offset = store.offset_by_time("timed", 0, ts).await.unwrap();
            let first_at_ts = stamps.iter().position(|&s| s >= ts).unwrap();
            assert_eq!(offset as usize, first_at_ts, "lookup for message {i}");
        }
        assert_eq!(
            store
                .offset_by_time("timed", 0, stamps[19] + 1)
                .await
                .unwrap(),
            20
        );
        assert_eq!(store.offset_by_time("timed", 0, 0).await.unwrap(), 0);
        store.close().await.unwrap();
    });
}

#[test]
fn query_by_key_and_unique_id_across_index_files_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path(), FlushMode::Async);
    run(|| async move {
        let (store, _) = MessageStore::open(config.clone()).await.unwrap();
        // 150 messages × 2 index entries over files of 100 entries: three index files.
        for seq in 0..150u64 {
            let msg = Msg {
                body: body_for("keyed", (seq % 4) as u32, seq, 40),
                tags: None,
                keys: Some(format!("order-{} customer-{}", seq, seq % 7)),
                unique_id: Some(format!("ID{seq:08}")),
            };
            store
                .append(batch("keyed", (seq % 4) as u32, &[msg]))
                .await
                .unwrap();
        }
        for store in [store.clone(), {
            store.close().await.unwrap();
            MessageStore::open(config.clone()).await.unwrap().0
        }] {
            let hits = store
                .query_by_key("keyed", "order-17", 0, i64::MAX, 10)
                .await
                .unwrap();
            assert_eq!(hits.len(), 1);
            assert_eq!(body_of(&hits[0]), body_for("keyed", 1, 17, 40));
            let customers = store
                .query_by_key("keyed", "customer-3", 0, i64::MAX, 100)
                .await
                .unwrap();
            assert_eq!(customers.len(), (0..150).filter(|s| s % 7 == 3).count());
            let limited = store
                .query_by_key("keyed", "customer-3", 0, i64::MAX, 5)
                .await
                .unwrap();
            assert_eq!(limited.len(), 5, "result count is bounded");
            assert!(store
                .query_by_key("other-topic", "order-17", 0, i64::MAX, 10)
                .await
                .unwrap()
                .is_empty());
            let by_id = store
                .query_by_unique_id("ID00000099", 0, i64::MAX, 10)
                .await
                .unwrap();
            assert_eq!(by_id.len(), 1);
            assert_eq!(body_of(&by_id[0]), body_for("keyed", 3, 99, 40));
            assert!(
                store
                    .query_by_unique_id("ID00000099", 0, 1000, 10)
                    .await
                    .unwrap()
                    .is_empty(),
                "time range bounds"
            );
            let physical = decode_message(&by_id[0]).unwrap().physical_offset();
            assert_eq!(store.read_record_at(physical).await.unwrap(), by_id[0]);
            assert!(store.read_record_at(physical + 1).await.is_err());
        }
    });
}

#[test]
fn an_index_query_looks_at_a_bounded_number_of_entries_newest_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(dir.path(), FlushMode::Async);
    // 150 messages x 2 entries over files of 100: the budget covers the newest 120 entries.
    config.max_index_scan_entries_per_query = 120;
    run(|| async move {
        let (store, _) = MessageStore::open(config.clone()).await.unwrap();
        for seq in 0..150u64 {
            let msg = Msg {
                body: body_for("keyed", 0, seq, 40),
                tags: None,
                keys: Some(format!("order-{seq}")),
                unique_id: Some(format!("ID{seq:08}")),
            };
            store.append(batch("keyed", 0, &[msg])).await.unwrap();
        }
        let newest = store
            .query_by_key("keyed", "order-149", 0, i64::MAX, 10)
            .await
            .unwrap();
        assert_eq!(newest.len(), 1, "the newest entries are within the budget");
        let oldest = store
            .query_by_key("keyed", "order-0", 0, i64::MAX, 10)
            .await
            .unwrap();
        assert!(
            oldest.is_empty(),
            "a query over the whole time range stops at its budget"
        );
        store.close().await.unwrap();
        let mut unbounded = config;
        unbounded.max_index_scan_entries_per_query = 1_000;
        let (store, _) = MessageStore::open(unbounded).await.unwrap();
        let oldest = store
            .query_by_key("keyed", "order-0", 0, i64::MAX, 10)
            .await
            .unwrap();
        assert_eq!(
            oldest.len(),
            1,
            "with room in the budget the oldest entry is found"
        );
    });
}

#[test]
fn records_over_a_lowered_bound_are_refused_not_cut_and_read_again_when_it_is_raised() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(dir.path(), FlushMode::Async);
    config.max_record_bytes = 8192;
    run(|| async move {
        let (store, _) = MessageStore::open(config.clone()).await.unwrap();
        for (seq, len) in [(0, 100), (1, 6000)] {
            store
                .append(batch("sized", 0, &[plain("sized", 0, seq, len)]))
                .await
                .unwrap();
        }
        store.close().await.unwrap();
        let mut lowered = config.clone();
        lowered.max_record_bytes = 4096;
        let (store, _) = MessageStore::open(lowered).await.unwrap();
        let first = store
            .get_messages("sized", 0, 0, 1, 1 << 20, &TagFilter::All)
            .await
            .unwrap();
        assert_eq!(first.records.len(), 1, "the small record is served");
        let big = store
            .get_messages("sized", 0, 1, 1, 1 << 20, &TagFilter::All)
            .await;
        match big {
            Err(StoreError::Corrupt(why)) => assert!(why.contains("max_message_bytes"), "{why}"),
            other => panic!("a record over the lowered bound must be refused, got {other:?}"),
        }
        store.close().await.unwrap();
        let (store, _) = MessageStore::open(config).await.unwrap();
        let big = store
            .get_messages("sized", 0, 1, 1, 1 << 20, &TagFilter::All)
            .await
            .unwrap();
        assert_eq!(body_of(&big.records[0]), body_for("sized", 0, 1, 6000));
    });
}

#[test]
fn sizes_read_at_a_caller_chosen_offset_are_bounded_by_the_largest_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(dir.path(), FlushMode::Async);
    config.max_record_bytes = 4096;
    run(|| async move {
        let (store, _) = MessageStore::open(config).await.unwrap();
        // A body that looks like a record header claiming 20,000 bytes, then enough records
        // after it that the claim fits inside the written log.
        let mut fake = 20_000u32.to_be_bytes().to_vec();
        fake.extend(MESSAGE_MAGIC_CODE.to_be_bytes());
        fake.resize(300, b'f');
        let decoy = Msg {
            body: fake.clone(),
            tags: None,
            keys: None,
            unique_id: None,
        };
        store.append(batch("decoy", 0, &[decoy])).await.unwrap();
        for seq in 0..30 {
            store
                .append(batch("decoy", 0, &[plain("decoy", 0, seq, 1000)]))
                .await
                .unwrap();
        }
        let record = store.read_record_at(0).await.unwrap();
        let inside = record
            .windows(8)
            .position(|w| w == &fake[..8])
            .expect("the decoy body is in its record") as u64;
        match store.read_record_at(inside).await {
            Err(StoreError::RecordTooLarge { size, limit }) => {
                assert_eq!((size, limit), (20_000, 4096));
            }
            other => panic!("an offset inside a body must be refused by size, got {other:?}"),
        }
        // Nothing over the bound is stored either, so everything stored stays readable.
        let too_big = store
            .append(batch("decoy", 0, &[plain("decoy", 0, 99, 4096)]))
            .await;
        assert!(
            matches!(too_big, Err(StoreError::RecordTooLarge { limit: 4096, .. })),
            "{too_big:?}"
        );
    });
}

#[test]
fn retention_deletes_old_segments_and_the_entries_pointing_into_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(dir.path(), FlushMode::Async);
    config.file_reserved_hours = 0;
    config.retention_interval_ms = 3_600_000; // only when asked
    run(|| async move {
        let (store, _) = MessageStore::open(config.clone()).await.unwrap();
        for seq in 0..400 {
            store
                .append(batch("old", 0, &[plain("old", 0, seq, 900)]))
                .await
                .unwrap();
        }
        // Only durable segments are deleted: let the flush loop write them.
        wait_until_durable(&store).await;
        let deleted = store.run_retention().await.unwrap();
        assert!(
            deleted >= 4,
            "expired sealed segments are deleted (got {deleted})"
        );
        let (min_physical, write, _) = store.commitlog_offsets();
        assert!(min_physical > 0 && min_physical < write);
        let (min, max) = store.queue_offsets("old", 0).unwrap();
        assert!(
            min > 0 && max == 400,
            "queue min offset follows retention: {min}..{max}"
        );
        let too_small = store
            .get_messages("old", 0, 0, 10, 1 << 20, &TagFilter::All)
            .await
            .unwrap();
        assert_eq!(too_small.status, GetStatus::OffsetTooSmall);
        assert_eq!(too_small.next_offset, min);
        let rest = read_all(&store, "old", 0, min).await;
        assert_eq!(rest.len() as u64, 400 - min);
        assert_eq!(rest[0], body_for("old", 0, min, 900));
        store.close().await.unwrap();
        let (store, _) = MessageStore::open(config).await.unwrap();
        assert_eq!(
            store.queue_offsets("old", 0),
            Some((min, 400)),
            "reopen keeps the retention state"
        );
        store.close().await.unwrap();
    });
    let report = verify_data_dir(dir.path()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn derived_files_are_rebuilt_from_the_commitlog_when_missing() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path(), FlushMode::Sync);
    run(|| async move {
        let (store, _) = MessageStore::open(config.clone()).await.unwrap();
        fill(&store, 20).await;
        store.close().await.unwrap();
    });
    std::fs::remove_dir_all(dir.path().join("consumequeue")).unwrap();
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    std::fs::remove_file(dir.path().join("checkpoint")).unwrap();
    let config = small_config(dir.path(), FlushMode::Sync);
    run(|| async move {
        let (store, report) = MessageStore::open(config).await.unwrap();
        assert_eq!(report.records_redispatched, 20 * 12);
        check_all(&store, 20).await;
        assert_eq!(
            store
                .query_by_unique_id("nope", 0, i64::MAX, 1)
                .await
                .unwrap()
                .len(),
            0
        );
        store.close().await.unwrap();
    });
    assert!(verify_data_dir(dir.path()).unwrap().is_clean());
}

#[test]
fn a_shard_that_falls_behind_answers_busy_instead_of_queuing() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(dir.path(), FlushMode::Async);
    config.flush_interval_ms = 60_000;
    config.max_unflushed_bytes = 256 << 10;
    run(|| async move {
        let (store, _) = MessageStore::open(config).await.unwrap();
        let mut busy = None;
        for seq in 0..2000 {
            match store
                .append(batch("fast", 0, &[plain("fast", 0, seq, 1000)]))
                .await
            {
                Ok(_) => {}
                Err(e) => {
                    busy = Some((seq, e));
                    break;
                }
            }
        }
        // The early flush at half the limit keeps most appends going; if the disk is slower
        // than this loop the limit must answer Busy, never grow without bound.
        if let Some((seq, e)) = busy {
            assert!(matches!(e, StoreError::Busy { .. }), "got {e}");
            assert!(seq > 100);
        }
        let (_, write, _) = store.commitlog_offsets();
        let written = store.commitlog_written_offset();
        assert!(write - written <= 256 << 10, "unwritten bytes stay bounded");
        store.close().await.unwrap();
    });
}

#[test]
fn oversized_and_malformed_batches_are_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path(), FlushMode::Async);
    run(|| async move {
        let (store, _) = MessageStore::open(config).await.unwrap();
        let too_big = store
            .append(batch("big", 0, &[plain("big", 0, 0, 70_000)]))
            .await;
        assert!(
            matches!(too_big, Err(StoreError::RecordTooLarge { .. })),
            "{too_big:?}"
        );
        // The storage shard trusts the encoder's records but not a batch whose parts disagree.
        let mut broken = batch("ok", 0, &[plain("ok", 0, 0, 10), plain("ok", 0, 1, 10)]);
        let cut = broken.bytes.len() - 1;
        broken.bytes.to_mut().truncate(cut);
        let refused = store.append(broken).await;
        assert!(
            matches!(refused, Err(StoreError::InvalidRecord(_))),
            "{refused:?}"
        );
        let mut bad_topic = batch("ok", 0, &[plain("ok", 0, 0, 10)]);
        bad_topic.topics[0] = "../escape".into();
        assert!(store.append(bad_topic).await.is_err());
        assert_eq!(
            store.queue_offsets("ok", 0).map(|q| q.1).unwrap_or(0),
            0,
            "nothing of a refused batch lands"
        );
        store.close().await.unwrap();
    });
}

/// Without the journal, async flush acknowledges an append only once its O_DIRECT write has
/// completed: the bytes are then in the file (a crash of the process cannot lose them) although
/// no `fdatasync` has run, and the message is visible to readers at that same moment.
#[test]
fn an_async_append_is_in_the_file_when_it_returns_before_any_fdatasync() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(dir.path(), FlushMode::Async);
    config.flush_interval_ms = 600_000;
    config.journal_bytes = 0;
    let shard_dir = dir.path().to_path_buf();
    run(|| async move {
        let (store, _) = MessageStore::open(config).await.unwrap();
        for seq in 0..20u64 {
            let outcome = store
                .append(batch(
                    "acked",
                    0,
                    &[plain("acked", 0, seq, 300 + seq as usize * 97)],
                ))
                .await
                .unwrap();
            assert_eq!(outcome.status, AppendStatus::Ok);
            let record = outcome.records[0];
            let (_, write, synced) = store.commitlog_offsets();
            assert!(
                store.commitlog_written_offset() >= record.physical_offset + u64::from(record.size)
            );
            assert!(
                synced < write,
                "no fdatasync yet under a 10-minute interval"
            );
            // Read the segment file with ordinary (page cache) reads: what a restarted broker
            // would find after a kill -9.
            let segment = std::fs::read_dir(shard_dir.join("commitlog"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| p.file_name().unwrap().to_str().unwrap().len() == 20)
                .unwrap();
            let on_disk = std::fs::read(&segment).unwrap();
            let start = record.physical_offset as usize;
            let stored = &on_disk[start..start + record.size as usize];
            let view = shardmq_store::record::decode_message(stored).unwrap();
            assert_eq!(
                view.body(),
                &body_for("acked", 0, seq, 300 + seq as usize * 97)[..]
            );
            assert_eq!(view.queue_offset(), seq);
            let visible = read_all(&store, "acked", 0, 0).await;
            assert_eq!(visible.len() as u64, seq + 1, "visible once acknowledged");
        }
        store.close().await.unwrap();
    });
}

/// With the journal, async flush acknowledges an append once its bytes are in the journal, a
/// file mapped into memory: in the page cache, where a crash of the process cannot lose them,
/// whether or not their O_DIRECT write has completed. A broker killed while its last writes had
/// not reached the segment (zeros where records should be; the journal's header saying what it
/// held then) gets them back from the journal at the next open; without the journal they would
/// be lost.
#[test]
fn an_async_append_is_in_the_journal_when_it_returns_and_comes_back_after_a_crash() {
    const JOURNAL: u64 = 64 << 10;
    let lost_without_journal = |journal_bytes: u64| -> (usize, u64) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = small_config(dir.path(), FlushMode::Async);
        config.flush_interval_ms = 600_000;
        config.journal_bytes = JOURNAL;
        let shard_dir = dir.path().to_path_buf();
        let body = |seq: u64| body_for("journaled", 0, seq, 200 + seq as usize * 31);
        let cut_at: u64 = run(|| {
            let config = config.clone();
            let shard_dir = shard_dir.clone();
            async move {
                let (store, _) = MessageStore::open(config).await.unwrap();
                let mut cut_at = 0;
                for seq in 0..20u64 {
                    let outcome = store
                        .append(batch(
                            "journaled",
                            0,
                            &[plain("journaled", 0, seq, body(seq).len())],
                        ))
                        .await
                        .unwrap();
                    assert_eq!(outcome.status, AppendStatus::Ok);
                    let record = outcome.records[0];
                    if seq == 10 {
                        cut_at = record.physical_offset;
                    }
                    // Acknowledged: in the journal file, read with ordinary (page cache) reads.
                    let journal = std::fs::read(shard_dir.join("journal")).unwrap();
                    let at = 4096 + (record.physical_offset % JOURNAL) as usize;
                    let view = shardmq_store::record::decode_message(
                        &journal[at..at + record.size as usize],
                    )
                    .unwrap();
                    assert_eq!(view.body(), &body(seq)[..]);
                    assert_eq!(view.physical_offset(), record.physical_offset);
                }
                // Killed: no close (the executor and its tasks end here).
                cut_at
            }
        });
        // The kill came while the writes from record 10 on (at the latest) had not reached the
        // segment: the journal then vouched for everything from there (its header's start) and
        // the segment held zeros. (Often no write has completed at all by the time the
        // executor ends; then there is no segment file yet.)
        {
            use std::os::unix::fs::FileExt;
            let journal = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(shard_dir.join("journal"))
                .unwrap();
            let mut start = [0u8; 8];
            journal.read_exact_at(&mut start, 24).unwrap();
            let start = u64::from_be_bytes(start).min(cut_at);
            journal.write_all_at(&start.to_be_bytes(), 24).unwrap();
            let segment = std::fs::read_dir(shard_dir.join("commitlog"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| p.file_name().unwrap().to_str().unwrap().len() == 20);
            if let Some(segment) = segment {
                let mut bytes = std::fs::read(&segment).unwrap();
                for byte in bytes.iter_mut().skip(start as usize) {
                    *byte = 0;
                }
                std::fs::write(&segment, &bytes).unwrap();
            }
        }
        config.journal_bytes = journal_bytes;
        let (count, replayed) = run(|| async move {
            let (store, report) = MessageStore::open(config).await.unwrap();
            let bodies = read_all(&store, "journaled", 0, 0).await;
            for (seq, stored) in bodies.iter().enumerate() {
                assert_eq!(stored, &body(seq as u64));
            }
            store.close().await.unwrap();
            (bodies.len(), report.replayed_from_journal)
        });
        let report = verify_data_dir(dir.path()).unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
        (count, replayed)
    };
    let (count, replayed) = lost_without_journal(JOURNAL);
    assert_eq!(count, 20, "every acknowledged record is back");
    assert!(replayed > 0);
    // Opened without its journal, the same log keeps only what reached the segment.
    let (count, replayed) = lost_without_journal(0);
    assert!(count <= 10, "{count} records survived without the journal");
    assert_eq!(replayed, 0);
}
