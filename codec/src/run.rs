//! The network shard's check of a run of records a producer encoded itself (a
//! `SendRecordsRequest`, `docs/protocol.md`): one pass over the bytes, nothing allocated, and a
//! record that passes is one the storage shard can copy and patch without reading it again.
//!
//! For each record, in order: its total size is bounded (at least the smallest record, within
//! the run, its body within `max_message_bytes`) before anything is read for it; the magic; the
//! length fields add up; the sys flag holds only a plain send's bits and a store host of the
//! broker's address family; reconsume times and prepared offset are zero; the topic is the
//! request's; the properties are UTF-8 `key 0x01 value 0x02` pairs, none of them the broker's
//! own, `TAGS`/`KEYS`/`UNIQ_KEY` well formed, the CRC property last; the body CRC; the producer
//! part's CRC in the digits (§4.5 of `docs/storage-format.md`). What the storage shard and the
//! index need (length, tags, keys, unique id) is handed to `on_record` as slices of the run.

use crate::{
    parse_crc_digits, producer_part_crc, read_u32, RecordError, RecordView, CRC_DIGITS,
    CRC_PROPERTY_BYTES, MESSAGE_MAGIC_CODE, MIN_RECORD_BYTES, NAME_VALUE_SEPARATOR, PROPERTY_CRC32,
    PROPERTY_KEYS, PROPERTY_SEPARATOR, PROPERTY_TAGS, PROPERTY_UNIQUE_KEY, SYS_FLAG_BORN_HOST_V6,
    SYS_FLAG_COMPRESSED, SYS_FLAG_MULTI_TAGS, SYS_FLAG_STORE_HOST_V6,
};

/// What a run must respect; the broker's settings for the request.
#[derive(Debug, Clone, Copy)]
pub struct RunRules<'a> {
    /// The topic every record names (the request's).
    pub topic: &'a str,
    /// Largest body (`max_message_bytes`).
    pub max_body_bytes: usize,
    /// Most records in one run (`max_batch_messages`).
    pub max_records: usize,
    /// Whether the broker's store host is IPv6: a record's store host has its family, so that
    /// the storage shard can write its own over it.
    pub store_host_is_v6: bool,
    /// Property names only the broker sets.
    pub reserved_properties: &'a [&'a str],
}

/// One checked record, as slices of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunRecord<'a> {
    /// Where the record starts in the run.
    pub at: usize,
    pub len: u32,
    /// Length of the record's body.
    pub body_len: u32,
    pub tags: Option<&'a str>,
    /// The `KEYS` property: keys separated by single spaces.
    pub keys: Option<&'a str>,
    pub unique_key: Option<&'a str>,
}

/// Why a run is refused; nothing of it is stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    #[error("the run holds no record")]
    Empty,
    #[error("the run holds more than {limit} records, over max_batch_messages")]
    TooManyRecords { limit: usize },
    #[error("record {index} (byte {at} of the run): {error}")]
    Record {
        index: usize,
        at: usize,
        error: RecordError,
    },
    #[error("record {index}: body is {len} bytes, over max_message_bytes ({limit})")]
    BodyTooLarge {
        index: usize,
        len: usize,
        limit: usize,
    },
    #[error("record {index}: it names another topic than the request ({topic})")]
    TopicMismatch { index: usize, topic: String },
    #[error("record {index}: property `{name}` is the broker's own; a producer may not set it")]
    ReservedProperty { index: usize, name: String },
    #[error("record {index}: {what}")]
    Malformed { index: usize, what: &'static str },
}

/// Checks `run` against `rules` (see the module documentation), calling `on_record` for each
/// record in order; returns how many there are. On error no record after the failing one has
/// been reported, and the caller stores nothing.
pub fn check_run<'a>(
    run: &'a [u8],
    rules: &RunRules<'_>,
    on_record: impl FnMut(RunRecord<'a>),
) -> Result<usize, RunError> {
    let mut checker = RunChecker::default();
    checker.check_arrived(run, run.len(), rules, on_record)?;
    checker.finish(run.len())
}

