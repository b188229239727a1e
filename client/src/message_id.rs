//! Message ids: the unique id a producer gives each message ([`MessageId`], RocketMQ's
//! `UNIQ_KEY`, the id users see), and the broker's offset id, which names where a message is
//! stored and which the client derives from a send's answer ([`OffsetMessageId`]).
//!
//! Owns: making unique ids (16 bytes, nothing allocated), their text form (32 upper-case hex
//! characters, written straight into a record or formatted when shown), and the offset id's
//! text form, which must equal the broker's (`offset_message_id` in `broker/base/src/msgid.rs`)
//! character for character, since users look messages up by it. Never: sending or storing.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::host::local_ipv4;

/// Characters of a unique id made by a client: 16 bytes as upper-case hex.
pub const MESSAGE_ID_HEX_LEN: usize = 32;

const DIGITS: &[u8; 16] = b"0123456789ABCDEF";

/// Writes `bytes` as upper-case hex into `out`, which is exactly twice as long.
fn write_upper_hex(bytes: &[u8], out: &mut [u8]) {
    debug_assert_eq!(out.len(), bytes.len() * 2);
    for (byte, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0x0F)];
    }
}

/// The value of an upper-case hex digit (lower case is not accepted: a parsed id must format
/// back to the same text).
fn upper_hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// The bytes of upper-case hex `text` into `out` (`text` exactly twice as long), or `None`.
fn parse_upper_hex(text: &[u8], out: &mut [u8]) -> Option<()> {
    if text.len() != out.len() * 2 {
        return None;
    }
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        *byte = upper_hex_value(pair[0])? << 4 | upper_hex_value(pair[1])?;
    }
    Some(())
}

/// A message's unique id (RocketMQ's `UNIQ_KEY`): what [`Producer::send`] reports as
/// `msg_id` and consumers see as [`MessageExt::msg_id`].
///
/// An id the client makes ([`MessageId::generate`], done by [`Message::new`]) is 16 bytes,
/// copied and compared without allocating and formatted only when shown: 32 upper-case hex
/// characters of the local IPv4 address (4 bytes), the process id (2), a per-process salt (2),
/// seconds since the epoch (4) and a per-process counter (4). An id given as text
/// ([`Message::with_unique_id`], to resend a message under its first id) is kept as 16 bytes
/// when it has that form, and as its text otherwise; either way it compares equal to its text.
///
/// ```
/// use shardmq_client::MessageId;
/// let id = MessageId::generate();
/// let text = id.to_string();
/// assert_eq!(text.len(), 32);
/// assert_eq!(MessageId::from(text.as_str()), id);
/// assert_eq!(id, text);
/// ```
///
/// [`Producer::send`]: crate::Producer::send
/// [`MessageExt::msg_id`]: crate::MessageExt::msg_id
/// [`Message::new`]: crate::Message::new
/// [`Message::with_unique_id`]: crate::Message::with_unique_id
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(Repr);

/// Ids of the 16-byte form are always `Bytes` (text of that form is parsed), so equality of
/// the representation is equality of the text.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Repr {
    Bytes([u8; 16]),
    Text(Arc<str>),
}

/// What a unique id starts with in this process: local IPv4 address (4 bytes), process id
/// (low 2 bytes) and a per-process salt (2 bytes) from the start time, so two processes that
/// reuse a pid still differ.
fn unique_id_prefix() -> &'static [u8; 8] {
    static PREFIX: OnceLock<[u8; 8]> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let mut prefix = [0u8; 8];
        prefix[..4].copy_from_slice(&local_ipv4().octets());
        prefix[4..6].copy_from_slice(&(std::process::id() as u16).to_be_bytes());
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| elapsed.subsec_nanos())
            .unwrap_or(0);
        prefix[6..8].copy_from_slice(&((nanos >> 8) as u16).to_be_bytes());
        prefix
    })
}

/// Seconds since the epoch from the coarse clock: a read of memory the kernel updates every
/// tick, a few ns, where the precise clock costs tens of ns on a VM. An id needs no more than
/// the second.
fn coarse_epoch_seconds() -> u32 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes one `timespec` through the valid pointer it is given.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut now) };
    if status == 0 {
        now.tv_sec as u32
    } else {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs() as u32)
    }
}

