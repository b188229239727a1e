//! The remoting frame, its incremental decoder and the sniffer that tells a remoting connection
//! from a ShardMQ native one.
//!
//! Owns the frame layout (big-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | `length` i32 = 4 + headerLen + bodyLen (the prefix itself excluded) |
//! | 4..8 | top byte: serialize type (0 JSON, 1 ROCKETMQ); low 24 bits: headerLen |
//! | 8.. | the header, then the body (`length` − 4 − headerLen bytes, possibly none) |
//!
//! Bytes enter as the connection's read buffer (`BytesMut`); a whole frame is split off it and
//! frozen, and the command leaves with its body as a slice of that frame (no copy). Encoding
//! appends to a `BytesMut`. Never reads sockets, never interprets codes or bodies.
//!
//! `max_frame_bytes` counts the whole frame, prefix included, and is decided from the 4-byte
//! prefix alone, before any of the frame is buffered. Errors say whether frame boundaries are
//! lost ([`FrameError::is_boundary_lost`]): then the connection must be closed. Java closes the
//! channel on any decode error; a caller may keep the connection after a frame that was
//! consumed whole, but cannot answer it, because its opaque is unknown.

use bytes::{BufMut, BytesMut};

use crate::command::{EncodeError, HeaderError, HeaderLimits, RemotingCommand, SerializeType};

/// Default bound on a whole frame, prefix included: 16 MiB, as RocketMQ's
/// `com.rocketmq.remoting.frameMaxLength` default and the Rust client.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
/// The length prefix.
pub const LENGTH_PREFIX_BYTES: usize = 4;
/// The serialize-type/header-length word after the prefix.
pub const HEADER_WORD_BYTES: usize = 4;
/// The largest header length the word's low 24 bits can carry.
pub const MAX_HEADER_LENGTH_FIELD: usize = 0x00FF_FFFF;
/// How many bytes of a new connection [`sniff`] needs at most to decide.
pub const SNIFF_BYTES: usize = 12;
/// ShardMQ native frames carry this flatbuffers file identifier at bytes 8..12
/// (`docs/protocol.md`, "Frame layout").
const NATIVE_IDENTIFIER: &[u8; 4] = b"SHMQ";

/// Bounds the decoder enforces. Built with `Default` and the `with_` methods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameLimits {
    /// Largest frame accepted, prefix included, in bytes.
    pub max_frame_bytes: usize,
    /// Bounds on the header inside the frame.
    pub header: HeaderLimits,
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits {
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            header: HeaderLimits::default(),
        }
    }
}

impl FrameLimits {
    #[must_use]
    pub fn with_max_frame_bytes(mut self, max_frame_bytes: usize) -> Self {
        self.max_frame_bytes = max_frame_bytes;
        self
    }

    #[must_use]
    pub fn with_header_limits(mut self, header: HeaderLimits) -> Self {
        self.header = header;
        self
    }
}

/// A frame that cannot be decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error(
        "frame length field is {length}, under the {HEADER_WORD_BYTES} bytes of the \
         serialize-type/header-length word"
    )]
    LengthTooSmall { length: i32 },
    #[error("frame is {frame_bytes} bytes, over max_frame_bytes ({max_frame_bytes})")]
    TooLarge {
        frame_bytes: usize,
        max_frame_bytes: usize,
    },
    #[error("frame has serialize type {code}; only 0 (JSON) and 1 (ROCKETMQ) are known")]
    UnknownSerializeType { code: u8 },
    #[error(
        "frame header length is {header_bytes}, over the {room_bytes} bytes the frame holds \
         after its header-length word"
    )]
    HeaderLongerThanFrame {
        header_bytes: usize,
        room_bytes: usize,
    },
    #[error(transparent)]
    Header(#[from] HeaderError),
}

impl FrameError {
    /// True when the decoder no longer knows where the next frame starts: the connection must
    /// be closed. False when the bad frame was consumed whole and the next one can be read.
    pub fn is_boundary_lost(&self) -> bool {
        matches!(
            self,
            FrameError::LengthTooSmall { .. } | FrameError::TooLarge { .. }
        )
    }
}

/// Cuts whole frames off a connection's read buffer and decodes them.
///
/// Feed it the buffer after every read: it returns `Ok(None)` until a whole frame is there, and
/// never holds state of its own, so a frame may arrive in any number of pieces.
#[derive(Clone, Debug, Default)]
pub struct FrameDecoder {
    limits: FrameLimits,
}

