//! The stored message record: RocketMQ's CommitLog layout (version 1), field for field, plus a
//! whole-record CRC carried in a `__CRC32#` property, in the manner of RocketMQ 5 (which names
//! the same property; its digit order and coverage differ, see `docs/storage-format.md`).
//!
//! Owns: encoding a record from a message (done on network shards), patching the fields that only
//! the storage shard knows (queue offset, physical offset, store timestamp) together with the
//! whole-record CRC, and decoding/validating stored bytes. It never touches files or sockets.
//!
//! The byte layout, the CRC coverage and the invariants are in `docs/storage-format.md`; the
//! constants below are the ones that document names. One codec serves every reader and writer
//! of records: the broker (encoding on network shards, patching and reading on storage shards,
//! recovery and `verify`), the client (decoding pulled records) and the fuzz targets.
//!
//! Size: about 730 lines of code and 210 of unit tests; kept whole because encode, patch and
//! decode must agree byte for byte on one layout, which reads best side by side.

mod builder;
pub mod names;
mod run;

pub use builder::{RecordBuilder, RecordHeader};
pub use run::{check_run, RunChecker, RunError, RunRecord, RunRules};

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use bytes::BytesMut;

/// Magic code of a version-1 message record (1-byte topic length), as in RocketMQ.
pub const MESSAGE_MAGIC_CODE: u32 = 0xDAA3_20A7;
/// Magic code of the filler that pads the end of a CommitLog segment, as in RocketMQ
/// (`BLANK_MAGIC_CODE`). Its total size covers the rest of the segment.
pub const BLANK_MAGIC_CODE: u32 = 0xCBD4_3194;
/// A blank filler is at least its total size and magic code.
pub const BLANK_MIN_BYTES: usize = 8;

/// Sys flag bits (RocketMQ's `MessageSysFlag`).
pub const SYS_FLAG_COMPRESSED: u32 = 0x1;
pub const SYS_FLAG_MULTI_TAGS: u32 = 0x2;
pub const SYS_FLAG_TRANSACTION_PREPARED: u32 = 0x4;
pub const SYS_FLAG_TRANSACTION_COMMIT: u32 = 0x8;
pub const SYS_FLAG_TRANSACTION_ROLLBACK: u32 = 0xC;
pub const SYS_FLAG_BORN_HOST_V6: u32 = 0x10;
pub const SYS_FLAG_STORE_HOST_V6: u32 = 0x20;

/// Separators of RocketMQ's property encoding: `key\u{1}value\u{2}`.
pub const NAME_VALUE_SEPARATOR: u8 = 0x01;
pub const PROPERTY_SEPARATOR: u8 = 0x02;

/// Property that carries the whole-record CRC (named like RocketMQ 5's `PROPERTY_CRC32`). It is
/// always the last property; its value is exactly [`CRC_DIGITS`] decimal digits, zero padded,
/// most significant first.
pub const PROPERTY_CRC32: &str = "__CRC32#";
pub const CRC_DIGITS: usize = 10;
/// Bytes at the end of every record that the whole-record CRC does not cover: the ten digits
/// holding the CRC itself and the final property separator.
pub const CRC_TRAILER_BYTES: usize = CRC_DIGITS + 1;
/// Bytes the CRC property occupies: `__CRC32#` `\u{1}` ten digits `\u{2}`.
pub const CRC_PROPERTY_BYTES: usize = PROPERTY_CRC32.len() + 1 + CRC_TRAILER_BYTES;

/// Well-known property keys (RocketMQ's `MessageConst`).
pub const PROPERTY_KEYS: &str = "KEYS";
pub const PROPERTY_TAGS: &str = "TAGS";
pub const PROPERTY_UNIQUE_KEY: &str = "UNIQ_KEY";
/// Delay level of a message waiting in `SCHEDULE_TOPIC_XXXX`.
pub const PROPERTY_DELAY: &str = "DELAY";
/// Topic and queue a scheduled (delayed, timer, retry) message is delivered to.
pub const PROPERTY_REAL_TOPIC: &str = "REAL_TOPIC";
pub const PROPERTY_REAL_QUEUE_ID: &str = "REAL_QID";
/// Due time (ms since the epoch) of a timer message (RocketMQ 5's name).
pub const PROPERTY_TIMER_DELIVER_MS: &str = "TIMER_DELIVER_MS";
/// A retry or dead-letter copy's original topic, first message id and redelivery count.
pub const PROPERTY_RETRY_TOPIC: &str = "RETRY_TOPIC";
pub const PROPERTY_ORIGIN_MESSAGE_ID: &str = "ORIGIN_MESSAGE_ID";
pub const PROPERTY_RECONSUME_TIME: &str = "RECONSUME_TIME";
pub const PROPERTY_MAX_RECONSUME_TIMES: &str = "MAX_RECONSUME_TIMES";

/// Largest topic a version-1 record can hold (1-byte length) and RocketMQ's limit.
pub const MAX_TOPIC_BYTES: usize = 127;
/// Properties length is a 16-bit field.
pub const MAX_PROPERTIES_BYTES: usize = u16::MAX as usize;
/// Longest fixed header: both host addresses IPv6, through the body length field.
pub const MAX_HEADER_BYTES: usize = 112;
/// Shortest record: IPv4 hosts, empty body, a 1-byte topic and the CRC property alone.
pub const MIN_RECORD_BYTES: usize = 88 + 1 + 1 + 2 + CRC_PROPERTY_BYTES;

/// The largest record a body of at most `max_body_bytes` can make: the longest header, topic
/// and properties the format allows around it. Every size read from disk or the wire is checked
/// against this before anything is read or allocated for it.
pub const fn max_record_bytes(max_body_bytes: usize) -> usize {
    MAX_HEADER_BYTES + max_body_bytes + 1 + MAX_TOPIC_BYTES + 2 + MAX_PROPERTIES_BYTES
}

// Fixed offsets of the header fields that do not depend on the host address sizes.
const TOTAL_SIZE_AT: usize = 0;
const MAGIC_AT: usize = 4;
const BODY_CRC_AT: usize = 8;
const QUEUE_ID_AT: usize = 12;
const FLAG_AT: usize = 16;
const QUEUE_OFFSET_AT: usize = 20;
const PHYSICAL_OFFSET_AT: usize = 28;
const SYS_FLAG_AT: usize = 36;
const BORN_TIMESTAMP_AT: usize = 40;
const BORN_HOST_AT: usize = 48;

