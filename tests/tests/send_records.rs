//! `SendRecordsRequest` against a real broker (docs/protocol.md, "Send a run of records"): a
//! producer's run of stored records is stored as it came, with the broker's own fields written
//! in (both CRCs still hold when it is pulled back, the index finds its keys and unique ids),
//! the answer has one size for any number of records and names segment rollovers, and every
//! malformed run is refused with a clear status and nothing of it stored.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

mod reliability_support;

use bytes::BytesMut;
use reliability_support::{create_topic, pull_queue, query_by_key};
use shardmq_codec::{RecordBuilder, RecordHeader};
use shardmq_schema::{build_frame, wire, FrameEncoder, FrameHeader, VerifiedFrame};
use shardmq_tests::{status_of, BrokerProcess, TestClient};

/// One record of a test run.
#[derive(Clone, Copy)]
struct Record<'a> {
    body: &'a [u8],
    tags: Option<&'a str>,
    keys: Option<&'a str>,
    unique_key: Option<&'a str>,
    extra: &'a [(&'a str, &'a str)],
}

impl<'a> Record<'a> {
    fn plain(body: &'a [u8]) -> Self {
        Record {
            body,
            tags: None,
            keys: None,
            unique_key: None,
            extra: &[],
        }
    }
}

/// A run of `records` for `topic`, encoded as a producer encodes it.
fn run(topic: &str, records: &[Record<'_>]) -> BytesMut {
    let mut buf = BytesMut::new();
    for record in records {
        let header = RecordHeader {
            topic,
            queue_id: 0,
            flag: 0,
            body: record.body,
            sys_flag: 0,
            born_timestamp_ms: 1_700_000_000_000,
            born_host: "127.0.0.1:40000".parse().unwrap(),
            store_host: "127.0.0.1:1".parse().unwrap(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        };
        let mut builder = RecordBuilder::begin(&mut buf, &header).unwrap();
        for (key, value) in [
            ("TAGS", record.tags),
            ("KEYS", record.keys),
            ("UNIQ_KEY", record.unique_key),
        ] {
            if let Some(value) = value {
                builder.property(key, value).unwrap();
            }
        }
        for (key, value) in record.extra {
            builder.property(key, value).unwrap();
        }
        builder.finish().unwrap();
    }
    buf
}

fn send_run(
    client: &mut TestClient,
    topic: &str,
    queue_id: i32,
    bytes: &[u8],
    count: u32,
) -> VerifiedFrame {
    client
        .request(|b| {
            let topic = b.create_string(topic);
            let records = b.create_vector(bytes);
            let body = wire::SendRecordsRequest::create(
                b,
                &wire::SendRecordsRequestArgs {
                    topic: Some(topic),
                    queue_id,
                    producer_group: None,
                    records: Some(records),
                    count,
                },
            );
            (wire::Body::SendRecordsRequest, body.as_union_value())
        })
        .expect("an answer to SendRecordsRequest")
}

fn start_broker(extra: &[&str]) -> (tempfile::TempDir, BrokerProcess) {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(dir.path(), extra);
    (dir, broker)
}

#[test]
fn a_run_is_stored_as_sent_with_the_brokers_fields_and_found_by_its_index() {
    let (_dir, broker) = start_broker(&[]);
    let mut client = broker.client();
    create_topic(&mut client, "Runs", 2);
    let records: Vec<Record<'_>> = (0..5)
        .map(|i| Record {
            body: [b"one", b"two", b"six", b"ten", b"big"][i],
            tags: Some("TagA"),
            keys: Some(["k0 order-0", "k1", "k2", "k3", "k4 x"][i]),
            unique_key: Some(["0A00", "0A01", "0A02", "0A03", "0A04"][i]),
            extra: &[("color", "blue")],
        })
        .collect();
    let bytes = run("Runs", &records);
    let answer = send_run(&mut client, "Runs", 1, &bytes, 5);
    assert_eq!(
        status_of(&answer).0,
        wire::Status::OK,
        "{:?}",
        status_of(&answer)
    );
    let stored = answer
        .frame()
        .body_as_send_records_response()
        .expect("a SendRecordsResponse");
    assert_eq!(stored.queue_id(), 1);
    assert_eq!(stored.count(), 5);
    assert_eq!(stored.first_queue_offset(), 0);
    assert_eq!(stored.segment_starts().map_or(0, |s| s.len()), 0);
    assert_eq!(
        stored.store_host(),
        Some(broker.addr().to_string().as_str())
    );

    // Pulled back through decode_message: structure and both CRCs hold after the broker wrote
    // its fields (queue id, offsets, store time, store host) into the producer's bytes.
    let (pulled, _) = pull_queue(&mut client, "Runs", 1);
    assert_eq!(pulled.len(), 5);
    let mut expected_offset = stored.first_physical_offset() as u64;
    for (i, record) in pulled.iter().enumerate() {
        assert_eq!(record.body, records[i].body);
        assert_eq!(record.queue_id, 1);
        assert_eq!(record.queue_offset, i as u64);
        assert_eq!(record.physical_offset, expected_offset);
        expected_offset = record.end();
    }
    // The index has the keys and unique ids the run carried.
    let found = query_by_key(&mut client, "Runs", "order-0");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].body, b"one");
    assert_eq!(query_by_key(&mut client, "Runs", "x")[0].body, b"big");
    let by_id = client
        .request(|b| {
            let id = b.create_string("0A03");
            let body = wire::QueryByIdRequest::create(
                b,
                &wire::QueryByIdRequestArgs {
                    unique_id: Some(id),
                    ..Default::default()
                },
            );
            (wire::Body::QueryByIdRequest, body.as_union_value())
        })
        .unwrap();
    assert_eq!(status_of(&by_id).0, wire::Status::OK);
}

