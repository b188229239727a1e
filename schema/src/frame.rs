//! The frame codec: length-prefixed flatbuffer `Frame`s on a byte stream (docs/protocol.md,
//! "Frame layout").
//!
//! Owns: splitting a byte stream into frames ([`FrameDecoder`]), verifying each as a `Frame`
//! flatbuffer before anyone reads it ([`VerifiedFrame`]), and writing frames with their length
//! prefix ([`FrameEncoder`]). Never: I/O, and never a copy of frame bytes on the way in: frames
//! leave the decoder as [`Bytes`] slices of the read buffer, so message bodies can be passed on
//! by reference count. Never panics on input: every byte sequence a peer can send yields a frame,
//! `Ok(None)` (need more bytes) or a [`FrameError`].
//!
//! Wire layout of one frame: `u32` big-endian length `N` (1 ..= max_frame_bytes), then `N`
//! bytes holding a finished flatbuffer whose root is `Frame` with file identifier "SHMQ".

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flatbuffers::{FlatBufferBuilder, UnionWIPOffset, Vector, VerifierOptions, WIPOffset};

use crate::wire;

/// Bytes of the big-endian `u32` length that precedes every frame.
pub const FRAME_LENGTH_PREFIX_BYTES: usize = 4;

/// Default limit on a frame's length (the prefix's value, prefix excluded): 16 MiB, room for a
/// batch of 4 MiB messages or a pull response of several MiB of records plus headers.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// The flatbuffer file identifier every frame carries (bytes 4..8 of the flatbuffer).
pub const FRAME_FILE_IDENTIFIER: &str = wire::FRAME_IDENTIFIER;

/// Longest `Frame.message` that [`FrameEncoder::encode_error_response`] writes; longer messages
/// are cut at a character boundary. A human-readable line never needs more.
pub const MAX_STATUS_MESSAGE_BYTES: usize = 4 * 1024;

/// A builder that grew past this many bytes for one frame is dropped after that frame rather
/// than kept for reuse, so one rare huge send does not pin its memory for the connection's
/// life. Large enough for a full batch of 1 KiB messages (1,000 of them make a 1.1 MiB frame,
/// which needs a 2 MiB builder): a builder dropped after every batch grows again from 4 KiB by
/// doubling, copying and zeroing about twice the frame's size each time.
const RETAINED_BUILDER_BYTES: usize = 4 * 1024 * 1024;

/// Capacity a fresh builder starts with: most frames (requests, responses without records)
/// fit without growing.
const INITIAL_BUILDER_BYTES: usize = 4 * 1024;

/// Smallest flatbuffer with a file identifier: root offset plus identifier.
const MIN_FLATBUFFER_BYTES: usize = 8;

/// Why bytes from a peer are not a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length prefix is 0. The stream cannot be resynchronised: close the connection.
    #[error("frame length prefix is 0; every frame carries a flatbuffer Frame")]
    ZeroLength,
    /// The length prefix (or, when encoding, the built frame) is over the limit. When decoding,
    /// the stream cannot be resynchronised: close the connection.
    #[error("frame is {length_bytes} bytes, over max_frame_bytes ({max_frame_bytes})")]
    TooLarge {
        length_bytes: usize,
        max_frame_bytes: usize,
    },
    /// The frame's bytes are not a valid `Frame` flatbuffer. The frame has been consumed and the
    /// stream is still in step, so the connection may go on; the frame's request id is unknown.
    #[error("malformed frame: {0}")]
    Malformed(#[from] MalformedFrame),
}

/// What is wrong with a malformed frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MalformedFrame {
    /// Bytes 4..8 are not the file identifier "SHMQ": not a ShardMQ frame at all.
    #[error("the frame does not carry the file identifier {FRAME_FILE_IDENTIFIER:?}")]
    MissingFileIdentifier,
    /// The flatbuffers verifier rejected the frame.
    #[error("flatbuffer verification failed: {0}")]
    Verification(flatbuffers::InvalidFlatbuffer),
}

impl FrameError {
    /// The status to answer a peer with when its frame fails this way.
    #[must_use]
    pub fn status(&self) -> wire::Status {
        match self {
            Self::ZeroLength | Self::Malformed(_) => wire::Status::MALFORMED_FRAME,
            Self::TooLarge { .. } => wire::Status::FRAME_TOO_LARGE,
        }
    }

