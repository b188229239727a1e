//! Hostile and invalid input to the real `shardmq-broker`: garbage bytes, cut and oversized
//! frames, unknown requests, requests before the handshake, invalid names, forbidden topics,
//! oversized messages and out-of-range queues. Each gets its defined error status (or a closed
//! connection where the protocol says so), and afterwards the broker process is still running
//! and serves a fresh connection (a send and a pull of that message).
//!
//! Needs the binaries: `cargo build --workspace --bins` first.
//!
//! Size: one real-process test per kind of bad input, sharing this file's helpers.

use std::path::Path;

use shardmq_codec::decode_message;
use shardmq_schema::{build_frame, wire, FrameHeader, VerifiedFrame, FRAME_LENGTH_PREFIX_BYTES};
use shardmq_tests::{
    pull_request_body, send_request_body, split_records, status_of, upsert_topic_body,
    BrokerProcess, PullParams, RequestBody, TestClient, TestMessage,
};
use tempfile::TempDir;

/// The topic every health check sends to and pulls from.
const HEALTH_TOPIC: &str = "Health";

/// Queues of the topic the tests misuse.
const QUEUES: u32 = 8;

/// A broker over its own temp dir (kept in `_dir`'s guard) with a health topic and an
/// 8-queue topic `Target`.
struct Fixture {
    broker: BrokerProcess,
    _dir: TempDir,
    /// Number of health checks so far, to tell their messages apart.
    health_checks: u32,
}

impl Fixture {
    fn start(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let data_dir = dir.path().join("data");
        let broker = BrokerProcess::start(&data_dir, args);
        let mut client = broker.client();
        for topic in [HEALTH_TOPIC, "Target"] {
            let response = client
                .request(|builder| upsert_topic_body(builder, topic, (QUEUES, QUEUES, 6), true))
                .expect("an answer to UpsertTopicRequest");
            assert_eq!(status_of(&response).0, wire::Status::OK, "create {topic}");
        }
        Self {
            broker,
            _dir: dir,
            health_checks: 0,
        }
    }

    fn client(&self) -> TestClient {
        self.broker.client()
    }

    /// The broker process is alive and a fresh connection can send a message and pull it back.
    fn assert_still_serving(&mut self, after: &str) {
        assert!(
            self.broker.is_running(),
            "the broker process exited after {after}"
        );
        self.health_checks += 1;
        let queue_id = i32::try_from(self.health_checks % QUEUES).unwrap();
        let body = format!("health check {} after {after}", self.health_checks);
        let mut client = self.client();
        let response = client
            .request(|builder| {
                send_request_body(
                    builder,
                    HEALTH_TOPIC,
                    queue_id,
                    &[TestMessage::new(body.clone())],
                )
            })
            .unwrap_or_else(|error| panic!("send after {after}: {error}"));
        assert_eq!(
            status_of(&response),
            (wire::Status::OK, Some(String::new())),
            "send after {after}"
        );
        let queue_offset = response
            .frame()
            .body_as_send_response()
            .expect("a SendResponse")
            .results()
            .expect("results")
            .get(0)
            .queue_offset();
        let response = client
            .request(|builder| {
                pull_request_body(
                    builder,
                    &PullParams::new(HEALTH_TOPIC, queue_id, queue_offset),
                )
            })
            .unwrap_or_else(|error| panic!("pull after {after}: {error}"));
        assert_eq!(
            status_of(&response).0,
            wire::Status::OK,
            "pull after {after}"
        );
        let records = response
            .frame()
            .body_as_pull_response()
            .expect("a PullResponse")
            .records()
            .map(|records| records.bytes().to_vec())
            .unwrap_or_default();
        let records = split_records(&records);
        let view = decode_message(records.first().expect("one record"))
            .unwrap_or_else(|error| panic!("the pulled record after {after} is invalid: {error}"));
        assert_eq!(view.body(), body.as_bytes(), "pulled body after {after}");
    }

    /// (min, max) offsets of a queue of `Target`.
    fn target_offsets(&self, queue_id: i32) -> (i64, i64) {
        let response = self
            .client()
            .request(|builder| {
                let topic = builder.create_string("Target");
                let request = wire::QueueOffsetsRequest::create(
                    builder,
                    &wire::QueueOffsetsRequestArgs {
                        topic: Some(topic),
                        queue_id,
                    },
                );
                (wire::Body::QueueOffsetsRequest, request.as_union_value())
            })
            .expect("an answer to QueueOffsetsRequest");
        assert_eq!(status_of(&response).0, wire::Status::OK);
        let body = response
            .frame()
            .body_as_queue_offsets_response()
            .expect("a QueueOffsetsResponse");
        (body.min_offset(), body.max_offset())
    }
}

/// Asserts `response` has status `expected` and, when `expected` is not OK, a message saying
/// why.
fn assert_refused(response: &VerifiedFrame, expected: wire::Status, what: &str) {
    let (status, message) = status_of(response);
    assert_eq!(
        status, expected,
        "{what}: answered {status:?} ({message:?})"
    );
    assert!(
        message.is_some_and(|text| !text.is_empty()),
        "{what}: the {status:?} answer does not say why"
    );
}

/// Deterministic pseudo-random bytes (xorshift64), so a failure can be replayed.
struct Xorshift(u64);

