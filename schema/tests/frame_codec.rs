//! Frame codec tests: round-trips of random requests, decoding from random read splits, and
//! hostile input (garbage, truncated, oversized, corrupted frames), which must give the defined
//! errors and never panic.
//!
//! Size: one test per frame-codec rule, sharing this file's builders.

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use shardmq_schema::wire::{self, BodyT, FrameT};
use shardmq_schema::{
    build_frame, FrameDecoder, FrameEncoder, FrameError, FrameHeader, MalformedFrame,
    FRAME_LENGTH_PREFIX_BYTES, MAX_STATUS_MESSAGE_BYTES, MIN_RESERVE_AHEAD_BYTES,
};

// ---------------------------------------------------------------------------------------------
// Strategies

/// Builds an object-API value: flatc marks those structs `#[non_exhaustive]`, so other crates
/// cannot write them as struct expressions.
fn with<T: Default>(fill: impl FnOnce(&mut T)) -> T {
    let mut value = T::default();
    fill(&mut value);
    value
}

fn optional_text() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(".{0,24}")
}

fn key_value() -> impl Strategy<Value = wire::KeyValueT> {
    (optional_text(), optional_text()).prop_map(|(key, value)| {
        with(|v: &mut wire::KeyValueT| {
            v.key = key;
            v.value = value;
        })
    })
}

fn message() -> impl Strategy<Value = wire::MessageT> {
    (
        proptest::option::of(vec(any::<u8>(), 0..256)),
        optional_text(),
        proptest::option::of(vec("[a-zA-Z0-9_-]{1,12}", 0..4)),
        any::<i32>(),
        any::<i64>(),
        optional_text(),
        proptest::option::of(vec(key_value(), 0..4)),
        0i32..=18,
        any::<i64>(),
        any::<u8>(),
    )
        .prop_map(
            |(
                body,
                tags,
                keys,
                flag,
                born_timestamp_ms,
                unique_id,
                properties,
                delay_level,
                deliver_at_ms,
                compression,
            )| {
                with(|v: &mut wire::MessageT| {
                    v.body = body;
                    v.tags = tags;
                    v.keys = keys;
                    v.flag = flag;
                    v.born_timestamp_ms = born_timestamp_ms;
                    v.unique_id = unique_id;
                    v.properties = properties;
                    v.delay_level = delay_level;
                    v.deliver_at_ms = deliver_at_ms;
                    // Any value, known or not, must survive the trip.
                    v.compression = wire::Compression(compression);
                })
            },
        )
}

fn send_request() -> impl Strategy<Value = wire::SendRequestT> {
    (
        optional_text(),
        any::<i32>(),
        optional_text(),
        proptest::option::of(vec(message(), 0..6)),
    )
        .prop_map(|(topic, queue_id, producer_group, messages)| {
            with(|v: &mut wire::SendRequestT| {
                v.topic = topic;
                v.queue_id = queue_id;
                v.producer_group = producer_group;
                v.messages = messages;
            })
        })
}

fn pull_request() -> impl Strategy<Value = wire::PullRequestT> {
    (
        optional_text(),
        optional_text(),
        any::<i32>(),
        any::<i64>(),
        any::<u32>(),
        any::<u32>(),
        optional_text(),
        any::<u32>(),
        any::<i64>(),
    )
        .prop_map(
            |(
                consumer_group,
                topic,
                queue_id,
                queue_offset,
                max_messages,
                max_bytes,
                tag_expression,
                suspend_timeout_ms,
                commit_offset,
            )| {
                with(|v: &mut wire::PullRequestT| {
                    v.consumer_group = consumer_group;
                    v.topic = topic;
                    v.queue_id = queue_id;
                    v.queue_offset = queue_offset;
                    v.max_messages = max_messages;
                    v.max_bytes = max_bytes;
                    v.tag_expression = tag_expression;
                    v.suspend_timeout_ms = suspend_timeout_ms;
                    v.commit_offset = commit_offset;
                })
            },
        )
}

