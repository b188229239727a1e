//! Fuzzes the network shard's check of a producer's run of records (`check_run`, the
//! `SendRecordsRequest` path, docs/protocol.md): the bytes of a run come straight from the wire,
//! and a run that passes is copied into the CommitLog without being parsed again.
//!
//! Input: one control byte, then the run.
//! - bit 0: the broker's store host is IPv6;
//! - bits 1-2: max records 1, 2, 16 or 1,024;
//! - bits 3-4: max body 0, 64, 4,096 or 4 MiB bytes;
//! - bit 5: before the check, the target gives every record whose structure parses a correct
//!   body CRC and producer-part CRC (the fuzzer rarely guesses CRCs);
//! - bit 6: the request names another topic than the first record.
//!
//! What must hold for any input:
//! - `check_run` never panics;
//! - on success, the records it reported tile the run from its first byte to its last, there are
//!   no more than the limit, and each one, once the storage shard's fields are written into it
//!   (`patch_record`), is a record the CommitLog decoder accepts with both CRCs, the request's
//!   topic, a body within the limit, a plain send's sys flag, no property only the broker may
//!   set, the reported tags, keys and unique id, and the patched store host; the client reads it
//!   too;
//! - on failure, the records reported before it are exactly those before the failing one;
//! - checked in pieces as it would arrive (`RunChecker`), the run gives the same outcome and
//!   reports the same records.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use shardmq_codec::{
    check_run, decode_message, RunChecker, patch_record, record_crc, RecordView, RunError, RunRecord, RunRules,
    StorePatch, CRC_TRAILER_BYTES, SYS_FLAG_BORN_HOST_V6, SYS_FLAG_COMPRESSED, SYS_FLAG_MULTI_TAGS,
    SYS_FLAG_STORE_HOST_V6,
};
use std::net::SocketAddr;

/// Names only the broker sets (a subset of the broker's list is enough: the check treats every
/// name in the list alike).
const RESERVED: &[&str] = &["DELAY", "WAIT", "REAL_TOPIC", "RECONSUME_TIME"];
const OTHER_TOPIC: &str = "AnotherTopic";

fuzz_target!(|data: &[u8]| {
    let Some((&control, run)) = data.split_first() else {
        return;
    };
    let store_host_is_v6 = control & 1 != 0;
    let max_records = [1, 2, 16, 1024][usize::from((control >> 1) & 3)];
    let max_body_bytes = [0, 64, 4096, 4 << 20][usize::from((control >> 3) & 3)];
    let mut run = run.to_vec();
    if control & 0x20 != 0 {
        fix_crcs(&mut run);
    }
    let first_topic = RecordView::parse_unchecked(&run).ok().and_then(|view| {
        std::str::from_utf8(view.topic_bytes())
            .ok()
            .map(str::to_owned)
    });
    let topic = match first_topic {
        Some(topic) if control & 0x40 == 0 => topic,
        _ => OTHER_TOPIC.to_owned(),
    };
    let rules = RunRules {
        topic: &topic,
        max_body_bytes,
        max_records,
        store_host_is_v6,
        reserved_properties: RESERVED,
    };
    let mut reported: Vec<RunRecord<'_>> = Vec::new();
    let whole = check_run(&run, &rules, |record| reported.push(record));
    // Checked as it arrives (in pieces of 1 to 128 bytes, bit 7 choosing the small end), the
    // run gives exactly what the whole check gives.
    let piece = if control & 0x80 != 0 { 1 + run.len() % 7 } else { 1 + run.len() % 128 };
    let mut checker = RunChecker::default();
    let mut in_pieces: Vec<RunRecord<'_>> = Vec::new();
    let mut arrived = 0;
    let mut outcome = Ok(());
    while arrived < run.len() && outcome.is_ok() {
        arrived = (arrived + piece).min(run.len());
        outcome = checker.check_arrived(&run[..arrived], run.len(), &rules, |r| in_pieces.push(r));
    }
    let outcome = outcome.and_then(|()| checker.finish(run.len()));
    assert_eq!(outcome, whole, "checked in pieces, the run gives another outcome");
    assert_eq!(in_pieces, reported, "checked in pieces, other records are reported");
    match whole {
        Ok(count) => {
            assert_eq!(
                count,
                reported.len(),
                "the count is not the records reported"
            );
            assert!(count <= max_records, "more records than the limit");
            let mut at = 0;
            for record in &reported {
                assert_eq!(record.at, at, "records do not follow each other");
                at += record.len as usize;
            }
            assert_eq!(at, run.len(), "the records do not cover the run");
            for (index, record) in reported.iter().enumerate() {
                check_accepted(&run, record, index, &rules);
            }
        }
        Err(error) => {
            let failing = match error {
                RunError::Empty => {
                    assert!(run.is_empty(), "a run with bytes called empty");
                    0
                }
                RunError::TooManyRecords { limit } => {
                    assert_eq!(limit, max_records);
                    limit
                }
                RunError::Record { index, at, .. } => {
                    let before_end = reported.last().map_or(0, |r| r.at + r.len as usize);
                    assert_eq!(at, before_end, "the failing record's position");
                    index
                }
                RunError::BodyTooLarge { index, len, limit } => {
                    assert!(len > limit && limit == max_body_bytes);
                    index
                }
                RunError::TopicMismatch { index, .. }
                | RunError::ReservedProperty { index, .. }
                | RunError::Malformed { index, .. } => index,
            };
            assert_eq!(
                reported.len(),
                failing,
                "records reported past the failing one ({error})"
            );
        }
    }
});