impl Xorshift {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn bytes(&mut self, count: usize) -> Vec<u8> {
        (0..count)
            .map(|_| self.next_u64().to_le_bytes()[0])
            .collect()
    }

    fn below(&mut self, bound: usize) -> usize {
        usize::try_from(self.next_u64() % u64::try_from(bound).unwrap()).unwrap()
    }
}

fn length_prefixed(body: &[u8]) -> Vec<u8> {
    let mut frame = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    frame
}

/// The closure for [`TestClient::request`] that writes a `SendRequest`.
fn send_body<'a>(
    topic: &'a str,
    queue_id: i32,
    messages: &'a [TestMessage],
) -> impl FnOnce(&mut flatbuffers::FlatBufferBuilder<'static>) -> RequestBody + 'a {
    move |builder| send_request_body(builder, topic, queue_id, messages)
}

// ---------------------------------------------------------------------------------------------
// Framing

#[test]
fn random_bytes_are_answered_malformed_or_closed_and_the_broker_keeps_serving() {
    let mut fixture = Fixture::start(&[]);
    let mut random = Xorshift(0xB40C_E5ED_0000_0001);

    // Raw garbage, then end of stream: only error answers (id 0), then the connection closes.
    for round in 0..8 {
        let mut client = TestClient::connect(fixture.broker.addr()).unwrap();
        let length = 1 + random.below(512);
        let garbage = random.bytes(length);
        client.send_bytes(&garbage).unwrap();
        client.shutdown_write().unwrap();
        let frames = client
            .read_until_closed()
            .unwrap_or_else(|error| panic!("round {round}: not closed after garbage: {error}"));
        for frame in frames {
            assert_eq!(frame.frame().request_id(), 0, "round {round}");
            let status = status_of(&frame).0;
            assert!(
                [wire::Status::MALFORMED_FRAME, wire::Status::FRAME_TOO_LARGE].contains(&status),
                "round {round}: garbage answered {status:?}"
            );
        }
    }
    fixture.assert_still_serving("raw garbage");

    // Garbage under a plausible length prefix, with and without the file identifier: each is a
    // malformed frame answered with id 0, and the same connection goes on working.
    let mut client = fixture.client();
    for round in 0..16 {
        let length = 8 + random.below(256);
        let mut body = random.bytes(length);
        if round % 2 == 0 {
            body[4..8].copy_from_slice(b"SHMQ");
        }
        client.send_bytes(&length_prefixed(&body)).unwrap();
        let response = client.read_frame().expect("an answer to a malformed frame");
        assert_eq!(response.frame().request_id(), 0, "round {round}");
        assert_refused(
            &response,
            wire::Status::MALFORMED_FRAME,
            &format!("round {round}"),
        );
    }
    let response = client
        .request(send_body(
            HEALTH_TOPIC,
            0,
            &[TestMessage::new("same connection")],
        ))
        .expect("a send on the connection that sent garbage frames");
    assert_eq!(status_of(&response).0, wire::Status::OK);
    fixture.assert_still_serving("malformed frames");
}

#[test]
fn truncated_frame_then_close_stores_nothing_and_the_broker_keeps_serving() {
    let mut fixture = Fixture::start(&[]);
    let messages = [TestMessage::new("never whole")];

    // Cut at several places, then end of stream (or a plain close): no answer, nothing stored.
    for (round, keep_bytes) in [1usize, 3, 4, 9, 40].into_iter().enumerate() {
        let mut client = fixture.client();
        let request_id = client.take_request_id();
        let frame = client
            .encode_request(request_id, send_body("Target", 3, &messages))
            .unwrap();
        let keep_bytes = keep_bytes.min(frame.len() - 1);
        client.send_bytes(&frame[..keep_bytes]).unwrap();
        if round % 2 == 0 {
            client.shutdown_write().unwrap();
            assert!(
                client.read_until_closed().expect("closed").is_empty(),
                "a frame cut after {keep_bytes} bytes was answered"
            );
        } else {
            drop(client);
        }
    }
    // Cut one byte short of the end.
    let mut client = fixture.client();
    let request_id = client.take_request_id();
    let frame = client
        .encode_request(request_id, send_body("Target", 3, &messages))
        .unwrap();
    client.send_bytes(&frame[..frame.len() - 1]).unwrap();
    client.shutdown_write().unwrap();
    assert!(client.read_until_closed().expect("closed").is_empty());

    assert_eq!(
        fixture.target_offsets(3),
        (0, 0),
        "a truncated send stored a message"
    );
    fixture.assert_still_serving("truncated frames");
}

#[test]
fn oversized_length_prefix_is_answered_frame_too_large_and_closed() {
    let mut fixture = Fixture::start(&[]);
    let just_over_the_limit = u32::try_from(shardmq_schema::DEFAULT_MAX_FRAME_BYTES + 1).unwrap();
    for handshake_first in [false, true] {
        for length in [u32::MAX, just_over_the_limit] {
            let mut client = TestClient::connect(fixture.broker.addr()).unwrap();
            if handshake_first {
                client.handshake().unwrap();
            }
            let mut bytes = length.to_be_bytes().to_vec();
            bytes.extend_from_slice(&[0xAB; 64]);
            client.send_bytes(&bytes).unwrap();
            let frames = client
                .read_until_closed()
                .expect("the connection closes after the answer");
            assert_eq!(frames.len(), 1, "one answer, then close (prefix {length})");
            assert_eq!(frames[0].frame().request_id(), 0);
            assert_refused(
                &frames[0],
                wire::Status::FRAME_TOO_LARGE,
                &format!("prefix {length}"),
            );
        }
    }
    fixture.assert_still_serving("oversized length prefixes");
}

#[test]
fn zero_length_prefix_is_answered_malformed_and_closed() {
    let mut fixture = Fixture::start(&[]);
    let mut client = fixture.client();
    client.send_bytes(&[0, 0, 0, 0, 1, 2, 3]).unwrap();
    let frames = client.read_until_closed().expect("closed after the answer");
    assert_eq!(frames.len(), 1, "one answer, then close");
    assert_refused(
        &frames[0],
        wire::Status::MALFORMED_FRAME,
        "a zero length prefix",
    );
    fixture.assert_still_serving("a zero length prefix");
}

#[test]
fn flatbuffer_cut_under_a_matching_prefix_is_malformed_and_the_connection_goes_on() {
    let mut fixture = Fixture::start(&[]);
    let mut client = fixture.client();
    let request_id = client.take_request_id();
    let frame = client
        .encode_request(
            request_id,
            send_body("Target", 0, &[TestMessage::new("cut")]),
        )
        .unwrap();
    let cut_body = &frame[FRAME_LENGTH_PREFIX_BYTES..frame.len() - 8];
    client.send_bytes(&length_prefixed(cut_body)).unwrap();
    let response = client.read_frame().expect("an answer");
    assert_eq!(response.frame().request_id(), 0);
    assert_refused(&response, wire::Status::MALFORMED_FRAME, "a cut flatbuffer");
    assert_eq!(
        fixture.target_offsets(0),
        (0, 0),
        "a cut send stored a message"
    );
    let response = client
        .request(send_body("Target", 0, &[TestMessage::new("whole")]))
        .expect("an answer");
    assert_eq!(status_of(&response).0, wire::Status::OK);
    fixture.assert_still_serving("a cut flatbuffer");
}

// ---------------------------------------------------------------------------------------------
// Requests the broker does not serve

#[test]
fn unknown_and_unserved_requests_are_answered_unknown_request() {
    let mut fixture = Fixture::start(&[]);
    let mut client = fixture.client();

    // A body type from a newer peer: a table the verifier skips.
    let response = client
        .request(|builder| {
            let topic = builder.create_string("Target");
            let table = wire::GetRouteRequest::create(
                builder,
                &wire::GetRouteRequestArgs { topic: Some(topic) },
            );
            (wire::Body(200), table.as_union_value())
        })
        .expect("an answer");
    assert_refused(&response, wire::Status::UNKNOWN_REQUEST, "body type 200");

    // Requests of this protocol that a broker does not serve.
    let response = client
        .request(|builder| {
            let topic = builder.create_string("Target");
            let table = wire::GetRouteRequest::create(
                builder,
                &wire::GetRouteRequestArgs { topic: Some(topic) },
            );
            (wire::Body::GetRouteRequest, table.as_union_value())
        })
        .expect("an answer");
    assert_refused(
        &response,
        wire::Status::UNKNOWN_REQUEST,
        "a GetRouteRequest",
    );
    let response = client
        .request(|builder| {
            let table = wire::PullResponse::create(builder, &wire::PullResponseArgs::default());
            (wire::Body::PullResponse, table.as_union_value())
        })
        .expect("an answer");
    assert_refused(
        &response,
        wire::Status::UNKNOWN_REQUEST,
        "a response type as a request",
    );

    // A request without a body: refused, whichever error.
    let request_id = client.take_request_id();
    let frame = client
        .encode_frame(|builder| {
            build_frame(
                builder,
                &FrameHeader::request(request_id),
                wire::Body::NONE,
                None,
            )
        })
        .unwrap();
    client.send_bytes(&frame).unwrap();
    let response = client.read_response(request_id).expect("an answer");
    assert_ne!(
        status_of(&response).0,
        wire::Status::OK,
        "a request without a body"
    );

    // The connection still works.
    let response = client
        .request(send_body(
            HEALTH_TOPIC,
            0,
            &[TestMessage::new("after unknown requests")],
        ))
        .expect("an answer");
    assert_eq!(status_of(&response).0, wire::Status::OK);
    fixture.assert_still_serving("unknown requests");
}

fn topic_list_body(builder: &mut flatbuffers::FlatBufferBuilder<'static>) -> RequestBody {
    let request = wire::TopicListRequest::create(builder, &wire::TopicListRequestArgs::default());
    (wire::Body::TopicListRequest, request.as_union_value())
}

#[test]
fn requests_before_the_handshake_are_answered_handshake_required() {
    let mut fixture = Fixture::start(&[]);
    let mut client = TestClient::connect(fixture.broker.addr()).unwrap();
    let messages = [TestMessage::new("too early")];
    let answers = [
        ("send", client.request(send_body("Target", 1, &messages))),
        (
            "pull",
            client.request(|builder| pull_request_body(builder, &PullParams::new("Target", 1, 0))),
        ),
        (
            "create topic",
            client.request(|builder| upsert_topic_body(builder, "TooEarly", (1, 1, 6), true)),
        ),
        ("topic list", client.request(topic_list_body)),
    ];
    for (what, answer) in answers {
        let response =
            answer.unwrap_or_else(|error| panic!("{what} before the handshake: {error}"));
        assert_refused(&response, wire::Status::HANDSHAKE_REQUIRED, what);
    }

    // After the handshake the same connection serves, and nothing was done before it.
    client
        .handshake()
        .expect("a handshake after refused requests");
    let response = client.request(topic_list_body).expect("topic list");
    assert_eq!(status_of(&response).0, wire::Status::OK);
    let topics: Vec<String> = response
        .frame()
        .body_as_topic_list_response()
        .expect("a TopicListResponse")
        .topics()
        .map(|topics| topics.iter().map(str::to_owned).collect())
        .unwrap_or_default();
    assert_eq!(
        topics,
        [HEALTH_TOPIC, "Target"],
        "a refused request created a topic"
    );
    assert_eq!(
        fixture.target_offsets(1),
        (0, 0),
        "a refused send stored a message"
    );
    fixture.assert_still_serving("requests before the handshake");
}

#[test]
fn handshake_without_a_common_version_is_answered_unsupported_version_then_closed() {
    let mut fixture = Fixture::start(&[]);
    let mut client = TestClient::connect(fixture.broker.addr()).unwrap();
    let response = client.handshake_with_versions(99, 50).expect("an answer");
    assert_refused(
        &response,
        wire::Status::UNSUPPORTED_VERSION,
        "versions 50..=99",
    );
    let answer = response
        .frame()
        .body_as_handshake_response()
        .expect("the refusal carries a HandshakeResponse naming the broker's versions");
    assert_eq!(answer.protocol_version(), 0, "no version was agreed");
    assert!(
        answer.min_protocol_version() >= 1
            && answer.min_protocol_version() <= answer.max_protocol_version()
            && answer.max_protocol_version() < 50,
        "the broker's range {}..={} is stated",
        answer.min_protocol_version(),
        answer.max_protocol_version()
    );
    assert_eq!(
        answer.server().and_then(|s| s.name()),
        Some("shardmq-broker")
    );
    // The connection closes: a send written afterwards is never served.
    let _ = client.send_request(send_body("Target", 0, &[TestMessage::new("unversioned")]));
    let frames = client
        .read_until_closed()
        .expect("the broker closes the connection after refusing the handshake");
    assert!(
        frames.is_empty(),
        "nothing is answered after a refused handshake ({} frames)",
        frames.len()
    );
    assert_eq!(fixture.target_offsets(0), (0, 0));
    fixture.assert_still_serving("an unsupported version");
}

#[test]
fn a_frame_over_64_kib_before_the_handshake_is_frame_too_large_and_closed() {
    let mut fixture = Fixture::start(&[]);
    let mut client = TestClient::connect(fixture.broker.addr()).unwrap();
    // Far under max_frame_bytes (16 MiB) but over the pre-handshake limit.
    let body = vec![0x5A; 256 << 10];
    let _ = client.send_bytes(&length_prefixed(&body));
    let frames = client
        .read_until_closed()
        .expect("the connection closes after the answer");
    assert_eq!(frames.len(), 1, "one answer, then close");
    assert_refused(
        &frames[0],
        wire::Status::FRAME_TOO_LARGE,
        "256 KiB before the handshake",
    );

    // After the handshake the same size is an ordinary frame (here a malformed one).
    let mut client = fixture.client();
    client.send_bytes(&length_prefixed(&body)).unwrap();
    let response = client.read_frame().expect("an answer");
    assert_refused(
        &response,
        wire::Status::MALFORMED_FRAME,
        "256 KiB of garbage after the handshake",
    );
    let response = client.request(topic_list_body).expect("topic list");
    assert_eq!(
        status_of(&response).0,
        wire::Status::OK,
        "the connection goes on"
    );
    fixture.assert_still_serving("a large frame before the handshake");
}

#[test]
fn a_connection_sending_more_than_64_malformed_frames_is_closed() {
    let mut fixture = Fixture::start(&[]);
    let mut client = fixture.client();
    let garbage = length_prefixed(&[0xEE; 32]);
    let mut all = Vec::new();
    for _ in 0..70 {
        all.extend_from_slice(&garbage);
    }
    client.send_bytes(&all).unwrap();
    let frames = client
        .read_until_closed()
        .expect("the broker closes a connection that keeps sending garbage");
    assert_eq!(
        frames.len(),
        65,
        "64 malformed frames are answered, the 65th is answered and the connection closed"
    );
    for frame in &frames {
        assert_refused(frame, wire::Status::MALFORMED_FRAME, "a garbage frame");
    }
    fixture.assert_still_serving("70 malformed frames");
}

#[test]
fn a_connection_without_a_handshake_is_closed_after_the_handshake_timeout() {
    let mut fixture = Fixture::start(&["--handshake-timeout-ms", "300"]);
    let mut silent = TestClient::connect(fixture.broker.addr()).unwrap();
    let frames = silent
        .read_until_closed()
        .expect("a silent connection is closed by the broker within the read timeout");
    assert!(frames.is_empty(), "nothing is said to a silent connection");
    // A connection that shook hands stays open past the timeout. A silent connection opened
    // just after it is the clock: once that one is closed, the first one's timeout has passed.
    let mut client = fixture.client();
    let mut waited = TestClient::connect(fixture.broker.addr()).unwrap();
    let mut clock = TestClient::connect(fixture.broker.addr()).unwrap();
    waited.handshake().expect("a prompt handshake");
    let frames = clock
        .read_until_closed()
        .expect("the clock connection closes");
    assert!(frames.is_empty());
    let response = waited
        .request(topic_list_body)
        .expect("a handshaken connection outlives the handshake timeout");
    assert_eq!(status_of(&response).0, wire::Status::OK);
    let response = client.request(topic_list_body).expect("topic list");
    assert_eq!(status_of(&response).0, wire::Status::OK);
    fixture.assert_still_serving("a connection that never shook hands");
}

// ---------------------------------------------------------------------------------------------
// Names, topics and permissions

/// Topic names RocketMQ's rule refuses: a path separator, a parent directory, one byte over
/// the 127-byte limit, empty, a space, a path escape.
fn invalid_topic_names() -> Vec<String> {
    vec![
        "a/b".to_owned(),
        "..".to_owned(),
        "x".repeat(128),
        String::new(),
        "sp ace".to_owned(),
        "../escape".to_owned(),
        "tab\there".to_owned(),
    ]
}

/// Every file and directory name under `root`, recursively.
fn names_under(root: &Path) -> Vec<String> {
    let mut names = Vec::new();
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable dir") {
            let entry = entry.expect("a dir entry");
            names.push(entry.file_name().to_string_lossy().into_owned());
            if entry.file_type().expect("a file type").is_dir() {
                pending.push(entry.path());
            }
        }
    }
    names
}

