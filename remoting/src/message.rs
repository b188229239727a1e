//! The message encodings a SEND carries and its reply names: the properties string, the offset
//! message id, and the SEND_BATCH_MESSAGE (320) body.
//!
//! Owns three formats:
//! - **Properties**: `name` 0x01 `value` 0x02, repeated, UTF-8, at most [`MAX_PROPERTIES_BYTES`]
//!   (a stored record holds their length in an i16). Parsed in place: pairs are slices of the
//!   input.
//! - **Offset message id**: upper-case hex of the store host's IP (4 or 16 bytes), its port
//!   (i32) and the physical offset (i64): 32 hex characters for IPv4, 56 for IPv6. The SEND reply
//!   `msgId`; clients parse it back into END_TRANSACTION's `commitLogOffset`.
//! - **Batch body**: records `{totalSize i32, magic i32, bodyCRC i32, flag i32, bodyLen i32 +
//!   body, propsLen i16 + properties}`, concatenated. Clients write 0 for magic and CRC, so both
//!   are ignored. Bodies and properties leave as slices of the request body (no copy).
//!
//! Never touches the store's record format (`shardmq-codec` owns that) or decides what a
//! property means.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use bytes::{BufMut, Bytes, BytesMut};

/// Separates a property's name from its value.
pub const NAME_VALUE_SEPARATOR: u8 = 0x01;
/// Ends each property.
pub const PROPERTY_SEPARATOR: u8 = 0x02;
/// Most bytes of an encoded properties string: its length is an i16 in stored records.
pub const MAX_PROPERTIES_BYTES: usize = i16::MAX as usize;

/// A properties string that cannot be parsed or encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PropertiesError {
    #[error("message properties are not UTF-8 (first bad byte at {valid_up_to})")]
    NotUtf8 { valid_up_to: usize },
    #[error("message property {index} has no name/value separator (0x01)")]
    MissingNameValueSeparator { index: usize },
    #[error("message property name {name:?} contains a separator byte (0x01 or 0x02)")]
    SeparatorInName { name: String },
    #[error("message property {name:?} has a value containing a separator byte (0x01 or 0x02)")]
    SeparatorInValue { name: String },
    #[error("message properties are {properties_bytes} bytes, over {MAX_PROPERTIES_BYTES}")]
    TooLong { properties_bytes: usize },
}

/// A validated properties string; iterating yields `(name, value)` slices of it, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Properties<'a> {
    text: &'a str,
}

/// Validates a properties string: UTF-8, and every property has a name/value separator. A
/// final property without its trailing 0x02 is accepted; an empty string has no properties.
/// The value is everything after the first 0x01, as RocketMQ reads it.
pub fn parse_properties(bytes: &[u8]) -> Result<Properties<'_>, PropertiesError> {
    let text = std::str::from_utf8(bytes).map_err(|error| PropertiesError::NotUtf8 {
        valid_up_to: error.valid_up_to(),
    })?;
    let properties = Properties { text };
    if let Some(index) = properties
        .entries()
        .position(|entry| !entry.contains(NAME_VALUE_SEPARATOR as char))
    {
        return Err(PropertiesError::MissingNameValueSeparator { index });
    }
    Ok(properties)
}

impl<'a> Properties<'a> {
    /// The value of the first property called `name`.
    pub fn get(&self, name: &str) -> Option<&'a str> {
        self.iter()
            .find(|(candidate, _)| *candidate == name)
            .map(|(_, value)| value)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a str)> {
        self.entries()
            .filter_map(|entry| entry.split_once(NAME_VALUE_SEPARATOR as char))
    }

    /// The raw properties, separators included.
    pub fn as_str(&self) -> &'a str {
        self.text
    }

    fn entries(&self) -> impl Iterator<Item = &'a str> {
        let text = self.text;
        let body = text
            .strip_suffix(PROPERTY_SEPARATOR as char)
            .unwrap_or(text);
        body.split(PROPERTY_SEPARATOR as char)
            .filter(move |_| !text.is_empty())
    }
}