/// What an accepted record promises, checked on a patched copy.
fn check_accepted(run: &[u8], record: &RunRecord<'_>, index: usize, rules: &RunRules<'_>) {
    let bytes = &run[record.at..record.at + record.len as usize];
    for slice in [record.tags, record.keys, record.unique_key]
        .into_iter()
        .flatten()
    {
        let range = bytes.as_ptr_range();
        assert!(
            range.start <= slice.as_ptr() && slice.as_bytes().as_ptr_range().end <= range.end,
            "a reported property is not a slice of its record"
        );
    }
    let store_host: SocketAddr = if rules.store_host_is_v6 {
        "[fd00::7]:10911".parse().unwrap()
    } else {
        "10.9.8.7:10911".parse().unwrap()
    };
    let mut stored = bytes.to_vec();
    patch_record(
        &mut stored,
        StorePatch {
            queue_id: index as u32 % 8,
            queue_offset: index as u64,
            physical_offset: 1 << 30 | record.at as u64,
            store_timestamp_ms: 1_700_000_000_123,
            store_host: Some(store_host),
        },
    );
    let view = decode_message(&stored).unwrap_or_else(|error| {
        panic!("record {index} passed the run check but not the CommitLog decoder: {error}")
    });
    view.check_crcs().expect("both CRCs hold");
    assert_eq!(view.total_size(), record.len);
    assert_eq!(view.body().len(), record.body_len as usize);
    assert!(view.body().len() <= rules.max_body_bytes);
    assert_eq!(view.topic_bytes(), rules.topic.as_bytes());
    let send_flags =
        SYS_FLAG_COMPRESSED | SYS_FLAG_MULTI_TAGS | SYS_FLAG_BORN_HOST_V6 | SYS_FLAG_STORE_HOST_V6;
    assert_eq!(
        view.sys_flag() & !send_flags,
        0,
        "a sys flag a send may not set"
    );
    assert_eq!(view.reconsume_times(), 0);
    assert_eq!(view.prepared_transaction_offset(), 0);
    assert_eq!(view.store_host(), store_host);
    assert_eq!(view.queue_id(), index as u32 % 8);
    assert_eq!(view.tags(), record.tags);
    assert_eq!(view.unique_key(), record.unique_key);
    assert_eq!(view.property("KEYS"), record.keys);
    if let Some(keys) = record.keys {
        assert!(keys.split(' ').all(|key| !key.is_empty()));
    }
    for (name, _) in view.properties() {
        assert!(
            !RESERVED.contains(&name),
            "a broker-only property passed: {name}"
        );
    }
    let messages = shardmq_client::decode_records(&Bytes::from(stored.clone()), "fuzz")
        .unwrap_or_else(|error| {
            panic!("the client refuses a record the broker would store: {error}")
        });
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].topic(), rules.topic);
}

/// Gives each record whose structure parses, in order, a correct body CRC and the producer
/// part's CRC in its digits, as an honest producer would; stops at the first that does not parse.
fn fix_crcs(run: &mut [u8]) {
    let mut at = 0;
    while at < run.len() {
        let Ok(view) = RecordView::parse_unchecked(&run[at..]) else {
            return;
        };
        let total = view.total_size() as usize;
        if view.properties_bytes().len() < CRC_TRAILER_BYTES {
            return;
        }
        let body_crc = crc32fast::hash(view.body());
        let record = &mut run[at..at + total];
        record[8..12].copy_from_slice(&body_crc.to_be_bytes());
        // The digits hold the producer part's CRC: the whole-record CRC without the storage
        // fields' share (they are XORed together, docs/storage-format.md §4.5).
        let crc = record_crc(record) ^ store_fields_crc(record);
        record[total - CRC_TRAILER_BYTES..total - 1]
            .copy_from_slice(format!("{crc:010}").as_bytes());
        at += total;
    }
}

/// CRC32 of the fields the storage shard writes (queue id, queue and physical offsets, store
/// timestamp and host), from the layout in docs/storage-format.md §2.
fn store_fields_crc(record: &[u8]) -> u32 {
    let sys_flag = u32::from_be_bytes(record[36..40].try_into().unwrap());
    let born_host_len = if sys_flag & SYS_FLAG_BORN_HOST_V6 != 0 {
        20
    } else {
        8
    };
    let store_host_len = if sys_flag & SYS_FLAG_STORE_HOST_V6 != 0 {
        20
    } else {
        8
    };
    let store_timestamp_at = 48 + born_host_len;
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&record[12..16]);
    hasher.update(&record[20..36]);
    hasher.update(&record[store_timestamp_at..store_timestamp_at + 8 + store_host_len]);
    hasher.finalize()
}