/// Everything that makes a record invalid, with enough detail to report it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("record is {available} bytes, shorter than its header needs ({needed})")]
    Truncated { available: usize, needed: usize },
    #[error("total size field {total_size} is impossible (record area has {available} bytes)")]
    BadTotalSize { total_size: u32, available: usize },
    #[error("magic code {0:#010x} is neither a message nor a blank filler")]
    BadMagic(u32),
    #[error("field lengths add up to {computed} bytes but total size says {total_size}")]
    LengthMismatch { computed: usize, total_size: usize },
    #[error("body CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BodyCrc { stored: u32, computed: u32 },
    #[error("record CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    RecordCrc { stored: u32, computed: u32 },
    #[error("record CRC property `__CRC32#` is missing or malformed")]
    MissingCrcProperty,
    #[error("topic is {0} bytes, over the version-1 limit of 127")]
    TopicTooLong(usize),
    #[error("invalid topic: {0}")]
    InvalidTopic(String),
    #[error("topic is empty")]
    EmptyTopic,
    #[error("properties are {0} bytes, over the 65535-byte field")]
    PropertiesTooLong(usize),
    #[error("property key or value contains a separator byte (0x01 or 0x02)")]
    SeparatorInProperty,
    #[error("record says it is at physical offset {stored} but sits at {expected}")]
    WrongPhysicalOffset { stored: u64, expected: u64 },
    #[error("body is {0} bytes, over the largest a record holds (2^31 - 1)")]
    BodyTooLong(usize),
    #[error("properties are not UTF-8 `name 0x01 value 0x02` pairs")]
    MalformedProperties,
}

/// What a producer message turns into; filled by the network shard.
#[derive(Debug, Clone)]
pub struct RecordInput<'a> {
    pub topic: &'a str,
    pub queue_id: u32,
    pub flag: i32,
    pub body: &'a [u8],
    /// User and system properties except the CRC property, which the encoder adds.
    pub properties: &'a [(&'a str, &'a str)],
    pub sys_flag: u32,
    pub born_timestamp_ms: i64,
    pub born_host: SocketAddr,
    pub store_host: SocketAddr,
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
}

impl<'a> RecordInput<'a> {
    /// The fixed fields and body of the record.
    pub fn header(&self) -> RecordHeader<'a> {
        RecordHeader {
            topic: self.topic,
            queue_id: self.queue_id,
            flag: self.flag,
            body: self.body,
            sys_flag: self.sys_flag,
            born_timestamp_ms: self.born_timestamp_ms,
            born_host: self.born_host,
            store_host: self.store_host,
            reconsume_times: self.reconsume_times,
            prepared_transaction_offset: self.prepared_transaction_offset,
        }
    }
}

/// The fields only a storage shard can fill in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorePatch {
    /// The queue the record is stored in (a producer may leave the choice to the broker).
    pub queue_id: u32,
    pub queue_offset: u64,
    pub physical_offset: u64,
    pub store_timestamp_ms: i64,
    /// The broker's address as the record names it; `None` keeps the encoded one.
    pub store_host: Option<SocketAddr>,
}

/// An encoded but not yet stored record and what the storage shard needs to store it, worked
/// out by the encoder so that the storage shard never parses the record (see `EncodedBatch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingRecord {
    /// Length of the record in bytes (equals its total size field).
    pub len: u32,
    pub queue_id: u32,
    /// Hash of the `TAGS` property (0 without tags), for the ConsumeQueue entry.
    pub tags_hash: u64,
    /// Index of the record's topic in its batch's topic list.
    pub topic: u16,
    /// How many index hashes (keys, then the unique id) the record has in its batch's list.
    pub index_hash_count: u16,
}

fn host_len(is_v6: bool) -> usize {
    if is_v6 {
        20
    } else {
        8
    }
}

/// Offsets of the variable-position header fields, derived from the sys flag.
#[derive(Debug, Clone, Copy)]
struct Layout {
    store_timestamp_at: usize,
    store_host_at: usize,
    reconsume_times_at: usize,
    prepared_offset_at: usize,
    body_length_at: usize,
}

impl Layout {
    fn for_sys_flag(sys_flag: u32) -> Layout {
        let store_timestamp_at = BORN_HOST_AT + host_len(sys_flag & SYS_FLAG_BORN_HOST_V6 != 0);
        let store_host_at = store_timestamp_at + 8;
        let reconsume_times_at = store_host_at + host_len(sys_flag & SYS_FLAG_STORE_HOST_V6 != 0);
        let prepared_offset_at = reconsume_times_at + 4;
        let body_length_at = prepared_offset_at + 8;
        Layout {
            store_timestamp_at,
            store_host_at,
            reconsume_times_at,
            prepared_offset_at,
            body_length_at,
        }
    }
}

/// The whole-record CRC (`docs/storage-format.md` §4.5, format version 3): the CRC32 of the
/// bytes the producer fixes (every byte of `record` but the body, the fields only the storage
/// shard knows and the CRC trailer) XOR the CRC32 of those storage fields (queue id, queue
/// offset, physical offset, store timestamp, store host). The body is covered through the body
/// CRC field, which the producer part includes: a reader checks the body CRC and this one, one
/// pass over the body in all. So the network shard checks a record the client encoded in one
/// pass, and the storage shard hashes only the fields it writes (no CRC combine).
/// `record` must be at least as long as its header and its length fields must add up.
pub fn record_crc(record: &[u8]) -> u32 {
    let layout = Layout::for_sys_flag(read_u32(record, SYS_FLAG_AT));
    producer_part_crc(record, &layout) ^ store_fields_crc(record, &layout)
}

/// Where the body sits in `record`, from its body length field (clamped to the record).
fn body_range(record: &[u8], layout: &Layout) -> std::ops::Range<usize> {
    let body_at = layout.body_length_at + 4;
    let body_len = read_u32(record, layout.body_length_at) as usize;
    body_at..body_at.saturating_add(body_len).min(record.len())
}

