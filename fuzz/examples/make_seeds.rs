//! Writes the seed corpora in `fuzz/seeds/<target>/`: valid frames and records for the fuzzers
//! to mutate, so they start past the identifier, verifier and CRC checks that random bytes
//! almost never pass. Run from `fuzz/` with `cargo run --example make_seeds` after a format
//! change; `scripts/fuzz.sh` feeds the seeds to each target.

use std::net::SocketAddr;
use std::path::Path;

use bytes::BytesMut;
use flatbuffers::FlatBufferBuilder;
use shardmq_codec::{
    encode_blank, encode_record, patch_record, RecordBuilder, RecordHeader, RecordInput, StorePatch,
};
use shardmq_schema::{build_frame, wire, FrameEncoder, FrameHeader};

fn main() {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");

    let records = [
        record(
            "orders",
            3,
            0,
            0,
            b"hello",
            &[("TAGS", "TagA"), ("KEYS", "k1 k2"), ("UNIQ_KEY", "ID-1")],
            ipv4(),
        ),
        record("orders", 3, 1, 0, b"", &[], ipv4()),
        record(
            "payments",
            0,
            7,
            0,
            &[0xAB; 300],
            &[("user", "value")],
            ipv6(),
        ),
    ];
    // One CommitLog window: the records at their real physical offsets, then zero padding.
    let mut window = Vec::new();
    for (queue_offset, (topic, queue_id, body, properties)) in [
        ("orders", 3, &b"first"[..], &[("TAGS", "TagA")][..]),
        ("orders", 3, &b"second"[..], &[][..]),
        ("audit", 1, &[7u8; 64][..], &[("KEYS", "a b")][..]),
    ]
    .into_iter()
    .enumerate()
    {
        let bytes = record(
            topic,
            queue_id,
            queue_offset as u64,
            window.len() as u64,
            body,
            properties,
            ipv4(),
        );
        window.extend_from_slice(&bytes);
    }
    let mut blank = vec![0u8; 64];
    encode_blank(&mut blank);

    for (index, bytes) in records.iter().enumerate() {
        write(
            &seeds,
            "commitlog_record",
            &format!("record-{index}"),
            bytes,
        );
        write(&seeds, "client_records", &format!("record-{index}"), bytes);
    }
    write(&seeds, "commitlog_record", "blank", &blank);
    write(&seeds, "client_records", "three-records", &window);
    // commitlog_scan: 4 control bytes (segment of 64 KiB, base 0, window at 0, file end or not).
    for (name, is_file_end) in [("window-file-end", 0x80u8), ("window", 0)] {
        let mut input = vec![0, 0, 0, is_file_end];
        input.extend_from_slice(&window);
        input.extend_from_slice(&[0u8; 32]);
        write(&seeds, "commitlog_scan", name, &input);
    }

    // run_checker: a control byte (bit 0 IPv6 store host; 1,024 records and 4 MiB bodies
    // allowed), then a run as a producer builds it.
    for (name, control, hosts) in [("run-v4", 0x1Eu8, ipv4()), ("run-v6", 0x1F, ipv6())] {
        let mut input = vec![control];
        input.extend_from_slice(&run("orders", hosts));
        write(&seeds, "run_checker", name, &input);
    }

    let frames = frames(&records[0]);
    let mut stream = vec![0x07]; // frame_decoder: reads of 8 bytes, 64 KiB limit
    for (index, frame) in frames.iter().enumerate() {
        let mut input = vec![0xFF]; // reads of 128 bytes, 16 MiB limit
        input.extend_from_slice(frame);
        write(&seeds, "frame_decoder", &format!("frame-{index}"), &input);
        stream.extend_from_slice(frame);
    }
    write(&seeds, "frame_decoder", "stream", &stream);
    println!("seeds written under {}", seeds.display());
}

fn ipv4() -> (SocketAddr, SocketAddr) {
    (
        "10.0.0.7:51234".parse().unwrap(),
        "127.0.0.1:10911".parse().unwrap(),
    )
}

fn ipv6() -> (SocketAddr, SocketAddr) {
    (
        "[fe80::1]:40000".parse().unwrap(),
        "[::1]:10911".parse().unwrap(),
    )
}

fn record(
    topic: &str,
    queue_id: u32,
    queue_offset: u64,
    physical_offset: u64,
    body: &[u8],
    properties: &[(&str, &str)],
    (born_host, store_host): (SocketAddr, SocketAddr),
) -> Vec<u8> {
    let input = RecordInput {
        topic,
        queue_id,
        flag: 0,
        body,
        properties,
        sys_flag: 0,
        born_timestamp_ms: 1_700_000_000_000,
        born_host,
        store_host,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    };
    let mut buffer = BytesMut::new();
    encode_record(&mut buffer, &input).expect("a valid record");
    patch_record(
        &mut buffer,
        StorePatch {
            queue_id,
            queue_offset,
            physical_offset,
            store_timestamp_ms: 1_700_000_000_001,
            store_host: None,
        },
    );
    buffer.to_vec()
}