#[test]
fn invalid_topic_names_are_refused_by_every_request() {
    let mut fixture = Fixture::start(&[]);
    let mut client = fixture.client();
    for name in invalid_topic_names() {
        let shown = format!("{:?}", if name.len() > 20 { &name[..20] } else { &name });
        let response = client
            .request(|builder| upsert_topic_body(builder, &name, (1, 1, 6), true))
            .expect("an answer");
        assert_refused(
            &response,
            wire::Status::INVALID_ARGUMENT,
            &format!("create topic {shown}"),
        );
        let response = client
            .request(send_body(&name, 0, &[TestMessage::new("x")]))
            .expect("an answer");
        assert_refused(
            &response,
            wire::Status::INVALID_ARGUMENT,
            &format!("send to {shown}"),
        );
        let response = client
            .request(|builder| pull_request_body(builder, &PullParams::new(&name, 0, 0)))
            .expect("an answer");
        assert_refused(
            &response,
            wire::Status::INVALID_ARGUMENT,
            &format!("pull from {shown}"),
        );
    }
    // The longest valid name is accepted.
    let longest = "y".repeat(127);
    let response = client
        .request(|builder| upsert_topic_body(builder, &longest, (1, 1, 6), true))
        .expect("an answer");
    assert_eq!(
        status_of(&response).0,
        wire::Status::OK,
        "a 127-byte topic name"
    );

    // Nothing named after a refused topic was created, inside the data dir or next to it.
    let data_dir = fixture.broker.data_dir().to_owned();
    let parent_entries = names_under(data_dir.parent().unwrap());
    for forbidden in ["a", "b", "escape", "sp ace"] {
        assert!(
            !parent_entries.iter().any(|entry| entry == forbidden),
            "a refused topic name left {forbidden:?} on disk: {parent_entries:?}"
        );
    }
    fixture.assert_still_serving("invalid topic names");
}

