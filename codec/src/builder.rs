//! Writing a record straight into a buffer: [`RecordBuilder`] writes the header and body, then
//! the properties one by one (a value may be written in place, as a client's unique id is), and
//! on [`finish`](RecordBuilder::finish) the CRC property, the length fields and both CRCs. It is
//! what a producer uses to encode a send as a run of stored records (`docs/protocol.md`,
//! `SendRecordsRequest`), and what [`encode_record`](crate::encode_record) is made of. Nothing
//! is allocated: the record is written once, where it will be sent from.
//!
//! The storage fields (queue offset, physical offset, store timestamp) are written as zero and
//! the digits hold the producer part's CRC until the storage shard patches the record
//! ([`patch_record`](crate::patch_record)).

use std::net::{IpAddr, SocketAddr};

use bytes::{BufMut, BytesMut};

use crate::{
    producer_part_crc, write_crc_digits, Layout, RecordError, CRC_DIGITS, CRC_PROPERTY_BYTES,
    CRC_TRAILER_BYTES, MAX_HEADER_BYTES, MAX_PROPERTIES_BYTES, MAX_TOPIC_BYTES, MESSAGE_MAGIC_CODE,
    NAME_VALUE_SEPARATOR, PROPERTY_CRC32, PROPERTY_SEPARATOR, SYS_FLAG_BORN_HOST_V6,
    SYS_FLAG_STORE_HOST_V6,
};

/// The fixed fields of a record and its body, as a producer (or the broker) writes them.
#[derive(Debug, Clone)]
pub struct RecordHeader<'a> {
    pub topic: &'a str,
    pub queue_id: u32,
    pub flag: i32,
    pub body: &'a [u8],
    /// The producer's bits (compressed, multi tags, transaction); the host bits are set from
    /// the addresses.
    pub sys_flag: u32,
    pub born_timestamp_ms: i64,
    pub born_host: SocketAddr,
    /// The broker's address as its records name it; the storage shard may write its own over
    /// it (of the same address family).
    pub store_host: SocketAddr,
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
}

impl RecordHeader<'_> {
    /// The sys flag with the host bits set from the addresses.
    pub(crate) fn sys_flag_with_hosts(&self) -> u32 {
        let mut sys_flag = self.sys_flag & !(SYS_FLAG_BORN_HOST_V6 | SYS_FLAG_STORE_HOST_V6);
        if self.born_host.is_ipv6() {
            sys_flag |= SYS_FLAG_BORN_HOST_V6;
        }
        if self.store_host.is_ipv6() {
            sys_flag |= SYS_FLAG_STORE_HOST_V6;
        }
        sys_flag
    }
}

/// A record being written at the end of a buffer; see the module documentation. Dropped before
/// [`finish`](Self::finish) (an error included), it takes its bytes back out of the buffer.
pub struct RecordBuilder<'b> {
    buf: &'b mut BytesMut,
    start: usize,
    layout: Layout,
    properties_len_at: usize,
    is_finished: bool,
}

fn has_separator(bytes: &[u8]) -> bool {
    // The separators are 0x01 and 0x02: one comparison each, without an early exit, so that
    // the loop is vectorised (a property is short; the scan runs for every one).
    const _: () = assert!(NAME_VALUE_SEPARATOR == 1 && PROPERTY_SEPARATOR == 2);
    bytes
        .iter()
        .fold(false, |found, &b| found | (b.wrapping_sub(1) < 2))
}

/// A record's fields up to its body, written on the stack.
struct FixedFields {
    bytes: [u8; MAX_HEADER_BYTES],
    len: usize,
}

impl Default for FixedFields {
    fn default() -> Self {
        Self {
            bytes: [0; MAX_HEADER_BYTES],
            len: 0,
        }
    }
}

