//! Property tests of the public codecs: everything encoded decodes to what it was, however the
//! bytes are split on the way, and garbage never panics a decoder (it yields an error or waits).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::{Bytes, BytesMut};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use shardmq_remoting::{
    encode_batch_record, encode_frame, encode_properties, parse_properties, BatchMessages,
    FrameDecoder, HeaderLimits, LanguageCode, OffsetMessageId, RemotingCommand, SerializeType,
    DEFAULT_MAX_FRAME_BYTES,
};

fn language() -> impl Strategy<Value = LanguageCode> {
    let all: Vec<LanguageCode> = LanguageCode::all().collect();
    proptest::sample::select(all)
}

fn ext_fields() -> impl Strategy<Value = BTreeMap<String, String>> {
    btree_map(".{0,24}", ".{0,48}", 0..12)
}

/// A command either header format can carry: code and version within i16 (the binary
/// format's width), a remark that is absent or non-empty (binary writes `Some("")` as absent).
fn command(serialize_type: SerializeType) -> impl Strategy<Value = RemotingCommand> {
    (
        any::<i16>(),
        language(),
        any::<i16>(),
        any::<i32>(),
        any::<i32>(),
        proptest::option::of(".{1,40}"),
        ext_fields(),
        vec(any::<u8>(), 0..64),
    )
        .prop_map(
            move |(code, language, version, opaque, flag, remark, ext_fields, body)| {
                RemotingCommand {
                    code: i32::from(code),
                    language,
                    version: i32::from(version),
                    opaque,
                    flag,
                    remark,
                    ext_fields,
                    body: Bytes::from(body),
                    serialize_type,
                }
            },
        )
}

fn any_command() -> impl Strategy<Value = RemotingCommand> {
    prop_oneof![
        command(SerializeType::Json),
        command(SerializeType::RocketMq)
    ]
}

fn header_round_trip(command: RemotingCommand) -> Result<(), TestCaseError> {
    let mut header = BytesMut::new();
    command.encode_header(&mut header).expect("encodes");
    let decoded =
        RemotingCommand::decode_header(command.serialize_type, &header, &HeaderLimits::default())
            .expect("decodes");
    prop_assert_eq!(decoded, command.with_body(Bytes::new()));
    Ok(())
}

proptest! {
    #[test]
    fn json_header_round_trips(command in command(SerializeType::Json)) {
        header_round_trip(command)?;
    }

    #[test]
    fn json_header_keeps_full_width_codes_and_empty_remarks(
        code in any::<i32>(),
        version in any::<i32>(),
    ) {
        let mut command = RemotingCommand::request(code, 1).with_remark("");
        command.version = version;
        header_round_trip(command)?;
    }

    #[test]
    fn binary_header_round_trips(command in command(SerializeType::RocketMq)) {
        header_round_trip(command)?;
    }

    /// A stream of frames, cut into arbitrary pieces and fed one piece per "read", decodes to
    /// the same commands in the same order, and nothing is left over.
    #[test]
    fn frames_decode_across_random_splits(
        commands in vec(any_command(), 1..6),
        cuts in vec(any::<prop::sample::Index>(), 0..16),
    ) {
        let mut stream = BytesMut::new();
        for command in &commands {
            encode_frame(command, DEFAULT_MAX_FRAME_BYTES, &mut stream).expect("encodes");
        }
        let mut cut_points: Vec<usize> = cuts.iter().map(|cut| cut.index(stream.len())).collect();
        cut_points.push(stream.len());
        cut_points.sort_unstable();

        let decoder = FrameDecoder::default();
        let mut buffer = BytesMut::new();
        let mut decoded = Vec::new();
        let mut fed = 0;
        for cut in cut_points {
            buffer.extend_from_slice(&stream[fed..cut]);
            fed = cut;
            while let Some(command) = decoder.decode(&mut buffer).expect("decodes") {
                decoded.push(command);
            }
        }
        prop_assert!(buffer.is_empty());
        prop_assert_eq!(decoded, commands);
    }

    /// Garbage never panics the frame decoder: it waits, or it errors.
    #[test]
    fn garbage_frames_never_panic(bytes in vec(any::<u8>(), 0..256)) {
        let decoder = FrameDecoder::default();
        let mut buffer = BytesMut::from(&bytes[..]);
        for _ in 0..bytes.len() + 1 {
            match decoder.decode(&mut buffer) {
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(error) if error.is_boundary_lost() => break,
                Err(_) => continue,
            }
        }
    }

    /// A valid frame with one byte of its header changed decodes or errors, never panics.
    #[test]
    fn corrupted_headers_never_panic(
        command in any_command(),
        position in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut header = BytesMut::new();
        command.encode_header(&mut header).expect("encodes");
        if !header.is_empty() {
            let at = position.index(header.len());
            header[at] = byte;
        }
        let _ = RemotingCommand::decode_header(
            command.serialize_type,
            &header,
            &HeaderLimits::default(),
        );
    }

    #[test]
    fn properties_round_trip(
        pairs in vec(("[^\u{1}\u{2}]{0,16}", "[^\u{1}\u{2}]{0,32}"), 0..12),
    ) {
        let mut encoded = BytesMut::new();
        encode_properties(pairs.iter().map(|(n, v)| (n, v)), &mut encoded).expect("encodes");
        let parsed: Vec<(String, String)> = parse_properties(&encoded)
            .expect("parses")
            .iter()
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect();
        prop_assert_eq!(parsed, pairs);
    }

    #[test]
    fn batch_bodies_round_trip(
        records in vec((any::<i32>(), vec(any::<u8>(), 0..64), vec(any::<u8>(), 0..32)), 0..8),
    ) {
        let mut batch = BytesMut::new();
        for (flag, body, properties) in &records {
            encode_batch_record(*flag, body, properties, &mut batch).expect("encodes");
        }
        let decoded: Vec<(i32, Vec<u8>, Vec<u8>)> = BatchMessages::new(batch.freeze())
            .map(|message| {
                let message = message.expect("decodes");
                (message.flag, message.body.to_vec(), message.properties.to_vec())
            })
            .collect();
        prop_assert_eq!(decoded, records);
    }

    /// Garbage batch bodies end in an error or in records that lie within the body; never a
    /// panic, and never more records than 22-byte minimums fit.
    #[test]
    fn garbage_batches_never_panic(bytes in vec(any::<u8>(), 0..256)) {
        let length = bytes.len();
        let count = BatchMessages::new(Bytes::from(bytes)).count();
        prop_assert!(count <= length / 22 + 1);
    }

    #[test]
    fn offset_message_ids_round_trip(
        ipv4 in any::<[u8; 4]>(),
        ipv6 in any::<[u8; 16]>(),
        use_ipv6 in any::<bool>(),
        port in any::<u16>(),
        physical_offset in any::<i64>(),
    ) {
        let ip = if use_ipv6 {
            IpAddr::V6(Ipv6Addr::from(ipv6))
        } else {
            IpAddr::V4(Ipv4Addr::from(ipv4))
        };
        let id = OffsetMessageId::new(SocketAddr::new(ip, port), physical_offset);
        let text = id.encode();
        let expected_len = if use_ipv6 {
            OffsetMessageId::IPV6_HEX_DIGITS
        } else {
            OffsetMessageId::IPV4_HEX_DIGITS
        };
        prop_assert_eq!(text.len(), expected_len);
        prop_assert!(text.bytes().all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b)));
        prop_assert_eq!(OffsetMessageId::decode(&text), Ok(id));
    }

    #[test]
    fn offset_message_id_garbage_never_panics(text in ".{0,60}") {
        let _ = OffsetMessageId::decode(&text);
    }
}