    /// Whether the byte stream has lost its frame boundaries, so the connection must be closed
    /// (after answering, if the caller wishes).
    #[must_use]
    pub fn is_connection_fatal(&self) -> bool {
        matches!(self, Self::ZeroLength | Self::TooLarge { .. })
    }
}

/// Splits a byte stream into frames. Holds only its limits: the caller owns the read buffer, so
/// the same decoder works with any runtime's reads (glommio, tokio).
///
/// ```
/// # use bytes::BytesMut;
/// # use shardmq_schema::{FrameDecoder, FrameEncoder};
/// let mut encoder = FrameEncoder::new();
/// let bytes = encoder
///     .encode_error_response(7, shardmq_schema::wire::Status::SYSTEM_BUSY, "busy")
///     .unwrap();
/// let decoder = FrameDecoder::new();
/// let mut read_buffer = BytesMut::new();
/// read_buffer.extend_from_slice(&bytes); // what a socket read would append
/// let frame = decoder.decode(&mut read_buffer).unwrap().expect("one whole frame");
/// assert_eq!(frame.frame().request_id(), 7);
/// ```
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    max_frame_bytes: usize,
    verifier_options: VerifierOptions,
    reserves_ahead: bool,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new()
    }
}

/// Room a decoder reserves ahead for a partly received frame at least (it reserves up to as
/// much as the buffer holds, so room grows geometrically with the bytes that arrive).
pub const MIN_RESERVE_AHEAD_BYTES: usize = 64 << 10;

/// Makes `buffer`'s capacity at least `capacity` without `realloc`: glibc's `realloc` of a heap
/// block copies the whole old block (it cannot know how much of it is used), so growing a read
/// buffer that had held a megabyte frame copied that megabyte again. The allocation `buffer`
/// already owns is taken back when nothing else shares it any more (the frames split off it
/// were dropped) and it is large enough; otherwise its bytes move into a new allocation of
/// exactly `capacity`. Either way only the bytes held are moved.
pub fn grow_without_realloc(buffer: &mut BytesMut, capacity: usize) {
    if buffer.capacity() >= capacity || buffer.try_reclaim(capacity - buffer.len()) {
        return;
    }
    let mut grown = BytesMut::with_capacity(capacity);
    grown.extend_from_slice(buffer);
    *buffer = grown;
}

impl FrameDecoder {
    /// The full size (length prefix included) of the frame at the front of `buffer`, once its
    /// prefix has arrived and is within this decoder's limit.
    #[must_use]
    pub fn pending_frame_bytes(&self, buffer: &[u8]) -> Option<usize> {
        let prefix: [u8; FRAME_LENGTH_PREFIX_BYTES] =
            buffer.get(..FRAME_LENGTH_PREFIX_BYTES)?.try_into().ok()?;
        let length_bytes = u32::from_be_bytes(prefix) as usize;
        (length_bytes > 0 && length_bytes <= self.max_frame_bytes)
            .then_some(FRAME_LENGTH_PREFIX_BYTES + length_bytes)
    }

    /// A decoder that accepts frames up to [`DEFAULT_MAX_FRAME_BYTES`].
    #[must_use]
    pub fn new() -> Self {
        Self::with_max_frame_bytes(DEFAULT_MAX_FRAME_BYTES)
    }

    /// A decoder that accepts frames whose length prefix is at most `max_frame_bytes`.
    #[must_use]
    pub fn with_max_frame_bytes(max_frame_bytes: usize) -> Self {
        Self {
            max_frame_bytes,
            verifier_options: VerifierOptions::default(),
            reserves_ahead: true,
        }
    }

    /// This decoder without its own room-making for a partly received frame: for a caller
    /// that makes room for the whole frame itself once [`pending_frame_bytes`] names its size
    /// (with [`grow_without_realloc`]), so the frame's first bytes are not moved twice.
    ///
    /// [`pending_frame_bytes`]: Self::pending_frame_bytes
    #[must_use]
    pub fn without_reserve_ahead(mut self) -> Self {
        self.reserves_ahead = false;
        self
    }

    /// The largest length prefix this decoder accepts.
    #[must_use]
    pub fn max_frame_bytes(&self) -> usize {
        self.max_frame_bytes
    }

