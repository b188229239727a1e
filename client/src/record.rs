//! Decoding stored CommitLog records, as pull and query responses carry them
//! (docs/storage-format.md §4.2–4.5: RocketMQ's version-1 record, big-endian, with the
//! `__CRC32#` whole-record CRC property last), with the shared codec (`shardmq-codec`, the
//! broker's own).
//!
//! Owns: walking concatenated records by their total size, checking each one's layout and both
//! CRCs (the body CRC, and the whole-record CRC over everything else: one pass over each
//! record, end to end; §4.5), and turning
//! it into a [`MessageExt`] whose body, topic and properties share the response's memory.
//! Never: anything about the broker's files; a record that fails a check is an error, never a
//! message.

use std::sync::Arc;

use bytes::Bytes;
use shardmq_codec::{RecordView, SYS_FLAG_COMPRESSED};

use crate::message::MessageExt;
#[cfg(test)]
use crate::message::{NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR};

pub use shardmq_codec::MESSAGE_MAGIC_CODE;

/// Why a record is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record at byte {at} of the response: {reason}")]
pub struct RecordError {
    pub at: usize,
    pub reason: String,
}

/// Decodes every record in `records` (concatenated stored records, as in a query's answer).
/// Bodies, topics and properties are slices of `records`, not copies.
pub fn decode_records(records: &Bytes, broker_name: &str) -> Result<Vec<MessageExt>, RecordError> {
    decode_checked(records, broker_name, None)
}

/// What a pull asked for: every record of its answer must be of this topic and queue, at
/// rising queue offsets from `from_offset` on. The broker slices a pull's records out by
/// their ConsumeQueue entries and reads only their heads (size, magic, queue id, queue
/// offset, CommitLog offset), so the client checks the rest of each record: its framing, both
/// CRCs and these (storage-format.md §4.8).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pulled<'a> {
    pub topic: &'a str,
    pub queue_id: u32,
    pub from_offset: i64,
}

/// Decodes a pull's answer (`PullResponse.records`) as [`decode_records`] does, and checks that
/// every record is one of those `pulled` asked for.
pub(crate) fn decode_pulled(
    records: &Bytes,
    broker_name: &str,
    pulled: Pulled<'_>,
) -> Result<Vec<MessageExt>, RecordError> {
    decode_checked(records, broker_name, Some(pulled))
}

fn decode_checked(
    records: &Bytes,
    broker_name: &str,
    pulled: Option<Pulled<'_>>,
) -> Result<Vec<MessageExt>, RecordError> {
    let broker_name: Arc<str> = Arc::from(broker_name);
    let mut messages = Vec::with_capacity(estimated_count(records));
    let mut at = 0;
    let mut lowest_next = pulled.map_or(i64::MIN, |p| p.from_offset);
    while at < records.len() {
        let (message, total_size) = decode_record(records, at, &broker_name, Checks::Whole)
            .map_err(|reason| RecordError { at, reason })?;
        if let Some(pulled) = pulled {
            let reason = if message.topic[..] != *pulled.topic.as_bytes() {
                Some(format!(
                    "its topic is `{}`, not `{}` as pulled",
                    String::from_utf8_lossy(&message.topic),
                    pulled.topic
                ))
            } else if message.queue_id != pulled.queue_id {
                Some(format!(
                    "its queue is {}, not {} as pulled",
                    message.queue_id, pulled.queue_id
                ))
            } else if message.queue_offset < lowest_next {
                Some(format!(
                    "its queue offset {} is below {lowest_next}, where this answer goes on",
                    message.queue_offset
                ))
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(RecordError { at, reason });
            }
            lowest_next = message.queue_offset + 1;
        }
        messages.push(message);
        at += total_size;
    }
    Ok(messages)
}

/// How many records `records` holds if all were the size of the first (a capacity, so the
/// messages are not moved as their vector grows; at most one per 64 bytes).
fn estimated_count(records: &[u8]) -> usize {
    let first = records
        .get(..4)
        .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
    records.len() / first.max(64) + 1
}

/// What [`decode_record`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checks {
    /// The layout, both CRCs and the properties' form: a record as it arrives.
    Whole,
    /// Nothing: a record of an answer that passed [`Checks::Whole`] before, decoded again
    /// from the same bytes (a push consumer's cache keeps records, not messages).
    AlreadyChecked,
}