/// Appends `name` 0x01 `value` 0x02 for each pair. Names and values must not contain either
/// separator, and the whole must fit [`MAX_PROPERTIES_BYTES`]. On error `dst` is unchanged.
pub fn encode_properties<I, N, V>(pairs: I, dst: &mut BytesMut) -> Result<(), PropertiesError>
where
    I: IntoIterator<Item = (N, V)>,
    N: AsRef<str>,
    V: AsRef<str>,
{
    let start = dst.len();
    let result = append_properties(pairs, dst).and_then(|()| {
        let properties_bytes = dst.len() - start;
        if properties_bytes > MAX_PROPERTIES_BYTES {
            Err(PropertiesError::TooLong { properties_bytes })
        } else {
            Ok(())
        }
    });
    if result.is_err() {
        dst.truncate(start);
    }
    result
}

fn append_properties<I, N, V>(pairs: I, dst: &mut BytesMut) -> Result<(), PropertiesError>
where
    I: IntoIterator<Item = (N, V)>,
    N: AsRef<str>,
    V: AsRef<str>,
{
    let is_separator = |byte: &u8| *byte == NAME_VALUE_SEPARATOR || *byte == PROPERTY_SEPARATOR;
    for (name, value) in pairs {
        let (name, value) = (name.as_ref(), value.as_ref());
        if name.as_bytes().iter().any(is_separator) {
            return Err(PropertiesError::SeparatorInName { name: name.into() });
        }
        if value.as_bytes().iter().any(is_separator) {
            return Err(PropertiesError::SeparatorInValue { name: name.into() });
        }
        dst.put_slice(name.as_bytes());
        dst.put_u8(NAME_VALUE_SEPARATOR);
        dst.put_slice(value.as_bytes());
        dst.put_u8(PROPERTY_SEPARATOR);
    }
    Ok(())
}

/// An offset message id that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OffsetMessageIdError {
    #[error(
        "offset message id is {length_bytes} bytes; it must be 32 (IPv4) or 56 (IPv6) hex digits"
    )]
    BadLength { length_bytes: usize },
    #[error("offset message id has a non-hex byte at {position}")]
    NotHex { position: usize },
    #[error("offset message id has port {port}, outside 0..=65535")]
    PortOutOfRange { port: i32 },
}

/// Where a stored message is: the store host and its physical offset. Shown as upper-case hex.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OffsetMessageId {
    pub store_host: SocketAddr,
    pub physical_offset: i64,
}

impl OffsetMessageId {
    /// Hex digits of an id with an IPv4 store host.
    pub const IPV4_HEX_DIGITS: usize = 2 * (4 + 4 + 8);
    /// Hex digits of an id with an IPv6 store host.
    pub const IPV6_HEX_DIGITS: usize = 2 * (16 + 4 + 8);

    pub fn new(store_host: SocketAddr, physical_offset: i64) -> OffsetMessageId {
        OffsetMessageId {
            store_host,
            physical_offset,
        }
    }

    /// Reads an id in either form, hex digits of either case.
    pub fn decode(text: &str) -> Result<OffsetMessageId, OffsetMessageIdError> {
        let mut raw = [0_u8; Self::IPV6_HEX_DIGITS / 2];
        let ip_bytes = match text.len() {
            Self::IPV4_HEX_DIGITS => 4,
            Self::IPV6_HEX_DIGITS => 16,
            length_bytes => return Err(OffsetMessageIdError::BadLength { length_bytes }),
        };
        let raw = &mut raw[..text.len() / 2];
        for (index, pair) in text.as_bytes().chunks_exact(2).enumerate() {
            let high = hex_value(pair[0]).ok_or(OffsetMessageIdError::NotHex {
                position: 2 * index,
            })?;
            let low = hex_value(pair[1]).ok_or(OffsetMessageIdError::NotHex {
                position: 2 * index + 1,
            })?;
            raw[index] = (high << 4) | low;
        }
        let (ip, rest) = raw.split_at(ip_bytes);
        let ip = if ip_bytes == 4 {
            IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]))
        } else {
            let mut octets = [0_u8; 16];
            octets.copy_from_slice(ip);
            IpAddr::V6(Ipv6Addr::from(octets))
        };
        let port = i32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
        let port =
            u16::try_from(port).map_err(|_| OffsetMessageIdError::PortOutOfRange { port })?;
        let mut offset = [0_u8; 8];
        offset.copy_from_slice(&rest[4..12]);
        Ok(OffsetMessageId {
            store_host: SocketAddr::new(ip, port),
            physical_offset: i64::from_be_bytes(offset),
        })
    }

    /// The id as upper-case hex: 32 digits for an IPv4 store host, 56 for IPv6.
    pub fn encode(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for OffsetMessageId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.store_host.ip() {
            IpAddr::V4(ip) => write_hex(formatter, &ip.octets())?,
            IpAddr::V6(ip) => write_hex(formatter, &ip.octets())?,
        }
        write_hex(formatter, &i32::from(self.store_host.port()).to_be_bytes())?;
        write_hex(formatter, &self.physical_offset.to_be_bytes())
    }
}