impl MessageId {
    /// A new unique id. Unique unless one process makes more than 2^32 ids within one second.
    #[must_use]
    pub fn generate() -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(unique_id_prefix());
        bytes[8..12].copy_from_slice(&coarse_epoch_seconds().to_be_bytes());
        let count = COUNTER.fetch_add(1, Ordering::Relaxed);
        bytes[12..16].copy_from_slice(&count.to_be_bytes());
        Self(Repr::Bytes(bytes))
    }

    /// The id whose text is these 16 bytes in upper-case hex.
    #[must_use]
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(Repr::Bytes(bytes))
    }

    /// The 16 bytes, for an id of that form (every id a client makes).
    #[must_use]
    pub fn as_bytes(&self) -> Option<&[u8; 16]> {
        match &self.0 {
            Repr::Bytes(bytes) => Some(bytes),
            Repr::Text(_) => None,
        }
    }

    /// Whether the id is empty (given as an empty text): a message sent with none is named by
    /// its offset id.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        matches!(&self.0, Repr::Text(text) if text.is_empty())
    }

    /// Length of the id's text in bytes.
    #[must_use]
    pub fn text_len(&self) -> usize {
        match &self.0 {
            Repr::Bytes(_) => MESSAGE_ID_HEX_LEN,
            Repr::Text(text) => text.len(),
        }
    }

    /// Writes the id's text into `out`, exactly [`text_len`](Self::text_len) bytes: how a
    /// producer puts it into a record without making a `String`.
    pub(crate) fn write_text(&self, out: &mut [u8]) {
        match &self.0 {
            Repr::Bytes(bytes) => write_upper_hex(bytes, out),
            Repr::Text(text) => out.copy_from_slice(text.as_bytes()),
        }
    }

    /// The id's text, when it is kept as text (an id given by the application in another form).
    pub(crate) fn as_text(&self) -> Option<&str> {
        match &self.0 {
            Repr::Bytes(_) => None,
            Repr::Text(text) => Some(text),
        }
    }

    fn with_text<R>(&self, use_text: impl FnOnce(&str) -> R) -> R {
        match &self.0 {
            Repr::Bytes(bytes) => {
                let mut text = [0u8; MESSAGE_ID_HEX_LEN];
                write_upper_hex(bytes, &mut text);
                use_text(std::str::from_utf8(&text).unwrap_or_default())
            }
            Repr::Text(text) => use_text(text),
        }
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with_text(|text| formatter.write_str(text))
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with_text(|text| write!(formatter, "MessageId({text:?})"))
    }
}

impl From<[u8; 16]> for MessageId {
    fn from(bytes: [u8; 16]) -> Self {
        Self::from_bytes(bytes)
    }
}

impl From<&str> for MessageId {
    /// Kept as 16 bytes when `text` is 32 upper-case hex characters, else as the text.
    fn from(text: &str) -> Self {
        let mut bytes = [0u8; 16];
        match parse_upper_hex(text.as_bytes(), &mut bytes) {
            Some(()) => Self(Repr::Bytes(bytes)),
            None => Self(Repr::Text(Arc::from(text))),
        }
    }
}

impl From<String> for MessageId {
    fn from(text: String) -> Self {
        Self::from(text.as_str())
    }
}

impl From<&String> for MessageId {
    fn from(text: &String) -> Self {
        Self::from(text.as_str())
    }
}

impl From<&MessageId> for MessageId {
    fn from(id: &MessageId) -> Self {
        id.clone()
    }
}

impl std::str::FromStr for MessageId {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Self::from(text))
    }
}

impl From<MessageId> for String {
    fn from(id: MessageId) -> Self {
        id.to_string()
    }
}

impl From<&MessageId> for String {
    fn from(id: &MessageId) -> Self {
        id.to_string()
    }
}