    /// Takes the next complete frame off the front of `buffer` and verifies it.
    ///
    /// Returns `Ok(None)` when `buffer` holds no complete frame yet (having reserved room for
    /// more of a frame whose length is known: up to as much as has arrived, at least
    /// [`MIN_RESERVE_AHEAD_BYTES`]); append more bytes and call again. On
    /// [`FrameError::ZeroLength`] and [`FrameError::TooLarge`] nothing is consumed and every
    /// later call returns the same error. On [`FrameError::Malformed`] the bad frame has been
    /// consumed and decoding may go on.
    pub fn decode(&self, buffer: &mut BytesMut) -> Result<Option<VerifiedFrame>, FrameError> {
        match self.decode_unverified(buffer)? {
            Some(frame_bytes) => self.verify(frame_bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Like [`decode`](Self::decode) without verifying: returns the frame's bytes (prefix
    /// excluded), for a caller that forwards frames without reading them.
    pub fn decode_unverified(&self, buffer: &mut BytesMut) -> Result<Option<Bytes>, FrameError> {
        let Some(prefix) = buffer.get(..FRAME_LENGTH_PREFIX_BYTES) else {
            return Ok(None);
        };
        let mut prefix_bytes = [0u8; FRAME_LENGTH_PREFIX_BYTES];
        prefix_bytes.copy_from_slice(prefix);
        let length_bytes = u32::from_be_bytes(prefix_bytes) as usize;
        if length_bytes == 0 {
            return Err(FrameError::ZeroLength);
        }
        if length_bytes > self.max_frame_bytes {
            return Err(FrameError::TooLarge {
                length_bytes,
                max_frame_bytes: self.max_frame_bytes,
            });
        }
        let total_bytes = FRAME_LENGTH_PREFIX_BYTES + length_bytes;
        if buffer.len() < total_bytes {
            if self.reserves_ahead {
                // Room grows with what has arrived (at most doubling it), not with what the
                // prefix claims: a peer that declares a large frame and sends little costs
                // little.
                let missing = total_bytes - buffer.len();
                let ahead = missing.min(buffer.len().max(MIN_RESERVE_AHEAD_BYTES));
                grow_without_realloc(buffer, buffer.len() + ahead);
            }
            return Ok(None);
        }
        let mut frame = buffer.split_to(total_bytes);
        frame.advance(FRAME_LENGTH_PREFIX_BYTES);
        Ok(Some(frame.freeze()))
    }

    /// Verifies `frame_bytes` (one frame, length prefix excluded) as a `Frame` flatbuffer.
    pub fn verify(&self, frame_bytes: Bytes) -> Result<VerifiedFrame, FrameError> {
        if frame_bytes.len() > self.max_frame_bytes {
            return Err(FrameError::TooLarge {
                length_bytes: frame_bytes.len(),
                max_frame_bytes: self.max_frame_bytes,
            });
        }
        // Checked by hand: flatbuffers' buffer_has_identifier panics on short buffers.
        let identifier = frame_bytes.get(FRAME_LENGTH_PREFIX_BYTES..MIN_FLATBUFFER_BYTES);
        if identifier != Some(FRAME_FILE_IDENTIFIER.as_bytes()) {
            return Err(MalformedFrame::MissingFileIdentifier.into());
        }
        wire::root_as_frame_with_opts(&self.verifier_options, &frame_bytes)
            .map_err(MalformedFrame::Verification)?;
        Ok(VerifiedFrame { bytes: frame_bytes })
    }
}

/// One frame (length prefix excluded) that has passed the flatbuffers verifier, so reading it
/// needs no further checks. Cheap to clone: it shares the read buffer.
#[derive(Clone)]
pub struct VerifiedFrame {
    bytes: Bytes,
}

impl VerifiedFrame {
    /// The frame's root table.
    #[must_use]
    pub fn frame(&self) -> wire::Frame<'_> {
        // SAFETY: `bytes` passed `root_as_frame_with_opts` in `FrameDecoder::verify`, the only
        // constructor, and `Bytes` is immutable, so it is still a valid `Frame` flatbuffer.
        unsafe { wire::root_as_frame_unchecked(&self.bytes) }
    }

    /// The frame's bytes (length prefix excluded).
    #[must_use]
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The frame's bytes (length prefix excluded).
    #[must_use]
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// A [`Bytes`] for `part`, a slice read out of this frame (a message body, a record range),
    /// sharing the frame's memory instead of copying it. `None` if `part` does not lie within
    /// this frame.
    #[must_use]
    pub fn share(&self, part: &[u8]) -> Option<Bytes> {
        let frame_start = self.bytes.as_ptr() as usize;
        let part_start = part.as_ptr() as usize;
        let offset = part_start.checked_sub(frame_start)?;
        let end = offset.checked_add(part.len())?;
        (end <= self.bytes.len()).then(|| self.bytes.slice(offset..end))
    }
}

impl std::fmt::Debug for VerifiedFrame {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let frame = self.frame();
        formatter
            .debug_struct("VerifiedFrame")
            .field("request_id", &frame.request_id())
            .field("kind", &frame.kind())
            .field("status", &frame.status())
            .field("body_type", &frame.body_type())
            .field("length_bytes", &self.bytes.len())
            .finish()
    }
}

/// The fields every frame has besides its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader<'a> {
    pub request_id: u64,
    pub kind: wire::FrameKind,
    pub status: wire::Status,
    pub message: Option<&'a str>,
}

