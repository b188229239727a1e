//! The route scenarios, shared by the test binaries of the two serialize types
//! (`route_json.rs`, `route_rocketmq.rs`): rocketmq-client-rust 1.0.0 fixes its serialize type
//! once per process, so each type runs the same scenarios in a binary of its own.
//!
//! Each scenario starts a real name server and broker (`shardmq_compat::servers`), creates its
//! topic with the `shardmq` CLI and waits until ShardMQ's own protocol routes it; only then does
//! the RocketMQ client ask, once, so a failure is the name server's RocketMQ answer and not a
//! race with the broker's registration.

use std::collections::BTreeMap;

use shardmq_compat::client::{RocketMqAdmin, SerializeType, TopicRouteData};
use shardmq_compat::servers::{LocalCluster, BROKER_NAME, CLUSTER_NAME};

/// The topic the scenarios create.
const TOPIC: &str = "CompatRouteTopic";

/// Read and write queues of [`TOPIC`].
const QUEUES: u32 = 4;

/// A topic no one creates.
const UNKNOWN_TOPIC: &str = "CompatTopicNeverCreated";

/// RocketMQ's permission bits (PermName): a queue can be read, written.
const PERM_READ: u32 = 4;
const PERM_WRITE: u32 = 2;

/// The broker id of a master in `brokerAddrs`.
const MASTER_BROKER_ID: u64 = 0;

/// The route a RocketMQ client fetches from ShardMQ's name server for a topic with 4 queues on
/// one broker: that broker (its name and cluster) with its listen address as master (id 0), and
/// one queue entry with 4 read and 4 write queues, readable and writable.
pub fn route_of_a_topic_comes_from_shardmq_s_name_server(serialize_type: SerializeType) {
    shardmq_compat::client::select_serialize_type(serialize_type);
    let cluster = LocalCluster::start();
    cluster.create_topic(TOPIC, QUEUES);

    let client = start_client(&cluster, serialize_type);
    let route = client
        .topic_route(TOPIC)
        .unwrap_or_else(|error| panic!("{error}"))
        .unwrap_or_else(|| {
            panic!("the name server answered TOPIC_NOT_EXIST (17) for {TOPIC}, which it routes")
        });
    assert_route_of_the_cluster(&route, &cluster);
}

/// A topic never created has no route: the name server answers TOPIC_NOT_EXIST (17), which the
/// client reports as "no route" (not a transport error, not a timeout), and the same client
/// goes on fetching a topic that exists.
pub fn an_unknown_topic_has_no_route(serialize_type: SerializeType) {
    shardmq_compat::client::select_serialize_type(serialize_type);
    let cluster = LocalCluster::start();
    cluster.create_topic(TOPIC, QUEUES);

    let client = start_client(&cluster, serialize_type);
    match client.topic_route(UNKNOWN_TOPIC) {
        Ok(None) => {}
        Ok(Some(route)) => {
            panic!("{UNKNOWN_TOPIC} was never created, yet it has a route: {route:?}")
        }
        Err(error) => panic!(
            "expected TOPIC_NOT_EXIST (17) for {UNKNOWN_TOPIC}, which the client reports as no \
             route; got: {error}"
        ),
    }

    // The same client, over its name server channel, still gets answers.
    let route = client
        .topic_route(TOPIC)
        .unwrap_or_else(|error| panic!("after {UNKNOWN_TOPIC}'s TOPIC_NOT_EXIST: {error}"))
        .unwrap_or_else(|| {
            panic!("the name server answered TOPIC_NOT_EXIST (17) for {TOPIC}, which it routes")
        });
    assert_route_of_the_cluster(&route, &cluster);
}

fn start_client(cluster: &LocalCluster, serialize_type: SerializeType) -> RocketMqAdmin {
    RocketMqAdmin::start(&cluster.namesrv_addr(), serialize_type)
        .unwrap_or_else(|error| panic!("{error}"))
}

/// `route` is [`TOPIC`]'s route on `cluster`'s one broker.
fn assert_route_of_the_cluster(route: &TopicRouteData, cluster: &LocalCluster) {
    assert_eq!(
        route.broker_datas.len(),
        1,
        "one broker data entry: {route:?}"
    );
    let broker = &route.broker_datas[0];
    assert_eq!(broker.broker_name().as_str(), BROKER_NAME, "{route:?}");
    assert_eq!(broker.cluster(), CLUSTER_NAME, "{route:?}");
    let addresses: BTreeMap<u64, String> = broker
        .broker_addrs()
        .iter()
        .map(|(broker_id, address)| (*broker_id, address.as_str().to_owned()))
        .collect();
    assert_eq!(
        addresses,
        BTreeMap::from([(MASTER_BROKER_ID, cluster.broker_addr())]),
        "the broker's listen address as its master (id 0) address, and no other: {route:?}"
    );

    assert_eq!(
        route.queue_datas.len(),
        1,
        "one queue data entry: {route:?}"
    );
    let queues = &route.queue_datas[0];
    assert_eq!(queues.broker_name().as_str(), BROKER_NAME, "{route:?}");
    assert_eq!(queues.read_queue_nums(), QUEUES, "{route:?}");
    assert_eq!(queues.write_queue_nums(), QUEUES, "{route:?}");
    assert_eq!(queues.perm(), PERM_READ | PERM_WRITE, "{route:?}");

    // A non-empty static-topic mapping would switch the client to static-topic mode.
    assert!(
        route
            .topic_queue_mapping_by_broker
            .as_ref()
            .is_none_or(|mapping| mapping.is_empty()),
        "no static-topic mapping: {route:?}"
    );
}