impl PartialEq<str> for MessageId {
    fn eq(&self, other: &str) -> bool {
        match &self.0 {
            Repr::Text(text) => &**text == other,
            Repr::Bytes(bytes) => {
                let mut parsed = [0u8; 16];
                parse_upper_hex(other.as_bytes(), &mut parsed).is_some() && parsed == *bytes
            }
        }
    }
}

impl PartialEq<&str> for MessageId {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

impl PartialEq<String> for MessageId {
    fn eq(&self, other: &String) -> bool {
        *self == *other.as_str()
    }
}

impl PartialEq<MessageId> for str {
    fn eq(&self, other: &MessageId) -> bool {
        *other == *self
    }
}

impl PartialEq<MessageId> for &str {
    fn eq(&self, other: &MessageId) -> bool {
        *other == **self
    }
}

impl PartialEq<MessageId> for String {
    fn eq(&self, other: &MessageId) -> bool {
        *other == *self.as_str()
    }
}

/// Where the broker stored a message, as RocketMQ's offset message id names it: the store
/// host's address and port, then the physical offset with the storage shard in its top byte
/// (physical offsets repeat across a broker's storage shards). Its text is the broker's
/// `SendResult.offset_msg_id`: 32 upper-case hex characters for IPv4, 56 for IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct OffsetMessageId {
    pub store_host: SocketAddr,
    pub storage_shard: u32,
    pub physical_offset: u64,
}

/// Bytes of an offset id: address, port (4), shard and offset (8).
const fn offset_id_bytes(is_ipv6: bool) -> usize {
    (if is_ipv6 { 16 } else { 4 }) + 4 + 8
}

impl OffsetMessageId {
    /// The offset's top byte holds the storage shard.
    const SHARD_SHIFT: u32 = 56;

    /// Reads the broker's text form back (IPv4 or IPv6 store host).
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let is_ipv6 = match text.len() {
            len if len == 2 * offset_id_bytes(false) => false,
            len if len == 2 * offset_id_bytes(true) => true,
            _ => return None,
        };
        let mut bytes = [0u8; offset_id_bytes(true)];
        let bytes = &mut bytes[..offset_id_bytes(is_ipv6)];
        parse_upper_hex(text.as_bytes(), bytes)?;
        let address_len = if is_ipv6 { 16 } else { 4 };
        let (address, rest) = bytes.split_at(address_len);
        let ip = if is_ipv6 {
            IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(address).ok()?))
        } else {
            IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(address).ok()?))
        };
        let port = u32::from_be_bytes(rest[..4].try_into().ok()?) as u16;
        let raw = u64::from_be_bytes(rest[4..12].try_into().ok()?);
        Some(Self {
            store_host: SocketAddr::new(ip, port),
            storage_shard: (raw >> Self::SHARD_SHIFT) as u32,
            physical_offset: raw & ((1 << Self::SHARD_SHIFT) - 1),
        })
    }
}