impl<'a> FrameHeader<'a> {
    /// A request expecting a response with the same `request_id`.
    #[must_use]
    pub fn request(request_id: u64) -> Self {
        Self {
            request_id,
            kind: wire::FrameKind::REQUEST,
            status: wire::Status::OK,
            message: None,
        }
    }

    /// The response to the peer's request `request_id`.
    #[must_use]
    pub fn response(request_id: u64, status: wire::Status) -> Self {
        Self {
            request_id,
            kind: wire::FrameKind::RESPONSE,
            status,
            message: None,
        }
    }

    /// A frame that expects no answer.
    #[must_use]
    pub fn one_way() -> Self {
        Self {
            request_id: 0,
            kind: wire::FrameKind::ONE_WAY,
            status: wire::Status::OK,
            message: None,
        }
    }

    /// The same header with a human-readable `message`.
    #[must_use]
    pub fn with_message(self, message: &'a str) -> Self {
        Self {
            message: Some(message),
            ..self
        }
    }
}

/// Writes the root `Frame` table for `header` and a body already built in `builder` (`None`
/// with `wire::Body::NONE` for no body). Call it last inside a [`FrameEncoder`] closure.
pub fn build_frame<'b>(
    builder: &mut FlatBufferBuilder<'b>,
    header: &FrameHeader<'_>,
    body_type: wire::Body,
    body: Option<WIPOffset<UnionWIPOffset>>,
) -> WIPOffset<wire::Frame<'b>> {
    debug_assert_eq!(
        body_type == wire::Body::NONE,
        body.is_none(),
        "body_type and body must be given together"
    );
    let message = header.message.map(|text| builder.create_string(text));
    wire::Frame::create(
        builder,
        &wire::FrameArgs {
            request_id: header.request_id,
            kind: header.kind,
            status: header.status,
            message,
            body_type,
            body,
        },
    )
}

/// Writes frames with their length prefix. Keeps one `FlatBufferBuilder` for reuse, so building
/// a frame allocates nothing once the builder has grown to the connection's usual frame size.
///
/// ```
/// # use shardmq_schema::{build_frame, wire, FrameEncoder, FrameHeader};
/// let mut encoder = FrameEncoder::new();
/// let frame_bytes = encoder
///     .encode(|builder| {
///         let topic = builder.create_string("orders");
///         let request = wire::GetRouteRequest::create(
///             builder,
///             &wire::GetRouteRequestArgs { topic: Some(topic) },
///         );
///         build_frame(
///             builder,
///             &FrameHeader::request(1),
///             wire::Body::GetRouteRequest,
///             Some(request.as_union_value()),
///         )
///     })
///     .unwrap();
/// assert_eq!(&frame_bytes[8..12], b"SHMQ");
/// ```
pub struct FrameEncoder {
    builder: FlatBufferBuilder<'static>,
    max_frame_bytes: usize,
}

impl Default for FrameEncoder {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for FrameEncoder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("FrameEncoder")
            .field("max_frame_bytes", &self.max_frame_bytes)
            .finish_non_exhaustive()
    }
}

impl FrameEncoder {
    /// An encoder that refuses to write frames over [`DEFAULT_MAX_FRAME_BYTES`].
    #[must_use]
    pub fn new() -> Self {
        Self::with_max_frame_bytes(DEFAULT_MAX_FRAME_BYTES)
    }

    /// An encoder that refuses to write frames over `max_frame_bytes` (use the peer's limit from
    /// its `HandshakeResponse` when it states one).
    #[must_use]
    pub fn with_max_frame_bytes(max_frame_bytes: usize) -> Self {
        Self {
            builder: FlatBufferBuilder::with_capacity(INITIAL_BUILDER_BYTES),
            max_frame_bytes,
        }
    }

    /// The largest frame this encoder writes.
    #[must_use]
    pub fn max_frame_bytes(&self) -> usize {
        self.max_frame_bytes
    }