/// Decodes the record at byte `at` of `records`; returns it and its total size.
pub(crate) fn decode_record(
    records: &Bytes,
    at: usize,
    broker_name: &Arc<str>,
    checks: Checks,
) -> Result<(MessageExt, usize), String> {
    let view = RecordView::parse_unchecked(&records[at..]).map_err(|e| e.to_string())?;
    if checks == Checks::Whole {
        // The whole-record check also refuses properties that are not UTF-8 `name 0x01 value
        // 0x02` pairs.
        view.check_crcs().map_err(|e| e.to_string())?;
    }
    let topic =
        std::str::from_utf8(view.topic_bytes()).map_err(|_| "topic is not UTF-8".to_owned())?;
    let total_size = view.total_size() as usize;
    // A body the producer compressed is handed over inflated, with the flag cleared; one that
    // cannot be inflated is handed over as stored, flagged, for the application to judge.
    let mut sys_flag = view.sys_flag();
    let mut body = records.slice_ref(view.body());
    if sys_flag & SYS_FLAG_COMPRESSED != 0 {
        match crate::compression::inflate(&body) {
            Ok(inflated) => {
                body = inflated;
                sys_flag &= !SYS_FLAG_COMPRESSED;
            }
            Err(why) => tracing::warn!(
                %topic,
                queue_id = view.queue_id(),
                queue_offset = view.queue_offset(),
                "{why}"
            ),
        }
    }
    // Topic and properties were checked above (UTF-8, well-formed pairs).
    let message = MessageExt {
        topic: records.slice_ref(view.topic_bytes()),
        broker_name: Arc::clone(broker_name),
        queue_id: view.queue_id(),
        queue_offset: view.queue_offset() as i64,
        commit_log_offset: view.physical_offset() as i64,
        flag: view.flag(),
        sys_flag,
        born_timestamp_ms: view.born_timestamp_ms(),
        born_host: view.born_host(),
        store_timestamp_ms: view.store_timestamp_ms(),
        store_host: view.store_host(),
        reconsume_times: view.reconsume_times(),
        properties: records.slice_ref(view.properties_bytes()),
        body,
    };
    Ok((message, total_size))
}

/// Encodes a record as the broker stores it (IPv4 hosts, CRC property last): for tests of
/// the decoder and of code that consumes pulled records.
#[cfg(test)]
pub(crate) fn encode_test_record(
    topic: &str,
    queue_id: u32,
    queue_offset: u64,
    body: &[u8],
    properties: &[(&str, &str)],
) -> Vec<u8> {
    encode_test_record_with(topic, queue_id, queue_offset, body, properties, true)
}

