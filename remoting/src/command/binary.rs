//! The ROCKETMQ binary command header (serialize type 1).
//!
//! Owns the byte layout, big-endian throughout:
//!
//! | bytes | field |
//! |---|---|
//! | 2 | `code` i16 |
//! | 1 | `language` u8 |
//! | 2 | `version` i16 |
//! | 4 | `opaque` i32 |
//! | 4 | `flag` i32 |
//! | 4 + n | `remarkLen` i32, then n bytes of UTF-8 remark (0 = no remark) |
//! | 4 + m | `extLen` i32, then m bytes of entries {`keyLen` i16 + key, `valLen` i32 + value} |
//!
//! so [`FIXED_BYTES`] is the smallest header. Never sees the frame around the header or the
//! body. Every length is checked for sign and against the bytes that remain before anything is
//! read with it; the ext entries must fill `extLen` exactly and the ext section must end the
//! header.

use std::collections::BTreeMap;

use bytes::{BufMut, BytesMut};

use super::{EncodeError, HeaderError, HeaderLimits, LanguageCode, RemotingCommand, SerializeType};

/// Bytes of a header with no remark and no ext fields.
pub const FIXED_BYTES: usize = 2 + 1 + 2 + 4 + 4 + 4 + 4;

pub(super) fn encode(command: &RemotingCommand, dst: &mut BytesMut) -> Result<(), EncodeError> {
    let code = to_i16("code", command.code)?;
    let version = to_i16("version", command.version)?;
    let remark = command.remark.as_deref().unwrap_or("");
    let remark_len = to_i32_length("remark", remark.len())?;
    let ext_len = to_i32_length("extFields", ext_section_bytes(&command.ext_fields))?;

    dst.reserve(FIXED_BYTES + remark.len() + ext_len as usize);
    dst.put_i16(code);
    dst.put_u8(command.language.code());
    dst.put_i16(version);
    dst.put_i32(command.opaque);
    dst.put_i32(command.flag);
    dst.put_i32(remark_len);
    dst.put_slice(remark.as_bytes());
    dst.put_i32(ext_len);
    for (key, value) in &command.ext_fields {
        let key_len = i16::try_from(key.len()).map_err(|_| EncodeError::ExtKeyTooLong {
            key_bytes: key.len(),
        })?;
        dst.put_i16(key_len);
        dst.put_slice(key.as_bytes());
        dst.put_i32(to_i32_length("ext value", value.len())?);
        dst.put_slice(value.as_bytes());
    }
    Ok(())
}

fn ext_section_bytes(ext_fields: &BTreeMap<String, String>) -> usize {
    ext_fields
        .iter()
        .map(|(key, value)| 2 + key.len() + 4 + value.len())
        .sum()
}

fn to_i16(field: &'static str, value: i32) -> Result<i16, EncodeError> {
    i16::try_from(value).map_err(|_| EncodeError::OutOfI16Range { field, value })
}

fn to_i32_length(field: &'static str, length_bytes: usize) -> Result<i32, EncodeError> {
    i32::try_from(length_bytes).map_err(|_| EncodeError::LengthTooLarge {
        field,
        length_bytes,
    })
}

pub(super) fn decode(header: &[u8], limits: &HeaderLimits) -> Result<RemotingCommand, HeaderError> {
    let mut reader = Reader { rest: header };
    let code = reader.i16("code")?;
    // An unknown language number (a newer client's) is read as OTHER, as in the JSON header.
    let language = LanguageCode::from_code(reader.u8("language")?).unwrap_or(LanguageCode::Other);
    let version = reader.i16("version")?;
    let opaque = reader.i32("opaque")?;
    let flag = reader.i32("flag")?;
    let remark_len = reader.length_i32("remarkLen")?;
    let remark = match remark_len {
        0 => None,
        _ => Some(utf8(reader.take("remark", remark_len)?, "remark")?.to_owned()),
    };
    let ext_len = reader.length_i32("extLen")?;
    let ext_fields = decode_ext(reader.take("extFields", ext_len)?, limits)?;
    if !reader.rest.is_empty() {
        return Err(HeaderError::TrailingBytes {
            trailing_bytes: reader.rest.len(),
        });
    }
    Ok(RemotingCommand {
        code: i32::from(code),
        language,
        version: i32::from(version),
        opaque,
        flag,
        remark,
        ext_fields,
        body: bytes::Bytes::new(),
        serialize_type: SerializeType::RocketMq,
    })
}

