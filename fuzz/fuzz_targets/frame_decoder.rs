//! Fuzzes the wire frame codec (`shardmq_schema::FrameDecoder`), the first code that touches
//! every byte a peer sends to the broker, the namesrv or a client.
//!
//! The input is a byte stream fed to the decoder in reads of a size taken from the first byte,
//! the way a connection's read loop feeds it, under one of two limits (the broker's 64 KiB
//! pre-handshake limit or the default 16 MiB). What must hold:
//! - the decoder never panics, and never hands out a frame longer than its limit;
//! - `Ok(None)` consumes nothing, a frame consumes exactly its prefix and length, a malformed
//!   frame is consumed (the stream stays in step) and a fatal error consumes nothing;
//! - every frame it hands out can be read whole through the unchecked accessors (`Debug`
//!   walks every field and union body, `unpack` copies them all), and packing what was read
//!   gives a frame that verifies again and reads back the same.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use shardmq_schema::{wire, FrameDecoder, FrameError, FRAME_LENGTH_PREFIX_BYTES};

/// The broker's limit before a handshake (`PRE_HANDSHAKE_MAX_FRAME_BYTES`).
const PRE_HANDSHAKE_MAX_FRAME_BYTES: usize = 64 << 10;

fuzz_target!(|data: &[u8]| {
    let Some((&control, stream)) = data.split_first() else {
        return;
    };
    let read_bytes = usize::from(control & 0x7F) + 1;
    let decoder = if control & 0x80 == 0 {
        FrameDecoder::with_max_frame_bytes(PRE_HANDSHAKE_MAX_FRAME_BYTES)
    } else {
        FrameDecoder::new()
    };

    // The verifier on its own, as a caller holding one frame's bytes uses it.
    if let Ok(frame) = decoder.verify(bytes::Bytes::copy_from_slice(stream)) {
        read_whole(&frame);
    }

    let mut buffer = BytesMut::new();
    let mut fed = 0;
    let mut consumed = 0;
    'stream: while fed < stream.len() {
        let end = (fed + read_bytes).min(stream.len());
        buffer.extend_from_slice(&stream[fed..end]);
        fed = end;
        loop {
            let before = buffer.len();
            match decoder.decode(&mut buffer) {
                Ok(Some(frame)) => {
                    let length = frame.as_bytes().len();
                    assert!(length >= 1 && length <= decoder.max_frame_bytes());
                    assert_eq!(before - buffer.len(), FRAME_LENGTH_PREFIX_BYTES + length);
                    consumed += FRAME_LENGTH_PREFIX_BYTES + length;
                    read_whole(&frame);
                }
                Ok(None) => {
                    assert_eq!(buffer.len(), before, "Ok(None) consumed bytes");
                    break;
                }
                Err(error @ (FrameError::ZeroLength | FrameError::TooLarge { .. })) => {
                    assert!(error.is_connection_fatal());
                    assert_eq!(buffer.len(), before, "a fatal error consumed bytes");
                    // Every later call must say the same.
                    assert_eq!(decoder.decode(&mut buffer).err(), Some(error));
                    break 'stream;
                }
                Err(error @ FrameError::Malformed(_)) => {
                    assert!(!error.is_connection_fatal());
                    assert_eq!(error.status(), wire::Status::MALFORMED_FRAME);
                    assert!(buffer.len() < before, "a malformed frame was not consumed");
                    consumed += before - buffer.len();
                }
            }
        }
    }
    assert_eq!(consumed + buffer.len(), fed, "bytes lost or invented");
});

/// Reads every field of `frame` through the accessors that skip verification, and checks
/// that the frame survives being packed again.
fn read_whole(frame: &shardmq_schema::VerifiedFrame) {
    let view = frame.frame();
    let _ = format!("{view:?} {frame:?}");
    let unpacked = view.unpack();
    let mut builder = flatbuffers::FlatBufferBuilder::new();
    let root = unpacked.pack(&mut builder);
    wire::finish_frame_buffer(&mut builder, root);
    let repacked = FrameDecoder::new()
        .verify(bytes::Bytes::copy_from_slice(builder.finished_data()))
        .expect("a frame packed from a verified frame's contents verifies");
    assert_eq!(
        repacked.frame().unpack(),
        unpacked,
        "pack/unpack changed the frame"
    );
    // A part of the frame is shared, not copied; a slice from elsewhere is refused.
    if let Some(message) = view.message() {
        let shared = frame
            .share(message.as_bytes())
            .expect("the message lies in the frame");
        assert_eq!(&shared[..], message.as_bytes());
    }
    assert!(frame.share(b"not in the frame").is_none());
}