/// [`encode_test_record`], with or without the whole-record CRC property.
#[cfg(test)]
pub(crate) fn encode_test_record_with(
    topic: &str,
    queue_id: u32,
    queue_offset: u64,
    body: &[u8],
    properties: &[(&str, &str)],
    with_record_crc: bool,
) -> Vec<u8> {
    let mut props = String::new();
    for (name, value) in properties {
        props.push_str(name);
        props.push(NAME_VALUE_SEPARATOR);
        props.push_str(value);
        props.push(PROPERTY_SEPARATOR);
    }
    if with_record_crc {
        props.push_str("__CRC32#\u{1}0000000000\u{2}");
    }
    let mut out = Vec::new();
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(&MESSAGE_MAGIC_CODE.to_be_bytes());
    out.extend_from_slice(&crc32fast::hash(body).to_be_bytes());
    out.extend_from_slice(&queue_id.to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(&queue_offset.to_be_bytes());
    out.extend_from_slice(&(1000 + queue_offset).to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(&1_700_000_000_000u64.to_be_bytes());
    out.extend_from_slice(&[127, 0, 0, 1, 0, 0, 0x30, 0x39]);
    out.extend_from_slice(&1_700_000_000_001u64.to_be_bytes());
    out.extend_from_slice(&[127, 0, 0, 1, 0, 0, 0x2A, 0x9F]);
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(&0u64.to_be_bytes());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out.push(topic.len() as u8);
    out.extend_from_slice(topic.as_bytes());
    out.extend_from_slice(&(props.len() as u16).to_be_bytes());
    out.extend_from_slice(props.as_bytes());
    let total = out.len() as u32;
    out[..4].copy_from_slice(&total.to_be_bytes());
    if !with_record_crc {
        return out;
    }
    let crc = shardmq_codec::record_crc(&out);
    let digits = format!("{crc:010}");
    let digits_at = out.len() - shardmq_codec::CRC_TRAILER_BYTES;
    out[digits_at..digits_at + 10].copy_from_slice(digits.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_records() -> Bytes {
        let mut bytes = encode_test_record(
            "orders",
            3,
            7,
            b"hello",
            &[("TAGS", "A"), ("KEYS", "k1 k2"), ("UNIQ_KEY", "ID1")],
        );
        bytes.extend(encode_test_record("orders", 3, 8, b"world", &[]));
        Bytes::from(bytes)
    }

    #[test]
    fn decodes_concatenated_records() {
        let messages = decode_records(&two_records(), "broker-a").unwrap();
        assert_eq!(messages.len(), 2);
        let first = &messages[0];
        assert_eq!(first.topic(), "orders");
        assert_eq!(first.broker_name(), "broker-a");
        assert_eq!(first.queue_id, 3);
        assert_eq!(first.queue_offset, 7);
        assert_eq!(first.commit_log_offset, 1007);
        assert_eq!(&first.body[..], b"hello");
        assert_eq!(first.tags(), Some("A"));
        assert_eq!(first.keys(), ["k1", "k2"]);
        assert_eq!(first.msg_id(), "ID1");
        assert_eq!(first.born_host, "127.0.0.1:12345".parse().unwrap());
        assert_eq!(first.store_host, "127.0.0.1:10911".parse().unwrap());
        assert_eq!(first.store_timestamp_ms, 1_700_000_000_001);
        assert_eq!(first.user_properties().count(), 0);
        assert_eq!(messages[1].queue_offset, 8);
        assert_eq!(messages[1].tags(), None);
    }

    #[test]
    fn a_pull_s_answer_holds_only_records_of_the_topic_queue_and_offsets_pulled() {
        let pulled = Pulled {
            topic: "orders",
            queue_id: 3,
            from_offset: 7,
        };
        // Rising offsets from where the pull began, gaps allowed (a tag filter skips entries).
        let mut good = encode_test_record("orders", 3, 7, b"a", &[]);
        good.extend(encode_test_record("orders", 3, 9, b"b", &[]));
        let messages = decode_pulled(&Bytes::from(good.clone()), "b", pulled).unwrap();
        assert_eq!(messages.len(), 2);
        // A record of another topic, another queue, or at an offset the answer cannot hold,
        // each whole and with good CRCs, is refused where it lies.
        let second_at = good.len() - encode_test_record("orders", 3, 9, b"b", &[]).len();
        for (second, names) in [
            (
                encode_test_record("orderz", 3, 9, b"b", &[]),
                "topic is `orderz`",
            ),
            (encode_test_record("orders", 2, 9, b"b", &[]), "queue is 2"),
            (
                encode_test_record("orders", 3, 7, b"b", &[]),
                "offset 7 is below 8",
            ),
        ] {
            let mut answer = good[..second_at].to_vec();
            answer.extend(second);
            let error = decode_pulled(&Bytes::from(answer), "b", pulled).unwrap_err();
            assert_eq!(error.at, second_at, "{error}");
            assert!(error.reason.contains(names), "{names}: {error}");
        }
        // A query's answer has no such expectation.
        let before_the_pull = encode_test_record("orders", 3, 6, b"a", &[]);
        let error = decode_pulled(&Bytes::from(before_the_pull.clone()), "b", pulled).unwrap_err();
        assert!(error.reason.contains("offset 6 is below 7"), "{error}");
        assert_eq!(
            decode_records(&Bytes::from(before_the_pull), "b")
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn damaged_body_is_refused() {
        let mut bytes = two_records().to_vec();
        // The first body starts at 88 (IPv4 hosts).
        bytes[88] ^= 0xFF;
        let error = decode_records(&Bytes::from(bytes), "b").unwrap_err();
        assert_eq!(error.at, 0);
        assert!(
            error.reason.contains("body CRC mismatch"),
            "the body CRC covers the body: {}",
            error.reason
        );
    }

    #[test]
    fn a_record_without_the_record_crc_is_refused() {
        // Every record the broker stores ends with the CRC property (storage-format.md §4.5).
        let record = encode_test_record_with("orders", 3, 7, b"hello", &[], false);
        let error = decode_records(&Bytes::from(record), "b").unwrap_err();
        assert!(error.reason.contains("__CRC32#"), "{}", error.reason);
    }

    #[test]
    fn damaged_header_is_refused_by_the_record_crc() {
        let mut bytes = two_records().to_vec();
        bytes[20] ^= 0x01; // queue offset
        let error = decode_records(&Bytes::from(bytes), "b").unwrap_err();
        assert!(
            error.reason.contains("record CRC mismatch"),
            "{}",
            error.reason
        );
    }

    #[test]
    fn a_damaged_broker_filled_field_is_refused_by_the_record_crc() {
        for at in [27, 35, 63] {
            // queue offset, physical offset, store timestamp (IPv4 born host)
            let mut bytes = two_records().to_vec();
            bytes[at] ^= 0x01;
            let error = decode_records(&Bytes::from(bytes), "b").unwrap_err();
            assert!(
                error.reason.contains("record CRC mismatch"),
                "{}",
                error.reason
            );
        }
    }

    #[test]
    fn truncated_records_are_refused() {
        let bytes = two_records();
        for cut in [1, 10, 60, bytes.len() - 1] {
            let error = decode_records(&bytes.slice(..cut), "b");
            assert!(error.is_err(), "cut at {cut} accepted");
        }
        let mut wrong_magic = bytes.to_vec();
        wrong_magic[4] = 0;
        assert!(decode_records(&Bytes::from(wrong_magic), "b").is_err());
    }
}