/// CRC32 of the bytes the producer's side fixes: all but the body, the storage fields and the
/// trailer.
fn producer_part_crc(record: &[u8], layout: &Layout) -> u32 {
    let body = body_range(record, layout);
    let tail_end = record.len().saturating_sub(CRC_TRAILER_BYTES).max(body.end);
    let parts = [
        &record[..QUEUE_ID_AT],
        &record[FLAG_AT..QUEUE_OFFSET_AT],
        &record[SYS_FLAG_AT..layout.store_timestamp_at],
        &record[layout.reconsume_times_at..body.start],
        &record[body.end..tail_end],
    ];
    let len: usize = parts.iter().map(|part| part.len()).sum();
    if len <= GATHERED_CRC_BYTES {
        // Five short parts cost more per call than per byte (crc32fast falls back to its table
        // below 64 bytes): gathered, a header and a few properties are hashed in one call.
        let mut gathered = [0u8; GATHERED_CRC_BYTES];
        let mut at = 0;
        for part in parts {
            gathered[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        return crc32fast::hash(&gathered[..at]);
    }
    let mut hasher = crc32fast::Hasher::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize()
}

/// Most bytes of a record's producer part that [`producer_part_crc`] gathers into one buffer
/// before hashing (a header is at most 112; the rest is the topic and the properties).
const GATHERED_CRC_BYTES: usize = 512;

/// CRC32 of the fields the storage shard fills in: queue id, queue offset, physical offset,
/// store timestamp and store host (36 bytes with an IPv4 store host).
fn store_fields_crc(record: &[u8], layout: &Layout) -> u32 {
    // Gathered and hashed in one call: three `Hasher` updates of a few bytes each cost more in
    // calls (and in crc32fast's CPU feature check per hasher) than in bytes.
    let fields = [
        &record[QUEUE_ID_AT..FLAG_AT],
        &record[QUEUE_OFFSET_AT..PHYSICAL_OFFSET_AT + 8],
        &record[layout.store_timestamp_at..layout.reconsume_times_at],
    ];
    let mut gathered = [0u8; STORE_FIELDS_MAX_BYTES];
    let mut at = 0;
    for field in fields {
        gathered[at..at + field.len()].copy_from_slice(field);
        at += field.len();
    }
    crc32fast::hash(&gathered[..at])
}

/// The storage fields with an IPv6 store host: queue id 4, offsets 16, store timestamp 8,
/// store host 20.
const STORE_FIELDS_MAX_BYTES: usize = 4 + 16 + 8 + 20;

/// Bytes the properties field will take, CRC property included.
fn properties_len(properties: &[(&str, &str)]) -> usize {
    properties
        .iter()
        .map(|(k, v)| k.len() + v.len() + 2)
        .sum::<usize>()
        + CRC_PROPERTY_BYTES
}

/// The encoded size of `input`, without encoding it.
pub fn encoded_len(input: &RecordInput<'_>) -> usize {
    let layout = Layout::for_sys_flag(input.header().sys_flag_with_hosts());
    layout.body_length_at
        + 4
        + input.body.len()
        + 1
        + input.topic.len()
        + 2
        + properties_len(input.properties)
}

/// Appends the record for `input` to `buf`, with queue offset, physical offset and store
/// timestamp zero (the storage shard fills them with [`patch_record`]) and its CRCs computed.
/// Returns the record's length. On error nothing is appended.
pub fn encode_record(buf: &mut BytesMut, input: &RecordInput<'_>) -> Result<u32, RecordError> {
    let props_len = properties_len(input.properties);
    if props_len > MAX_PROPERTIES_BYTES {
        return Err(RecordError::PropertiesTooLong(props_len));
    }
    let mut record = RecordBuilder::begin(buf, &input.header())?;
    for (key, value) in input.properties {
        record.property(key, value)?;
    }
    record.finish()
}

/// Writes the storage shard's fields into an encoded record and completes its CRC: hashes the
/// fields it wrote and XORs that into the producer part's CRC the encoder left in the digits.
/// The record's store host keeps its address family (the sys flag fixes the layout): a patch
/// whose store host is of the other family leaves the encoded one (the network shard refuses
/// such records before they get here).
pub fn patch_record(record: &mut [u8], patch: StorePatch) {
    let layout = Layout::for_sys_flag(read_u32(record, SYS_FLAG_AT));
    write_store_fields(&mut record[..layout.reconsume_times_at], &layout, &patch);
    let len = record.len();
    let digits = len - CRC_TRAILER_BYTES..len - 1;
    let producer_part =
        parse_crc_digits(&record[digits.clone()]).expect("the encoder wrote ten CRC digits");
    let crc = producer_part ^ store_fields_crc(record, &layout);
    write_crc_digits(&mut record[digits], crc);
}

/// Copies the encoded record `source` into `dest` (of the same length) with the storage
/// shard's fields written and its CRC completed, as [`patch_record`] on the copy would, but
/// without reading `dest`: the fields are patched and hashed in a copy of the header on the
/// stack and the producer part's CRC is read from `source`. (Reading back the bytes just
/// copied missed the cache: a large copy's stores do not leave the lines in it.)
pub fn copy_patched(dest: &mut [u8], source: &[u8], patch: StorePatch) {
    assert_eq!(dest.len(), source.len(), "a record is copied whole");
    let layout = Layout::for_sys_flag(read_u32(source, SYS_FLAG_AT));
    let head_len = layout.reconsume_times_at;
    let mut head = [0u8; MAX_HEADER_BYTES];
    let head = &mut head[..head_len];
    head.copy_from_slice(&source[..head_len]);
    write_store_fields(head, &layout, &patch);
    let len = source.len();
    let digits_at = len - CRC_TRAILER_BYTES;
    let producer_part =
        parse_crc_digits(&source[digits_at..len - 1]).expect("the encoder wrote ten CRC digits");
    let crc = producer_part ^ store_fields_crc(head, &layout);
    dest[..head_len].copy_from_slice(head);
    dest[head_len..digits_at].copy_from_slice(&source[head_len..digits_at]);
    write_crc_digits(&mut dest[digits_at..len - 1], crc);
    dest[len - 1] = source[len - 1];
}

/// Writes the fields only the storage shard knows into `head`, a record's bytes up to its
/// store host (inclusive).
fn write_store_fields(head: &mut [u8], layout: &Layout, patch: &StorePatch) {
    head[QUEUE_ID_AT..FLAG_AT].copy_from_slice(&patch.queue_id.to_be_bytes());
    head[QUEUE_OFFSET_AT..QUEUE_OFFSET_AT + 8].copy_from_slice(&patch.queue_offset.to_be_bytes());
    head[PHYSICAL_OFFSET_AT..PHYSICAL_OFFSET_AT + 8]
        .copy_from_slice(&patch.physical_offset.to_be_bytes());
    let store_timestamp_at = layout.store_timestamp_at;
    head[store_timestamp_at..store_timestamp_at + 8]
        .copy_from_slice(&patch.store_timestamp_ms.to_be_bytes());
    if let Some(host) = patch.store_host {
        let is_v6 = read_u32(head, SYS_FLAG_AT) & SYS_FLAG_STORE_HOST_V6 != 0;
        debug_assert_eq!(
            is_v6,
            host.is_ipv6(),
            "store host family differs from the record's"
        );
        if is_v6 == host.is_ipv6() {
            write_host(
                &mut head[layout.store_host_at..layout.reconsume_times_at],
                &host,
            );
        }
    }
}

/// Writes `host` (address, then port as u32) into `out`, which is exactly its size.
fn write_host(out: &mut [u8], host: &SocketAddr) {
    match host.ip() {
        IpAddr::V4(ip) => out[..4].copy_from_slice(&ip.octets()),
        IpAddr::V6(ip) => out[..16].copy_from_slice(&ip.octets()),
    }
    let port_at = out.len() - 4;
    out[port_at..].copy_from_slice(&u32::from(host.port()).to_be_bytes());
}

fn write_crc_digits(out: &mut [u8], crc: u32) {
    debug_assert_eq!(out.len(), CRC_DIGITS);
    let mut value = crc;
    for digit in out.iter_mut().rev() {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

fn parse_crc_digits(digits: &[u8]) -> Option<u32> {
    let digits: &[u8; CRC_DIGITS] = digits.try_into().ok()?;
    // Without an exit per digit, so the ten steps unroll into straight-line code.
    let mut value: u64 = 0;
    let mut is_bad = false;
    for &d in digits {
        let digit = d.wrapping_sub(b'0');
        is_bad |= digit > 9;
        value = value * 10 + u64::from(digit);
    }
    if is_bad {
        return None;
    }
    u32::try_from(value).ok()
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

fn read_host(bytes: &[u8], at: usize, is_v6: bool) -> SocketAddr {
    if is_v6 {
        let octets: [u8; 16] = bytes[at..at + 16].try_into().expect("16 bytes");
        let port = read_u32(bytes, at + 16) as u16;
        SocketAddr::new(IpAddr::from(octets), port)
    } else {
        let octets: [u8; 4] = bytes[at..at + 4].try_into().expect("4 bytes");
        let port = read_u32(bytes, at + 4) as u16;
        SocketAddr::new(IpAddr::V4(Ipv4Addr::from(octets)), port)
    }
}

/// What sits at a position of the CommitLog.
#[derive(Debug)]
pub enum Entry<'a> {
    Message(RecordView<'a>),
    /// Segment end filler of this many bytes.
    Blank(u32),
}

/// Reads the total size at the start of `bytes` (for the scanner to know how much to fetch).
pub fn peek_total_size(bytes: &[u8]) -> Option<u32> {
    (bytes.len() >= 4).then(|| read_u32(bytes, TOTAL_SIZE_AT))
}

/// Decodes and fully validates the entry at the start of `bytes` (which may hold more after it).
/// Validation: plausible size, magic, field lengths adding up to the total size, body CRC and
/// whole-record CRC. A record that passes is exactly what the encoder produced.
pub fn decode_entry(bytes: &[u8]) -> Result<Entry<'_>, RecordError> {
    if bytes.len() < BLANK_MIN_BYTES {
        return Err(RecordError::Truncated {
            available: bytes.len(),
            needed: BLANK_MIN_BYTES,
        });
    }
    let total_size = read_u32(bytes, TOTAL_SIZE_AT);
    let magic = read_u32(bytes, MAGIC_AT);
    if magic == BLANK_MAGIC_CODE {
        if (total_size as usize) < BLANK_MIN_BYTES || total_size as usize > bytes.len() {
            return Err(RecordError::BadTotalSize {
                total_size,
                available: bytes.len(),
            });
        }
        return Ok(Entry::Blank(total_size));
    }
    if magic != MESSAGE_MAGIC_CODE {
        return Err(RecordError::BadMagic(magic));
    }
    let view = RecordView::parse_unchecked(bytes)?;
    view.check_crcs()?;
    Ok(Entry::Message(view))
}

/// The fields at the head of a message record (its first 36 bytes) that say which record it
/// is: what a reader that slices records out by their ConsumeQueue entries checks when it
/// hands them to a reader that checks everything else (the broker serving a pull: the client
/// checks each record's framing, topic and both CRCs end to end, storage-format.md §4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHead {
    pub total_size: u32,
    pub queue_id: u32,
    pub queue_offset: u64,
    pub physical_offset: u64,
}

/// The bytes of a record's head ([`RecordHead`]): total size to physical offset.
pub const RECORD_HEAD_BYTES: usize = SYS_FLAG_AT;

/// Reads the head of a record that must be a message: enough bytes for the head and a
/// message's magic; nothing past the head is read.
pub fn read_head(bytes: &[u8]) -> Result<RecordHead, RecordError> {
    if bytes.len() < RECORD_HEAD_BYTES {
        return Err(RecordError::Truncated {
            available: bytes.len(),
            needed: RECORD_HEAD_BYTES,
        });
    }
    let magic = read_u32(bytes, MAGIC_AT);
    if magic != MESSAGE_MAGIC_CODE {
        return Err(RecordError::BadMagic(magic));
    }
    Ok(RecordHead {
        total_size: read_u32(bytes, TOTAL_SIZE_AT),
        queue_id: read_u32(bytes, QUEUE_ID_AT),
        queue_offset: read_u64(bytes, QUEUE_OFFSET_AT),
        physical_offset: read_u64(bytes, PHYSICAL_OFFSET_AT),
    })
}

/// Decodes a record that must be a message (not a blank), validating it.
pub fn decode_message(bytes: &[u8]) -> Result<RecordView<'_>, RecordError> {
    match decode_entry(bytes)? {
        Entry::Message(view) => Ok(view),
        Entry::Blank(_) => Err(RecordError::BadMagic(BLANK_MAGIC_CODE)),
    }
}

/// A validated view of one stored record; borrows the bytes.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    bytes: &'a [u8],
    layout: Layout,
    body_at: usize,
    body_len: usize,
    topic_at: usize,
    topic_len: usize,
    properties_at: usize,
    properties_len: usize,
}

impl<'a> RecordView<'a> {
    /// Parses the structure (sizes add up) without checking CRCs: for bytes this process wrote
    /// itself, where the CRC check would only repeat work.
    pub fn parse_unchecked(bytes: &'a [u8]) -> Result<RecordView<'a>, RecordError> {
        if bytes.len() < BLANK_MIN_BYTES {
            return Err(RecordError::Truncated {
                available: bytes.len(),
                needed: BLANK_MIN_BYTES,
            });
        }
        let magic = read_u32(bytes, MAGIC_AT);
        if magic != MESSAGE_MAGIC_CODE {
            return Err(RecordError::BadMagic(magic));
        }
        let total_size = read_u32(bytes, TOTAL_SIZE_AT);
        let total = total_size as usize;
        if total > bytes.len() {
            return Err(RecordError::BadTotalSize {
                total_size,
                available: bytes.len(),
            });
        }
        let bytes = &bytes[..total];
        if total < SYS_FLAG_AT + 4 {
            return Err(RecordError::Truncated {
                available: total,
                needed: SYS_FLAG_AT + 4,
            });
        }
        let layout = Layout::for_sys_flag(read_u32(bytes, SYS_FLAG_AT));
        let need = |needed: usize| {
            if total < needed {
                Err(RecordError::Truncated {
                    available: total,
                    needed,
                })
            } else {
                Ok(())
            }
        };
        need(layout.body_length_at + 4)?;
        let body_len = read_u32(bytes, layout.body_length_at) as usize;
        let body_at = layout.body_length_at + 4;
        let topic_len_at = body_at
            .checked_add(body_len)
            .ok_or(RecordError::LengthMismatch {
                computed: usize::MAX,
                total_size: total,
            })?;
        need(topic_len_at + 1)?;
        let topic_len = bytes[topic_len_at] as usize;
        let topic_at = topic_len_at + 1;
        need(topic_at + topic_len + 2)?;
        let properties_len_at = topic_at + topic_len;
        let properties_len =
            u16::from_be_bytes([bytes[properties_len_at], bytes[properties_len_at + 1]]) as usize;
        let properties_at = properties_len_at + 2;
        let computed = properties_at + properties_len;
        if computed != total {
            return Err(RecordError::LengthMismatch {
                computed,
                total_size: total,
            });
        }
        Ok(RecordView {
            bytes,
            layout,
            body_at,
            body_len,
            topic_at,
            topic_len,
            properties_at,
            properties_len,
        })
    }

    /// Checks both CRCs: the body CRC (one pass over the body) and the whole-record CRC, which
    /// covers every other byte, the body CRC field included (§4.5). What every reader of bytes
    /// that left this process checks: recovery, `verify`, a disk read, the client.
    pub fn check_crcs(&self) -> Result<(), RecordError> {
        self.check_body_crc()?;
        self.check_record_crc()
    }

    /// Checks the body CRC only (one pass over the body).
    pub fn check_body_crc(&self) -> Result<(), RecordError> {
        let stored_body = read_u32(self.bytes, BODY_CRC_AT);
        let computed_body = crc32fast::hash(self.body());
        if stored_body != computed_body {
            return Err(RecordError::BodyCrc {
                stored: stored_body,
                computed: computed_body,
            });
        }
        Ok(())
    }

    /// Checks the whole-record CRC, which covers every byte of the record but the body and its
    /// own digits (the body through the body CRC field), and that the properties are what the
    /// encoder writes. Without [`check_crcs`](Self::check_crcs)'s body check it does not cover
    /// the body bytes.
    pub fn check_record_crc(&self) -> Result<(), RecordError> {
        let props = self.properties_bytes();
        if props.len() < CRC_PROPERTY_BYTES {
            return Err(RecordError::MissingCrcProperty);
        }
        let trailer = &props[props.len() - CRC_PROPERTY_BYTES..];
        let key_len = PROPERTY_CRC32.len();
        let well_formed = &trailer[..key_len] == PROPERTY_CRC32.as_bytes()
            && trailer[key_len] == NAME_VALUE_SEPARATOR
            && trailer[CRC_PROPERTY_BYTES - 1] == PROPERTY_SEPARATOR
            && (props.len() == CRC_PROPERTY_BYTES
                || props[props.len() - CRC_PROPERTY_BYTES - 1] == PROPERTY_SEPARATOR);
        let stored = if well_formed {
            parse_crc_digits(&trailer[key_len + 1..key_len + 1 + CRC_DIGITS])
        } else {
            None
        }
        .ok_or(RecordError::MissingCrcProperty)?;
        let computed = record_crc(self.bytes);
        if stored != computed {
            return Err(RecordError::RecordCrc { stored, computed });
        }
        // The encoder never writes anything else; a crafted record with valid CRCs must not be
        // served to clients that would refuse it.
        let user_properties = &props[..props.len() - CRC_PROPERTY_BYTES];
        let is_well_formed = std::str::from_utf8(user_properties).is_ok_and(|text| {
            text.split(PROPERTY_SEPARATOR as char)
                .filter(|pair| !pair.is_empty())
                .all(|pair| pair.contains(NAME_VALUE_SEPARATOR as char))
        });
        if !is_well_formed {
            return Err(RecordError::MalformedProperties);
        }
        Ok(())
    }

    /// The record's bytes, exactly as stored.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
    pub fn total_size(&self) -> u32 {
        self.bytes.len() as u32
    }
    pub fn body_crc(&self) -> u32 {
        read_u32(self.bytes, BODY_CRC_AT)
    }
    pub fn queue_id(&self) -> u32 {
        read_u32(self.bytes, QUEUE_ID_AT)
    }
    pub fn flag(&self) -> i32 {
        read_u32(self.bytes, FLAG_AT) as i32
    }
    pub fn queue_offset(&self) -> u64 {
        read_u64(self.bytes, QUEUE_OFFSET_AT)
    }
    pub fn physical_offset(&self) -> u64 {
        read_u64(self.bytes, PHYSICAL_OFFSET_AT)
    }
    pub fn sys_flag(&self) -> u32 {
        read_u32(self.bytes, SYS_FLAG_AT)
    }
    pub fn born_timestamp_ms(&self) -> i64 {
        read_u64(self.bytes, BORN_TIMESTAMP_AT) as i64
    }
    pub fn born_host(&self) -> SocketAddr {
        read_host(
            self.bytes,
            BORN_HOST_AT,
            self.sys_flag() & SYS_FLAG_BORN_HOST_V6 != 0,
        )
    }
    pub fn store_timestamp_ms(&self) -> i64 {
        read_u64(self.bytes, self.layout.store_timestamp_at) as i64
    }
    pub fn store_host(&self) -> SocketAddr {
        read_host(
            self.bytes,
            self.layout.store_host_at,
            self.sys_flag() & SYS_FLAG_STORE_HOST_V6 != 0,
        )
    }
    pub fn reconsume_times(&self) -> i32 {
        read_u32(self.bytes, self.layout.reconsume_times_at) as i32
    }
    pub fn prepared_transaction_offset(&self) -> i64 {
        read_u64(self.bytes, self.layout.prepared_offset_at) as i64
    }
    pub fn body(&self) -> &'a [u8] {
        &self.bytes[self.body_at..self.body_at + self.body_len]
    }
    /// The topic as bytes (validated UTF-8 is not required of stored bytes).
    pub fn topic_bytes(&self) -> &'a [u8] {
        &self.bytes[self.topic_at..self.topic_at + self.topic_len]
    }
    pub fn topic(&self) -> &'a str {
        std::str::from_utf8(self.topic_bytes()).unwrap_or("")
    }
    pub fn properties_bytes(&self) -> &'a [u8] {
        &self.bytes[self.properties_at..self.properties_at + self.properties_len]
    }
    /// Iterates `(key, value)` pairs, the CRC property included.
    pub fn properties(&self) -> PropertyIter<'a> {
        PropertyIter {
            rest: self.properties_bytes(),
        }
    }
    pub fn property(&self, key: &str) -> Option<&'a str> {
        self.properties().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
    pub fn tags(&self) -> Option<&'a str> {
        self.property(PROPERTY_TAGS)
    }
    /// Message keys (the `KEYS` property, space separated).
    pub fn keys(&self) -> impl Iterator<Item = &'a str> {
        self.property(PROPERTY_KEYS)
            .unwrap_or("")
            .split(' ')
            .filter(|k| !k.is_empty())
    }
    pub fn unique_key(&self) -> Option<&'a str> {
        self.property(PROPERTY_UNIQUE_KEY)
    }
}

