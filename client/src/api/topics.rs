//! Topic requests to one broker: create or update, delete, list its topics, and a topic's
//! per-queue stats.
//!
//! Owns: those four requests and their answers, and the types they carry: [`TopicConfig`]
//! (with its limits and the checks a config passes before it is sent) and [`QueueStats`].
//! Never: which brokers to ask (`admin.rs`).

use std::time::Duration;

use shardmq_schema::{topic_permission, wire};

use super::{missing_body, require_ok};
use crate::error::{Error, Result};
use crate::message::check_topic_name;
use crate::pool::ConnectionPool;

/// Queues of a topic created without saying how many (brokers' common default).
pub const DEFAULT_TOPIC_QUEUES: u32 = 8;

/// Most queues of one topic on one broker.
pub const MAX_TOPIC_QUEUES: u32 = 1024;

/// A topic as one broker hosts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicConfig {
    pub name: String,
    /// Queues consumers read: ids `0..read_queues`.
    pub read_queues: u32,
    /// Queues producers write: ids `0..write_queues`.
    pub write_queues: u32,
    /// Permission bits: read 4, write 2, inherit 1 (default 6).
    pub perm: u32,
    /// Whether consumers should consume it orderly.
    pub is_ordered: bool,
}

impl TopicConfig {
    /// A readable and writable topic with `queues` read and write queues.
    #[must_use]
    pub fn new(name: impl Into<String>, queues: u32) -> Self {
        Self {
            name: name.into(),
            read_queues: queues,
            write_queues: queues,
            perm: topic_permission::READ_WRITE,
            is_ordered: false,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        check_topic_name(&self.name)?;
        for (what, count) in [
            ("read_queues", self.read_queues),
            ("write_queues", self.write_queues),
        ] {
            if count == 0 || count > MAX_TOPIC_QUEUES {
                return Err(Error::InvalidArgument(format!(
                    "{what} of topic {} is {count}; it must be 1..={MAX_TOPIC_QUEUES}",
                    self.name
                )));
            }
        }
        if self.perm & !(topic_permission::READ_WRITE | topic_permission::INHERIT) != 0 {
            return Err(Error::InvalidArgument(format!(
                "perm {} has bits other than read 4, write 2 and inherit 1",
                self.perm
            )));
        }
        Ok(())
    }
}

/// One queue's offsets and last store time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStats {
    pub broker_name: String,
    pub queue_id: u32,
    pub min_offset: i64,
    pub max_offset: i64,
    /// Store time of the newest message (ms since the epoch); 0 when the queue is empty.
    pub last_update_ms: i64,
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_configs_are_checked() {
        assert!(TopicConfig::new("t", 8).validate().is_ok());
        assert!(TopicConfig::new("t", 0).validate().is_err());
        assert!(TopicConfig::new("t", 1025).validate().is_err());
        assert!(TopicConfig::new("bad name", 8).validate().is_err());
        let mut config = TopicConfig::new("t", 8);
        config.perm = 8;
        assert!(config.validate().is_err());
    }
}