#[test]
fn a_run_without_a_queue_goes_where_the_broker_puts_it() {
    let (_dir, broker) = start_broker(&[]);
    let mut client = broker.client();
    create_topic(&mut client, "Chosen", 4);
    let bytes = run("Chosen", &[Record::plain(b"a"), Record::plain(b"b")]);
    let answer = send_run(&mut client, "Chosen", -1, &bytes, 2);
    assert_eq!(status_of(&answer).0, wire::Status::OK);
    let queue = answer
        .frame()
        .body_as_send_records_response()
        .unwrap()
        .queue_id();
    assert!((0..4).contains(&queue));
    let (pulled, _) = pull_queue(&mut client, "Chosen", queue);
    assert_eq!(pulled.len(), 2);
    assert!(pulled.iter().all(|r| r.queue_id == queue as u32));
}

#[test]
fn a_run_across_a_segment_end_names_where_the_next_segment_starts() {
    // 128 KiB segments: a run of 80 records of 2 KiB crosses one.
    let (_dir, broker) =
        start_broker(&["--segment-bytes", "131072", "--max-message-bytes", "8192"]);
    let mut client = broker.client();
    create_topic(&mut client, "Rolls", 1);
    let body = vec![7u8; 2048];
    let records: Vec<Record<'_>> = (0..80).map(|_| Record::plain(&body)).collect();
    let bytes = run("Rolls", &records);
    let answer = send_run(&mut client, "Rolls", 0, &bytes, 80);
    assert_eq!(status_of(&answer).0, wire::Status::OK);
    let stored = answer.frame().body_as_send_records_response().unwrap();
    let starts: Vec<(u32, u64)> = stored
        .segment_starts()
        .unwrap()
        .iter()
        .map(|s| (s.index(), s.physical_offset()))
        .collect();
    assert_eq!(starts.len(), 1, "one rollover: {starts:?}");
    assert_eq!(starts[0].1, 131072);
    // The offsets the answer implies are where the records are.
    let (pulled, _) = pull_queue(&mut client, "Rolls", 0);
    assert_eq!(pulled.len(), 80);
    let mut offset = stored.first_physical_offset() as u64;
    for (i, record) in pulled.iter().enumerate() {
        if let Some((_, start)) = starts.iter().find(|(index, _)| *index as usize == i) {
            offset = *start;
        }
        assert_eq!(record.physical_offset, offset, "record {i}");
        offset += record.total_size;
    }
}

