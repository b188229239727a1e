//! Client membership requests: the heartbeat that declares this client's producer and
//! consumer groups, leaving them at shutdown, and a consumer group's members.
//!
//! Owns: those three requests and their answers. Never: when to send them (the clients' timers
//! and shutdowns).

use std::time::Duration;

use shardmq_schema::{wire, VerifiedFrame};

use super::{missing_body, require_ok, strings};
use crate::error::Result;
use crate::pool::ConnectionPool;
use crate::route::MessageQueue;

/// One consumer group a client declares in its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeartbeatGroup {
    pub group: String,
    pub is_broadcasting: bool,
    pub is_orderly: bool,
    /// (topic, expression, `TAG` or `SQL92`).
    pub subscriptions: Vec<(String, String, &'static str)>,
    /// The queues the client consumes for the group now; `None`: not reported.
    pub held_queues: Option<Vec<MessageQueue>>,
}

impl ConnectionPool {
    /// Tells the broker this client is alive and which groups it belongs to.
    pub(crate) async fn heartbeat(
        &self,
        address: &str,
        timeout: Duration,
        producer_groups: &[String],
        consumer_groups: &[HeartbeatGroup],
    ) -> Result<()> {
        let client_id = self.client_id().to_owned();
        let frame = self
            .request(address, "heartbeat", timeout, |builder| {
                let groups: Vec<_> = consumer_groups
                    .iter()
                    .map(|info| {
                        let subscriptions: Vec<_> = info
                            .subscriptions
                            .iter()
                            .map(|(topic, expression, expression_type)| {
                                let topic = builder.create_string(topic);
                                let expression = builder.create_string(expression);
                                let expression_type = builder.create_string(expression_type);
                                wire::Subscription::create(
                                    builder,
                                    &wire::SubscriptionArgs {
                                        topic: Some(topic),
                                        expression: Some(expression),
                                        expression_type: Some(expression_type),
                                    },
                                )
                            })
                            .collect();
                        let subscriptions = builder.create_vector(&subscriptions);
                        let held_queues = info.held_queues.as_ref().map(|queues| {
                            let queues: Vec<_> = queues
                                .iter()
                                .map(|queue| {
                                    let topic = builder.create_string(&queue.topic);
                                    let broker_name = builder.create_string(&queue.broker_name);
                                    wire::HeldQueue::create(
                                        builder,
                                        &wire::HeldQueueArgs {
                                            topic: Some(topic),
                                            broker_name: Some(broker_name),
                                            queue_id: queue.queue_id,
                                        },
                                    )
                                })
                                .collect();
                            builder.create_vector(&queues)
                        });
                        let group = builder.create_string(&info.group);
                        wire::ConsumerGroupInfo::create(
                            builder,
                            &wire::ConsumerGroupInfoArgs {
                                group: Some(group),
                                message_model: if info.is_broadcasting {
                                    wire::MessageModel::BROADCASTING
                                } else {
                                    wire::MessageModel::CLUSTERING
                                },
                                is_orderly: info.is_orderly,
                                subscriptions: Some(subscriptions),
                                held_queues,
                            },
                        )
                    })
                    .collect();
                let consumer_groups = builder.create_vector(&groups);
                let producer_groups = strings(builder, producer_groups);
                let client_id = builder.create_string(&client_id);
                let request = wire::HeartbeatRequest::create(
                    builder,
                    &wire::HeartbeatRequestArgs {
                        client_id: Some(client_id),
                        producer_groups,
                        consumer_groups: Some(consumer_groups),
                    },
                );
                (wire::Body::HeartbeatRequest, request.as_union_value())
            })
            .await?;
        require_ok(address, frame).map(|_| ())
    }

    /// Leaves a producer and/or consumer group at the broker (clean shutdown).
    pub(crate) async fn unregister_client(
        &self,
        address: &str,
        timeout: Duration,
        producer_group: Option<&str>,
        consumer_group: Option<&str>,
    ) -> Result<()> {
        let client_id = self.client_id().to_owned();
        let frame = self
            .request(address, "unregister client", timeout, |builder| {
                let client_id = builder.create_string(&client_id);
                let producer_group = producer_group.map(|g| builder.create_string(g));
                let consumer_group = consumer_group.map(|g| builder.create_string(g));
                let request = wire::UnregisterClientRequest::create(
                    builder,
                    &wire::UnregisterClientRequestArgs {
                        client_id: Some(client_id),
                        producer_group,
                        consumer_group,
                    },
                );
                (
                    wire::Body::UnregisterClientRequest,
                    request.as_union_value(),
                )
            })
            .await?;
        require_ok(address, frame).map(|_| ())
    }

    /// The broker's `ConsumerListResponse` for `group`, checked (its body is there).
    pub(crate) async fn consumer_list_answer(
        &self,
        address: &str,
        timeout: Duration,
        group: &str,
    ) -> Result<VerifiedFrame> {
        let frame = self
            .request(address, "consumer list", timeout, |builder| {
                let group = builder.create_string(group);
                let request = wire::ConsumerListRequest::create(
                    builder,
                    &wire::ConsumerListRequestArgs {
                        consumer_group: Some(group),
                    },
                );
                (wire::Body::ConsumerListRequest, request.as_union_value())
            })
            .await?;
        let frame = require_ok(address, frame)?;
        if frame.frame().body_as_consumer_list_response().is_none() {
            return Err(missing_body(address, "ConsumerListResponse"));
        }
        Ok(frame)
    }

    /// Client ids of a consumer group's live members at this broker, sorted.
    pub(crate) async fn consumer_list(
        &self,
        address: &str,
        timeout: Duration,
        group: &str,
    ) -> Result<Vec<String>> {
        let frame = self.consumer_list_answer(address, timeout, group).await?;
        let response = frame
            .frame()
            .body_as_consumer_list_response()
            .ok_or_else(|| missing_body(address, "ConsumerListResponse"))?;
        let mut ids: Vec<String> = response
            .client_ids()
            .iter()
            .flat_map(|ids| ids.iter())
            .map(str::to_owned)
            .collect();
        ids.sort();
        Ok(ids)
    }
}
