//! A RocketMQ client's membership: HEART_BEAT (34) becomes a native heartbeat (its producer
//! groups, and each consumer group's model and subscriptions), UNREGISTER_CLIENT (35) an
//! unregistration, GET_CONSUMER_LIST_BY_GROUP (38) the members of a group. The heartbeat's
//! subscriptions are also kept on the connection for its pulls ([`RemotingSession`]).

use std::collections::HashMap;

use shardmq_remoting::codes::response;
use shardmq_remoting::{decode_heartbeat_body, RemotingCommand};
use shardmq_schema::wire;

use super::dispatch::{native_answer, native_request, required, Answer, Reply};
use super::RemotingSession;
use crate::network::clients as native;
use crate::network::request::{refuse, Connection};
use crate::network::NetworkShard;

pub(super) async fn heartbeat(
    shard: &NetworkShard,
    connection: &Connection,
    session: &RemotingSession,
    command: &RemotingCommand,
) -> Answer {
    let data = decode_heartbeat_body(&command.body)
        .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))?;
    let mut subscriptions = HashMap::new();
    for consumer in &data.consumer_data_set {
        for subscription in &consumer.subscription_data_set {
            let is_sql = crate::network::consume::is_sql(Some(&subscription.expression_type))?;
            if is_sql {
                // Refused here, at subscribe time, when the broker serves no SQL92 filter or
                // the expression does not compile (the remark names the position).
                shard
                    .sql_filter(&subscription.sub_string)
                    .map_err(|refusal| {
                        refuse(
                            refusal.status,
                            format!(
                                "group {} subscribes to {}: {}",
                                consumer.group_name, subscription.topic, refusal.message
                            ),
                        )
                    })?;
            }
            subscriptions.insert(
                (consumer.group_name.clone(), subscription.topic.clone()),
                (subscription.sub_string.clone(), is_sql),
            );
        }
    }
    let request = native_request(shard, |b| {
        let client_id = b.create_string(&data.client_id);
        let producers: Vec<_> = data
            .producer_data_set
            .iter()
            .map(|producer| b.create_string(&producer.group_name))
            .collect();
        let producers = b.create_vector(&producers);
        let consumers: Vec<_> = data
            .consumer_data_set
            .iter()
            .map(|consumer| {
                let subscriptions: Vec<_> = consumer
                    .subscription_data_set
                    .iter()
                    .map(|subscription| {
                        let topic = b.create_string(&subscription.topic);
                        let expression = b.create_string(&subscription.sub_string);
                        let expression_type = b.create_string(&subscription.expression_type);
                        wire::Subscription::create(
                            b,
                            &wire::SubscriptionArgs {
                                topic: Some(topic),
                                expression: Some(expression),
                                expression_type: Some(expression_type),
                            },
                        )
                    })
                    .collect();
                let subscriptions = b.create_vector(&subscriptions);
                let group = b.create_string(&consumer.group_name);
                wire::ConsumerGroupInfo::create(
                    b,
                    &wire::ConsumerGroupInfoArgs {
                        group: Some(group),
                        message_model: if consumer.is_clustering() {
                            wire::MessageModel::CLUSTERING
                        } else {
                            wire::MessageModel::BROADCASTING
                        },
                        // RocketMQ's heartbeat does not say; its orderly consumers lock queues.
                        is_orderly: false,
                        subscriptions: Some(subscriptions),
                        // RocketMQ's heartbeat does not carry its rebalance result.
                        held_queues: None,
                    },
                )
            })
            .collect();
        let consumers = b.create_vector(&consumers);
        let body = wire::HeartbeatRequest::create(
            b,
            &wire::HeartbeatRequestArgs {
                client_id: Some(client_id),
                producer_groups: Some(producers),
                consumer_groups: Some(consumers),
            },
        );
        (wire::Body::HeartbeatRequest, body.as_union_value())
    })?;
    let heartbeat = request
        .frame()
        .body_as_heartbeat_request()
        .expect("built as a heartbeat");
    native_answer(
        shard,
        native::heartbeat(shard, connection, 0, heartbeat).await,
    )?;
    *session.subscriptions.borrow_mut() = subscriptions;
    Ok(Reply::to(command, response::SUCCESS))
}

/// CHECK_CLIENT_CONFIG (46): a RocketMQ consumer asks before it subscribes with a SQL92
/// expression whether the broker accepts it. A tag subscription is accepted; a SQL92 one when
/// the broker filters by SQL92 (`enable_property_filter`) and the expression compiles, else
/// refused with the reason (SUBSCRIPTION_PARSE_FAILED, the position of the error named).
pub(super) async fn check_client_config(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let check = shardmq_remoting::heartbeat::decode_check_client_body(&command.body)
        .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))?;
    let subscription = &check.subscription_data;
    if crate::network::consume::is_sql(Some(&subscription.expression_type))? {
        shard.sql_filter(&subscription.sub_string)?;
    }
    Ok(Reply::to(command, response::SUCCESS))
}

pub(super) async fn unregister(
    shard: &NetworkShard,
    connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let client_id = required(command, "clientID")?;
    let producer_group = command.ext("producerGroup").unwrap_or_default();
    let consumer_group = command.ext("consumerGroup").unwrap_or_default();
    let request = native_request(shard, |b| {
        let client_id = b.create_string(client_id);
        let producer_group = b.create_string(producer_group);
        let consumer_group = b.create_string(consumer_group);
        let body = wire::UnregisterClientRequest::create(
            b,
            &wire::UnregisterClientRequestArgs {
                client_id: Some(client_id),
                producer_group: Some(producer_group),
                consumer_group: Some(consumer_group),
            },
        );
        (wire::Body::UnregisterClientRequest, body.as_union_value())
    })?;
    let unregister = request
        .frame()
        .body_as_unregister_client_request()
        .expect("built as an unregistration");
    native_answer(
        shard,
        native::unregister_client(shard, connection, 0, unregister).await,
    )?;
    Ok(Reply::to(command, response::SUCCESS))
}

pub(super) async fn consumer_list(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let group = required(command, "consumerGroup")?;
    let request = native_request(shard, |b| {
        let group = b.create_string(group);
        let body = wire::ConsumerListRequest::create(
            b,
            &wire::ConsumerListRequestArgs {
                consumer_group: Some(group),
            },
        );
        (wire::Body::ConsumerListRequest, body.as_union_value())
    })?;
    let list = request
        .frame()
        .body_as_consumer_list_request()
        .expect("built as a consumer list request");
    let answer = native_answer(shard, native::consumer_list(shard, 0, list).await)?;
    let members: Vec<&str> = answer
        .frame()
        .body_as_consumer_list_response()
        .and_then(|list| list.client_ids())
        .map(|ids| ids.iter().collect())
        .unwrap_or_default();
    let body = serde_json::to_vec(&serde_json::json!({ "consumerIdList": members }))
        .map_err(|error| refuse(wire::Status::SYSTEM_ERROR, error.to_string()))?;
    Ok(Reply::to(command, response::SUCCESS).with_body(body.into()))
}