fn decode_ext(
    section: &[u8],
    limits: &HeaderLimits,
) -> Result<BTreeMap<String, String>, HeaderError> {
    let mut reader = Reader { rest: section };
    let mut ext_fields = BTreeMap::new();
    while !reader.rest.is_empty() {
        let key_len = reader.i16("keyLen")?;
        let key_len = usize::try_from(key_len).map_err(|_| HeaderError::NegativeLength {
            field: "keyLen",
            length: i64::from(key_len),
        })?;
        limits.check_ext_field(ext_fields.len(), key_len)?;
        let key = utf8(reader.take("ext key", key_len)?, "ext key")?;
        let value_len = reader.length_i32("valLen")?;
        let value = utf8(reader.take("ext value", value_len)?, "ext value")?;
        ext_fields.insert(key.to_owned(), value.to_owned());
    }
    Ok(ext_fields)
}

fn utf8<'a>(bytes: &'a [u8], field: &'static str) -> Result<&'a str, HeaderError> {
    std::str::from_utf8(bytes).map_err(|_| HeaderError::NotUtf8 { field })
}

/// A cursor that never reads past its slice: every take is checked against what remains.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, field: &'static str, needed_bytes: usize) -> Result<&'a [u8], HeaderError> {
        if needed_bytes > self.rest.len() {
            return Err(HeaderError::Truncated {
                field,
                needed_bytes,
                remaining_bytes: self.rest.len(),
            });
        }
        let (taken, rest) = self.rest.split_at(needed_bytes);
        self.rest = rest;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], HeaderError> {
        let mut array = [0; N];
        array.copy_from_slice(self.take(field, N)?);
        Ok(array)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, HeaderError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn i16(&mut self, field: &'static str) -> Result<i16, HeaderError> {
        Ok(i16::from_be_bytes(self.array(field)?))
    }

    fn i32(&mut self, field: &'static str) -> Result<i32, HeaderError> {
        Ok(i32::from_be_bytes(self.array(field)?))
    }

    /// An i32 length, refused when negative. The caller's `take` checks it against what remains.
    fn length_i32(&mut self, field: &'static str) -> Result<usize, HeaderError> {
        let length = self.i32(field)?;
        usize::try_from(length).map_err(|_| HeaderError::NegativeLength {
            field,
            length: i64::from(length),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RemotingCommand {
        RemotingCommand::request(310, 99)
            .with_remark("hi")
            .with_ext("a", "PG")
            .with_ext("b", "T")
            .with_serialize_type(SerializeType::RocketMq)
    }

    fn encoded(command: &RemotingCommand) -> Vec<u8> {
        let mut dst = BytesMut::new();
        encode(command, &mut dst).expect("encodes");
        dst.to_vec()
    }

    #[test]
    fn layout_matches_the_table() {
        let bytes = encoded(&sample());
        let expected: Vec<u8> = [
            &310_i16.to_be_bytes()[..],
            &[0],
            &479_i16.to_be_bytes(),
            &99_i32.to_be_bytes(),
            &0_i32.to_be_bytes(),
            &2_i32.to_be_bytes(),
            b"hi",
            &((2 + 1 + 4 + 2) + (2 + 1 + 4 + 1_i32)).to_be_bytes(),
            &1_i16.to_be_bytes(),
            b"a",
            &2_i32.to_be_bytes(),
            b"PG",
            &1_i16.to_be_bytes(),
            b"b",
            &1_i32.to_be_bytes(),
            b"T",
        ]
        .concat();
        assert_eq!(bytes, expected);
        let decoded = decode(&bytes, &HeaderLimits::default()).expect("decodes");
        assert_eq!(decoded, sample());
    }

    #[test]
    fn smallest_header_has_no_remark_and_no_ext() {
        let command = RemotingCommand::request(0, 0).with_serialize_type(SerializeType::RocketMq);
        let bytes = encoded(&command);
        assert_eq!(bytes.len(), FIXED_BYTES);
        assert_eq!(FIXED_BYTES, 21);
        let decoded = decode(&bytes, &HeaderLimits::default()).expect("decodes");
        assert_eq!(decoded.remark, None);
        assert!(decoded.ext_fields.is_empty());
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = encoded(&sample());
        for cut in 0..bytes.len() {
            let error = decode(&bytes[..cut], &HeaderLimits::default()).unwrap_err();
            assert!(
                matches!(error, HeaderError::Truncated { .. }),
                "cut at {cut}: {error:?}"
            );
        }
    }

    #[test]
    fn lengths_that_lie_are_refused() {
        let mut bytes = encoded(&sample());
        // remarkLen at offset 13 says 1000 bytes.
        bytes[13..17].copy_from_slice(&1000_i32.to_be_bytes());
        assert!(matches!(
            decode(&bytes, &HeaderLimits::default()),
            Err(HeaderError::Truncated {
                field: "remark",
                needed_bytes: 1000,
                ..
            })
        ));
        bytes[13..17].copy_from_slice(&(-1_i32).to_be_bytes());
        assert!(matches!(
            decode(&bytes, &HeaderLimits::default()),
            Err(HeaderError::NegativeLength {
                field: "remarkLen",
                length: -1
            })
        ));
    }

    #[test]
    fn ext_lengths_that_lie_are_refused() {
        let bytes = encoded(&sample());
        let ext_len_at = 17 + 2;
        let first_key_len_at = ext_len_at + 4;
        let first_value_len_at = first_key_len_at + 2 + 1;

        let mut short_section = bytes.clone();
        short_section[ext_len_at..ext_len_at + 4].copy_from_slice(&5_i32.to_be_bytes());
        assert!(decode(&short_section, &HeaderLimits::default()).is_err());

        let mut negative_key = bytes.clone();
        negative_key[first_key_len_at..first_key_len_at + 2]
            .copy_from_slice(&(-2_i16).to_be_bytes());
        assert!(matches!(
            decode(&negative_key, &HeaderLimits::default()),
            Err(HeaderError::NegativeLength {
                field: "keyLen",
                ..
            })
        ));

        let mut long_value = bytes;
        long_value[first_value_len_at..first_value_len_at + 4]
            .copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(matches!(
            decode(&long_value, &HeaderLimits::default()),
            Err(HeaderError::Truncated {
                field: "ext value",
                ..
            })
        ));
    }

    #[test]
    fn trailing_bytes_and_bad_utf8_are_refused() {
        let mut trailing = encoded(&sample());
        trailing.push(0);
        assert!(matches!(
            decode(&trailing, &HeaderLimits::default()),
            Err(HeaderError::TrailingBytes { trailing_bytes: 1 })
        ));
        let mut bad_remark = encoded(&sample());
        bad_remark[17] = 0xFF;
        assert!(matches!(
            decode(&bad_remark, &HeaderLimits::default()),
            Err(HeaderError::NotUtf8 { field: "remark" })
        ));
    }

    #[test]
    fn ext_limits_are_enforced() {
        let mut command = sample();
        for i in 0..10 {
            command.set_ext(format!("k{i}"), i);
        }
        let bytes = encoded(&command);
        let limits = HeaderLimits::default().with_max_ext_fields(4);
        assert!(matches!(
            decode(&bytes, &limits),
            Err(HeaderError::TooManyExtFields { max_ext_fields: 4 })
        ));
        let limits = HeaderLimits::default().with_max_ext_key_bytes(1);
        assert!(matches!(
            decode(&bytes, &limits),
            Err(HeaderError::ExtKeyTooLong {
                key_bytes: 2,
                max_ext_key_bytes: 1
            })
        ));
    }

    #[test]
    fn values_outside_i16_do_not_encode() {
        let mut command = sample();
        command.version = 70_000;
        assert!(matches!(
            encode(&command, &mut BytesMut::new()),
            Err(EncodeError::OutOfI16Range {
                field: "version",
                value: 70_000
            })
        ));
        let mut command = sample();
        command.set_ext("k".repeat(40_000), "v");
        assert!(matches!(
            encode(&command, &mut BytesMut::new()),
            Err(EncodeError::ExtKeyTooLong { key_bytes: 40_000 })
        ));
    }

    #[test]
    fn negative_code_round_trips() {
        let mut command = sample();
        command.code = -1000;
        let decoded = decode(&encoded(&command), &HeaderLimits::default()).expect("decodes");
        assert_eq!(decoded.code, -1000);
    }
}