/// Iterator over RocketMQ-encoded properties; skips empty pairs and stops at the first
/// malformed one.
pub struct PropertyIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for PropertyIter<'a> {
    type Item = (&'a str, &'a str);
    fn next(&mut self) -> Option<Self::Item> {
        // Empty pairs (two separators in a row) are skipped, as RocketMQ's
        // `string2messageProperties` and the record checks do.
        while let Some((&PROPERTY_SEPARATOR, rest)) = self.rest.split_first() {
            self.rest = rest;
        }
        if self.rest.is_empty() {
            return None;
        }
        let name_end = self.rest.iter().position(|&b| b == NAME_VALUE_SEPARATOR)?;
        let value_len = self.rest[name_end + 1..]
            .iter()
            .position(|&b| b == PROPERTY_SEPARATOR)?;
        let key = std::str::from_utf8(&self.rest[..name_end]).ok()?;
        let value = std::str::from_utf8(&self.rest[name_end + 1..name_end + 1 + value_len]).ok()?;
        self.rest = &self.rest[name_end + 1 + value_len + 1..];
        Some((key, value))
    }
}

/// The tags hash stored in ConsumeQueue entries: Java's `String.hashCode()` of the tag widened
/// to 64 bits, exactly as RocketMQ computes it, so RocketMQ tooling agrees with our entries.
pub fn tags_hash(tag: &str) -> u64 {
    let mut hash: i32 = 0;
    for unit in tag.encode_utf16() {
        hash = hash.wrapping_mul(31).wrapping_add(i32::from(unit));
    }
    i64::from(hash) as u64
}