impl FrameDecoder {
    pub fn new(limits: FrameLimits) -> FrameDecoder {
        FrameDecoder { limits }
    }

    pub fn limits(&self) -> &FrameLimits {
        &self.limits
    }

    /// Takes the next whole frame off the front of `buffer`, if there is one, and decodes it.
    ///
    /// After an error with [`FrameError::is_boundary_lost`] the buffer is untouched and the
    /// connection must be closed; after any other error the bad frame has been removed.
    pub fn decode(&self, buffer: &mut BytesMut) -> Result<Option<RemotingCommand>, FrameError> {
        let Some(frame_bytes) = self.frame_bytes(buffer)? else {
            return Ok(None);
        };
        if buffer.len() < frame_bytes {
            // Nothing is reserved for the rest of the frame: memory follows the bytes that
            // arrive, so a peer cannot make a connection hold max_frame_bytes by sending a
            // 4-byte prefix.
            return Ok(None);
        }
        let frame = buffer.split_to(frame_bytes).freeze();
        let word = u32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
        let type_code = (word >> 24) as u8;
        let header_bytes = (word & MAX_HEADER_LENGTH_FIELD as u32) as usize;
        let serialize_type = SerializeType::from_code(type_code)
            .ok_or(FrameError::UnknownSerializeType { code: type_code })?;
        let header_start = LENGTH_PREFIX_BYTES + HEADER_WORD_BYTES;
        let room_bytes = frame_bytes - header_start;
        if header_bytes > room_bytes {
            return Err(FrameError::HeaderLongerThanFrame {
                header_bytes,
                room_bytes,
            });
        }
        let body_start = header_start + header_bytes;
        let mut command = RemotingCommand::decode_header(
            serialize_type,
            &frame[header_start..body_start],
            &self.limits.header,
        )?;
        command.body = frame.slice(body_start..);
        Ok(Some(command))
    }

    /// The size of the frame at the front of `buffer`, prefix included, once its prefix is
    /// there; refused from the prefix alone when it is out of bounds.
    fn frame_bytes(&self, buffer: &BytesMut) -> Result<Option<usize>, FrameError> {
        let Some(prefix) = buffer.get(..LENGTH_PREFIX_BYTES) else {
            return Ok(None);
        };
        let length = i32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
        let length_bytes = match usize::try_from(length) {
            Ok(length_bytes) if length_bytes >= HEADER_WORD_BYTES => length_bytes,
            _ => return Err(FrameError::LengthTooSmall { length }),
        };
        let frame_bytes = LENGTH_PREFIX_BYTES + length_bytes;
        if frame_bytes > self.limits.max_frame_bytes {
            return Err(FrameError::TooLarge {
                frame_bytes,
                max_frame_bytes: self.limits.max_frame_bytes,
            });
        }
        Ok(Some(frame_bytes))
    }
}

/// Appends `command` as one frame: prefix, word, header and body. The body is copied; use
/// [`encode_frame_head`] to send it from its own buffer instead. On error `dst` is unchanged.
pub fn encode_frame(
    command: &RemotingCommand,
    max_frame_bytes: usize,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    encode_frame_head(command, max_frame_bytes, dst)?;
    dst.extend_from_slice(&command.body);
    Ok(())
}

/// Appends everything of `command`'s frame but the body: the prefix (which counts the body),
/// the word and the header. The caller writes `command.body` right after, e.g. with a vectored
/// write, so a large pull body is never copied. On error `dst` is unchanged.
pub fn encode_frame_head(
    command: &RemotingCommand,
    max_frame_bytes: usize,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    encode_frame_head_with_body_bytes(command, command.body.len(), max_frame_bytes, dst)
}

/// As [`encode_frame_head`], for a body of `body_bytes` that is not in `command.body` (which
/// should be empty): a pull answer whose body is the stored records, written after the head as
/// slices of the log. On error `dst` is unchanged.
pub fn encode_frame_head_with_body_bytes(
    command: &RemotingCommand,
    body_bytes: usize,
    max_frame_bytes: usize,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    let start = dst.len();
    dst.put_u32(0);
    dst.put_u32(0);
    let result = command
        .encode_header(dst)
        .and_then(|()| patch_head(command, body_bytes, start, max_frame_bytes, dst));
    if result.is_err() {
        dst.truncate(start);
    }
    result
}

