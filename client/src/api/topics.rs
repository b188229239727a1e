//! Topic requests to one broker: create or update, delete, list its topics, and a topic's
//! per-queue stats.
//!
//! Owns: those four requests and their answers. Never: which brokers to ask (`admin.rs`).

use std::time::Duration;

use shardmq_schema::wire;

use super::{missing_body, require_ok};
use crate::admin::{QueueStats, TopicConfig};
use crate::error::Result;
use crate::pool::ConnectionPool;

impl ConnectionPool {
    /// Creates or updates a topic at one broker.
    pub(crate) async fn upsert_topic(
        &self,
        address: &str,
        timeout: Duration,
        config: &TopicConfig,
        is_create_only: bool,
    ) -> Result<()> {
        let frame = self
            .request(address, "upsert topic", timeout, |builder| {
                let name = builder.create_string(&config.name);
                let topic = wire::TopicConfig::create(
                    builder,
                    &wire::TopicConfigArgs {
                        name: Some(name),
                        read_queues: config.read_queues,
                        write_queues: config.write_queues,
                        perm: config.perm,
                        is_ordered: config.is_ordered,
                    },
                );
                let request = wire::UpsertTopicRequest::create(
                    builder,
                    &wire::UpsertTopicRequestArgs {
                        config: Some(topic),
                        create_only: is_create_only,
                    },
                );
                (wire::Body::UpsertTopicRequest, request.as_union_value())
            })
            .await?;
        require_ok(address, frame).map(|_| ())
    }

    /// Deletes a topic at one broker.
    pub(crate) async fn delete_topic(
        &self,
        address: &str,
        timeout: Duration,
        topic: &str,
        force: bool,
    ) -> Result<()> {
        let frame = self
            .request(address, "delete topic", timeout, |builder| {
                let topic = builder.create_string(topic);
                let request = wire::DeleteTopicRequest::create(
                    builder,
                    &wire::DeleteTopicRequestArgs {
                        topic: Some(topic),
                        force,
                    },
                );
                (wire::Body::DeleteTopicRequest, request.as_union_value())
            })
            .await?;
        require_ok(address, frame).map(|_| ())
    }

    /// The topics one broker hosts, with their configs.
    pub(crate) async fn broker_topics(
        &self,
        address: &str,
        timeout: Duration,
        include_system: bool,
    ) -> Result<Vec<TopicConfig>> {
        let frame = self
            .request(address, "broker topics", timeout, |builder| {
                let request = wire::BrokerTopicsRequest::create(
                    builder,
                    &wire::BrokerTopicsRequestArgs { include_system },
                );
                (wire::Body::BrokerTopicsRequest, request.as_union_value())
            })
            .await?;
        let frame = require_ok(address, frame)?;
        let response = frame
            .frame()
            .body_as_broker_topics_response()
            .ok_or_else(|| missing_body(address, "BrokerTopicsResponse"))?;
        Ok(response
            .topics()
            .iter()
            .flat_map(|topics| topics.iter())
            .map(|topic| TopicConfig {
                name: topic.name().unwrap_or_default().to_owned(),
                read_queues: topic.read_queues(),
                write_queues: topic.write_queues(),
                perm: topic.perm(),
                is_ordered: topic.is_ordered(),
            })
            .collect())
    }

    /// Per-queue offsets and last store time of a topic at one broker.
    pub(crate) async fn topic_stats(
        &self,
        address: &str,
        timeout: Duration,
        topic: &str,
    ) -> Result<Vec<QueueStats>> {
        let frame = self
            .request(address, "topic stats", timeout, |builder| {
                let topic = builder.create_string(topic);
                let request = wire::TopicStatsRequest::create(
                    builder,
                    &wire::TopicStatsRequestArgs { topic: Some(topic) },
                );
                (wire::Body::TopicStatsRequest, request.as_union_value())
            })
            .await?;
        let frame = require_ok(address, frame)?;
        let response = frame
            .frame()
            .body_as_topic_stats_response()
            .ok_or_else(|| missing_body(address, "TopicStatsResponse"))?;
        Ok(response
            .queues()
            .iter()
            .flat_map(|queues| queues.iter())
            .map(|queue| QueueStats {
                broker_name: String::new(),
                queue_id: u32::try_from(queue.queue_id()).unwrap_or(0),
                min_offset: queue.min_offset(),
                max_offset: queue.max_offset(),
                last_update_ms: queue.last_update_ms(),
            })
            .collect())
    }
}
