//! Decoding stored CommitLog records, as pull and query responses carry them
//! (docs/storage-format.md §4.2–4.5: RocketMQ's version-1 record, big-endian, with the
//! `__CRC32#` whole-record CRC property last).
//!
//! Owns: walking concatenated records by their total size, checking each one's layout, body
//! CRC and (when present) whole-record CRC, and turning it into a [`MessageExt`] whose body
//! shares the response's memory. Never: anything about the broker's files; a record that fails
//! a check is an error, never a message.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::Bytes;

use std::sync::Arc;

use crate::message::{check_properties, MessageExt, RecordParts};

/// Magic code of a version-1 message record (1-byte topic length).
pub const MESSAGE_MAGIC_CODE: u32 = 0xDAA3_20A7;

/// Sys flag bit: the born host is IPv6 (20 bytes instead of 8).
const SYS_FLAG_BORN_HOST_V6: u32 = 0x10;
/// Sys flag bit: the store host is IPv6.
const SYS_FLAG_STORE_HOST_V6: u32 = 0x20;
/// Sys flag bit: the body is zlib-compressed (RocketMQ's `COMPRESSED_FLAG`).
const SYS_FLAG_COMPRESSED: u32 = 0x1;

/// Bytes before the born host: total size, magic, body CRC, queue id, flag, queue offset,
/// physical offset, sys flag, born timestamp.
const BORN_HOST_AT: usize = 48;

/// Name of the whole-record CRC property (docs/storage-format.md §4.5).
const CRC_PROPERTY: &[u8] = b"__CRC32#";
/// The CRC property's ten decimal digits and final 0x02 are outside its own coverage.
const CRC_TRAILER_BYTES: usize = 11;
/// `__CRC32#`, 0x01, ten digits, 0x02.
const CRC_PROPERTY_BYTES: usize = 20;

/// Separates a property's name from its value.
pub(crate) const NAME_VALUE_SEPARATOR: char = '\u{1}';
/// Ends each property.
pub(crate) const PROPERTY_SEPARATOR: char = '\u{2}';

/// Why a record is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record at byte {at} of the response: {reason}")]
pub struct RecordError {
    pub at: usize,
    pub reason: String,
}

/// Decodes every record in `records` (concatenated stored records, as in
/// `PullResponse.records`). Bodies are slices of `records`, not copies.
pub fn decode_records(records: &Bytes, broker_name: &str) -> Result<Vec<MessageExt>, RecordError> {
    let broker_name: Arc<str> = Arc::from(broker_name);
    let mut messages = Vec::new();
    let mut at = 0;
    while at < records.len() {
        let rest = records.slice(at..);
        let (message, total_size) =
            decode_record(&rest, &broker_name).map_err(|reason| RecordError { at, reason })?;
        messages.push(message);
        at += total_size;
    }
    Ok(messages)
}