    /// Builds one frame with `build` (which must end with [`build_frame`] or
    /// `wire::Frame::create` and must not call `finish`) and returns it, length prefix included,
    /// in one buffer.
    pub fn encode<F>(&mut self, build: F) -> Result<Bytes, FrameError>
    where
        F: FnOnce(&mut FlatBufferBuilder<'static>) -> WIPOffset<wire::Frame<'static>>,
    {
        let mut out = BytesMut::new();
        self.encode_into(&mut out, build)?;
        Ok(out.freeze())
    }

    /// Like [`encode`](Self::encode), appending the frame to `out` (a connection's write buffer,
    /// so several frames can leave in one write). Returns the bytes appended; on error `out` is
    /// unchanged.
    pub fn encode_into<F>(&mut self, out: &mut BytesMut, build: F) -> Result<usize, FrameError>
    where
        F: FnOnce(&mut FlatBufferBuilder<'static>) -> WIPOffset<wire::Frame<'static>>,
    {
        self.builder.reset();
        let root = build(&mut self.builder);
        wire::finish_frame_buffer(&mut self.builder, root);
        let result = write_prefixed(out, self.builder.finished_data(), 0, self.max_frame_bytes);
        self.release_oversized_builder();
        result
    }

    /// Writes a response with `status`, a `message` (cut to [`MAX_STATUS_MESSAGE_BYTES`]) and
    /// no body: the answer to a request that failed.
    pub fn encode_error_response(
        &mut self,
        request_id: u64,
        status: wire::Status,
        message: &str,
    ) -> Result<Bytes, FrameError> {
        let mut out = BytesMut::new();
        self.encode_error_response_into(&mut out, request_id, status, message)?;
        Ok(out.freeze())
    }

    /// Like [`encode_error_response`](Self::encode_error_response), appending to `out`.
    pub fn encode_error_response_into(
        &mut self,
        out: &mut BytesMut,
        request_id: u64,
        status: wire::Status,
        message: &str,
    ) -> Result<usize, FrameError> {
        let message = truncate_at_char_boundary(message, MAX_STATUS_MESSAGE_BYTES);
        let header = FrameHeader::response(request_id, status).with_message(message);
        self.encode_into(out, |builder| {
            build_frame(builder, &header, wire::Body::NONE, None)
        })
    }

    /// Writes the head of a frame whose last `trailing_bytes` bytes the caller writes itself,
    /// straight after the head, from memory it already has: how a pull response carries stored
    /// CommitLog records without copying them.
    ///
    /// `build` receives the offset of a `[ubyte]` vector that will hold those bytes (use it for
    /// `PullResponse.records`). It is built first, so it lies at the very end of the flatbuffer;
    /// the head appended to `out` ends with that vector's length word. The frame is complete once
    /// exactly `trailing_bytes` bytes follow the head on the wire. Returns the head's length;
    /// on error `out` is unchanged.
    pub fn encode_head_with_trailing_bytes<F>(
        &mut self,
        out: &mut BytesMut,
        trailing_bytes: usize,
        build: F,
    ) -> Result<usize, FrameError>
    where
        F: FnOnce(
            &mut FlatBufferBuilder<'static>,
            WIPOffset<Vector<'static, u8>>,
        ) -> WIPOffset<wire::Frame<'static>>,
    {
        self.builder.reset();
        // Nothing precedes this vector in the builder, and flatbuffers build back to front, so
        // its (zero) length word is the last 4 bytes of the finished buffer. Every offset in the
        // buffer points forward to it or to something before it, so appending the trailing
        // bytes after it and patching the length keeps every offset and alignment valid.
        let trailing_vector = self.builder.create_vector::<u8>(&[]);
        let root = build(&mut self.builder, trailing_vector);
        wire::finish_frame_buffer(&mut self.builder, root);
        let result = write_prefixed(
            out,
            self.builder.finished_data(),
            trailing_bytes,
            self.max_frame_bytes,
        );
        self.release_oversized_builder();
        result
    }

    fn release_oversized_builder(&mut self) {
        if self.builder.unfinished_data().len() > RETAINED_BUILDER_BYTES {
            self.builder = FlatBufferBuilder::with_capacity(INITIAL_BUILDER_BYTES);
        }
    }
}

/// Appends the length prefix and `flatbuffer` to `out`. With `trailing_bytes > 0`, the last 4
/// bytes of `flatbuffer` are the empty trailing vector's length word (see
/// [`FrameEncoder::encode_head_with_trailing_bytes`]): they are written as `trailing_bytes`
/// and the prefix counts the bytes the caller will append.
fn write_prefixed(
    out: &mut BytesMut,
    flatbuffer: &[u8],
    trailing_bytes: usize,
    max_frame_bytes: usize,
) -> Result<usize, FrameError> {
    let length_bytes = flatbuffer.len().saturating_add(trailing_bytes);
    let too_large = FrameError::TooLarge {
        length_bytes,
        max_frame_bytes,
    };
    if length_bytes > max_frame_bytes {
        return Err(too_large);
    }
    let (Ok(length_prefix), Ok(trailing_length_word)) =
        (u32::try_from(length_bytes), u32::try_from(trailing_bytes))
    else {
        return Err(too_large);
    };
    out.reserve(FRAME_LENGTH_PREFIX_BYTES + flatbuffer.len());
    out.put_u32(length_prefix);
    if trailing_bytes == 0 {
        out.extend_from_slice(flatbuffer);
    } else {
        let (head, length_word) = flatbuffer.split_at(flatbuffer.len().saturating_sub(4));
        debug_assert_eq!(length_word, [0u8; 4], "trailing vector is not last");
        out.extend_from_slice(head);
        out.put_u32_le(trailing_length_word);
    }
    Ok(FRAME_LENGTH_PREFIX_BYTES + flatbuffer.len())
}

/// The longest prefix of `text` of at most `max_bytes` bytes that ends on a char boundary.
fn truncate_at_char_boundary(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growing_without_realloc_keeps_the_bytes_and_reuses_an_allocation_no_longer_shared() {
        let mut buffer = BytesMut::with_capacity(16);
        buffer.extend_from_slice(b"abc");
        grow_without_realloc(&mut buffer, 1 << 20);
        assert_eq!(&buffer[..], b"abc");
        assert!(buffer.capacity() >= 1 << 20);

        // A frame split off and still held: the rest moves to a new allocation.
        buffer.extend_from_slice(&[7u8; 1000]);
        let frame = buffer.split_to(900).freeze();
        let held = buffer.len();
        let before = buffer.as_ptr();
        grow_without_realloc(&mut buffer, 2 << 20);
        assert!(buffer.capacity() >= 2 << 20);
        assert_eq!(buffer.len(), held);
        assert_ne!(buffer.as_ptr(), before);
        assert_eq!(&frame[..3], b"abc");

        // Once the frames split off are dropped, the allocation is taken back, not replaced.
        buffer.extend_from_slice(&[9u8; 4096]);
        let frame = buffer.split_to(4000).freeze();
        drop(frame);
        let start = buffer.as_ptr() as usize;
        let want = buffer.capacity() + 1;
        grow_without_realloc(&mut buffer, want);
        assert!(buffer.capacity() >= want);
        let reused = buffer.as_ptr() as usize;
        assert!(
            reused < start,
            "the bytes moved to the front of the same allocation"
        );
        assert!(buffer.iter().all(|b| *b == 9 || *b == 7));
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate_at_char_boundary("abc", 10), "abc");
        assert_eq!(truncate_at_char_boundary("abc", 2), "ab");
        // "é" is two bytes: cutting inside it drops it whole.
        assert_eq!(truncate_at_char_boundary("aé", 2), "a");
        assert_eq!(truncate_at_char_boundary("é", 1), "");
    }

    #[test]
    fn statuses_of_errors() {
        assert_eq!(
            FrameError::ZeroLength.status(),
            wire::Status::MALFORMED_FRAME
        );
        let too_large = FrameError::TooLarge {
            length_bytes: 2,
            max_frame_bytes: 1,
        };
        assert_eq!(too_large.status(), wire::Status::FRAME_TOO_LARGE);
        assert!(too_large.is_connection_fatal());
        let malformed = FrameError::from(MalformedFrame::MissingFileIdentifier);
        assert_eq!(malformed.status(), wire::Status::MALFORMED_FRAME);
        assert!(!malformed.is_connection_fatal());
    }

    #[test]
    fn oversized_builder_is_released() {
        let mut encoder = FrameEncoder::new();
        let big_message = "x".repeat(2 * RETAINED_BUILDER_BYTES);
        encoder
            .encode(|builder| {
                build_frame(
                    builder,
                    &FrameHeader::one_way().with_message(&big_message),
                    wire::Body::NONE,
                    None,
                )
            })
            .expect("under the frame limit");
        assert!(encoder.builder.unfinished_data().is_empty());
    }
}