#[test]
fn sends_to_missing_system_or_read_only_topics_are_refused() {
    let mut fixture = Fixture::start(&[]);
    let mut client = fixture.client();
    let message = [TestMessage::new("misdirected")];

    let response = client
        .request(send_body("NoSuchTopic", 0, &message))
        .expect("an answer");
    assert_refused(
        &response,
        wire::Status::TOPIC_NOT_FOUND,
        "send to a missing topic",
    );
    let response = client
        .request(|builder| pull_request_body(builder, &PullParams::new("NoSuchTopic", 0, 0)))
        .expect("an answer");
    assert_refused(
        &response,
        wire::Status::TOPIC_NOT_FOUND,
        "pull from a missing topic",
    );

    for system_topic in [
        "%DLQ%g",
        "%RETRY%g",
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
    ] {
        let response = client
            .request(send_body(system_topic, -1, &message))
            .expect("an answer");
        assert_refused(
            &response,
            wire::Status::NO_PERMISSION,
            &format!("send to {system_topic}"),
        );
        let response = client
            .request(|builder| upsert_topic_body(builder, system_topic, (1, 1, 6), false))
            .expect("an answer");
        assert_refused(
            &response,
            wire::Status::INVALID_ARGUMENT,
            &format!("create {system_topic}"),
        );
    }

    // Permissions: read-only refuses sends, write-only refuses pulls.
    for (topic, perm) in [("ReadOnly", 4), ("WriteOnly", 2)] {
        let response = client
            .request(|builder| upsert_topic_body(builder, topic, (1, 1, perm), true))
            .expect("an answer");
        assert_eq!(status_of(&response).0, wire::Status::OK, "create {topic}");
    }
    let response = client
        .request(send_body("ReadOnly", 0, &message))
        .expect("an answer");
    assert_refused(
        &response,
        wire::Status::NO_PERMISSION,
        "send to a read-only topic",
    );
    let response = client
        .request(|builder| pull_request_body(builder, &PullParams::new("WriteOnly", 0, 0)))
        .expect("an answer");
    assert_refused(
        &response,
        wire::Status::NO_PERMISSION,
        "pull from a write-only topic",
    );

    // Creating an existing topic with create_only.
    let response = client
        .request(|builder| upsert_topic_body(builder, "Target", (1, 1, 6), true))
        .expect("an answer");
    assert_refused(
        &response,
        wire::Status::TOPIC_ALREADY_EXISTS,
        "create Target again",
    );
    fixture.assert_still_serving("misdirected sends");
}