/// A cursor over one record's bytes; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize, field: &str) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(count)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| {
                format!(
                    "{field} ({count} bytes at {}) runs past the record's {} bytes",
                    self.at,
                    self.bytes.len()
                )
            })?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn u8(&mut self, field: &str) -> Result<u8, String> {
        Ok(self.take(1, field)?[0])
    }

    fn u16(&mut self, field: &str) -> Result<u16, String> {
        let bytes = self.take(2, field)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    fn u32(&mut self, field: &str) -> Result<u32, String> {
        let bytes = self.take(4, field)?;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn u64(&mut self, field: &str) -> Result<u64, String> {
        let bytes = self.take(8, field)?;
        let mut array = [0u8; 8];
        array.copy_from_slice(bytes);
        Ok(u64::from_be_bytes(array))
    }

    fn host(&mut self, is_v6: bool, field: &str) -> Result<SocketAddr, String> {
        let ip = if is_v6 {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(self.take(16, field)?);
            IpAddr::V6(Ipv6Addr::from(octets))
        } else {
            let bytes = self.take(4, field)?;
            IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
        };
        // Ports take 4 bytes; the low 16 bits are the port.
        let port = self.u32(field)? as u16;
        Ok(SocketAddr::new(ip, port))
    }
}

/// Decodes the record at the start of `bytes`; returns it and its total size.
fn decode_record(bytes: &Bytes, broker_name: &Arc<str>) -> Result<(MessageExt, usize), String> {
    let mut head = Reader { bytes, at: 0 };
    let total_size = head.u32("total size")? as usize;
    if total_size < BORN_HOST_AT || total_size > bytes.len() {
        return Err(format!(
            "total size {total_size} is under {BORN_HOST_AT} or past the {} bytes left",
            bytes.len()
        ));
    }
    let record = &bytes[..total_size];
    let mut reader = Reader {
        bytes: record,
        at: 4,
    };
    let magic = reader.u32("magic code")?;
    if magic != MESSAGE_MAGIC_CODE {
        return Err(format!(
            "magic code {magic:#010X} is not a version-1 message ({MESSAGE_MAGIC_CODE:#010X})"
        ));
    }
    let body_crc = reader.u32("body CRC")?;
    let queue_id = reader.u32("queue id")?;
    let flag = reader.u32("flag")? as i32;
    let queue_offset = reader.u64("queue offset")? as i64;
    let commit_log_offset = reader.u64("physical offset")? as i64;
    let sys_flag = reader.u32("sys flag")?;
    let born_timestamp_ms = reader.u64("born timestamp")? as i64;
    let born_host = reader.host(sys_flag & SYS_FLAG_BORN_HOST_V6 != 0, "born host")?;
    let store_timestamp_at = reader.at;
    let store_timestamp_ms = reader.u64("store timestamp")? as i64;
    let store_host = reader.host(sys_flag & SYS_FLAG_STORE_HOST_V6 != 0, "store host")?;
    let reconsume_times = reader.u32("reconsume times")? as i32;
    let _prepared_transaction_offset = reader.u64("prepared transaction offset")?;
    let body_length = reader.u32("body length")? as usize;
    let body_start = reader.at;
    let body = reader.take(body_length, "body")?;
    let topic_length = usize::from(reader.u8("topic length")?);
    let topic_start = reader.at;
    let topic = std::str::from_utf8(reader.take(topic_length, "topic")?)
        .map_err(|_| "topic is not UTF-8".to_owned())?;
    let properties_length = usize::from(reader.u16("properties length")?);
    let properties_start = reader.at;
    let properties_bytes = reader.take(properties_length, "properties")?;
    if reader.at != total_size {
        return Err(format!(
            "fields end at {} but the total size is {total_size}",
            reader.at
        ));
    }
    // The whole-record CRC covers the body too, so a record that carries one is checked in one
    // pass; the body CRC is compared only for a record without it.
    if !check_record_crc(record, store_timestamp_at, properties_bytes)? {
        let computed_body_crc = crc32fast::hash(body);
        if computed_body_crc != body_crc {
            return Err(format!(
                "body CRC {computed_body_crc:#010X} does not match the stored {body_crc:#010X} (topic {topic}, queue {queue_id}, offset {queue_offset})"
            ));
        }
    }
    check_properties(properties_bytes)?;
    // A body the producer compressed is handed over inflated, with the flag cleared; one that
    // cannot be inflated is handed over as stored, flagged, for the application to judge.
    let mut sys_flag = sys_flag;
    let mut body = bytes.slice(body_start..body_start + body_length);
    if sys_flag & SYS_FLAG_COMPRESSED != 0 {
        match crate::compression::inflate(&body) {
            Ok(inflated) => {
                body = inflated;
                sys_flag &= !SYS_FLAG_COMPRESSED;
            }
            Err(why) => tracing::warn!(%topic, queue_id, queue_offset, "{why}"),
        }
    }
    let message = MessageExt::from_record_parts(RecordParts {
        topic: bytes.slice(topic_start..topic_start + topic_length),
        broker_name: Arc::clone(broker_name),
        queue_id,
        queue_offset,
        commit_log_offset,
        flag,
        sys_flag,
        born_timestamp_ms,
        born_host,
        store_timestamp_ms,
        store_host,
        reconsume_times,
        properties: bytes.slice(properties_start..properties_start + properties_length),
        body,
    });
    Ok((message, total_size))
}

/// Offsets of the fields the broker's storage shard fills in after the producer's part of the
/// record is hashed: queue offset and physical offset (the store timestamp's place depends on
/// the born host's size).
const QUEUE_OFFSET_AT: usize = 20;
const PHYSICAL_OFFSET_END: usize = 36;

/// The whole-record CRC as the broker computes it (`docs/storage-format.md`, "Record CRC"):
/// CRC32 of the record except queue offset, physical offset, store timestamp (at
/// `store_timestamp_at`) and the trailer (the ten digits and the final separator), XOR the
/// CRC32 of those three fields.
fn record_crc(record: &[u8], store_timestamp_at: usize) -> u32 {
    let mut producer_part = crc32fast::Hasher::new();
    producer_part.update(&record[..QUEUE_OFFSET_AT]);
    producer_part.update(&record[PHYSICAL_OFFSET_END..store_timestamp_at]);
    producer_part.update(&record[store_timestamp_at + 8..record.len() - CRC_TRAILER_BYTES]);
    let mut store_fields = crc32fast::Hasher::new();
    store_fields.update(&record[QUEUE_OFFSET_AT..PHYSICAL_OFFSET_END]);
    store_fields.update(&record[store_timestamp_at..store_timestamp_at + 8]);
    producer_part.finalize() ^ store_fields.finalize()
}

/// Checks the `__CRC32#` property when the record ends with one ([`record_crc`] written as ten
/// decimal digits); `Ok(false)` when it carries none.
fn check_record_crc(
    record: &[u8],
    store_timestamp_at: usize,
    properties: &[u8],
) -> Result<bool, String> {
    if properties.len() < CRC_PROPERTY_BYTES {
        return Ok(false);
    }
    let crc_property = &properties[properties.len() - CRC_PROPERTY_BYTES..];
    let starts_property = properties.len() == CRC_PROPERTY_BYTES
        || properties[properties.len() - CRC_PROPERTY_BYTES - 1] == PROPERTY_SEPARATOR as u8;
    if !starts_property || !crc_property.starts_with(CRC_PROPERTY) {
        return Ok(false);
    }
    let digits = &crc_property[CRC_PROPERTY.len() + 1..CRC_PROPERTY_BYTES - 1];
    let stored = std::str::from_utf8(digits)
        .ok()
        .filter(|text| text.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|text| text.parse::<u32>().ok())
        .ok_or_else(|| "the __CRC32# property is not ten decimal digits".to_owned())?;
    let computed = record_crc(record, store_timestamp_at);
    if computed != stored {
        return Err(format!(
            "whole-record CRC {computed} does not match the stored {stored}"
        ));
    }
    Ok(true)
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
    let crc = record_crc(&out, BORN_HOST_AT + 8);
    let digits = format!("{crc:010}");
    let digits_at = out.len() - CRC_TRAILER_BYTES;
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
    fn damaged_body_is_refused() {
        let mut bytes = two_records().to_vec();
        // The first body starts at 88 (IPv4 hosts).
        bytes[88] ^= 0xFF;
        let error = decode_records(&Bytes::from(bytes), "b").unwrap_err();
        assert_eq!(error.at, 0);
        assert!(
            error.reason.contains("whole-record CRC"),
            "the record CRC covers the body: {}",
            error.reason
        );
    }

    #[test]
    fn a_record_without_the_record_crc_is_checked_by_its_body_crc() {
        let record = encode_test_record_with("orders", 3, 7, b"hello", &[], false);
        assert_eq!(
            decode_records(&Bytes::from(record.clone()), "b").unwrap()[0].body,
            &b"hello"[..]
        );
        let mut damaged = record;
        damaged[88] ^= 0xFF;
        let error = decode_records(&Bytes::from(damaged), "b").unwrap_err();
        assert!(error.reason.contains("body CRC"), "{}", error.reason);
    }

    #[test]
    fn damaged_header_is_refused_by_the_record_crc() {
        let mut bytes = two_records().to_vec();
        bytes[20] ^= 0x01; // queue offset
        let error = decode_records(&Bytes::from(bytes), "b").unwrap_err();
        assert!(
            error.reason.contains("whole-record CRC"),
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
                error.reason.contains("whole-record CRC"),
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