impl fmt::Display for OffsetMessageId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut bytes = [0u8; offset_id_bytes(true)];
        let mut len = 0;
        match self.store_host.ip() {
            IpAddr::V4(ip) => {
                bytes[..4].copy_from_slice(&ip.octets());
                len += 4;
            }
            IpAddr::V6(ip) => {
                bytes[..16].copy_from_slice(&ip.octets());
                len += 16;
            }
        }
        bytes[len..len + 4].copy_from_slice(&u32::from(self.store_host.port()).to_be_bytes());
        len += 4;
        let raw = (u64::from(self.storage_shard) << Self::SHARD_SHIFT) | self.physical_offset;
        bytes[len..len + 8].copy_from_slice(&raw.to_be_bytes());
        len += 8;
        let mut text = [0u8; 2 * offset_id_bytes(true)];
        write_upper_hex(&bytes[..len], &mut text[..2 * len]);
        formatter.write_str(std::str::from_utf8(&text[..2 * len]).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_differ_and_print_as_32_upper_hex() {
        let first = MessageId::generate();
        let second = MessageId::generate();
        assert_ne!(first, second);
        let text = first.to_string();
        assert_eq!(text.len(), MESSAGE_ID_HEX_LEN);
        assert!(text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b)));
        assert_eq!(
            &text[..16],
            &second.to_string()[..16],
            "same process, same prefix"
        );
        let mut written = [0u8; MESSAGE_ID_HEX_LEN];
        first.write_text(&mut written);
        assert_eq!(&written[..], text.as_bytes());
        assert_eq!(first.text_len(), MESSAGE_ID_HEX_LEN);
    }

    #[test]
    fn ids_format_their_bytes_as_the_formatter_does() {
        let bytes: [u8; 16] = [
            0x00, 0x01, 0x7F, 0x80, 0xAB, 0xCD, 0xEF, 0xFF, 0x10, 0x20, 0x30, 0x40, 0x5A, 0xA5,
            0x09, 0x90,
        ];
        let expected: String = bytes.iter().map(|b| format!("{b:02X}")).collect();
        let id = MessageId::from_bytes(bytes);
        assert_eq!(id.to_string(), expected);
        assert_eq!(format!("{id:?}"), format!("MessageId({expected:?})"));
        assert_eq!(String::from(&id), expected);
        assert_eq!(id.as_bytes(), Some(&bytes));
    }

    #[test]
    fn text_ids_compare_as_their_text() {
        let hex = "0A0B0C0D00010002000000030000ABCD";
        let parsed = MessageId::from(hex);
        assert!(
            parsed.as_bytes().is_some(),
            "32 upper-case hex digits are kept as bytes"
        );
        assert_eq!(parsed, hex);
        assert_eq!(hex, parsed);
        assert_eq!(parsed.to_string(), hex);
        assert_ne!(parsed, "0A0B0C0D00010002000000030000ABCE");
        // Other forms are kept as text and printed back unchanged.
        for text in [
            "0a0b0c0d00010002000000030000abcd",
            "127.0.0.1:10911@0000000000000010",
            "",
            "x",
        ] {
            let id = MessageId::from(text);
            assert!(id.as_bytes().is_none(), "{text}");
            assert_eq!(id.to_string(), text);
            assert_eq!(id, text);
            assert_eq!(id.text_len(), text.len());
            assert_eq!(id.as_text(), Some(text));
        }
        assert!(MessageId::from("").is_empty());
        assert!(!parsed.is_empty());
        assert_ne!(MessageId::from("0a0b0c0d00010002000000030000abcd"), parsed);
        assert_eq!("x".parse::<MessageId>().unwrap(), "x");
    }

    /// Expected texts produced by the broker's `shardmq_base::msgid::offset_message_id` for the
    /// same (store host, storage shard, physical offset); the client cannot depend on the
    /// broker's crates, so its output is written down here.
    const BROKER_OFFSET_IDS: &[(&str, u32, u64, &str)] = &[
        (
            "10.1.2.3:10911",
            1,
            123_456,
            "0A01020300002A9F010000000001E240",
        ),
        ("127.0.0.1:10911", 0, 0, "7F00000100002A9F0000000000000000"),
        (
            "127.0.0.1:40001",
            3,
            0x00AB_CDEF_0123_4567,
            "7F00000100009C4103ABCDEF01234567",
        ),
        (
            "192.168.200.17:1",
            255,
            (1 << 56) - 1,
            "C0A8C81100000001FFFFFFFFFFFFFFFF",
        ),
        (
            "[::1]:10911",
            2,
            4096,
            "0000000000000000000000000000000100002A9F0200000000001000",
        ),
    ];

    #[test]
    fn offset_ids_are_formatted_as_the_broker_formats_them() {
        for &(host, storage_shard, physical_offset, expected) in BROKER_OFFSET_IDS {
            let id = OffsetMessageId {
                store_host: host.parse().unwrap(),
                storage_shard,
                physical_offset,
            };
            assert_eq!(
                id.to_string(),
                expected,
                "{host} {storage_shard} {physical_offset}"
            );
            assert_eq!(OffsetMessageId::parse(expected), Some(id));
        }
        assert_eq!(OffsetMessageId::parse("7F000001"), None);
        assert_eq!(
            OffsetMessageId::parse("7f00000100002a9f0000000000000000"),
            None,
            "the broker writes upper case"
        );
    }
}