#[test]
fn malformed_runs_are_refused_and_nothing_of_them_is_stored() {
    let (_dir, broker) = start_broker(&["--max-message-bytes", "4096"]);
    let mut client = broker.client();
    create_topic(&mut client, "Strict", 1);
    let good = run(
        "Strict",
        &[Record::plain(b"first"), Record::plain(b"second")],
    );
    let second = u32::from_be_bytes(good[..4].try_into().unwrap()) as usize;
    let refused = |client: &mut TestClient, bytes: &[u8], count: u32, topic: &str| {
        let answer = send_run(client, topic, 0, bytes, count);
        status_of(&answer)
    };
    let mut cases: Vec<(&str, Vec<u8>, u32, wire::Status)> = Vec::new();
    cases.push((
        "truncated",
        good[..good.len() - 3].to_vec(),
        2,
        wire::Status::INVALID_ARGUMENT,
    ));
    let mut lying = good.to_vec();
    lying[second..second + 4].copy_from_slice(&(1u32 << 30).to_be_bytes());
    cases.push((
        "a total size that lies",
        lying,
        2,
        wire::Status::INVALID_ARGUMENT,
    ));
    let mut bad_crc = good.to_vec();
    bad_crc[second + 17] ^= 1;
    cases.push((
        "a bad record CRC",
        bad_crc,
        2,
        wire::Status::INVALID_ARGUMENT,
    ));
    let mut bad_body = good.to_vec();
    bad_body[second + 90] ^= 1;
    cases.push((
        "a bad body CRC",
        bad_body,
        2,
        wire::Status::INVALID_ARGUMENT,
    ));
    let reserved = run(
        "Strict",
        &[Record {
            extra: &[("REAL_TOPIC", "Other")],
            ..Record::plain(b"x")
        }],
    );
    cases.push((
        "a reserved property",
        reserved.to_vec(),
        1,
        wire::Status::INVALID_ARGUMENT,
    ));
    let other_topic = run("Elsewhere", &[Record::plain(b"x")]);
    cases.push((
        "another topic",
        other_topic.to_vec(),
        1,
        wire::Status::INVALID_ARGUMENT,
    ));
    cases.push((
        "a count that lies",
        good.to_vec(),
        3,
        wire::Status::INVALID_ARGUMENT,
    ));
    let big = vec![1u8; 5000];
    let too_large = run("Strict", &[Record::plain(&big)]);
    cases.push((
        "a body over max_message_bytes",
        too_large.to_vec(),
        1,
        wire::Status::MESSAGE_TOO_LARGE,
    ));
    cases.push((
        "an empty run",
        Vec::new(),
        1,
        wire::Status::INVALID_ARGUMENT,
    ));
    for (what, bytes, count, status) in cases {
        let (got, message) = refused(&mut client, &bytes, count, "Strict");
        assert_eq!(got, status, "{what}: {message:?}");
        assert!(
            message.as_deref().is_some_and(|m| !m.is_empty()),
            "{what}: the refusal says why"
        );
    }
    // A system topic is refused as for SendRequest.
    let system = run("SCHEDULE_TOPIC_XXXX", &[Record::plain(b"x")]);
    let (status, _) = refused(&mut client, &system, 1, "SCHEDULE_TOPIC_XXXX");
    assert_eq!(status, wire::Status::NO_PERMISSION);
    // Nothing of any refused run is in the queue; a good one after them is stored at 0.
    let (pulled, _) = pull_queue(&mut client, "Strict", 0);
    assert!(pulled.is_empty(), "{} records stored", pulled.len());
    let answer = send_run(&mut client, "Strict", 0, &good, 2);
    assert_eq!(status_of(&answer).0, wire::Status::OK);
    assert_eq!(
        answer
            .frame()
            .body_as_send_records_response()
            .unwrap()
            .first_queue_offset(),
        0
    );
}