// ---------------------------------------------------------------------------------------------
// Messages and queues

#[test]
fn message_over_max_message_bytes_is_refused_and_its_batch_stores_nothing() {
    const LIMIT: usize = 1024;
    let mut fixture = Fixture::start(&["--max-message-bytes", &LIMIT.to_string()]);
    let mut client = TestClient::connect(fixture.broker.addr()).unwrap();
    let handshake = client.handshake().expect("handshake");
    let announced = handshake
        .frame()
        .body_as_handshake_response()
        .expect("a HandshakeResponse")
        .max_message_bytes();
    assert_eq!(
        announced as usize, LIMIT,
        "the handshake announces max_message_bytes"
    );

    let too_large = TestMessage::new(vec![7u8; LIMIT + 1]);
    let response = client
        .request(send_body("Target", 2, std::slice::from_ref(&too_large)))
        .expect("an answer");
    assert_refused(
        &response,
        wire::Status::MESSAGE_TOO_LARGE,
        "a 1025-byte body",
    );
    let batch = [TestMessage::new("fine"), too_large];
    let response = client
        .request(send_body("Target", 2, &batch))
        .expect("an answer");
    assert_refused(
        &response,
        wire::Status::MESSAGE_TOO_LARGE,
        "a batch with a 1025-byte body",
    );
    assert_eq!(
        fixture.target_offsets(2),
        (0, 0),
        "a refused batch stored some of its messages"
    );

    let at_limit = [TestMessage::new(vec![7u8; LIMIT])];
    let response = client
        .request(send_body("Target", 2, &at_limit))
        .expect("an answer");
    assert_eq!(
        status_of(&response).0,
        wire::Status::OK,
        "a body of exactly the limit"
    );
    fixture.assert_still_serving("oversized messages");
}