impl FromStr for OffsetMessageId {
    type Err = OffsetMessageIdError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        OffsetMessageId::decode(text)
    }
}

fn write_hex(formatter: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    bytes
        .iter()
        .try_for_each(|byte| write!(formatter, "{byte:02X}"))
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

/// Bytes of a batch record around its body and properties: totalSize, magic, bodyCRC, flag,
/// bodyLen (i32 each) and propsLen (i16).
pub const BATCH_RECORD_FIXED_BYTES: usize = 5 * 4 + 2;

/// A batch body that cannot be decoded or a record that cannot be encoded. `index` is the
/// record's position in the batch and `offset` its first byte in the body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error(
        "batch record {index} at byte {offset}: totalSize {total_size} is outside \
         {BATCH_RECORD_FIXED_BYTES}..={remaining_bytes} (the bytes that remain)"
    )]
    TotalSizeOutOfRange {
        index: usize,
        offset: usize,
        total_size: i64,
        remaining_bytes: usize,
    },
    #[error(
        "batch record {index} at byte {offset}: only {remaining_bytes} bytes remain, under the \
         4 of totalSize"
    )]
    Truncated {
        index: usize,
        offset: usize,
        remaining_bytes: usize,
    },
    #[error("batch record {index} at byte {offset}: {field} {length} is negative")]
    NegativeLength {
        index: usize,
        offset: usize,
        field: &'static str,
        length: i32,
    },
    #[error(
        "batch record {index} at byte {offset}: {field} of {length} bytes runs past the \
         record's totalSize {total_size}"
    )]
    FieldOverrun {
        index: usize,
        offset: usize,
        field: &'static str,
        length: usize,
        total_size: usize,
    },
    #[error(
        "batch record {index} at byte {offset}: totalSize {total_size} but its fields fill \
         {filled_bytes}"
    )]
    SizeMismatch {
        index: usize,
        offset: usize,
        total_size: usize,
        filled_bytes: usize,
    },
    #[error("batch record properties are {properties_bytes} bytes, over {MAX_PROPERTIES_BYTES}")]
    PropertiesTooLong { properties_bytes: usize },
    #[error("batch record is {record_bytes} bytes, over the 2147483647 its totalSize holds")]
    RecordTooLarge { record_bytes: usize },
}

/// One message of a batch. `body` and `properties` are slices of the batch body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchMessage {
    pub flag: i32,
    pub body: Bytes,
    /// Raw; read with [`parse_properties`].
    pub properties: Bytes,
}

/// The records of a SEND_BATCH_MESSAGE body, in order. Yields an error once and then stops:
/// after a bad record the rest cannot be trusted.
#[derive(Clone, Debug)]
pub struct BatchMessages {
    batch: Bytes,
    offset: usize,
    index: usize,
    is_done: bool,
}

impl BatchMessages {
    pub fn new(batch: Bytes) -> BatchMessages {
        BatchMessages {
            batch,
            offset: 0,
            index: 0,
            is_done: false,
        }
    }

