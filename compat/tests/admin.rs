//! The admin calls RocketMQ's `mqadmin` commands make, through rocketmq-client-rust 1.0.0's
//! admin API (`DefaultMQAdminExt`, JSON headers): a broker's runtime information
//! (`brokerStatus`), a topic's per-queue offsets (`topicStatus`), a group's progress
//! (`consumerProgress`), its connections and subscriptions (`consumerConnection`), the groups
//! consuming a topic (`topicConsumeByWho`) and deleting a topic on the brokers and the name
//! server (`deleteTopic`). The client's own decoders read every body, so these tests pin down
//! that ShardMQ writes them as the client parses them (the offset tables keyed by queue
//! objects, as RocketMQ's fastjson writes them).
//!
//! Each test starts a fresh name server and broker, creates its topic with the `shardmq` CLI
//! and runs its clients on one `ClientHost`; every call has a deadline and every wait polls a
//! condition with one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use rocketmq_client_rust::{
    DefaultMQAdminExt, MQAdminMutationExt, MQAdminReadExt, MQAdminTopicStatsReadExt, TopicAdmin,
};
use rocketmq_model::message::MessageQueue;
use rocketmq_protocol::protocol::heartbeat::message_model::MessageModel;
use shardmq_compat::client::{CallError, ClientHost, SerializeType, REMOTING_TIMEOUT};
use shardmq_compat::consumer::{PushConsumer, PushConsumerOptions};
use shardmq_compat::producer::{Message, Producer};
use shardmq_compat::servers::{wait_until, LocalCluster, BROKER_NAME, CLUSTER_NAME};

const SERIALIZE_TYPE: SerializeType = SerializeType::JSON;

/// The topic every test creates on its own broker.
const TOPIC: &str = "CompatAdminTopic";

/// Read and write queues of [`TOPIC`].
const QUEUES: u32 = 4;

/// RocketMQ's `TOPIC_NOT_EXIST`.
const TOPIC_NOT_EXIST: i32 = 17;

/// RocketMQ's `CONSUMER_NOT_ONLINE`.
const CONSUMER_NOT_ONLINE: i32 = 206;

/// How long a consumer may take to be given its queues and to commit what it consumed (the
/// 1.0.0 client persists offsets every 5 s, the first time 10 s after it starts).
const COMMIT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a deleted topic's route may take to go (the broker registers again at once).
const ROUTE_GONE_TIMEOUT: Duration = Duration::from_secs(10);

/// A started `DefaultMQAdminExt` on its own host; shut down, with a deadline, when dropped.
struct Admin {
    admin: Option<DefaultMQAdminExt>,
    host: Arc<ClientHost>,
}

impl Admin {
    fn start(host: &Arc<ClientHost>, namesrv: &str) -> Self {
        let mut admin = DefaultMQAdminExt::with_timeout(host.client_runtime(), REMOTING_TIMEOUT);
        admin.set_namesrv_addr(namesrv);
        host.call("starting the admin client", admin.start())
            .unwrap_or_else(|error| panic!("{error}"));
        Self {
            admin: Some(admin),
            host: Arc::clone(host),
        }
    }

    fn ext(&self) -> &DefaultMQAdminExt {
        self.admin.as_ref().expect("a started admin client")
    }
}

impl Drop for Admin {
    fn drop(&mut self) {
        if let Some(mut admin) = self.admin.take() {
            self.host
                .shut_down("admin client", async move { admin.shutdown().await });
        }
    }
}