#[test]
fn message_over_the_default_four_mib_is_message_too_large() {
    let mut fixture = Fixture::start(&[]);
    let mut client = fixture.client();
    let too_large = [TestMessage::new(vec![1u8; (4 << 20) + 1])];
    let response = client
        .request(send_body("Target", 0, &too_large))
        .expect("an answer");
    assert_refused(
        &response,
        wire::Status::MESSAGE_TOO_LARGE,
        "a 4 MiB + 1 byte body",
    );
    assert_eq!(fixture.target_offsets(0), (0, 0));
    fixture.assert_still_serving("a 4 MiB + 1 byte body");
}

#[test]
fn queue_ids_and_offsets_out_of_range_are_refused() {
    let mut fixture = Fixture::start(&[]);
    let mut client = fixture.client();
    let message = [TestMessage::new("nowhere")];
    let queues = i32::try_from(QUEUES).unwrap();
    for queue_id in [queues, queues + 1, -2, i32::MIN, i32::MAX] {
        let response = client
            .request(send_body("Target", queue_id, &message))
            .expect("an answer");
        assert_refused(
            &response,
            wire::Status::INVALID_ARGUMENT,
            &format!("send to queue {queue_id}"),
        );
        let response = client
            .request(|builder| pull_request_body(builder, &PullParams::new("Target", queue_id, 0)))
            .expect("an answer");
        assert_refused(
            &response,
            wire::Status::INVALID_ARGUMENT,
            &format!("pull queue {queue_id}"),
        );
    }
    let response = client
        .request(|builder| {
            let topic = builder.create_string("Target");
            let request = wire::QueueOffsetsRequest::create(
                builder,
                &wire::QueueOffsetsRequestArgs {
                    topic: Some(topic),
                    queue_id: queues,
                },
            );
            (wire::Body::QueueOffsetsRequest, request.as_union_value())
        })
        .expect("an answer");
    assert_refused(
        &response,
        wire::Status::INVALID_ARGUMENT,
        "offsets of queue 8",
    );
    let response = client
        .request(|builder| {
            let group = builder.create_string("G");
            let topic = builder.create_string("Target");
            let request = wire::CommitConsumerOffsetRequest::create(
                builder,
                &wire::CommitConsumerOffsetRequestArgs {
                    consumer_group: Some(group),
                    topic: Some(topic),
                    queue_id: queues,
                    offset: 1,
                },
            );
            (
                wire::Body::CommitConsumerOffsetRequest,
                request.as_union_value(),
            )
        })
        .expect("an answer");
    assert_refused(
        &response,
        wire::Status::INVALID_ARGUMENT,
        "commit to queue 8",
    );

    // Offsets: negative is invalid; past the end moves the consumer back to the end.
    let response = client
        .request(send_body("Target", 4, &message))
        .expect("an answer");
    assert_eq!(status_of(&response).0, wire::Status::OK);
    let response = client
        .request(|builder| pull_request_body(builder, &PullParams::new("Target", 4, -1)))
        .expect("an answer");
    assert_refused(
        &response,
        wire::Status::INVALID_ARGUMENT,
        "pull at offset -1",
    );
    let response = client
        .request(|builder| pull_request_body(builder, &PullParams::new("Target", 4, 1_000)))
        .expect("an answer");
    assert_eq!(
        status_of(&response).0,
        wire::Status::PULL_OFFSET_MOVED,
        "pull past the end"
    );
    let moved = response
        .frame()
        .body_as_pull_response()
        .expect("a PullResponse");
    assert_eq!(
        (moved.next_begin_offset(), moved.max_offset()),
        (1, 1),
        "PULL_OFFSET_MOVED points at the queue's end"
    );
    fixture.assert_still_serving("out-of-range queues");
}

