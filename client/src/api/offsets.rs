//! Offset requests: a consumer group's committed offset of a queue (read and commit), and a
//! queue's own offsets (its bounds, or the first one stored at a time).
//!
//! Owns: those four requests and their answers. Never: when offsets are committed (the
//! consumers).

use std::time::Duration;

use shardmq_schema::wire;

use super::{missing_body, require_ok};
use crate::error::Result;
use crate::pool::ConnectionPool;

impl ConnectionPool {
    /// The group's committed offset of a queue; `None` when it never committed one.
    pub(crate) async fn query_consumer_offset(
        &self,
        address: &str,
        timeout: Duration,
        group: &str,
        topic: &str,
        queue_id: u32,
    ) -> Result<Option<i64>> {
        let frame = self
            .request(address, "query consumer offset", timeout, |builder| {
                let group = builder.create_string(group);
                let topic = builder.create_string(topic);
                let request = wire::QueryConsumerOffsetRequest::create(
                    builder,
                    &wire::QueryConsumerOffsetRequestArgs {
                        consumer_group: Some(group),
                        topic: Some(topic),
                        queue_id: queue_id as i32,
                    },
                );
                (
                    wire::Body::QueryConsumerOffsetRequest,
                    request.as_union_value(),
                )
            })
            .await?;
        if frame.frame().status() == wire::Status::CONSUMER_GROUP_NOT_FOUND {
            return Ok(None);
        }
        let frame = require_ok(address, frame)?;
        let offset = frame
            .frame()
            .body_as_offset_response()
            .ok_or_else(|| missing_body(address, "OffsetResponse"))?
            .offset();
        Ok((offset >= 0).then_some(offset))
    }

    /// Commits the group's offset of a queue (the next offset it will consume).
    pub(crate) async fn commit_consumer_offset(
        &self,
        address: &str,
        timeout: Duration,
        group: &str,
        topic: &str,
        queue_id: u32,
        offset: i64,
    ) -> Result<()> {
        let frame = self
            .request(address, "commit consumer offset", timeout, |builder| {
                let group = builder.create_string(group);
                let topic = builder.create_string(topic);
                let request = wire::CommitConsumerOffsetRequest::create(
                    builder,
                    &wire::CommitConsumerOffsetRequestArgs {
                        consumer_group: Some(group),
                        topic: Some(topic),
                        queue_id: queue_id as i32,
                        offset,
                    },
                );
                (
                    wire::Body::CommitConsumerOffsetRequest,
                    request.as_union_value(),
                )
            })
            .await?;
        require_ok(address, frame).map(|_| ())
    }

    /// A queue's smallest stored and one-past-largest visible offsets.
    pub(crate) async fn queue_offsets(
        &self,
        address: &str,
        timeout: Duration,
        topic: &str,
        queue_id: u32,
    ) -> Result<(i64, i64)> {
        let frame = self
            .request(address, "queue offsets", timeout, |builder| {
                let topic = builder.create_string(topic);
                let request = wire::QueueOffsetsRequest::create(
                    builder,
                    &wire::QueueOffsetsRequestArgs {
                        topic: Some(topic),
                        queue_id: queue_id as i32,
                    },
                );
                (wire::Body::QueueOffsetsRequest, request.as_union_value())
            })
            .await?;
        let frame = require_ok(address, frame)?;
        let response = frame
            .frame()
            .body_as_queue_offsets_response()
            .ok_or_else(|| missing_body(address, "QueueOffsetsResponse"))?;
        Ok((response.min_offset(), response.max_offset()))
    }

    /// The first offset of a queue stored at or after `timestamp_ms`.
    pub(crate) async fn offset_by_time(
        &self,
        address: &str,
        timeout: Duration,
        topic: &str,
        queue_id: u32,
        timestamp_ms: i64,
    ) -> Result<i64> {
        let frame = self
            .request(address, "offset by time", timeout, |builder| {
                let topic = builder.create_string(topic);
                let request = wire::OffsetByTimeRequest::create(
                    builder,
                    &wire::OffsetByTimeRequestArgs {
                        topic: Some(topic),
                        queue_id: queue_id as i32,
                        timestamp_ms,
                    },
                );
                (wire::Body::OffsetByTimeRequest, request.as_union_value())
            })
            .await?;
        let frame = require_ok(address, frame)?;
        Ok(frame
            .frame()
            .body_as_offset_response()
            .ok_or_else(|| missing_body(address, "OffsetResponse"))?
            .offset())
    }
}