/// Fills in the prefix and the word once the header's size is known.
fn patch_head(
    command: &RemotingCommand,
    body_bytes: usize,
    start: usize,
    max_frame_bytes: usize,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    let head_bytes = dst.len() - start;
    let header_bytes = head_bytes - LENGTH_PREFIX_BYTES - HEADER_WORD_BYTES;
    if header_bytes > MAX_HEADER_LENGTH_FIELD {
        return Err(EncodeError::HeaderTooLarge { header_bytes });
    }
    let frame_bytes = head_bytes + body_bytes;
    // The length field is an i32, so no configuration can let a frame past 2 GiB.
    if frame_bytes > max_frame_bytes || frame_bytes - LENGTH_PREFIX_BYTES > i32::MAX as usize {
        return Err(EncodeError::FrameTooLarge {
            frame_bytes,
            max_frame_bytes,
        });
    }
    let length = (frame_bytes - LENGTH_PREFIX_BYTES) as u32;
    let word = (u32::from(command.serialize_type.code()) << 24) | header_bytes as u32;
    dst[start..start + 4].copy_from_slice(&length.to_be_bytes());
    dst[start + 4..start + 8].copy_from_slice(&word.to_be_bytes());
    Ok(())
}

/// What the first bytes of a new connection are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sniffed {
    /// A RocketMQ remoting frame: byte 4 (the serialize type) is 0 or 1.
    Remoting,
    /// A ShardMQ native frame: `SHMQ` at bytes 8..12.
    Native,
    /// Not enough bytes yet to tell; read more (at most [`SNIFF_BYTES`] in all).
    NeedMore,
    /// Neither protocol: close the connection.
    Neither,
}

