//! The send-back request (RocketMQ's CONSUMER_SEND_MSG_BACK): a consumer hands a message it
//! could not consume back to the broker that stored it, which stores a copy for the group's
//! retry topic after a delay, or for its dead-letter topic (docs/protocol.md, "Send-back").
//!
//! Owns: the wire form of that one request and its answer. Never: deciding when to send back
//! (the push consumer does, in `push/consume.rs`).

use std::time::Duration;

use shardmq_schema::wire;

use crate::api::require_ok;
use crate::error::{Error, Result};
use crate::pool::ConnectionPool;

/// Which stored message to send back, and how.
#[derive(Debug, Clone)]
pub(crate) struct SendBackArgs<'a> {
    pub group: &'a str,
    /// The topic and queue the message was pulled from.
    pub topic: &'a str,
    pub queue_id: u32,
    pub commit_log_offset: i64,
    /// The message's unique id; the broker checks the stored record carries it.
    pub unique_id: &'a str,
    /// 0: the broker picks `3 + reconsume times`; -1: straight to the dead-letter topic.
    pub delay_level: i32,
    pub max_reconsume_times: i32,
}

/// Where the broker put the copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SendBackAnswer {
    pub topic: String,
    pub reconsume_times: i32,
    pub is_dead_letter: bool,
}

impl ConnectionPool {
    pub(crate) async fn send_back(
        &self,
        address: &str,
        timeout: Duration,
        args: &SendBackArgs<'_>,
    ) -> Result<SendBackAnswer> {
        let frame = self
            .request(address, "send back", timeout, |builder| {
                let group = builder.create_string(args.group);
                let topic = builder.create_string(args.topic);
                let unique_id = builder.create_string(args.unique_id);
                let request = wire::ConsumerSendBackRequest::create(
                    builder,
                    &wire::ConsumerSendBackRequestArgs {
                        consumer_group: Some(group),
                        topic: Some(topic),
                        queue_id: i32::try_from(args.queue_id).unwrap_or(i32::MAX),
                        commit_log_offset: args.commit_log_offset,
                        unique_id: Some(unique_id),
                        delay_level: args.delay_level,
                        max_reconsume_times: args.max_reconsume_times,
                    },
                );
                (
                    wire::Body::ConsumerSendBackRequest,
                    request.as_union_value(),
                )
            })
            .await?;
        let frame = require_ok(address, frame)?;
        let response = frame
            .frame()
            .body_as_consumer_send_back_response()
            .ok_or_else(|| Error::UnexpectedResponse {
                address: address.to_owned(),
                detail: "the answer carries no ConsumerSendBackResponse".to_owned(),
            })?;
        Ok(SendBackAnswer {
            topic: response.topic().unwrap_or_default().to_owned(),
            reconsume_times: response.reconsume_times(),
            is_dead_letter: response.is_dead_letter(),
        })
    }
}