/// Writes a blank filler header covering all of `out` (the rest is left as zeros).
pub fn encode_blank(out: &mut [u8]) {
    debug_assert!(out.len() >= BLANK_MIN_BYTES);
    let header = blank_header(out.len() as u64);
    out[..BLANK_MIN_BYTES].copy_from_slice(&header);
}

/// The header of a blank filler `total_size` bytes long (its body is zeros).
pub fn blank_header(total_size: u64) -> [u8; BLANK_MIN_BYTES] {
    let mut header = [0u8; BLANK_MIN_BYTES];
    header[..4].copy_from_slice(&(total_size as u32).to_be_bytes());
    header[4..8].copy_from_slice(&BLANK_MAGIC_CODE.to_be_bytes());
    header
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn property_iter_skips_empty_pairs_like_the_record_check() {
        // An empty pair before KEYS was once accepted by the checks (and indexed) while this
        // iterator read the next key as "\x02KEYS": readers then did not see the keys.
        let it = PropertyIter {
            rest: b"\x02a\x01b\x02\x02KEYS\x01k\x02\x02",
        };
        let pairs: Vec<_> = it.collect();
        assert_eq!(pairs, vec![("a", "b"), ("KEYS", "k")]);
    }

    fn input<'a>(
        topic: &'a str,
        body: &'a [u8],
        props: &'a [(&'a str, &'a str)],
    ) -> RecordInput<'a> {
        RecordInput {
            topic,
            queue_id: 3,
            flag: 7,
            body,
            properties: props,
            sys_flag: 0,
            born_timestamp_ms: 1_700_000_000_000,
            born_host: "127.0.0.1:5555".parse().unwrap(),
            store_host: "10.0.0.1:10911".parse().unwrap(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        }
    }

    #[test]
    fn size_bounds_match_the_layout() {
        let both_v6 = Layout::for_sys_flag(SYS_FLAG_BORN_HOST_V6 | SYS_FLAG_STORE_HOST_V6);
        assert_eq!(MAX_HEADER_BYTES, both_v6.body_length_at + 4);
        assert_eq!(encoded_len(&input("T", b"", &[])), MIN_RECORD_BYTES);
        let topic = "T".repeat(MAX_TOPIC_BYTES);
        let value = "v".repeat(MAX_PROPERTIES_BYTES - CRC_PROPERTY_BYTES - 3);
        let props = [("k", value.as_str())];
        let mut widest = input(&topic, b"0123456789", &props);
        widest.born_host = "[::1]:5555".parse().unwrap();
        widest.store_host = "[::1]:10911".parse().unwrap();
        let mut buf = BytesMut::new();
        let len = encode_record(&mut buf, &widest).unwrap();
        assert_eq!(
            len as usize,
            max_record_bytes(10),
            "the widest record is the bound"
        );
    }

    #[test]
    fn java_string_hash_matches_known_values() {
        // "TagA".hashCode() == 2598919, "".hashCode() == 0, "hello".hashCode() == 99162322.
        assert_eq!(tags_hash("TagA"), 2_598_919);
        assert_eq!(tags_hash(""), 0);
        assert_eq!(tags_hash("hello"), 99_162_322);
        // Negative Java hashes sign-extend: "polygenelubricants".hashCode() == Integer.MIN_VALUE.
        assert_eq!(tags_hash("polygenelubricants") as i64, i64::from(i32::MIN));
    }

    #[test]
    fn crc_trailer_catches_a_torn_header() {
        let props = [("TAGS", "TagA")];
        let mut buf = BytesMut::new();
        encode_record(&mut buf, &input("T", b"hello", &props)).unwrap();
        patch_record(
            &mut buf,
            StorePatch {
                queue_id: 3,
                queue_offset: 1,
                physical_offset: 2,
                store_timestamp_ms: 3,
                store_host: None,
            },
        );
        assert!(decode_message(&buf).is_ok());
        buf[BORN_TIMESTAMP_AT + 7] ^= 1;
        assert!(matches!(
            decode_message(&buf),
            Err(RecordError::RecordCrc { .. })
        ));
    }

    #[test]
    fn a_flipped_storage_field_is_caught_by_the_record_crc() {
        let mut buf = BytesMut::new();
        encode_record(&mut buf, &input("T", b"hello", &[])).unwrap();
        patch_record(
            &mut buf,
            StorePatch {
                queue_id: 9,
                queue_offset: 5,
                physical_offset: 1 << 40,
                store_timestamp_ms: 1_700_000_000_123,
                store_host: Some("10.9.8.7:10911".parse().unwrap()),
            },
        );
        let view = decode_message(&buf).unwrap();
        assert_eq!(view.queue_id(), 9);
        assert_eq!(view.store_host(), "10.9.8.7:10911".parse().unwrap());
        let layout = Layout::for_sys_flag(0);
        for at in [
            QUEUE_ID_AT + 3,
            QUEUE_OFFSET_AT + 7,
            PHYSICAL_OFFSET_AT,
            layout.store_timestamp_at + 7,
            layout.store_host_at + 2,
            layout.store_host_at + 7,
        ] {
            let mut damaged = buf.clone();
            damaged[at] ^= 1;
            assert!(
                matches!(decode_message(&damaged), Err(RecordError::RecordCrc { .. })),
                "flip at {at} went unnoticed"
            );
        }
    }

    /// The producer part's CRC as five separate updates, the definition `producer_part_crc`
    /// must keep when it gathers the parts.
    fn producer_part_crc_piecewise(record: &[u8]) -> u32 {
        let layout = Layout::for_sys_flag(read_u32(record, SYS_FLAG_AT));
        let body = body_range(record, &layout);
        let tail_end = record.len().saturating_sub(CRC_TRAILER_BYTES).max(body.end);
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&record[..QUEUE_ID_AT]);
        hasher.update(&record[FLAG_AT..QUEUE_OFFSET_AT]);
        hasher.update(&record[SYS_FLAG_AT..layout.store_timestamp_at]);
        hasher.update(&record[layout.reconsume_times_at..body.start]);
        hasher.update(&record[body.end..tail_end]);
        hasher.finalize()
    }

    proptest! {
        #[test]
        fn the_producer_part_crc_is_the_same_gathered_or_not(
            topic in "[a-zA-Z0-9_%|-]{1,127}",
            body in proptest::collection::vec(any::<u8>(), 0..300),
            props in proptest::collection::vec(("[A-Za-z_]{1,12}", "[ -~]{0,200}"), 0..8),
            v6_born in any::<bool>(),
            v6_store in any::<bool>(),
        ) {
            let prop_refs: Vec<(&str, &str)> = props.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let mut rec = input(&topic, &body, &prop_refs);
            if v6_born {
                rec.born_host = "[::1]:4242".parse().unwrap();
            }
            if v6_store {
                rec.store_host = "[::2]:10911".parse().unwrap();
            }
            let mut buf = BytesMut::new();
            encode_record(&mut buf, &rec).unwrap();
            let layout = Layout::for_sys_flag(read_u32(&buf, SYS_FLAG_AT));
            // Both sides of GATHERED_CRC_BYTES are drawn: up to 8 properties of up to 215 bytes.
            prop_assert_eq!(producer_part_crc(&buf, &layout), producer_part_crc_piecewise(&buf));
        }

        #[test]
        fn round_trip(
            topic in "[a-zA-Z0-9_%|-]{1,127}",
            body in proptest::collection::vec(any::<u8>(), 0..2048),
            props in proptest::collection::vec(("[A-Za-z_]{1,12}", "[ -~]{0,40}"), 0..6),
            queue_offset in any::<u64>(),
            physical_offset in any::<u64>(),
            store_ts in any::<i64>(),
            v6_born in any::<bool>(),
        ) {
            let prop_refs: Vec<(&str, &str)> = props.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let mut rec = input(&topic, &body, &prop_refs);
            if v6_born {
                rec.born_host = "[::1]:4242".parse().unwrap();
            }
            let mut buf = BytesMut::from(&b"prefix"[..]);
            let len = encode_record(&mut buf, &rec).unwrap();
            prop_assert_eq!(len as usize, encoded_len(&rec));
            let patch = StorePatch { queue_id: 3, queue_offset, physical_offset, store_timestamp_ms: store_ts, store_host: None };
            patch_record(&mut buf[6..], patch);
            let view = decode_message(&buf[6..]).unwrap();
            prop_assert_eq!(view.topic(), topic.as_str());
            prop_assert_eq!(view.body(), &body[..]);
            prop_assert_eq!(view.queue_offset(), queue_offset);
            prop_assert_eq!(view.physical_offset(), physical_offset);
            prop_assert_eq!(view.store_timestamp_ms(), store_ts);
            prop_assert_eq!(view.born_host(), rec.born_host);
            prop_assert_eq!(view.store_host(), rec.store_host);
            prop_assert_eq!(view.queue_id(), 3);
            prop_assert_eq!(view.flag(), 7);
            let decoded: Vec<(&str, &str)> = view.properties().collect();
            prop_assert_eq!(&decoded[..decoded.len() - 1], &prop_refs[..]);
            prop_assert_eq!(decoded.last().unwrap().0, PROPERTY_CRC32);
        }

        #[test]
        fn a_patched_copy_is_the_record_patched_in_place(
            body in proptest::collection::vec(any::<u8>(), 0..1500),
            props in proptest::collection::vec(("[A-Za-z_]{1,12}", "[ -~]{0,40}"), 0..6),
            queue_id in any::<u32>(),
            queue_offset in any::<u64>(),
            physical_offset in any::<u64>(),
            store_ts in any::<i64>(),
            v6_born in any::<bool>(),
            v6_store in any::<bool>(),
            new_store_host in any::<bool>(),
        ) {
            let prop_refs: Vec<(&str, &str)> = props.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let mut rec = input("TopicP", &body, &prop_refs);
            if v6_born {
                rec.born_host = "[::1]:4242".parse().unwrap();
            }
            let store_host: SocketAddr = if v6_store { "[fe80::7]:10911".parse().unwrap() } else { "10.1.2.3:10911".parse().unwrap() };
            if v6_store {
                rec.store_host = "[::1]:1".parse().unwrap();
            }
            let mut source = BytesMut::new();
            encode_record(&mut source, &rec).unwrap();
            let patch = StorePatch {
                queue_id,
                queue_offset,
                physical_offset,
                store_timestamp_ms: store_ts,
                store_host: new_store_host.then_some(store_host),
            };
            let mut in_place = source.to_vec();
            patch_record(&mut in_place, patch);
            let mut copy = vec![0xA5u8; source.len()];
            copy_patched(&mut copy, &source, patch);
            prop_assert_eq!(&copy, &in_place);
            prop_assert!(decode_message(&copy).unwrap().check_crcs().is_ok());
        }

        #[test]
        fn any_single_byte_flip_is_detected(pos_seed in any::<usize>(), bit in 0u8..8) {
            let props = [("KEYS", "k1 k2"), ("TAGS", "TagB")];
            let mut buf = BytesMut::new();
            encode_record(&mut buf, &input("TopicX", b"some body bytes", &props)).unwrap();
            patch_record(&mut buf, StorePatch { queue_id: 3, queue_offset: 9, physical_offset: 4096, store_timestamp_ms: 77, store_host: None });
            let pos = pos_seed % buf.len();
            buf[pos] ^= 1 << bit;
            prop_assert!(decode_entry(&buf).is_err(), "flip at byte {} bit {} went unnoticed", pos, bit);
        }

        #[test]
        fn decoding_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_entry(&bytes);
        }

        /// Random bytes almost never get past the magic code; this starts from a valid record
        /// (any topic, body, properties, host kinds) and damages it where the parser looks:
        /// the length fields (total, body, topic, properties) get arbitrary values, bytes are
        /// overwritten, the record is cut. Every decoder must answer without panicking, and a
        /// record the unchecked parser accepts has fields within its bytes.
        #[test]
        fn damaged_records_never_panic_the_decoders(
            topic in "[a-zA-Z0-9_%|-]{1,127}",
            body in proptest::collection::vec(any::<u8>(), 0..512),
            props in proptest::collection::vec(("[A-Za-z_]{1,12}", "[ -~]{0,40}"), 0..6),
            v6_born in any::<bool>(),
            v6_store in any::<bool>(),
            damage in proptest::collection::vec((0usize..5, any::<usize>(), any::<u32>()), 1..6),
            cut in proptest::option::of(any::<usize>()),
        ) {
            let prop_refs: Vec<(&str, &str)> =
                props.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let mut rec = input(&topic, &body, &prop_refs);
            if v6_born {
                rec.born_host = "[::1]:4242".parse().unwrap();
            }
            if v6_store {
                rec.store_host = "[::1]:10911".parse().unwrap();
            }
            let mut buf = BytesMut::new();
            encode_record(&mut buf, &rec).unwrap();
            let layout = Layout::for_sys_flag(read_u32(&buf, SYS_FLAG_AT));
            let topic_len_at = layout.body_length_at + 4 + body.len();
            let props_len_at = topic_len_at + 1 + topic.len();
            for (kind, at, value) in damage {
                let len = buf.len();
                match kind {
                    0 => buf[TOTAL_SIZE_AT..TOTAL_SIZE_AT + 4].copy_from_slice(&value.to_be_bytes()),
                    1 => buf[layout.body_length_at..layout.body_length_at + 4]
                        .copy_from_slice(&value.to_be_bytes()),
                    2 => buf[topic_len_at] = value as u8,
                    3 => buf[props_len_at..props_len_at + 2]
                        .copy_from_slice(&(value as u16).to_be_bytes()),
                    _ => buf[at % len] = value as u8,
                }
            }
            let bytes: &[u8] = match cut {
                Some(at) => &buf[..at % (buf.len() + 1)],
                None => &buf,
            };
            let _ = decode_entry(bytes);
            let _ = decode_message(bytes);
            if let Ok(view) = RecordView::parse_unchecked(bytes) {
                prop_assert!(view.total_size() as usize <= bytes.len());
                prop_assert!(view.body().len() <= bytes.len());
                let _ = view.check_record_crc();
                let _ = (view.topic(), view.tags(), view.unique_key(), view.born_host(), view.store_host());
                let _ = view.keys().count();
                let _ = view.properties().count();
            }
        }
    }
}