#[test]
fn invalid_messages_and_names_in_a_send_or_pull_are_refused() {
    let mut fixture = Fixture::start(&[]);
    let mut client = fixture.client();
    let cases: Vec<(&str, Vec<TestMessage>, wire::Status)> = vec![
        ("no messages", vec![], wire::Status::INVALID_ARGUMENT),
        (
            "a key with a space",
            vec![TestMessage::new("k").keys(&["two words"])],
            wire::Status::INVALID_ARGUMENT,
        ),
        (
            "an empty key",
            vec![TestMessage::new("k").keys(&[""])],
            wire::Status::INVALID_ARGUMENT,
        ),
        (
            "a reserved property",
            vec![TestMessage::new("p").property("TAGS", "sneaky")],
            wire::Status::INVALID_ARGUMENT,
        ),
        (
            "a property with a separator",
            vec![TestMessage::new("p").property("name\u{1}x", "value\u{2}y")],
            wire::Status::INVALID_ARGUMENT,
        ),
    ];
    let too_many: Vec<TestMessage> = (0..1025)
        .map(|i| TestMessage::new(format!("{i}")))
        .collect();
    let mut cases = cases;
    cases.push((
        "a batch of 1025 messages, over max_batch_messages (1024)",
        too_many,
        wire::Status::INVALID_ARGUMENT,
    ));
    for (what, messages, expected) in &cases {
        let response = client
            .request(send_body("Target", 5, messages))
            .expect("an answer");
        assert_refused(&response, *expected, what);
    }
    assert_eq!(
        fixture.target_offsets(5),
        (0, 0),
        "a refused send stored a message"
    );

    // A delay level the broker does not have, a delivery time beyond the timer horizon (3 days)
    // and two ways of delaying at once are refused, never stored or delivered early.
    for (what, delay_level, deliver_at_ms) in [
        ("delay level 19 of 18", 19, 0),
        ("a negative delay level", -1, 0),
        ("a delivery time in 2100", 0, 4_102_444_800_000),
        ("a delay level and a delivery time", 3, 4_102_444_800_000),
    ] {
        let response = client
            .request(|builder| {
                let body = builder.create_vector(b"later");
                let message = wire::Message::create(
                    builder,
                    &wire::MessageArgs {
                        body: Some(body),
                        delay_level,
                        deliver_at_ms,
                        ..Default::default()
                    },
                );
                let messages = builder.create_vector(&[message]);
                let topic = builder.create_string("Target");
                let request = wire::SendRequest::create(
                    builder,
                    &wire::SendRequestArgs {
                        topic: Some(topic),
                        queue_id: 5,
                        producer_group: None,
                        messages: Some(messages),
                    },
                );
                (wire::Body::SendRequest, request.as_union_value())
            })
            .expect("an answer");
        assert_refused(&response, wire::Status::INVALID_ARGUMENT, what);
    }
    assert_eq!(
        fixture.target_offsets(5),
        (0, 0),
        "a refused send stored a message"
    );

    let mut params = PullParams::new("Target", 5, 0);
    params.tag_expression = Some("TagA\u{1}".to_owned());
    let response = client
        .request(|builder| pull_request_body(builder, &params))
        .expect("an answer");
    assert_refused(
        &response,
        wire::Status::INVALID_TAG_EXPRESSION,
        "a control character in a tag expression",
    );
    let mut params = PullParams::new("Target", 5, 0);
    params.consumer_group = Some("bad group".to_owned());
    let response = client
        .request(|builder| pull_request_body(builder, &params))
        .expect("an answer");
    assert_refused(
        &response,
        wire::Status::INVALID_ARGUMENT,
        "a group name with a space",
    );
    fixture.assert_still_serving("invalid messages");
}

// ---------------------------------------------------------------------------------------------
// Topic configs, queries, groups

#[test]
fn invalid_topic_configs_are_refused_and_change_nothing() {
    let mut fixture = Fixture::start(&[]);
    let mut client = fixture.client();
    for (what, queues_and_perm) in [
        ("zero read queues", (0, 1, 6)),
        ("zero write queues", (1, 0, 6)),
        ("1025 queues", (1025, 1025, 6)),
        ("perm bit 8", (1, 1, 8)),
        ("perm 255", (1, 1, 255)),
    ] {
        let response = client
            .request(|builder| upsert_topic_body(builder, "Target", queues_and_perm, false))
            .expect("an answer");
        assert_refused(&response, wire::Status::INVALID_ARGUMENT, what);
    }
    // Target still has its 8 queues.
    let response = client
        .request(send_body("Target", 7, &[TestMessage::new("queue 7")]))
        .expect("an answer");
    assert_eq!(
        status_of(&response).0,
        wire::Status::OK,
        "a refused update changed Target"
    );
    fixture.assert_still_serving("invalid topic configs");
}