/// [`check_run`] over a run whose bytes arrive in pieces: each call checks the records that
/// have arrived whole since the last, so a receiver can check a large run while the rest of it
/// is still on the wire. Every record is bounded against the whole run's length (known from
/// the frame's head) before anything is read for it, exactly as `check_run` does, and the
/// outcome over any split of the arrivals is the outcome of `check_run` over the whole run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunChecker {
    /// Bytes of the run checked (the start of the next record).
    at: usize,
    /// Records checked.
    index: usize,
}

impl RunChecker {
    /// Bytes of the run checked so far.
    #[must_use]
    pub fn checked_bytes(&self) -> usize {
        self.at
    }

    /// Records checked so far.
    #[must_use]
    pub fn count(&self) -> usize {
        self.index
    }

    /// Checks the records wholly within `arrived` (the first bytes of a run of `run_len` bytes,
    /// the same bytes as at every earlier call, and more) that were not checked before, calling
    /// `on_record` for each in order. A record that has not arrived whole waits for the next
    /// call. On error the run is refused: no record after the failing one is reported.
    pub fn check_arrived<'a>(
        &mut self,
        arrived: &'a [u8],
        run_len: usize,
        rules: &RunRules<'_>,
        mut on_record: impl FnMut(RunRecord<'a>),
    ) -> Result<(), RunError> {
        let arrived = &arrived[..arrived.len().min(run_len)];
        while self.at < arrived.len() {
            let (at, index) = (self.at, self.index);
            if index >= rules.max_records {
                return Err(RunError::TooManyRecords {
                    limit: rules.max_records,
                });
            }
            let in_run = run_len - at;
            let record_error = |error| RunError::Record { index, at, error };
            if in_run < MIN_RECORD_BYTES {
                return Err(record_error(RecordError::Truncated {
                    available: in_run,
                    needed: MIN_RECORD_BYTES,
                }));
            }
            if arrived.len() - at < 4 {
                break;
            }
            let total = read_u32(arrived, at) as usize;
            // Bounded against the whole run before waiting for it to arrive.
            if total < MIN_RECORD_BYTES
                || total > in_run
                || total > crate::max_record_bytes(rules.max_body_bytes)
            {
                return Err(record_error(RecordError::BadTotalSize {
                    total_size: total as u32,
                    available: in_run,
                }));
            }
            if arrived.len() - at < total {
                break;
            }
            let record =
                check_record(&arrived[at..at + total], index, rules).map_err(
                    |error| match error {
                        Checked::Record(error) => record_error(error),
                        Checked::Run(error) => error,
                    },
                )?;
            on_record(RunRecord { at, ..record });
            self.at += total;
            self.index += 1;
        }
        Ok(())
    }

    /// The number of records once the whole run (`run_len` bytes) has been checked.
    pub fn finish(&self, run_len: usize) -> Result<usize, RunError> {
        if run_len == 0 {
            return Err(RunError::Empty);
        }
        assert_eq!(
            self.at, run_len,
            "finish is called after the whole run has been checked"
        );
        Ok(self.index)
    }
}

enum Checked {
    Record(RecordError),
    Run(RunError),
}

impl From<RecordError> for Checked {
    fn from(error: RecordError) -> Self {
        Checked::Record(error)
    }
}

/// The sys flag bits a plain send may carry.
const SEND_SYS_FLAGS: u32 =
    SYS_FLAG_COMPRESSED | SYS_FLAG_MULTI_TAGS | SYS_FLAG_BORN_HOST_V6 | SYS_FLAG_STORE_HOST_V6;