impl FixedFields {
    fn put(&mut self, bytes: &[u8]) {
        self.bytes[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    /// A host as the record holds it: the address's octets, then the port as a `u32`.
    fn put_host(&mut self, host: &SocketAddr) {
        match host.ip() {
            IpAddr::V4(ip) => self.put(&ip.octets()),
            IpAddr::V6(ip) => self.put(&ip.octets()),
        }
        self.put(&u32::from(host.port()).to_be_bytes());
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl<'b> RecordBuilder<'b> {
    /// Writes the header, the body and the topic of a record at the end of `buf`.
    pub fn begin(
        buf: &'b mut BytesMut,
        header: &RecordHeader<'_>,
    ) -> Result<RecordBuilder<'b>, RecordError> {
        if header.topic.is_empty() {
            return Err(RecordError::EmptyTopic);
        }
        if header.topic.len() > MAX_TOPIC_BYTES {
            return Err(RecordError::TopicTooLong(header.topic.len()));
        }
        if header.body.len() > i32::MAX as usize {
            return Err(RecordError::BodyTooLong(header.body.len()));
        }
        let sys_flag = header.sys_flag_with_hosts();
        let layout = Layout::for_sys_flag(sys_flag);
        let start = buf.len();
        buf.reserve(layout.body_length_at + 4 + header.body.len() + 3 + header.topic.len() + 64);
        // The fixed fields are written on the stack and appended in one copy: a run encodes a
        // thousand records per send.
        let mut fixed = FixedFields::default();
        fixed.put(&0u32.to_be_bytes()); // total size: `finish`
        fixed.put(&MESSAGE_MAGIC_CODE.to_be_bytes());
        fixed.put(&crc32fast::hash(header.body).to_be_bytes());
        fixed.put(&header.queue_id.to_be_bytes());
        fixed.put(&header.flag.to_be_bytes());
        fixed.put(&0u64.to_be_bytes()); // queue offset: storage shard
        fixed.put(&0u64.to_be_bytes()); // physical offset: storage shard
        fixed.put(&sys_flag.to_be_bytes());
        fixed.put(&header.born_timestamp_ms.to_be_bytes());
        fixed.put_host(&header.born_host);
        fixed.put(&0i64.to_be_bytes()); // store timestamp: storage shard
        fixed.put_host(&header.store_host);
        fixed.put(&header.reconsume_times.to_be_bytes());
        fixed.put(&header.prepared_transaction_offset.to_be_bytes());
        debug_assert_eq!(fixed.len, layout.body_length_at);
        fixed.put(&(header.body.len() as u32).to_be_bytes());
        buf.put_slice(fixed.as_bytes());
        buf.put_slice(header.body);
        buf.put_u8(header.topic.len() as u8);
        buf.put_slice(header.topic.as_bytes());
        let properties_len_at = buf.len();
        buf.put_u16(0); // properties length: `finish`
        Ok(RecordBuilder {
            buf,
            start,
            layout,
            properties_len_at,
            is_finished: false,
        })
    }

    /// Appends the property `key` = `value`. Neither may hold a separator byte (0x01, 0x02).
    pub fn property(&mut self, key: &str, value: &str) -> Result<(), RecordError> {
        if has_separator(key.as_bytes()) || has_separator(value.as_bytes()) {
            return Err(RecordError::SeparatorInProperty);
        }
        self.buf.reserve(key.len() + value.len() + 2);
        self.buf.put_slice(key.as_bytes());
        self.buf.put_u8(NAME_VALUE_SEPARATOR);
        self.buf.put_slice(value.as_bytes());
        self.buf.put_u8(PROPERTY_SEPARATOR);
        Ok(())
    }

    /// Appends the property `key` whose value, `value_len` bytes, `write` writes in place (a
    /// unique id formatted straight into the record). The value must be UTF-8 without
    /// separator bytes.
    pub fn property_with(
        &mut self,
        key: &str,
        value_len: usize,
        write: impl FnOnce(&mut [u8]),
    ) -> Result<(), RecordError> {
        if has_separator(key.as_bytes()) {
            return Err(RecordError::SeparatorInProperty);
        }
        self.buf.reserve(key.len() + value_len + 2);
        self.buf.put_slice(key.as_bytes());
        self.buf.put_u8(NAME_VALUE_SEPARATOR);
        let value_at = self.buf.len();
        self.buf.put_bytes(0, value_len);
        write(&mut self.buf[value_at..]);
        let value = &self.buf[value_at..];
        if has_separator(value) || std::str::from_utf8(value).is_err() {
            return Err(RecordError::SeparatorInProperty);
        }
        self.buf.put_u8(PROPERTY_SEPARATOR);
        Ok(())
    }

    /// Appends the CRC property, fills in the lengths and both CRCs, and returns the record's
    /// length.
    pub fn finish(mut self) -> Result<u32, RecordError> {
        let properties_len = self.buf.len() - (self.properties_len_at + 2) + CRC_PROPERTY_BYTES;
        if properties_len > MAX_PROPERTIES_BYTES {
            return Err(RecordError::PropertiesTooLong(properties_len));
        }
        self.buf.reserve(CRC_PROPERTY_BYTES);
        self.buf.put_slice(PROPERTY_CRC32.as_bytes());
        self.buf.put_u8(NAME_VALUE_SEPARATOR);
        self.buf.put_bytes(b'0', CRC_DIGITS);
        self.buf.put_u8(PROPERTY_SEPARATOR);
        let at = self.properties_len_at;
        self.buf[at..at + 2].copy_from_slice(&(properties_len as u16).to_be_bytes());
        let record = &mut self.buf[self.start..];
        let total = record.len();
        record[..4].copy_from_slice(&(total as u32).to_be_bytes());
        // The digits hold the producer part's CRC until `patch_record` folds in the storage
        // fields; a record is never stored or served before that.
        let crc = producer_part_crc(record, &self.layout);
        write_crc_digits(&mut record[total - CRC_TRAILER_BYTES..total - 1], crc);
        self.is_finished = true;
        Ok(total as u32)
    }
}

impl Drop for RecordBuilder<'_> {
    fn drop(&mut self) {
        if !self.is_finished {
            self.buf.truncate(self.start);
        }
    }
}