    /// Decodes the record at `self.offset` and returns it with its total size.
    fn record(&self) -> Result<(BatchMessage, usize), BatchError> {
        let (index, offset) = (self.index, self.offset);
        let rest = &self.batch[offset..];
        let Some(total_size) = read_i32(rest, 0) else {
            return Err(BatchError::Truncated {
                index,
                offset,
                remaining_bytes: rest.len(),
            });
        };
        let total_size = match usize::try_from(total_size) {
            Ok(size) if (BATCH_RECORD_FIXED_BYTES..=rest.len()).contains(&size) => size,
            _ => {
                return Err(BatchError::TotalSizeOutOfRange {
                    index,
                    offset,
                    total_size: i64::from(total_size),
                    remaining_bytes: rest.len(),
                })
            }
        };
        let record = &rest[..total_size];
        let negative = |field, length| BatchError::NegativeLength {
            index,
            offset,
            field,
            length,
        };
        let overrun = |field, length| BatchError::FieldOverrun {
            index,
            offset,
            field,
            length,
            total_size,
        };
        // Fixed fields: totalSize 0, magic 4, bodyCRC 8, flag 12, bodyLen 16, body from 20.
        let flag = read_i32(record, 12).ok_or_else(|| overrun("flag", 4))?;
        let body_len = read_i32(record, 16).ok_or_else(|| overrun("bodyLen", 4))?;
        let body_len = usize::try_from(body_len).map_err(|_| negative("bodyLen", body_len))?;
        let body_start = 20;
        let body_end = body_start + body_len;
        // The properties length must fit after the body, inside the record.
        if body_end + 2 > total_size {
            return Err(overrun("body", body_len));
        }
        let properties_len = i16::from_be_bytes([record[body_end], record[body_end + 1]]);
        let properties_len = usize::try_from(properties_len)
            .map_err(|_| negative("propsLen", i32::from(properties_len)))?;
        let properties_start = body_end + 2;
        let properties_end = properties_start + properties_len;
        if properties_end > total_size {
            return Err(overrun("properties", properties_len));
        }
        if properties_end != total_size {
            return Err(BatchError::SizeMismatch {
                index,
                offset,
                total_size,
                filled_bytes: properties_end,
            });
        }
        let message = BatchMessage {
            flag,
            body: self.batch.slice(offset + body_start..offset + body_end),
            properties: self
                .batch
                .slice(offset + properties_start..offset + properties_end),
        };
        Ok((message, total_size))
    }
}

impl Iterator for BatchMessages {
    type Item = Result<BatchMessage, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.is_done || self.offset == self.batch.len() {
            return None;
        }
        match self.record() {
            Ok((message, total_size)) => {
                self.offset += total_size;
                self.index += 1;
                debug_assert!(self.offset <= self.batch.len());
                Some(Ok(message))
            }
            Err(error) => {
                self.is_done = true;
                Some(Err(error))
            }
        }
    }
}

impl std::iter::FusedIterator for BatchMessages {}

fn read_i32(bytes: &[u8], at: usize) -> Option<i32> {
    let field = bytes.get(at..at.checked_add(4)?)?;
    Some(i32::from_be_bytes([field[0], field[1], field[2], field[3]]))
}