fn frame() -> impl Strategy<Value = FrameT> {
    let body = prop_oneof![
        Just(BodyT::NONE),
        send_request().prop_map(|request| BodyT::SendRequest(Box::new(request))),
        pull_request().prop_map(|request| BodyT::PullRequest(Box::new(request))),
    ];
    (any::<u64>(), 0u8..3, any::<u16>(), optional_text(), body).prop_map(
        |(request_id, kind, status, message, body)| {
            with(|v: &mut FrameT| {
                v.request_id = request_id;
                v.kind = wire::FrameKind(kind);
                v.status = wire::Status(status);
                v.message = message;
                v.body = body;
            })
        },
    )
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn encode(encoder: &mut FrameEncoder, frame: &FrameT) -> Bytes {
    encoder
        .encode(|builder| frame.pack(builder))
        .expect("test frames are under the limit")
}

/// Decodes every complete frame in `buffer`, stopping at the first error.
fn decode_all(decoder: &FrameDecoder, buffer: &mut BytesMut) -> Result<Vec<FrameT>, FrameError> {
    let mut frames = Vec::new();
    while let Some(frame) = decoder.decode(buffer)? {
        frames.push(frame.frame().unpack());
    }
    Ok(frames)
}

fn length_prefixed(payload: &[u8]) -> BytesMut {
    let length = u32::try_from(payload.len()).expect("small payload");
    let mut buffer = BytesMut::new();
    buffer.extend_from_slice(&length.to_be_bytes());
    buffer.extend_from_slice(payload);
    buffer
}

/// A frame with bodies of most kinds, for corruption tests.
fn sample_frame_bytes() -> Bytes {
    let frame = with(|v: &mut FrameT| {
        v.request_id = 42;
        v.kind = wire::FrameKind::REQUEST;
        v.status = wire::Status::OK;
        v.message = Some("hello".into());
        v.body = BodyT::SendRequest(Box::new(with(|v: &mut wire::SendRequestT| {
            v.topic = Some("orders".into());
            v.queue_id = 3;
            v.producer_group = Some("producers".into());
            v.messages = Some(vec![with(|v: &mut wire::MessageT| {
                v.body = Some(b"payload".to_vec());
                v.tags = Some("TagA".into());
                v.keys = Some(vec!["k1".into(), "k2".into()]);
                v.unique_id = Some("0A0B0C".into());
                v.properties = Some(vec![with(|v: &mut wire::KeyValueT| {
                    v.key = Some("a".into());
                    v.value = Some("b".into());
                })]);
            })]);
        })));
    });
    encode(&mut FrameEncoder::new(), &frame)
}

/// Feeds `input` to a decoder and reads every frame it yields in full; the test is that this
/// returns (no panic) and that each outcome is one the codec defines.
fn decode_hostile(decoder: &FrameDecoder, input: &[u8]) {
    let mut buffer = BytesMut::from(input);
    loop {
        let before = buffer.len();
        match decoder.decode(&mut buffer) {
            Ok(Some(frame)) => {
                // Reading a verified frame must not panic, whatever its contents.
                let _ = frame.frame().unpack();
                let _ = format!("{frame:?}");
            }
            Ok(None) => {
                assert_eq!(buffer.len(), before, "waiting must consume nothing");
                break;
            }
            Err(error @ (FrameError::ZeroLength | FrameError::TooLarge { .. })) => {
                assert_eq!(buffer.len(), before, "a fatal error must consume nothing");
                assert_eq!(decoder.decode(&mut buffer).unwrap_err(), error);
                break;
            }
            Err(FrameError::Malformed(_)) => {
                assert!(buffer.len() < before, "a malformed frame must be consumed");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Round-trips

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_frames_round_trip(frame in frame()) {
        let bytes = encode(&mut FrameEncoder::new(), &frame);
        let mut buffer = BytesMut::from(&bytes[..]);
        let decoded = FrameDecoder::new().decode(&mut buffer)?.expect("one whole frame");
        prop_assert!(buffer.is_empty());
        prop_assert_eq!(decoded.frame().unpack(), frame);
    }

    /// The path the broker takes: build with `build_frame`, read with accessors.
    #[test]
    fn pull_request_built_by_hand_reads_back(request in pull_request(), request_id in any::<u64>()) {
        let mut encoder = FrameEncoder::new();
        let bytes = encoder.encode(|builder| {
            let consumer_group = request.consumer_group.as_deref().map(|s| builder.create_string(s));
            let topic = request.topic.as_deref().map(|s| builder.create_string(s));
            let tag_expression = request.tag_expression.as_deref().map(|s| builder.create_string(s));
            let body = wire::PullRequest::create(builder, &wire::PullRequestArgs {
                consumer_group,
                topic,
                queue_id: request.queue_id,
                queue_offset: request.queue_offset,
                max_messages: request.max_messages,
                max_bytes: request.max_bytes,
                tag_expression,
                suspend_timeout_ms: request.suspend_timeout_ms,
                commit_offset: request.commit_offset,
                expression_type: None,
            });
            build_frame(builder, &FrameHeader::request(request_id), wire::Body::PullRequest,
                Some(body.as_union_value()))
        })?;
        let mut buffer = BytesMut::from(&bytes[..]);
        let decoded = FrameDecoder::new().decode(&mut buffer)?.expect("one whole frame");
        let frame = decoded.frame();
        prop_assert_eq!(frame.request_id(), request_id);
        prop_assert_eq!(frame.kind(), wire::FrameKind::REQUEST);
        prop_assert_eq!(frame.status(), wire::Status::OK);
        let pull = frame.body_as_pull_request().expect("a pull request");
        prop_assert_eq!(pull.consumer_group(), request.consumer_group.as_deref());
        prop_assert_eq!(pull.topic(), request.topic.as_deref());
        prop_assert_eq!(pull.queue_id(), request.queue_id);
        prop_assert_eq!(pull.queue_offset(), request.queue_offset);
        prop_assert_eq!(pull.max_messages(), request.max_messages);
        prop_assert_eq!(pull.max_bytes(), request.max_bytes);
        prop_assert_eq!(pull.tag_expression(), request.tag_expression.as_deref());
        prop_assert_eq!(pull.suspend_timeout_ms(), request.suspend_timeout_ms);
        prop_assert_eq!(pull.commit_offset(), request.commit_offset);
    }

    #[test]
    fn random_read_splits_yield_the_same_frames(
        frames in vec(frame(), 1..6),
        cut_points in vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let mut encoder = FrameEncoder::new();
        let mut stream = BytesMut::new();
        for frame in &frames {
            encoder.encode_into(&mut stream, |builder| frame.pack(builder))?;
        }
        let mut cuts: Vec<usize> = cut_points.iter().map(|index| index.index(stream.len() + 1)).collect();
        cuts.push(stream.len());
        cuts.sort_unstable();

        let decoder = FrameDecoder::new();
        let mut read_buffer = BytesMut::new();
        let mut decoded = Vec::new();
        let mut start = 0;
        for cut in cuts {
            read_buffer.extend_from_slice(&stream[start..cut]);
            start = cut;
            decoded.extend(decode_all(&decoder, &mut read_buffer)?);
        }
        prop_assert!(read_buffer.is_empty());
        prop_assert_eq!(decoded, frames);
    }

    /// Pull responses whose records are written after the head, as the broker does to avoid
    /// copying stored bytes, decode like any other frame.
    #[test]
    fn trailing_records_round_trip(
        records in vec(any::<u8>(), 0..2048),
        next_begin_offset in any::<i64>(),
        min_offset in any::<i64>(),
        max_offset in any::<i64>(),
        request_id in any::<u64>(),
        message in optional_text(),
    ) {
        let mut encoder = FrameEncoder::new();
        let mut stream = BytesMut::new();
        let header = FrameHeader { message: message.as_deref(), ..FrameHeader::response(request_id, wire::Status::OK) };
        let head_bytes = encoder.encode_head_with_trailing_bytes(&mut stream, records.len(), |builder, records_vector| {
            let body = wire::PullResponse::create(builder, &wire::PullResponseArgs {
                next_begin_offset,
                min_offset,
                max_offset,
                records: Some(records_vector),
                suggest_which_broker_id: min_offset & 3,
            });
            build_frame(builder, &header, wire::Body::PullResponse, Some(body.as_union_value()))
        })?;
        prop_assert_eq!(head_bytes, stream.len());
        stream.extend_from_slice(&records);

        let decoded = FrameDecoder::new().decode(&mut stream)?.expect("one whole frame");
        prop_assert!(stream.is_empty());
        let expected = with(|v: &mut FrameT| { v.request_id = request_id; v.kind = wire::FrameKind::RESPONSE; v.status = wire::Status::OK; v.message = message; v.body = BodyT::PullResponse(Box::new(with(|v: &mut wire::PullResponseT| { v.next_begin_offset = next_begin_offset; v.min_offset = min_offset; v.max_offset = max_offset; v.records = Some(records.clone()); v.suggest_which_broker_id = min_offset & 3; }))); });
        prop_assert_eq!(decoded.frame().unpack(), expected);
        let pull = decoded.frame().body_as_pull_response().expect("a pull response");
        let records_in_frame = pull.records().expect("records present").bytes();
        let shared = decoded.share(records_in_frame).expect("records lie in the frame");
        prop_assert_eq!(&shared[..], &records[..]);
    }
}

// ---------------------------------------------------------------------------------------------
// Hostile input

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn garbage_never_panics(input in vec(any::<u8>(), 0..512)) {
        decode_hostile(&FrameDecoder::with_max_frame_bytes(256), &input);
        decode_hostile(&FrameDecoder::new(), &input);
    }

    #[test]
    fn garbage_with_a_valid_length_is_malformed_or_a_frame(payload in vec(any::<u8>(), 1..512)) {
        let mut buffer = length_prefixed(&payload);
        match FrameDecoder::new().decode(&mut buffer) {
            Ok(Some(frame)) => { let _ = frame.frame().unpack(); }
            Err(FrameError::Malformed(_)) => {}
            other => prop_assert!(false, "unexpected outcome {:?}", other),
        }
        prop_assert!(buffer.is_empty());
    }

    #[test]
    fn corrupted_frames_never_panic(
        corruptions in vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let frame = sample_frame_bytes();
        let mut payload = frame[FRAME_LENGTH_PREFIX_BYTES..].to_vec();
        for (index, value) in corruptions {
            let position = index.index(payload.len());
            payload[position] = value;
        }
        let mut buffer = length_prefixed(&payload);
        match FrameDecoder::new().decode(&mut buffer) {
            Ok(Some(frame)) => { let _ = frame.frame().unpack(); }
            Err(FrameError::Malformed(_)) => {}
            other => prop_assert!(false, "unexpected outcome {:?}", other),
        }
    }

    #[test]
    fn truncated_frames_wait_for_more(cut in any::<prop::sample::Index>()) {
        let frame = sample_frame_bytes();
        let cut = cut.index(frame.len());
        let mut buffer = BytesMut::from(&frame[..cut]);
        prop_assert!(FrameDecoder::new().decode(&mut buffer)?.is_none());
        prop_assert_eq!(buffer.len(), cut);
        buffer.extend_from_slice(&frame[cut..]);
        prop_assert!(FrameDecoder::new().decode(&mut buffer)?.is_some());
    }

    #[test]
    fn oversized_length_is_refused_without_reading(
        max_frame_bytes in 1usize..=(1 << 24),
        excess in 1u64..=(1 << 31),
    ) {
        let length = (max_frame_bytes as u64 + excess).min(u64::from(u32::MAX));
        let mut buffer = BytesMut::from(&(length as u32).to_be_bytes()[..]);
        let decoder = FrameDecoder::with_max_frame_bytes(max_frame_bytes);
        let expected = FrameError::TooLarge { length_bytes: length as usize, max_frame_bytes };
        prop_assert_eq!(decoder.decode(&mut buffer).unwrap_err(), expected.clone());
        prop_assert_eq!(decoder.decode(&mut buffer).unwrap_err(), expected);
        prop_assert_eq!(buffer.len(), FRAME_LENGTH_PREFIX_BYTES);
        prop_assert!(buffer.capacity() < 1024, "no room reserved for a refused frame");
    }
}

#[test]
fn room_for_a_declared_frame_grows_with_what_arrives() {
    let declared = 16 << 20;
    let mut buffer = BytesMut::from(&(declared as u32).to_be_bytes()[..]);
    buffer.extend_from_slice(&[7u8; 100]);
    let decoder = FrameDecoder::with_max_frame_bytes(declared);
    assert_eq!(
        decoder.pending_frame_bytes(&buffer),
        Some(FRAME_LENGTH_PREFIX_BYTES + declared)
    );
    assert!(decoder.decode(&mut buffer).unwrap().is_none());
    assert!(
        buffer.capacity() <= 2 * MIN_RESERVE_AHEAD_BYTES,
        "a 16 MiB declaration with 104 bytes received reserved {} bytes",
        buffer.capacity()
    );
    // With 1 MiB received, at most about as much again is reserved.
    buffer.extend_from_slice(&vec![7u8; 1 << 20]);
    assert!(decoder.decode(&mut buffer).unwrap().is_none());
    assert!(buffer.capacity() <= 3 << 20, "{}", buffer.capacity());
    assert_eq!(FrameDecoder::new().pending_frame_bytes(&[0, 0]), None);
}

#[test]
fn zero_length_is_refused() {
    let mut buffer = BytesMut::from(&[0u8, 0, 0, 0, 1, 2, 3][..]);
    let decoder = FrameDecoder::new();
    assert_eq!(
        decoder.decode(&mut buffer).unwrap_err(),
        FrameError::ZeroLength
    );
    assert_eq!(
        decoder.decode(&mut buffer).unwrap_err(),
        FrameError::ZeroLength
    );
    assert_eq!(buffer.len(), 7);
    assert_eq!(
        FrameError::ZeroLength.status(),
        wire::Status::MALFORMED_FRAME
    );
}

#[test]
fn short_frames_are_malformed() {
    for length in 1..8 {
        let mut buffer = length_prefixed(&vec![0u8; length]);
        let error = FrameDecoder::new().decode(&mut buffer).unwrap_err();
        assert_eq!(
            error,
            FrameError::Malformed(MalformedFrame::MissingFileIdentifier)
        );
        assert!(buffer.is_empty());
    }
}

#[test]
fn frame_without_identifier_is_malformed() {
    let mut builder = flatbuffers::FlatBufferBuilder::new();
    let root = build_frame(
        &mut builder,
        &FrameHeader::request(1),
        wire::Body::NONE,
        None,
    );
    builder.finish(root, None);
    let mut buffer = length_prefixed(builder.finished_data());
    assert_eq!(
        FrameDecoder::new().decode(&mut buffer).unwrap_err(),
        FrameError::Malformed(MalformedFrame::MissingFileIdentifier)
    );
}

#[test]
fn invalid_flatbuffer_with_identifier_is_malformed() {
    // Root offset pointing past the end, followed by the right identifier.
    let mut payload = vec![0xF0, 0xFF, 0, 0];
    payload.extend_from_slice(b"SHMQ");
    let mut buffer = length_prefixed(&payload);
    let error = FrameDecoder::new().decode(&mut buffer).unwrap_err();
    assert!(
        matches!(
            error,
            FrameError::Malformed(MalformedFrame::Verification(_))
        ),
        "{error:?}"
    );
    assert_eq!(error.status(), wire::Status::MALFORMED_FRAME);
    assert!(!error.is_connection_fatal());
}

#[test]
fn decoding_goes_on_after_a_malformed_frame() {
    let mut buffer = length_prefixed(b"not a flatbuffer at all");
    buffer.extend_from_slice(&sample_frame_bytes());
    let decoder = FrameDecoder::new();
    assert!(matches!(
        decoder.decode(&mut buffer),
        Err(FrameError::Malformed(_))
    ));
    let frame = decoder
        .decode(&mut buffer)
        .expect("valid frame")
        .expect("complete frame");
    assert_eq!(frame.frame().request_id(), 42);
}

#[test]
fn unknown_body_type_verifies_and_reads_as_unknown() {
    // A newer peer's body: the receiver must be able to answer UNKNOWN_REQUEST.
    let mut encoder = FrameEncoder::new();
    let bytes = encoder
        .encode(|builder| {
            let topic = builder.create_string("orders");
            let body = wire::GetRouteRequest::create(
                builder,
                &wire::GetRouteRequestArgs { topic: Some(topic) },
            );
            build_frame(
                builder,
                &FrameHeader::request(9),
                wire::Body(200),
                Some(body.as_union_value()),
            )
        })
        .expect("small frame");
    let mut buffer = BytesMut::from(&bytes[..]);
    let frame = FrameDecoder::new()
        .decode(&mut buffer)
        .expect("verifies")
        .expect("complete");
    assert_eq!(frame.frame().body_type(), wire::Body(200));
    assert!(frame.frame().body_as_get_route_request().is_none());
    assert_eq!(frame.frame().unpack().body, BodyT::NONE);
}

#[test]
fn message_bodies_are_shared_not_copied() {
    let bytes = sample_frame_bytes();
    let mut buffer = BytesMut::from(&bytes[..]);
    let frame = FrameDecoder::new().decode(&mut buffer).unwrap().unwrap();
    let send = frame.frame().body_as_send_request().unwrap();
    let body = send.messages().unwrap().get(0).body().unwrap().bytes();
    let shared = frame.share(body).expect("body lies in the frame");
    assert_eq!(&shared[..], b"payload");
    assert_eq!(shared.as_ptr(), body.as_ptr());
    assert!(frame.share(b"elsewhere").is_none());
}

// ---------------------------------------------------------------------------------------------
// Encoder

#[test]
fn error_response_carries_status_and_message() {
    let mut encoder = FrameEncoder::new();
    let bytes = encoder
        .encode_error_response(77, wire::Status::TOPIC_NOT_FOUND, "topic orders not found")
        .unwrap();
    let length = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
    assert_eq!(length, bytes.len() - FRAME_LENGTH_PREFIX_BYTES);
    let mut buffer = BytesMut::from(&bytes[..]);
    let frame = FrameDecoder::new().decode(&mut buffer).unwrap().unwrap();
    let frame = frame.frame();
    assert_eq!(frame.request_id(), 77);
    assert_eq!(frame.kind(), wire::FrameKind::RESPONSE);
    assert_eq!(frame.status(), wire::Status::TOPIC_NOT_FOUND);
    assert_eq!(frame.message(), Some("topic orders not found"));
    assert_eq!(frame.body_type(), wire::Body::NONE);
}

#[test]
fn error_response_message_is_capped() {
    let mut encoder = FrameEncoder::new();
    let long_message = "é".repeat(MAX_STATUS_MESSAGE_BYTES);
    let bytes = encoder
        .encode_error_response(1, wire::Status::SYSTEM_ERROR, &long_message)
        .unwrap();
    let mut buffer = BytesMut::from(&bytes[..]);
    let frame = FrameDecoder::new().decode(&mut buffer).unwrap().unwrap();
    let message = frame.frame().message().unwrap().to_owned();
    assert!(message.len() <= MAX_STATUS_MESSAGE_BYTES);
    assert!(long_message.starts_with(&message));
    assert_eq!(message.len(), MAX_STATUS_MESSAGE_BYTES);
}

#[test]
fn encoder_refuses_frames_over_its_limit() {
    let mut encoder = FrameEncoder::with_max_frame_bytes(64);
    let mut out = BytesMut::from(&b"earlier"[..]);
    let long_message = "x".repeat(100);
    let error = encoder
        .encode_into(&mut out, |builder| {
            build_frame(
                builder,
                &FrameHeader::one_way().with_message(&long_message),
                wire::Body::NONE,
                None,
            )
        })
        .unwrap_err();
    assert!(
        matches!(error, FrameError::TooLarge { max_frame_bytes: 64, length_bytes } if length_bytes > 64),
        "{error:?}"
    );
    assert_eq!(&out[..], b"earlier");

    let error = encoder
        .encode_head_with_trailing_bytes(&mut out, 1000, |builder, records| {
            let body = wire::PullResponse::create(
                builder,
                &wire::PullResponseArgs {
                    records: Some(records),
                    ..Default::default()
                },
            );
            build_frame(
                builder,
                &FrameHeader::response(1, wire::Status::OK),
                wire::Body::PullResponse,
                Some(body.as_union_value()),
            )
        })
        .unwrap_err();
    assert!(matches!(error, FrameError::TooLarge { .. }), "{error:?}");
    assert_eq!(&out[..], b"earlier");

    // The encoder is still usable after refusing.
    assert!(encoder
        .encode_error_response(2, wire::Status::OK, "")
        .is_ok());
}

#[test]
fn frames_append_to_a_write_buffer() {
    let mut encoder = FrameEncoder::new();
    let mut out = BytesMut::new();
    let first = encoder
        .encode_error_response_into(&mut out, 1, wire::Status::SYSTEM_BUSY, "busy")
        .unwrap();
    let second = encoder
        .encode_error_response_into(&mut out, 2, wire::Status::DISK_FULL, "full")
        .unwrap();
    assert_eq!(out.len(), first + second);
    let frames = decode_all(&FrameDecoder::new(), &mut out).unwrap();
    let ids: Vec<u64> = frames.iter().map(|frame| frame.request_id).collect();
    assert_eq!(ids, [1, 2]);
}

#[test]
fn every_body_kind_round_trips() {
    let bodies = [
        BodyT::HandshakeRequest(Box::new(with(|v: &mut wire::HandshakeRequestT| {
            v.protocol_version = shardmq_schema::PROTOCOL_VERSION;
            v.min_protocol_version = 1;
            v.client_id = Some("192.0.2.7@1".into());
            v.client_version = Some("shardmq-client 0.1.0".into());
        }))),
        BodyT::HandshakeResponse(Box::new(with(|v: &mut wire::HandshakeResponseT| {
            v.protocol_version = 1;
            v.min_protocol_version = 1;
            v.max_protocol_version = 1;
            v.server = Some(Box::new(with(|v: &mut wire::ServerInfoT| {
                v.name = Some("shardmq-broker".into());
                v.version = Some("0.1.0".into());
                v.cluster_name = Some("DefaultCluster".into());
                v.broker_name = Some("broker-a".into());
                v.broker_id = 0;
            })));
            v.max_frame_bytes = 16 << 20;
            v.max_message_bytes = 4 << 20;
        }))),
        BodyT::SendResponse(Box::new(with(|v: &mut wire::SendResponseT| {
            v.queue_id = 2;
            v.results = Some(vec![with(|v: &mut wire::SendResultT| {
                v.unique_id = Some("id".into());
                v.offset_msg_id = Some("7F0000010000277F0000000000000000".into());
                v.queue_offset = 5;
                v.commit_log_offset = 1024;
            })]);
        }))),
        BodyT::RegisterBrokerRequest(Box::new(with(|v: &mut wire::RegisterBrokerRequestT| {
            v.cluster_name = Some("DefaultCluster".into());
            v.broker_name = Some("broker-a".into());
            v.broker_id = 0;
            v.broker_address = Some("127.0.0.1:10911".into());
            v.ha_server_address = None;
            v.topics = Some(vec![with(|v: &mut wire::TopicConfigT| {
                v.name = Some("orders".into());
                v.read_queues = 8;
                v.write_queues = 8;
                v.perm = shardmq_schema::topic_permission::READ_WRITE;
                v.is_ordered = false;
            })]);
            v.topic_config_version = 3;
        }))),
        BodyT::RegisterBrokerResponse(Box::new(with(|v: &mut wire::RegisterBrokerResponseT| {
            v.master_address = Some("127.0.0.1:10911".into());
            v.ha_server_address = None;
        }))),
        BodyT::UnregisterBrokerRequest(Box::new(with(|v: &mut wire::UnregisterBrokerRequestT| {
            v.cluster_name = Some("DefaultCluster".into());
            v.broker_name = Some("broker-a".into());
            v.broker_id = 0;
            v.broker_address = Some("127.0.0.1:10911".into());
        }))),
        BodyT::GetRouteRequest(Box::new(with(|v: &mut wire::GetRouteRequestT| {
            v.topic = Some("orders".into());
        }))),
        BodyT::RouteResponse(Box::new(with(|v: &mut wire::RouteResponseT| {
            v.topic = Some("orders".into());
            v.brokers = Some(vec![with(|v: &mut wire::BrokerDataT| {
                v.cluster_name = Some("DefaultCluster".into());
                v.broker_name = Some("broker-a".into());
                v.addresses = Some(vec![with(|v: &mut wire::BrokerAddressT| {
                    v.broker_id = 0;
                    v.address = Some("127.0.0.1:10911".into());
                })]);
            })]);
            v.queues = Some(vec![with(|v: &mut wire::QueueDataT| {
                v.broker_name = Some("broker-a".into());
                v.read_queues = 8;
                v.write_queues = 8;
                v.perm = 6;
            })]);
        }))),
        BodyT::TopicListRequest(Box::new(with(|v: &mut wire::TopicListRequestT| {
            v.cluster_name = None;
        }))),
        BodyT::TopicListResponse(Box::new(with(|v: &mut wire::TopicListResponseT| {
            v.topics = Some(vec!["a".into(), "b".into()]);
        }))),
    ];
    let mut encoder = FrameEncoder::new();
    let decoder = FrameDecoder::new();
    for (index, body) in bodies.into_iter().enumerate() {
        let frame = with(|v: &mut FrameT| {
            v.request_id = index as u64;
            v.kind = wire::FrameKind::RESPONSE;
            v.status = wire::Status::OK;
            v.message = None;
            v.body = body;
        });
        let mut buffer = BytesMut::from(&encode(&mut encoder, &frame)[..]);
        let decoded = decoder.decode(&mut buffer).unwrap().unwrap();
        assert_eq!(decoded.frame().unpack(), frame);
    }
}

#[test]
fn schema_defaults_are_the_documented_ones() {
    // Absent fields read as these values; docs/protocol.md lists them.
    let pull = wire::PullRequestT::default();
    assert_eq!(pull.max_messages, 32);
    assert_eq!(pull.suspend_timeout_ms, 15_000);
    assert_eq!(pull.commit_offset, -1);
    assert_eq!(wire::SendRequestT::default().queue_id, -1);
    assert_eq!(wire::TopicConfigT::default().perm, 6);
    assert_eq!(wire::FrameT::default().kind, wire::FrameKind::REQUEST);
    assert_eq!(wire::FrameT::default().status, wire::Status::OK);
}

#[test]
fn a_frame_of_exactly_the_limit_is_accepted() {
    let bytes = sample_frame_bytes();
    let length_bytes = bytes.len() - FRAME_LENGTH_PREFIX_BYTES;

    let mut buffer = BytesMut::from(&bytes[..]);
    let at_limit = FrameDecoder::with_max_frame_bytes(length_bytes);
    assert!(at_limit.decode(&mut buffer).unwrap().is_some());

    let mut buffer = BytesMut::from(&bytes[..]);
    let below = FrameDecoder::with_max_frame_bytes(length_bytes - 1);
    assert_eq!(
        below.decode(&mut buffer).unwrap_err(),
        FrameError::TooLarge {
            length_bytes,
            max_frame_bytes: length_bytes - 1
        }
    );
}