/// Sends `run` as a producer does (the records are the frame's trailing bytes) in pieces with
/// pauses between them, so the broker checks the records that have arrived while the rest are
/// still on the way, and returns the answer.
fn send_run_in_pieces(
    client: &mut TestClient,
    topic: &str,
    run: &[u8],
    count: u32,
) -> VerifiedFrame {
    let request_id = client.take_request_id();
    let mut head = BytesMut::new();
    FrameEncoder::new()
        .encode_head_with_trailing_bytes(&mut head, run.len(), |b, records| {
            let topic = b.create_string(topic);
            let request = wire::SendRecordsRequest::create(
                b,
                &wire::SendRecordsRequestArgs {
                    topic: Some(topic),
                    queue_id: 0,
                    producer_group: None,
                    records: Some(records),
                    count,
                },
            );
            build_frame(
                b,
                &FrameHeader::request(request_id),
                wire::Body::SendRecordsRequest,
                Some(request.as_union_value()),
            )
        })
        .unwrap();
    let mut frame = head.to_vec();
    frame.extend_from_slice(run);
    let cuts = [
        0,
        head.len() + run.len() / 3,
        head.len() + 2 * run.len() / 3,
        frame.len(),
    ];
    for piece in cuts.windows(2) {
        client.send_bytes(&frame[piece[0]..piece[1]]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(40));
    }
    client
        .read_response(request_id)
        .expect("an answer to the run")
}

#[test]
fn a_run_checked_while_it_arrives_is_refused_or_stored_as_a_whole() {
    let (_dir, broker) = start_broker(&["--max-message-bytes", "4096"]);
    let mut client = broker.client();
    create_topic(&mut client, "Pieces", 1);
    let bodies: Vec<Vec<u8>> = (0..6u8).map(|i| vec![b'a' + i; 3000]).collect();
    let records: Vec<Record<'_>> = bodies.iter().map(|b| Record::plain(b)).collect();
    let good = run("Pieces", &records);
    let starts: Vec<usize> = shardmq_tests::split_records(&good)
        .iter()
        .map(|r| r.as_ptr() as usize - good.as_ptr() as usize)
        .collect();
    let mut cases: Vec<(&str, Vec<u8>, u32, wire::Status)> = Vec::new();
    let mut bad_body = good.to_vec();
    bad_body[starts[0] + 200] ^= 1;
    cases.push((
        "a bad body CRC in the first piece",
        bad_body,
        6,
        wire::Status::INVALID_ARGUMENT,
    ));
    let mut bad_late = good.to_vec();
    bad_late[starts[5] + 200] ^= 1;
    cases.push((
        "a bad body CRC in the last piece",
        bad_late,
        6,
        wire::Status::INVALID_ARGUMENT,
    ));
    let mut lying = good.to_vec();
    lying[starts[1]..starts[1] + 4].copy_from_slice(&(1u32 << 30).to_be_bytes());
    cases.push((
        "a total size that lies",
        lying,
        6,
        wire::Status::INVALID_ARGUMENT,
    ));
    cases.push((
        "more records than count",
        good.to_vec(),
        5,
        wire::Status::INVALID_ARGUMENT,
    ));
    cases.push((
        "fewer records than count",
        good.to_vec(),
        7,
        wire::Status::INVALID_ARGUMENT,
    ));
    let big = vec![1u8; 5000];
    let mut with_big = records.clone();
    with_big[4] = Record::plain(&big);
    cases.push((
        "a body over max_message_bytes",
        run("Pieces", &with_big).to_vec(),
        6,
        wire::Status::MESSAGE_TOO_LARGE,
    ));
    let elsewhere = run("Elsewhere", &records[..1]);
    let mut mixed = elsewhere.to_vec();
    mixed.extend_from_slice(&good[starts[1]..]);
    cases.push(("another topic", mixed, 6, wire::Status::INVALID_ARGUMENT));
    for (what, bytes, count, status) in cases {
        let answer = send_run_in_pieces(&mut client, "Pieces", &bytes, count);
        let (got, message) = status_of(&answer);
        assert_eq!(got, status, "{what}: {message:?}");
    }
    let (pulled, _) = pull_queue(&mut client, "Pieces", 0);
    assert!(
        pulled.is_empty(),
        "{} records of refused runs stored",
        pulled.len()
    );
    let answer = send_run_in_pieces(&mut client, "Pieces", &good, 6);
    assert_eq!(status_of(&answer).0, wire::Status::OK);
    let (pulled, _) = pull_queue(&mut client, "Pieces", 0);
    assert_eq!(pulled.len(), 6);
    for (record, body) in pulled.iter().zip(&bodies) {
        assert_eq!(record.body.as_slice(), body.as_slice());
    }
    // The same connection goes on with frames of other kinds after the runs.
    create_topic(&mut client, "After", 1);
}