fn check_record<'a>(
    bytes: &'a [u8],
    index: usize,
    rules: &RunRules<'_>,
) -> Result<RunRecord<'a>, Checked> {
    let malformed = |what| Checked::Run(RunError::Malformed { index, what });
    if bytes.len() < MIN_RECORD_BYTES {
        return Err(RecordError::Truncated {
            available: bytes.len(),
            needed: MIN_RECORD_BYTES,
        }
        .into());
    }
    let total = read_u32(bytes, 0) as usize;
    // Bounded before anything is read for it: within the run, and no larger than the largest
    // body allowed can make.
    if total < MIN_RECORD_BYTES
        || total > bytes.len()
        || total > crate::max_record_bytes(rules.max_body_bytes)
    {
        return Err(RecordError::BadTotalSize {
            total_size: total as u32,
            available: bytes.len(),
        }
        .into());
    }
    let magic = read_u32(bytes, 4);
    if magic != MESSAGE_MAGIC_CODE {
        return Err(RecordError::BadMagic(magic).into());
    }
    let view = RecordView::parse_unchecked(&bytes[..total])?;
    let sys_flag = view.sys_flag();
    if sys_flag & !SEND_SYS_FLAGS != 0 {
        return Err(malformed(
            "its sys flag has bits a plain send does not set (transactions use their own request)",
        ));
    }
    if (sys_flag & SYS_FLAG_STORE_HOST_V6 != 0) != rules.store_host_is_v6 {
        return Err(malformed(
            "its store host is not of the broker's address family",
        ));
    }
    if view.reconsume_times() != 0 || view.prepared_transaction_offset() != 0 {
        return Err(malformed(
            "reconsume times and prepared transaction offset must be zero in a send",
        ));
    }
    if view.body().len() > rules.max_body_bytes {
        return Err(Checked::Run(RunError::BodyTooLarge {
            index,
            len: view.body().len(),
            limit: rules.max_body_bytes,
        }));
    }
    if view.topic_bytes() != rules.topic.as_bytes() {
        return Err(Checked::Run(RunError::TopicMismatch {
            index,
            topic: rules.topic.to_owned(),
        }));
    }
    let (tags, keys, unique_key) = check_properties(view.properties_bytes(), index, rules)?;
    let stored_body_crc = view.body_crc();
    let body_crc = crc32fast::hash(view.body());
    if stored_body_crc != body_crc {
        return Err(RecordError::BodyCrc {
            stored: stored_body_crc,
            computed: body_crc,
        }
        .into());
    }
    let properties = view.properties_bytes();
    let digits_at = properties.len() - 1 - CRC_DIGITS;
    let stored = parse_crc_digits(&properties[digits_at..digits_at + CRC_DIGITS])
        .ok_or(RecordError::MissingCrcProperty)?;
    let computed = producer_part_crc(view.bytes(), &view.layout);
    if stored != computed {
        return Err(RecordError::RecordCrc { stored, computed }.into());
    }
    Ok(RunRecord {
        at: 0,
        len: total as u32,
        body_len: view.body().len() as u32,
        tags,
        keys,
        unique_key,
    })
}

/// Where `byte` first occurs in `bytes` (a property: a few dozen bytes, scanned inline).
fn byte_position(bytes: &[u8], byte: u8) -> Option<usize> {
    bytes.iter().position(|&b| b == byte)
}

type IndexedProperties<'a> = (Option<&'a str>, Option<&'a str>, Option<&'a str>);