fn query_by_offset_id_body(
    builder: &mut flatbuffers::FlatBufferBuilder<'static>,
    offset_msg_id: &str,
) -> RequestBody {
    let offset_msg_id = builder.create_string(offset_msg_id);
    let request = wire::QueryByIdRequest::create(
        builder,
        &wire::QueryByIdRequestArgs {
            unique_id: None,
            offset_msg_id: Some(offset_msg_id),
            begin_ms: 0,
            end_ms: 0,
        },
    );
    (wire::Body::QueryByIdRequest, request.as_union_value())
}

#[test]
fn queries_naming_no_record_are_query_not_found_or_invalid() {
    let mut fixture = Fixture::start(&[]);
    let mut client = fixture.client();
    let response = client
        .request(send_body(
            "Target",
            0,
            &[TestMessage::new("the only message")],
        ))
        .expect("an answer");
    assert_eq!(status_of(&response).0, wire::Status::OK);
    let offset_id = response
        .frame()
        .body_as_send_response()
        .expect("a SendResponse")
        .results()
        .expect("results")
        .get(0)
        .offset_msg_id()
        .expect("an offset id")
        .to_owned();
    let response = client
        .request(|builder| query_by_offset_id_body(builder, &offset_id))
        .expect("an answer");
    assert_eq!(
        status_of(&response).0,
        wire::Status::OK,
        "the real offset id"
    );

    // The same host with other offsets: inside the record, past the end, another shard.
    let host = &offset_id[..16];
    let physical = u64::from_str_radix(&offset_id[16..], 16).unwrap();
    let not_found = [
        format!("{host}{:016X}", physical + 1),
        format!("{host}{:016X}", physical + 4),
        format!("{host}{:016X}", physical + 1_000_000),
        format!("{host}{:016X}", (1u64 << 56) - 1),
        format!("{host}{:016X}", (5u64 << 56) | physical),
    ];
    for id in &not_found {
        let response = client
            .request(|builder| query_by_offset_id_body(builder, id))
            .expect("an answer");
        assert_refused(
            &response,
            wire::Status::QUERY_NOT_FOUND,
            &format!("offset id {id}"),
        );
    }
    for id in ["", "XYZ", "0123", &"G".repeat(32)] {
        let response = client
            .request(|builder| query_by_offset_id_body(builder, id))
            .expect("an answer");
        assert_refused(
            &response,
            wire::Status::INVALID_ARGUMENT,
            &format!("offset id {id:?}"),
        );
    }
    fixture.assert_still_serving("queries for missing records");
}

#[test]
fn invalid_group_names_and_offsets_are_refused() {
    let mut fixture = Fixture::start(&[]);
    let mut client = fixture.client();
    let long_group = "g".repeat(256);
    for group in ["", "bad group", "a/b", long_group.as_str()] {
        let response = client
            .request(|builder| {
                let group = builder.create_string(group);
                let request = wire::ConsumerListRequest::create(
                    builder,
                    &wire::ConsumerListRequestArgs {
                        consumer_group: Some(group),
                    },
                );
                (wire::Body::ConsumerListRequest, request.as_union_value())
            })
            .expect("an answer");
        assert_refused(
            &response,
            wire::Status::INVALID_ARGUMENT,
            &format!("consumer list of {group:?}"),
        );
        let response = client
            .request(|builder| {
                let group = builder.create_string(group);
                let info = wire::ConsumerGroupInfo::create(
                    builder,
                    &wire::ConsumerGroupInfoArgs {
                        group: Some(group),
                        ..Default::default()
                    },
                );
                let groups = builder.create_vector(&[info]);
                let client_id = builder.create_string("bad-heartbeat");
                let request = wire::HeartbeatRequest::create(
                    builder,
                    &wire::HeartbeatRequestArgs {
                        client_id: Some(client_id),
                        producer_groups: None,
                        consumer_groups: Some(groups),
                    },
                );
                (wire::Body::HeartbeatRequest, request.as_union_value())
            })
            .expect("an answer");
        assert_refused(
            &response,
            wire::Status::INVALID_ARGUMENT,
            &format!("heartbeat for group {group:?}"),
        );
    }
    let response = client
        .request(|builder| {
            let group = builder.create_string("G");
            let topic = builder.create_string("Target");
            let request = wire::CommitConsumerOffsetRequest::create(
                builder,
                &wire::CommitConsumerOffsetRequestArgs {
                    consumer_group: Some(group),
                    topic: Some(topic),
                    queue_id: 0,
                    offset: -1,
                },
            );
            (
                wire::Body::CommitConsumerOffsetRequest,
                request.as_union_value(),
            )
        })
        .expect("an answer");
    assert_refused(
        &response,
        wire::Status::INVALID_ARGUMENT,
        "a negative committed offset",
    );
    fixture.assert_still_serving("invalid groups");
}
