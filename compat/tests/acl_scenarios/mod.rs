//! RocketMQ's ACL 1.0 with rocketmq-client-rust 1.0.0 against a broker with access control on
//! (`--acl-file`, docs/acl.md "RocketMQ clients (remoting)"): the client's `AclClientRPCHook`
//! signs every request with an account's `SessionCredentials`, and ShardMQ's broker checks
//! that signature and the account's permissions. A client with credentials creates a topic
//! (admin account), sends to it and consumes from it; a client without credentials is refused
//! NO_PERMISSION (16). Shared by the test binaries of the two serialize types (`acl_json.rs`,
//! `acl_rocketmq.rs`): the signature covers the ext fields as each header form carries them.
//!
//! The name server does not enforce access control here; only the broker's answers are under
//! test. No address is trusted: the clients on 127.0.0.1 must sign.

use std::time::Duration;

use rocketmq_client_rust::{SendStatus, SessionCredentials};
use shardmq_compat::client::{ClientHost, RocketMqAdmin, SerializeType};
use shardmq_compat::consumer::{PushConsumer, PushConsumerOptions};
use shardmq_compat::producer::{Message, Producer};
use shardmq_compat::servers::{wait_until, LocalCluster};

const TOPIC: &str = "CompatAclTopic";
const QUEUES: u32 = 2;
const GROUP: &str = "CompatAclGroup";

const APP_KEY: &str = "compat-app";
const APP_SECRET: &str = "compat-app-secret";
const ADMIN_KEY: &str = "compat-admin";
const ADMIN_SECRET: &str = "compat-admin-secret";

/// RocketMQ's NO_PERMISSION.
const NO_PERMISSION: i32 = 16;

/// How long a created topic may take to be routed by the name server.
const ROUTE_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a consumer may take to commit what it consumed (the 1.0.0 client persists offsets
/// every 5 s, the first time 10 s after it starts).
const COMMIT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long sent messages may take to reach a new consumer (its first rebalance included).
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(60);

/// The application may publish and subscribe to [`TOPIC`] and consume as [`GROUP`] (which also
/// covers the group's retry topic); the admin account may do anything. The trusted list names
/// an address that is not loopback.
fn acl_toml() -> String {
    format!(
        r#"
trusted_addresses = ["10.255.255.254"]

[[accounts]]
access_key = "{APP_KEY}"
secret_key = "{APP_SECRET}"
topic_perms = {{ {TOPIC} = "PUB|SUB" }}
group_perms = {{ {GROUP} = "SUB" }}

[[accounts]]
access_key = "{ADMIN_KEY}"
secret_key = "{ADMIN_SECRET}"
admin = true
"#
    )
}

fn message(index: usize) -> Message {
    Message::builder()
        .topic(TOPIC)
        .tags("acl")
        .body_slice(format!("acl message {index}").as_bytes())
        .build_unchecked()
}

pub fn a_client_with_credentials_sends_and_consumes_and_one_without_is_refused(
    serialize_type: SerializeType,
) {
    shardmq_compat::client::select_serialize_type(serialize_type);
    let dir = tempfile::TempDir::new().unwrap();
    let acl_file = dir.path().join("acl.toml");
    std::fs::write(&acl_file, acl_toml()).unwrap();
    let cluster = LocalCluster::start_with_broker_args(&["--acl-file", acl_file.to_str().unwrap()]);
    let namesrv = cluster.namesrv_addr();

    // The admin account creates the topic (UPDATE_AND_CREATE_TOPIC needs the admin flag).
    let admin = RocketMqAdmin::start_with_credentials(
        &namesrv,
        serialize_type,
        Some(SessionCredentials::with_keys(ADMIN_KEY, ADMIN_SECRET)),
    )
    .unwrap_or_else(|error| panic!("{error}"));
    admin
        .create_topic(&cluster.broker_addr(), TOPIC, QUEUES)
        .unwrap_or_else(|error| panic!("{error}"));
    wait_until(ROUTE_TIMEOUT, &format!("a route for {TOPIC}"), || {
        let route = admin.topic_route(TOPIC).ok()??;
        let write_queues: u32 = route
            .queue_datas
            .iter()
            .map(|queue| queue.write_queue_nums())
            .sum();
        (write_queues == QUEUES).then_some(())
    });

    let host = ClientHost::start("acl", serialize_type);

    // Without credentials: the broker refuses the send. (1.0.0 reports a broker's refusal of a
    // send by its code only; the remark naming what is missing is tested in the main
    // workspace's tests/tests/acl_remoting.rs.)
    let anonymous = Producer::start(&host, &namesrv, "CompatAclAnonymous")
        .unwrap_or_else(|error| panic!("{error}"));
    let refused = anonymous
        .send(message(0))
        .expect_err("a send without credentials is refused");
    let (code, _remark) = refused
        .response()
        .unwrap_or_else(|| panic!("the broker answered the refusal: {refused}"));
    assert_eq!(code, NO_PERMISSION, "{refused}");
    drop(anonymous);

    // With the application's credentials: sent, then consumed by a signed push consumer
    // (heartbeats, rebalancing, pulls and offset commits all signed).
    let producer = Producer::start_with_credentials(
        &host,
        &namesrv,
        "CompatAclProducer",
        Some(SessionCredentials::with_keys(APP_KEY, APP_SECRET)),
    )
    .unwrap_or_else(|error| panic!("{error}"));
    const SENT: usize = 3;
    for index in 0..SENT {
        let sent = producer
            .send(message(index))
            .unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(sent.send_status, SendStatus::SendOk, "{sent:?}");
    }
    let consumer = PushConsumer::start(
        &host,
        &namesrv,
        PushConsumerOptions::new(GROUP, TOPIC, "*")
            .credentials(SessionCredentials::with_keys(APP_KEY, APP_SECRET)),
    )
    .unwrap_or_else(|error| panic!("{error}"));
    consumer.inbox().wait_for(
        RECEIVE_TIMEOUT,
        &format!("the {SENT} signed sends"),
        |deliveries| (deliveries.len() >= SENT).then_some(()),
    );
    let mut bodies: Vec<String> = consumer
        .inbox()
        .deliveries()
        .iter()
        .map(|delivery| delivery.body_text())
        .collect();
    bodies.sort();
    bodies.dedup();
    assert_eq!(
        bodies,
        (0..SENT)
            .map(|index| format!("acl message {index}"))
            .collect::<Vec<_>>()
    );
    // The consumer's signed offset commits (UPDATE_CONSUMER_OFFSET, oneway: a refusal would
    // be silent) are stored.
    wait_until(COMMIT_TIMEOUT, "the group's committed offsets", || {
        let committed = admin
            .committed_offsets(&cluster.broker_addr(), GROUP, TOPIC)
            .ok()?;
        (committed == SENT as i64).then_some(())
    });
}