/// Appends one batch record (magic and bodyCRC written as 0, as clients do). On error `dst` is
/// unchanged.
pub fn encode_batch_record(
    flag: i32,
    body: &[u8],
    properties: &[u8],
    dst: &mut BytesMut,
) -> Result<(), BatchError> {
    let properties_len =
        i16::try_from(properties.len()).map_err(|_| BatchError::PropertiesTooLong {
            properties_bytes: properties.len(),
        })?;
    let record_bytes = BATCH_RECORD_FIXED_BYTES + body.len() + properties.len();
    let total_size =
        i32::try_from(record_bytes).map_err(|_| BatchError::RecordTooLarge { record_bytes })?;
    dst.reserve(record_bytes);
    dst.put_i32(total_size);
    dst.put_i32(0);
    dst.put_i32(0);
    dst.put_i32(flag);
    // body.len() < record_bytes, which fits an i32.
    dst.put_i32(body.len() as i32);
    dst.put_slice(body);
    dst.put_i16(properties_len);
    dst.put_slice(properties);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_parse_in_place() {
        let raw = b"UNIQ_KEY\x01ABC\x02WAIT\x01true\x02TAGS\x01a\x01b\x02";
        let properties = parse_properties(raw).expect("parses");
        let pairs: Vec<_> = properties.iter().collect();
        assert_eq!(
            pairs,
            [("UNIQ_KEY", "ABC"), ("WAIT", "true"), ("TAGS", "a\x01b")]
        );
        assert_eq!(properties.get("WAIT"), Some("true"));
        assert_eq!(properties.get("DELAY"), None);
        assert!(std::ptr::eq(
            properties.get("UNIQ_KEY").unwrap().as_ptr(),
            raw[9..].as_ptr()
        ));
    }

    #[test]
    fn properties_edge_cases() {
        assert_eq!(parse_properties(b"").unwrap().iter().count(), 0);
        let no_trailing = parse_properties(b"A\x011\x02B\x012").unwrap();
        assert_eq!(no_trailing.get("B"), Some("2"));
        let empty_value = parse_properties(b"A\x01\x02").unwrap();
        assert_eq!(empty_value.get("A"), Some(""));
        assert_eq!(
            parse_properties(b"A\x011\x02junk\x02"),
            Err(PropertiesError::MissingNameValueSeparator { index: 1 })
        );
        assert_eq!(
            parse_properties(b"A\x011\x02\x02B\x012\x02"),
            Err(PropertiesError::MissingNameValueSeparator { index: 1 })
        );
        assert_eq!(
            parse_properties(b"A\x01\xff\x02"),
            Err(PropertiesError::NotUtf8 { valid_up_to: 2 })
        );
    }

    #[test]
    fn properties_encode() {
        let mut dst = BytesMut::new();
        encode_properties([("KEYS", "k1 k2"), ("WAIT", "false")], &mut dst).expect("encodes");
        assert_eq!(&dst[..], b"KEYS\x01k1 k2\x02WAIT\x01false\x02");

        let before = dst.clone();
        assert_eq!(
            encode_properties([("A", "x"), ("B\x02", "y")], &mut dst),
            Err(PropertiesError::SeparatorInName {
                name: "B\x02".into()
            })
        );
        assert_eq!(
            encode_properties([("A", "x\x01")], &mut dst),
            Err(PropertiesError::SeparatorInValue { name: "A".into() })
        );
        let huge = "v".repeat(MAX_PROPERTIES_BYTES);
        assert_eq!(
            encode_properties([("A", huge.as_str())], &mut dst),
            Err(PropertiesError::TooLong {
                properties_bytes: MAX_PROPERTIES_BYTES + 3
            })
        );
        assert_eq!(dst, before, "failed encodes leave dst alone");
    }

    #[test]
    fn offset_message_id_ipv4() {
        let id = OffsetMessageId::new("10.0.0.1:10911".parse().unwrap(), 0x1234_5678_9ABC);
        let text = id.encode();
        assert_eq!(text, "0A00000100002A9F0000123456789ABC");
        assert_eq!(text.len(), OffsetMessageId::IPV4_HEX_DIGITS);
        assert_eq!(OffsetMessageId::decode(&text), Ok(id));
        assert_eq!(
            OffsetMessageId::decode(&text.to_lowercase()),
            Ok(id),
            "lower case is read too"
        );
    }

    #[test]
    fn offset_message_id_ipv6() {
        let id = OffsetMessageId::new("[fe80::1]:10911".parse().unwrap(), -1);
        let text = id.encode();
        assert_eq!(text.len(), OffsetMessageId::IPV6_HEX_DIGITS);
        assert!(text.starts_with("FE80000000000000"));
        assert!(text.ends_with("00002A9FFFFFFFFFFFFFFFFF"));
        assert_eq!(text.parse::<OffsetMessageId>(), Ok(id));
    }

    #[test]
    fn offset_message_id_errors() {
        assert_eq!(
            OffsetMessageId::decode("0A000001"),
            Err(OffsetMessageIdError::BadLength { length_bytes: 8 })
        );
        assert_eq!(
            OffsetMessageId::decode(&"0".repeat(33)),
            Err(OffsetMessageIdError::BadLength { length_bytes: 33 })
        );
        assert_eq!(
            OffsetMessageId::decode("0A00000100002A9F000012345678ZABC"),
            Err(OffsetMessageIdError::NotHex { position: 28 })
        );
        // 16 two-byte characters are 32 bytes but not hex.
        assert_eq!(
            OffsetMessageId::decode(&"é".repeat(16)),
            Err(OffsetMessageIdError::NotHex { position: 0 })
        );
        assert_eq!(
            OffsetMessageId::decode("0A000001FFFFFFFF0000123456789ABC"),
            Err(OffsetMessageIdError::PortOutOfRange { port: -1 })
        );
        assert_eq!(
            OffsetMessageId::decode("0A000001000100000000123456789ABC"),
            Err(OffsetMessageIdError::PortOutOfRange { port: 65536 })
        );
    }

    fn batch_of(records: &[(i32, &[u8], &[u8])]) -> Bytes {
        let mut dst = BytesMut::new();
        for (flag, body, properties) in records {
            encode_batch_record(*flag, body, properties, &mut dst).expect("encodes");
        }
        dst.freeze()
    }

    #[test]
    fn batch_records_decode_as_slices() {
        let batch = batch_of(&[
            (1, b"one", b"A\x011\x02"),
            (0, b"", b""),
            (7, b"three", b""),
        ]);
        let messages: Vec<_> = BatchMessages::new(batch.clone())
            .collect::<Result<_, _>>()
            .expect("decodes");
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[0].flag, 1);
        assert_eq!(&messages[0].body[..], b"one");
        assert_eq!(
            parse_properties(&messages[0].properties).unwrap().get("A"),
            Some("1")
        );
        assert!(messages[1].body.is_empty());
        assert_eq!(&messages[2].body[..], b"three");
        let batch_range = batch.as_ptr_range();
        assert!(batch_range.contains(&messages[2].body.as_ptr()));
        assert_eq!(BatchMessages::new(Bytes::new()).count(), 0);
    }

    fn first_error(batch: Vec<u8>) -> BatchError {
        BatchMessages::new(Bytes::from(batch))
            .find_map(Result::err)
            .expect("an error")
    }

    #[test]
    fn batch_lengths_that_lie_are_refused() {
        let good = batch_of(&[(0, b"body", b"A\x011\x02")]).to_vec();

        let mut short_total = good.clone();
        short_total[..4].copy_from_slice(&10_i32.to_be_bytes());
        assert!(matches!(
            first_error(short_total),
            BatchError::TotalSizeOutOfRange { total_size: 10, .. }
        ));

        let mut long_total = good.clone();
        long_total[..4].copy_from_slice(&1000_i32.to_be_bytes());
        assert!(matches!(
            first_error(long_total),
            BatchError::TotalSizeOutOfRange {
                total_size: 1000,
                remaining_bytes: 30,
                ..
            }
        ));

        let mut negative_body = good.clone();
        negative_body[16..20].copy_from_slice(&(-5_i32).to_be_bytes());
        assert!(matches!(
            first_error(negative_body),
            BatchError::NegativeLength {
                field: "bodyLen",
                length: -5,
                ..
            }
        ));

        let mut long_body = good.clone();
        long_body[16..20].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(matches!(
            first_error(long_body),
            BatchError::FieldOverrun { field: "body", .. }
        ));

        let mut long_properties = good.clone();
        long_properties[24..26].copy_from_slice(&100_i16.to_be_bytes());
        assert!(matches!(
            first_error(long_properties),
            BatchError::FieldOverrun {
                field: "properties",
                length: 100,
                ..
            }
        ));

        let mut negative_properties = good.clone();
        negative_properties[24..26].copy_from_slice(&(-1_i16).to_be_bytes());
        assert!(matches!(
            first_error(negative_properties),
            BatchError::NegativeLength {
                field: "propsLen",
                ..
            }
        ));

        let mut short_properties = good.clone();
        short_properties[24..26].copy_from_slice(&1_i16.to_be_bytes());
        assert!(matches!(
            first_error(short_properties),
            BatchError::SizeMismatch {
                total_size: 30,
                filled_bytes: 27,
                ..
            }
        ));

        let mut trailing = good.clone();
        trailing.extend_from_slice(&[0, 0]);
        assert!(matches!(
            first_error(trailing),
            BatchError::Truncated {
                index: 1,
                offset: 30,
                remaining_bytes: 2
            }
        ));
    }

    #[test]
    fn batch_iteration_stops_after_an_error() {
        let mut batch = batch_of(&[(0, b"a", b""), (0, b"b", b"")]).to_vec();
        batch[..4].copy_from_slice(&3_i32.to_be_bytes());
        let mut messages = BatchMessages::new(Bytes::from(batch));
        assert!(matches!(messages.next(), Some(Err(_))));
        assert!(messages.next().is_none());
    }

    #[test]
    fn batch_record_properties_are_bounded() {
        let properties = vec![b'x'; MAX_PROPERTIES_BYTES + 1];
        let mut dst = BytesMut::new();
        assert_eq!(
            encode_batch_record(0, b"", &properties, &mut dst),
            Err(BatchError::PropertiesTooLong {
                properties_bytes: MAX_PROPERTIES_BYTES + 1
            })
        );
        assert!(dst.is_empty());
    }
}
