//! The real `shardmq-namesrv` process over loopback: registration and routes, unregistration,
//! expiry of silent brokers, hostile input, pipelining and graceful shutdown. Each test starts
//! its own namesrv on a free port, so tests run in parallel without sharing state.
//!
//! Needs the binary: `cargo build --workspace --bins` (or `-p shardmq-namesrv`) first.
//!
//! Size: one real-process test per name-server behaviour, sharing this file's helpers.

use std::time::{Duration, Instant};

use shardmq_schema::wire;
use shardmq_schema::{build_frame, FrameHeader, VerifiedFrame, FRAME_LENGTH_PREFIX_BYTES};
use shardmq_tests::{status_of, wait_until, ClientError, NamesrvProcess, TestClient};

// ---------------------------------------------------------------------------------------------
// Request builders and response readers

struct Broker<'a> {
    cluster_name: &'a str,
    broker_name: &'a str,
    broker_id: i64,
    address: &'a str,
    /// (name, read queues, write queues, perm)
    topics: &'a [(&'a str, u32, u32, u32)],
}

impl<'a> Broker<'a> {
    fn master(
        broker_name: &'a str,
        address: &'a str,
        topics: &'a [(&'a str, u32, u32, u32)],
    ) -> Self {
        Self {
            cluster_name: "DefaultCluster",
            broker_name,
            broker_id: 0,
            address,
            topics,
        }
    }
}

fn register(client: &mut TestClient, broker: &Broker<'_>) -> VerifiedFrame {
    client
        .request(|builder| {
            let topics: Vec<_> = broker
                .topics
                .iter()
                .map(|&(name, read_queues, write_queues, perm)| {
                    let name = builder.create_string(name);
                    wire::TopicConfig::create(
                        builder,
                        &wire::TopicConfigArgs {
                            name: Some(name),
                            read_queues,
                            write_queues,
                            perm,
                            is_ordered: false,
                        },
                    )
                })
                .collect();
            let topics = builder.create_vector(&topics);
            let cluster_name = builder.create_string(broker.cluster_name);
            let broker_name = builder.create_string(broker.broker_name);
            let broker_address = builder.create_string(broker.address);
            let request = wire::RegisterBrokerRequest::create(
                builder,
                &wire::RegisterBrokerRequestArgs {
                    cluster_name: Some(cluster_name),
                    broker_name: Some(broker_name),
                    broker_id: broker.broker_id,
                    broker_address: Some(broker_address),
                    ha_server_address: None,
                    topics: Some(topics),
                    topic_config_version: 1,
                    state_version: 0,
                },
            );
            (wire::Body::RegisterBrokerRequest, request.as_union_value())
        })
        .expect("register broker")
}

fn register_ok(client: &mut TestClient, broker: &Broker<'_>) {
    let response = register(client, broker);
    assert_eq!(status_of(&response), (wire::Status::OK, None));
    assert!(response
        .frame()
        .body_as_register_broker_response()
        .is_some());
}

fn unregister(client: &mut TestClient, broker: &Broker<'_>) -> VerifiedFrame {
    client
        .request(|builder| {
            let cluster_name = builder.create_string(broker.cluster_name);
            let broker_name = builder.create_string(broker.broker_name);
            let broker_address = builder.create_string(broker.address);
            let request = wire::UnregisterBrokerRequest::create(
                builder,
                &wire::UnregisterBrokerRequestArgs {
                    cluster_name: Some(cluster_name),
                    broker_name: Some(broker_name),
                    broker_id: broker.broker_id,
                    broker_address: Some(broker_address),
                },
            );
            (
                wire::Body::UnregisterBrokerRequest,
                request.as_union_value(),
            )
        })
        .expect("unregister broker")
}

fn get_route(client: &mut TestClient, topic: &str) -> VerifiedFrame {
    client
        .request(|builder| {
            let topic = builder.create_string(topic);
            let request = wire::GetRouteRequest::create(
                builder,
                &wire::GetRouteRequestArgs { topic: Some(topic) },
            );
            (wire::Body::GetRouteRequest, request.as_union_value())
        })
        .expect("get route")
}

fn topic_list_request(
    builder: &mut flatbuffers::FlatBufferBuilder<'static>,
    cluster_name: Option<&str>,
) -> (
    wire::Body,
    flatbuffers::WIPOffset<flatbuffers::UnionWIPOffset>,
) {
    let cluster_name = cluster_name.map(|name| builder.create_string(name));
    let request =
        wire::TopicListRequest::create(builder, &wire::TopicListRequestArgs { cluster_name });
    (wire::Body::TopicListRequest, request.as_union_value())
}

