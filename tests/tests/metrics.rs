//! The Prometheus endpoints of the real `shardmq-broker` and `shardmq-namesrv`
//! (`--metrics-listen`): after known traffic, each scrape reports exactly that traffic.
//!
//! Needs the binaries: `cargo build --workspace --bins` first.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use shardmq_schema::wire;
use shardmq_tests::{
    pull_request_body, require_ok, send_request_body, upsert_topic_body, wait_until, BrokerProcess,
    NamesrvProcess, PullParams, ServerProcess, TestMessage,
};

/// The metrics address a server logged (`metrics served at http://ADDR/metrics`).
fn metrics_addr(server: &ServerProcess) -> SocketAddr {
    wait_until(
        Duration::from_secs(10),
        "the metrics address in the log",
        || {
            server.log_lines().iter().find_map(|line| {
                let start =
                    line.find("metrics served at http://")? + "metrics served at http://".len();
                let end = line[start..].find("/metrics")? + start;
                line[start..end].parse().ok()
            })
        },
    )
}

/// (status line, body) of `GET path`.
fn http_get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("the endpoint answers and closes");
    let (head, body) = response
        .split_once("\r\n\r\n")
        .expect("an HTTP head and body");
    (
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    )
}

/// The value of the sample `name{labels}` (exact text before the value), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
}

#[test]
fn broker_and_namesrv_metrics_count_exactly_the_traffic_sent() {
    const TOPIC: &str = "Metered";
    let dir = tempfile::tempdir().unwrap();
    let namesrv = NamesrvProcess::start_with_args(&["--metrics-listen", "127.0.0.1:0"]);
    let namesrv_addr = namesrv.addr().to_string();
    let broker = BrokerProcess::start(
        &dir.path().join("data"),
        &[
            "--namesrv",
            &namesrv_addr,
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let broker_metrics = metrics_addr(&broker);
    let namesrv_metrics = metrics_addr(&namesrv);

    let mut client = broker.client();
    require_ok(
        client
            .request(|b| upsert_topic_body(b, TOPIC, (2, 2, 6), false))
            .unwrap(),
    )
    .unwrap();
    let messages: Vec<TestMessage> = (0..5)
        .map(|i| TestMessage::new(vec![b'x'; 100 + i]))
        .collect();
    require_ok(
        client
            .request(|b| send_request_body(b, TOPIC, 0, &messages))
            .unwrap(),
    )
    .expect("send 5 messages");
    let pulled = require_ok(
        client
            .request(|b| pull_request_body(b, &PullParams::new(TOPIC, 0, 0)))
            .unwrap(),
    )
    .expect("pull them");
    let pulled_bytes = pulled
        .frame()
        .body_as_pull_response()
        .and_then(|p| p.records())
        .map_or(0, |r| r.len());
    require_ok(
        client
            .request(|b| {
                let group = b.create_string("MeterGroup");
                let topic = b.create_string(TOPIC);
                let request = wire::CommitConsumerOffsetRequest::create(
                    b,
                    &wire::CommitConsumerOffsetRequestArgs {
                        consumer_group: Some(group),
                        topic: Some(topic),
                        queue_id: 0,
                        offset: 2,
                    },
                );
                (
                    wire::Body::CommitConsumerOffsetRequest,
                    request.as_union_value(),
                )
            })
            .unwrap(),
    )
    .expect("commit offset 2");
    // A refused request shows under its status.
    let refused = client
        .request(|b| send_request_body(b, "NoSuchTopic", 0, &messages[..1]))
        .unwrap();
    assert_eq!(refused.frame().status(), wire::Status::TOPIC_NOT_FOUND);

    let (status, text) = http_get(broker_metrics, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK", "{text}");
    let expect = |series: &str, value: f64| {
        assert_eq!(
            sample(&text, series),
            Some(value),
            "{series} should be {value} in:\n{text}"
        );
    };
    expect("shardmq_messages_in_total{topic=\"Metered\"}", 5.0);
    expect("shardmq_bytes_in_total{topic=\"Metered\"}", 510.0);
    expect("shardmq_messages_out_total{topic=\"Metered\"}", 5.0);
    expect(
        "shardmq_bytes_out_total{topic=\"Metered\"}",
        pulled_bytes as f64,
    );
    expect(
        "shardmq_consumer_lag_messages{group=\"MeterGroup\",topic=\"Metered\"}",
        3.0,
    );
    expect("shardmq_responses_total{status=\"TOPIC_NOT_FOUND\"}", 1.0);
    expect("shardmq_send_latency_seconds_count", 2.0);
    expect("shardmq_parked_pulls{shard=\"0\"}", 0.0);
    // Every request handled by now: nothing is held against the request byte budget.
    expect("shardmq_request_bytes_held{shard=\"0\"}", 0.0);
    assert!(
        sample(&text, "shardmq_connections{shard=\"0\"}").is_some_and(|n| n >= 1.0),
        "connections missing:\n{text}"
    );
    assert!(
        sample(&text, "shardmq_disk_free_bytes").is_some_and(|n| n > 0.0),
        "disk free missing:\n{text}"
    );
    // Under async flush the group commit follows the answer; it shows within moments.
    wait_until(
        Duration::from_secs(5),
        "a CommitLog flush to be observed",
        || {
            let (_, text) = http_get(broker_metrics, "/metrics");
            sample(&text, "shardmq_flush_latency_seconds_count")
                .is_some_and(|n| n >= 1.0)
                .then_some(())
        },
    );
    assert!(
        sample(&text, "shardmq_commitlog_bytes{shard=\"0\"}").is_some_and(|n| n > 0.0),
        "CommitLog size missing:\n{text}"
    );

    let (status, _) = http_get(broker_metrics, "/elsewhere");
    assert_eq!(status, "HTTP/1.1 404 Not Found");

    // The namesrv: one broker, and a route served once the broker registered the topic.
    let mut namesrv_client = namesrv.client();
    wait_until(Duration::from_secs(10), "a route for Metered", || {
        let response = namesrv_client
            .request(|b| {
                let topic = b.create_string(TOPIC);
                let request = wire::GetRouteRequest::create(
                    b,
                    &wire::GetRouteRequestArgs { topic: Some(topic) },
                );
                (wire::Body::GetRouteRequest, request.as_union_value())
            })
            .ok()?;
        (response.frame().status() == wire::Status::OK).then_some(())
    });
    let (status, text) = http_get(namesrv_metrics, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(
        sample(&text, "shardmq_namesrv_brokers"),
        Some(1.0),
        "{text}"
    );
    assert!(
        sample(
            &text,
            "shardmq_namesrv_routes_served_total{outcome=\"found\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert!(
        sample(&text, "shardmq_namesrv_registrations_total").is_some_and(|n| n >= 1.0),
        "{text}"
    );
}
