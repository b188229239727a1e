//! RocketMQ's admin calls against the real broker and name server over our own remoting codec:
//! what a malformed or incomplete admin request is answered (a refusal naming the field, on a
//! connection that stays open), and the answers' shapes where RocketMQ's clients do not reach
//! (the fastjson object keys of an offset table, a deleted topic's route on the name server).

use shardmq_remoting::codes::{request, response};
use shardmq_remoting::RemotingCommand;
use shardmq_tests::{LocalCluster, RemotingClient};
use tempfile::TempDir;

const TOPIC: &str = "AdminOrders";

/// RocketMQ's CONSUMER_NOT_ONLINE.
const CONSUMER_NOT_ONLINE: i32 = 206;

fn remark(answer: &RemotingCommand) -> &str {
    answer.remark.as_deref().unwrap_or_default()
}

#[test]
fn admin_requests_with_missing_or_bad_fields_are_refused_by_name_and_the_connection_stays() {
    let dir = TempDir::new().unwrap();
    let cluster = LocalCluster::start(dir.path());
    cluster.create_topic(TOPIC, 2);
    let mut broker = RemotingClient::connect(&cluster.broker_addr());

    let missing = [
        (request::GET_TOPIC_STATS_INFO, "topic"),
        (request::GET_CONSUME_STATS, "consumerGroup"),
        (request::GET_CONSUMER_CONNECTION_LIST, "consumerGroup"),
        (request::QUERY_TOPIC_CONSUME_BY_WHO, "topic"),
        (request::DELETE_TOPIC_IN_BROKER, "topic"),
    ];
    for (code, field) in missing {
        let answer = broker.call(RemotingCommand::request(code, 0));
        assert_eq!(answer.code, response::MESSAGE_ILLEGAL, "code {code}");
        assert!(
            remark(&answer).contains(field),
            "code {code}: {:?}",
            answer.remark
        );
    }
    let bad_group = broker.call(
        RemotingCommand::request(request::GET_CONSUME_STATS, 0)
            .with_ext("consumerGroup", "a group with spaces"),
    );
    assert_eq!(
        bad_group.code,
        response::MESSAGE_ILLEGAL,
        "{:?}",
        bad_group.remark
    );
    let long_topic = broker.call(
        RemotingCommand::request(request::QUERY_TOPIC_CONSUME_BY_WHO, 0)
            .with_ext("topic", "t".repeat(300)),
    );
    assert_eq!(
        long_topic.code,
        response::MESSAGE_ILLEGAL,
        "{:?}",
        long_topic.remark
    );
    let too_many_topics = broker.call(
        RemotingCommand::request(request::GET_CONSUME_STATS, 0)
            .with_ext("consumerGroup", "g")
            .with_ext("topicList", vec!["t"; 2000].join(";")),
    );
    assert_eq!(too_many_topics.code, response::MESSAGE_ILLEGAL);
    assert!(
        remark(&too_many_topics).contains("1024"),
        "{:?}",
        too_many_topics.remark
    );
    let system_topic = broker.call(
        RemotingCommand::request(request::DELETE_TOPIC_IN_BROKER, 0)
            .with_ext("topic", "%RETRY%AdminGroup"),
    );
    assert_eq!(
        system_topic.code,
        response::NO_PERMISSION,
        "{:?}",
        system_topic.remark
    );
    let offline = broker.call(
        RemotingCommand::request(request::GET_CONSUMER_CONNECTION_LIST, 0)
            .with_ext("consumerGroup", "nobody"),
    );
    assert_eq!(offline.code, CONSUMER_NOT_ONLINE);
    for unsupported in [
        request::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        request::DELETE_SUBSCRIPTIONGROUP,
    ] {
        let answer = broker.call(RemotingCommand::request(unsupported, 0));
        assert_eq!(answer.code, response::REQUEST_CODE_NOT_SUPPORTED);
    }

    // After all of that the same connection is still served.
    let stats = broker
        .call(RemotingCommand::request(request::GET_TOPIC_STATS_INFO, 0).with_ext("topic", TOPIC));
    assert_eq!(stats.code, response::SUCCESS, "{:?}", stats.remark);
    let body = std::str::from_utf8(&stats.body).expect("UTF-8");
    assert!(
        body.starts_with(r#"{"offsetTable":{{"brokerName":"#),
        "queues are object keys, as fastjson writes them: {body}"
    );
    let runtime = broker.call(RemotingCommand::request(
        request::GET_BROKER_RUNTIME_INFO,
        0,
    ));
    assert_eq!(runtime.code, response::SUCCESS);
    let runtime: serde_json::Value = serde_json::from_slice(&runtime.body).expect("JSON");
    assert!(runtime["table"]["uptimeMs"].is_string(), "{runtime}");

    // The topic deleted on the broker, then on the name server: no route is left.
    let deleted = broker.call(
        RemotingCommand::request(request::DELETE_TOPIC_IN_BROKER, 0).with_ext("topic", TOPIC),
    );
    assert_eq!(deleted.code, response::SUCCESS, "{:?}", deleted.remark);
    let mut namesrv = RemotingClient::connect(&cluster.namesrv_addr());
    let missing = namesrv.call(RemotingCommand::request(
        request::DELETE_TOPIC_IN_NAMESRV,
        0,
    ));
    assert_ne!(missing.code, response::SUCCESS);
    assert!(remark(&missing).contains("topic"), "{:?}", missing.remark);
    let deleted = namesrv.call(
        RemotingCommand::request(request::DELETE_TOPIC_IN_NAMESRV, 0).with_ext("topic", TOPIC),
    );
    assert_eq!(deleted.code, response::SUCCESS);
    let route = namesrv.call(
        RemotingCommand::request(request::GET_ROUTEINFO_BY_TOPIC, 0).with_ext("topic", TOPIC),
    );
    assert_eq!(route.code, response::TOPIC_NOT_EXIST);
}