fn topic_list(client: &mut TestClient, cluster_name: Option<&str>) -> Vec<String> {
    let response = client
        .request(|builder| topic_list_request(builder, cluster_name))
        .expect("topic list");
    assert_eq!(status_of(&response).0, wire::Status::OK);
    let list = response
        .frame()
        .body_as_topic_list_response()
        .expect("TopicListResponse");
    list.topics()
        .map(|topics| topics.iter().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// One broker name of a route: (cluster, broker name, [(broker id, address)]).
type RouteBroker = (String, String, Vec<(i64, String)>);

/// One broker name's queues of a route: (broker name, read queues, write queues, perm).
type RouteQueues = (String, u32, u32, u32);

/// A route as plain values, for comparing whole.
#[derive(Debug, PartialEq, Eq)]
struct Route {
    brokers: Vec<RouteBroker>,
    queues: Vec<RouteQueues>,
}

/// The route of `topic`, `None` on TOPIC_NOT_FOUND.
fn route_of(client: &mut TestClient, topic: &str) -> Option<Route> {
    let response = get_route(client, topic);
    let (status, message) = status_of(&response);
    if status == wire::Status::TOPIC_NOT_FOUND {
        assert!(response.frame().body_as_route_response().is_none());
        return None;
    }
    assert_eq!(status, wire::Status::OK, "{message:?}");
    let route = response
        .frame()
        .body_as_route_response()
        .expect("RouteResponse");
    assert_eq!(route.topic(), Some(topic));
    let brokers = route
        .brokers()
        .expect("brokers")
        .iter()
        .map(|broker| {
            let addresses = broker
                .addresses()
                .expect("addresses")
                .iter()
                .map(|address| {
                    (
                        address.broker_id(),
                        address.address().unwrap_or_default().to_owned(),
                    )
                })
                .collect();
            (
                broker.cluster_name().unwrap_or_default().to_owned(),
                broker.broker_name().unwrap_or_default().to_owned(),
                addresses,
            )
        })
        .collect();
    let queues = route
        .queues()
        .expect("queues")
        .iter()
        .map(|queues| {
            (
                queues.broker_name().unwrap_or_default().to_owned(),
                queues.read_queues(),
                queues.write_queues(),
                queues.perm(),
            )
        })
        .collect();
    Some(Route { brokers, queues })
}

fn owned(text: &str) -> String {
    text.to_owned()
}

/// Asserts the namesrv still serves a fresh connection: handshake and a route look-up.
fn assert_still_serving(namesrv: &NamesrvProcess) {
    let mut client = namesrv.client();
    let response = get_route(&mut client, "AnyTopic");
    assert_eq!(status_of(&response).0, wire::Status::TOPIC_NOT_FOUND);
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

// ---------------------------------------------------------------------------------------------
// Routes

#[test]
fn route_appears_after_registration() {
    let namesrv = NamesrvProcess::start();
    let mut client = namesrv.client();
    assert_eq!(route_of(&mut client, "Orders"), None, "no broker yet");

    let topics = [("Orders", 8, 4, 6), ("Audit", 2, 2, 4)];
    register_ok(
        &mut client,
        &Broker::master("broker-a", "127.0.0.1:10911", &topics),
    );

    let route = route_of(&mut client, "Orders").expect("route after registration");
    assert_eq!(
        route,
        Route {
            brokers: vec![(
                owned("DefaultCluster"),
                owned("broker-a"),
                vec![(0, owned("127.0.0.1:10911"))]
            )],
            queues: vec![(owned("broker-a"), 8, 4, 6)],
        }
    );
    assert_eq!(
        route_of(&mut client, "Audit").unwrap().queues,
        [(owned("broker-a"), 2, 2, 4)]
    );
    assert_eq!(route_of(&mut client, "Payments"), None);
    assert_eq!(topic_list(&mut client, None), ["Audit", "Orders"]);
    assert_eq!(
        topic_list(&mut client, Some("DefaultCluster")),
        ["Audit", "Orders"]
    );
    assert!(topic_list(&mut client, Some("OtherCluster")).is_empty());

    // Another client sees the same table.
    let mut other = namesrv.client();
    assert!(route_of(&mut other, "Orders").is_some());
}

#[test]
fn re_registration_replaces_topics() {
    let namesrv = NamesrvProcess::start();
    let mut client = namesrv.client();
    register_ok(
        &mut client,
        &Broker::master(
            "broker-a",
            "127.0.0.1:10911",
            &[("Orders", 8, 8, 6), ("Old", 1, 1, 6)],
        ),
    );
    register_ok(
        &mut client,
        &Broker::master(
            "broker-a",
            "127.0.0.1:10911",
            &[("Orders", 16, 16, 6), ("New", 1, 1, 6)],
        ),
    );
    assert_eq!(
        route_of(&mut client, "Orders").unwrap().queues,
        [(owned("broker-a"), 16, 16, 6)]
    );
    assert_eq!(route_of(&mut client, "Old"), None);
    assert_eq!(topic_list(&mut client, None), ["New", "Orders"]);
}

#[test]
fn brokers_of_one_topic_merge_in_its_route() {
    let namesrv = NamesrvProcess::start();
    let mut client = namesrv.client();
    register_ok(
        &mut client,
        &Broker::master("broker-b", "127.0.0.1:20911", &[("Orders", 4, 4, 6)]),
    );
    register_ok(
        &mut client,
        &Broker::master(
            "broker-a",
            "127.0.0.1:10911",
            &[("Orders", 8, 8, 6), ("Solo", 1, 1, 6)],
        ),
    );
    let slave = Broker {
        broker_id: 1,
        address: "127.0.0.1:10921",
        ..Broker::master("broker-a", "", &[("Orders", 8, 8, 6)])
    };
    let response = register(&mut client, &slave);
    let registered = response
        .frame()
        .body_as_register_broker_response()
        .expect("response body");
    assert_eq!(
        registered.master_address(),
        Some("127.0.0.1:10911"),
        "a slave learns its master"
    );

    let route = route_of(&mut client, "Orders").expect("route");
    assert_eq!(
        route.brokers,
        [
            (
                owned("DefaultCluster"),
                owned("broker-a"),
                vec![(0, owned("127.0.0.1:10911")), (1, owned("127.0.0.1:10921"))]
            ),
            (
                owned("DefaultCluster"),
                owned("broker-b"),
                vec![(0, owned("127.0.0.1:20911"))]
            ),
        ]
    );
    assert_eq!(
        route.queues,
        [(owned("broker-a"), 8, 8, 6), (owned("broker-b"), 4, 4, 6)]
    );
    let solo = route_of(&mut client, "Solo").expect("route");
    assert_eq!(solo.brokers.len(), 1, "broker-b does not host Solo");
}

#[test]
fn unregister_removes_the_broker() {
    let namesrv = NamesrvProcess::start();
    let mut client = namesrv.client();
    let broker_a = Broker::master("broker-a", "127.0.0.1:10911", &[("Orders", 8, 8, 6)]);
    let broker_b = Broker::master("broker-b", "127.0.0.1:20911", &[("Orders", 4, 4, 6)]);
    register_ok(&mut client, &broker_a);
    register_ok(&mut client, &broker_b);

    assert_eq!(
        status_of(&unregister(&mut client, &broker_a)).0,
        wire::Status::OK
    );
    let route = route_of(&mut client, "Orders").expect("broker-b still hosts it");
    assert_eq!(route.queues, [(owned("broker-b"), 4, 4, 6)]);

    assert_eq!(
        status_of(&unregister(&mut client, &broker_b)).0,
        wire::Status::OK
    );
    assert_eq!(route_of(&mut client, "Orders"), None);
    assert!(topic_list(&mut client, None).is_empty());
    // Unregistering an unknown broker is not an error.
    assert_eq!(
        status_of(&unregister(&mut client, &broker_b)).0,
        wire::Status::OK
    );
}

#[test]
fn silent_broker_expires() {
    let broker_timeout = Duration::from_millis(1000);
    let namesrv = NamesrvProcess::start_with_args(&[
        "--broker-timeout-ms",
        "1000",
        "--scan-interval-ms",
        "50",
    ]);
    let mut client = namesrv.client();
    let silent = Broker::master("broker-a", "127.0.0.1:10911", &[("Orders", 8, 8, 6)]);
    let alive = Broker::master("broker-b", "127.0.0.1:20911", &[("Orders", 4, 4, 6)]);
    let registered_at = Instant::now();
    register_ok(&mut client, &silent);
    register_ok(&mut client, &alive);
    assert_eq!(route_of(&mut client, "Orders").unwrap().brokers.len(), 2);

    // broker-b keeps registering (a heartbeat every 100 ms, well inside the timeout);
    // broker-a says nothing more.
    let route = wait_until(Duration::from_secs(20), "broker-a to expire", || {
        register_ok(&mut client, &alive);
        let route = route_of(&mut client, "Orders").expect("broker-b keeps the topic alive");
        if route.brokers.len() == 1 {
            Some(route)
        } else {
            std::thread::sleep(Duration::from_millis(80));
            None
        }
    });
    assert!(
        registered_at.elapsed() >= broker_timeout,
        "expired after {:?}, before the broker timeout",
        registered_at.elapsed()
    );
    assert_eq!(route.brokers[0].1, "broker-b");
    wait_until(Duration::from_secs(5), "the expiry log line", || {
        namesrv
            .log_lines()
            .iter()
            .any(|line| line.contains("broker-a") && line.contains("expired"))
            .then_some(())
    });

    // Once broker-b goes silent too, the topic has no route.
    wait_until(Duration::from_secs(20), "broker-b to expire", || {
        route_of(&mut client, "Orders").is_none().then_some(())
    });
}

// ---------------------------------------------------------------------------------------------
// Protocol rules and hostile input

#[test]
fn handshake_announces_the_namesrv() {
    let namesrv = NamesrvProcess::start();
    let mut client = TestClient::connect(namesrv.addr()).unwrap();
    let response = client.handshake().expect("handshake");
    let handshake = response
        .frame()
        .body_as_handshake_response()
        .expect("HandshakeResponse");
    assert_eq!(
        handshake.protocol_version(),
        shardmq_schema::PROTOCOL_VERSION
    );
    let server = handshake.server().expect("server info");
    assert_eq!(server.name(), Some("shardmq-namesrv"));
    assert_eq!(server.broker_id(), -1);
    assert_eq!(
        handshake.max_frame_bytes() as usize,
        shardmq_schema::DEFAULT_MAX_FRAME_BYTES
    );
}

#[test]
fn request_before_handshake_is_refused() {
    let namesrv = NamesrvProcess::start();
    let mut client = TestClient::connect(namesrv.addr()).unwrap();
    let response = get_route(&mut client, "Orders");
    assert_eq!(status_of(&response).0, wire::Status::HANDSHAKE_REQUIRED);
    // The connection goes on: a handshake now succeeds and requests are served.
    client.handshake().expect("handshake after the refusal");
    assert_eq!(
        status_of(&get_route(&mut client, "Orders")).0,
        wire::Status::TOPIC_NOT_FOUND
    );
}

#[test]
fn unsupported_version_closes_the_connection() {
    let namesrv = NamesrvProcess::start();
    let mut client = TestClient::connect(namesrv.addr()).unwrap();
    let response = client.handshake_with_versions(99, 50).expect("a response");
    assert_eq!(status_of(&response).0, wire::Status::UNSUPPORTED_VERSION);
    let handshake = response
        .frame()
        .body_as_handshake_response()
        .expect("HandshakeResponse");
    assert_eq!(handshake.protocol_version(), 0);
    assert_eq!(
        handshake.max_protocol_version(),
        shardmq_schema::PROTOCOL_VERSION
    );
    assert!(client.read_until_closed().expect("closed").is_empty());
    assert_still_serving(&namesrv);
}

#[test]
fn unknown_requests_are_answered_unknown_request() {
    let namesrv = NamesrvProcess::start();
    let mut client = namesrv.client();

    // A body type from a newer peer: a table the verifier skips.
    let response = client
        .request(|builder| {
            let topic = builder.create_string("Orders");
            let table = wire::GetRouteRequest::create(
                builder,
                &wire::GetRouteRequestArgs { topic: Some(topic) },
            );
            (wire::Body(200), table.as_union_value())
        })
        .expect("a response");
    assert_eq!(status_of(&response).0, wire::Status::UNKNOWN_REQUEST);

    // A request this protocol knows but a namesrv does not serve.
    let response = client
        .request(|builder| {
            let topic = builder.create_string("Orders");
            let table = wire::SendRequest::create(
                builder,
                &wire::SendRequestArgs {
                    topic: Some(topic),
                    ..Default::default()
                },
            );
            (wire::Body::SendRequest, table.as_union_value())
        })
        .expect("a response");
    assert_eq!(status_of(&response).0, wire::Status::UNKNOWN_REQUEST);

    // A frame kind from a newer peer.
    let request_id = client.take_request_id();
    let frame = client
        .encode_frame(|builder| {
            let header = FrameHeader {
                kind: wire::FrameKind(9),
                ..FrameHeader::request(request_id)
            };
            build_frame(builder, &header, wire::Body::NONE, None)
        })
        .unwrap();
    client.send_bytes(&frame).unwrap();
    let response = client.read_response(request_id).expect("a response");
    assert_eq!(status_of(&response).0, wire::Status::UNKNOWN_REQUEST);

    // A request without a body.
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
    let response = client.read_response(request_id).expect("a response");
    assert_eq!(status_of(&response).0, wire::Status::INVALID_ARGUMENT);

    // The connection still works.
    assert_eq!(
        status_of(&get_route(&mut client, "Orders")).0,
        wire::Status::TOPIC_NOT_FOUND
    );
}

#[test]
fn invalid_registrations_are_refused() {
    let namesrv = NamesrvProcess::start();
    let mut client = namesrv.client();
    let cases = [
        Broker::master("", "127.0.0.1:10911", &[]),
        Broker::master("broker-a", "no-port", &[]),
        Broker::master("broker-a", "127.0.0.1:10911", &[("bad topic", 1, 1, 6)]),
        Broker::master(
            "broker-a",
            "127.0.0.1:10911",
            &[("Orders", 1, 1, 6), ("Orders", 2, 2, 6)],
        ),
        Broker::master("broker-a", "127.0.0.1:10911", &[("Orders", 1, 1, 64)]),
    ];
    for case in &cases {
        let response = register(&mut client, case);
        let (status, message) = status_of(&response);
        assert_eq!(status, wire::Status::INVALID_ARGUMENT, "{message:?}");
        assert!(message.is_some_and(|text| text.starts_with("invalid ")));
    }
    assert!(topic_list(&mut client, None).is_empty());
    let response = get_route(&mut client, "");
    assert_eq!(status_of(&response).0, wire::Status::INVALID_ARGUMENT);
}

#[test]
fn oversized_length_prefix_is_refused_and_closes() {
    let namesrv = NamesrvProcess::start();
    for handshake_first in [false, true] {
        let mut client = TestClient::connect(namesrv.addr()).unwrap();
        if handshake_first {
            client.handshake().unwrap();
        }
        let mut bytes = u32::MAX.to_be_bytes().to_vec();
        bytes.extend_from_slice(&[0xAB; 64]);
        client.send_bytes(&bytes).unwrap();
        let frames = client.read_until_closed().expect("closed after the answer");
        assert_eq!(frames.len(), 1, "one answer, then close");
        assert_eq!(frames[0].frame().request_id(), 0);
        assert_eq!(status_of(&frames[0]).0, wire::Status::FRAME_TOO_LARGE);
    }
    assert_still_serving(&namesrv);
}

#[test]
fn zero_length_prefix_is_refused_and_closes() {
    let namesrv = NamesrvProcess::start();
    let mut client = namesrv.client();
    client.send_bytes(&[0, 0, 0, 0, 1, 2, 3]).unwrap();
    let frames = client.read_until_closed().expect("closed after the answer");
    assert_eq!(frames.len(), 1);
    assert_eq!(status_of(&frames[0]).0, wire::Status::MALFORMED_FRAME);
    assert_still_serving(&namesrv);
}

#[test]
fn truncated_frames_are_refused() {
    let namesrv = NamesrvProcess::start();

    // A frame cut short, then end of stream: nothing to answer, the connection closes.
    let mut client = TestClient::connect(namesrv.addr()).unwrap();
    let request_id = client.take_request_id();
    let frame = client
        .encode_request(request_id, |builder| topic_list_request(builder, None))
        .unwrap();
    client.send_bytes(&frame[..frame.len() - 5]).unwrap();
    client.shutdown_write().unwrap();
    assert!(client.read_until_closed().expect("closed").is_empty());

    // A flatbuffer cut short under a length prefix that matches the cut: the frame is whole
    // but malformed, answered with id 0, and the connection goes on.
    let mut client = namesrv.client();
    let request_id = client.take_request_id();
    let frame = client
        .encode_request(request_id, |builder| {
            topic_list_request(builder, Some("DefaultCluster"))
        })
        .unwrap();
    let cut_body = &frame[FRAME_LENGTH_PREFIX_BYTES..frame.len() - 8];
    client.send_bytes(&length_prefixed(cut_body)).unwrap();
    let response = client.read_frame().expect("an answer");
    assert_eq!(response.frame().request_id(), 0);
    assert_eq!(status_of(&response).0, wire::Status::MALFORMED_FRAME);
    assert_eq!(
        status_of(&get_route(&mut client, "Orders")).0,
        wire::Status::TOPIC_NOT_FOUND
    );

    assert_still_serving(&namesrv);
}

#[test]
fn random_bytes_are_refused() {
    let namesrv = NamesrvProcess::start();
    let mut random = Xorshift(0x5EED_1234_ABCD_0001);

    // Raw garbage: whatever the first four bytes say, the server answers with errors (id 0)
    // and closes, or closes once the stream ends.
    for _ in 0..8 {
        let mut client = TestClient::connect(namesrv.addr()).unwrap();
        let length = 1 + random.below(512);
        let garbage = random.bytes(length);
        client.send_bytes(&garbage).unwrap();
        client.shutdown_write().unwrap();
        for frame in client.read_until_closed().expect("closed") {
            assert_eq!(frame.frame().request_id(), 0);
            let status = status_of(&frame).0;
            assert!(
                [wire::Status::MALFORMED_FRAME, wire::Status::FRAME_TOO_LARGE].contains(&status),
                "{status:?}"
            );
        }
    }

    // Garbage under a plausible length prefix, with and without the file identifier: a
    // malformed frame, answered with id 0, after which the same connection still works.
    let mut client = namesrv.client();
    for round in 0..16 {
        let length = 8 + random.below(256);
        let mut body = random.bytes(length);
        if round % 2 == 0 {
            body[4..8].copy_from_slice(b"SHMQ");
        }
        client.send_bytes(&length_prefixed(&body)).unwrap();
        let response = client.read_frame().expect("an answer");
        assert_eq!(response.frame().request_id(), 0);
        assert_eq!(
            status_of(&response).0,
            wire::Status::MALFORMED_FRAME,
            "round {round}"
        );
    }
    assert_eq!(
        status_of(&get_route(&mut client, "Orders")).0,
        wire::Status::TOPIC_NOT_FOUND
    );
    assert_still_serving(&namesrv);
}

#[test]
fn corrupted_requests_never_break_the_server() {
    let namesrv = NamesrvProcess::start();
    let mut random = Xorshift(0xC0FF_EE00_0000_0042);
    let mut client = namesrv.client();
    let topics = [("Orders", 8, 8, 6)];
    let template = client
        .encode_request(7, |builder| {
            let topics: Vec<_> = topics
                .iter()
                .map(|&(name, read_queues, write_queues, perm)| {
                    let name = builder.create_string(name);
                    wire::TopicConfig::create(
                        builder,
                        &wire::TopicConfigArgs {
                            name: Some(name),
                            read_queues,
                            write_queues,
                            perm,
                            is_ordered: false,
                        },
                    )
                })
                .collect();
            let topics = builder.create_vector(&topics);
            let cluster_name = builder.create_string("DefaultCluster");
            let broker_name = builder.create_string("broker-a");
            let broker_address = builder.create_string("127.0.0.1:10911");
            let request = wire::RegisterBrokerRequest::create(
                builder,
                &wire::RegisterBrokerRequestArgs {
                    cluster_name: Some(cluster_name),
                    broker_name: Some(broker_name),
                    broker_address: Some(broker_address),
                    topics: Some(topics),
                    ..Default::default()
                },
            );
            (wire::Body::RegisterBrokerRequest, request.as_union_value())
        })
        .unwrap();

    for _ in 0..64 {
        // Flip bytes after the length prefix, so the stream stays in step.
        let mut corrupted = template.to_vec();
        for _ in 0..1 + random.below(3) {
            let position = FRAME_LENGTH_PREFIX_BYTES
                + random.below(corrupted.len() - FRAME_LENGTH_PREFIX_BYTES);
            corrupted[position] ^= 1 << random.below(8);
        }
        // A well-formed request after it tells where its answers (zero or one: the flips may
        // have made it a one-way or a response frame) end.
        let probe_id = client.take_request_id();
        let probe = client
            .encode_request(probe_id, |builder| topic_list_request(builder, None))
            .unwrap();
        corrupted.extend_from_slice(&probe);
        client.send_bytes(&corrupted).unwrap();
        let mut answers = 0;
        loop {
            match client.read_frame() {
                Ok(frame) if frame.frame().request_id() == probe_id => break,
                Ok(_) => answers += 1,
                // The flips made a handshake the server refuses; it closes. Start over.
                Err(ClientError::Closed) => {
                    client = namesrv.client();
                    break;
                }
                Err(other) => panic!("after a corrupted frame: {other}"),
            }
        }
        assert!(answers <= 1, "{answers} answers to one corrupted frame");
    }
    assert_still_serving(&namesrv);
}

#[test]
fn pipelined_requests_are_all_answered_in_order() {
    let namesrv = NamesrvProcess::start();
    let mut client = namesrv.client();
    register_ok(
        &mut client,
        &Broker::master("broker-a", "127.0.0.1:10911", &[("Orders", 8, 8, 6)]),
    );
    // More than the server's per-connection in-flight limit (128), in one write.
    let mut batch = Vec::new();
    let mut request_ids = Vec::new();
    for index in 0..300 {
        let request_id = client.take_request_id();
        let topic = if index % 2 == 0 { "Orders" } else { "Missing" };
        let frame = client
            .encode_request(request_id, |builder| {
                let topic = builder.create_string(topic);
                let request = wire::GetRouteRequest::create(
                    builder,
                    &wire::GetRouteRequestArgs { topic: Some(topic) },
                );
                (wire::Body::GetRouteRequest, request.as_union_value())
            })
            .unwrap();
        batch.extend_from_slice(&frame);
        request_ids.push((request_id, index % 2 == 0));
    }
    client.send_bytes(&batch).unwrap();
    for (request_id, is_found) in request_ids {
        let response = client
            .read_response(request_id)
            .expect("the response, in order");
        let expected = if is_found {
            wire::Status::OK
        } else {
            wire::Status::TOPIC_NOT_FOUND
        };
        assert_eq!(status_of(&response).0, expected);
    }
}

#[test]
fn sigterm_stops_the_server_gracefully() {
    let mut namesrv = NamesrvProcess::start();
    let mut client = namesrv.client();
    let status = namesrv
        .signal_and_wait("TERM", Duration::from_secs(10))
        .expect("exits within 10 s of SIGTERM");
    assert!(status.success(), "exit status {status}");
    assert!(client
        .read_until_closed()
        .expect("connection closed")
        .is_empty());
    assert!(namesrv
        .log_lines()
        .iter()
        .any(|line| line.contains("SIGTERM")));
}

#[test]
fn cluster_info_lists_clusters_and_their_brokers() {
    let namesrv = NamesrvProcess::start();
    let mut client = namesrv.client();
    let topics = [("Orders", 4, 4, 6)];
    register_ok(
        &mut client,
        &Broker::master("broker-b", "127.0.0.1:10921", &topics),
    );
    register_ok(
        &mut client,
        &Broker::master("broker-a", "127.0.0.1:10911", &topics),
    );
    let answer = client
        .request(|builder| {
            let request = wire::ClusterInfoRequest::create(builder, &Default::default());
            (wire::Body::ClusterInfoRequest, request.as_union_value())
        })
        .expect("cluster info");
    let info = answer
        .frame()
        .body_as_cluster_info_response()
        .expect("a ClusterInfoResponse");
    let clusters: Vec<(String, Vec<(String, String)>)> = info
        .clusters()
        .unwrap()
        .iter()
        .map(|cluster| {
            let brokers = cluster
                .brokers()
                .unwrap()
                .iter()
                .map(|b| {
                    let address = b.addresses().unwrap().get(0).address().unwrap().to_owned();
                    (b.broker_name().unwrap().to_owned(), address)
                })
                .collect();
            (cluster.cluster_name().unwrap().to_owned(), brokers)
        })
        .collect();
    assert_eq!(
        clusters,
        vec![(
            owned("DefaultCluster"),
            vec![
                (owned("broker-a"), owned("127.0.0.1:10911")),
                (owned("broker-b"), owned("127.0.0.1:10921"))
            ]
        )],
        "clusters sorted by name, brokers by broker name"
    );
}