/// Tells a remoting connection from a native one by its first bytes (up to [`SNIFF_BYTES`]).
///
/// Native is decided on `SHMQ` at bytes 8..12 and wins if both could match (a native frame's
/// byte 4 is the low byte of its flatbuffer root offset, which can be 0 or 1, while a remoting
/// header never starts with `SHMQ`: JSON starts with `{`, binary with a request code far below
/// 0x5348). As soon as a byte of 8..12 differs from `SHMQ` the answer is Remoting or Neither by
/// byte 4, so a short remoting frame is not kept waiting for a twelfth byte that may never come.
pub fn sniff(first_bytes: &[u8]) -> Sniffed {
    let identifier_end = first_bytes.len().min(SNIFF_BYTES);
    let identifier_start = identifier_end.min(8);
    let identifier_seen = &first_bytes[identifier_start..identifier_end];
    if NATIVE_IDENTIFIER.starts_with(identifier_seen) {
        return if identifier_seen.len() == NATIVE_IDENTIFIER.len() {
            Sniffed::Native
        } else {
            Sniffed::NeedMore
        };
    }
    match first_bytes.get(4) {
        Some(0 | 1) => Sniffed::Remoting,
        Some(_) => Sniffed::Neither,
        None => Sniffed::NeedMore,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{LanguageCode, FLAG_RESPONSE};
    use bytes::Bytes;

    fn sample(serialize_type: SerializeType) -> RemotingCommand {
        RemotingCommand::request(11, 5)
            .with_ext("topic", "T")
            .with_body(Bytes::from_static(b"payload"))
            .with_serialize_type(serialize_type)
    }

    fn frame_of(command: &RemotingCommand) -> BytesMut {
        let mut dst = BytesMut::new();
        encode_frame(command, DEFAULT_MAX_FRAME_BYTES, &mut dst).expect("encodes");
        dst
    }

    #[test]
    fn a_head_for_a_body_sent_apart_decodes_with_that_body() {
        let records = [Bytes::from_static(b"first"), Bytes::from_static(b"second")];
        let answer = RemotingCommand::request(11, 9);
        let mut wire = BytesMut::new();
        encode_frame_head_with_body_bytes(&answer, 11, DEFAULT_MAX_FRAME_BYTES, &mut wire)
            .expect("encodes");
        for record in &records {
            wire.extend_from_slice(record);
        }
        let decoded = FrameDecoder::default()
            .decode(&mut wire)
            .expect("decodes")
            .expect("whole");
        assert_eq!(&decoded.body[..], b"firstsecond");
        assert!(wire.is_empty());
        let mut too_large = BytesMut::new();
        assert!(
            encode_frame_head_with_body_bytes(&answer, 100, 64, &mut too_large).is_err()
                && too_large.is_empty()
        );
    }

    #[test]
    fn frame_layout_and_round_trip() {
        for serialize_type in [SerializeType::Json, SerializeType::RocketMq] {
            let command = sample(serialize_type);
            let mut buffer = frame_of(&command);
            let length = u32::from_be_bytes([buffer[0], buffer[1], buffer[2], buffer[3]]) as usize;
            assert_eq!(length + 4, buffer.len());
            assert_eq!(buffer[4], serialize_type.code());
            let header_bytes = u32::from_be_bytes([0, buffer[5], buffer[6], buffer[7]]) as usize;
            assert_eq!(length, 4 + header_bytes + b"payload".len());

            let decoded = FrameDecoder::default()
                .decode(&mut buffer)
                .expect("decodes")
                .expect("whole frame");
            assert_eq!(decoded, command);
            assert!(buffer.is_empty());
        }
    }

    #[test]
    fn body_is_a_slice_of_the_read_buffer() {
        let mut buffer = frame_of(&sample(SerializeType::RocketMq));
        let buffer_range = buffer.as_ptr_range();
        let decoded = FrameDecoder::default()
            .decode(&mut buffer)
            .expect("decodes")
            .expect("whole frame");
        assert!(buffer_range.contains(&decoded.body.as_ptr()));
    }

    #[test]
    fn partial_frames_wait_without_consuming() {
        let whole = frame_of(&sample(SerializeType::Json));
        let decoder = FrameDecoder::default();
        for cut in 0..whole.len() {
            let mut buffer = BytesMut::from(&whole[..cut]);
            assert!(decoder.decode(&mut buffer).expect("no error").is_none());
            assert_eq!(
                buffer.len(),
                cut,
                "nothing consumed before the frame is whole"
            );
        }
    }

    #[test]
    fn two_frames_in_one_buffer() {
        let mut buffer = frame_of(&sample(SerializeType::Json));
        let second = RemotingCommand::response_to(&sample(SerializeType::RocketMq), 0);
        buffer.extend_from_slice(&frame_of(&second));
        let decoder = FrameDecoder::default();
        assert_eq!(decoder.decode(&mut buffer).unwrap().unwrap().code, 11);
        let response = decoder.decode(&mut buffer).unwrap().unwrap();
        assert_eq!(response.flag, FLAG_RESPONSE);
        assert_eq!(response.language, LanguageCode::Java);
        assert!(decoder.decode(&mut buffer).unwrap().is_none());
    }

    #[test]
    fn oversized_frame_is_refused_from_the_prefix_alone() {
        let decoder = FrameDecoder::new(FrameLimits::default().with_max_frame_bytes(1024));
        let mut buffer = BytesMut::from(&1021_u32.to_be_bytes()[..]);
        let error = decoder.decode(&mut buffer).unwrap_err();
        assert!(matches!(
            error,
            FrameError::TooLarge {
                frame_bytes: 1025,
                max_frame_bytes: 1024
            }
        ));
        assert!(error.is_boundary_lost());
        assert_eq!(
            error.to_string(),
            "frame is 1025 bytes, over max_frame_bytes (1024)"
        );

        let mut exactly = BytesMut::from(&1020_u32.to_be_bytes()[..]);
        assert!(decoder.decode(&mut exactly).expect("fits").is_none());
    }

    #[test]
    fn lengths_under_the_word_are_refused() {
        for length in [0_i32, 3, -1, i32::MIN] {
            let mut buffer = BytesMut::from(&length.to_be_bytes()[..]);
            let error = FrameDecoder::default().decode(&mut buffer).unwrap_err();
            assert!(matches!(error, FrameError::LengthTooSmall { length: l } if l == length));
            assert!(error.is_boundary_lost());
        }
    }

    #[test]
    fn header_longer_than_frame_is_refused_and_skipped() {
        let mut buffer = BytesMut::new();
        buffer.put_u32(4 + 2);
        buffer.put_u32(3); // JSON, header length 3, but only 2 bytes follow.
        buffer.put_slice(b"{}");
        buffer.extend_from_slice(&frame_of(&sample(SerializeType::Json)));
        let decoder = FrameDecoder::default();
        let error = decoder.decode(&mut buffer).unwrap_err();
        assert!(matches!(
            error,
            FrameError::HeaderLongerThanFrame {
                header_bytes: 3,
                room_bytes: 2
            }
        ));
        assert!(!error.is_boundary_lost());
        assert_eq!(decoder.decode(&mut buffer).unwrap().unwrap().code, 11);
    }

    #[test]
    fn unknown_serialize_type_is_refused_and_skipped() {
        let mut buffer = BytesMut::new();
        buffer.put_u32(4 + 2);
        buffer.put_u32((2 << 24) | 2);
        buffer.put_slice(b"{}");
        let error = FrameDecoder::default().decode(&mut buffer).unwrap_err();
        assert!(matches!(
            error,
            FrameError::UnknownSerializeType { code: 2 }
        ));
        assert!(!error.is_boundary_lost());
        assert!(buffer.is_empty());
    }

    #[test]
    fn bad_header_keeps_boundaries() {
        let mut buffer = BytesMut::new();
        buffer.put_u32(4 + 5);
        buffer.put_u32(5);
        buffer.put_slice(b"[1,2]");
        let error = FrameDecoder::default().decode(&mut buffer).unwrap_err();
        assert!(matches!(
            error,
            FrameError::Header(HeaderError::NotAnObject { found: "array" })
        ));
        assert!(!error.is_boundary_lost());
        assert!(buffer.is_empty());
    }

    #[test]
    fn header_over_its_limit_is_refused() {
        let limits = FrameLimits::default()
            .with_header_limits(HeaderLimits::default().with_max_header_bytes(16));
        let mut buffer = frame_of(&sample(SerializeType::Json));
        let error = FrameDecoder::new(limits).decode(&mut buffer).unwrap_err();
        assert!(matches!(
            error,
            FrameError::Header(HeaderError::TooLarge {
                max_header_bytes: 16,
                ..
            })
        ));
    }

    #[test]
    fn encode_refuses_frames_over_the_limit_and_leaves_dst_alone() {
        let command = sample(SerializeType::Json).with_body(vec![0_u8; 100]);
        let mut dst = BytesMut::from(&b"x"[..]);
        let error = encode_frame(&command, 64, &mut dst).unwrap_err();
        assert!(matches!(
            error,
            EncodeError::FrameTooLarge {
                max_frame_bytes: 64,
                ..
            }
        ));
        assert_eq!(&dst[..], b"x");
    }

    #[test]
    fn head_then_body_equals_whole_frame() {
        let command = sample(SerializeType::RocketMq);
        let mut head = BytesMut::new();
        encode_frame_head(&command, DEFAULT_MAX_FRAME_BYTES, &mut head).expect("encodes");
        head.extend_from_slice(&command.body);
        assert_eq!(head, frame_of(&command));
    }

    #[test]
    fn sniff_tells_the_protocols_apart() {
        let remoting = frame_of(&sample(SerializeType::Json));
        assert_eq!(sniff(&remoting[..12]), Sniffed::Remoting);
        let binary = frame_of(&sample(SerializeType::RocketMq));
        assert_eq!(sniff(&binary[..12]), Sniffed::Remoting);

        let mut native = [0_u8; 12];
        native[..4].copy_from_slice(&100_u32.to_be_bytes());
        native[4..8].copy_from_slice(&16_u32.to_le_bytes());
        native[8..12].copy_from_slice(b"SHMQ");
        assert_eq!(sniff(&native), Sniffed::Native);
        // A native root offset whose low byte is 0 still reads as native.
        native[4..8].copy_from_slice(&256_u32.to_le_bytes());
        assert_eq!(sniff(&native), Sniffed::Native);

        for cut in 0..8 {
            assert_eq!(sniff(&remoting[..cut]), Sniffed::NeedMore, "cut {cut}");
        }
        // The first header byte `{` already rules native out.
        assert_eq!(sniff(&remoting[..9]), Sniffed::Remoting);
        for cut in 0..12 {
            assert_eq!(sniff(&native[..cut]), Sniffed::NeedMore, "cut {cut}");
        }

        assert_eq!(sniff(b"GET / HTTP/1.1\r\n"), Sniffed::Neither);
        // A TLS ClientHello whose record length's low byte is not 0 or 1.
        assert_eq!(
            sniff(b"\x16\x03\x01\x02\xfc\x01\x00\x01\xfc\x03\x03\x00"),
            Sniffed::Neither
        );
    }
}
