//! Fuzzes RocketMQ's remoting codec (`shardmq_remoting`), the first code that touches every
//! byte a RocketMQ client sends the name server or a broker: the frame decoder, both header
//! formats, and the bodies a request may carry (heartbeat, queue locks, a batch of messages,
//! properties, offset message ids).
//!
//! The input is a byte stream fed to the decoder in reads of a size taken from the first byte,
//! as a connection's read loop feeds it. What must hold:
//! - nothing panics, and no frame longer than the limit is handed out;
//! - `Ok(None)` consumes nothing; an error that loses the frame boundary consumes nothing (the
//!   connection closes); any other error consumes the bad frame whole;
//! - a decoded command encodes again, and that encoding decodes to the same command.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use shardmq_remoting::{
    decode_heartbeat_body, decode_lock_batch_request, encode_frame, parse_properties,
    BatchMessages, FrameDecoder, FrameLimits, OffsetMessageId,
};

/// A small limit, so that the fuzzer reaches the too-large path as well as whole frames.
const MAX_FRAME_BYTES: usize = 64 << 10;

fuzz_target!(|data: &[u8]| {
    let Some((&control, stream)) = data.split_first() else {
        return;
    };
    let read_bytes = usize::from(control & 0x7F) + 1;
    let decoder = FrameDecoder::new(FrameLimits::default().with_max_frame_bytes(MAX_FRAME_BYTES));
    let mut buffer = BytesMut::new();
    let mut fed = 0;
    while fed < stream.len() {
        let next = (fed + read_bytes).min(stream.len());
        buffer.extend_from_slice(&stream[fed..next]);
        fed = next;
        loop {
            let before = buffer.len();
            match decoder.decode(&mut buffer) {
                Ok(None) => {
                    assert_eq!(buffer.len(), before, "an incomplete frame consumed bytes");
                    break;
                }
                Ok(Some(command)) => {
                    let used = before - buffer.len();
                    assert!(used <= MAX_FRAME_BYTES, "a frame over the limit was handed out");
                    let mut again = BytesMut::new();
                    if encode_frame(&command, usize::MAX, &mut again).is_ok() {
                        let decoded = FrameDecoder::default()
                            .decode(&mut again)
                            .expect("an encoded command decodes")
                            .expect("whole");
                        assert_eq!(decoded.code, command.code);
                        assert_eq!(decoded.opaque, command.opaque);
                        assert_eq!(decoded.flag, command.flag);
                        assert_eq!(decoded.ext_fields, command.ext_fields);
                        assert_eq!(decoded.body, command.body);
                    }
                    let _ = decode_heartbeat_body(&command.body);
                    let _ = decode_lock_batch_request(&command.body);
                    for message in BatchMessages::new(command.body.clone()) {
                        match message {
                            Ok(message) => {
                                if let Ok(properties) = parse_properties(&message.properties) {
                                    let _ = properties.iter().count();
                                }
                            }
                            Err(_) => break,
                        }
                    }
                    for value in command.ext_fields.values() {
                        let _ = OffsetMessageId::decode(value);
                        if let Ok(properties) = parse_properties(value.as_bytes()) {
                            let _ = properties.iter().count();
                        }
                    }
                }
                Err(error) => {
                    if error.is_boundary_lost() {
                        assert_eq!(buffer.len(), before, "a fatal error consumed bytes");
                        return;
                    }
                    assert!(buffer.len() < before, "a bad frame was not consumed");
                }
            }
        }
    }
});