/// Checks the properties of a record in a run and returns its `TAGS`, `KEYS` and `UNIQ_KEY`.
fn check_properties<'a>(
    properties: &'a [u8],
    index: usize,
    rules: &RunRules<'_>,
) -> Result<IndexedProperties<'a>, Checked> {
    let malformed = |what| Checked::Run(RunError::Malformed { index, what });
    if properties.len() < CRC_PROPERTY_BYTES {
        return Err(RecordError::MissingCrcProperty.into());
    }
    let (user, trailer) = properties.split_at(properties.len() - CRC_PROPERTY_BYTES);
    let key_len = PROPERTY_CRC32.len();
    let is_trailer = &trailer[..key_len] == PROPERTY_CRC32.as_bytes()
        && trailer[key_len] == NAME_VALUE_SEPARATOR
        && trailer[CRC_PROPERTY_BYTES - 1] == PROPERTY_SEPARATOR
        && user.last().is_none_or(|&b| b == PROPERTY_SEPARATOR);
    if !is_trailer {
        return Err(RecordError::MissingCrcProperty.into());
    }
    let text = std::str::from_utf8(user).map_err(|_| RecordError::MalformedProperties)?;
    let (mut tags, mut keys, mut unique_key) = (None, None, None);
    // A byte loop over the pairs: the separators are ASCII, so every cut lands on a character
    // boundary of the validated text (a `str::split` by `char` cost several times more here).
    let mut rest = text;
    while !rest.is_empty() {
        let end = byte_position(rest.as_bytes(), PROPERTY_SEPARATOR).unwrap_or(rest.len());
        let pair = &rest[..end];
        rest = &rest[(end + 1).min(rest.len())..];
        if pair.is_empty() {
            continue;
        }
        let cut = byte_position(pair.as_bytes(), NAME_VALUE_SEPARATOR)
            .ok_or(RecordError::MalformedProperties)?;
        let (key, value) = (&pair[..cut], &pair[cut + 1..]);
        // The three properties every producer sets are matched first; they are the producer's
        // own, never reserved, so only the other names are looked up among the broker's.
        match key {
            PROPERTY_TAGS if tags.is_none() => {
                if value.is_empty() {
                    return Err(malformed("TAGS is empty"));
                }
                tags = Some(value);
            }
            PROPERTY_KEYS if keys.is_none() => {
                if value.is_empty()
                    || value.starts_with(' ')
                    || value.ends_with(' ')
                    || value.contains("  ")
                {
                    return Err(malformed(
                        "KEYS must be non-empty keys separated by single spaces",
                    ));
                }
                keys = Some(value);
            }
            PROPERTY_UNIQUE_KEY if unique_key.is_none() => {
                if value.is_empty() {
                    return Err(malformed("UNIQ_KEY is empty"));
                }
                unique_key = Some(value);
            }
            PROPERTY_TAGS | PROPERTY_KEYS | PROPERTY_UNIQUE_KEY => {
                return Err(malformed("TAGS, KEYS and UNIQ_KEY may appear once each"));
            }
            "" => return Err(malformed("a property has an empty name")),
            _ => {
                if key == PROPERTY_CRC32 || rules.reserved_properties.contains(&key) {
                    return Err(Checked::Run(RunError::ReservedProperty {
                        index,
                        name: key.to_owned(),
                    }));
                }
            }
        }
    }
    Ok((tags, keys, unique_key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RecordBuilder, RecordHeader};
    use bytes::BytesMut;
    use proptest::prelude::*;

    const RESERVED: [&str; 3] = ["DELAY", "REAL_TOPIC", "WAIT"];

    fn rules(topic: &str) -> RunRules<'_> {
        RunRules {
            topic,
            max_body_bytes: 4096,
            max_records: 100,
            store_host_is_v6: false,
            reserved_properties: &RESERVED,
        }
    }

    fn header<'a>(topic: &'a str, body: &'a [u8]) -> RecordHeader<'a> {
        RecordHeader {
            topic,
            queue_id: 0,
            flag: 0,
            body,
            sys_flag: 0,
            born_timestamp_ms: 1_700_000_000_000,
            born_host: "127.0.0.1:40000".parse().unwrap(),
            store_host: "127.0.0.1:10911".parse().unwrap(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        }
    }

    /// A run of `n` records with tags, keys and a unique id each.
    fn run(topic: &str, n: usize) -> BytesMut {
        let mut buf = BytesMut::new();
        for i in 0..n {
            let body = format!("body {i}");
            let mut record =
                RecordBuilder::begin(&mut buf, &header(topic, body.as_bytes())).unwrap();
            record.property("TAGS", "TagA").unwrap();
            record.property("KEYS", &format!("k{i} order-{i}")).unwrap();
            record
                .property_with("UNIQ_KEY", 32, |out| out.fill(b'A' + (i % 26) as u8))
                .unwrap();
            record.property("color", "blue").unwrap();
            record.finish().unwrap();
        }
        buf
    }

    fn check(bytes: &[u8], rules: &RunRules<'_>) -> Result<Vec<RunRecord<'static>>, RunError> {
        let owned: &'static [u8] = Box::leak(bytes.to_vec().into_boxed_slice());
        let mut records = Vec::new();
        check_run(owned, rules, |r| records.push(r))?;
        Ok(records)
    }

    #[test]
    fn a_built_run_is_accepted_with_what_the_index_needs() {
        let bytes = run("Orders", 3);
        let records = check(&bytes, &rules("Orders")).unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(records[0].at, 0);
        assert_eq!(
            records[1].at, records[0].len as usize,
            "records follow each other"
        );
        assert_eq!(records[2].tags, Some("TagA"));
        assert_eq!(records[2].keys, Some("k2 order-2"));
        assert_eq!(
            records[2].unique_key,
            Some("CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC")
        );
    }

    #[test]
    fn the_builder_writes_what_encode_record_writes() {
        let input = crate::RecordInput {
            topic: "T",
            queue_id: 2,
            flag: 5,
            body: b"hello",
            properties: &[("TAGS", "x"), ("a", "b")],
            sys_flag: SYS_FLAG_COMPRESSED,
            born_timestamp_ms: 7,
            born_host: "[::1]:1".parse().unwrap(),
            store_host: "10.0.0.1:2".parse().unwrap(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        };
        let mut encoded = BytesMut::new();
        crate::encode_record(&mut encoded, &input).unwrap();
        let mut built = BytesMut::new();
        let mut record = RecordBuilder::begin(&mut built, &input.header()).unwrap();
        record.property("TAGS", "x").unwrap();
        record.property_with("a", 1, |out| out[0] = b'b').unwrap();
        assert_eq!(record.finish().unwrap() as usize, encoded.len());
        assert_eq!(built, encoded);
    }

    #[test]
    fn a_builder_dropped_on_an_error_leaves_the_buffer_as_it_was() {
        let mut buf = BytesMut::from(&b"before"[..]);
        {
            let mut record = RecordBuilder::begin(&mut buf, &header("T", b"x")).unwrap();
            assert_eq!(
                record.property("bad\u{1}key", "v"),
                Err(RecordError::SeparatorInProperty)
            );
        }
        assert_eq!(&buf[..], b"before");
        let long = "v".repeat(crate::MAX_PROPERTIES_BYTES);
        let mut record = RecordBuilder::begin(&mut buf, &header("T", b"x")).unwrap();
        record.property("k", &long).unwrap();
        assert!(matches!(
            record.finish(),
            Err(RecordError::PropertiesTooLong(_))
        ));
        assert_eq!(&buf[..], b"before");
    }

    fn refused(bytes: &[u8], rules: &RunRules<'_>) -> RunError {
        check(bytes, rules).expect_err("the run must be refused")
    }

    #[test]
    fn malformed_runs_are_refused_with_the_record_named() {
        let good = run("Orders", 2);
        let second = check(&good, &rules("Orders")).unwrap()[1].at;
        // Truncated: the last record is cut.
        let cut = &good[..good.len() - 5];
        assert!(matches!(
            refused(cut, &rules("Orders")),
            RunError::Record { index: 1, .. }
        ));
        // A total size that lies (longer than the run, then shorter than its fields).
        let mut lying = good.clone();
        lying[second..second + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            refused(&lying, &rules("Orders")),
            RunError::Record {
                index: 1,
                error: RecordError::BadTotalSize { .. },
                ..
            }
        ));
        let mut short = good.clone();
        let len = u32::from_be_bytes(good[second..second + 4].try_into().unwrap());
        short[second..second + 4].copy_from_slice(&(len - 3).to_be_bytes());
        assert!(matches!(
            refused(&short, &rules("Orders")),
            RunError::Record { index: 1, .. }
        ));
        // A flipped body byte: the body CRC.
        let mut flipped = good.clone();
        let body_at = second + 88;
        flipped[body_at] ^= 1;
        assert!(matches!(
            refused(&flipped, &rules("Orders")),
            RunError::Record {
                error: RecordError::BodyCrc { .. },
                ..
            }
        ));
        // A flipped flag byte: the record CRC.
        let mut flag = good.clone();
        flag[second + 17] ^= 1;
        assert!(matches!(
            refused(&flag, &rules("Orders")),
            RunError::Record {
                error: RecordError::RecordCrc { .. },
                ..
            }
        ));
        // Another topic than the request's.
        assert!(matches!(
            refused(&good, &rules("Other")),
            RunError::TopicMismatch { index: 0, .. }
        ));
        // Over the body limit, over the record count, empty.
        let mut small = rules("Orders");
        small.max_body_bytes = 3;
        assert!(matches!(
            refused(&good, &small),
            RunError::Record { .. } | RunError::BodyTooLarge { .. }
        ));
        let mut one = rules("Orders");
        one.max_records = 1;
        assert_eq!(refused(&good, &one), RunError::TooManyRecords { limit: 1 });
        assert_eq!(refused(&[], &rules("Orders")), RunError::Empty);
        // A store host of the other family.
        let mut v6 = rules("Orders");
        v6.store_host_is_v6 = true;
        assert!(matches!(refused(&good, &v6), RunError::Malformed { .. }));
    }

    #[test]
    fn reserved_and_malformed_properties_are_refused() {
        let build = |props: &[(&str, &str)]| {
            let mut buf = BytesMut::new();
            let mut record = RecordBuilder::begin(&mut buf, &header("T", b"b")).unwrap();
            for (k, v) in props {
                record.property(k, v).unwrap();
            }
            record.finish().unwrap();
            buf
        };
        assert!(matches!(
            refused(&build(&[("DELAY", "3")]), &rules("T")),
            RunError::ReservedProperty { .. }
        ));
        assert!(matches!(
            refused(&build(&[("__CRC32#", "0000000000")]), &rules("T")),
            RunError::ReservedProperty { .. }
        ));
        for props in [
            &[("KEYS", "a  b")][..],
            &[("KEYS", " a")][..],
            &[("TAGS", "")][..],
            &[("", "v")][..],
            &[("TAGS", "a"), ("TAGS", "b")][..],
        ] {
            assert!(
                matches!(
                    refused(&build(props), &rules("T")),
                    RunError::Malformed { .. }
                ),
                "{props:?}"
            );
        }
        // A transaction flag or a reconsume count has no place in a plain send.
        let mut buf = BytesMut::new();
        let mut half = header("T", b"b");
        half.sys_flag = crate::SYS_FLAG_TRANSACTION_PREPARED;
        RecordBuilder::begin(&mut buf, &half)
            .unwrap()
            .finish()
            .unwrap();
        assert!(matches!(
            refused(&buf, &rules("T")),
            RunError::Malformed { .. }
        ));
        let mut buf = BytesMut::new();
        let mut retried = header("T", b"b");
        retried.reconsume_times = 1;
        RecordBuilder::begin(&mut buf, &retried)
            .unwrap()
            .finish()
            .unwrap();
        assert!(matches!(
            refused(&buf, &rules("T")),
            RunError::Malformed { .. }
        ));
    }

    #[test]
    fn a_checked_and_patched_record_decodes_with_both_crcs() {
        let mut bytes = run("Orders", 1);
        check(&bytes, &rules("Orders")).unwrap();
        crate::patch_record(
            &mut bytes,
            crate::StorePatch {
                queue_id: 4,
                queue_offset: 17,
                physical_offset: 4096,
                store_timestamp_ms: 1_700_000_000_001,
                store_host: Some("10.1.1.1:10911".parse().unwrap()),
            },
        );
        let view = crate::decode_message(&bytes).unwrap();
        assert_eq!(view.queue_id(), 4);
        assert_eq!(view.store_host(), "10.1.1.1:10911".parse().unwrap());
        // The record CRC leaves the body to the body CRC: a body flip passes the record check
        // alone and is caught by the full check.
        let view_at = bytes.clone();
        let mut damaged = view_at;
        damaged[88] ^= 1;
        let damaged_view = RecordView::parse_unchecked(&damaged).unwrap();
        assert!(damaged_view.check_record_crc().is_ok());
        assert!(matches!(
            damaged_view.check_crcs(),
            Err(RecordError::BodyCrc { .. })
        ));
    }

    proptest! {
        /// Whatever a producer can build is accepted whole, and any single flipped byte is
        /// refused (or, in the storage fields the storage shard overwrites, harmless).
        #[test]
        fn built_runs_pass_and_flips_are_refused(
            bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..600), 1..8),
            props in proptest::collection::vec(("[a-z]{1,8}", "[ -~]{0,30}"), 0..4),
            flip in any::<proptest::sample::Index>(),
            bit in 0u8..8,
        ) {
            let mut buf = BytesMut::new();
            for body in &bodies {
                let mut record = RecordBuilder::begin(&mut buf, &header("Topic", body)).unwrap();
                for (k, v) in &props {
                    record.property(k, v).unwrap();
                }
                record.finish().unwrap();
            }
            let records = check(&buf, &rules("Topic")).unwrap();
            prop_assert_eq!(records.len(), bodies.len());
            let at = flip.index(buf.len());
            let mut damaged = buf.clone();
            damaged[at] ^= 1 << bit;
            if let Ok(found) = check(&damaged, &rules("Topic")) {
                // Only the fields the storage shard writes over may be flipped unnoticed.
                let record = found.iter().find(|r| r.at <= at && at < r.at + r.len as usize).unwrap();
                let offset = at - record.at;
                let storage = (12..16).contains(&offset) || (20..36).contains(&offset) || (56..72).contains(&offset);
                prop_assert!(storage, "flip at {} (offset {} of its record) went unnoticed", at, offset);
            }
        }

        /// Checked in pieces as they arrive, a run (whole, damaged or cut short) gives exactly
        /// what `check_run` gives over the whole of it: the same records, or the same refusal.
        #[test]
        fn a_run_checked_as_it_arrives_is_checked_as_a_whole(
            bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..600), 1..8),
            cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..6),
            flip in proptest::option::of((any::<proptest::sample::Index>(), 0u8..8)),
            shorter_by in 0usize..3,
        ) {
            let mut buf = BytesMut::new();
            for (i, body) in bodies.iter().enumerate() {
                let mut record = RecordBuilder::begin(&mut buf, &header("Topic", body)).unwrap();
                record.property("KEYS", &format!("k{i}")).unwrap();
                record.finish().unwrap();
            }
            if let Some((at, bit)) = flip {
                let at = at.index(buf.len());
                buf[at] ^= 1 << bit;
            }
            let run = &buf[..buf.len() - shorter_by.min(buf.len() - 1)];
            let rules = RunRules { max_records: 5, ..rules("Topic") };
            let mut whole = Vec::new();
            let expected = check_run(run, &rules, |r| whole.push(r));
            let mut arrivals: Vec<usize> = cuts.iter().map(|c| c.index(run.len() + 1)).collect();
            arrivals.sort_unstable();
            arrivals.push(run.len());
            let mut checker = RunChecker::default();
            let mut pieces = Vec::new();
            let mut outcome = Ok(());
            for arrived in arrivals {
                outcome = checker.check_arrived(&run[..arrived], run.len(), &rules, |r| pieces.push(r));
                if outcome.is_err() {
                    break;
                }
            }
            let outcome = outcome.and_then(|()| checker.finish(run.len()));
            prop_assert_eq!(outcome, expected);
            prop_assert_eq!(pieces, whole);
        }

        #[test]
        fn garbage_runs_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
            let _ = check(&bytes, &rules("T"));
        }
    }
}