/// `brokerStatus` and `topicStatus`: five messages sent to queue 0 show in the broker's
/// runtime table and as queue 0's offsets (min 0, max 5, a store time); the other queues are
/// empty; every queue is keyed by the topic, the broker's name and its id. A topic the broker
/// does not host is TOPIC_NOT_EXIST.
#[test]
fn runtime_info_and_topic_stats() {
    let cluster = start_cluster_with_topic();
    let host = ClientHost::start("admin-runtime", SERIALIZE_TYPE);
    let namesrv = cluster.namesrv_addr();
    let broker = cluster.broker_addr();
    let producer = Producer::start(&host, &namesrv, "CompatAdminProducer")
        .unwrap_or_else(|error| panic!("{error}"));
    for index in 0..5 {
        producer
            .send_to_queue(message(index), 0)
            .unwrap_or_else(|error| panic!("{error}"));
    }
    let admin = Admin::start(&host, &namesrv);

    let table: BTreeMap<String, String> = host
        .call(
            "fetching the broker's runtime information",
            admin
                .ext()
                .fetch_broker_runtime_stats(broker.as_str().into()),
        )
        .unwrap_or_else(|error| panic!("{error}"))
        .table
        .into_iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect();
    assert_eq!(
        table.get("brokerName").map(String::as_str),
        Some(BROKER_NAME)
    );
    assert_eq!(
        table.get("clusterName").map(String::as_str),
        Some(CLUSTER_NAME)
    );
    let messages_in: u64 = table["messagesIn"].parse().expect("a count");
    assert!(messages_in >= 5, "messagesIn {messages_in} in {table:?}");
    let boot: i64 = table["bootTimestamp"].parse().expect("ms since the epoch");
    assert!(boot > 1_600_000_000_000, "bootTimestamp {boot}");
    assert!(table["runtime"].starts_with("[ 0 days"), "{table:?}");
    assert!(
        table["brokerVersionDesc"].starts_with("ShardMQ "),
        "{table:?}"
    );

    let stats = host
        .call(
            "fetching the topic's stats",
            admin
                .ext()
                .topic_stats_at(broker.as_str().into(), TOPIC.into()),
        )
        .unwrap_or_else(|error| panic!("{error}"));
    let offsets = stats.get_offset_table();
    assert_eq!(offsets.len(), QUEUES as usize, "{offsets:?}");
    for queue_id in 0..QUEUES as i32 {
        let offset = offsets
            .get(&MessageQueue::from_parts(TOPIC, BROKER_NAME, queue_id))
            .unwrap_or_else(|| panic!("queue {queue_id} in {offsets:?}"));
        assert_eq!(offset.get_min_offset(), 0);
        if queue_id == 0 {
            assert_eq!(offset.get_max_offset(), 5);
            assert!(offset.get_last_update_timestamp() >= boot, "{offset:?}");
        } else {
            assert_eq!(offset.get_max_offset(), 0);
            assert_eq!(offset.get_last_update_timestamp(), 0);
        }
    }

    let unknown = host.call(
        "fetching an unknown topic's stats",
        admin
            .ext()
            .topic_stats_at(broker.as_str().into(), "CompatNoSuchTopic".into()),
    );
    assert_eq!(response_code(unknown.map(|_| ())), Some(TOPIC_NOT_EXIST));
}

/// `consumerProgress`, `consumerConnection` and `topicConsumeByWho`: once a push consumer of
/// `TagA || TagB` has consumed 12 messages and committed them, the group's progress shows every
/// queue with its committed offset at the queue's end (12 over the four queues) and a store
/// time where it consumed something; its connection lists the consumer's client id, the
/// subscription with its tags and the clustering model; the topic is consumed by the group.
/// A group with no member is CONSUMER_NOT_ONLINE.
#[test]
fn consumer_progress_connections_and_groups_of_a_topic() {
    let cluster = start_cluster_with_topic();
    let host = ClientHost::start("admin-consumers", SERIALIZE_TYPE);
    let namesrv = cluster.namesrv_addr();
    let broker = cluster.broker_addr();
    let group = "CompatAdminGroup";
    let consumer = PushConsumer::start(
        &host,
        &namesrv,
        PushConsumerOptions::new(group, TOPIC, "TagA || TagB"),
    )
    .unwrap_or_else(|error| panic!("{error}"));
    let producer = Producer::start(&host, &namesrv, "CompatAdminProducer")
        .unwrap_or_else(|error| panic!("{error}"));
    for index in 0..12 {
        producer
            .send(message(index))
            .unwrap_or_else(|error| panic!("{error}"));
    }
    consumer
        .inbox()
        .wait_for(COMMIT_TIMEOUT, "the 12 messages", |deliveries| {
            (deliveries.len() >= 12).then_some(())
        });
    cluster.wait_until_group_caught_up(group, TOPIC, COMMIT_TIMEOUT);
    let admin = Admin::start(&host, &namesrv);

    for topic in [Some(TOPIC), None] {
        let stats = host
            .call(
                "fetching the group's consume stats",
                admin.ext().examine_consume_stats(
                    group.into(),
                    topic.map(Into::into),
                    None,
                    Some(broker.as_str().into()),
                    None,
                ),
            )
            .unwrap_or_else(|error| panic!("{error}"));
        let mut total = 0;
        for queue_id in 0..QUEUES as i32 {
            let offset = stats
                .get_offset_table()
                .get(&MessageQueue::from_parts(TOPIC, BROKER_NAME, queue_id))
                .unwrap_or_else(|| panic!("queue {queue_id} in {:?}", stats.get_offset_table()));
            assert_eq!(offset.get_consumer_offset(), offset.get_broker_offset());
            assert_eq!(offset.get_pull_offset(), offset.get_consumer_offset());
            assert_eq!(
                offset.get_last_timestamp() > 0,
                offset.get_broker_offset() > 0,
                "{offset:?}"
            );
            total += offset.get_broker_offset();
        }
        assert_eq!(total, 12, "{:?}", stats.get_offset_table());
        assert_eq!(stats.compute_total_diff(), 0);
    }

    let connection = host
        .call(
            "fetching the group's connections",
            admin
                .ext()
                .examine_consumer_connection_info(group.into(), Some(broker.as_str().into())),
        )
        .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(connection.get_connection_set().len(), 1);
    let client_id = connection
        .get_connection_set()
        .iter()
        .next()
        .expect("one connection")
        .get_client_id();
    assert!(!client_id.is_empty());
    assert_eq!(
        connection.get_message_model(),
        Some(MessageModel::Clustering)
    );
    let subscription = connection
        .get_subscription_table()
        .iter()
        .find(|(topic, _)| topic.as_str() == TOPIC)
        .map(|(_, subscription)| subscription)
        .unwrap_or_else(|| panic!("{TOPIC} in {:?}", connection.get_subscription_table()));
    assert_eq!(subscription.sub_string.as_str(), "TagA || TagB");
    let tags: BTreeSet<String> = subscription
        .tags_set
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(tags, BTreeSet::from(["TagA".to_owned(), "TagB".to_owned()]));
    assert_eq!(subscription.code_set.len(), 2);

    let groups = host
        .call(
            "fetching the groups consuming the topic",
            MQAdminReadExt::query_topic_consume_by_who(admin.ext(), TOPIC.into()),
        )
        .unwrap_or_else(|error| panic!("{error}"));
    assert!(
        groups
            .get_group_list()
            .iter()
            .any(|name| name.as_str() == group),
        "{groups:?}"
    );

    let offline = host.call(
        "fetching an offline group's connections",
        admin
            .ext()
            .observe_consumer_connection_at("CompatNoSuchGroup".into(), broker.as_str().into()),
    );
    assert_eq!(
        response_code(offline.map(|_| ())),
        Some(CONSUMER_NOT_ONLINE)
    );
    drop(consumer);
}