/// A run of three records as a producer encodes them for a `SendRecordsRequest`.
fn run(topic: &str, (born_host, store_host): (SocketAddr, SocketAddr)) -> Vec<u8> {
    let mut buffer = BytesMut::new();
    for (index, body) in [&b"first"[..], &[0x5A; 200][..], &b""[..]]
        .into_iter()
        .enumerate()
    {
        let header = RecordHeader {
            topic,
            queue_id: 0,
            flag: 0,
            body,
            sys_flag: 0,
            born_timestamp_ms: 1_700_000_000_000,
            born_host,
            store_host,
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        };
        let mut record = RecordBuilder::begin(&mut buffer, &header).expect("a valid header");
        record.property("TAGS", "TagA").expect("tags");
        record
            .property("KEYS", &format!("k{index} order-{index}"))
            .expect("keys");
        record
            .property("UNIQ_KEY", &format!("ID-{index}"))
            .expect("id");
        record.property("user", "value").expect("a user property");
        record.finish().expect("a valid record");
    }
    buffer.to_vec()
}

/// A handshake, a send, a pull, a pull response carrying `record`, and an error response, each
/// with its length prefix.
fn frames(record: &[u8]) -> Vec<Vec<u8>> {
    let mut encoder = FrameEncoder::new();
    let mut frames = Vec::new();
    frames.push(encode(&mut encoder, FrameHeader::request(1), |builder| {
        let client_id = builder.create_string("fuzz-seed");
        let body = wire::HandshakeRequest::create(
            builder,
            &wire::HandshakeRequestArgs {
                protocol_version: 1,
                min_protocol_version: 1,
                client_id: Some(client_id),
                client_version: None,
            },
        );
        (wire::Body::HandshakeRequest, body.as_union_value())
    }));
    frames.push(encode(&mut encoder, FrameHeader::request(2), |builder| {
        let body = builder.create_vector(b"message body");
        let tags = builder.create_string("TagA");
        let key = builder.create_string("order-1");
        let keys = builder.create_vector(&[key]);
        let name = builder.create_string("user");
        let value = builder.create_string("value");
        let property = wire::KeyValue::create(
            builder,
            &wire::KeyValueArgs {
                key: Some(name),
                value: Some(value),
            },
        );
        let properties = builder.create_vector(&[property]);
        let message = wire::Message::create(
            builder,
            &wire::MessageArgs {
                body: Some(body),
                tags: Some(tags),
                keys: Some(keys),
                properties: Some(properties),
                born_timestamp_ms: 1_700_000_000_000,
                ..Default::default()
            },
        );
        let messages = builder.create_vector(&[message]);
        let topic = builder.create_string("orders");
        let group = builder.create_string("producers");
        let request = wire::SendRequest::create(
            builder,
            &wire::SendRequestArgs {
                topic: Some(topic),
                queue_id: 3,
                producer_group: Some(group),
                messages: Some(messages),
            },
        );
        (wire::Body::SendRequest, request.as_union_value())
    }));
    frames.push(encode(&mut encoder, FrameHeader::request(3), |builder| {
        let topic = builder.create_string("orders");
        let group = builder.create_string("consumers");
        let expression = builder.create_string("TagA || TagB");
        let request = wire::PullRequest::create(
            builder,
            &wire::PullRequestArgs {
                consumer_group: Some(group),
                topic: Some(topic),
                queue_id: 3,
                queue_offset: 0,
                max_messages: 32,
                tag_expression: Some(expression),
                suspend_timeout_ms: 1000,
                commit_offset: -1,
                ..Default::default()
            },
        );
        (wire::Body::PullRequest, request.as_union_value())
    }));
    frames.push(encode(
        &mut encoder,
        FrameHeader::response(3, wire::Status::OK),
        |builder| {
            let records = builder.create_vector(record);
            let response = wire::PullResponse::create(
                builder,
                &wire::PullResponseArgs {
                    next_begin_offset: 1,
                    min_offset: 0,
                    max_offset: 1,
                    records: Some(records),
                    suggest_which_broker_id: 0,
                },
            );
            (wire::Body::PullResponse, response.as_union_value())
        },
    ));
    frames.push(
        encoder
            .encode_error_response(4, wire::Status::SYSTEM_BUSY, "busy")
            .expect("an error response")
            .to_vec(),
    );
    frames
}

fn encode(
    encoder: &mut FrameEncoder,
    header: FrameHeader<'_>,
    build: impl FnOnce(
        &mut FlatBufferBuilder<'static>,
    ) -> (
        wire::Body,
        flatbuffers::WIPOffset<flatbuffers::UnionWIPOffset>,
    ),
) -> Vec<u8> {
    encoder
        .encode(|builder| {
            let (body_type, body) = build(builder);
            build_frame(builder, &header, body_type, Some(body))
        })
        .expect("a frame")
        .to_vec()
}

fn write(seeds: &Path, target: &str, name: &str, bytes: &[u8]) {
    let dir = seeds.join(target);
    std::fs::create_dir_all(&dir).expect("create the seed directory");
    std::fs::write(dir.join(name), bytes).expect("write a seed");
}