/// `deleteTopic`: the admin client deletes the topic on every broker of the cluster, then on
/// the name server; the topic has no route any more and the broker no longer hosts it. Doing
/// it again succeeds (the topic is already gone), as with RocketMQ.
#[test]
fn delete_topic_on_brokers_and_name_server() {
    let cluster = start_cluster_with_topic();
    let host = ClientHost::start("admin-delete", SERIALIZE_TYPE);
    let namesrv = cluster.namesrv_addr();
    let broker = cluster.broker_addr();
    let admin = Admin::start(&host, &namesrv);

    host.call(
        "deleting the topic",
        admin.ext().remove_topic(TOPIC.into(), CLUSTER_NAME.into()),
    )
    .unwrap_or_else(|error| panic!("{error}"));
    wait_until(
        ROUTE_GONE_TIMEOUT,
        "the deleted topic's route to go",
        || {
            let route = host
                .call(
                    "fetching the route",
                    TopicAdmin::examine_topic_route_info_with_timeout(
                        admin.ext(),
                        TOPIC.into(),
                        REMOTING_TIMEOUT.as_millis() as u64,
                    ),
                )
                .ok()?;
            route.is_none().then_some(())
        },
    );
    let stats = host.call(
        "fetching the deleted topic's stats",
        admin
            .ext()
            .topic_stats_at(broker.as_str().into(), TOPIC.into()),
    );
    assert_eq!(response_code(stats.map(|_| ())), Some(TOPIC_NOT_EXIST));

    host.call(
        "deleting the topic again",
        admin.ext().remove_topic(TOPIC.into(), CLUSTER_NAME.into()),
    )
    .unwrap_or_else(|error| panic!("{error}"));
}

fn start_cluster_with_topic() -> LocalCluster {
    let cluster = LocalCluster::start();
    cluster.create_topic(TOPIC, QUEUES);
    cluster
}

/// A message of [`TOPIC`], tagged `TagA` or `TagB` by its index.
fn message(index: u32) -> Message {
    Message::builder()
        .topic(TOPIC)
        .tags(if index.is_multiple_of(2) {
            "TagA"
        } else {
            "TagB"
        })
        .body_slice(format!("admin message {index}").as_bytes())
        .build_unchecked()
}

/// The response code a failed call was answered with; `None` when it succeeded or failed
/// without an answer.
fn response_code(result: Result<(), CallError>) -> Option<i32> {
    result
        .err()
        .and_then(|error| error.response())
        .map(|(code, _)| code)
}
